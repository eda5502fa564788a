"""The start of a run, told as it happens (coordinator/startup_report.py), the services' model-load
log lines (common/model_load_log.py) and the warning for a setting that does nothing here."""

from __future__ import annotations

import json

import pytest
import torch

from rollway.common.model_load_log import checkpoint_bytes, logged_model_load
from rollway.coordinator.plan.host import gpu_present
from rollway.coordinator.startup_report import loading_line, model_size, timed_line
from rollway.deploy.launcher import parse_run_config, warn_no_op_settings

QWEN3_06B = dict(
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)


@pytest.fixture
def qwen_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_06B))
    return tmp_path


def test_the_model_size_comes_from_config_json_in_the_loading_dtype(qwen_dir):
    # 596,049,920 parameters (the tied embedding once): 4 bytes each in fp32, 2 in bf16.
    assert model_size(str(qwen_dir), "float32") == "596.0M parameters, 2.38 GB float32"
    assert model_size(str(qwen_dir), "bfloat16") == "596.0M parameters, 1.19 GB bfloat16"
    assert model_size(str(qwen_dir), "auto") == "596.0M parameters"  # where it runs decides
    assert model_size(str(qwen_dir / "missing"), "float32") == ""
    tiny = {**QWEN3_06B, "vocab_size": 400, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    (qwen_dir / "config.json").write_text(json.dumps(tiny))
    assert model_size(str(qwen_dir), "float32").endswith(" MB float32")  # not "0.00 GB"


def test_the_loading_line_groups_the_services_by_dtype(qwen_dir):
    line = loading_line(
        str(qwen_dir), {"trainer": "float32", "rollout_0": "bfloat16", "rollout_1": "bfloat16"}
    )
    assert line == (
        f"loading {qwen_dir} in trainer (596.0M parameters, 2.38 GB float32); "
        "rollout_0, rollout_1 (596.0M parameters, 1.19 GB bfloat16) ..."
    )


def test_a_timed_line_names_the_slowest_first():
    line = timed_line("services initialised", 13.44, {"dataloader": 0.1, "trainer": 13.4, "rollout_0": 0.31})
    assert line == "services initialised in 13.4s (trainer 13.4s, rollout_0 0.3s, dataloader 0.1s)"
    assert timed_line("services up", 9.81) == "services up in 9.8s"


class _Log:
    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **fields):
        self.lines.append((event, fields))


def test_a_model_load_is_logged_with_its_size_and_time(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_bytes(tmp_path) == 1000
    log = _Log()
    with logged_model_load(log, tmp_path, "float32") as loaded:
        loaded.append(torch.nn.Linear(10, 5))  # 55 parameters
    (started, before), (ended, after) = log.lines
    assert (started, before) == (
        "loading model",
        {"path": str(tmp_path), "dtype": "float32", "checkpoint_bytes": 1000},
    )
    assert ended == "model loaded" and after["num_params"] == 55 and after["num_bytes"] == 220
    assert after["seconds"] >= 0


def test_fsdp_cpu_offload_on_a_cpu_only_machine_is_said_to_do_nothing(qwen_dir, capsys):
    flags = ["--hf-checkpoint", str(qwen_dir), "--prompt-data", "train.jsonl"]
    warn_no_op_settings(parse_run_config([*flags, "--fsdp-cpu-offload"]))
    err = capsys.readouterr().err
    if gpu_present():  # with a GPU it does what it says
        assert err == ""
    else:
        assert "warning: fsdp_cpu_offload does nothing on CPU" in err
    warn_no_op_settings(parse_run_config(flags))
    assert capsys.readouterr().err == ""
