"""The trainer gRPC service (rank 0): protos in, TrainerController calls, protos out.

Start-up with a model: parse config -> serve gRPC (health NOT_SERVING) -> spawn ranks 1..N-1 ->
load and shard the model on every rank -> SERVING. Without one (a bare trainer) it is SERVING at
once and the first run's Init loads the run's model. Each run gets its own ranks, model,
optimizer and step results (RunHost); SIGTERM drains the calls, then stops the ranks. Ranks
that broke (a rank died) make it NOT_SERVING, or make it exit where a launcher restarts it
(broken_ranks.py).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from rollway.common.config import ConfigError, from_dict, to_dict
from rollway.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from rollway.common.log import bind_run_context, get_logger
from rollway.common.run_host import RunHost, run_scoped_servicer
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.structs import from_struct, to_struct
from rollway.common.v1 import common_pb2
from rollway.trainer.batch import sample_fields, to_items
from rollway.trainer.broken_ranks import BrokenRanks
from rollway.trainer.config import TRAINING_SETTINGS, TrainerConfig
from rollway.trainer.controller import TrainerController
from rollway.trainer.datums import datum_loss, to_datum_items
from rollway.trainer.loss.losses import get_loss
from rollway.trainer.model_loading import ModelLoadError, read_hf_config
from rollway.trainer.optim_request import adam_settings
from rollway.trainer.reference import check_reference
from rollway.trainer.runtime import RankRuntime
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from rollway.trainer.weight_sync.pusher import WeightPusher

log = get_logger("rollway.trainer.service")


RESULTS_PER_MESSAGE = 64


def read_stream(request_iterator, header_type: str) -> tuple[object, list]:
    """(header, samples) of a header-then-SampleChunk stream; the header must come first, once."""
    header, samples = None, []
    for message in request_iterator:
        kind = message.WhichOneof("payload")
        if header is None:
            if kind != "header":
                raise InvalidArgument("header", f"the first message must be a {header_type}")
            header = message.header
        elif kind == "header":
            raise InvalidArgument("header", "sent twice: only the first message is a header")
        elif kind == "samples":
            samples.extend(message.samples.samples)
    if header is None:
        raise InvalidArgument("header", f"missing: the stream was empty (expected a {header_type})")
    return header, samples


# The long calls whose progress the coordinator watches (a hang is told from a slow step by it).
# Not InitWeightGroup: a rendezvous waits for its peers (an SGLang server starting takes a minute),
# under its own deadline; a frozen trainer is still found, as it answers nothing. Not
# WaitCheckpoint: it mostly returns at once (the write ended during the step), so its median would
# make the silent wait for a long write look hung.
WATCHED_CALLS = (
    "TrainStep",
    "ForwardBackward",
    "OptimStep",
    "ComputeLogProbs",
    "SaveCheckpoint",
    "ExportHF",
    "LoadCheckpoint",
    "PushWeights",
)


class TrainerService(trainer_pb2_grpc.TrainerServiceServicer):
    """Rank 0's servicer; the ranks' work goes through TrainerController."""

    def __init__(self, controller: TrainerController, auth_token: str = ""):
        self.controller = controller
        self.pusher = WeightPusher(controller, auth_token)

    def require_engine(self):
        """Rank 0's engine, or UNAVAILABLE while the model is still loading."""
        engine = self.controller.engine
        if engine is None:
            raise Unavailable("the trainer is still loading the model")
        return engine

    def TrainStep(self, request_iterator, context):
        engine = self.require_engine()
        if self.controller.settings is None:
            raise FailedPrecondition("TrainStep before Init: call Init first")
        header, samples = read_stream(request_iterator, "TrainStepHeader")
        if header.step_id < 0:
            raise InvalidArgument("header.step_id", f"must not be negative (got {header.step_id})")
        stored = self.controller.stored_result(header.step_id)
        if stored is None:
            settings = self.controller.step_settings(from_struct(header.overrides))
            if header.num_samples != len(samples):
                raise InvalidArgument(
                    "header.num_samples", f"announced {header.num_samples} samples but {len(samples)} arrived"
                )
            policy = settings.loss_type == "policy_loss"
            items = to_items(
                samples,
                vocab_size=engine.vocab_size,
                with_loss_mask=True,
                per_token_inputs=(
                    sample_fields(samples, settings)
                    if policy
                    else get_loss(settings.loss_type).per_token_inputs
                ),
                require_prompt=policy,
            )
            stored, already = self.controller.train_step(header.step_id, items, settings)
        else:
            already = True
        return trainer_pb2.TrainStepResponse(
            step_id=header.step_id,
            global_step=stored.global_step,
            metrics=stored.metrics,
            already_applied=already,
        )

    def ComputeLogProbs(self, request_iterator, context):
        engine = self.require_engine()
        header, samples = read_stream(request_iterator, "ComputeLogProbsHeader")
        temperature = header.temperature or 1.0
        if not temperature > 0 or temperature == float("inf"):
            raise InvalidArgument(
                "header.temperature", f"must be a positive number (got {header.temperature})"
            )
        items = to_items(samples, vocab_size=engine.vocab_size, with_loss_mask=False, require_prompt=True)
        results = self.controller.compute_log_probs(
            items, temperature, header.with_entropy, header.use_reference
        )
        for start in range(0, len(results), RESULTS_PER_MESSAGE):
            yield trainer_pb2.ComputeLogProbsResponse(
                results=[
                    trainer_pb2.SampleLogProbs(index=start + k, log_probs=log_probs, entropy=entropy)
                    for k, (log_probs, entropy) in enumerate(results[start : start + RESULTS_PER_MESSAGE])
                ]
            )

    def ForwardBackward(self, request, context):
        engine = self.require_engine()
        config = dict(request.loss_fn_config)
        spec = datum_loss(request.loss_fn, config)
        items = to_datum_items(request.data, spec, engine.vocab_size)
        results = self.controller.forward_backward(
            items, request.loss_fn, config, request.forward_only, request.adapter
        )
        loss_sum = sum(sum(losses) for _, losses in results)
        return trainer_pb2.ForwardBackwardResponse(
            outputs=[
                trainer_pb2.DatumOutput(log_probs=lp, elementwise_loss=losses) for lp, losses in results
            ],
            metrics={
                "loss:sum": loss_sum,
                "num_datums": float(len(items)),
                "num_tokens": float(sum(len(item.loss_mask) for item in items)),
            },
        )

    def OptimStep(self, request, context):
        self.require_engine()
        global_step, metrics = self.controller.optim_step(**adam_settings(request), adapter=request.adapter)
        return trainer_pb2.OptimStepResponse(global_step=global_step, metrics=metrics)

    def SaveCheckpoint(self, request, context):
        self.require_engine()
        directory, hf_dir, step, blocking_seconds = self.controller.save_checkpoint(
            request.path,
            request.hf_export,
            from_struct(request.extra_state),
            request.async_save,
            request.adapter,
        )
        return trainer_pb2.SaveCheckpointResponse(
            checkpoint_dir=str(directory),
            hf_dir=str(hf_dir or ""),
            global_step=step,
            blocking_seconds=blocking_seconds,
        )

    def WaitCheckpoint(self, request, context):
        self.require_engine()
        saved = self.controller.wait_checkpoint(request.checkpoint_dir)
        return trainer_pb2.WaitCheckpointResponse(
            checkpoint_dir=str(saved.directory),
            write_seconds=saved.write_seconds,
            size_bytes=saved.size_bytes,
        )

    def ExportHF(self, request, context):
        self.require_engine()
        directory, step = self.controller.export_hf(request.path, request.adapter)
        return trainer_pb2.ExportHFResponse(hf_dir=str(directory), global_step=step)

    def LoadCheckpoint(self, request, context):
        self.require_engine()
        directory, step, extra_state, skipped = self.controller.load_checkpoint(request.path, request.adapter)
        return trainer_pb2.LoadCheckpointResponse(
            checkpoint_dir=str(directory),
            global_step=step,
            extra_state=to_struct(extra_state),
            skipped_checkpoints=skipped,
        )

    def DropAdapter(self, request, context):
        self.require_engine()
        was_held, num_adapters = self.controller.drop_adapter(request.adapter)
        return trainer_pb2.DropAdapterResponse(was_held=was_held, num_adapters=num_adapters)

    def InitWeightGroup(self, request, context):
        self.require_engine()
        if not request.HasField("group"):
            raise InvalidArgument("group", "is required")
        already = self.pusher.init_group(request.group)
        return trainer_pb2.InitWeightGroupResponse(already_initialized=already)

    def PushWeights(self, request, context):
        self.require_engine()
        yield from self.pusher.push(request)

    def WeightChecksum(self, request, context):
        self.require_engine()
        digest, count = self.controller.weight_checksum(request.dtype)
        return trainer_pb2.WeightChecksumResponse(
            checksum=common_pb2.WeightsChecksum(
                weight_version=self.controller.weight_version,
                algorithm="sha256",
                digest=digest,
                num_tensors=count,
            )
        )


