"""Per-episode cost of each environment path against the built-in (in-process) one.

Every multi-turn path runs the same scripted episode (step k answers " obs k.", reward 0.5, done
after TURNS steps) on a real rollout service with the tiny model (hf engine), the same prompts and
seeds, so the sampled tokens are the same and the difference in wall time is the path's own cost:

    custom      rollway's Environment plugin in the rollout process (the baseline)
    remote      the same class behind the Environment gRPC service, in its own process
    openenv     the same script as an OpenEnv app (openenv-core, its own server process, one
                WebSocket session per episode)
    agent       the same script as an agent using the official `openai` client against the
                rollout service's OpenAI-compatible endpoint (a thread per episode, HTTP per turn;
                its observations are user messages rendered by the chat template, so its tokens
                differ from the other paths' and its samples are not compared)

Single-turn paths score one reply each:

    none        no environment (the baseline: the service's own reward function, if any)
    verifiers   a verifiers taskset's rubric (the demo's addition task, tests/support/verifiers_tasks.py)

Figures: episodes_per_s, ms_per_episode (wall over episodes, all of a call's episodes in flight at once) and
overhead_ms_per_episode (this path's ms_per_episode minus its baseline's). The multi-turn paths'
samples are checked token for token against the baseline's (same work, or the row is refused).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.harness import BenchResult

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
TURNS = 3
ROUNDS = 3  # timed Generate calls per path, after one warm-up call


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "ROLLWAY_VF_ADDITION_ROWS": "64"}


def _request(prompts: int, n: int, label_of, metadata_of):
    from rollway.common.v1 import common_pb2
    from rollway.rollout.v1 import rollout_pb2

    request = rollout_pb2.GenerateRequest(
        n_samples_per_prompt=n,
        # Most tokens end the random model's turn, so every episode takes its TURNS model turns.
        sampling_params=common_pb2.SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=11, stop_token_ids=list(range(3, 300))
        ),
    )
    for i in range(prompts):
        prompt = request.prompts.add(token_ids=[1, 40 + i, 60, 70], label=label_of(i))
        prompt.metadata.update(metadata_of(i))
    return request


def _time_path(stub, request, rounds: int) -> tuple[float, list]:
    """Seconds per episode over `rounds` calls (after a warm-up call), and the last call's samples."""
    list(stub.Generate(request, timeout=600))
    start = time.perf_counter()
    for _ in range(rounds):
        samples = sorted((r.sample for r in stub.Generate(request, timeout=600)), key=lambda s: s.index)
    elapsed = time.perf_counter() - start
    bad = [s.reward_error for s in samples if s.reward_error]
    if bad:
        raise RuntimeError(f"episodes failed: {bad[:3]}")
    return elapsed / (rounds * len(samples)), samples


def run(quick: bool) -> BenchResult:
    from rollway.common.client import open_channel
    from rollway.common.supervision.service_process import ServiceProcess
    from rollway.demo.data import make_demo_data
    from rollway.demo.tiny_model import make_tiny_model
    from rollway.rollout.environments.verifiers_env import export_prompts
    from rollway.rollout.v1 import rollout_pb2_grpc

    prompts, n = (4, 4) if quick else (8, 8)
    rounds = 1 if quick else ROUNDS
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = make_tiny_model(work / "model", seed=0)
        data = make_demo_data(work / "data", num_sft=10, num_rl=100, num_eval=10)
        env = {**_env(), "ROLLWAY_VF_ADDITION_DATA": str(data["rl"])}
        os.environ.update(env)  # export_prompts below loads the taskset in this process
        sys.path.insert(0, str(TESTS))

        def rollout(*args: str) -> object:
            svc = stack.enter_context(
                ServiceProcess("rollout", ["--hf-checkpoint", str(model), *args], work / "svc", env=env)
            )
            return rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))

        remote_env = stack.enter_context(
            ServiceProcess(
                "environment",
                ["--environment", "custom", "--custom-generate-function-path", SCRIPTED],
                work / "svc",
                env=env,
                module="rollway.environment",
            )
        )
        openenv = stack.enter_context(
            ServiceProcess(
                "openenv",
                ["--openenv-app", "bench.environment_paths:app"],
                work / "svc",
                env=env,
                module="rollway.openenv_host",
                wait_serving=False,
            )
        )
        multi_turn = {
            "custom": rollout("--environment", "custom", "--custom-generate-function-path", SCRIPTED),
            "remote": rollout("--environment", "remote", "--environment-url", remote_env.address),
            "openenv": rollout("--environment", "openenv", "--openenv-url", f"http://{openenv.address}"),
            "agent": rollout(*AGENT_ARGS, "--num-environment-workers", str(prompts * n)),
        }
        request = _request(prompts, n, lambda i: "", lambda i: {"turns": TURNS})
        baseline_samples = None
        for path, stub in multi_turn.items():
            seconds, samples = _time_path(stub, request, rounds)
            tokens = [list(s.response_token_ids) for s in samples]
            if baseline_samples is None:
                baseline_samples, baseline = tokens, seconds
            elif path != "agent" and tokens != baseline_samples:
                raise RuntimeError(f"{path}: its samples differ from the in-process path's")
            rows.append(_row(path, "multi-turn", seconds, baseline, samples))

        exported = work / "vf.jsonl"
        export_prompts("support.verifiers_tasks:addition", exported)
        tasks = [json.loads(line) for line in exported.read_text().splitlines()]
        single = {
            "none": rollout(),
            "verifiers": rollout("--environment", "verifiers", "--verifiers-taskset", VF_TASKSET),
        }
        request = _request(prompts, n, lambda i: tasks[i]["label"], lambda i: tasks[i]["metadata"])
        for path, stub in single.items():
            seconds, samples = _time_path(stub, request, rounds)
            if path == "none":
                baseline = seconds
            rows.append(_row(path, "single-turn", seconds, baseline, samples))
    return BenchResult(
        name="environments",
        rows=rows,
        units={"episodes_per_s": "episodes/s", "ms_per_episode": "ms", "overhead_ms_per_episode": "ms"},
        config={
            "model": "tiny (hf engine, CPU)",
            "episodes_per_call": prompts * n,
            "timed_calls": rounds,
            "model_turns_per_episode": f"{TURNS} (multi-turn), 1 (single-turn)",
            "max_new_tokens_per_turn": 8,
        },
        notes="overhead: ms_per_episode minus the baseline's (custom for multi-turn, none for single-turn), "
        "with all of a call's episodes in flight at once; the custom, remote and openenv samples are identical token for token (the agent's observations are chat-rendered user turns)",
    )


SCRIPTED = "support.remote_environments:ScriptedEnvironment"
AGENT_ARGS = ("--environment", "agent", "--agent-function-path", "bench.environment_paths:scripted_agent")
VF_TASKSET = "support.verifiers_tasks:addition"


def _row(path: str, kind: str, seconds: float, baseline: float, samples) -> dict:
    return {
        "path": path,
        "episode": kind,
        "model_turns": sum(1 for t in samples[0].turns if t.role == "model") or 1,
        "episodes_per_s": round(1.0 / seconds, 1),
        "ms_per_episode": round(seconds * 1e3, 1),
        "overhead_ms_per_episode": round((seconds - baseline) * 1e3, 1),
    }
