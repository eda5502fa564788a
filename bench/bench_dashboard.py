"""What the dashboard costs a run: the same GRPO run of the tiny model, four ways, on one coordinator.

Variants (rows):
    no_samples        dashboard_rollout_groups 0: nothing kept for the Rollouts view
    samples           8 groups per step kept (RUN_DIR/rollouts): the default
    samples_scored    ... and the trainer scores them before each step (dashboard_trainer_log_probs)
    watched           the default, with a client on the event stream and polling Services
                      every 0.5 s (a dashboard open on the run the whole time)
Figures (medians over the steps after each run's first, two interleaved rounds): step_time_s, train_time_s,
other_s (step time not in generation, training, weight sync or eval: where the scoring lands),
stored_kb_per_step (compressed rollout samples per step).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from bench.harness import BenchResult

VARIANTS = {
    "no_samples": {"dashboard_rollout_groups": 0},
    "samples": {},
    "samples_scored": {"dashboard_trainer_log_probs": True},
    "watched": {},
}


KNOWN_PHASES = ("perf/rollout_time", "perf/train_time", "perf/weight_sync_time", "perf/eval_time")


def _config(model: Path, data: Path, num_steps: int) -> dict:
    return {
        "hf_checkpoint": str(model),
        "prompt_data": [str(data / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 8,
        "n_samples_per_prompt": 8,
        "global_batch_size": 64,
        "num_rollout": num_steps,
        "rollout_max_response_len": 8,
        "rm_type": "exact_match",
        "lr": 1e-4,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 8192,
    }


def _watch(url: str, run_id: str, stop: threading.Event) -> None:
    """A dashboard left open: the event stream read, Services polled every 0.5 s."""

    def stream() -> None:
        with urllib.request.urlopen(f"{url}/api/events?runs={run_id}", timeout=600) as events:
            for _ in events:
                if stop.is_set():
                    return

    threading.Thread(target=stream, daemon=True).start()
    while not stop.wait(0.5):
        urllib.request.urlopen(f"{url}/api/runs/{run_id}/services", timeout=10).read()


def run(quick: bool) -> BenchResult:
    from rollway.common.client import open_channel
    from rollway.common.structs import to_struct
    from rollway.common.supervision.service_process import ServiceProcess
    from rollway.coordinator.dashboard import rollout_samples
    from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model

    num_steps, rounds = (4, 1) if quick else (12, 2)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = make_tiny_model(work / "model", seed=0)
        make_demo_data(work / "data", seed=0)
        address_file = work / "dashboard.address"
        coordinator = stack.enter_context(
            ServiceProcess(
                "coordinator",
                ["--runs-root", str(work / "runs"), "--dashboard-address-file", str(address_file)],
                work,
            )
        )
        url = address_file.read_text()
        stub = coordinator_pb2_grpc.CoordinatorServiceStub(open_channel(coordinator.address))
        measured: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        for round_index in range(rounds):  # interleaved, so a busy moment of the machine hits all
            for name, overrides in VARIANTS.items():
                run_id = f"{name}-{round_index}"
                config = to_struct({**_config(model, work / "data", num_steps), **overrides})
                stub.StartRun(coordinator_pb2.StartRunRequest(config=config, run_id=run_id))
                stop = threading.Event()
                if name == "watched":
                    threading.Thread(target=_watch, args=(url, run_id, stop), daemon=True).start()
                while stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run.state in (
                    coordinator_pb2.RUN_STATE_STARTING,
                    coordinator_pb2.RUN_STATE_RUNNING,
                ):
                    time.sleep(0.5)
                stop.set()
                run_dir = work / "runs" / run_id
                records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
                steps = [r for r in records if "perf/step_time" in r][1:]  # the first step warms up
                stored = sorted((run_dir / rollout_samples.ROLLOUTS_DIR).glob("*.gz"))
                measured[name] += [
                    {
                        "step": r["perf/step_time"],
                        "train": r["perf/train_time"],
                        "other": r["perf/step_time"] - sum(r.get(k, 0.0) for k in KNOWN_PHASES),
                        "kb": sum(p.stat().st_size for p in stored) / max(len(stored), 1) / 1024,
                    }
                    for r in steps
                ]
        rows = [
            {
                "variant": name,
                "step_time_s": round(statistics.median(m["step"] for m in values), 4),
                "train_time_s": round(statistics.median(m["train"] for m in values), 4),
                "other_s": round(statistics.median(m["other"] for m in values), 4),
                "stored_kb_per_step": round(values[-1]["kb"], 1),
            }
            for name, values in measured.items()
        ]
    return BenchResult(
        name="dashboard",
        rows=rows,
        units={"step_time_s": "s", "train_time_s": "s", "other_s": "s", "stored_kb_per_step": "KiB"},
        config={"num_steps": num_steps, "samples_per_step": 64, "max_response_len": 8, "model": "tiny (~1M)"},
        notes="tiny model on CPU; one coordinator; the variants interleaved, medians of steps",
    )
