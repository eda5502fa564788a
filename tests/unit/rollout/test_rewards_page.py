"""docs/rewards.md says what the rewards do: its examples table is scored by the real reward
functions, its custom reward module goes through the real loader, and its reward server answers
the real remote reward on loopback."""

from __future__ import annotations

import importlib
import re
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from rollway.common.shared_settings import BUILTIN_REWARD_NAMES
from rollway.rollout.config import RolloutConfig
from rollway.rollout.rewards import BUILTIN_REWARDS
from rollway.rollout.rewards.custom import load_custom_reward
from rollway.rollout.rewards.remote import remote_reward
from rollway.rollout.rewards.runner import call_reward
from rollway.rollout.rewards.types import RewardSample

PAGE = Path(__file__).resolve().parents[3] / "docs" / "rewards.md"
EMPTY = "*(empty)*"


def _section(heading: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def _cell(text: str) -> str:
    """A table cell's value: a code span's content exactly, EMPTY as ""."""
    text = text.strip()
    if text == EMPTY:
        return ""
    code = re.fullmatch(r"`([^`]*)`", text)
    return code[1] if code else text


def examples() -> list[tuple[str, str, str, str]]:
    """(rm_type, response, label, reward) of each row of the page's examples table."""
    rows = []
    for line in _section("Examples").splitlines():
        cells = line.strip().strip("|").split("|")
        if len(cells) != 5 or set(cells[0].strip()) <= set("-") or "rm_type" in cells[0]:
            continue
        rows.append(tuple(_cell(c) for c in cells[:4]))
    return rows


def python_block(first_line: str) -> str:
    for body in re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), re.S | re.M):
        if body.startswith(first_line):
            return body
    raise AssertionError(f"rewards.md has no python block starting with {first_line!r}")


def test_the_examples_table_covers_each_builtin_reward_with_a_1_and_a_0():
    rows = examples()
    assert len(rows) >= 20
    for name in BUILTIN_REWARD_NAMES:
        scores = {reward for rm_type, _, _, reward in rows if rm_type == name}
        assert {"0", "1"} <= scores, f"{name}: the page needs an example scoring 1 and one scoring 0"


@pytest.mark.parametrize("rm_type, response, label, reward", examples(), ids=lambda v: v[:24])
def test_each_example_scores_what_the_page_says(rm_type, response, label, reward):
    sample = RewardSample(prompt="What is 40 + 42?", response=response, label=label)
    fn = BUILTIN_REWARDS[rm_type].fn
    if reward == "error":  # the runner gives the sample 0 and this error as its reward_error
        with pytest.raises(ValueError, match="no label"):
            fn(sample)
    else:
        assert fn(sample) == pytest.approx(float(reward), abs=1e-9)


@pytest.fixture
def page_module(tmp_path, monkeypatch):
    """Write a python block of the page as a module on sys.path; yields its import name."""
    written = []

    def write(first_line: str) -> str:
        name = re.match(r"# (\w+)\.py", first_line)[1]
        (tmp_path / f"{name}.py").write_text(python_block(first_line))
        written.append(name)
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in written:
        sys.modules.pop(name, None)


def _sample(response: str, label: str = "82", num_tokens: int = 1, **kw) -> RewardSample:
    return RewardSample(
        prompt="What is 40 + 42?", response=response, label=label, response_token_ids=(0,) * num_tokens, **kw
    )


def test_the_custom_reward_example_loads_and_scores_as_its_docstrings_say(page_module):
    module = page_module("# my_rewards.py")
    config = RolloutConfig(hf_checkpoint="x")
    boxed = load_custom_reward(f"{module}:boxed_answer", False, config)
    samples = [_sample("so \\boxed{82}"), _sample("so \\boxed{83}"), _sample("82")]
    assert call_reward(boxed, samples) == [1.0, 0.1, 0.0]

    group = load_custom_reward(f"{module}:shortest_right", True, config)
    samples = [_sample("\\boxed{82}", num_tokens=9), _sample("82", num_tokens=3), _sample("83", num_tokens=2)]
    samples.append(_sample("it is 82", num_tokens=3))
    assert call_reward(group, samples) == [1.0, 1.5, 0.0, 1.5]


def test_the_reward_server_example_answers_the_remote_reward(page_module):
    module = importlib.import_module(page_module("# reward_server.py"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), module.RewardHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        remote = remote_reward(f"http://127.0.0.1:{server.server_port}/score", timeout=10)
        assert remote(_sample(" 82\n", metadata={"id": 7.0})) == 1.0
        assert remote(_sample("83")) == 0.0
    finally:
        server.shutdown()
        server.server_close()
