"""GRPO end to end with the rollout on real SGLang servers that the rollout service launches.

One stack for the module (dataloader, trainer, coordinator, rollout service). First a server that
cannot start (before any server is up, so that it stops none); then the first run launches two
SGLang 0.5.23 servers (rollout_num_gpus: 2 on the CPU route) and every later run reuses them,
since its engine settings are the same. Then the faults: kill -9 of one server mid-generation and
of the other mid-weight-update, in one run (supervision restarts each, the current weights reach
it before it generates, every step happens once), and SIGTERM of the rollout service stopping every server process (a
test after it, in another order, finds a new rollout service). Each test launches the servers
itself where it finds none, so the tests pass in any order; file order launches them least.

SGLang ignores sampling_seed on CPU, so samples differ from run to run: the assertions are on
what holds (counts, versions, staleness, log-prob parity with the trainer, steps once).
"""

from __future__ import annotations

import os
import random
import re
import signal
import string
import threading
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.jsonl import read_metrics
from support.processes import ServiceProcess, alive, descendants, wait_all_gone
from support.rl_stack import rl_config, start_rl_stack
from support.sglang_servers import NEWEST, rollout_settings
from support.stack import coordinator_stub, start_run, wait_run
from support.waiting import wait_until

from rollway.common.v1 import common_pb2
from rollway.coordinator import debug_data
from rollway.coordinator.v1 import coordinator_pb2
from rollway.rollout.engines.sglang_http import SGLangClient, SGLangHTTPError

pytestmark = [pytest.mark.slow, pytest.mark.sglang]
SUCCEEDED, FAILED = coordinator_pb2.RUN_STATE_SUCCEEDED, coordinator_pb2.RUN_STATE_FAILED
# fp32 on both sides: measured ~5e-7 (a server serving other weights gives ~1e-1).
LOG_PROB_TOLERANCE = 1e-4
# The stray request of a former run: as long as the tiny model's context (1,024) allows, each step
# slowed to at least STEP_SLEEP_SECONDS, so it needs >= 1,000 s, past every deadline of its test.
# Its prompt is longer than the 1-token generations of health checks, so its prefill shows in the log.
STRAY_PROMPT = list(range(5, 21))
STRAY_TOKENS = 1000
STEP_SLEEP_SECONDS = 1.0
STRAY_HTTP_SECONDS = 700.0
# Server 0's forward steps held this long while a server is to be killed mid-generation: a sample
# of 16 tokens stays in flight >= 2.4 s, 48 polls (0.5 s held step 0 alone >= 8 s).
KILL_STEP_SLEEP_SECONDS = 0.15


