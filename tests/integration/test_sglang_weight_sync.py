"""Weight sync into real SGLang servers, both releases the adapter supports.

Per release: two servers (the session's shared pair, tests/conftest.py), a rollout service
attached to them (--sglang-urls), a trainer service, a gloo weight group on loopback. The tests
share these processes as runs would, in any order (each pushes the versions after the one it
finds): pushes reach every server (in a weight-update session on 0.5.21+), the served weights
equal the trainer's (greedy log-probs against ComputeLogProbs), the --check-weight-update-equal
check after training, and a refused update that leaves every server on its version without the
trainer waiting for the group timeout.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait

import pytest
from google.protobuf import struct_pb2
from support.processes import ServiceProcess
from support.sglang_servers import VERSIONS
from support.trainer_steps import train_sft_step

from rollway.common.v1 import common_pb2
from rollway.coordinator.remote import Services
from rollway.coordinator.run_state import RunState
from rollway.coordinator.weight_check import WeightCheckError, check_weight_update_equal
from rollway.coordinator.weight_sync import (
    WeightSyncError,
    WeightSyncSettings,
    init_weight_group,
    sync_weights,
)
from rollway.rollout.v1 import rollout_pb2
from rollway.trainer.v1 import trainer_pb2

pytestmark = [pytest.mark.slow, pytest.mark.sglang]
GROUP_TIMEOUT = 60.0
PROMPTS = ([1, 50, 60, 70], [1, 9], [1, 33, 44, 45])
# Train/rollout log-prob difference, fp32 on both sides (measured ~5e-7).
LOG_PROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=VERSIONS)
def stack(request, tiny_model_dir, tmp_path_factory, sglang_pair):
    version = request.param
    workdir = tmp_path_factory.mktemp(f"sglang-{version}")
    trainer = ServiceProcess(
        "trainer", ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32"], workdir
    )
    rollout = None
    with ThreadPoolExecutor(1) as pool:
        trainer_up = pool.submit(trainer.start)  # it needs no server: it starts while they do
        try:
            servers = sglang_pair(version)  # skips (fails on CI) without the install
            rollout = ServiceProcess(
                "rollout",
                ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32", "--reward", "none",
                 "--rollout-engine", "sglang", "--sglang-urls", *[s.url for s in servers]],
                workdir,
            ).start()  # fmt: skip
            trainer_up.result()
            services = Services.connect(trainer=trainer.address, rollouts=[rollout.address])
            config = struct_pb2.Struct()
            config.update({"lr": 0.02, "clip_grad": 0.0})  # a step moves the weights well past noise
            services.trainer.Init(trainer_pb2.InitRequest(config=config))
            yield {"version": version, "servers": servers, "services": services, "num_steps": 0,
                   "group_formed": False}  # fmt: skip
            services.close()
        finally:
            wait([trainer_up])
            for proc in (rollout, trainer):
                if proc is not None:
                    proc.stop()


@pytest.fixture(scope="module")
def settings():
    # Small buckets: several /update_weights_from_distributed calls per update.
    return WeightSyncSettings(bucket_size_bytes=256 * 1024, timeout_seconds=GROUP_TIMEOUT, max_attempts=1)


def greedy_samples(services: Services) -> list[common_pb2.Sample]:
    request = rollout_pb2.GenerateRequest(
        prompts=[rollout_pb2.Prompt(token_ids=p) for p in PROMPTS],
        n_samples_per_prompt=1,
        sampling_params=common_pb2.SamplingParams(temperature=0.0, max_new_tokens=8),
        reward="none",
    )
    replies = services.rollouts[0].Generate(request, timeout=120)
    return sorted((r.sample for r in replies), key=lambda s: s.group_index)


def max_log_prob_diff(services: Services) -> tuple[float, list[common_pb2.Sample]]:
    """Greedy samples through the rollout service and the largest |trainer - rollout| log-prob."""
    samples = greedy_samples(services)
    trainer = services.compute_log_probs(samples, temperature=1.0)
    diffs = [
        abs(a - b)
        for s, t in zip(samples, trainer, strict=True)
        for a, b in zip(s.rollout_log_probs, t, strict=True)
    ]
    assert len(diffs) == sum(len(s.response_token_ids) for s in samples) > 0
    return max(diffs), samples


def rollout_version(stack) -> int:
    return stack["services"].rollout_info()[0].weight_version


def served_versions(stack) -> list[str]:
    return [s.weight_version() for s in stack["servers"]]


def train_one_step(stack) -> None:
    """One optimizer step, each with its own step id (a repeated id is a retry, not a new step)."""
    train_sft_step(stack["services"], stack["num_steps"])
    stack["num_steps"] += 1


@pytest.fixture
def weight_group(stack, settings):
    """The module's weight group, formed by the first test that needs one (any order)."""
    if not stack["group_formed"]:
        init_weight_group(stack["services"], settings)
        stack["group_formed"] = True


