"""The start of a run: its services started or attached, each told the run's settings, agreed.

    addresses in the config? ──no──> the run's launcher: LocalServiceGroup.start (bare processes,
                                     in parallel) or RayServiceGroup.start (actors; launcher: ray)
    remote_environment? ──> its Environment service too (a local process serving it); its address
                            is the rollout services' environment_url
    openenv_app? ──> an OpenEnv host process (rollway.openenv_host) instead: openenv_url
    Services.connect (health SERVING; an unreachable address fails in seconds, naming it)
    Init on every service at once, each with its part of the run config (run_config.py)
    agreement: model, vocabulary, temperature, estimator ──> a mismatch refuses the run, naming both

At the end of the run (any end), every service gets EndRun (freeing it for the next run) and the
services the run started are stopped.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from rollway.common.client import open_channel
from rollway.common.log import get_logger
from rollway.common.structs import to_struct
from rollway.common.supervision.supervisor import LocalServiceGroup, ServiceGroup
from rollway.common.tracing import in_current_context
from rollway.coordinator.remote import LONG_CALL_SECONDS, Services
from rollway.coordinator.run_config import COMPONENTS, RunConfig, jsonable
from rollway.dataloader.v1 import dataloader_pb2, dataloader_pb2_grpc
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc

log = get_logger("rollway.coordinator.run_start")
END_RUN_SECONDS = 10.0
HUNG_END_RUN_SECONDS = 600.0  # how long a hung service has to wake up and take its EndRun


class RunRefused(RuntimeError):
    """The run's services cannot serve it together (they disagree, or one refused its Init)."""


# StartRun's check that attached services answer: short, so a refusal comes in seconds.
ATTACHED_CHECK_SECONDS = 3.0
ADDRESS_SETTINGS = {"dataloader": "dataloader_addr", "rollout": "rollout_addr", "trainer": "trainer_addr"}


