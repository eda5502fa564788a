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
"""

from __future__ import annotations

import hashlib
import tempfile
import threading
import time
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
    EngineUnsupported,
    ModelInfo,
    OnFinish,
    SampleRequest,
    SampleResult,
)
from rollway.rollout.engines.hf_weights import eos_token_ids
from rollway.rollout.engines.sglang_http import SGLangHTTPError, parse_generate_reply, sampling_params_body
from rollway.rollout.engines.sglang_server import ServerProcess, Supervisor, launch_command, launch_env

log = get_logger("rollway.rollout.sglang")
# How often a sample waiting for a servable server looks again.
SERVER_WAIT_SECONDS = 0.2
# How long a server may take to finish the requests still running when its cache must be flushed
# after a disk load (aborted ones end within a step or two; a stray one ends at its length limit).
FLUSH_IDLE_SECONDS = 60.0


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
        self._weight_sync_backend = "nccl"

    def _make_servers(self) -> list[ServerProcess]:
        config, timeout = self.config, self.config.sglang_request_timeout
        if config.sglang_urls:
            return [ServerProcess(None, url, None, timeout) for url in config.sglang_urls]
        log_dir = Path(config.sglang_log_dir or tempfile.mkdtemp(prefix="rollway-sglang-"))
        env = launch_env(config)
        servers = []
        for i in range(config.rollout_num_gpus // config.rollout_num_gpus_per_engine):
            port = config.sglang_port + i
            url = f"http://{config.sglang_host}:{port}"
            command = launch_command(config, i, port)
            servers.append(ServerProcess(command, url, log_dir / f"server-{i}.log", timeout, env))
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
        devices = set()
        for server in self.servers:
            try:
                devices.add(server.client.device())
            except SGLangHTTPError as exc:
                log.warning(
                    "sglang server does not say its device; assuming cuda", url=server.url, error=str(exc)
                )
                devices.add("cuda")
        # NCCL only when every server is on an accelerator; CPU servers receive over gloo.
        self._weight_sync_backend = "gloo" if "cpu" in devices else "nccl"
        log.info("sglang engine ready", servers=[s.url for s in self.servers], devices=sorted(devices))

    @property
    def weight_sync_backend(self) -> str:
        return self._weight_sync_backend

    def _on_restart(self, server: ServerProcess) -> None:
        # A fresh server serves the checkpoint: with pushed weights, that is the wrong policy.
        server.has_sessions = None
        server.weight_version = 0
        if self.weight_version > 0:
            server.awaiting_weights = True
            log.warning("sglang server restarting; it generates again once it has weight version "
                        f"{self.weight_version}", url=server.url)  # fmt: skip

    @property
    def num_workers_awaiting_weights(self) -> int:
        tp = self.config.rollout_num_gpus_per_engine
        return tp * sum(s.awaiting_weights for s in self.servers)

    def describe(self) -> dict[str, Any]:
        return {
            "servers": [
                {
                    "url": s.url,
                    "healthy": s.healthy,
                    "restarts": s.num_restarts,
                    "restarted": s.restarted,
                    "weight_version": s.weight_version,
                    "awaiting_weights": s.awaiting_weights,
                }
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

    def _servable(self) -> list[ServerProcess]:
        return [s for s in self.servers if s.healthy and not s.awaiting_weights]

    def _pick_server(self, deadline: float) -> ServerProcess:
        """The least-loaded server that is healthy and has the current weights; waits for one
        while a restart or a weight push is under way (until `deadline` or the startup timeout)."""
        while True:
            with self._lock:
                servable = self._servable()
                if servable:
                    server = min(servable, key=lambda s: self._load[id(s)])
                    self._load[id(server)] += 1
                    return server
                waiting = [s.url for s in self.servers if s.awaiting_weights]
                # Launched servers are restarted by the supervisor; attached ones come back only
                # with weights pushed to them (awaiting) or not at all as far as we know.
                may_return = waiting or any(s.launched and s.num_restarts < self.supervisor.max_restarts
                                            for s in self.servers)  # fmt: skip
            if self._stopped or time.monotonic() >= deadline or not may_return:
                detail = f"; awaiting weights: {waiting}" if waiting else ""
                raise EngineError(f"no healthy sglang server{detail}", retryable=True)
            time.sleep(SERVER_WAIT_SECONDS)

    def _generate_one(self, request: SampleRequest, handle: BatchHandle) -> None:
        deadline = time.monotonic() + self.config.sglang_request_timeout
        server_deadline = time.monotonic() + self.config.sglang_startup_timeout
        last_error = ""
        while True:
            if handle.aborted:
                handle.finish(SampleResult(request, finish_reason=FINISH_ABORT))
                return
            try:
                server = self._pick_server(min(deadline, server_deadline))
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
            if exc.status == 0 and time.monotonic() < deadline and not self._stopped:
                return None, str(exc)
            return SampleResult(request, error=str(exc), retryable=exc.status == 0), ""
        finally:
            with self._lock:
                self._in_flight.pop(rid, None)
                self._load[id(server)] -= 1

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
        self._each_server(lambda s: s.client.pause_generation("abort"), skip_unreachable=True)
        self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._each_server(lambda s: s.client.continue_generation(), skip_unreachable=True)
            self._paused = False

    def _each_server(self, call, skip_unreachable: bool = False) -> None:
        """`call(server)` on each server in turn. `skip_unreachable`: a server that does not answer
        (killed, restarting) is marked unhealthy and left out; it generates nothing meanwhile, and
        a restarted server waits for the weights before it does (pause and resume need no more)."""
        errors = []
        for server in self.servers:
            try:
                call(server)
            except SGLangHTTPError as exc:
                if skip_unreachable and exc.status == 0:
                    server.healthy = False
                    log.warning("sglang server unreachable; left out", url=server.url, error=str(exc))
                    continue
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

    def _each_server_at_once(self, call, servers: list[ServerProcess] | None = None) -> None:
        """`call(server)` on every server concurrently: weight collectives need every rank inside at
        the same time (a loop over servers would block in the first server's broadcast)."""
        servers = self.servers if servers is None else servers
        if not servers:
            return

        def guarded(server: ServerProcess) -> None:
            server.weight_calls += 1
            try:
                call(server)
            finally:
                server.weight_calls -= 1

        with ThreadPoolExecutor(len(servers)) as pool:
            futures = [pool.submit(guarded, server) for server in servers]
        errors = []
        for future in futures:
            try:
                future.result()
            except SGLangHTTPError as exc:
                errors.append(str(exc))
        if errors:
            raise EngineError("; ".join(errors), retryable=any("no answer" in e for e in errors))

    def _wait_until_up(self) -> None:
        """Every server must be up before a group forms (each is a member): a restarting one is
        waited for. Asked afresh, not from the supervisor's last round: a server killed a moment
        ago may still be marked healthy, and a member missing from the rendezvous would leave the
        others blocked in it until the group timeout."""
        deadline = time.monotonic() + self.config.sglang_startup_timeout
        while True:
            down = []
            for server in self.servers:
                if not server.alive() or (server.healthy and not server.client.answers()):
                    # Seen down just now. Only then is the supervisor's flag cleared: clearing it
                    # on a stale read would undo the supervisor marking a restarted server
                    # healthy meanwhile (each answers() of the others can take a second under
                    # load), and the group would wait for it until the deadline.
                    server.healthy = False
                    down.append(server.url)
                elif not server.healthy:  # restarting: the supervisor marks it once it generates
                    down.append(server.url)
            if not down:
                return
            if self._stopped or time.monotonic() >= deadline:
                raise EngineError(f"sglang server(s) {down} not healthy", retryable=True)
            time.sleep(SERVER_WAIT_SECONDS)

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        self._wait_until_up()
        tp = self.config.rollout_num_gpus_per_engine
        offsets = {id(s): rank_offset + i * tp for i, s in enumerate(self.servers)}
        self._each_server_at_once(lambda s: s.client.init_weights_update_group(
            master_address, master_port, offsets[id(s)], world_size, group_name, backend))  # fmt: skip

    def begin_weight_update(self, group_name: str) -> None:
        """Open a weight-update session on every server at once (SGLang 0.5.21+ refuses a
        distributed update outside one; a server answering 404 has no sessions).

        A refusal closes the sessions this call opened and makes every server leave the group,
        so the trainer's broadcast fails at once instead of waiting for the group timeout."""
        opened: list[ServerProcess] = []
        lock = threading.Lock()

        def begin(server: ServerProcess) -> None:
            server.has_sessions = server.client.begin_weight_update()
            server.buckets_loaded = 0
            if server.has_sessions:
                with lock:
                    opened.append(server)

        try:
            self._each_server_at_once(begin)
        except EngineError as exc:
            self._close_sessions(opened)
            self._leave_group(group_name)
            raise EngineError(f"weight update refused: {exc}", retryable=exc.retryable) from None

    def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int,
        load_format: str | None = None,
    ) -> None:
        """One bucket, every server at once. A server refusing it leaves the group right away, so
        the trainer's broadcast fails at once (a refused server never joins it)."""

        def update(server: ServerProcess) -> None:
            try:
                server.client.update_weights_from_distributed(
                    names, dtypes, shapes, group_name, weight_version, load_format=load_format
                )
            except SGLangHTTPError as exc:
                if exc.status != 0:
                    self._leave_group(group_name, [server])
                raise
            server.buckets_loaded += 1

        self._each_server_at_once(update)

    def end_weight_update(self, weight_version: int | None) -> None:
        """Close every open session; `weight_version` None: the update failed. A server that
        loaded part of a failed update serves a mix of versions: it generates nothing until a
        whole update reaches it."""
        self._close_sessions([s for s in self.servers if s.has_sessions])
        for server in self.servers:
            if weight_version is not None:
                server.weight_version, server.awaiting_weights = weight_version, False
            elif server.buckets_loaded:
                server.awaiting_weights = True
                log.error("sglang server loaded part of a failed weight update; held out of generation "
                          "until the next update", url=server.url, buckets_loaded=server.buckets_loaded)  # fmt: skip
            server.buckets_loaded = 0

    def _close_sessions(self, servers: list[ServerProcess]) -> None:
        def end(server: ServerProcess) -> None:
            server.client.end_weight_update()

        try:
            self._each_server_at_once(end, servers)
        except EngineError as exc:  # a dead server's session died with it
            log.warning("closing weight-update sessions failed", error=str(exc))

    def _leave_group(self, group_name: str, servers: list[ServerProcess] | None = None) -> None:
        def leave(server: ServerProcess) -> None:
            server.client.destroy_weights_update_group(group_name)

        try:
            self._each_server_at_once(leave, servers)
        except EngineError as exc:
            log.warning("leaving the weight group failed", error=str(exc))

    def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        """Every server loads the files (all or nothing per server: SGLang keeps the old weights
        when a load fails); a server that failed is held out of generation until the next update."""
        failed: list[ServerProcess] = []

        def load(server: ServerProcess) -> None:
            try:
                # SGLang refuses a flush (and so the whole load) while any request runs, and an
                # abort just before takes a step to land: load, then flush once the server is idle.
                server.client.update_weights_from_disk(model_path, weight_version, flush_cache=False)
                server.client.flush_cache(timeout=FLUSH_IDLE_SECONDS)
            except SGLangHTTPError:
                failed.append(server)
                raise
            server.weight_version, server.awaiting_weights = weight_version, False

        try:
            self._each_server_at_once(load)
        except EngineError:
            if len(failed) < len(self.servers):  # the others now serve the new version
                for server in failed:
                    server.awaiting_weights = True
            raise

    # --- --check-weight-update-equal (SGLang's weight checker: its own hash, per server) ---

    checksum_algorithm = "sglang-weights-checker"

    def weights_checksum(self, dtype=None) -> tuple[str, int]:
        """SGLang's hash of the served weights (its fused tensors: not comparable with the trainer's
        sha256, but with this engine's own earlier checksums). Servers that disagree give a digest
        that matches no single server's ("servers-differ:...")."""
        if dtype is not None and str(dtype).removeprefix("torch.") != self.config.dtype:
            raise EngineUnsupported(f"sglang hashes its served dtype ({self.config.dtype}) only, not {dtype}")
        digests, tensors = {}, {}
        for server in self.servers:
            try:
                rank = server.client.weights_checker("checksum")["ranks"][0]
            except SGLangHTTPError as exc:  # 0.5.20's checker needs CUDA
                error = EngineUnsupported if exc.status else EngineError
                raise error(f"sglang {server.url} cannot hash its weights: {exc.message}") from None
            except (KeyError, IndexError) as exc:
                raise EngineError(f"sglang {server.url}: unexpected weights_checker reply: {exc}") from None
            digests[server.url] = (str(rank["per_gpu_checksum"]), len(rank["checksums"]))
            tensors[server.url] = rank["checksums"]
        if len(set(digests.values())) > 1:  # e.g. scrambled: then the servers differ
            first, *others = tensors.values()
            differ = sorted({n for o in others for n in first.keys() | o.keys() if first.get(n) != o.get(n)})
            log.warning("sglang servers serve different weights", servers=list(digests), tensors=differ[:8])
            combined = hashlib.sha256("".join(d for d, _ in digests.values()).encode()).hexdigest()
            return f"servers-differ:{combined}", max(n for _, n in digests.values())
        return next(iter(digests.values()))

    def scramble_weights(self, seed: int) -> int:
        """Random values in every weight of every server (SGLang draws them: `seed` is not used)."""
        num_tensors = self.weights_checksum()[1]
        self._each_server(lambda s: s.client.weights_checker("reset_tensors"))
        return num_tensors

    def reset_weights(self) -> None:
        # A new run: whatever a former run left on the servers (a request sent as its batch was
        # aborted) is aborted too; then SGLang reloads the Hugging Face directory in place.
        self._each_server(lambda s: s.client.abort_request(abort_all=True), skip_unreachable=True)
        self.update_weights_from_disk(self.config.hf_checkpoint, 0)
        self.weight_version = 0