def test_every_update_reaches_every_server(stack, settings):
    services, servers = stack["services"], stack["servers"]
    version = rollout_version(stack)
    # The shared pair may serve a former test's version: joining the group changes none of it.
    before = served_versions(stack)
    init_weight_group(services, settings)
    stack["group_formed"] = True
    assert served_versions(stack) == before and before[0] == before[1], before
    sync_weights(services, version + 1, settings)
    assert served_versions(stack) == [str(version + 1)] * 2
    train_one_step(stack)  # the trainer's weights move: the servers now serve stale ones
    stale_diff, _ = max_log_prob_diff(services)
    sync_weights(services, version + 2, settings)
    assert served_versions(stack) == [str(version + 2)] * 2
    assert [info.weight_version for info in services.rollout_info()] == [version + 2]
    diff, samples = max_log_prob_diff(services)
    assert diff < LOG_PROB_TOLERANCE < stale_diff, (diff, stale_diff)
    assert {s.weight_version for s in samples} == {version + 2}
    # Both servers serve the same weights: the same greedy tokens from each.
    assert (
        servers[0].greedy(PROMPTS[0]) == servers[1].greedy(PROMPTS[0]) == list(samples[0].response_token_ids)
    )


def test_check_weight_update_equal_after_training(stack, settings, weight_group):
    services = stack["services"]
    version = rollout_version(stack)
    train_one_step(stack)
    state = RunState(weight_version=version)
    sync_weights(services, version + 1, settings)
    state.weight_version = version + 1
    if stack["version"] == "0.5.20":  # its weight checker needs CUDA: the check says so, untouched
        with pytest.raises(WeightCheckError, match="UNIMPLEMENTED.*cannot hash its weights.*CUDA"):
            check_weight_update_equal(services, state, settings)
        assert served_versions(stack) == [str(version + 1)] * 2
        sync_weights(services, version + 2, settings)
        state.weight_version = version + 2
    else:
        check_weight_update_equal(services, state, settings)  # scrambles both, pushes the next, compares
    assert state.weight_version == version + 2
    assert served_versions(stack) == [str(version + 2)] * 2
    diff, _ = max_log_prob_diff(services)
    assert diff < LOG_PROB_TOLERANCE


def test_a_refused_update_leaves_every_server_on_its_version(stack, settings, weight_group):
    if stack["version"] == "0.5.20":
        pytest.skip("SGLang 0.5.20 has no weight-update sessions, so no session to refuse")
    services, servers = stack["services"], stack["servers"]
    version, before = rollout_version(stack), served_versions(stack)
    probes = [s.greedy(PROMPTS[2]) for s in servers]
    train_one_step(stack)
    # Someone else holds a session on server 1: its /begin_weight_update refuses ours.
    assert servers[1].client.begin_weight_update()
    try:
        started = time.monotonic()
        with pytest.raises(WeightSyncError, match="already open"):
            sync_weights(services, version + 1, settings)
        elapsed = time.monotonic() - started
    finally:
        servers[1].client.end_weight_update()
    # The trainer's broadcast failed at once (the servers left the group), not at the group timeout.
    assert elapsed < GROUP_TIMEOUT / 3, elapsed
    assert served_versions(stack) == before
    assert [s.greedy(PROMPTS[2]) for s in servers] == probes
    assert [info.weight_version for info in services.rollout_info()] == [version]
    assert all(info.num_workers_awaiting_weights == 0 for info in services.rollout_info())
    # The coordinator's retry: a rebuilt group, and the same version goes through.
    init_weight_group(services, settings)
    sync_weights(services, version + 1, settings)
    assert served_versions(stack) == [str(version + 1)] * 2
    diff, _ = max_log_prob_diff(services)
    assert diff < LOG_PROB_TOLERANCE