def attached_services_down(run: RunConfig) -> list[tuple[str, str]]:
    """(setting, problem) for each service address the run gives that does not answer now: found
    before StartRun answers, instead of a run that fails seconds later."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from rollway.common.client import open_channel

    attached = [(name, address) for name, group in run.addresses().items() for address in group if address]

    def problem(name: str, address: str) -> tuple[str, str] | None:
        # Only a service that does not answer is down: one that answers NOT_SERVING is starting
        # (engines loading) or busy, and the run's connect waits for it as before.
        setting = ADDRESS_SETTINGS.get(name, name)
        with open_channel(address) as channel:
            try:
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=ATTACHED_CHECK_SECONDS
                )
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return setting, f"{address}: the {name} does not answer ({exc.code().name})"
        return None

    if not attached:
        return []
    with ThreadPoolExecutor(len(attached)) as pool:
        found = list(pool.map(lambda pair: problem(*pair), attached))
    return [p for p in found if p is not None]


def start_missing_services(
    run: RunConfig, workdir: Path, run_id: str = ""
) -> tuple[dict[str, list[str]], ServiceGroup | None]:
    """Addresses of every service the run uses, starting those the config gives no address for
    with the run's launcher; what the placement decided becomes part of the run's settings."""
    addresses = run.addresses()
    missing = {name: 1 for name, given in addresses.items() if not given}
    if not missing:
        return addresses, None
    c = run.coordinator
    if c.launcher == "ray":
        from rollway.common.supervision.ray_services import RayServiceGroup

        group = RayServiceGroup(run, workdir, name=run_id or workdir.parent.name, ray_address=c.ray_address)
    else:
        environment = {"environment": run.environment_args()} if run.managed_environment else {}
        module = run.environment_module
        # The run restarts a dead trainer, so a trainer whose ranks broke exits to be restarted
        # with all of them (trainer/broken_ranks.py).
        trainer = {"trainer": ["--exit-when-ranks-break"]}
        group = LocalServiceGroup(
            workdir,
            args={**environment, **trainer},
            http_services={"environment": module} if module else None,
        )
    log.info("starting services", services=sorted(missing), launcher=c.launcher)
    addresses.update(group.start(missing))
    if run.managed_environment:
        run.use_environment(addresses["environment"][0])
    apply_placement(run, group)
    return addresses, group


def apply_placement(run: RunConfig, group: ServiceGroup) -> None:
    """What the placement decided (where the weight group meets, ...) becomes part of the run's
    settings, pushed to the services that declare it at their Init; again after a restart moved
    a service (trainer rank 0 on another node)."""
    for key, value in group.placement_settings().items():
        run.given[key] = value
        for name in COMPONENTS:
            if hasattr(run.component(name), key):
                setattr(run.component(name), key, value)


def connect(addresses: dict[str, list[str]]) -> Services:
    return Services.connect(
        dataloader=(addresses.get("dataloader") or [""])[0],
        trainer=(addresses.get("trainer") or [""])[0],
        rollouts=addresses.get("rollout", []),
    )


def init_services(
    services: Services,
    run: RunConfig,
    run_id: str,
    *,
    rebuild: bool = False,
    fresh: frozenset[str] = frozenset(),
    seconds: dict[str, float] | None = None,
) -> dict[str, object]:
    """Init every service at once with its settings; the replies by service (rollout_i). `rebuild`:
    every service starts the run's state afresh (a recovery resumes from the last checkpoint),
    except those in `fresh` (trainer, dataloader, rollout_i): new processes, with no state of the
    run to drop (a rebuild there would also drop trainer ranks that a launcher started for it).
    `seconds` receives each service's Init time (the startup lines name the slow one)."""
    seconds = {} if seconds is None else seconds
    calls = {}
    started = time.monotonic()  # the calls start together: each one's time runs from here
    with ThreadPoolExecutor(2 + len(services.rollouts)) as pool:
        if services.trainer is not None:
            request = trainer_pb2.InitRequest(
                config=_struct(run, "trainer"), run_id=run_id, rebuild=rebuild and "trainer" not in fresh
            )
            calls["trainer"] = pool.submit(
                in_current_context(services.trainer.Init), request, timeout=LONG_CALL_SECONDS
            )
        if services.dataloader is not None:
            request = dataloader_pb2.InitRequest(
                config=_struct(run, "dataloader"),
                run_id=run_id,
                rebuild=rebuild and "dataloader" not in fresh,
            )
            calls["dataloader"] = pool.submit(
                in_current_context(services.dataloader.Init), request, timeout=LONG_CALL_SECONDS
            )
        for i, stub in enumerate(services.rollouts):
            request = rollout_pb2.InitRequest(
                config=_struct(run, "rollout"), run_id=run_id, rebuild=rebuild and f"rollout_{i}" not in fresh
            )
            calls[f"rollout_{i}"] = pool.submit(
                in_current_context(stub.Init), request, timeout=LONG_CALL_SECONDS
            )
        for name, call in calls.items():  # before waiting on any: a call's time is its own
            call.add_done_callback(functools.partial(_record_seconds, seconds, name, started))
        replies, refusals = {}, []
        for name, call in calls.items():
            try:
                replies[name] = call.result()
            except grpc.RpcError as exc:
                refusals.append(f"{name} refused the run: {exc.code().name}: {exc.details()}")
    if refusals:
        end_run(services, run_id)
        raise RunRefused("; ".join(refusals))
    problems = disagreements(run, replies)
    if problems:
        end_run(services, run_id)
        raise RunRefused("the run's services disagree: " + "; ".join(problems))
    return replies


def _record_seconds(seconds: dict[str, float], name: str, started: float, _call) -> None:
    seconds[name] = time.monotonic() - started  # run by the pool when the call ends


