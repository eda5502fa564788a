"""--check-weight-update-equal: prove that a weight sync replaces every byte the engines serve.

    rollout_i.ScrambleWeights (random values, debug hook) -> checksums now differ from the trainer's
    -> sync_weights(v + 1) -> trainer.WeightChecksum == rollout_i.WeightChecksum (sha256 of every
    parameter in the serving dtype, rollway.common.weights_checksum) or the run fails

Miles' check of the same name scrambles the engine, syncs and compares; the scramble makes a
sync that silently skipped a tensor visible, which comparing after an ordinary sync would not.
"""

from __future__ import annotations

import grpc

from rollway.common.log import get_logger
from rollway.coordinator.remote import Services
from rollway.coordinator.run_state import RunState
from rollway.coordinator.weight_sync import WeightSyncSettings, sync_weights
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

log = get_logger("rollway.coordinator.weight_check")
SCRAMBLE_SEED = 20240617


class WeightCheckError(RuntimeError):
    """The engines' weights differ from the trainer's after a sync (or the check cannot run)."""


def _rollout_digests(services: Services, dtype: str) -> list[tuple[str, int, str]]:
    """(digest, num_tensors, algorithm) of each rollout service."""
    replies = []
    for stub, info in zip(services.rollouts, _infos(services), strict=True):
        # An engine hashing in its own format (sglang) hashes its served dtype.
        request = rollout_pb2.WeightChecksumRequest(dtype=dtype if info.engine != "sglang" else "")
        replies.append(stub.WeightChecksum(request).checksum)
    return [(c.digest, c.num_tensors, c.algorithm) for c in replies]


def _infos(services: Services) -> list[rollout_pb2.GetInfoResponse]:
    return [stub.GetInfo(rollout_pb2.GetInfoRequest()) for stub in services.rollouts]


def check_weight_update_equal(
    services: Services, state: RunState, settings: WeightSyncSettings
) -> dict[str, float]:
    """Scramble, sync version state.weight_version + 1, compare checksums; the sync's metrics.

    An engine hashing in rollway's sha256 (hf) must then equal the trainer's checksum. One that
    hashes in its own format (sglang's weight checker) must equal its own checksum from before the
    scramble: it served the trainer's weights then (the version last pushed, with no training
    since), so equality after the scramble proves the sync rewrote every tensor."""
    if not services.rollouts:
        raise WeightCheckError("check_weight_update_equal needs at least one rollout service")
    dtype = settings.dtype or _infos(services)[0].dtype
    try:
        trainer = services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype=dtype)).checksum
        before = _rollout_digests(services, dtype)
        for i, stub in enumerate(services.rollouts):
            stub.ScrambleWeights(rollout_pb2.ScrambleWeightsRequest(seed=SCRAMBLE_SEED + i))
        scrambled = _rollout_digests(services, dtype)
    except grpc.RpcError as exc:
        raise WeightCheckError(
            f"check_weight_update_equal cannot run: {exc.code().name}: {exc.details()}"
        ) from None
    expected = [
        (trainer.digest, trainer.num_tensors) if algorithm == trainer.algorithm else (digest, count)
        for digest, count, algorithm in before
    ]
    if any(s[:2] == e for s, e in zip(scrambled, expected, strict=True)):
        raise WeightCheckError(
            "scrambling did not change the engine's weights: the check would prove nothing"
        )
    state.weight_version += 1
    metrics = sync_weights(services, state.weight_version, settings)
    synced = _rollout_digests(services, dtype)
    differing = [i for i, (s, e) in enumerate(zip(synced, expected, strict=True)) if s[:2] != e]
    if differing:
        raise WeightCheckError(
            f"check_weight_update_equal failed: rollout(s) {differing} serve weights that differ from the "
            f"trainer's after syncing version {state.weight_version} (expected "
            f"{[expected[i][0][:16] for i in differing]}, engines {[synced[i][0][:16] for i in differing]})"
        )
    log.info("check_weight_update_equal passed", weight_version=state.weight_version,
             digest=trainer.digest, num_tensors=trainer.num_tensors, dtype=dtype)  # fmt: skip
    return metrics