class TrainerRuns:
    """Init and EndRun: which run the trainer serves, with which settings (the rest is per run)."""

    def __init__(self, startup: TrainerConfig, host: RunHost, server: RollwayServer):
        self.startup = startup
        self.host = host
        self.server = server

    def Init(self, request, context):
        if request.run_id:
            bind_run_context(run_id=request.run_id)
        settings = run_settings(self.startup, from_struct(request.config))
        # Broken ranks are never handed to a run: its Init builds new ones (a trainer that nothing
        # restarts heals here; a supervised one has exited instead: broken_ranks.py).
        current = self.host.current()
        broken = current is not None and current.controller.runtime.broken is not None
        servicer, already, rebuilt = self.host.init(
            request.run_id, settings, rebuild=request.rebuild or broken
        )
        engine = servicer.require_engine()
        self.server.set_serving()  # a rebuild replaces ranks a failed run may have broken
        repeat = servicer.controller.init(
            {k: v for k, v in to_dict(settings).items() if k in TRAINING_SETTINGS}
        )
        return trainer_pb2.InitResponse(
            num_parameters=engine.num_parameters,
            world_size=servicer.controller.world_size,
            global_step=engine.global_step,
            model=settings.hf_checkpoint,
            already_initialized=already and repeat,
            run_id=request.run_id,
            vocab_size=engine.vocab_size,
            settings=to_struct(to_dict(settings)),
            rebuilt=rebuilt,
        )

    def EndRun(self, request, context):
        return trainer_pb2.EndRunResponse(was_holding=self.host.end(request.run_id))