def _struct(run: RunConfig, name: str):
    return to_struct(jsonable(run.service_settings(name)))


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def disagreements(run: RunConfig, replies: dict[str, object]) -> list[str]:
    """What the services must agree on and do not, each naming both values."""
    c = run.coordinator
    problems = []
    models = {name: reply.settings["hf_checkpoint"] for name, reply in replies.items()}
    reference = next(iter(models.items()), None)
    for name, model in models.items():
        if reference and not _same_path(model, reference[1]):
            problems.append(f"hf_checkpoint: {reference[0]} has {reference[1]!r}, {name} has {model!r}")
    vocab = {name: int(reply.vocab_size) for name, reply in replies.items() if name != "dataloader"}
    first = next(iter(vocab.items()), None)
    for name, size in vocab.items():
        if first and size != first[1]:
            problems.append(f"vocabulary: {first[0]} has {first[1]} tokens, {name} has {size}")
    if "dataloader" in replies and first and replies["dataloader"].vocab_size > first[1]:
        problems.append(
            f"vocabulary: the dataloader's tokenizer has {replies['dataloader'].vocab_size} tokens, "
            f"more than {first[0]}'s model ({first[1]})"
        )
    trainer = replies.get("trainer")
    if trainer is not None and not c.is_sft:
        # The coordinator computes the group part of the estimator, the trainer its token part;
        # dr_grpo's loss divides by the response budget the rollout samples with.
        shared = ["rollout_temperature", "advantage_estimator"]
        if c.advantage_estimator == "dr_grpo":
            shared.append("rollout_max_response_len")
        for setting in shared:
            ours, theirs = getattr(c, setting), trainer.settings[setting]
            if ours != theirs:
                problems.append(f"{setting}: the run has {ours!r}, the trainer has {theirs!r}")
    dataloader = replies.get("dataloader")
    if dataloader is not None and dataloader.settings["mode"] != "auto":
        wanted = "sft" if c.is_sft else "rl"
        if dataloader.settings["mode"] != wanted:
            problems.append(f"mode: the run is {wanted}, the dataloader serves {dataloader.settings['mode']}")
    return problems


END_RUN_MESSAGES = {
    "trainer": (trainer_pb2_grpc.TrainerServiceStub, trainer_pb2.EndRunRequest),
    "dataloader": (dataloader_pb2_grpc.DataloaderServiceStub, dataloader_pb2.EndRunRequest),
    "rollout": (rollout_pb2_grpc.RolloutServiceStub, rollout_pb2.EndRunRequest),
}


def end_run(services: Services, run_id: str) -> None:
    """EndRun on every service (best effort: a dead service holds nothing). A hung one (its
    channel closed) is sent EndRun in the background, on a channel of its own: if it wakes up
    (an attached service thawed by its owner) it is free for the next run, and nobody waits."""
    for name, addresses in services.addresses.items():
        if name not in END_RUN_MESSAGES:
            continue
        stub_class, request_class = END_RUN_MESSAGES[name]
        for index, address in enumerate(addresses):
            if (name, index) in services.gone:
                _end_run_in_background(stub_class, request_class(run_id=run_id), address, name)
                continue
            stub = services.stub(name, index)
            try:
                stub.EndRun(request_class(run_id=run_id), timeout=END_RUN_SECONDS)
            except grpc.RpcError as exc:
                log.warning(
                    "EndRun failed", run_id=run_id, service=name, error=f"{exc.code().name}: {exc.details()}"
                )


def _end_run_in_background(stub_class, request, address: str, name: str) -> None:
    def end() -> None:
        with open_channel(address) as channel:
            try:
                stub_class(channel).EndRun(request, timeout=HUNG_END_RUN_SECONDS)
            except grpc.RpcError:
                return  # still hung, or gone: it holds nothing then
        log.info("EndRun reached a service that was hung", service=name, address=address)

    # A thread, not a future: the channel's call policy may wait for the connection before the
    # future exists, and a frozen process accepts TCP but never answers.
    threading.Thread(target=end, name=f"end-run-{name}", daemon=True).start()
