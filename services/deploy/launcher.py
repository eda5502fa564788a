"""`rollway run CONFIG`: validate a run config, start the services it needs, drive the run.

    rollway run CONFIG [--flag value ...]                 embedded: local processes on loopback
    rollway run CONFIG --trainer-addr A --rollout-addr B ...   attach to running services
    rollway run CONFIG ... --coordinator-addr C           ... and to a running coordinator
    rollway run CONFIG --launcher ray [--ray-address R]   ... the coordinator starts them as Ray actors
    rollway plan CONFIG [--memory-budget GIB]             print the batch arithmetic and memory plan

The run config is one flat namespace (Miles' flags). Every component's settings dataclass is
parsed from it, so a wrong value anywhere is reported, naming the setting, before anything
starts. This process then starts a coordinator (unless given one) and sends it the run
(StartRun); the coordinator starts the services the run needs (local processes, or Ray actors
with `launcher: ray`), supervises and stops them. This process follows StreamMetrics with a
progress line, restarts a dead coordinator, and stops everything (by pid) on exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rollway.common.client import wait_until_serving
from rollway.common.config import parse_components
from rollway.common.run_components import run_components
from rollway.coordinator.plan.text import plan

TAIL_LINES = 30


def parse_run_config(
    argv: list[str], prog: str = "rollway run", given: dict | None = None
) -> dict[str, object]:
    """All components' settings from `CONFIG [flags]`; exits 2 naming a wrong setting. `given`
    receives the settings as written (the file, then the flags): what StartRun is sent."""
    if argv and not argv[0].startswith("-"):
        argv = ["--config", argv[0], *argv[1:]]
    classes = run_components()
    parsed = parse_components(list(classes.values()), argv, prog=prog, given=given)
    return dict(zip(classes, parsed, strict=True))


def typed(given: dict) -> dict:
    """The settings with each value as its setting's type: flags arrive as text, and StartRun
    takes typed JSON (it converts nothing: "1e-3" for a number is refused there)."""
    import dataclasses

    from rollway.common.config import coerce_setting

    out = {}
    for key, value in given.items():
        out[key] = value
        for cls in run_components().values():
            names = {f.name: f.name for f in dataclasses.fields(cls)}
            names.update(
                {a.replace("-", "_"): f.name for f in dataclasses.fields(cls) for a in f.metadata["aliases"]}
            )
            if key in names:
                out[key] = coerce_setting(cls, names[key], value)  # parse_run_config has accepted it
                break
    return out


def parse_launcher_options(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Where the run goes (not run settings): --coordinator-addr, --trace-file; and the rest. Where
    its services go (--launcher, --ray-address) are run settings: StartRun takes them too."""
    parser = argparse.ArgumentParser(prog="rollway run", add_help=False, allow_abbrev=False)
    group = parser.add_argument_group("placement (deploy/README.md)")
    group.add_argument("--coordinator-addr", default="", help="a running coordinator to start the run on")
    group.add_argument(
        "--trace-file", default="", help="JSON-lines span file of the coordinator this command starts"
    )
    group.add_argument(
        "--memory-budget",
        type=float,
        default=0.0,
        help="GiB of memory the run may use (default: this machine's available memory)",
    )
    group.add_argument(
        "--ignore-memory-plan",
        action="store_true",
        help="start the run even where its memory plan does not fit (coordinator/plan/memory.py)",
    )
    if "-h" in argv or "--help" in argv:  # the run settings' help follows
        print(parser.format_help().split("\n\n", 1)[1])
    return parser.parse_known_args(argv)


