"""The gateway's parts, wired together, and what spans them: the session calls (ending a session
releases its models and samplers), the watch (silent sessions, expired checkpoints, dead
trainers) and the shutdown. app.py's routes call the parts directly:

    Gateway.models       ModelTable (models.py)                    create, train, unload models
    Gateway.checkpoints  CheckpointCalls (checkpoint_calls.py)     save, load, delete, TTL
    Gateway.sampling     SamplingSessionTable (sampling_sessions)  sampling sessions, sample calls
    Gateway.runs         TrainingRuns (training_runs.py)           the RestClient's listings
    Gateway.futures      FutureStore (futures.py)                  retrieve_future

Training calls return a request id at once; their work runs on the model's own thread in arrival
order (tenants.py) and retrieve_future reads the result (futures.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

from rollway.common.log import get_logger
from rollway.gateway.callers import caller, owns
from rollway.gateway.checkpoint_calls import CheckpointCalls
from rollway.gateway.checkpoints import CheckpointStore
from rollway.gateway.config import GatewayConfig
from rollway.gateway.errors import not_found
from rollway.gateway.futures import FutureStore
from rollway.gateway.models import ModelTable
from rollway.gateway.sampling_sessions import SamplingSessionTable
from rollway.gateway.sessions import SessionTable
from rollway.gateway.training_runs import TrainingRuns

log = get_logger("rollway.gateway")


class Gateway:
    """Sessions, models, sampling sessions, checkpoints and futures of one gateway process."""

    def __init__(self, config: GatewayConfig):
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.sessions = SessionTable(config.session_timeout_s)
        self.futures = FutureStore()
        # Every checkpoint saved through the API (kept across gateway restarts on this workdir).
        self.saved = CheckpointStore(self.workdir)
        self.models = ModelTable(config, self.sessions, self.saved, self.futures)
        self.sampling = SamplingSessionTable(config, self.sessions, self.saved, self.futures)
        self.checkpoints = CheckpointCalls(self.models, self.sampling, self.sessions, self.saved)
        self.runs = TrainingRuns(self.models, self.saved)
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_loop, name="gateway-watch", daemon=True)
        self._watch.start()

    # --- sessions --------------------------------------------------------------------------
    def create_session(self, user_metadata: dict[str, str] | None = None) -> str:
        return self.sessions.create(caller(), user_metadata).session_id

    def heartbeat(self, session_id: str) -> None:
        self.sessions.owned(session_id)
        if not self.sessions.heartbeat(session_id):
            raise not_found(f"session_id: {session_id!r} is not an open session (it ended or timed out)")

    def end_session(self, session_id: str) -> None:
        self.sessions.owned(session_id)
        session = self.sessions.end(session_id)
        if session is not None:
            self._release(session.model_ids, session.sampling_session_ids)

    def list_sessions(self, limit: int, offset: int) -> dict:
        mine = [s.session_id for s in self.sessions.all() if owns(s.owner)]
        return {"sessions": mine[offset : offset + limit]}

    def get_session(self, session_id: str) -> dict:
        session = self.sessions.owned(session_id)
        return {
            "training_run_ids": sorted(session.model_ids),
            "sampler_ids": sorted(session.sampling_session_ids),
            "user_metadata": session.user_metadata or None,
        }

    def _release(self, model_ids: set[str], sampling_session_ids: set[str]) -> None:
        self.models.release(model_ids)
        self.sampling.release(sampling_session_ids)

    # --- the watch and the end -------------------------------------------------------------
    def _watch_loop(self) -> None:
        """Release silent sessions' models; restart dead trainers from their last saved state;
        remove checkpoints whose TTL ran out."""
        while not self._stop.wait(0.5):
            for tinker_path in self.saved.expired():
                log.info("checkpoint expired; removing it", tinker_path=tinker_path)
                self.checkpoints.remove(tinker_path)
            for session in self.sessions.expire():
                log.info("session timed out; releasing its models", session_id=session.session_id,
                            models=sorted(session.model_ids))  # fmt: skip
                self._release(session.model_ids, session.sampling_session_ids)
            self.sampling.stop_idle()
            for tenant in self.models.all():
                try:
                    if tenant.heal():
                        log.warning("trainer restarted", model_id=tenant.spec.model_id)
                except Exception:  # noqa: BLE001 - logged; the next pass tries again
                    log.exception("trainer restart failed", model_id=tenant.spec.model_id)

    def close(self) -> None:
        self._stop.set()
        self.sampling.close()
        self.models.close()
