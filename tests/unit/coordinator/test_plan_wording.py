"""`rollway plan`'s words say what the run will do (#37): a run that never loops over its data
does not "loop over epochs", an SFT run lists no rollout engine, a GPU note only where a GPU is
targeted; and the eval pages in flight hold no more samples than a rollout."""

from __future__ import annotations

import json

import pytest

from rollway.coordinator.run_config import parse_run_config as parse_mapping
from rollway.deploy.launcher import parse_run_config, plan_main

QWEN = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 32, "tie_word_embeddings": True, "max_position_embeddings": 4096, "torch_dtype": "float32",
}  # fmt: skip


@pytest.fixture
def run_files(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(QWEN))
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "label": "1"}) + "\n" for i in range(100)))
    return ["--hf-checkpoint", str(tmp_path / "model"), "--prompt-data", str(data), "--memory-budget", "8"]


def _plan(capsys, argv: list[str]) -> dict[str, str]:
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    return {line[:25].strip(): line[25:].strip() for line in out.splitlines()} | {"": out}


def test_a_run_shorter_than_an_epoch_covers_part_of_it_and_one_longer_loops(run_files, capsys):
    lines = _plan(capsys, [*run_files, "--num-rollout", "2", "--rollout-batch-size", "8"])
    assert lines["end of data"] == "num_rollout 2 wins: it covers 0.16 of an epoch of the data (100 rows)"
    lines = _plan(capsys, [*run_files, "--num-rollout", "50", "--rollout-batch-size", "8"])
    assert lines["end of data"] == "num_rollout 50 wins: the data (100 rows) loops over epochs, 4.00 epochs"
    # RunInfo.end_of_data and ValidateRun's plan say the same, from the run's own check of the data.
    run = parse_mapping({"hf_checkpoint": run_files[1], "prompt_data": [run_files[3]], "num_rollout": 2,
                         "rollout_batch_size": 8}, check_files=True)  # fmt: skip
    assert run.end_of_data == "num_rollout 2 wins: it covers 0.16 of an epoch of the data (100 rows)"


def test_an_sft_run_lists_no_rollout_engine_threads(run_files, capsys):
    rl = _plan(capsys, [*run_files, "--cpu-threads", "2"])["CPU threads"]
    assert rl.startswith("2 per trainer rank, 2 for the CPU rollout engine (on CPU here: ")
    sft_flags = [
        "--cpu-threads",
        "2",
        "--loss-type",
        "sft_loss",
        "--apply-chat-template",
        "--input-key",
        "input",
    ]
    sft = _plan(capsys, [*run_files, *sft_flags])["CPU threads"]
    assert sft.startswith("2 per trainer rank (on CPU here: ") and "rollout" not in sft


def test_the_sglang_gpu_note_only_where_a_gpu_is_here(run_files, capsys):
    """On this CPU machine the plan of an sglang run says nothing of a GPU (#37); on a GPU
    machine it names sglang_mem_fraction_static."""
    from rollway.coordinator.plan.memory import plan_memory

    out = _plan(capsys, [*run_files, "--rollout-engine", "sglang"])[""]
    assert "KV pool" in out or "sglang server" in out, out
    assert "of its GPU" not in out
    configs = parse_run_config([*run_files[:4], "--rollout-engine", "sglang"])
    for on_gpu in (False, True):
        notes = plan_memory(configs, 8 << 30, ["rollout"], on_gpu=on_gpu).notes
        gpu_note = "sglang takes sglang_mem_fraction_static 0.8 of its GPU"
        assert (gpu_note in notes) == on_gpu, (on_gpu, notes)


def test_the_eval_pages_in_flight_hold_no_more_samples_than_a_rollout():
    """Two pages generate at once (evaluation.py): by default they hold a rollout's 64 samples."""

    def prompts_per_page(*flags: str) -> int:
        argv = ["--hf-checkpoint", "/models/m", "--prompt-data", "x.jsonl", *flags]
        return parse_run_config(argv)["coordinator"].eval_prompts_per_generate

    rollout = ["--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--global-batch-size", "64"]
    assert prompts_per_page(*rollout) == 32
    assert prompts_per_page(*rollout, "--n-samples-per-eval-prompt", "4") == 8  # 2 pages x 8 x 4
    assert prompts_per_page(*rollout, "--n-samples-per-eval-prompt", "64") == 1  # never none
    assert prompts_per_page("--eval-batch-size", "5") == 5
