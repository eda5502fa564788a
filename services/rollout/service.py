"""The rollout gRPC service: servicer and serve().

The servicer validates requests, owns the pause gate and the reward runner, and delegates
generation to the engine chosen by --rollout-engine. InitWeightGroup and UpdateWeights (the
receive side of weight sync) go to the weight receiver of the engine's kind (weight_sync/receiver.py).
"""

from __future__ import annotations

import dataclasses
import sys
import threading

from rollway.common.config import ConfigError
from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.common.log import get_logger
from rollway.common.run_host import RunHost, run_scoped_servicer
from rollway.common.server import RollwayServer, ServerConfig
from rollway.common.v1 import common_pb2
from rollway.common.weights_checksum import dtype_from_name
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines import create_engine
from rollway.rollout.engines.base import MEMORY_TAGS, Engine, EngineError
from rollway.rollout.environments.agent_hub import AgentHub
from rollway.rollout.environments.registry import EnvironmentRegistry, episode_limits
from rollway.rollout.episode_spec import TextCodec
from rollway.rollout.episodes import EpisodeEngine
from rollway.rollout.generate_queue import GenerateQueue
from rollway.rollout.generate_stream import GenerateStream, StreamContext, engine_error_status
from rollway.rollout.generation_gate import GenerationGate
from rollway.rollout.prompt_encoding import PromptEncoder, load_tokenizer
from rollway.rollout.request_validation import plan_generation
from rollway.rollout.rewards import RewardRunner, build_rewards
from rollway.rollout.runs import EngineKeeper, RolloutRuns, close_servicer
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from rollway.rollout.weight_sync.receiver import weight_receiver

log = get_logger("rollway.rollout")

# On SIGTERM, unfinished samples are aborted this long before the grace period ends (at most half
# of it), leaving time for them to stream back before the server cancels what is left.
ABORT_LEAD_SECONDS = 2.0


def _check_tags(tags) -> list[str]:
    for pos, tag in enumerate(tags):
        if tag not in MEMORY_TAGS:
            raise InvalidArgument(f"tags[{pos}]", f"unknown tag {tag!r}; known: {', '.join(MEMORY_TAGS)}")
    return list(tags) or list(MEMORY_TAGS)


def _busy() -> FailedPrecondition:
    return FailedPrecondition("samples are generating; Pause (abort or wait) before ReleaseMemory")


# The long calls whose progress the coordinator watches (a hang is told from a slow step by it).
# Not InitWeightGroup: a rendezvous waits for its peers and its servers' start, under its own deadline.
WATCHED_CALLS = ("Generate", "UpdateWeights")


class _InProcessCall:
    """The part of a gRPC call context Generate uses, for calls made inside the process."""

    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:
        return True


