"""Run after run on one rollout service: the engine outlives runs, everything else is per run.

A run's Init gets a new RolloutService (pause gate, reward runner, weight receiver and its
group, counters) around the engine. The engine is kept while the run's engine settings equal
the served ones (loading a model or launching SGLang servers takes long); it is then reset to
the base weights of hf_checkpoint at weight version 0, so a run on a reused service starts
exactly as on a fresh one. Other engine settings (another model, dtype, engine) start a new
engine.
"""

from __future__ import annotations

from collections.abc import Callable

from rollway.common.config import ConfigError, from_dict, to_dict
from rollway.common.errors import FailedPrecondition, InvalidArgument
from rollway.common.log import bind_run_context, get_logger
from rollway.common.run_host import RunHost
from rollway.common.structs import from_struct, to_struct
from rollway.rollout.config import ENGINE_SETTINGS, PROCESS_SETTINGS, RolloutConfig, process_setting_problem
from rollway.rollout.engines.base import Engine, EngineError
from rollway.rollout.v1 import rollout_pb2

log = get_logger("rollway.rollout.runs")

# (settings) -> (engine not started, rewards, tokenizer); the service's _build.
Prepare = Callable[[RolloutConfig], tuple[Engine, dict, object]]
# (settings, engine, rewards, tokenizer) -> the run's servicer.
MakeServicer = Callable[[RolloutConfig, Engine, dict, object], object]


def engine_settings(settings: RolloutConfig) -> dict:
    return {k: v for k, v in to_dict(settings).items() if k in ENGINE_SETTINGS}


class EngineKeeper:
    """The engine (and tokenizer) kept across runs, and the servicer built for each run."""

    def __init__(self, prepare: Prepare, make_servicer: MakeServicer):
        self.prepare = prepare
        self.make_servicer = make_servicer
        self.engine: Engine | None = None
        self._engine_settings: dict | None = None

    def build(self, settings: RolloutConfig):
        """The servicer of a run (starts or resets the engine; blocks while a model loads)."""
        try:
            engine, rewards, tokenizer = self.prepare(settings)
        except ConfigError as exc:
            raise InvalidArgument(f"config.{exc.setting}", exc.problem) from None
        except (EngineError, OSError, ValueError) as exc:
            raise FailedPrecondition(f"the rollout service cannot serve the run: {exc}") from None
        if self.engine is not None and engine_settings(settings) == self._engine_settings:
            engine = self.engine
            engine.abort_all()
            engine.resume()
            engine.reset_weights()
        else:
            self.stop()
            try:
                engine.start()
            except Exception as exc:
                engine.stop()
                raise FailedPrecondition(f"engine {settings.rollout_engine} failed to start: {exc}") from None
            self.engine, self._engine_settings = engine, engine_settings(settings)
        return self.make_servicer(settings, engine, rewards, tokenizer)

    def adopt(self, engine: Engine, settings: RolloutConfig) -> None:
        """The engine started from the start-up flags."""
        self.engine, self._engine_settings = engine, engine_settings(settings)

    def stop(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.stop()


def close_servicer(servicer) -> None:
    """What a run's servicer holds besides the engine: its weight group and reward threads."""
    servicer.weights.close()
    servicer.runner.shutdown()
    servicer.episodes.close()
    servicer.agents.close()


class RolloutRuns:
    """Init and EndRun of the rollout service."""

    def __init__(self, startup: RolloutConfig, host: RunHost):
        self.startup = startup
        self.host = host

    def Init(self, request, context):
        if request.run_id:
            bind_run_context(run_id=request.run_id)
        given = from_struct(request.config)
        try:
            settings = from_dict(RolloutConfig, given, base=self.startup)
        except ConfigError as exc:
            raise InvalidArgument(f"config.{exc.setting}", exc.problem) from None
        for name in sorted(PROCESS_SETTINGS & set(given)):
            if getattr(settings, name) != getattr(self.startup, name):
                raise InvalidArgument(f"config.{name}", process_setting_problem(name))
        servicer, already, _ = self.host.init(request.run_id, settings, rebuild=request.rebuild)
        info = servicer.engine.model_info
        return rollout_pb2.InitResponse(
            run_id=request.run_id,
            already_initialized=already,
            settings=to_struct(to_dict(settings)),
            model=info.model,
            vocab_size=info.vocab_size,
            weight_version=servicer.engine.weight_version,
        )

    def EndRun(self, request, context):
        return rollout_pb2.EndRunResponse(was_holding=self.host.end(request.run_id))
