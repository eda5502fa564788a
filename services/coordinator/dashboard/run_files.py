"""What the dashboard reads from a run directory; the run writes these files, the dashboard only reads.

RUN_DIR/metrics.jsonl     one record per step (metrics.py)
RUN_DIR/config.json       the config as given and as resolved per component (runs.py)
RUN_DIR/status.json       the final state and error (written when the run ends)
RUN_DIR/notices.jsonl     what the run survived, a line each: recoveries, skipped checkpoints
RUN_DIR/result.json       final metrics of a run that succeeded
RUN_DIR/rollouts/         sampled rollouts per step (rollout_samples.py)
RUN_DIR/services/*.log    logs of the services the run started (JSON lines)
RUN_DIR/trace.jsonl       spans of every service, when the run was traced (`rollway run` does)
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

from rollway.coordinator.step_pace import pace_of

STATUS_FILE = "status.json"
NOTICES_FILE = "notices.jsonl"
TRACE_FILE = "trace.jsonl"
LOG_TAIL_LINES = 40
# Local service logs are named SERVICE-LAUNCHERPID-NS.log, next to SERVICE-LAUNCHERPID-NS.port.
SERVICE_LOG = re.compile(r"(dataloader|rollout|trainer|coordinator)-\d+-(\d+)\.log")


STATUS_RESERVED_BYTES = 4096


def reserve_status(run_dir: Path) -> None:
    """At a run's start: a status.json with no state yet, padded to STATUS_RESERVED_BYTES, so that
    the run's ending can be recorded even once the disk is full (write_status)."""
    path = Path(run_dir) / STATUS_FILE
    path.write_bytes(_padded({"state": "", "error": "", "time": time.time()}))


STARTED_FILE = "started.json"


def write_started(run_dir: Path, started: float) -> None:
    """When the run's services were up and its loop began (GetRun's started_time)."""
    (Path(run_dir) / STARTED_FILE).write_text(json.dumps({"time": started}))


def write_status(run_dir: Path, state: str, error: str = "", ended: float | None = None) -> None:
    """Record how a run ended, so a finished run's directory tells it (the dashboard's Runs view).

    Replaced atomically; when that cannot be written (a full disk: the run may have failed of it),
    the reserved file is overwritten in place, which needs no new blocks."""
    path = Path(run_dir) / STATUS_FILE
    status = {"state": state, "error": error, "time": ended or time.time()}
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(status))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        if not path.is_file() or path.stat().st_size < STATUS_RESERVED_BYTES:
            raise
        with open(path, "r+b") as f:
            f.write(_padded(status))
            f.flush()
            os.fsync(f.fileno())


def _padded(status: dict) -> bytes:
    """The status as JSON, its error cut to fit, padded with spaces to the reserved size."""
    error = status["error"]
    while True:
        text = json.dumps({**status, "error": error}).encode()
        over = len(text) - STATUS_RESERVED_BYTES
        if over <= 0:
            return text.ljust(STATUS_RESERVED_BYTES)
        error = error[: max(len(error) - over - 3, 0)] + "..."


def append_notice(run_dir: Path, line: str) -> None:
    with (Path(run_dir) / NOTICES_FILE).open("a") as f:
        f.write(json.dumps({"time": time.time(), "notice": line}) + "\n")


def read_notices(run_dir: Path) -> list[dict]:
    try:
        lines = (Path(run_dir) / NOTICES_FILE).read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


class _MetricsFile:
    """metrics.jsonl parsed once: each read parses only what was appended since the last one
    (a dashboard open on a long run polls it twice a second). A file rewritten in place (a
    resumed run drops the steps it redoes) is read again from its start."""

    def __init__(self, path: Path):
        self.path = path
        self.inode = None
        self.offset = 0
        self.records: list[dict] = []
        self.lock = threading.Lock()

    def read(self) -> list[dict]:
        with self.lock:
            try:
                with open(self.path, "rb") as f:
                    stat = os.fstat(f.fileno())
                    if stat.st_ino != self.inode or stat.st_size < self.offset:
                        self.inode, self.offset, self.records = stat.st_ino, 0, []
                    f.seek(self.offset)
                    data = f.read()
            except OSError:
                return []
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
            self.offset += len(complete)
            for line in complete.splitlines():
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    continue
            return self.records


_metrics_files: dict[Path, _MetricsFile] = {}
_metrics_lock = threading.Lock()


