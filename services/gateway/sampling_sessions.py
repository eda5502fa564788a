"""The open sampling sessions (sampling.py's Sampler) and the rollout services they share, one
per base model (base_rollouts.py): opened on a saved sampler checkpoint or a base model, sampled
on their rollout's thread, released with their session; a rollout service left without samplers
closes.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rollway.gateway.base_rollouts import BaseRollout
from rollway.gateway.callers import owns
from rollway.gateway.checkpoints import CheckpointStore
from rollway.gateway.config import GatewayConfig
from rollway.gateway.errors import bad_request, not_found
from rollway.gateway.futures import FutureStore
from rollway.gateway.sampling import Sampler
from rollway.gateway.sessions import Session, SessionTable


class SamplingSessionTable:
    """sampling session id -> Sampler, and base model directory -> its shared BaseRollout."""

    def __init__(
        self, config: GatewayConfig, sessions: SessionTable, saved: CheckpointStore, futures: FutureStore
    ):
        self.config = config
        self.workdir = Path(config.workdir).resolve()
        self.sessions = sessions
        self.saved = saved
        self.futures = futures
        self.samplers: dict[str, Sampler] = {}
        # One rollout service per base model, shared by its samplers (base_rollouts.py).
        self.rollouts: dict[Path, BaseRollout] = {}
        self._lock = threading.Lock()  # guards both, and each rollout's num_samplers

    def create_sampling_session(self, session_id: str, model_path: str | None, base_model: str | None) -> str:
        session = self.sessions.owned(session_id)
        if model_path:
            saved, spec = self.saved.find(model_path)
            model_dir, base_model = saved.hf_dir, spec.base_model
        elif base_model and (Path(base_model) / "config.json").is_file():
            model_dir = Path(base_model).resolve()
        else:
            raise bad_request(
                "model_path or base_model: name a saved sampler checkpoint or a local model directory"
            )
        sampling_session_id = new_sampling_session_id(session_id)
        self.open(session, sampling_session_id, model_dir, base_model, model_path)
        return sampling_session_id

    def open(
        self, session: Session, sampling_session_id: str, model_dir: Path, base_model, model_path
    ) -> Sampler:
        """A sampler of `model_dir`'s weights on `base_model`'s rollout service (started with its
        first sampler), in `session`."""
        base = Path(base_model).resolve()
        with self._lock:
            rollout = self.rollouts.get(base)
            if rollout is None:
                rollout = self.rollouts[base] = BaseRollout(base, self.workdir / "rollouts", self.config)
            rollout.num_samplers += 1
        sampler = Sampler(sampling_session_id, Path(model_dir).resolve(), rollout)
        if sampler.weights != base:  # on the rollout's thread, ahead of the first sample
            rollout.submit(lambda: rollout.prepare(sampler.weights))
        sampler.owner = session.owner
        sampler.describe = {
            "sampler_id": sampling_session_id,
            "base_model": str(base_model),
            "model_path": model_path,
        }
        with self._lock:
            self.samplers[sampling_session_id] = sampler
            session.sampling_session_ids.add(sampling_session_id)
        return sampler

    def sampler_info(self, sampling_session_id: str) -> dict:
        sampler = self.samplers.get(sampling_session_id)
        if sampler is None or not owns(sampler.owner):
            raise not_found(f"sampler_id: {sampling_session_id!r} is not an open sampling session")
        return sampler.describe

    def sample(self, body: dict[str, Any]) -> str:
        sampler = self.samplers.get(body.get("sampling_session_id") or "")
        if sampler is None or not owns(sampler.owner):
            raise not_found(
                f"sampling_session_id: {body.get('sampling_session_id')!r} is not an open sampling session"
            )
        request = sampler.generate_request(body)  # validated now: a bad request is refused at once
        sampler.rollout.last_used = time.monotonic()
        return self.futures.submit(
            sampler.rollout.executor,
            sampler.sampling_session_id,
            lambda: sampler.sample(request, body.get("prompt_logprobs_last_n")),
        )

    def stop_idle(self) -> None:
        """Stop the rollout services no sampler used for --sampler-idle-s (the next call starts
        them again)."""
        for rollout in list(self.rollouts.values()):
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                rollout.stop_when_idle(self.config.sampler_idle_s)

    def release(self, sampling_session_ids: set[str]) -> None:
        """Stop these samplers, and close the rollout services left without any."""
        with self._lock:
            samplers = [self.samplers.pop(s) for s in sampling_session_ids if s in self.samplers]
            for sampler in samplers:
                sampler.rollout.num_samplers -= 1
            unused = [b for b, r in self.rollouts.items() if r.num_samplers == 0]
            rollouts = [self.rollouts.pop(b) for b in unused]
        for sampler in samplers:
            sampler.stop()
        for rollout in rollouts:  # after its samplers' clean-up, which runs on its thread
            rollout.executor.submit(rollout.close)

    def close(self) -> None:
        """Close every rollout service and stop every sampler."""
        with self._lock:
            samplers, rollouts = list(self.samplers.values()), list(self.rollouts.values())
            self.samplers.clear()
            self.rollouts.clear()
        for rollout in rollouts:  # first: its samplers then clean up at once, not on its thread
            rollout.close()
        for sampler in samplers:
            sampler.stop()


def new_sampling_session_id(session_id: str) -> str:
    return f"{session_id}-sampler-{uuid.uuid4().hex[:8]}"
