"""The data behind the Rollouts, Services and Step timeline views, from a run's files (and, for a
live run, from its services: health, pid, weight version, samples in flight)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

from rollway.coordinator.dashboard import rollout_samples, run_files, trace_index

# Where a step's time goes, as the timeline stacks it: (label, metric). What is left of
# perf/step_time is "other" (advantages, metrics, dashboard samples, waiting). Dataloading comes
# from the trace (the step's NextBatch calls, made inside its generation) when there is one.
# Rewards are computed by the rollout service as each sample finishes, overlapping generation,
# so they are part of it.
STEP_PHASES = (
    ("dataloading", ""),
    ("generation", "perf/rollout_time"),
    ("training", "perf/train_time"),
    ("weight sync", "perf/weight_sync_time"),
    ("eval", "perf/eval_time"),
    ("checkpoint", "perf/save_time"),
)
HEALTH_TIMEOUT_SECONDS = 1.0
RPC_PREFIX = re.compile(r"^/?rollway\.\w+\.v1\.")  # span names: /rollway.trainer.v1.TrainerService/TrainStep


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str):
    try:
        from tokenizers import Tokenizer
    except ImportError:  # a coordinator installed without the ml extra shows token ids
        return None
    return Tokenizer.from_file(path)


def tokenizer_for(run_dir: Path):
    """The run's tokenizer (tokenizers only, no torch), or None when its checkpoint has none here."""
    config = run_files.read_json(Path(run_dir) / "config.json")
    for component in ("dataloader", "rollout", "trainer"):
        checkpoint = config.get(component, {}).get("hf_checkpoint") or ""
        candidate = Path(checkpoint) / "tokenizer.json"
        if checkpoint and candidate.exists():
            return _tokenizer(str(candidate))
    return None