def run(argv: list[str]) -> int:
    options, argv = parse_launcher_options(argv)
    given: dict = {}
    configs = parse_run_config(argv, given=given)
    c = configs["coordinator"]
    from rollway.common.supervision.supervisor import LocalServiceGroup
    from rollway.coordinator.runs import check_run_id, new_run_id

    run_id = c.run_id or new_run_id()
    try:
        check_run_id(run_id)
    except Exception as exc:
        print(f"rollway run: {exc}", file=sys.stderr)
        return 2
    if not options.coordinator_addr and not memory_allows(configs, options, given):
        return 2
    if not options.coordinator_addr:
        warn_no_op_settings(configs)
    run_dir = (Path(c.run_dir or "runs") / run_id).resolve()
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    # The coordinator starts the services the run needs (StartRun's own code path) and stops them.
    # Its dashboard writes its address here; spans of every service go to the run's trace file
    # (the dashboard's step timeline) unless the command names another.
    dashboard_file = run_dir / "services" / "dashboard.address"
    dashboard_file.unlink(missing_ok=True)
    coordinator_args = ["--runs-root", str(run_dir.parent), "--dashboard-address-file", str(dashboard_file)]
    coordinator_args += ["--trace-file", options.trace_file or str(run_dir / "trace.jsonl")]
    group = LocalServiceGroup(run_dir / "services", args={"coordinator": coordinator_args})
    try:
        coordinator_address = options.coordinator_addr
        if coordinator_address:
            wait_until_serving(coordinator_address, 120.0)
        else:
            print("starting the coordinator ...", flush=True)
            coordinator_address = group.start({"coordinator": 1})["coordinator"][0]
            if dashboard_file.exists():  # written before the coordinator reports SERVING
                print(f"dashboard: {dashboard_file.read_text()}/?run={run_id}", flush=True)
        # A coordinator elsewhere writes under its own --runs-root unless the config names a run_dir.
        remote_default = options.coordinator_addr and not c.run_dir
        settings = {
            **typed(given),
            "run_id": run_id,
            "run_dir": "" if remote_default else str(run_dir.parent),
        }
        print(
            f"run {run_id}: {'(coordinator ' + coordinator_address + ')' if remote_default else run_dir}",
            flush=True,
        )
        restarts = 0
        while True:
            code = _drive(
                coordinator_address, run_id, settings, c.num_rollout, _describe_dead(group), interrupted,
                eval_interval=c.eval_interval,
            )  # fmt: skip
            if code != COORDINATOR_CRASHED or options.coordinator_addr or restarts >= c.max_restarts:
                _count_coordinator_restarts(run_dir, restarts)
                return 1 if code == COORDINATOR_CRASHED else code
            # The services it started die with it; a new one starts them again and resumes the run
            # from its last checkpoint (StartRun with the same run id).
            restarts += 1
            print(f"restarting the coordinator ({restarts}/{c.max_restarts})", file=sys.stderr, flush=True)
            coordinator_address = group.restart("coordinator", 0)
            settings["resume"] = True  # the same run id exists now: continue it, explicitly
    finally:
        signal.signal(signal.SIGINT, previous)
        group.stop()


def _count_coordinator_restarts(run_dir: Path, restarts: int) -> None:
    """result.json counts the coordinator's own restarts too (only this launcher saw them)."""
    path = run_dir / "result.json"
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # the run did not succeed: no result to add to
    result["num_coordinator_restarts"] = restarts
    path.write_text(json.dumps(result, indent=1))


# How long the metrics stream may take to end after the run has (its last records come then).
STREAM_END_SECONDS = 15.0

# _drive's status when a process this launcher started (the coordinator) died: it may be restarted.
COORDINATOR_CRASHED = -1


def _describe_dead(group) -> Callable[[], str | None]:
    """The launcher's view of its supervisor: a description of the first dead service, or None."""

    def dead() -> str | None:
        found = group.dead()
        return str(found) if found else None

    return dead


