"""--environment verifiers: tasksets built from verifiers' own classes (tests/support/verifiers_tasks.py,
the demo's addition data) run by the episode engine over the real hf engine (tiny model): the
prompts export_prompts writes, loss masks (1 exactly on model tokens), log-probs against a
teacher-forced pass, the tool's answer appended as the chat template renders verifiers' tool
message, and rewards and reward parts equal to the task's rewards computed here on the same reply."""

from __future__ import annotations

import json
import os
import queue

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollway.common.config import ConfigError
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import SampleRequest
from rollway.rollout.engines.hf import HFEngine
from rollway.rollout.environments import environment_factory
from rollway.rollout.environments.base import EpisodeStart, ModelTurn
from rollway.rollout.environments.tool_calls import format_tool_call
from rollway.rollout.environments.verifiers_env import TASK_INDEX_KEY, export_prompts
from rollway.rollout.episode_spec import ENVIRONMENT, MODEL, EpisodeLimits, EpisodeSpec, TextCodec, TurnRecord
from rollway.rollout.episodes import EpisodeEngine
from rollway.rollout.prompt_encoding import PromptEncoder
from rollway.rollout.sampling import SamplingParams

SINGLE = "support.verifiers_tasks:addition"
TOOL = "support.verifiers_tasks:addition_with_tool"
TURN_ENDS = frozenset(range(3, 300))  # most of the random model's tokens end its turn


@pytest.fixture(scope="module", autouse=True)
def addition_data(demo_data_dir):
    os.environ["ROLLWAY_VF_ADDITION_DATA"] = str(demo_data_dir / "rl.parquet")
    yield
    os.environ.pop("ROLLWAY_VF_ADDITION_DATA", None)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    torch.set_num_threads(1)
    engine = HFEngine(RolloutConfig(hf_checkpoint=str(tiny_model_dir), device="cpu", dtype="float32"))
    engine.start()
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _rows(path, tmp_path) -> list[dict]:
    out = tmp_path / "prompts.jsonl"
    assert export_prompts(path, out) == 32
    return [json.loads(line) for line in out.read_text().splitlines()]


def _factory(path):
    config = RolloutConfig(environment="verifiers", verifiers_taskset=path, environment_step_timeout=30)
    return environment_factory("verifiers", config)


def _expected(reply: str, answer: str, num_tool_calls: int) -> tuple[float, dict[str, float]]:
    """The task's rewards written out here: correct (weight 1) + 0.5 * starts_with_digit."""
    correct, digit = float(reply.strip() == answer), float(reply[:1].isdigit())
    return correct + 0.5 * digit, {
        "correct": correct,
        "starts_with_digit": digit,
        "num_tool_calls": float(num_tool_calls),
    }


def _teacher_forced(reference, prompt, response):
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logp = torch.log_softmax(reference(ids).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) + j - 1, tok]) for j, tok in enumerate(response)]


def _episodes(engine, tokenizer) -> EpisodeEngine:
    encoder = PromptEncoder(tokenizer)
    codec = TextCodec(
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        observation_ids=lambda step: encoder.observation_token_ids(step.observation, step.messages),
    )
    limits = EpisodeLimits(
        max_turns=4, max_total_tokens=0, max_context_len=1024, turn_timeout=60, episode_timeout=60
    )
    return EpisodeEngine(engine, codec, lambda: limits, num_workers=2)


def _prompt_ids(tokenizer, row) -> tuple[int, ...]:
    text = tokenizer.apply_chat_template(
        row["messages"], tools=row.get("tools"), tokenize=False, add_generation_prompt=True
    )
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])


def _run(episodes, requests):
    results = queue.Queue()
    episodes.submit(requests, results.put)
    return sorted([results.get(timeout=60) for _ in requests], key=lambda r: r.request.index)


def test_export_writes_each_tasks_messages_tools_label_and_index(tmp_path):
    from support.verifiers_tasks import addition_with_tool

    rows = _rows(TOOL, tmp_path)
    tasks = list(addition_with_tool())
    assert [r["metadata"][TASK_INDEX_KEY] for r in rows] == list(range(32))
    assert [r["label"] for r in rows] == [t.key for t in tasks]
    assert rows[0]["messages"] == [
        {"role": "system", "content": "Use the add tool, then answer with the number."},
        {"role": "user", "content": tasks[0].data.prompt},
    ]
    [tool] = rows[0]["tools"]
    assert tool["function"]["name"] == "add" and tool["function"]["description"] == "Add two integers."
    assert tool["function"]["parameters"]["required"] == ["a", "b"]
    assert "tools" not in _rows(SINGLE, tmp_path)[0]


def test_turns_are_answered_by_verifiers_tools_and_scored_by_its_rewards(tmp_path):
    rows = _rows(TOOL, tmp_path)
    row = rows[0]
    assert row["messages"][1]["content"] == "What is 98 + 72?" and _answer(row) == "170"
    env = _factory(TOOL)()
    env.reset(EpisodeStart("", row["label"], row["metadata"], ()))
    call = format_tool_call("add", {"a": 98, "b": 72})
    step = env.step(ModelTurn(f"Let me add.\n{call}", (), "stop"))
    assert step.messages == [{"role": "tool", "content": "170"}] and not step.done and step.reward == 0.0
    bad = env.step(
        ModelTurn('<tool_call>\n{"name": "add", "arguments": {"a": "x"}}\n</tool_call>', (), "stop")
    )
    assert not bad.done and "validation error" in bad.messages[0]["content"]  # verifiers/MCP's own error
    unknown = env.step(ModelTurn(format_tool_call("mul", {"a": 1, "b": 2}), (), "stop"))
    assert unknown.messages == [{"role": "tool", "content": "error: unknown tool 'mul'; available: add"}]
    final = env.step(ModelTurn("170", (), "stop"))
    reward, metrics = _expected("170", "170", num_tool_calls=3)
    assert final.done and final.reward == pytest.approx(reward) == 1.5 and final.metrics == metrics
    # The episode as verifiers recorded it: the conversation of the trace its rewards read.
    roles = [m.role for m in env.trace.messages]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert (
        env.trace.messages[2].tool_calls[0].name == "add" and env.trace.messages[2].content == "Let me add."
    )