def rollout_groups(run_dir: Path, step: int) -> dict:
    """One step's stored groups: prompt text, samples with per-token text and values."""
    samples = rollout_samples.read_step(run_dir, step)
    tokenizer = tokenizer_for(run_dir)

    def text(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False) if tokenizer else " ".join(map(str, ids))

    def piece(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer else f"[{token_id}]"

    groups: dict[int, dict] = {}
    for s in samples:
        group = groups.setdefault(
            s["group_index"],
            {
                "group_index": s["group_index"],
                "prompt": text(s["prompt_token_ids"]),
                "label": s.get("label", ""),
                "samples": [],
            },
        )
        ids = s["response_token_ids"]
        tokens = [{"id": t, "text": piece(t)} for t in ids]
        for key in ("rollout_log_probs", "entropy", "train_rollout_log_prob_diff", "trainer_log_probs"):
            for token, value in zip(tokens, s.get(key, []), strict=False):
                token[key] = value
        sample = {k: v for k, v in s.items() if k not in ("prompt_token_ids", "response_token_ids")}
        sample = {k: v for k, v in sample.items() if not isinstance(v, list)}
        group["samples"].append({**sample, "num_tokens": len(ids), "tokens": tokens})
    for group in groups.values():
        rewards = {s["reward"] for s in group["samples"]}
        group["zero_variance"] = len(group["samples"]) > 1 and len(rewards) == 1
        group["mean_reward"] = sum(s["reward"] for s in group["samples"]) / max(len(group["samples"]), 1)
    return {"step": step, "tokenizer": tokenizer is not None, "groups": list(groups.values())}


def step_times(records: list[dict], trace_file: Path | None = None) -> list[dict]:
    """Each training step's time split into the timeline's phases (seconds)."""
    index = trace_index.index_for(trace_file) if trace_file is not None and trace_file.exists() else None
    rows = []
    for r in records:
        if "perf/step_time" not in r:
            continue  # the final evaluation's record
        phases = {label: float(r.get(metric, 0.0)) for label, metric in STEP_PHASES if metric}
        dataloading = index.dataloading(r["step"], r["time"]) if index is not None else None
        phases["dataloading"] = min(dataloading or 0.0, phases["generation"])
        phases["generation"] -= phases["dataloading"]
        # The evaluation before a step is timed apart from it (perf/eval_time), not inside.
        total = r["perf/step_time"] + phases["eval"]
        phases["other"] = max(total - sum(phases.values()), 0.0)
        rows.append({"step": r["step"], "total": total, "phases": phases})
    return rows


def weight_syncs(records: list[dict]) -> list[dict]:
    """Each weight update's phase timings (perf/weight_sync_*), with the version it made."""
    rows = []
    for r in records:
        timings = {k.removeprefix("perf/"): v for k, v in r.items() if k.startswith("perf/weight_sync")}
        if timings:
            rows.append({"step": r["step"], "weight_version": r.get("rollout/weight_version"), **timings})
    return rows


def trace_file_of(run_dir: Path, trace_file: Path | None) -> Path | None:
    """The run's own trace file, else the coordinator's (shared by its runs)."""
    return run_files.trace_path(run_dir) or (trace_file if trace_file and trace_file.exists() else None)


def trace(run_dir: Path, step: int, trace_file: Path | None) -> dict:
    """The spans of one step's trace, times in ms from the step's start."""
    path = trace_file_of(run_dir, trace_file)
    if path is None:
        return {"step": step, "trace_file": None, "spans": []}
    records, _ = run_files.read_metrics(run_dir)
    near = next((r["time"] for r in records if r["step"] == step and "perf/step_time" in r), None)
    spans = run_files.step_spans(Path(path), step, near)
    start = min((s["start_ns"] for s in spans), default=0)
    return {
        "step": step,
        "trace_file": str(path),
        "spans": [
            {
                "name": RPC_PREFIX.sub("", s["name"]),
                "service": (s.get("service") or "").removeprefix("rollway-"),
                "start_ms": (s["start_ns"] - start) / 1e6,
                "duration_ms": (s["end_ns"] - s["start_ns"]) / 1e6,
                "status": s.get("status", ""),
                "span_id": s["span_id"],
                "parent_span_id": s.get("parent_span_id"),
            }
            for s in spans
        ],
    }


def services(run_dir: Path, record=None, coordinator_address: str = "") -> list[dict]:
    """Each service of the run: address, health, pid, weight version, samples in flight, last
    error and log tail. Live services are asked (short deadlines); a finished run's come from logs.
    A live run's coordinator is this process."""
    logs = {(s["name"], s["index"]): s for s in run_files.service_logs(run_dir)}
    rows = []
    if record is not None and not record.finished:
        row = {"name": "coordinator", "index": 0, "address": coordinator_address, "pid": os.getpid()}
        row["health"] = "SERVING"  # it is answering this request
        if record.driver is not None:
            row["weight_version"] = record.driver.state.weight_version
        if ("coordinator", 0) in logs:  # `rollway run` keeps its log with the run
            row["log_path"] = logs[("coordinator", 0)]["log_path"]
        rows.append(row)
    if record is not None and record.addresses:
        processes = getattr(record.group, "processes", {}) if record.group is not None else {}
        for name, addresses in record.addresses.items():
            for index, address in enumerate(addresses):
                process = (processes.get(name) or [None] * (index + 1))[index] if processes else None
                row = {
                    "name": name,
                    "index": index,
                    "address": address,
                    "started_by_run": process is not None,
                }
                if process is not None and process.proc is not None:
                    row["pid"] = process.pid
                    row["log_path"] = str(process.log_path)
                    row["exit_code"] = process.proc.poll()
                elif (name, index) in logs:
                    row["log_path"] = logs[(name, index)]["log_path"]
                if record.finished:
                    row["health"] = "STOPPED"
                else:
                    row.update(_ask(name, address))
                if name == "trainer" and record.driver is not None:
                    row["weight_version"] = record.driver.state.weight_version
                rows.append(row)
    else:
        for entry in logs.values():
            rows.append({**entry, "health": "STOPPED"})
    for row in rows:
        text = run_files.tail(Path(row["log_path"])) if row.get("log_path") else ""
        row["log_tail"] = text
        row["last_error"] = run_files.last_error(text)
    return rows


def _ask(name: str, address: str) -> dict:
    with _untraced():
        return _ask_service(name, address)


@contextlib.contextmanager
def _untraced():
    """Calls made inside leave no spans, here or in the service (the parent is not sampled):
    looking at a run must not add to its trace."""
    import random

    from opentelemetry import context, trace

    span_context = trace.SpanContext(
        trace_id=random.getrandbits(128) or 1,
        span_id=random.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT),
    )
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    try:
        yield
    finally:
        context.detach(token)


def _ask_service(name: str, address: str) -> dict:
    from rollway.common.client import ClientConfig
    from rollway.common.healthcheck import check

    config = ClientConfig(max_retries=0)
    found = {"health": check(address, timeout_seconds=HEALTH_TIMEOUT_SECONDS, client_config=config)}
    if name == "rollout" and found["health"] == "SERVING":
        import grpc

        from rollway.common.client import open_channel
        from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

        with open_channel(address, config) as channel:
            try:
                info = rollout_pb2_grpc.RolloutServiceStub(channel).GetInfo(
                    rollout_pb2.GetInfoRequest(), timeout=HEALTH_TIMEOUT_SECONDS
                )
                found["weight_version"] = info.weight_version
                found["in_flight_samples"] = info.num_samples_in_flight
                found["paused"] = info.paused
            except grpc.RpcError as exc:
                found["info_error"] = f"{exc.code().name}: {exc.details()}"
    return found
