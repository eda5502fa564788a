"""GRPO with the rollout on SGLang servers that were already running (--sglang-urls): two servers
of the newest release (the session's shared pair, tests/conftest.py), a rollout service attached to them by the run's
config, weight sync over gloo every step into both. (Both releases' weight sync, 0.5.20's
included: tests/integration/test_sglang_weight_sync.py.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest
from support.jsonl import read_metrics
from support.rl_stack import rl_config, start_rl_stack
from support.sglang_servers import NEWEST, sglang_venv
from support.stack import coordinator_stub, start_run, wait_run

from rollway.coordinator.v1 import coordinator_pb2

pytestmark = [pytest.mark.slow, pytest.mark.sglang]
LOG_PROB_TOLERANCE = 1e-4  # fp32 both sides, measured ~5e-7


def test_grpo_on_two_attached_servers(tiny_model_dir, demo_data_dir, tmp_path, sglang_pair):
    sglang_venv(NEWEST)  # skips (fails on CI) without the install, before anything starts
    with ThreadPoolExecutor(1) as pool, ExitStack() as exits:
        pair = pool.submit(sglang_pair, NEWEST)  # the services start while the servers do
        services = start_rl_stack(exits, tmp_path, tiny_model_dir, demo_data_dir)
        servers = pair.result()
        stub = coordinator_stub(services["coordinator"])
        config = rl_config(services, rollout_engine="sglang", sglang_urls=[s.url for s in servers],
                           dtype="float32", num_rollout=3)  # fmt: skip
        start_run(stub, "attached", config)
        final = wait_run(stub, "attached", timeout=600)
        assert final.state == coordinator_pb2.RUN_STATE_SUCCEEDED, final.error
        metrics = read_metrics(tmp_path / "runs" / "attached")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert [m["rollout/weight_version/min"] for m in metrics] == [1.0, 2.0, 3.0]
    assert all(m["rollout/num_samples"] == 16.0 and m["train/grad_norm"] > 0 for m in metrics)
    diffs = [m["train/train_rollout_logprob_abs_diff"] for m in metrics]
    assert all(d < LOG_PROB_TOLERANCE for d in diffs), diffs
    # Both servers were given every version, also the last one (pushed after step 2).
    assert [s.weight_version() for s in servers] == ["4", "4"]
    assert servers[0].greedy([1, 33, 44]) == servers[1].greedy([1, 33, 44])
