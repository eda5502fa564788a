"""Weight sync over real services: a trainer, two hf rollout services, a gloo group on loopback.

The tests run in file order against the same processes, as a run would: first push, training then
a push (generation equals the trainer's export), retries and refusals, the disk path, the
--check-weight-update-equal mode, a corrupted bucket, and a receiver killed mid-transfer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from support.trainer_steps import train_sft_step as train
from support.waiting import wait_until

from rollway.common.v1 import common_pb2
from rollway.coordinator.remote import Services
from rollway.coordinator.run_state import RunState
from rollway.coordinator.weight_check import check_weight_update_equal
from rollway.coordinator.weight_sync import (
    WeightSyncError,
    WeightSyncSettings,
    init_weight_group,
    sync_weights,
)
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

pytestmark = pytest.mark.slow
TIMEOUT = 20.0
TESTS_DIR = str(Path(__file__).resolve().parents[1])  # support.weight_faults lives there
FAULTS_ENV = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")])}
METRICS = {
    "perf/weight_sync_gather_time",
    "perf/weight_sync_pause_time",
    "perf/weight_sync_wire_time",
    "perf/weight_sync_load_time",
    "perf/weight_sync_verify_time",
    "perf/weight_sync_time",
    "perf/weight_sync_bytes",
    "perf/weight_sync_gbytes_per_s",
}


def rollout_args(model_dir) -> list[str]:
    return ["--hf-checkpoint", str(model_dir), "--dtype", "float32", "--reward", "none"]


def start_all(*procs: ServiceProcess) -> list[ServiceProcess]:
    """Start the processes concurrently (each start waits for its health check)."""
    with ThreadPoolExecutor(len(procs)) as pool:
        list(pool.map(ServiceProcess.start, procs))
    return list(procs)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("weight-sync")
    trainer = ServiceProcess(
        "trainer", ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32"], workdir
    )
    rollouts = [ServiceProcess("rollout", rollout_args(tiny_model_dir), workdir) for _ in range(2)]
    procs = []
    try:
        procs = start_all(trainer, *rollouts)
        services = Services.connect(trainer=trainer.address, rollouts=[r.address for r in rollouts])
        yield {"services": services, "trainer": trainer, "rollouts": rollouts, "workdir": workdir}
        services.close()
    finally:
        for proc in procs or [trainer, *rollouts]:
            proc.stop()


@pytest.fixture(scope="module")
def settings():
    return WeightSyncSettings(bucket_size_bytes=256 * 1024, timeout_seconds=TIMEOUT, max_attempts=1)


def checksums(services: Services) -> tuple[str, list[str]]:
    trainer = services.trainer.WeightChecksum(trainer_pb2.WeightChecksumRequest(dtype="float32")).checksum
    request = rollout_pb2.WeightChecksumRequest(dtype="float32")
    return trainer.digest, [stub.WeightChecksum(request).checksum.digest for stub in services.rollouts]


def versions(services: Services) -> list[int]:
    return [info.weight_version for info in services.rollout_info()]


def refused(call, code: grpc.StatusCode, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    assert fragment in err.value.details()


def greedy(stub) -> list[tuple[list[int], list[float]]]:
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=p) for p in ([1, 50, 60, 70], [1, 9], [1, 33, 44, 45])],
        n_samples_per_prompt=1,
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=12),
        reward="none",
    )
    samples = sorted((r.sample for r in stub.Generate(request, timeout=120)), key=lambda s: s.group_index)
    return [(list(s.response_token_ids), list(s.rollout_log_probs)) for s in samples]


def test_first_push_makes_both_engines_serve_the_trainers_weights(cluster, settings):
    services = cluster["services"]
    spec = init_weight_group(services, settings)
    assert (spec.world_size, spec.backend) == (3, "gloo")
    metrics = sync_weights(services, 1, settings)
    assert set(metrics) == METRICS and metrics["perf/weight_sync_time"] > 0
    assert metrics["perf/weight_sync_wire_time"] > 0 and metrics["perf/weight_sync_verify_time"] > 0
    assert versions(services) == [1, 1]
    trainer, engines = checksums(services)
    assert engines == [trainer, trainer]


def test_bad_requests_are_refused_with_the_field_named(cluster):
    services = cluster["services"]
    push = services.trainer.PushWeights
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    refused(lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=0))), invalid, "weight_version")
    refused(
        lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=5, transport="tcp"))),
        invalid,
        "transport",
    )
    refused(
        lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=5, dtype="int8"))), invalid, "dtype"
    )
    refused(
        lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=5, transport="disk"))),
        invalid,
        "disk_path",
    )
    bad = common_pb2.WeightGroupSpec(group_name="g", master_address="127.0.0.1", master_port=0, world_size=2)
    refused(lambda: services.trainer.InitWeightGroup(trainer_pb2.InitWeightGroupRequest(group=bad)), invalid,
            "group.master_port")  # fmt: skip
    bad.master_port, bad.backend, bad.timeout_seconds = 1234, "gloo", 5
    rollout = services.rollouts[0]
    refused(lambda: rollout.InitWeightGroup(rollout_pb2.InitWeightGroupRequest(group=bad)), invalid,
            "group.rank_offset")  # fmt: skip
    refused(lambda: rollout.UpdateWeights(rollout_pb2.UpdateWeightsRequest()), invalid, "manifest")
    manifest = common_pb2.WeightManifest(
        weight_version=2, transport="distributed", checksum_algorithm="sha256"
    )
    refused(lambda: rollout.UpdateWeights(rollout_pb2.UpdateWeightsRequest(manifest=manifest)), invalid,
            "manifest.checksum_algorithm")  # fmt: skip
    assert versions(services) == [1, 1]  # nothing changed, the services still serve


def test_trained_weights_generate_exactly_like_the_trainers_export(cluster, settings, tmp_path):
    services = cluster["services"]
    _, (initial, _) = checksums(services)
    config = struct_pb2.Struct()
    config.update({"lr": 0.02, "clip_grad": 0.0})
    services.trainer.Init(trainer_pb2.InitRequest(config=config))
    for step in range(3):
        train(services, step)
    sync_weights(services, 2, settings)
    assert versions(services) == [2, 2]
    trainer, engines = checksums(services)
    assert engines == [trainer, trainer] and trainer != initial
    saved = services.trainer.SaveCheckpoint(
        trainer_pb2.SaveCheckpointRequest(path=str(tmp_path), hf_export=True)
    )
    with ServiceProcess("rollout", rollout_args(saved.hf_dir), cluster["workdir"]) as exported:
        reference = greedy(Services.connect(rollouts=[exported.address]).rollouts[0])
    for stub in services.rollouts:
        synced = greedy(stub)
        assert [tokens for tokens, _ in synced] == [tokens for tokens, _ in reference]
        for (_, logp), (_, ref) in zip(synced, reference, strict=True):
            assert logp == pytest.approx(ref, abs=1e-6)


def test_retries_are_no_ops_and_versions_only_move_forward(cluster, settings):
    services = cluster["services"]
    metrics = sync_weights(services, 2, settings)  # every engine serves 2 already
    assert metrics["perf/weight_sync_wire_time"] == 0 and versions(services) == [2, 2]
    push = services.trainer.PushWeights
    refused(lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=1))), grpc.StatusCode.FAILED_PRECONDITION,
            "only move forward")  # fmt: skip
    train(services, 10)
    refused(lambda: list(push(trainer_pb2.PushWeightsRequest(weight_version=2))), grpc.StatusCode.FAILED_PRECONDITION,
            "push a new version")  # fmt: skip
    with pytest.raises(WeightSyncError, match="only move forward"):
        sync_weights(services, 1, settings)


def test_disk_path_writes_atomically_and_the_engines_load_it(cluster, settings, tmp_path):
    services = cluster["services"]
    disk = WeightSyncSettings(
        transport="disk", disk_path=str(tmp_path), bucket_size_bytes=1 << 20, max_attempts=1
    )
    assert init_weight_group(services, disk) is None  # no group for the disk path
    metrics = sync_weights(services, 3, disk)
    assert versions(services) == [3, 3] and metrics["perf/weight_sync_verify_time"] > 0
    trainer, engines = checksums(services)
    assert engines == [trainer, trainer]
    written = tmp_path / "weights-v00000003"
    files = sorted(p.name for p in written.iterdir())
    assert "config.json" in files and "model.safetensors.index.json" in files
    assert [f for f in files if f.endswith(".safetensors")] == [
        f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    train(services, 11)
    sync_weights(services, 4, disk)
    train(services, 12)
    sync_weights(services, 5, disk)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights-v00000004", "weights-v00000005"]


def test_check_weight_update_equal_scrambles_syncs_and_compares(cluster, settings):
    services = cluster["services"]
    init_weight_group(services, settings)
    state = RunState()
    state.weight_version = 5
    metrics = check_weight_update_equal(services, state, settings)
    assert state.weight_version == 6 and versions(services) == [6, 6]
    assert metrics["perf/weight_sync_time"] > 0
    trainer, engines = checksums(services)
    assert engines == [trainer, trainer]


def test_a_corrupted_bucket_is_refused_and_the_old_weights_keep_serving(cluster, settings, tiny_model_dir):
    corrupt = ServiceProcess("rollout", [*rollout_args(tiny_model_dir), "--corrupt-receive"], cluster["workdir"],
                             module="support.weight_faults", env=FAULTS_ENV)  # fmt: skip
    with corrupt:
        both = Services.connect(trainer=cluster["trainer"].address,
                                rollouts=[cluster["rollouts"][0].address, corrupt.address])  # fmt: skip
        before = checksums(both)[1][1]
        init_weight_group(both, settings)
        train(both, 13)
        with pytest.raises(WeightSyncError) as err:
            sync_weights(both, 7, settings)
        assert "DATA_LOSS" in str(err.value) and "rank 2: checksum mismatch" in str(err.value)
        assert not err.value.retryable
        assert versions(both) == [7, 0]  # the healthy engine committed, the corrupt one kept version 0
        trainer, (healthy, damaged) = checksums(both)
        assert healthy == trainer and damaged == before
        assert len(greedy(both.rollouts[1])) == 3  # and it still serves
        both.close()


def test_a_receiver_killed_mid_transfer_fails_the_push_and_a_rebuilt_group_succeeds(
    cluster, settings, tiny_model_dir
):
    workdir = cluster["workdir"]
    slow = ServiceProcess("rollout", [*rollout_args(tiny_model_dir), "--slow-receive", "0.3"], workdir,
                          module="support.weight_faults", env=FAULTS_ENV)  # fmt: skip
    first = cluster["rollouts"][0].address
    with slow:
        pair = Services.connect(trainer=cluster["trainer"].address, rollouts=[first, slow.address])
        init_weight_group(pair, settings)
        old = versions(pair)[0]
        train(pair, 14)
        outcome = {}

        def sync() -> None:
            started = time.monotonic()
            try:
                sync_weights(pair, 8, settings)
            except WeightSyncError as exc:
                outcome["error"] = exc
            outcome["seconds"] = time.monotonic() - started

        thread = threading.Thread(target=sync)
        thread.start()
        # Receiving has begun; 17 buckets at 0.3 s each: killed mid-transfer.
        wait_until(lambda: "receiving weights" in slow.log_text(), 60, "the slow receiver to start receiving")
        slow.signal(signal.SIGKILL)
        thread.join(TIMEOUT + 30)
        assert not thread.is_alive()
        assert outcome["seconds"] < TIMEOUT, outcome  # failed fast, well within the group timeout
        error = str(outcome["error"])
        assert "trainer: UNAVAILABLE" in error and "not delivered" in error and outcome["error"].retryable
        survivor = pair.rollouts[0].GetInfo(rollout_pb2.GetInfoRequest())
        assert survivor.weight_version == old  # the survivor keeps its version
        pair.close()
    fresh = ServiceProcess("rollout", rollout_args(tiny_model_dir), workdir)
    with fresh:
        rebuilt = Services.connect(trainer=cluster["trainer"].address, rollouts=[first, fresh.address])
        init_weight_group(rebuilt, settings)
        sync_weights(rebuilt, 8, settings)
        assert versions(rebuilt) == [8, 8]
        trainer, engines = checksums(rebuilt)
        assert engines == [trainer, trainer]
        rebuilt.close()
