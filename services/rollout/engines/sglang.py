"""The `sglang` engine: supervised SGLang servers driven over HTTP with token ids in and out.

Each sample is one /generate call (input_ids, sampling_params, return_logprob) sent from a
thread pool to the least-loaded healthy server; rollout log-probs and tokens come from
meta_info.output_token_logprobs, the finish reason from meta_info.finish_reason. With
--sglang-urls the servers are used as they are (health-checked, never restarted); otherwise
rollout_num_gpus / rollout_num_gpus_per_engine servers are launched and supervised. GPU only.
"""

from __future__ import annotations

import tempfile
import threading
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
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
from rollway.rollout.engines.sglang_http import SGLangHTTPError, parse_generate_reply, sampling_params_body
from rollway.rollout.engines.sglang_server import ServerProcess, Supervisor, launch_command

log = get_logger("rollway.rollout.sglang")


class SGLangEngine(Engine):
    """One or more SGLang servers behind a thread pool."""

    name = "sglang"
    receives_weights_in_process = False  # the SGLang servers join the weight group themselves

    def __init__(self, config: RolloutConfig):
        super().__init__()
        self.config = config
        self.servers = self._make_servers()
        self.supervisor = Supervisor(
            self.servers,
            startup_timeout=config.sglang_startup_timeout,
            interval=config.sglang_health_interval,
            max_restarts=config.sglang_max_restarts,
            on_restart=self._on_restart,
        )
        self._pool = ThreadPoolExecutor(
            max_workers=min(1024, config.sglang_server_concurrency * len(self.servers))
        )
        self._lock = threading.Lock()
        self._in_flight: dict[str, tuple[BatchHandle, ServerProcess]] = {}
        self._handles: weakref.WeakSet[BatchHandle] = weakref.WeakSet()
        self._load = {id(s): 0 for s in self.servers}
        self._paused = False
        self._released = False
        self._stopped = False
        self._info: ModelInfo | None = None

    def _make_servers(self) -> list[ServerProcess]:
        config, timeout = self.config, self.config.sglang_request_timeout
        if config.sglang_urls:
            return [ServerProcess(None, url, None, timeout) for url in config.sglang_urls]
        log_dir = Path(config.sglang_log_dir or tempfile.mkdtemp(prefix="rollway-sglang-"))
        servers = []
        for i in range(config.rollout_num_gpus // config.rollout_num_gpus_per_engine):
            port = config.sglang_port + i
            url = f"http://{config.sglang_host}:{port}"
            servers.append(
                ServerProcess(launch_command(config, i, port), url, log_dir / f"server-{i}.log", timeout)
            )
        return servers

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
        return len(self.servers) * self.config.rollout_num_gpus_per_engine

    def start(self) -> None:
        _ = self.model_info
        self.supervisor.start()
        log.info("sglang engine ready", servers=[s.url for s in self.servers])

    def _on_restart(self, server: ServerProcess) -> None:
        # A fresh server serves the checkpoint, not the last pushed weights.
        log.warning("sglang server restarted; it serves the checkpoint's weights until the next update",
                    url=server.url, weight_version=self.weight_version)  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {
            "servers": [
                {"url": s.url, "healthy": s.healthy, "restarts": s.num_restarts, "restarted": s.restarted}
                for s in self.servers
            ]
        }

    def stop(self) -> None:
        self._stopped = True
        self.abort_all()
        self.supervisor.stop()
        # Not cancel_futures: a queued sample of an aborted batch finishes at once as aborted, and
        # a cancelled one would never be reported (its stream would wait for it).
        self._pool.shutdown(wait=False)

    @property
    def running(self) -> bool:
        return not self._stopped

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

    def _pick_server(self) -> ServerProcess:
        with self._lock:
            healthy = [s for s in self.servers if s.healthy]
            if not healthy:
                raise EngineError("no healthy sglang server", retryable=True)
            server = min(healthy, key=lambda s: self._load[id(s)])
            self._load[id(server)] += 1
            return server

    def _generate_one(self, request: SampleRequest, handle: BatchHandle) -> None:
        if handle.aborted:
            handle.finish(SampleResult(request, finish_reason=FINISH_ABORT))
            return
        rid = f"rollway-{uuid.uuid4().hex}"
        try:
            server = self._pick_server()
        except EngineError as exc:
            handle.finish(SampleResult(request, error=str(exc), retryable=True))
            return
        with self._lock:
            self._in_flight[rid] = (handle, server)
        try:
            reply = server.client.generate(
                list(request.prompt_token_ids),
                sampling_params_body(request.params),
                rid,
                self.config.sglang_request_timeout,
            )
            result = parse_generate_reply(request, reply, self.weight_version)
        except SGLangHTTPError as exc:
            result = SampleResult(request, error=str(exc), retryable=exc.status == 0)
        finally:
            with self._lock:
                self._in_flight.pop(rid, None)
                self._load[id(server)] -= 1
        handle.finish(result)

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
        self._each_server(lambda s: s.client.pause_generation("abort"))
        self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._each_server(lambda s: s.client.continue_generation())
            self._paused = False

    def _each_server(self, call) -> None:
        errors = []
        for server in self.servers:
            try:
                call(server)
            except SGLangHTTPError as exc:
                errors.append(str(exc))
        if errors:
            raise EngineError("; ".join(errors), retryable=any("no answer" in e for e in errors))

    # --- memory ---

    @property
    def weights_released(self) -> bool:
        return self._released

    def release_memory(self, tags: list[str]) -> None:
        self._each_server(lambda s: s.client.release_memory_occupation(tags))
        self._released = self._released or "weights" in tags

    def resume_memory(self, tags: list[str]) -> None:
        self._each_server(lambda s: s.client.resume_memory_occupation(tags))
        if "weights" in tags:
            self._released = False

    # --- weight sync hooks (used by the weight-sync receiver) ---

    def flush_cache(self) -> None:
        self._each_server(lambda s: s.client.flush_cache())

    def _each_server_at_once(self, call) -> None:
        """`call(server)` on every server concurrently: weight collectives need every rank inside at
        the same time (a loop over servers would block in the first server's broadcast)."""
        with ThreadPoolExecutor(len(self.servers)) as pool:
            futures = [pool.submit(call, server) for server in self.servers]
        errors = []
        for future in futures:
            try:
                future.result()
            except SGLangHTTPError as exc:
                errors.append(str(exc))
        if errors:
            raise EngineError("; ".join(errors), retryable=any("no answer" in e for e in errors))

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        tp = self.config.rollout_num_gpus_per_engine
        offsets = {id(s): rank_offset + i * tp for i, s in enumerate(self.servers)}
        self._each_server_at_once(lambda s: s.client.init_weights_update_group(
            master_address, master_port, offsets[id(s)], world_size, group_name, backend))  # fmt: skip

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int,
        load_format: str | None = None,
    ) -> None:
        self._each_server_at_once(
            lambda s: s.client.update_weights_from_distributed(
                names, dtypes, shapes, group_name, weight_version, load_format=load_format
            )
        )

    def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        self._each_server_at_once(lambda s: s.client.update_weights_from_disk(model_path, weight_version))

    def reset_weights(self) -> None:
        # SGLang reloads a Hugging Face directory in place (/update_weights_from_disk).
        self.update_weights_from_disk(self.config.hf_checkpoint, 0)
        self.weight_version = 0