def _drive(
    address: str,
    run_id: str,
    settings: dict,
    num_steps: int,
    dead: Callable[[], str | None],
    interrupted: threading.Event,
    eval_interval: int = 0,
) -> int:
    """StartRun, follow metrics with a progress line, stop on Ctrl-C; `dead()` describes a crashed
    service this launcher started (the coordinator), reported with its log tail; `eval_interval`
    tells the line's ETA which steps begin with an evaluation."""
    import grpc

    from rollway.common.client import open_channel
    from rollway.common.structs import to_struct
    from rollway.coordinator.metrics import ProgressLine
    from rollway.coordinator.run_config import jsonable
    from rollway.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc

    stub = coordinator_pb2_grpc.CoordinatorServiceStub(open_channel(address))
    try:
        started = stub.StartRun(
            coordinator_pb2.StartRunRequest(config=to_struct(jsonable(settings)), run_id=run_id)
        ).run
    except grpc.RpcError as exc:
        print(f"run refused: {exc.details()}", file=sys.stderr)
        return 2
    # The coordinator's count: a num_epoch run's steps are known once it has read the data. A
    # resumed run's stream replays the earlier attempts' records: from this attempt's start (on the
    # coordinator's clock, which stamps the records) the line shows steps and counts their pace.
    progress = ProgressLine(
        started.num_steps or num_steps, since=started.created_time, eval_interval=eval_interval
    )
    stream = stub.StreamMetrics(coordinator_pb2.StreamMetricsRequest(run_id=run_id), timeout=1e7)
    follower = threading.Thread(
        target=lambda: [progress.update(r.step + 1, dict(r.metrics), at=r.time) for r in _quiet(stream)],
        daemon=True,
    )
    follower.start()
    notices_shown = startup_shown = 0
    try:
        while True:
            crashed = dead()
            if crashed:
                print(f"service crashed: {crashed}", file=sys.stderr)
                _stop_quietly(stub, run_id)
                return COORDINATOR_CRASHED
            info = stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id), timeout=10.0).run
            # What the run survived (a recovery is told before its services are loaded again),
            # then what it loads and how long that took.
            for line in info.notices[notices_shown:]:
                print(line, file=sys.stderr, flush=True)
            notices_shown = len(info.notices)
            for line in info.startup[startup_shown:]:
                print(line, flush=True)
            startup_shown = len(info.startup)
            if info.state not in (coordinator_pb2.RUN_STATE_STARTING, coordinator_pb2.RUN_STATE_RUNNING):
                # The stream ends by itself with the run, its last step's records last (they wait
                # for the final state): let it print them before it is cancelled.
                follower.join(STREAM_END_SECONDS)
                break
            if interrupted.is_set():
                print("stopping the run (Ctrl-C)", file=sys.stderr)
                stub.StopRun(coordinator_pb2.StopRunRequest(run_id=run_id), timeout=10.0)
                interrupted.clear()
            time.sleep(0.5)
    except grpc.RpcError as exc:
        crashed = _wait_for(dead, 5.0)  # the coordinator process may be exiting: name it when it has
        print(f"service crashed: {crashed}" if crashed else f"the coordinator at {address} stopped answering: "
              f"{exc.code().name}: {exc.details()}", file=sys.stderr)  # fmt: skip
        return COORDINATOR_CRASHED if crashed else 1
    finally:
        stream.cancel()
    follower.join(10)
    state = coordinator_pb2.RunState.Name(info.state).removeprefix("RUN_STATE_")
    print(f"run {run_id} {state}" + (f": {info.error}" if info.error else ""), flush=True)
    return 0 if info.state == coordinator_pb2.RUN_STATE_SUCCEEDED else 1


