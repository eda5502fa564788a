"""An OpenEnv environment (openenv-core, unmodified: its create_fastapi_app served by uvicorn in its
own process) behind a real rollout service through --environment openenv: multi-turn episodes
(masks, the observation's token ids, the environment's rewards), per-episode sessions, a deadline
and a killed server each failing their samples (FINISH_REASON_FAILED), never hanging."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.openenv_envs import WRONG_REWARD
from support.processes import ServiceProcess
from support.waiting import wait_until
from transformers import AutoTokenizer

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.environments.base import EnvironmentFailed, EpisodeStart, ModelTurn
from rollway.rollout.environments.openenv import OpenEnvEpisodes, OpenEnvTurns, load_turns
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

pytestmark = pytest.mark.slow
TESTS_DIR = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"PYTHONPATH": TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with ServiceProcess(
        "openenv",
        ["--openenv-app", "support.openenv_envs:app"],
        tmp_path_factory.mktemp("openenv"),
        module="rollway.openenv_host",
        env=env,
        wait_serving=False,  # an HTTP server: it writes its port file once /health answers
    ) as svc:
        yield svc


@pytest.fixture(scope="module")
def rollout(tiny_model_dir, server, tmp_path_factory):
    args = [
        "--hf-checkpoint", str(tiny_model_dir),
        "--environment", "openenv",
        "--openenv-url", f"http://{server.address}",
        "--environment-step-timeout", "60",
    ]  # fmt: skip
    with ServiceProcess("rollout", args, tmp_path_factory.mktemp("rollout")) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


def _request(label: str, metadata: dict, n: int) -> rollout_pb2.GenerateRequest:
    prompt = rollout_pb2.Prompt(token_ids=[1, 50, 60, 70], label=label)
    prompt.metadata.update(metadata)
    return rollout_pb2.GenerateRequest(
        prompts=[prompt],
        n_samples_per_prompt=n,
        # Most tokens end the random model's turn, so its turns end with "stop".
        sampling_params=common_pb2.SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=3, stop_token_ids=list(range(3, 300))
        ),
    )


def _correct(text: str, label: str) -> bool:
    numbers = re.findall(r"-?\d+", text)  # the environment's own rule (support/openenv_envs.py)
    return bool(numbers) and numbers[-1] == label


def test_episodes_run_against_an_openenv_server(rollout, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    wrong = tuple(tokenizer.encode(" Wrong, try again.", add_special_tokens=False))
    samples = [r.sample for r in rollout.Generate(_request("7", {"max_tries": 3}, n=4), timeout=120)]
    assert sorted(s.index for s in samples) == [0, 1, 2, 3]
    assert any(len(s.turns) > 1 for s in samples)  # the random model answers wrong: the env answers
    for s in samples:
        assert s.finish_reason == common_pb2.FINISH_REASON_STOP, s.reward_error
        assert len(s.loss_mask) == len(s.response_token_ids) == len(s.rollout_log_probs)
        # Model turns alternate with the environment's answers; the last model turn ends it.
        roles = [t.role for t in s.turns]
        assert roles[0::2] == ["model"] * len(roles[0::2]) and set(roles[1::2]) <= {"environment"}
        position, model_texts = 0, []
        for turn in s.turns:
            ids = tuple(s.response_token_ids[position : position + turn.num_tokens])
            mask = list(s.loss_mask[position : position + turn.num_tokens])
            if turn.role == "environment":
                assert ids == wrong and mask == [0] * len(ids)  # the observation, as tokenised alone
                assert list(s.rollout_log_probs[position : position + turn.num_tokens]) == [0.0] * len(ids)
            else:
                log_probs = s.rollout_log_probs[position : position + turn.num_tokens]
                assert mask == [1] * len(ids) and all(lp < 0.0 for lp in log_probs)
                model_texts.append(tokenizer.decode(list(ids), skip_special_tokens=True))
            position += turn.num_tokens
        assert position == len(s.response_token_ids)
        # The reward is the environment's: 1 for the turn that answered 7, -0.25 for each other;
        # the episode ended there or after three tries.
        verdicts = [_correct(text, "7") for text in model_texts]
        assert not any(verdicts[:-1]) and (verdicts[-1] or len(model_texts) == 3)
        assert s.reward == pytest.approx(sum(1.0 if v else WRONG_REWARD for v in verdicts))


def _start(label: str, metadata: dict | None = None) -> EpisodeStart:
    return EpisodeStart(f"What is {label}?", label, metadata or {}, (1, 2, 3))


def _turn(text: str) -> ModelTurn:
    return ModelTurn(text, (5,), "stop")


def test_concurrent_episodes_each_have_their_own_environment(server):
    pool = OpenEnvEpisodes(f"http://{server.address}", 30.0, OpenEnvTurns())
    episodes = [pool.new_episode() for _ in range(8)]
    with ThreadPoolExecutor(8) as threads:
        list(threads.map(lambda i: episodes[i].reset(_start(str(i), {"max_tries": 2})), range(8)))
        # Every episode first answers its neighbour's label, then its own: only its own is right.
        first = list(threads.map(lambda i: episodes[i].step(_turn(f"{(i + 1) % 8}")), range(8)))
        second = list(threads.map(lambda i: episodes[i].step(_turn(f"it is {i}")), range(8)))
    assert [(s.observation, s.reward, s.done) for s in first] == [
        (" Wrong, try again.", WRONG_REWARD, False)
    ] * 8
    assert [(s.observation, s.reward, s.done) for s in second] == [(" Correct.", 1.0, True)] * 8
    for episode in episodes:
        episode.close()


def test_a_step_past_its_deadline_fails(server, tmp_path):
    pool = OpenEnvEpisodes(f"http://{server.address}", 1.5, OpenEnvTurns())
    episode = pool.new_episode()
    episode.reset(_start("1", {"stuck_marker": str(tmp_path / "stuck")}))
    started = time.monotonic()
    with pytest.raises(EnvironmentFailed, match="no answer within 1.5s"):
        episode.step(_turn("1"))
    assert 1.4 < time.monotonic() - started < 10
    episode.close()


def test_a_killed_openenv_server_fails_its_samples_at_once(rollout, server, tmp_path):
    marker = tmp_path / "stuck"
    samples, errors = [], []

    def generate():
        try:
            request = _request("1", {"stuck_marker": str(marker)}, n=3)
            samples.extend(r.sample for r in rollout.Generate(request, timeout=90))
        except Exception as exc:  # reported below
            errors.append(exc)

    caller = threading.Thread(target=generate)
    caller.start()
    wait_until(marker.exists, 60, "the environment to be inside a step")
    killed_at = time.monotonic()
    server.signal(signal.SIGKILL)
    caller.join(60)
    assert not caller.is_alive() and not errors
    assert time.monotonic() - killed_at < 30  # failed at once, not after --environment-step-timeout
    assert sorted(s.index for s in samples) == [0, 1, 2]
    for s in samples:
        assert s.finish_reason == common_pb2.FINISH_REASON_FAILED
        assert "openenv environment" in s.reward_error and "step" in s.reward_error
        assert s.turns[0].role == "model" and len(s.response_token_ids) == s.turns[0].num_tokens


def _readme_example() -> str:
    readme = (Path(TESTS_DIR).parent / "docs" / "environments.md").read_text()
    [block] = re.findall(r"```python\n(# my_openenv\.py.*?)```", readme, re.S)
    return block


def test_the_readme_example_runs_at_the_pinned_version(tmp_path, monkeypatch):
    readme = (Path(TESTS_DIR).parent / "docs" / "environments.md").read_text()
    pinned = re.search(r'"(openenv-core==[\d.]+)"', (Path(TESTS_DIR).parent / "pyproject.toml").read_text())
    assert f"tested with `{pinned.group(1)}`" in readme
    (tmp_path / "my_openenv.py").write_text(_readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    env = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = ["--openenv-app", "my_openenv:app"]
    module = "rollway.openenv_host"
    with ServiceProcess("openenv", args, tmp_path, module=module, env=env, wait_serving=False) as svc:
        pool = OpenEnvEpisodes(svc.address, 30.0, load_turns("my_openenv:GuessTurns"))
        episode = pool.new_episode()
        episode.reset(_start("42"))
        first, second = episode.step(_turn("41")), episode.step(_turn("it is 42"))
        episode.close()
    assert (first.messages, first.reward, first.done) == (
        [{"role": "user", "content": "Wrong. Again:"}],
        0.0,
        False,
    )
    assert (second.messages, second.reward, second.done) == ([], 1.0, True)