class RolloutService(rollout_pb2_grpc.RolloutServiceServicer):
    """Generate, pause/resume, memory and weight-checksum RPCs over one engine."""

    def __init__(
        self,
        config: RolloutConfig,
        engine: Engine,
        rewards,
        tokenizer,
        generate_queue: GenerateQueue,
        auth_token: str = "",
        host: str = "127.0.0.1",
    ):
        self.config = config
        # Service-wide (it outlives runs): running and queued Generate calls (generate_queue.py).
        self.generate_queue = generate_queue
        self.prompts = PromptEncoder(tokenizer)
        self.engine = engine
        self.weights = weight_receiver(engine, auth_token)
        self.gate = GenerationGate()
        self.runner = RewardRunner(config.num_reward_workers, config.reward_timeout)
        decode = lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)  # noqa: E731
        # Agent episodes (--environment agent): their HTTP endpoint starts with the first one.
        self.agents = AgentHub(config, self.prompts, host, auth_token, decode, rewards)
        self.environments = EnvironmentRegistry(config, self.agents)
        self.agents.generate = self.generate_in_process
        if config.openai_api_port:  # a port given: plain /v1 requests are served from the start
            try:
                self.agents.start()
            except OSError as exc:
                raise ConfigError(
                    "openai_api_port", f"cannot serve on {host}:{config.openai_api_port}: {exc}"
                ) from None
        self.episodes = EpisodeEngine(
            engine,
            TextCodec(
                decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
                observation_ids=lambda step: self.prompts.observation_token_ids(
                    step.observation, step.messages
                ),
            ),
            lambda: episode_limits(config, engine.model_info),
            config.num_environment_workers,
        )
        self.ctx = StreamContext(
            engine=engine,
            episodes=self.episodes,
            gate=self.gate,
            rewards=rewards,
            runner=self.runner,
            decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
            shutting_down=lambda: generate_queue.closed,
        )

    def Generate(self, request, context):
        plan = plan_generation(
            request,
            self.config,
            self.engine.model_info,
            self.ctx.rewards,
            self.prompts,
            self.environments.get,
        )
        with self.generate_queue.slot(context.is_active, context.add_callback) as admitted:
            if not admitted:
                return  # the client went away while queued
            log.info(
                "generate", request_id=request.request_id, num_samples=len(plan.samples), reward=plan.reward
            )
            scores = self._prompt_scores(request, plan)
            stream = GenerateStream(self.ctx, request, plan)
            for reply in stream.run(context.is_active, context.add_callback):
                reply.prompt_log_probs.extend(scores.get(tuple(reply.sample.prompt_token_ids), ()))
                yield reply

    def _prompt_scores(self, request, plan) -> dict[tuple[int, ...], list[float]]:
        """Each prompt's log-probs, when the request asks for them (before generating: with the
        weights served when the call starts)."""
        if not request.prompt_log_probs or not plan.samples:
            return {}
        temperature = plan.samples[0].params.temperature  # one call: one temperature
        try:
            return {p: self.engine.prompt_log_probs(list(p), temperature) for p in set(plan.prompt_token_ids)}
        except EngineError as exc:
            raise engine_error_status(exc) from None

    def generate_in_process(self, request: rollout_pb2.GenerateRequest) -> list:
        """Generate for the OpenAI-compatible endpoint's plain /v1 requests (a whole call's samples)."""
        return [reply.sample for reply in self.Generate(request, _InProcessCall())]

    def InitWeightGroup(self, request, context):
        if not request.HasField("group"):
            raise InvalidArgument("group", "is required")
        ranks, already = self.weights.init_group(request.group)
        return rollout_pb2.InitWeightGroupResponse(ranks=ranks, already_initialized=already)

    def UpdateWeights(self, request, context):
        return self.weights.update(request)

    def ScrambleWeights(self, request, context):
        try:
            num_tensors = self.engine.scramble_weights(request.seed)
        except EngineError as exc:
            raise engine_error_status(exc) from None
        log.warning(
            "weights scrambled (debug hook)", seed=request.seed, weight_version=self.engine.weight_version
        )
        return rollout_pb2.ScrambleWeightsResponse(num_tensors=num_tensors)

    def Pause(self, request, context):
        if request.mode == rollout_pb2.PAUSE_MODE_WAIT:
            self.gate.pause_wait(context.time_remaining())
            self.engine.pause()
            log.info("paused", mode="wait")
            return rollout_pb2.PauseResponse()
        num_aborted = self.gate.pause_abort(self.episodes.abort_all)
        self.engine.pause()
        log.info("paused", mode="abort", num_aborted=num_aborted)
        return rollout_pb2.PauseResponse(num_aborted=num_aborted)

    def Abort(self, request, context):
        if not request.request_id:
            raise InvalidArgument("request_id", "is required")
        num_aborted = self.ctx.running.abort(request.request_id)
        log.info("aborted", request_id=request.request_id, num_aborted=num_aborted)
        return rollout_pb2.AbortResponse(num_aborted=num_aborted)

    def Resume(self, request, context):
        self.engine.resume()
        self.gate.resume()
        log.info("resumed")
        return rollout_pb2.ResumeResponse()

    def ReleaseMemory(self, request, context):
        tags = _check_tags(request.tags)
        try:
            self.gate.run_if_idle(lambda: self.engine.release_memory(tags), _busy)
        except EngineError as exc:
            raise engine_error_status(exc) from None
        if "weights" in tags:
            self.weights.release_staging()
        log.info("memory released", tags=tags)
        return rollout_pb2.ReleaseMemoryResponse()

    def ResumeMemory(self, request, context):
        tags = _check_tags(request.tags)
        try:
            self.engine.resume_memory(tags)
        except EngineError as exc:
            raise engine_error_status(exc) from None
        log.info("memory resumed", tags=tags, weight_version=self.engine.weight_version)
        return rollout_pb2.ResumeMemoryResponse()

    def WeightChecksum(self, request, context):
        try:
            dtype = dtype_from_name(request.dtype) if request.dtype else None
        except ValueError as exc:
            raise InvalidArgument("dtype", str(exc)) from None
        try:
            digest, num_tensors = self.engine.weights_checksum(dtype)
        except EngineError as exc:
            raise engine_error_status(exc) from None
        checksum = common_pb2.WeightsChecksum(
            weight_version=self.engine.weight_version,
            algorithm=self.engine.checksum_algorithm,
            digest=digest,
            num_tensors=num_tensors,
        )
        return rollout_pb2.WeightChecksumResponse(checksum=checksum)

    def GetInfo(self, request, context):
        info = self.engine.model_info
        counters = self.ctx.counters
        return rollout_pb2.GetInfoResponse(
            model=info.model,
            engine=self.engine.name,
            weight_version=self.engine.weight_version,
            paused=self.gate.paused,
            num_workers=self.engine.num_workers,
            dtype=info.dtype,
            rewards=sorted(self.ctx.rewards),
            memory_released=self.engine.weights_released,
            max_context_len=info.max_context_len,
            vocab_size=info.vocab_size,
            eos_token_ids=sorted(info.eos_token_ids),
            default_reward=self.config.reward,
            num_samples_generated=counters.num_samples_generated,
            num_samples_aborted=counters.num_samples_aborted,
            num_reward_errors=self.runner.num_errors,
            num_reward_timeouts=self.runner.num_timeouts,
            num_samples_in_flight=self.engine.num_in_flight,
            acknowledges_weight_updates=self.engine.receives_weights_in_process,
            num_generate_calls_running=self.generate_queue.num_running,
            num_generate_calls_queued=self.generate_queue.num_queued,
            num_workers_awaiting_weights=self.engine.num_workers_awaiting_weights,
            weight_sync_backend=self.engine.weight_sync_backend,
        )