def _wait_for(dead: Callable[[], str | None], seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = dead()
        if found:
            return found
        time.sleep(0.1)
    return None


def _stop_quietly(stub, run_id: str) -> None:
    import grpc

    from rollway.coordinator.v1 import coordinator_pb2

    try:
        stub.StopRun(coordinator_pb2.StopRunRequest(run_id=run_id, immediate=True), timeout=10.0)
    except grpc.RpcError:
        pass  # the coordinator itself is what died


def _quiet(stream):
    import grpc

    try:
        yield from stream
    except grpc.RpcError:
        return


def warn_no_op_settings(configs: dict[str, object]) -> None:
    """Say so where a setting does nothing on this machine (a trainer started here, no GPU)."""
    from rollway.coordinator.plan.host import gpu_present, services_started_here

    if (
        configs["trainer"].fsdp_cpu_offload
        and "trainer" in services_started_here(configs)
        and not gpu_present()
    ):
        print(
            "warning: fsdp_cpu_offload does nothing on CPU (no GPU here): the trainer's parameters, "
            "gradients and optimizer state are in host memory already",
            file=sys.stderr,
            flush=True,
        )


def memory_allows(configs: dict[str, object], options: argparse.Namespace, given: dict | None = None) -> bool:
    """The memory plan of the services this run starts here fits (or --ignore-memory-plan): else
    the refusal, with the numbers and what to change, goes to stderr. An unset max_tokens_per_gpu
    whose default does not fit is lowered to the largest that does (in `given` and `configs`)."""
    import dataclasses

    from rollway.coordinator.plan.coefficients import GIB
    from rollway.coordinator.plan.host import available_memory, gpu_present, services_started_here
    from rollway.coordinator.plan.memory import default_micro_batch, plan_memory
    from rollway.coordinator.plan.shape import ModelShapeError
    from rollway.coordinator.plan.text import memory_text, refusal

    started = services_started_here(configs)
    budget = int(options.memory_budget * GIB) or available_memory()
    if not started or not budget:
        return True
    on_gpu = gpu_present()
    try:
        found = plan_memory(configs, budget, started, on_gpu)
    except ModelShapeError as exc:  # a missing model is refused by StartRun's checks
        print(f"memory plan: not checked: {exc}", file=sys.stderr)
        return True
    chosen = default_micro_batch(found, configs, given or {})
    if chosen and given is not None:
        print(
            f"memory plan: max_tokens_per_gpu {chosen}, the largest micro-batch that fits "
            f"(the default {configs['trainer'].max_tokens_per_gpu} would need {found.total / GIB:.2f} "
            f"GiB, {found.budget / GIB:.2f} usable)",
            file=sys.stderr,
        )
        given["max_tokens_per_gpu"] = chosen
        configs["trainer"] = dataclasses.replace(configs["trainer"], max_tokens_per_gpu=chosen)
        found = plan_memory(configs, budget, started, on_gpu)
    if found.fits:
        return True
    if options.ignore_memory_plan:
        print(f"memory plan: {refusal(found, configs)} (ignored)", file=sys.stderr)
        return True
    print(f"run refused: {refusal(found, configs)}", file=sys.stderr)
    print(memory_text(found), file=sys.stderr)
    return False


def plan_main(argv: list[str]) -> int:
    from rollway.coordinator.plan.coefficients import GIB
    from rollway.coordinator.plan.host import available_memory, gpu_present, services_started_here
    from rollway.coordinator.plan.memory import default_micro_batch, plan_memory
    from rollway.coordinator.plan.shape import ModelShapeError
    from rollway.coordinator.plan.text import memory_text

    options, argv = parse_launcher_options(argv)
    given: dict = {}
    configs = parse_run_config(argv, prog="rollway plan", given=given)
    print(plan(configs))
    if configs["coordinator"].launcher == "ray":
        from rollway.common.supervision.ray_cluster import read_cluster
        from rollway.coordinator.plan.text import ray_placement_text

        nodes, source = read_cluster(configs["coordinator"].ray_address)
        print(ray_placement_text(configs, nodes, source))
    started = services_started_here(configs) or ["dataloader", "rollout", "trainer"]
    budget = int(options.memory_budget * GIB) or available_memory()
    try:
        found = plan_memory(configs, budget, started, gpu_present())
    except ModelShapeError as exc:
        print(f"memory plan: not available: {exc}")
        return 0
    print(memory_text(found))
    chosen = default_micro_batch(found, configs, given)
    if chosen:
        print(f"  max_tokens_per_gpu is unset: rollway run lowers it to {chosen}, the largest that fits")
    return 0
