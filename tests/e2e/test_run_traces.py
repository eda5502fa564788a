"""Traces and logs across services tell a run's whole story (`rollway run --trace-file F`).

    rollway run grpo.yaml --trace-file F
      └─ coordinator --trace-file F            rl_step spans, the CLIENT spans of its calls
           └─ dataloader, rollout, trainer     started by the coordinator: their SERVER spans in F too

For each step, the rl_step span's trace holds every call the step makes, also those made from
thread pools (Generate, UpdateWeights) and the streaming PushWeights, on both sides of the wire.
The services' JSON log lines carry the step as an integer, as the coordinator's do.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NUM_STEPS = 2
SERVER_SPANS = {
    "/rollway.rollout.v1.RolloutService/Generate": "rollway-rollout",
    "/rollway.trainer.v1.TrainerService/TrainStep": "rollway-trainer",
    "/rollway.trainer.v1.TrainerService/PushWeights": "rollway-trainer",
    "/rollway.rollout.v1.RolloutService/UpdateWeights": "rollway-rollout",
}


def grpo_config(model_dir: Path, data_dir: Path, run_dir: Path) -> dict:
    return {
        "hf_checkpoint": str(model_dir),
        "prompt_data": [str(data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 2,
        "n_samples_per_prompt": 2,
        "global_batch_size": 4,
        "num_rollout": NUM_STEPS,
        "rollout_max_response_len": 4,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "run_dir": str(run_dir),
        "run_id": "traced",
    }


def log_records(path: Path) -> list[dict]:
    records = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a library's own output that happens to start with a brace
    return records


def test_rollway_run_trace_file_holds_every_call_of_a_step_from_every_service(
    tiny_model_dir, demo_data_dir, tmp_path
):
    config = tmp_path / "grpo.json"
    config.write_text(json.dumps(grpo_config(tiny_model_dir, demo_data_dir, tmp_path / "runs")))
    trace_file = tmp_path / "spans.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "run", str(config), "--trace-file", str(trace_file)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run traced SUCCEEDED" in result.stdout

    spans = [json.loads(line) for line in trace_file.read_text().splitlines()]
    assert {s["service"] for s in spans} == {
        "rollway-coordinator",
        "rollway-dataloader",
        "rollway-rollout",
        "rollway-trainer",
    }, "the services the coordinator started must write to the run's trace file too"
    steps = {s["attributes"]["step"]: s for s in spans if s["name"] == "rl_step"}
    assert sorted(steps) == list(range(NUM_STEPS))
    by_id = {s["span_id"]: s for s in spans}
    for step, root in steps.items():
        assert root["service"] == "rollway-coordinator" and root["parent_span_id"] is None
        in_trace = [s for s in spans if s["trace_id"] == root["trace_id"]]
        servers = {(s["name"], s["service"]) for s in in_trace if s["kind"] == "SERVER"}
        assert set(SERVER_SPANS.items()) <= servers, f"step {step}: {sorted(servers)}"
        # Each server span hangs below the step through the coordinator's CLIENT span of that call.
        for s in in_trace:
            if s["kind"] == "SERVER" and s["name"] in SERVER_SPANS:
                client = by_id[s["parent_span_id"]]
                assert (client["kind"], client["service"]) == ("CLIENT", "rollway-coordinator")
                assert client["name"] == s["name"].lstrip("/")
        # No call of the step landed in a trace of its own.
        assert not [
            s
            for s in spans
            if s["kind"] == "SERVER"
            and s["name"] in SERVER_SPANS
            and s["trace_id"] != root["trace_id"]
            and root["start_ns"] <= s["start_ns"] <= root["end_ns"]
        ], f"step {step}: calls made during the step outside its trace"

    # Before the first step: the weight group on both sides and the first push, in one trace.
    (initial,) = [s for s in spans if s["name"] == "initial_weight_sync"]
    servers = {
        (s["name"], s["service"])
        for s in spans
        if s["trace_id"] == initial["trace_id"] and s["kind"] == "SERVER"
    }
    assert {
        ("/rollway.trainer.v1.TrainerService/InitWeightGroup", "rollway-trainer"),
        ("/rollway.rollout.v1.RolloutService/InitWeightGroup", "rollway-rollout"),
        ("/rollway.trainer.v1.TrainerService/PushWeights", "rollway-trainer"),
        ("/rollway.rollout.v1.RolloutService/UpdateWeights", "rollway-rollout"),
    } <= servers, sorted(servers)
    assert initial["end_ns"] <= steps[0]["start_ns"]

    # The services' JSON log lines carry step (an integer) while they serve a step's calls.
    logs = {
        name: [
            r
            for path in (tmp_path / "runs" / "traced" / "services").glob(f"{name}-*.log")
            for r in log_records(path)
        ]
        for name in ("rollout", "trainer")
    }
    for name, records in logs.items():
        stepped = [r for r in records if "step" in r]
        assert stepped, f"no {name} log line carries step"
        assert all(type(r["step"]) is int for r in stepped), [
            r["step"] for r in stepped if type(r["step"]) is not int
        ]
        assert {r["step"] for r in stepped} <= set(range(NUM_STEPS))
        assert all(r["run_id"] == "traced" for r in stepped)
        assert all(type(r["weight_version"]) is int for r in stepped if "weight_version" in r)
