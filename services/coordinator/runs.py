"""The coordinator's runs: each run executes in a thread; the gRPC API starts, watches and stops them."""

from __future__ import annotations

import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from rollway.common.config import ConfigError, from_dict, to_dict
from rollway.common.errors import AlreadyExists, InvalidArgument, NotFound
from rollway.common.log import get_logger
from rollway.common.v1 import common_pb2
from rollway.coordinator.config import CoordinatorConfig
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.metrics import MetricsSink
from rollway.coordinator.remote import Services
from rollway.coordinator.run import Run, RunStopped

log = get_logger("rollway.coordinator.runs")


@dataclass
class RunRecord:
    """A run known to this coordinator."""

    run_id: str
    config: CoordinatorConfig
    run_dir: Path
    state: str = "STARTING"  # STARTING, RUNNING, SUCCEEDED, FAILED, STOPPED
    error: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    run: Run | None = None
    thread: threading.Thread | None = None
    created: float = field(default_factory=time.time)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


def new_run_id() -> str:
    return time.strftime("run-%Y%m%d-%H%M%S-", time.gmtime()) + f"{time.time_ns() % 1_000_000:06d}"


def parse_run_config(mapping: dict) -> CoordinatorConfig:
    """Validate a StartRun config; errors name the setting."""
    try:
        return from_dict(CoordinatorConfig, mapping)
    except ConfigError as exc:
        raise InvalidArgument(f"config.{exc.setting}", exc.problem) from None


def execute(record: RunRecord, *, progress: bool = False) -> None:
    """Connect to the run's services and drive the run to its end (in the calling thread)."""
    c = record.config
    services = None
    try:
        services = Services.connect(
            dataloader=c.dataloader_addr if not c.load_debug_rollout_data else "",
            trainer=c.trainer_addr if not c.debug_rollout_only else "",
            rollouts=c.rollout_addr if not c.train_only else [],
        )
        evaluator = None
        if c.eval_prompt_data and not c.train_only:
            sampling = common_pb2.SamplingParams(
                temperature=c.eval_temperature,
                top_p=1.0,
                top_k=-1,
                max_new_tokens=c.rollout_max_response_len,
                seed=c.rollout_seed,
            )
            evaluator = Evaluator(
                services,
                c.eval_prompt_data[::2],
                n_samples=c.n_samples_per_eval_prompt,
                sampling=sampling,
                reward=c.rm_type,
            )
        record.run = Run(
            c,
            services,
            record.run_dir,
            evaluator=evaluator,
            stop=record.stop,
            trainer_settings=c.trainer_settings,
            progress=progress,
        )
        record.state = "RUNNING"
        final = record.run.execute()
        record.state = "SUCCEEDED"
        (record.run_dir / "result.json").write_text(
            json.dumps(
                {"run_id": record.run_id, "final_metrics": final, "hf_export_dir": record.run.hf_export_dir},
                indent=1,
            )
        )
    except RunStopped:
        record.state = "STOPPED"
    except Exception as exc:  # the run fails; the coordinator keeps serving
        record.state = "FAILED"
        record.error = describe_error(exc)
        log.error("run failed", run_id=record.run_id, error=record.error, traceback=traceback.format_exc())
    finally:
        if services is not None:
            services.close()


def describe_error(exc: BaseException) -> str:
    """One line for a failed run: a service's status and message, or the exception."""
    import grpc

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"a service call failed: {exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class RunManager:
    """Runs of this coordinator process, by id."""

    def __init__(self, default_run_root: str = "runs"):
        self.default_run_root = default_run_root
        self._runs: dict[str, RunRecord] = {}
        self._lock = threading.Lock()

    def start(self, mapping: dict, run_id: str = "") -> RunRecord:
        config = parse_run_config(mapping)
        run_id = run_id or config.run_id or new_run_id()
        run_dir = Path(config.run_dir or self.default_run_root) / run_id
        with self._lock:
            if run_id in self._runs and self._runs[run_id].state in ("STARTING", "RUNNING"):
                raise AlreadyExists(f"run {run_id} is already running")
            record = RunRecord(run_id=run_id, config=config, run_dir=run_dir)
            self._runs[run_id] = record
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=1))
        record.thread = threading.Thread(target=execute, args=(record,), name=f"run-{run_id}", daemon=True)
        record.thread.start()
        log.info("run started", run_id=run_id, run_dir=str(run_dir))
        return record

    def get(self, run_id: str) -> RunRecord:
        with self._lock:
            if run_id not in self._runs:
                raise NotFound(f"run_id: no run {run_id!r}")
            return self._runs[run_id]

    def list(self) -> list[RunRecord]:
        with self._lock:
            return sorted(self._runs.values(), key=lambda r: r.created, reverse=True)

    def stop(self, run_id: str) -> RunRecord:
        record = self.get(run_id)
        record.stop.set()
        return record

    def follow(self, run_id: str, from_step: int):
        """Metrics records of a run from `from_step`, following until the run ends."""
        record = self.get(run_id)
        deadline = time.monotonic() + 60
        while record.run is None and record.state in ("STARTING",) and time.monotonic() < deadline:
            time.sleep(0.05)
        if record.run is None:
            yield from (r for r in MetricsSink.read(record.metrics_path) if r["step"] >= from_step)
            return
        yield from record.run.sink.follow(from_step)
        if record.thread is not None:
            record.thread.join(30)  # the stream ends once the run's final state is visible to GetRun

    def stop_all(self) -> None:
        for record in self.list():
            record.stop.set()