@pytest.fixture(scope="module")
def stack(tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sglang-grpo")
    base_port = random.randrange(20000, 28000, 2)
    engine = rollout_settings(
        NEWEST,
        tiny_model_dir,
        rollout_num_gpus=2,  # two servers
        sglang_port=base_port,
        sglang_log_dir=str(workdir / "sglang-logs"),
        sglang_health_interval=1.0,
        # A restart took over 300 s at a load of ~20 on the shared 2-core machine (30-40 s quiet).
        sglang_startup_timeout=600.0,
        sglang_server_concurrency=4,
    )
    with ExitStack() as exits:
        services = start_rl_stack(exits, workdir, tiny_model_dir, demo_data_dir)
        yield {
            "exits": exits,
            "services": services,
            "workdir": workdir,
            "engine": engine,
            "urls": [f"http://127.0.0.1:{base_port + i}" for i in range(2)],
            "stub": coordinator_stub(services["coordinator"]),
        }


@pytest.fixture(autouse=True)
def rollout_service_up(stack):
    """A rollout service SIGTERMed by a former test (the module's last one, in file order) is
    started again, the same way, so that every test finds the whole stack in any order."""
    rollout = stack["services"]["rollout"]
    if rollout.proc.poll() is not None:
        rollout.stop()
        again = ServiceProcess(rollout.service, rollout.args, rollout.workdir, env=rollout.env)
        stack["services"]["rollout"] = stack["exits"].enter_context(again)


def run(stack, name: str, **extra) -> list[dict]:
    config = rl_config(stack["services"], **stack["engine"], **extra)
    start_run(stack["stub"], name, config)
    final = wait_run(stack["stub"], name, timeout=600)
    assert final.state == SUCCEEDED, final.error
    return read_metrics(stack["workdir"] / "runs" / name)


def server_pids(stack) -> dict[int, int]:
    """pid of each launched launch_server process (the guard's child), by port."""
    pids = {}
    for pid, command in descendants(stack["services"]["rollout"].pid).items():
        if "sglang.launch_server" in command and "sglang_guard" not in command:
            port = int(command.split("--port")[1].split()[0])
            pids[port] = pid
    return pids


def served_versions(stack) -> list[str]:
    return [SGLangClient(url).weight_version() for url in stack["urls"]]


def test_a_server_that_cannot_start_fails_the_run_naming_it(stack):
    # First in the module: no servers are up yet, so its run (other engine settings) stops none
    # that the next tests would have to launch again.
    engine = {
        **stack["engine"],
        "sglang_extra_args": [*stack["engine"]["sglang_extra_args"], "--no-such-flag"],
    }
    start_run(stack["stub"], "bad-server", rl_config(stack["services"], **engine, num_rollout=1))
    final = wait_run(stack["stub"], "bad-server", timeout=300)
    assert final.state == FAILED
    assert stack["urls"][0] in final.error and "--no-such-flag" in final.error, final.error


def test_sync_grpo_through_two_launched_servers(stack):
    metrics = run(stack, "sync", check_weight_update_equal=True)
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # v1 before the first rollout, v2 from the check (it scrambles both servers and pushes).
    assert [m["rollout/weight_version/min"] for m in metrics] == [2.0, 3.0, 4.0]
    assert [m["rollout/weight_version"] for m in metrics] == [3.0, 4.0, 5.0]
    assert all(m["rollout/num_samples"] == 16.0 and m["train/grad_norm"] > 0 for m in metrics)
    assert all(m["train/train_rollout_logprob_abs_diff"] < LOG_PROB_TOLERANCE for m in metrics), [
        m["train/train_rollout_logprob_abs_diff"] for m in metrics
    ]
    assert all(m["perf/weight_sync_time"] > 0 for m in metrics)
    assert served_versions(stack) == ["5", "5"]
    assert len(server_pids(stack)) == 2


def test_async_with_staleness_two(stack):
    metrics = run(
        stack, "async2", num_rollout=5, async_mode=True, max_weight_staleness=2, rollout_max_response_len=2
    )
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 4]
    # How far ahead generation gets depends on its speed against training's (SGLang on CPU is
    # the slower side here); the bound is what must hold.
    staleness = [m["rollout/staleness/max"] for m in metrics]
    assert staleness[0] == 0.0 and 1.0 <= max(staleness) <= 2.0, staleness
    assert all(m["rollout/weight_version/min"] >= m["step"] - 1 for m in metrics)
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_dynamic_sampling_over_sampling_and_partial_rollout(stack):
    # Refills of 4 prompts; once 4 groups with reward variance are in, the leftovers are aborted
    # on the servers and continued in the next rollout from their partial responses.
    metrics = run(
        stack,
        "partial",
        n_samples_per_prompt=2,
        global_batch_size=8,
        rollout_max_response_len=16,
        dynamic_sampling_filter_path="check_reward_nonzero_std",
        over_sampling_batch_size=4,
        partial_rollout=True,
        mask_offpolicy_in_partial_rollout=True,
        num_rollout=4,
    )
    assert [m["step"] for m in metrics] == [0, 1, 2, 3]
    assert all(m["rollout/num_samples"] == 8.0 and m["rollout/raw_reward"] == 0.5 for m in metrics)
    assert sum(m["rollout/zero_std/dropped_groups"] for m in metrics) > 0
    carried = [m["rollout/partial/carried_groups"] for m in metrics]
    continued = [m["rollout/partial/continued_samples"] for m in metrics]
    assert all((continued[k + 1] > 0) == (carried[k] > 0) for k in range(len(metrics) - 1))
    assert all(m["train/grad_norm"] > 0 for m in metrics)