def test_a_prompt_of_another_taskset_version_fails_its_episode(tmp_path):
    row = _rows(SINGLE, tmp_path)[0]
    env = _factory(SINGLE)()
    with pytest.raises(Exception, match="another version of the taskset"):
        env.reset(EpisodeStart("", "not-the-key", row["metadata"], ()))
    with pytest.raises(Exception, match="names no task"):
        env.reset(EpisodeStart("", row["label"], {TASK_INDEX_KEY: 999}, ()))
    with pytest.raises(ConfigError, match="not a verifiers Taskset"):
        _factory("support.verifiers_tasks:AdditionData")
    with pytest.raises(ConfigError, match="cannot import"):
        _factory("no_such_module:tasks")


def test_single_turn_episodes_keep_sampled_tokens_masks_and_rubric_rewards(
    engine, tokenizer, reference, tmp_path
):
    rows = _rows(SINGLE, tmp_path)[:4]
    new_env = _factory(SINGLE)
    requests = [
        SampleRequest(
            index=i,
            prompt_token_ids=_prompt_ids(tokenizer, row),
            params=SamplingParams(temperature=1.0, max_new_tokens=6, seed=11 + i, stop_token_ids=TURN_ENDS),
            episode=EpisodeSpec(new_environment=new_env, label=row["label"], metadata=row["metadata"]),
        )
        for i, row in enumerate(rows)
    ]
    episodes = _episodes(engine, tokenizer)
    try:
        results = _run(episodes, requests)
    finally:
        episodes.close()
    for result, row in zip(results, rows, strict=True):
        out = result.episode
        assert result.finish_reason == "stop" and not out.failure
        assert [t.role for t in out.turns] == [MODEL] and out.loss_mask == [1] * len(result.token_ids)
        reply = tokenizer.decode(result.token_ids, skip_special_tokens=True)
        reward, metrics = _expected(reply, _answer(row), 0)
        assert out.reward == pytest.approx(reward) and out.metrics == metrics
        forced = _teacher_forced(reference, result.request.prompt_token_ids, result.token_ids)
        assert result.log_probs == pytest.approx(forced, abs=2e-4)


def _answer(row) -> str:
    a, b = (int(x) for x in row["messages"][-1]["content"].removeprefix("What is ").rstrip("?").split(" + "))
    return str(a + b)


def test_a_tool_episode_appends_verifiers_tool_message_as_the_template_renders_it(
    engine, tokenizer, reference, tmp_path
):
    row = _rows(TOOL, tmp_path)[0]
    prompt = _prompt_ids(tokenizer, row)
    # The random tiny model never writes a tool call: the episode continues a model turn that
    # began with one (a partial rollout's prefix, loss mask 1), so the engine samples the rest.
    call = tuple(
        tokenizer(format_tool_call("add", {"a": 98, "b": 72}), add_special_tokens=False)["input_ids"]
    )
    prefix_log_probs = _teacher_forced(reference, prompt, call)
    request = SampleRequest(
        index=0,
        prompt_token_ids=prompt,
        params=SamplingParams(
            temperature=1.0, max_new_tokens=len(call) + 6, seed=5, stop_token_ids=TURN_ENDS
        ),
        episode=EpisodeSpec(
            new_environment=_factory(TOOL),
            label=row["label"],
            metadata=row["metadata"],
            prefix_token_ids=call,
            prefix_log_probs=tuple(prefix_log_probs),
            prefix_loss_mask=(1,) * len(call),
            prefix_turns=(TurnRecord(MODEL, len(call)),),
        ),
    )
    episodes = _episodes(engine, tokenizer)
    try:
        [result] = _run(episodes, [request])
    finally:
        episodes.close()
    out = result.episode
    assert result.finish_reason == "stop" and not out.failure, out.failure
    assert [t.role for t in out.turns] == [MODEL, MODEL, ENVIRONMENT, MODEL]
    tokens, mask = result.token_ids, out.loss_mask
    assert tuple(tokens[: len(call)]) == call
    # The environment's tokens: verifiers' tool message (the MCP tool's "170") rendered by the chat
    # template after the model's end of turn, tokenised alone; loss mask 0 exactly there.
    rendered = "\n" + tokenizer.apply_chat_template(
        [{"role": "tool", "content": "170"}], tokenize=False, add_generation_prompt=True
    )
    expected_env = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    start = out.turns[0].num_tokens + out.turns[1].num_tokens
    assert tokens[start : start + len(expected_env)] == expected_env
    assert mask == [1] * start + [0] * len(expected_env) + [1] * out.turns[3].num_tokens
    forced = _teacher_forced(reference, prompt, tokens)
    model = [i for i, m in enumerate(mask) if m]
    assert [result.log_probs[i] for i in model] == pytest.approx([forced[i] for i in model], abs=2e-4)
    assert all(result.log_probs[i] == 0.0 for i, m in enumerate(mask) if not m)
    reply = tokenizer.decode(tokens[start + len(expected_env) :], skip_special_tokens=True)
    reward, metrics = _expected(reply, "170", num_tool_calls=1)
    assert out.reward == pytest.approx(reward) and out.metrics == metrics
