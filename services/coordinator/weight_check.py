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


def _rollout_digests(services: Services, dtype: str) -> list[tuple[str, int, int]]:
    request = rollout_pb2.WeightChecksumRequest(dtype=dtype)
    replies = [stub.WeightChecksum(request).checksum for stub in services.rollouts]
    return [(c.digest, c.num_tensors, c.weight_version) for c in replies]


def check_weight_update_equal(
    services: Services, state: RunState, settings: WeightSyncSettings
) -> dict[str, float]:
    """Scramble, sync version state.weight_version + 1, compare checksums; the sync's metrics."""
    if not services.rollouts:
        raise WeightCheckError("check_weight_update_equal needs at least one rollout service")
    infos = [stub.GetInfo(rollout_pb2.GetInfoRequest()) for stub in services.rollouts]
    dtype = settings.dtype or infos[0].dtype
    try:
        for i, stub in enumerate(services.rollouts):
            stub.ScrambleWeights(rollout_pb2.ScrambleWeightsRequest(seed=SCRAMBLE_SEED + i))
        expected = services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype=dtype)).checksum
        scrambled = _rollout_digests(services, dtype)
    except grpc.RpcError as exc:
        raise WeightCheckError(
            f"check_weight_update_equal cannot run: {exc.code().name}: {exc.details()}"
        ) from None
    if any(digest == expected.digest for digest, _, _ in scrambled):
        raise WeightCheckError(
            "scrambling did not change the engine's weights: the check would prove nothing"
        )
    state.weight_version += 1
    metrics = sync_weights(services, state.weight_version, settings)
    expected = services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype=dtype)).checksum
    synced = _rollout_digests(services, dtype)
    differing = [
        i
        for i, (digest, count, _) in enumerate(synced)
        if (digest, count) != (expected.digest, expected.num_tensors)
    ]
    if differing:
        raise WeightCheckError(
            f"check_weight_update_equal failed: rollout(s) {differing} serve weights that differ from the "
            f"trainer's after syncing version {state.weight_version} (trainer sha256 {expected.digest[:16]}..., "
            f"engines {[synced[i][0][:16] for i in differing]})"
        )
    log.info("check_weight_update_equal passed", weight_version=state.weight_version,
             digest=expected.digest, num_tensors=expected.num_tensors, dtype=dtype)  # fmt: skip
    return metrics