# The calculator task with the model's first turn read as a call of the calculator on the prompt's
# sum (the random tiny model writes no tool calls of its own): every episode is model turn ->
# the real calculator environment's tool message -> model turn (the answer, rewarded).
FORCED_CALCULATOR = """
import re
from rollway.rollout.environments.base import ModelTurn
from rollway.rollout.environments.calculator import CalculatorEnvironment
from rollway.rollout.environments.tool_calls import format_tool_call


class FirstTurnCallsTheCalculator(CalculatorEnvironment):
    def reset(self, start):
        super().reset(start)
        self.expression = re.search(r"\\d+ \\+ \\d+", start.prompt).group(0)
        self.num_turns = 0

    def step(self, turn):
        self.num_turns += 1
        if self.num_turns == 1:
            call = format_tool_call("calculator", {"expression": self.expression})
            turn = ModelTurn(call, turn.token_ids, turn.finish_reason)
        return super().step(turn)
"""


def test_a_run_starts_on_servers_still_running_a_former_request(stack):
    """A request a former run left on a server (one sent as its batch was aborted) is aborted by
    the next run's Init; SGLang refuses to flush its cache under a running request, so the reset
    to the run's weights would fail otherwise.

    The stray request cannot end on its own before the test's deadlines, however fast the machine:
    SGLang's own test hook (/slow_down) sleeps before every forward step of server 0 while the stray
    runs, so its STRAY_TOKENS steps take at least STRAY_TOKENS * STEP_SLEEP_SECONDS, longer than the
    run's 600 s deadline. Only an abort ends it in time."""
    if not server_pids(stack):
        run(stack, "launch", num_rollout=1)
    client = SGLangClient(stack["urls"][0])
    server_log = stack["workdir"] / "sglang-logs" / "server-0.log"
    seen = _log_lines(server_log)
    stray = {}

    def generate() -> None:
        body = {"max_new_tokens": STRAY_TOKENS, "ignore_eos": True, "temperature": 1.0}
        try:
            stray["reply"] = client.generate(STRAY_PROMPT, body, rid="stray", timeout=STRAY_HTTP_SECONDS)
        except Exception as exc:  # reported by the assertion below
            stray["error"] = exc
        finally:  # the run's own generation on server 0 at full speed again
            client.post("/slow_down", {"forward_sleep_time": None})

    client.post("/slow_down", {"forward_sleep_time": STEP_SLEEP_SECONDS})  # in effect once answered
    thread = threading.Thread(target=generate, daemon=True)
    try:
        thread.start()
        wait_until(lambda: _stray_prefilled(server_log, seen), timeout=60, what="the stray request's prefill")
        assert thread.is_alive(), stray
        metrics = run(stack, "after-stray", num_rollout=1)
        thread.join(timeout=60)
    finally:
        client.post("/slow_down", {"forward_sleep_time": None})
    assert "reply" in stray, stray
    assert stray["reply"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(stray["reply"]["output_ids"]) < STRAY_TOKENS
    assert metrics[0]["train/train_rollout_logprob_abs_diff"] < LOG_PROB_TOLERANCE


def test_multi_turn_calculator_episodes(stack):
    (stack["workdir"] / "rewards" / "forced_calculator.py").write_text(FORCED_CALCULATOR)
    dump = str(stack["workdir"] / "episodes" / "rollout_{rollout_id}.pb")
    # Any lowercase letter or digit 0-5 ends a model turn (a random model seldom writes its end
    # of turn; SGLang takes at most 32 stop strings).
    stop = list(string.ascii_lowercase + string.digits[:6])
    metrics = run(stack, "calculator", environment="custom", generate_max_turns=3, rollout_max_response_len=6,
                  rollout_stop=stop,
                  custom_generate_function_path="forced_calculator:FirstTurnCallsTheCalculator",
                  save_debug_rollout_data=dump)  # fmt: skip
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # Token in, token out: the trainer's log-probs of the model turns, read in the whole episode
    # (the tool message in between), equal SGLang's of each turn.
    assert all(m["train/train_rollout_logprob_abs_diff"] < LOG_PROB_TOLERANCE for m in metrics)
    episodes = [s for rollout_id in range(3) for s in debug_data.load_rollout(dump, rollout_id)]
    # A first turn cut at rollout_max_response_len ends its episode ("length"): one model turn.
    ended = [s for s in episodes if s.finish_reason == common_pb2.FINISH_REASON_STOP]
    assert len(episodes) == 48 and len(ended) > len(episodes) // 2
    for sample in ended:
        assert [t.role for t in sample.turns] == ["model", "environment", "model"]
        first, tool, _ = sample.turns
        assert set(sample.loss_mask[: first.num_tokens]) == {1}
        assert set(sample.loss_mask[first.num_tokens : first.num_tokens + tool.num_tokens]) == {0}
        assert sum(t.num_tokens for t in sample.turns) == len(sample.response_token_ids)
        assert tool.num_tokens > 0 and all(
            t.weight_version == sample.weight_version for t in sample.turns if t.role == "model"
        )


def _wait_in_run(stack, name: str, ready, what: str, timeout: float) -> None:
    """Wait until `ready()`, failing at once if the run ends first."""

    def moment() -> bool:
        if ready():
            return True
        run = stack["stub"].GetRun(coordinator_pb2.GetRunRequest(run_id=name)).run
        assert run.state not in (SUCCEEDED, FAILED), f"{name} ended before {what}: {run.error}"
        return False

    wait_until(moment, timeout=timeout, what=f"{name}: {what}", poll=0.05)


def _kill_when(stack, name: str, ready, server: int, timeout: float = 300.0) -> int:
    """Wait until `ready()` (failing at once if the run ends first); then kill -9 server `server`
    and return its old pid."""
    _wait_in_run(stack, name, ready, f"the moment to kill server {server}", timeout)
    pid = server_pids(stack)[_port(stack, server)]
    os.kill(pid, signal.SIGKILL)
    return pid


def _port(stack, server: int) -> int:
    return int(stack["urls"][server].rsplit(":", 1)[1])


def _restarted(stack, server: int, old_pid: int) -> bool:
    return not alive(old_pid) and server_pids(stack).get(_port(stack, server)) not in (None, old_pid)


@pytest.mark.timeout(1200)  # two server restarts one after the other (3-4 min each at a load of ~20)
def test_kill_a_server_mid_generation_and_the_other_mid_weight_update(stack):
    """Two faults in one run of 4 steps (the restarts cannot overlap: a weight update waits for
    every server, so two runs would only add a run's start): kill -9 of server 0 while step 1's
    samples are on it, then of server 1 inside the first weight update after server 0 is back.
    Supervision restarts each; a sample in flight is sent again, the interrupted update is
    retried in a rebuilt group, the current weights reach each restarted server before it
    generates, and every step happens once with every version once."""
    info = lambda: stack["services"]["rollout"]  # noqa: E731
    if not server_pids(stack):
        run(stack, "launch", num_rollout=1)
    server_1_log = stack["workdir"] / "sglang-logs" / "server-1.log"
    # Server 0's samples stay in flight >= KILL_STEP_SLEEP_SECONDS (every forward step is held that
    # long), so the moment to kill cannot pass between two polls (0.05 s) however fast generation
    # is; the restarted server is a new process, at full speed.
    client = SGLangClient(stack["urls"][0])
    client.post("/slow_down", {"forward_sleep_time": KILL_STEP_SLEEP_SECONDS})
    try:
        # Small buckets: an update is many /update_weights_from_distributed calls.
        start_run(stack["stub"], "kill", rl_config(stack["services"], **stack["engine"], num_rollout=4,
                                                     rollout_max_response_len=16,
                                                     update_weight_buffer_size=64 * 1024))  # fmt: skip
        log = stack["workdir"] / "runs" / "kill" / "metrics.jsonl"

        def generating_step_one() -> bool:  # step 0 done, step 1's samples on the servers
            return log.exists() and log.read_text().count("\n") >= 1 and _in_flight(info()) > 0

        old_pid_0 = _kill_when(stack, "kill", generating_step_one, server=0)
    except BaseException:
        client.post("/slow_down", {"forward_sleep_time": None})  # the module's later tests at full speed
        raise

    # The second fault waits for server 0 to serve pushed weights again (a restarted server serves
    # "default" until an update reaches it): an update that began before (one that found server 0
    # dead) is not the one to interrupt. Updates after steps 2 and 3 are still to come.
    def server_0_back_with_weights() -> bool:
        if not _restarted(stack, 0, old_pid_0):
            return False
        try:
            return SGLangClient(stack["urls"][0], timeout=10.0).weight_version() != "default"
        except SGLangHTTPError:
            return False

    _wait_in_run(stack, "kill", server_0_back_with_weights, "server 0 restarted with weights", timeout=700)
    begun = _log_count(server_1_log, "/begin_weight_update")

    def updating() -> bool:  # the next update has begun on server 1
        return _log_count(server_1_log, "/begin_weight_update") > begun

    old_pid_1 = _kill_when(stack, "kill", updating, server=1)
    metrics = _steps_once(stack, "kill", 4)
    assert all(m["rollout/num_samples"] == 16.0 for m in metrics), "a sample in flight on server 0 was lost"
    assert [m["rollout/weight_version"] for m in metrics] == [2.0, 3.0, 4.0, 5.0], (
        "the interrupted update skipped or repeated a version"
    )
    assert _restarted(stack, 0, old_pid_0), "server 0 (killed mid-generation) was not restarted"
    assert _restarted(stack, 1, old_pid_1), "server 1 (killed mid-update) was not restarted"
    assert served_versions(stack) == ["5", "5"], "a restarted server did not get the current weights"
    assert all(m["train/train_rollout_logprob_abs_diff"] < LOG_PROB_TOLERANCE for m in metrics), (
        "samples generated with other weights than the trainer's"
    )


def _steps_once(stack, name: str, num_steps: int) -> list[dict]:
    final = wait_run(stack["stub"], name, timeout=600)
    assert final.state == SUCCEEDED, final.error
    metrics = read_metrics(stack["workdir"] / "runs" / name)
    assert [m["step"] for m in metrics] == list(range(num_steps)), "a step was skipped or repeated"
    return metrics


def _log_count(log: Path, text: str) -> int:
    return log.read_text().count(text) if log.exists() else 0


def _log_lines(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def _stray_prefilled(log: Path, after_line: int) -> bool:
    """A prefill of at least the stray's prompt after `after_line`: only health checks (1 token each)
    and the stray reach the server between runs, so this batch holds the stray (then running)."""
    for line in log.read_text().splitlines()[after_line:]:
        if match := re.search(r"Prefill batch.* #new-token: (\d+), #cached-token: (\d+)", line):
            if int(match[1]) + int(match[2]) >= len(STRAY_PROMPT):
                return True
    return False


def _in_flight(rollout) -> int:
    from rollway.common.client import open_channel
    from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

    with open_channel(rollout.address) as channel:
        stub = rollout_pb2_grpc.RolloutServiceStub(channel)
        return stub.GetInfo(rollout_pb2.GetInfoRequest(), timeout=10).num_samples_in_flight


def test_sigterm_of_the_rollout_service_stops_its_servers(stack):
    # Last in the module, on the servers its former tests launched; alone, it launches them.
    if len(server_pids(stack)) != 2:
        run(stack, "last", num_rollout=1)
    pids = list(descendants(stack["services"]["rollout"].pid))
    assert len(server_pids(stack)) == 2
    rollout = stack["services"]["rollout"]
    rollout.signal(signal.SIGTERM)
    assert wait_all_gone(pids, timeout=60) == []
    rollout.proc.wait(60)  # the service ends too (and the next test, in another order, finds it gone)