def run_settings(startup: TrainerConfig, overrides: dict) -> TrainerConfig:
    """The run's trainer settings: its overrides on the start-up flags (errors name config.X)."""
    try:
        return from_dict(TrainerConfig, overrides, base=startup)
    except ConfigError as exc:
        raise InvalidArgument(f"config.{exc.setting}", exc.problem) from None


def build_for_run(
    settings: TrainerConfig, on_broken: Callable[[TrainerConfig, str], None], auth_token: str = ""
) -> TrainerService:
    """Ranks, model and controller for one run (blocks while the model loads on every rank).
    `on_broken(settings, reason)`: the ranks broke (broken_ranks.py)."""
    try:
        read_hf_config(settings.hf_checkpoint)
        check_reference(settings)
    except ModelLoadError as exc:
        raise InvalidArgument("config.hf_checkpoint", str(exc)) from None
    runtime = RankRuntime(settings, on_broken=functools.partial(on_broken, settings), auth_token=auth_token)
    servicer = TrainerService(TrainerController(settings, runtime), auth_token)
    try:
        engine = runtime.start()
    except Exception:
        runtime.shutdown()
        raise
    log.info("trainer ready", world_size=settings.world_size, num_parameters=engine.num_parameters)
    return servicer


def close_run(servicer: TrainerService) -> None:
    servicer.pusher.close()
    servicer.controller.finish_pending_save()  # a checkpoint half-written is of no use to anyone
    servicer.controller.runtime.shutdown()


def same_start_up(old: TrainerConfig, new: TrainerConfig) -> bool:
    """A run may change its training settings in place; anything else rebuilds the ranks."""
    old_values, new_values = to_dict(old), to_dict(new)
    return all(old_values[k] == new_values[k] for k in old_values if k not in TRAINING_SETTINGS)


def serve(server_config: ServerConfig, config: TrainerConfig) -> int | None:
    """Serve until SIGTERM, then stop every rank. With a model in the flags, load it first.
    Returns the exit code of a trainer that stopped because its ranks broke (broken_ranks.py)."""
    server = RollwayServer("trainer", server_config, WATCHED_CALLS)
    bare = not config.hf_checkpoint
    if not bare:
        try:
            read_hf_config(config.hf_checkpoint)
            check_reference(config)
        except ModelLoadError as exc:
            log.error("cannot start", error=str(exc))
            sys.exit(2)

    broken = BrokenRanks(server)
    host = RunHost(
        "trainer",
        lambda settings: build_for_run(settings, broken.on_broken, server.auth_token),
        close_run,
        in_place=same_start_up,
    )
    servicer = run_scoped_servicer(
        trainer_pb2_grpc.TrainerServiceServicer,
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
        host,
        TrainerRuns(config, host, server),
        read_only=frozenset({"WeightChecksum"}),
    )
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        servicer,
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    )
    server.on_stop(host.close)
    try:
        server.start()
        if not bare:
            host.adopt(build_for_run(config, broken.on_broken, server.auth_token), config)
    except Exception:
        log.exception("trainer failed to start")
        server.stop(0)
        sys.exit(1)
    if bare:
        log.info("trainer ready without a model: a run's Init configures it")
    server.set_serving()
    server.wait_for_termination()
    return broken.exit_code