def _build(config: RolloutConfig) -> tuple[Engine, dict, object]:
    """Rewards, tokenizer and the (not yet started) engine: bad settings fail in seconds."""
    rewards = build_rewards(config)
    tokenizer = load_tokenizer(config)
    return create_engine(config), rewards, tokenizer


def serve(server_config: ServerConfig, config: RolloutConfig) -> None:
    """Serve until SIGTERM. With a model in the flags it is loaded first (start-up errors exit
    with a message); without one, a run's Init loads the run's model (runs.py)."""
    generate_queue = GenerateQueue(
        config.max_generate_calls or max(1, server_config.max_workers - 4),
        config.generate_queue_size,
        config.generate_queue_timeout,
    )
    threads = GenerateQueue.num_threads(generate_queue.max_running, generate_queue.max_queued)
    server_config = dataclasses.replace(server_config, max_workers=max(server_config.max_workers, threads))
    server = RollwayServer("rollout", server_config, WATCHED_CALLS)
    engines = EngineKeeper(
        _build, lambda *args: RolloutService(*args, generate_queue, server.auth_token, server_config.host)
    )
    host = RunHost("rollout", engines.build, close_servicer)
    if config.hf_checkpoint:
        try:
            engine, rewards, tokenizer = _build(config)
        except (ConfigError, EngineError, OSError, ValueError) as exc:
            log.error("start-up failed", error=str(exc))
            sys.exit(f"rollout: {exc}")
    server.add_service(
        rollout_pb2_grpc.add_RolloutServiceServicer_to_server,
        run_scoped_servicer(
            rollout_pb2_grpc.RolloutServiceServicer,
            rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
            host,
            RolloutRuns(config, host),
            read_only=frozenset({"GetInfo", "WeightChecksum"}),
        ),
        rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"],
    )

    def shutdown() -> None:
        servicer = host.current()
        if servicer is not None:
            servicer.weights.close()
        engines.stop()
        host.close()

    def abort_generation() -> None:
        servicer = host.current()
        if servicer is not None:  # episodes first, so that none starts another turn
            num_aborted = servicer.episodes.abort_all()
            log.info("draining: unfinished samples aborted", num_aborted=num_aborted)
        elif engines.engine is not None:
            num_aborted = engines.engine.abort_all()
            log.info("draining: unfinished samples aborted", num_aborted=num_aborted)

    def drain(grace: float) -> None:
        generate_queue.close()  # queued calls (and calls waiting for Resume) end now: UNAVAILABLE
        # Running calls may finish within the grace; what still generates shortly before it ends
        # is aborted, so every stream ends with its samples instead of being cancelled.
        timer = threading.Timer(max(grace - min(ABORT_LEAD_SECONDS, grace / 2), 0.0), abort_generation)
        timer.daemon = True
        timer.start()

    server.on_drain(drain)
    server.on_stop(shutdown)
    server.start()
    if config.hf_checkpoint:
        try:
            engine.start()  # health stays NOT_SERVING while the model loads or servers launch
        except Exception as exc:
            log.exception("engine start failed")
            server.stop(0)
            sys.exit(f"rollout: engine {config.rollout_engine} failed to start: {exc}")
        engines.adopt(engine, config)
        try:
            servicer = RolloutService(
                config, engine, rewards, tokenizer, generate_queue, server.auth_token, server_config.host
            )
        except ConfigError as exc:
            server.stop(0)
            sys.exit(f"rollout: {exc}")
        host.adopt(servicer, config)
    server.set_serving()
    server.wait_for_termination()