def read_metrics(run_dir: Path, from_record: int = 0) -> tuple[list[dict], int]:
    """Records of metrics.jsonl from the `from_record`-th on, and how many there are now."""
    path = Path(run_dir) / "metrics.jsonl"
    with _metrics_lock:
        cached = _metrics_files.setdefault(path, _MetricsFile(path))
    records = cached.read()
    return records[from_record:], len(records)


def finished_state(run_dir: Path) -> tuple[str, str]:
    """(state, error) of a run from its files: status.json, else result.json (SUCCEEDED), else
    UNKNOWN (a run still going elsewhere, or whose coordinator died)."""
    status = read_json(Path(run_dir) / STATUS_FILE)
    if status.get("state"):
        return status["state"], status.get("error", "")
    if (Path(run_dir) / "result.json").exists():
        return "SUCCEEDED", ""
    return "UNKNOWN", ""


def num_steps(run_dir: Path) -> int:
    config = read_json(Path(run_dir) / "config.json")
    return int(config.get("coordinator", {}).get("num_rollout", 0) or 0)


def eval_interval(run_dir: Path) -> int:
    config = read_json(Path(run_dir) / "config.json")
    return int(config.get("coordinator", {}).get("eval_interval", 0) or 0)


def progress(
    records: list[dict], num_steps: int, state: str, since: float = 0.0, eval_interval: int = 0
) -> dict:
    """Steps done, total, seconds per step and per evaluation, and the ETA of a run from its
    metrics records (the pace of those written from `since` on: a resumed run's attempt)."""
    steps = [r for r in records if num_steps == 0 or r["step"] < num_steps]
    done = (max(r["step"] for r in steps) + 1) if steps else 0
    # Wall time between step ends less the evaluations, which are paced apart (step_pace.py).
    pace = pace_of(steps, num_steps, since, eval_interval)
    eta = pace.eta_seconds() if state in ("RUNNING", "STARTING") else None
    return {
        "step": done,
        "num_steps": num_steps,
        "seconds_per_step": pace.seconds_per_step,
        "seconds_per_eval": pace.seconds_per_eval,
        "eta_seconds": eta,
    }


def tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a file, reading at most its last `max_bytes`."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - max_bytes, 0))
            data = f.read().decode("utf8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def last_error(log_text: str) -> str:
    """The last error or warning-with-traceback a JSON-lines service log holds ('' if none)."""
    for line in reversed(log_text.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:
            if "Traceback" in line or line.startswith(("Error", "RuntimeError")):
                return line
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "critical", "exception"):
            detail = entry.get("error") or entry.get("exception") or ""
            return f"{entry.get('event', '')}: {detail}".strip(": ")
    return ""


def service_logs(run_dir: Path) -> list[dict]:
    """The services a run started locally: name, index (by start order), address, log path."""
    folder = Path(run_dir) / "services"
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = SERVICE_LOG.fullmatch(path.name)
        if match:
            port = path.with_suffix(".port")
            address = f"127.0.0.1:{port.read_text().strip()}" if port.exists() else ""
            found.append((int(match.group(2)), match.group(1), address, path))
    found.sort()
    counts: dict[str, int] = {}
    services = []
    for _, name, address, path in found:
        index = counts[name] = counts.get(name, -1) + 1
        services.append({"name": name, "index": index, "address": address, "log_path": str(path)})
    return services


def trace_path(run_dir: Path) -> Path | None:
    path = Path(run_dir) / TRACE_FILE
    return path if path.exists() else None


def step_spans(trace_file: Path, step: int, near_time: float | None = None) -> list[dict]:
    """Every span of one step's trace (the root rl_step/sft_step span with that step, and all spans
    sharing its trace id). Several runs may share a file: the root nearest `near_time` (the step's
    metrics record time, written inside the root span) is taken."""
    roots = []
    by_trace: dict[str, list[dict]] = {}
    with open(trace_file) as f:
        for line in f:
            try:
                span = json.loads(line)
            except ValueError:
                continue
            by_trace.setdefault(span["trace_id"], []).append(span)
            if span["name"] in ("rl_step", "sft_step") and span.get("attributes", {}).get("step") == step:
                roots.append(span)
    if not roots:
        return []
    if near_time is not None:
        root = min(roots, key=lambda s: abs(s["end_ns"] / 1e9 - near_time))
    else:
        root = roots[-1]
    # By start; the root first where a call starts in the same nanosecond as its step.
    return sorted(
        by_trace[root["trace_id"]], key=lambda s: (s["start_ns"], s.get("parent_span_id") is not None)
    )
