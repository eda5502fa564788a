"""Services the coordinator did not start (attached by address) that die or freeze mid-run: the
run fails at once, the error names the service (never a bare "Stream removed"), and status.json
records it. They cannot be restarted from here: their owner does that."""

from __future__ import annotations

import json
import os
import signal
import time
from contextlib import ExitStack

import pytest
from support.rl_stack import rl_config, start_rl_stack
from support.stack import coordinator_stub, start_run, wait_run
from support.waiting import wait_until

from rollway.coordinator.v1 import coordinator_pb2

pytestmark = pytest.mark.slow

FAILED = coordinator_pb2.RUN_STATE_FAILED
HUNG_SERVICE_SECONDS = 4.0


def steps_done(stub, run_id: str) -> int:
    return stub.GetRun(coordinator_pb2.GetRunRequest(run_id=run_id)).run.step


def test_a_dead_or_frozen_attached_service_fails_the_run_naming_it(tiny_model_dir, demo_data_dir, tmp_path):
    with ExitStack() as stack:
        services = start_rl_stack(stack, tmp_path, tiny_model_dir, demo_data_dir)
        stub = coordinator_stub(services["coordinator"])
        runs_root = tmp_path / "runs"

        # A frozen rollout service: it answers nothing, so the hang watch names it.
        config = rl_config(services, num_rollout=10_000, hung_service_seconds=HUNG_SERVICE_SECONDS)
        start_run(stub, "frozen", config)
        wait_until(lambda: steps_done(stub, "frozen") >= 1, 120, "a first step")
        os.kill(services["rollout"].pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            final = wait_run(stub, "frozen", timeout=120)
            seconds = time.monotonic() - frozen_at
        finally:
            os.kill(services["rollout"].pid, signal.SIGCONT)
        assert final.state == FAILED
        address = services["rollout"].address
        assert final.error.startswith("rollout "), final.error
        assert address in final.error and ("is hung" in final.error or "unreachable" in final.error), (
            final.error
        )
        assert seconds < HUNG_SERVICE_SECONDS + 15
        status = json.loads((runs_root / "frozen" / "status.json").read_text())
        assert (status["state"], status["error"]) == ("FAILED", final.error)

        # A dead trainer (kill -9): named, not "Stream removed (recvmsg: Connection reset by peer)".
        start_run(stub, "dead", rl_config(services, num_rollout=10_000))
        wait_until(lambda: steps_done(stub, "dead") >= 1, 120, "a first step")
        os.kill(services["trainer"].pid, signal.SIGKILL)
        final = wait_run(stub, "dead", timeout=120)
        assert final.state == FAILED
        assert final.error.startswith(f"trainer at {services['trainer'].address} is unreachable"), final.error
        assert json.loads((runs_root / "dead" / "status.json").read_text())["state"] == "FAILED"
