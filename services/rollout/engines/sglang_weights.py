"""Weight updates of one engine's SGLang servers through their HTTP endpoints, and SGLang's own
hash of the served weights (--check-weight-update-equal). Called by the engine's weight hooks
(sglang.py), which the weight-sync receiver (weight_sync/sglang.py) drives:

    InitWeightGroup:  /init_weights_update_group, every server at once (i: rank_offset + i * tp)
    distributed:      /begin_weight_update (404: a server without sessions), then per bucket
                      /update_weights_from_distributed, then /end_weight_update, each on every
                      server at once
    disk:             /update_weights_from_disk, then /flush_cache once the server is idle

A refusal makes the servers leave the group (/destroy_weights_update_group), so the trainer's
broadcast fails at once instead of at the group timeout. A server that loaded part of a failed
update is held out of generation (sglang_fleet.py) until a whole update reaches it.
"""

from __future__ import annotations

import hashlib
import threading

from rollway.common.log import get_logger
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import EngineError, EngineUnsupported
from rollway.rollout.engines.sglang_fleet import ServerFleet
from rollway.rollout.engines.sglang_http import SGLangHTTPError
from rollway.rollout.engines.sglang_server import ServerProcess

log = get_logger("rollway.rollout.sglang")
# How long a server may take to finish the requests still running when its cache must be flushed
# after a disk load (aborted ones end within a step or two; a stray one ends at its length limit).
FLUSH_IDLE_SECONDS = 60.0


class SGLangWeights:
    """The weight endpoints of every server of `fleet`, each update all or nothing per server."""

    def __init__(self, config: RolloutConfig, fleet: ServerFleet):
        self.config = config
        self.fleet = fleet

    def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        self.fleet.wait_until_up()
        tp = self.config.rollout_num_gpus_per_engine
        offsets = {id(s): rank_offset + i * tp for i, s in enumerate(self.fleet.servers)}
        self.fleet.call_at_once(lambda s: s.client.init_weights_update_group(
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
            self.fleet.call_at_once(begin)
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

        self.fleet.call_at_once(update)

    def end_weight_update(self, weight_version: int | None) -> None:
        """Close every open session; `weight_version` None: the update failed. A server that
        loaded part of a failed update serves a mix of versions: it generates nothing until a
        whole update reaches it."""
        servers = self.fleet.servers
        self._close_sessions([s for s in servers if s.has_sessions])
        for server in servers:
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
            self.fleet.call_at_once(end, servers)
        except EngineError as exc:  # a dead server's session died with it
            log.warning("closing weight-update sessions failed", error=str(exc))

    def _leave_group(self, group_name: str, servers: list[ServerProcess] | None = None) -> None:
        def leave(server: ServerProcess) -> None:
            server.client.destroy_weights_update_group(group_name)

        try:
            self.fleet.call_at_once(leave, servers)
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
            self.fleet.call_at_once(load)
        except EngineError:
            if len(failed) < len(self.fleet.servers):  # the others now serve the new version
                for server in failed:
                    server.awaiting_weights = True
            raise

    def weights_checksum(self, dtype=None) -> tuple[str, int]:
        """SGLang's hash of the served weights (its fused tensors: not comparable with the trainer's
        sha256, but with this engine's own earlier checksums). Servers that disagree give a digest
        that matches no single server's ("servers-differ:...")."""
        if dtype is not None and str(dtype).removeprefix("torch.") != self.config.dtype:
            raise EngineUnsupported(f"sglang hashes its served dtype ({self.config.dtype}) only, not {dtype}")
        digests, tensors = {}, {}
        for server in self.fleet.servers:
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

    def scramble_weights(self) -> int:
        """Random values in every weight of every server (SGLang draws them); how many tensors."""
        num_tensors = self.weights_checksum()[1]
        self.fleet.call_each(lambda s: s.client.weights_checker("reset_tensors"))
        return num_tensors
