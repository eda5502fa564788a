"""Reward functions (contract tests for every registered kind) and the reward runner."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rollway.common.config import ConfigError
from rollway.rollout.config import RolloutConfig
from rollway.rollout.rewards import RewardFunction, RewardRunner, RewardSample, build_rewards
from rollway.rollout.rewards.custom import load_custom_reward
from rollway.rollout.rewards.math_reward import math_reward
from rollway.rollout.rewards.remote import remote_reward
from rollway.rollout.rewards.runner import call_reward
from rollway.rollout.rewards.text_match import exact_match, f1


def S(response: str, label: str = "", **kw) -> RewardSample:
    return RewardSample(prompt="What is 40 + 42?", response=response, label=label, **kw)


@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("The answer is 82.", "82", 1.0),
        ("82", "82", 1.0),
        ("40 + 42 = 82", "82", 1.0),
        ("The sum is 82.0", "82", 1.0),
        ("I think \\boxed{82} is right, not 83", "82", 1.0),
        ("The answer is 1,234.", "1234", 1.0),
        ("The answer is -5.", "-5", 1.0),
        ("The answer is 83.", "82", 0.0),
        ("The answer is 8 2", "82", 0.0),
        ("The answer is 82, not 83", "82", 0.0),
        ("no number here", "82", 0.0),
        ("", "82", 0.0),
        ("  Paris. ", "paris", 1.0),
        ("London", "Paris", 0.0),
    ],
)
def test_exact_match_extracts_the_final_number(response, label, expected):
    assert exact_match(S(response, label)) == expected


@pytest.mark.parametrize(
    "response, label, expected",
    [
        ("0.5", "1/2", 1.0),
        ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("$\\frac12$", "1/2", 1.0),
        ("The answer is 82.", "82", 1.0),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("no answer", "4", 0.0),
    ],
)
def test_math_reward_accepts_equivalent_forms(response, label, expected):
    assert math_reward(S(response, label)) == expected


def test_f1_is_squad_token_f1():
    assert f1(S("The Eiffel Tower", "eiffel tower")) == 1.0  # articles, case and punctuation ignored
    assert f1(S("the answer is 82", "82")) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert f1(S("nothing", "82")) == 0.0


class _RewardModel(BaseHTTPRequestHandler):
    replies: list = []
    seen: list = []

    def do_POST(self):
        self.seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        status, body = self.replies.pop(0)
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def reward_model():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RewardModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _RewardModel.replies, _RewardModel.seen = [], []
    yield f"http://127.0.0.1:{server.server_port}/score", _RewardModel
    server.shutdown()
    server.server_close()


def test_remote_reward_posts_the_sample_and_reads_the_reply(reward_model):
    url, handler = reward_model
    handler.replies = [(200, "0.75"), (200, '{"reward": 1}'), (500, "model crashed"), (200, '{"score": 1}')]
    remote = remote_reward(url, timeout=5)
    sample = S("The answer is 82.", "82", metadata={"id": 7})
    assert remote(sample) == 0.75
    assert handler.seen[0] == {
        "prompt": "What is 40 + 42?",
        "response": "The answer is 82.",
        "label": "82",
        "metadata": {"id": 7},
    }
    assert remote(sample) == 1.0
    with pytest.raises(RuntimeError, match="HTTP 500: model crashed"):
        remote(sample)
    with pytest.raises(RuntimeError, match="returned no number"):
        remote(sample)


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def by_length(sample):\n    return len(sample.response)\n"
        "def miles_style(args, sample):\n    return args.reward_timeout\n"
        "async def async_reward(sample):\n    return 0.5\n"
        "def group(samples):\n    return [float(i) for i in range(len(samples))]\n"
        "def three(a, b, c):\n    return 0\n"
        "NOT_CALLABLE = 3\n"
    )
    (tmp_path / "broken_rewards.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("my_rewards", "broken_rewards"):
        sys.modules.pop(name, None)


def test_custom_reward_loads_plain_miles_async_and_group_functions(reward_module):
    config = RolloutConfig(hf_checkpoint="x", reward_timeout=7.0)
    assert call_reward(load_custom_reward("my_rewards:by_length", False, config), [S("abc")]) == [3.0]
    assert call_reward(load_custom_reward("my_rewards:miles_style", False, config), [S("abc")]) == [7.0]
    assert call_reward(load_custom_reward("my_rewards:async_reward", False, config), [S("abc")]) == [0.5]
    group = load_custom_reward("my_rewards:group", True, config)
    assert group.group and call_reward(group, [S("a"), S("b"), S("c")]) == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "path, message",
    [
        ("no_such_module:f", "cannot import 'no_such_module': ModuleNotFoundError"),
        ("broken_rewards:f", "cannot import 'broken_rewards': SyntaxError"),
        ("my_rewards:missing", "module 'my_rewards' has no attribute 'missing'"),
        ("my_rewards:NOT_CALLABLE", "is not callable"),
        ("my_rewards:three", "must take (sample) or (args, sample); it takes (a, b, c)"),
    ],
)
def test_custom_reward_errors_name_the_setting(reward_module, path, message):
    with pytest.raises(ConfigError) as info:
        load_custom_reward(path, False, RolloutConfig(hf_checkpoint="x"))
    assert info.value.setting == "custom_rm_path"
    assert message in str(info.value)


def test_registry_holds_builtins_and_configured_rewards(reward_module):
    config = RolloutConfig(
        hf_checkpoint="x", rm_url="http://127.0.0.1:1/", custom_rm_path="my_rewards:by_length"
    )
    assert sorted(build_rewards(config)) == ["custom", "exact_match", "f1", "math", "remote"]
    assert sorted(build_rewards(RolloutConfig(hf_checkpoint="x"))) == ["exact_match", "f1", "math"]
    with pytest.raises(ConfigError, match="unknown reward 'nope'"):
        build_rewards(RolloutConfig(hf_checkpoint="x", reward="nope"))


def _score(runner, reward, samples):
    done = threading.Event()
    out = {}

    def finish(rewards, error):
        out.update(rewards=rewards, error=error)
        done.set()

    runner.score(reward, samples, finish)
    assert done.wait(10)
    return out["rewards"], out["error"]


def test_runner_marks_slow_failing_and_non_numeric_rewards():
    # The slow reward returns only once released: it times out however fast the machine, and its
    # verdict arriving before the release shows the runner does not wait for it.
    runner = RewardRunner(num_workers=4, timeout=0.3)
    released = threading.Event()

    def slow(sample):
        released.wait(60)
        return 1.0

    try:
        rewards, error = _score(runner, RewardFunction("slow", slow), [S("x")])
    finally:
        released.set()
    assert rewards == [0.0] and "timed out after 0.3s" in error
    assert (runner.num_timeouts, runner.num_errors) == (1, 0)
    # The others return at once, but not provably within 0.3 s on a loaded machine: time to spare.
    runner = RewardRunner(num_workers=4, timeout=60)
    rewards, error = _score(runner, RewardFunction("bad", lambda s: 1 / 0), [S("x")])
    assert rewards == [0.0] and "ZeroDivisionError" in error
    rewards, error = _score(runner, RewardFunction("text", lambda s: "high"), [S("x")])
    assert rewards == [0.0] and "must be a number" in error
    rewards, error = _score(runner, RewardFunction("nan", lambda s: float("nan")), [S("x")])
    assert "not finite" in error
    rewards, error = _score(runner, RewardFunction("ok", exact_match), [S("so 82.", "82")])
    assert (rewards, error) == ([1.0], "")
    assert (runner.num_timeouts, runner.num_errors) == (0, 3)


def test_runner_scores_a_group_at_once_and_checks_its_length():
    runner = RewardRunner(num_workers=2, timeout=5)
    ranks = RewardFunction("rank", lambda samples: [float(len(s.response)) for s in samples], group=True)
    assert _score(runner, ranks, [S("a"), S("bbb")]) == ([1.0, 3.0], "")
    short = RewardFunction("short", lambda samples: [1.0], group=True)
    rewards, error = _score(runner, short, [S("a"), S("b")])
    assert rewards == [0.0, 0.0] and "must return 2 rewards" in error
