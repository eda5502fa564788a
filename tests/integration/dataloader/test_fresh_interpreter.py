"""What the dataloader costs a fresh interpreter: Arrow's peak memory while opening a parquet file,
and loading a named tokenizer class without importing torch."""

import json
import os
import shutil
import subprocess
import sys

from unit.dataloader.test_datasets import write_parquet


def test_parquet_is_read_a_record_batch_at_a_time(tmp_path):
    """Arrow's peak allocation while opening stays near one row group, far below the file's size."""
    rows = [{"prompt": os.urandom(200).hex(), "label": str(i)} for i in range(40_000)]
    path = write_parquet(tmp_path / "big.parquet", rows, row_group_size=1000)
    script = (
        "import sys, pyarrow as pa; from pathlib import Path;"
        "from rollway.dataloader.datasets import open_source; from rollway.dataloader.rows import RowRules;"
        "from rollway.dataloader.sources import parse_path;"
        f"s = open_source(parse_path({str(path)!r}, 'b'), RowRules('prompt', 'label'), Path({str(tmp_path)!r}), False);"
        "print(len(s.store), pa.default_memory_pool().max_memory())"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    num_rows, peak_bytes = map(int, out.stdout.split())
    assert num_rows == 40_000
    assert path.stat().st_size > 12 * 2**20 and peak_bytes < 4 * 2**20, peak_bytes


def test_named_tokenizer_class_loads_like_auto_tokenizer_without_torch(tmp_path, tiny_model_dir):
    """tokenizer_config's class is loaded directly: the ids AutoTokenizer gives, without importing torch."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"})
    )
    script = (
        "import sys, json; import rollway.dataloader.service;"
        "from rollway.dataloader.encoder import load_tokenizer;"
        f"t = load_tokenizer({str(tmp_path)!r}); ids = t('What is 12 + 345?  ok', add_special_tokens=False)['input_ids'];"
        "print(json.dumps([type(t).__name__, 'torch' in sys.modules, ids]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    class_name, imported_torch, ids = json.loads(out.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert class_name == type(auto).__name__ == "Qwen2Tokenizer"
    assert ids == auto("What is 12 + 345?  ok", add_special_tokens=False)["input_ids"]
    assert imported_torch is False
