"""The `sglang` engine: supervised SGLang servers driven over HTTP with token ids in and out.

Each sample is one /generate call (input_ids, sampling_params, return_logprob) sent from a
thread pool to the least-loaded healthy server; rollout log-probs and tokens come from
meta_info.output_token_logprobs, the finish reason from meta_info.finish_reason. With
--sglang-urls the servers are used as they are (health-checked, never restarted); otherwise
rollout_num_gpus / rollout_num_gpus_per_engine servers are launched (with `sglang_python` and
`sglang_env`, since SGLang usually lives in its own virtualenv) and supervised.

A server that restarts, or that an update failed half-way through, serves weights other than
the current version: it is held out of generation (`awaiting_weights`) until a whole update
reaches it; GetInfo reports it so the coordinator rebuilds the group and pushes. A sample whose
server stops answering is sent again to another server. On GPUs this is the production engine;
on CPU a real server runs through deploy/sglang-cpu (tests/integration/test_sglang_*.py).

    sglang.py          generation, abort, pause, memory; the weight hooks hand over to
    sglang_weights.py  the weight-update endpoints and SGLang's weight checksum
    sglang_fleet.py    the servers: which may generate, the least-loaded pick, calls on each
    sglang_server.py   one server's process and the supervisor; sglang_http.py its HTTP API
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from rollway.common.log import get_logger
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import (
    FINISH_ABORT,
    BatchHandle,
    Engine,
    EngineError,
    ModelInfo,
    OnFinish,
    SampleRequest,
    SampleResult,
)
from rollway.rollout.engines.hf_weights import eos_token_ids
from rollway.rollout.engines.sglang_fleet import ServerFleet
from rollway.rollout.engines.sglang_http import SGLangHTTPError, parse_generate_reply, sampling_params_body
from rollway.rollout.engines.sglang_server import ServerProcess
from rollway.rollout.engines.sglang_weights import SGLangWeights

log = get_logger("rollway.rollout.sglang")


class SGLangEngine(Engine):
    """One or more SGLang servers behind a thread pool."""

    name = "sglang"
    receives_weights_in_process = False  # the SGLang servers join the weight group themselves

    def __init__(self, config: RolloutConfig):
        super().__init__()
        self.config = config
        self._stopped = threading.Event()
        self.fleet = ServerFleet(config, lambda: self.weight_version, self._stopped)
        self.weights = SGLangWeights(config, self.fleet)
        self._pool = ThreadPoolExecutor(
            max_workers=min(1024, config.sglang_server_concurrency * len(self.fleet.servers))
        )
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[BatchHandle, ServerProcess]] = {}
        self._handles: weakref.WeakSet[BatchHandle] = weakref.WeakSet()
        self._paused = False
        self._released = False
        self._info: ModelInfo | None = None
        self._weight_sync_backend = "nccl"

    @property
    def model_info(self) -> ModelInfo:
        if self._info is None:
            path = self.config.hf_checkpoint
            model_config = AutoConfig.from_pretrained(path)
            self._info = ModelInfo(
                model=path,
                vocab_size=int(model_config.vocab_size),
                max_context_len=self.config.rollout_max_context_len
                or int(model_config.max_position_embeddings),
                eos_token_ids=eos_token_ids(path, AutoTokenizer.from_pretrained(path)),
                dtype=self.config.dtype,
            )
        return self._info

    @property
    def num_workers(self) -> int:
        return len(self.fleet.servers) * self.config.rollout_num_gpus_per_engine

    def start(self) -> None:
        _ = self.model_info
        devices = self.fleet.start()
        # NCCL only when every server is on an accelerator; CPU servers receive over gloo.
        self._weight_sync_backend = "gloo" if "cpu" in devices else "nccl"
        log.info("sglang engine ready", servers=[s.url for s in self.fleet.servers], devices=sorted(devices))

    @property
    def weight_sync_backend(self) -> str:
        return self._weight_sync_backend

    @property
    def num_workers_awaiting_weights(self) -> int:
        return self.fleet.num_workers_awaiting_weights

    def describe(self) -> dict[str, Any]:
        return {"servers": self.fleet.describe()}

    def stop(self) -> None:
        self._stopped.set()
        self.abort_all()
        self.fleet.stop()
        # Not cancel_futures: a queued sample of an aborted batch finishes at once as aborted, and
        # a cancelled one would never be reported (its stream would wait for it).
        self._pool.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return not self._stopped.is_set()

    # --- generation ---

    def submit(self, requests: list[SampleRequest], on_finish: OnFinish) -> BatchHandle:
        handle = BatchHandle(len(requests), on_finish)
        with self._lock:
            self._handles.add(handle)
        for request in requests:
            self._pool.submit(self._generate_one, request, handle)
        return handle

    @property
    def num_in_flight(self) -> int:
        with self._lock:
            return sum(max(h.num_pending, 0) for h in self._handles)

    def _generate_one(self, request: SampleRequest, handle: BatchHandle) -> None:
        deadline = time.monotonic() + self.config.sglang_request_timeout
        server_deadline = time.monotonic() + self.config.sglang_startup_timeout
        last_error = ""
        while True:
            if handle.aborted:
                handle.finish(SampleResult(request, finish_reason=FINISH_ABORT))
                return
            try:
                # Waits while a restart or a weight push is under way (until the startup timeout).
                server = self.fleet.pick(min(deadline, server_deadline))
            except EngineError as exc:
                error = f"{exc} (last call: {last_error})" if last_error else str(exc)
                handle.finish(SampleResult(request, error=error, retryable=True))
                return
            result, last_error = self._call_generate(request, handle, server, deadline)
            if result is not None:
                handle.finish(result)
                return
            # The server stopped answering (killed, restarting): the sample goes to another one.
            server.healthy = False
            log.warning("sglang server did not answer; sample sent again", url=server.url, error=last_error)

    def _call_generate(
        self, request: SampleRequest, handle: BatchHandle, server: ServerProcess, deadline: float
    ) -> tuple[SampleResult | None, str]:
        """One /generate call: (result, "") or, when the server gave no answer and time is left to
        try again, (None, the error)."""
        rid = f"rollway-{uuid.uuid4().hex}"
        with self._lock:
            self._in_flight[rid] = (handle, server)
        try:
            reply = server.client.generate(
                list(request.prompt_token_ids),
                sampling_params_body(request.params),
                rid,
                max(deadline - time.monotonic(), 1.0),
            )
            return parse_generate_reply(request, reply, server.weight_version or self.weight_version), ""
        except SGLangHTTPError as exc:
            if exc.status == 0 and time.monotonic() < deadline and not self._stopped.is_set():
                return None, str(exc)
            return SampleResult(request, error=str(exc), retryable=exc.status == 0), ""
        finally:
            with self._lock:
                self._in_flight.pop(rid, None)
            self.fleet.release(server)

    def _abort_where(self, handle: BatchHandle | None) -> int:
        """Mark batches aborted (unsent samples end without a call), abort their in-flight calls."""
        with self._lock:
            handles = [h for h in self._handles if (handle is None or h is handle) and not h.done]
            for h in handles:
                h.aborted = True
            targets = [(rid, s) for rid, (h, s) in self._in_flight.items() if h in handles]
            num_aborted = sum(max(h.num_pending, 0) for h in handles)
        for rid, server in targets:
            try:
                server.client.abort_request(rid=rid)
            except SGLangHTTPError as exc:
                log.warning("abort_request failed", url=server.url, error=str(exc))
        return num_aborted

    def abort(self, handle: BatchHandle) -> int:
        return self._abort_where(handle)

    def abort_all(self) -> int:
        return self._abort_where(None)

    def pause(self) -> None:
        self.fleet.call_each(lambda s: s.client.pause_generation("abort"), skip_unreachable=True)
        self._paused = True

    def resume(self) -> None:
        if self._paused:
            self.fleet.call_each(lambda s: s.client.continue_generation(), skip_unreachable=True)
            self._paused = False

    # --- memory ---

    @property
    def weights_released(self) -> bool:
        return self._released

    def release_memory(self, tags: list[str]) -> None:
        self.fleet.call_each(lambda s: s.client.release_memory_occupation(tags))
        self._released = self._released or "weights" in tags

    def resume_memory(self, tags: list[str]) -> None:
        self.fleet.call_each(lambda s: s.client.resume_memory_occupation(tags))
        if "weights" in tags:
            self._released = False

    # --- weight sync hooks (used by the weight-sync receiver; the endpoints: sglang_weights.py) ---

    def flush_cache(self) -> None:
        self.fleet.call_each(lambda s: s.client.flush_cache())

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        self.weights.init_weights_update_group(
            master_address, master_port, rank_offset, world_size, group_name, backend
        )

    def begin_weight_update(self, group_name: str) -> None:
        self.weights.begin_weight_update(group_name)

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int,
        load_format: str | None = None,
    ) -> None:
        self.weights.update_weights_from_distributed(
            names, dtypes, shapes, group_name, weight_version, load_format=load_format
        )

    def end_weight_update(self, weight_version: int | None) -> None:
        self.weights.end_weight_update(weight_version)

    def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        self.weights.update_weights_from_disk(model_path, weight_version)

    def reset_weights(self) -> None:
        # A new run: whatever a former run left on the servers (a request sent as its batch was
        # aborted) is aborted too; then SGLang reloads the Hugging Face directory in place.
        self.fleet.call_each(lambda s: s.client.abort_request(abort_all=True), skip_unreachable=True)
        self.weights.update_weights_from_disk(self.config.hf_checkpoint, 0)
        self.weight_version = 0

    # --- --check-weight-update-equal (SGLang's weight checker: its own hash, per server) ---

    checksum_algorithm = "sglang-weights-checker"

    def weights_checksum(self, dtype=None) -> tuple[str, int]:
        return self.weights.weights_checksum(dtype)

    def scramble_weights(self, seed: int) -> int:
        """SGLang draws the random values: `seed` is not used."""
        return self.weights.scramble_weights()
