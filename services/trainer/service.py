"""The trainer gRPC service (rank 0): protos in, TrainerController calls, protos out.

Start-up: parse config -> spawn ranks 1..N-1 -> serve gRPC (health NOT_SERVING) -> load and shard
the model on every rank -> SERVING. SIGTERM drains the calls, then stops the other ranks.
"""

from __future__ import annotations

import sys

from google.protobuf import json_format, struct_pb2

from rollway.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from rollway.common.log import bind_run_context, get_logger
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.v1 import common_pb2
from rollway.trainer.batch import to_items
from rollway.trainer.config import TrainerConfig
from rollway.trainer.controller import TrainerController
from rollway.trainer.losses import get_loss
from rollway.trainer.model_loading import ModelLoadError, read_hf_config
from rollway.trainer.policy_inputs import sample_fields
from rollway.trainer.reference import check_reference
from rollway.trainer.runtime import RankRuntime
from rollway.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from rollway.trainer.weight_push import WeightPusher


def _log():
    """The logger, bound at call time: logging is configured by the server after this import."""
    return get_logger("rollway.trainer.service")


RESULTS_PER_MESSAGE = 64


def struct_to_dict(struct: struct_pb2.Struct) -> dict:
    return json_format.MessageToDict(struct) if struct is not None else {}


def dict_to_struct(data: dict) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(data or {})
    return struct


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


class TrainerService(trainer_pb2_grpc.TrainerServiceServicer):
    """Rank 0's servicer; the ranks' work goes through TrainerController."""

    def __init__(self, controller: TrainerController):
        self.controller = controller
        self.pusher = WeightPusher(controller)

    def _engine(self):
        engine = self.controller.engine
        if engine is None:
            raise Unavailable("the trainer is still loading the model")
        return engine

    def Init(self, request, context):
        engine = self._engine()
        if request.run_id:
            bind_run_context(run_id=request.run_id)
        already = self.controller.init(struct_to_dict(request.config))
        return trainer_pb2.InitResponse(
            num_parameters=engine.num_parameters,
            world_size=self.controller.world_size,
            global_step=engine.global_step,
            model=self.controller.startup.hf_checkpoint,
            already_initialized=already,
        )

    def TrainStep(self, request_iterator, context):
        engine = self._engine()
        if self.controller.settings is None:
            raise FailedPrecondition("TrainStep before Init: call Init first")
        header, samples = read_stream(request_iterator, "TrainStepHeader")
        if header.step_id < 0:
            raise InvalidArgument("header.step_id", f"must not be negative (got {header.step_id})")
        stored = self.controller.stored_result(header.step_id)
        if stored is None:
            settings = self.controller.step_settings(struct_to_dict(header.overrides))
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
        engine = self._engine()
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

    def SaveCheckpoint(self, request, context):
        self._engine()
        directory, hf_dir, step = self.controller.save_checkpoint(
            request.path, request.hf_export, struct_to_dict(request.extra_state)
        )
        return trainer_pb2.SaveCheckpointResponse(
            checkpoint_dir=str(directory), hf_dir=str(hf_dir or ""), global_step=step
        )

    def LoadCheckpoint(self, request, context):
        self._engine()
        directory, step, extra_state = self.controller.load_checkpoint(request.path)
        return trainer_pb2.LoadCheckpointResponse(
            checkpoint_dir=str(directory), global_step=step, extra_state=dict_to_struct(extra_state)
        )

    def InitWeightGroup(self, request, context):
        self._engine()
        if not request.HasField("group"):
            raise InvalidArgument("group", "is required")
        already = self.pusher.init_group(request.group)
        return trainer_pb2.InitWeightGroupResponse(already_initialized=already)

    def PushWeights(self, request, context):
        self._engine()
        yield from self.pusher.push(request)

    def WeightChecksum(self, request, context):
        self._engine()
        digest, count = self.controller.weight_checksum(request.dtype)
        return trainer_pb2.WeightChecksumResponse(
            checksum=common_pb2.WeightsChecksum(
                weight_version=self.controller.weight_version,
                algorithm="sha256",
                digest=digest,
                num_tensors=count,
            )
        )


def serve(server_config: ServerConfig, config: TrainerConfig) -> None:
    """Spawn the ranks, load the model, serve until SIGTERM, then stop every rank."""
    server = RollwayServer("trainer", server_config)
    try:
        read_hf_config(config.hf_checkpoint)
        check_reference(config)
    except ModelLoadError as exc:
        _log().error("cannot start", error=str(exc))
        sys.exit(2)
    runtime = RankRuntime(config, on_broken=lambda reason: server.set_serving(False))
    controller = TrainerController(config, runtime)
    servicer = TrainerService(controller)
    server.add_service(
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server,
        servicer,
        trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"],
    )
    server.on_stop(servicer.pusher.close)
    server.on_stop(runtime.shutdown)
    try:
        server.start()
        engine = runtime.start()
    except Exception:
        _log().exception("trainer failed to start")
        server.stop(0)
        sys.exit(1)
    _log().info("trainer ready", world_size=config.world_size, num_parameters=engine.num_parameters)
    server.set_serving()
    server.wait_for_termination()
