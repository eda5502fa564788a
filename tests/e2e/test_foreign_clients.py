"""rollway driven as other systems drive it: a Node.js client and `buf curl` run whole jobs.

    npm ci (tests/e2e/node) -> node run_job.mjs --address COORD --config run.json -> JSON summary
    buf curl (server reflection only, no .proto files) -> StartRun, GetRun, StreamMetrics, StopRun

One coordinator per module, started with no other service: every run makes it start the
services the run needs (dataloader, trainer, and rollout for RL) as its own children and stop
them at the run's end. The tests watch those children through /proc while the run goes on and
check afterwards that they are gone and their addresses refuse health checks. The GRPO runs use a
custom reward (the share of digits in a response) so that rewards vary within a group and the
policy gradient is not zero: the tiny model never answers the sums right.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import ServiceProcess

from rollway.demo.data import write_digit_share_reward

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NODE_CLIENT = REPO / "tests" / "e2e" / "node"
BUF = Path(sys.executable).parent / "buf"
BUF_FLAGS = ["--protocol", "grpc", "--http2-prior-knowledge", "--reflect-protocol", "grpc-v1"]
COORDINATOR = "rollway.coordinator.v1.CoordinatorService"
SERVICE_MODULE = re.compile(r"-m\x00rollway\.(dataloader|trainer|rollout)\x00")
# npm's own words for a registry it cannot reach (npm ci prints one of them, with the code).
NPM_OFFLINE = re.compile(
    r"E(NOTFOUND|AI_AGAIN|CONNREFUSED|CONNRESET|TIMEDOUT|NETUNREACH|HOSTUNREACH)|network", re.I
)
RUN_SECONDS = 240.0


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def node_client() -> Path:
    """tests/e2e/node with its pinned packages installed (npm ci; again only when the lock changed)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node and npm are needed for the Node.js client tests (apt-get install nodejs npm)")
    lock = NODE_CLIENT / "package-lock.json"
    stamp = NODE_CLIENT / "node_modules" / ".rollway-installed-lock-sha256"
    wanted = hashlib.sha256(lock.read_bytes()).hexdigest()
    with open(NODE_CLIENT / "package.json") as guard:  # one installer at a time in this folder
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text() != wanted:
            result = subprocess.run(
                ["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=NODE_CLIENT,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if result.returncode != 0:
                output = result.stdout + result.stderr
                offline = [line for line in output.splitlines() if NPM_OFFLINE.search(line)]
                if offline:
                    pytest.skip(
                        "npm cannot reach its registry, so the Node.js client's packages are not installed: "
                        + " | ".join(offline[:3])
                    )
                pytest.fail(f"npm ci failed (exit {result.returncode}):\n{output[-3000:]}")
            stamp.write_text(wanted)
    return NODE_CLIENT


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory):
    """One coordinator, alone: the runs start their own services. Its children can import the reward."""
    workdir = tmp_path_factory.mktemp("foreign-clients")
    rewards = workdir / "rewards"
    write_digit_share_reward(rewards, "e2e_digit_reward")
    path = os.pathsep.join(p for p in (str(rewards), os.environ.get("PYTHONPATH", "")) if p)
    with ServiceProcess(
        "coordinator", ["--runs-root", str(workdir / "runs")], workdir, env={"PYTHONPATH": path}
    ) as service:
        yield service


def sft_config(model_dir: Path, data_dir: Path, **extra) -> dict:
    return {
        "hf_checkpoint": str(model_dir),
        "prompt_data": [str(data_dir / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "loss_type": "sft_loss",
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "num_rollout": 5,
        "lr": 0.003,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        **extra,
    }


def grpo_config(model_dir: Path, data_dir: Path, **extra) -> dict:
    return {
        "hf_checkpoint": str(model_dir),
        "prompt_data": [str(data_dir / "rl.parquet")],
        "input_key": "prompt",
        "label_key": "label",
        "apply_chat_template": True,
        "rollout_batch_size": 8,
        "n_samples_per_prompt": 4,
        "global_batch_size": 32,
        "num_rollout": 3,
        "rollout_max_response_len": 8,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 4096,
        "reward": "custom",
        "custom_rm_path": "e2e_digit_reward:digit_share",
        **extra,
    }


# ---------------------------------------------------------------- processes the coordinator starts


def children_of(pid: int) -> dict[int, str]:
    """The rollway services among `pid`'s child processes: child pid -> service name."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        match = SERVICE_MODULE.search(cmdline)
        if parent == pid and match:
            found[int(entry.name)] = match.group(1)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ChildWatch:
    """Samples the coordinator's service children while a client drives a run."""

    def __init__(self, coordinator_pid: int):
        self.coordinator_pid = coordinator_pid
        self.seen: dict[int, str] = {}
        self.gone_at: dict[int, float] = {}

    def sample(self) -> None:
        now = time.monotonic()
        current = children_of(self.coordinator_pid)
        self.seen.update(current)
        for pid in self.seen:
            if pid not in current:
                self.gone_at.setdefault(pid, now)


def run_until_exit(cmd: list[str], watch: ChildWatch, out: Path, timeout: float = RUN_SECONDS) -> str:
    """Run a client to its end (stdout to `out`), sampling the coordinator's children meanwhile."""
    with open(out, "w") as stdout, open(out.with_suffix(".stderr"), "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True)
        try:
            deadline = time.monotonic() + timeout
            while proc.poll() is None:
                watch.sample()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{cmd[:2]} still running after {timeout:.0f}s")
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                proc.kill()  # our own child, by its pid
            proc.wait()
    watch.sample()
    assert proc.returncode == 0, (
        f"{cmd[:2]} exited {proc.returncode}: {out.with_suffix('.stderr').read_text()}"
    )
    return out.read_text()


def node_run(node_client: Path, coordinator, config: dict, run_id: str, tmp_path: Path, *flags: str):
    """Drive one run with the Node.js client; its JSON summary and the services it saw come back."""
    config_path = tmp_path / f"{run_id}.json"
    config_path.write_text(json.dumps(config))
    watch = ChildWatch(coordinator.pid)
    started = time.monotonic()
    cmd = ["node", str(node_client / "run_job.mjs"), "--address", coordinator.address]
    cmd += ["--config", str(config_path), "--run-id", run_id, "--timeout-s", str(RUN_SECONDS - 10), *flags]
    summary = json.loads(run_until_exit(cmd, watch, tmp_path / f"{run_id}.out"))
    print(f"{run_id}: {summary['state']} step {summary['step']} in {time.monotonic() - started:.1f}s")
    return summary, watch


def health_refused(address: str) -> grpc.StatusCode:
    """The status a health check on `address` gets (a stopped service: UNAVAILABLE)."""
    with grpc.insecure_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def assert_services_started_and_gone(coordinator, watch: ChildWatch, addresses: dict, run_dir: Path, names):
    """The run's services were the coordinator's own children, on the addresses RunInfo lists, and
    are gone now: processes reaped, ports refusing health checks."""
    assert sorted(watch.seen.values()) == sorted(names), watch.seen
    assert sorted(n.removesuffix("_0") for n in addresses) == sorted(names), addresses
    ports = sorted(int(p.read_text()) for p in (run_dir / "services").glob("*.port"))
    assert sorted(int(a.rsplit(":", 1)[1]) for a in addresses.values()) == ports
    assert all(a.startswith("127.0.0.1:") for a in addresses.values())
    assert not [pid for pid in watch.seen if alive(pid)], "services outlived their run"
    assert children_of(coordinator.pid) == {}
    for name, address in addresses.items():
        assert health_refused(address) == grpc.StatusCode.UNAVAILABLE, f"{name} at {address} still answers"
    exits = {
        f"{svc}({pid})": round(watch.gone_at[pid] - min(watch.gone_at.values()), 1)
        for pid, svc in watch.seen.items()
    }
    print(f"services gone (s after the first): {exits}")


def values(series: list[dict]) -> list[float]:
    return [point["value"] for point in series]


# ---------------------------------------------------------------- Node.js client


def test_node_client_runs_sft_then_grpo_back_to_back_on_one_coordinator(
    node_client, coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    sft, sft_watch = node_run(
        node_client, coordinator, sft_config(tiny_model_dir, demo_data_dir), "node-sft", tmp_path
    )
    assert sft["state"] == "RUN_STATE_SUCCEEDED", sft["error"]
    assert sft["started_state"] == "RUN_STATE_STARTING"
    assert (sft["step"], sft["num_steps"]) == (5, 5)
    assert sft["steps"] == [0, 1, 2, 3, 4]
    losses = values(sft["losses"]["sft/loss"])
    assert len(losses) == 5 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    assert sft["last_metrics"]["sft/loss"] == losses[-1]
    assert sft["last_metrics"]["sft/tokens_seen"] > 0
    assert sft["rewards"] == {} and sft["error"] == ""
    assert Path(sft["run_dir"]).name == "node-sft"
    on_disk = [json.loads(line) for line in (Path(sft["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["sft/loss"] for r in on_disk] == losses  # the stream carried exactly what the run wrote
    assert_services_started_and_gone(
        coordinator, sft_watch, sft["service_addresses"], Path(sft["run_dir"]), ["dataloader", "trainer"]
    )

    grpo, grpo_watch = node_run(
        node_client, coordinator, grpo_config(tiny_model_dir, demo_data_dir), "node-grpo", tmp_path
    )
    assert grpo["state"] == "RUN_STATE_SUCCEEDED", grpo["error"]
    assert (grpo["step"], grpo["num_steps"]) == (3, 3)
    assert grpo["steps"] == [0, 1, 2]
    rewards = values(grpo["rewards"]["rollout/raw_reward"])
    assert len(rewards) == 3 and all(0.0 <= r <= 1.0 for r in rewards)
    assert max(rewards) > 0, "the custom reward was not used"
    assert values(grpo["rewards"]["rollout/rewards"]) == rewards  # no KL penalty: rewards are raw
    pg_losses = values(grpo["losses"]["train/pg_loss"])
    assert len(pg_losses) == 3 and all(math.isfinite(x) for x in pg_losses)
    last = grpo["last_metrics"]
    assert last["train/grad_norm"] > 0  # rewards differ within groups, so advantages do too
    assert last["rollout/num_samples"] == 32 and last["rollout/response_len/max"] <= 8
    assert last["rollout/weight_version"] == 4  # pushed before step 0 and after each of 3 steps
    assert {"train/ppo_kl", "train/pg_clipfrac", "perf/weight_sync_time"} <= set(grpo["metric_names"])
    assert_services_started_and_gone(
        coordinator,
        grpo_watch,
        grpo["service_addresses"],
        Path(grpo["run_dir"]),
        ["dataloader", "rollout", "trainer"],
    )
    # Started per run: the second run's services are new processes on new ports.
    assert not set(sft_watch.seen) & set(grpo_watch.seen)
    assert not set(sft["service_addresses"].values()) & set(grpo["service_addresses"].values())


def test_node_client_stop_run_immediate_ends_a_run_as_stopped(
    node_client, coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    config = grpo_config(tiny_model_dir, demo_data_dir, num_rollout=1000)
    summary, watch = node_run(
        node_client, coordinator, config, "node-stop", tmp_path, "--stop-after-first-metric"
    )
    assert summary["state"] == "RUN_STATE_STOPPED", summary["error"]
    assert summary["error"] == ""
    assert summary["stop"]["requested_at_step"] == 0
    # StopRun answers at once; the run reaches STOPPED after its calls in flight are cancelled.
    assert summary["stop"]["reply_state"] == "RUN_STATE_RUNNING"
    assert summary["num_steps"] == 1000 and summary["step"] <= 2
    assert summary["steps"] == list(range(len(summary["steps"]))) and len(summary["steps"]) <= 2
    assert summary["stop"]["final_after_s"] < 15, summary["stop"]
    print(f"StopRun(immediate) -> STOPPED in {summary['stop']['final_after_s']:.1f}s")
    assert_services_started_and_gone(
        coordinator,
        watch,
        summary["service_addresses"],
        Path(summary["run_dir"]),
        ["dataloader", "rollout", "trainer"],
    )


# ---------------------------------------------------------------- buf curl, through reflection only


def buf_command(*args: str) -> list[str]:
    """`buf curl` with no schema: it learns every type from the server's grpc.reflection.v1."""
    if not BUF.exists():
        pytest.skip(f"buf is not installed at {BUF}")
    return [str(BUF), "curl", *BUF_FLAGS, *args]


def buf_curl(address: str, method: str, body: dict) -> subprocess.CompletedProcess:
    cmd = buf_command("--data", json.dumps(body), f"http://{address}/{COORDINATOR}/{method}")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def buf_curl_list(address: str) -> set[str]:
    """The methods `buf curl --list-methods` finds through reflection."""
    listed = subprocess.run(
        buf_command("--list-methods", f"http://{address}"), capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    return set(listed.stdout.split())


def json_stream(text: str) -> list[dict]:
    """The JSON objects `buf curl` prints one after another for a server-streaming call."""
    decoder, objects, index = json.JSONDecoder(), [], 0
    while (index := len(text) - len(text[index:].lstrip())) < len(text):
        obj, index = decoder.raw_decode(text, index)
        objects.append(obj)
    return objects


FINAL_STATES = ("RUN_STATE_SUCCEEDED", "RUN_STATE_FAILED", "RUN_STATE_STOPPED")


def buf_get_run(address: str, run_id: str) -> dict:
    polled = buf_curl(address, "GetRun", {"run_id": run_id})
    assert polled.returncode == 0, polled.stderr
    return json.loads(polled.stdout)["run"]


def buf_follow(address: str, run_id: str, watch: ChildWatch, out: Path, on_poll=None):
    """Follow a run with `buf curl` StreamMetrics while GetRun is polled (buf curl too) to its end.

    `on_poll(run)` sees every polled RunInfo. Returns the final RunInfo, the states polled and the
    records streamed live (the stream ends with the run, exit 0)."""
    with open(out, "w") as stdout:
        stream = subprocess.Popen(
            buf_command(
                "--data", json.dumps({"run_id": run_id}), f"http://{address}/{COORDINATOR}/StreamMetrics"
            ),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + RUN_SECONDS
            states = []
            while True:
                watch.sample()
                run = buf_get_run(address, run_id)
                states.append(run["state"])
                if run["state"] in FINAL_STATES:
                    break
                if on_poll is not None:
                    on_poll(run)
                assert time.monotonic() < deadline, f"{run_id} still {run['state']} after {RUN_SECONDS:.0f}s"
                time.sleep(0.2)
            _, stream_err = stream.communicate(timeout=60)  # the stream ends with the run
        finally:
            if stream.poll() is None:
                stream.kill()  # our own child, by its pid
                stream.wait()
    watch.sample()
    assert stream.returncode == 0, stream_err
    return run, states, json_stream(out.read_text())


def test_buf_curl_drives_an_sft_run_through_reflection_alone(
    coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    methods = buf_curl_list(coordinator.address)
    assert {
        f"{COORDINATOR}/{m}" for m in ("StartRun", "GetRun", "StreamMetrics", "StopRun", "ListRuns")
    } <= methods

    config = sft_config(tiny_model_dir, demo_data_dir, lr="x", max_tokens_per_gpu="lots", learning_rate=1)
    bad = buf_curl(coordinator.address, "StartRun", {"run_id": "buf-bad", "config": config})
    assert bad.returncode != 0
    error = json.loads(bad.stderr)
    assert error["code"] == "invalid_argument"
    for named in (
        "config.lr: must be a number",
        "config.max_tokens_per_gpu:",
        "config.learning_rate: unknown",
    ):
        assert named in error["message"], error  # every error at once, each naming its setting

    started = buf_curl(
        coordinator.address,
        "StartRun",
        {"run_id": "buf-sft", "config": sft_config(tiny_model_dir, demo_data_dir)},
    )
    assert started.returncode == 0, started.stderr
    run = json.loads(started.stdout)["run"]
    assert (run["runId"], run["state"], run["numSteps"]) == ("buf-sft", "RUN_STATE_STARTING", "5")

    # Follow the run live while GetRun is polled until its end.
    watch = ChildWatch(coordinator.pid)
    run, states, live = buf_follow(coordinator.address, "buf-sft", watch, tmp_path / "stream.out")
    assert run["state"] == "RUN_STATE_SUCCEEDED", run.get("error")
    assert "RUN_STATE_RUNNING" in states
    assert (run["step"], run["numSteps"]) == ("5", "5")
    assert [int(r.get("step", 0)) for r in live] == [0, 1, 2, 3, 4]  # proto3 JSON leaves out step 0
    losses = [r["metrics"]["sft/loss"] for r in live]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.8 * losses[0], losses
    assert run["lastMetrics"]["sft/loss"] == losses[-1]
    assert all(r["time"] > 0 for r in live)

    # After the end, StreamMetrics replays from a step on, from the run's metrics.jsonl.
    replay = buf_curl(coordinator.address, "StreamMetrics", {"run_id": "buf-sft", "from_step": 3})
    assert replay.returncode == 0, replay.stderr
    assert [(int(r["step"]), r["metrics"]["sft/loss"]) for r in json_stream(replay.stdout)] == list(
        zip([3, 4], losses[3:], strict=True)
    )
    listed_runs = json.loads(buf_curl(coordinator.address, "ListRuns", {}).stdout)["runs"]
    assert {"runId": "buf-sft", "state": "RUN_STATE_SUCCEEDED"}.items() <= next(
        r for r in listed_runs if r["runId"] == "buf-sft"
    ).items()
    assert_services_started_and_gone(
        coordinator, watch, run["serviceAddresses"], Path(run["runDir"]), ["dataloader", "trainer"]
    )


def test_buf_curl_drives_a_grpo_run_through_reflection_alone(
    coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    started = buf_curl(
        coordinator.address,
        "StartRun",
        {"run_id": "buf-grpo", "config": grpo_config(tiny_model_dir, demo_data_dir)},
    )
    assert started.returncode == 0, started.stderr
    run = json.loads(started.stdout)["run"]
    assert (run["runId"], run["state"], run["numSteps"]) == ("buf-grpo", "RUN_STATE_STARTING", "3")

    watch = ChildWatch(coordinator.pid)
    run, states, live = buf_follow(coordinator.address, "buf-grpo", watch, tmp_path / "stream.out")
    assert run["state"] == "RUN_STATE_SUCCEEDED", run.get("error")
    assert "RUN_STATE_RUNNING" in states
    assert (run["step"], run["numSteps"]) == ("3", "3")
    assert [int(r.get("step", 0)) for r in live] == [0, 1, 2]
    rewards = [r["metrics"]["rollout/raw_reward"] for r in live]
    assert all(0.0 <= r <= 1.0 for r in rewards) and max(rewards) > 0, rewards  # the custom reward
    assert [r["metrics"]["rollout/rewards"] for r in live] == rewards  # no KL penalty
    assert all(math.isfinite(r["metrics"]["train/pg_loss"]) for r in live)
    last = live[-1]["metrics"]
    assert last["train/grad_norm"] > 0  # rewards differ within groups, so advantages do too
    assert last["rollout/num_samples"] == 32 and last["rollout/response_len/max"] <= 8
    assert [r["metrics"]["rollout/weight_version"] for r in live] == [
        2,
        3,
        4,
    ]  # pushed before step 0, after each
    assert run["lastMetrics"]["train/pg_loss"] == last["train/pg_loss"]
    assert_services_started_and_gone(
        coordinator, watch, run["serviceAddresses"], Path(run["runDir"]), ["dataloader", "rollout", "trainer"]
    )


def test_buf_curl_stop_run_immediate_ends_a_long_run_as_stopped(
    coordinator, tiny_model_dir, demo_data_dir, tmp_path
):
    config = grpo_config(tiny_model_dir, demo_data_dir, num_rollout=1000)
    started = buf_curl(coordinator.address, "StartRun", {"run_id": "buf-stop", "config": config})
    assert started.returncode == 0, started.stderr
    stop = {}

    def stop_after_the_first_step(run: dict) -> None:
        if stop or int(run.get("step", 0)) < 1:
            return
        stop["requested_at_step"] = int(run["step"])
        stop["requested"] = time.monotonic()
        reply = buf_curl(coordinator.address, "StopRun", {"run_id": "buf-stop", "immediate": True})
        assert reply.returncode == 0, reply.stderr
        stop["reply"] = json.loads(reply.stdout)["run"]

    watch = ChildWatch(coordinator.pid)
    run, _, live = buf_follow(
        coordinator.address, "buf-stop", watch, tmp_path / "stream.out", stop_after_the_first_step
    )
    stopped_after = time.monotonic() - stop["requested"]
    assert run["state"] == "RUN_STATE_STOPPED", run.get("error")
    assert "error" not in run  # proto3 JSON leaves out an empty error
    # StopRun answers at once, while the run still runs; it is STOPPED once its calls in flight are cancelled.
    assert stop["reply"]["state"] == "RUN_STATE_RUNNING" and stop["reply"]["runId"] == "buf-stop"
    assert stopped_after < 15, f"STOPPED {stopped_after:.1f}s after StopRun(immediate)"
    print(
        f"buf curl StopRun(immediate) at step {stop['requested_at_step']} -> STOPPED in {stopped_after:.1f}s"
    )
    assert (
        run["numSteps"] == "1000"
        and stop["requested_at_step"] <= int(run["step"]) <= stop["requested_at_step"] + 1
    )
    # The stream carried the finished steps and ended with the run.
    assert [int(r.get("step", 0)) for r in live] == list(range(int(run["step"])))
    assert_services_started_and_gone(
        coordinator, watch, run["serviceAddresses"], Path(run["runDir"]), ["dataloader", "rollout", "trainer"]
    )
