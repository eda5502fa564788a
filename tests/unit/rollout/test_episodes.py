"""Multi-turn episodes over the real hf engine (tiny model), in process: token-in/token-out,
loss masks and log-probs against a teacher-forced forward, per-turn weight versions, every limit
with its finish reason, environment failures, abort and a continued (resumed) episode."""

from __future__ import annotations

import queue
import threading
import time
from contextlib import contextmanager, nullcontext

import pytest
import torch
from support.waiting import wait_until
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import SampleRequest
from rollway.rollout.engines.hf import HFEngine
from rollway.rollout.environments.base import Environment, EpisodeStart, ModelTurn, Step
from rollway.rollout.episode_spec import ENVIRONMENT, MODEL, EpisodeLimits, EpisodeSpec, TextCodec
from rollway.rollout.episodes import EpisodeEngine
from rollway.rollout.prompt_encoding import PromptEncoder
from rollway.rollout.sampling import SamplingParams

PROMPT = (1, 50, 60, 70)


class CountingEnvironment(Environment):
    """Answers every turn with "obs <k>" (reward 0.25), done after metadata["turns"] turns (never if 0);
    metadata["fail_at"]: raises at that step; a `gate` Event: steps wait for it."""

    gate: threading.Event | None = None
    closed = 0
    waiting = 0
    released = threading.Event()

    def reset(self, start: EpisodeStart) -> None:
        self.turns = int(start.metadata.get("turns", 0))
        self.fail_at = int(start.metadata.get("fail_at", -1))
        self.hold = bool(start.metadata.get("hold", False))
        self.seen: list[ModelTurn] = []

    def step(self, turn: ModelTurn) -> Step:
        self.seen.append(turn)
        k = len(self.seen)
        if self.gate is not None:
            type(self).waiting += 1
            assert self.gate.wait(30)
        if self.hold:  # a stuck environment: held until the test releases it
            assert self.released.wait(30)
        if k == self.fail_at:
            raise RuntimeError(f"broken at step {k}")
        metrics = {"steps": float(k)} | ({"first": 1.0} if k == 1 else {})
        return Step(observation=f" obs {k}.", reward=0.25, done=k == self.turns, metrics=metrics)

    def close(self) -> None:
        type(self).closed += 1


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


def _episodes(engine, tokenizer, **limits) -> EpisodeEngine:
    encoder = PromptEncoder(tokenizer)
    codec = TextCodec(
        decode=lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True),
        observation_ids=lambda step: encoder.observation_token_ids(step.observation, step.messages),
    )
    # Time limits that never end an episode unless a test sets them: a 600-token greedy turn took
    # over 60 s on the loaded 2-core machine (then "episode_timeout", not the reason under test).
    settings = dict(
        max_turns=16, max_total_tokens=0, max_context_len=1024, turn_timeout=600, episode_timeout=600
    )
    settings.update(limits)
    return EpisodeEngine(engine, codec, lambda: EpisodeLimits(**settings), num_workers=4)


# Most of the random model's tokens end its turn, so turns are short and end with "stop".
TURN_ENDS = frozenset(range(3, 300))


def _request(
    index=0, env=CountingEnvironment, max_new_tokens=6, seed=7, temperature=1.0, stops=TURN_ENDS, **spec
):
    metadata = spec.pop("metadata", {})
    return SampleRequest(
        index=index,
        prompt_token_ids=PROMPT,
        params=SamplingParams(
            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, stop_token_ids=stops
        ),
        episode=EpisodeSpec(new_environment=env, metadata=metadata, **spec),
    )


# A turn timeout must cut a long greedy turn after its first tokens, whatever the machine's speed:
# every forward of the model is held PACE_SECONDS (so N tokens take >= N * PACE_SECONDS, far past
# CUT_SECONDS), and CUT_SECONDS leaves a loaded machine ample time for the first token.
PACE_SECONDS = 0.01
CUT_SECONDS = 1.0


@contextmanager
def _paced(engine):
    """Every forward of the engine's model takes at least PACE_SECONDS (a hook on the model)."""
    hook = engine.batcher.model.register_forward_pre_hook(lambda module, args: time.sleep(PACE_SECONDS))
    try:
        yield
    finally:
        hook.remove()


# A deadline only for a hang (the episodes' own limits above are longer).
def _run(episodes, requests, timeout=300):
    results = queue.Queue()
    episodes.submit(requests, results.put)
    out = [results.get(timeout=timeout) for _ in requests]
    return sorted(out, key=lambda r: r.request.index)


def _teacher_forced(reference, prompt, response, temperature=1.0):
    ids = torch.tensor([list(prompt) + list(response)])
    with torch.no_grad():
        logits = reference(ids).logits[0].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    start = len(prompt)
    return [float(logp[start + j - 1, tok]) for j, tok in enumerate(response)]


def test_multi_turn_masks_and_log_probs_equal_a_teacher_forced_pass(engine, tokenizer, reference):
    episodes = _episodes(engine, tokenizer)
    try:
        [result] = _run(episodes, [_request(metadata={"turns": 3})])
    finally:
        episodes.close()
    out = result.episode
    assert result.finish_reason == "stop" and not out.failure
    roles = [t.role for t in out.turns]
    assert roles == [MODEL, ENVIRONMENT, MODEL, ENVIRONMENT, MODEL]
    assert sum(t.num_tokens for t in out.turns) == len(result.token_ids) == len(out.loss_mask)
    assert len(result.log_probs) == len(result.token_ids)
    assert out.reward == pytest.approx(0.75)
    # Each step's metrics: a later value of a name replaces an earlier one, others are kept.
    assert out.metrics == {"steps": 3.0, "first": 1.0}
    # Environment tokens are the observation tokenised alone (token-in/token-out), mask 0, log-prob 0.
    pos = 0
    for k, turn in enumerate(out.turns):
        span = slice(pos, pos + turn.num_tokens)
        if turn.role == ENVIRONMENT:
            expected = tokenizer(f" obs {k // 2 + 1}.", add_special_tokens=False)["input_ids"]
            assert result.token_ids[span] == expected
            assert set(out.loss_mask[span]) == {0} and set(result.log_probs[span]) == {0.0}
        else:
            assert set(out.loss_mask[span]) == {1}
            assert turn.weight_version == engine.weight_version
        pos += turn.num_tokens
    forced = _teacher_forced(reference, PROMPT, result.token_ids)
    model_positions = [i for i, m in enumerate(out.loss_mask) if m]
    assert len(model_positions) >= 3
    for i in model_positions:
        assert result.log_probs[i] == pytest.approx(forced[i], abs=2e-4)


@pytest.mark.parametrize(
    ("limits", "request_args", "finish_reason"),
    [
        ({"max_turns": 2}, {"metadata": {"turns": 0}}, "max_turns"),
        ({"max_total_tokens": 15}, {"metadata": {"turns": 0}}, "max_tokens"),
        ({"max_context_len": len(PROMPT) + 15}, {"metadata": {"turns": 0}}, "max_tokens"),
        (
            {},
            {"metadata": {"turns": 0}, "max_new_tokens": 400, "temperature": 0.0, "stops": frozenset()},
            "length",
        ),
        (
            {"turn_timeout": CUT_SECONDS},
            {"metadata": {"turns": 0}, "max_new_tokens": 900, "temperature": 0.0, "stops": frozenset()},
            "turn_timeout",
        ),
        ({"episode_timeout": 0.5}, {"metadata": {"turns": 0, "hold": True}}, "episode_timeout"),
        ({}, {"metadata": {"turns": 5, "fail_at": 2}}, "failed"),
    ],
)
def test_each_limit_ends_an_episode_with_its_finish_reason(
    engine, tokenizer, limits, request_args, finish_reason
):
    episodes = _episodes(engine, tokenizer, **limits)
    closed_before = CountingEnvironment.closed
    CountingEnvironment.released.clear()
    try:
        with _paced(engine) if finish_reason == "turn_timeout" else nullcontext():
            [result] = _run(episodes, [_request(**request_args)])
    finally:
        CountingEnvironment.released.set()
        episodes.close()
    assert result.finish_reason == finish_reason
    out = result.episode
    assert len(out.loss_mask) == len(result.token_ids) == sum(t.num_tokens for t in out.turns)
    num_model_turns = sum(1 for t in out.turns if t.role == MODEL)
    if finish_reason == "max_turns":
        assert num_model_turns == 2
    if finish_reason == "max_tokens":
        assert len(result.token_ids) <= 15
    if finish_reason == "length":
        assert [t.role for t in out.turns] == [MODEL] and out.turns[0].num_tokens == 400
    if finish_reason == "turn_timeout":
        assert 0 < len(result.token_ids) < 900
    if finish_reason == "failed":
        assert "broken at step 2" in out.failure and num_model_turns == 2
    # Closed once, however it ended (a stuck step: once it returns).
    wait_until(lambda: CountingEnvironment.closed == closed_before + 1, 10, "the environment closed")


def test_abort_ends_episodes_mid_turn_and_a_continuation_resumes_them(engine, tokenizer, reference):
    CountingEnvironment.gate, CountingEnvironment.waiting = threading.Event(), 0
    episodes = _episodes(engine, tokenizer)
    try:
        results = queue.Queue()
        handle = episodes.submit([_request(i, metadata={"turns": 3}) for i in range(2)], results.put)
        wait_until(lambda: CountingEnvironment.waiting == 2, 30, "both episodes in their first step")
        # Both episodes wait in their first environment step: abort lets the step finish (its
        # observation is appended), then ends them.
        assert episodes.abort(handle) == 2
        CountingEnvironment.gate.set()
        aborted = [results.get(timeout=30) for _ in range(2)]
    finally:
        CountingEnvironment.gate = None
    assert {r.finish_reason for r in aborted} == {"abort"}
    first = aborted[0]
    assert [t.role for t in first.episode.turns] == [MODEL, ENVIRONMENT]
    # Continue it: the environment is replayed with the finished model turn, the episode goes on.
    spec = dict(
        prefix_token_ids=tuple(first.token_ids),
        prefix_log_probs=tuple(first.log_probs),
        prefix_loss_mask=tuple(first.episode.loss_mask),
        prefix_turns=tuple(first.episode.turns),
    )
    try:
        [done] = _run(episodes, [_request(first.request.index, metadata={"turns": 3}, **spec)])
    finally:
        episodes.close()
    assert done.finish_reason == "stop"
    assert done.token_ids[: len(first.token_ids)] == first.token_ids
    assert [t.role for t in done.episode.turns] == [MODEL, ENVIRONMENT] * 2 + [MODEL]
    assert done.episode.reward == pytest.approx(0.75)
    forced = _teacher_forced(reference, PROMPT, done.token_ids)
    for i, m in enumerate(done.episode.loss_mask):
        assert done.log_probs[i] == (pytest.approx(forced[i], abs=2e-4) if m else 0.0)


def test_an_episode_spanning_a_weight_update_records_each_turns_version(engine, tokenizer):
    CountingEnvironment.gate, CountingEnvironment.waiting = threading.Event(), 0
    episodes = _episodes(engine, tokenizer)
    before = engine.weight_version
    try:
        results = queue.Queue()
        episodes.submit([_request(metadata={"turns": 2})], results.put)
        wait_until(lambda: CountingEnvironment.waiting == 1, 30, "the episode in its first step")
        engine.weight_version = before + 1  # what a committed weight update does between two turns
        CountingEnvironment.gate.set()
        result = results.get(timeout=30)
    finally:
        CountingEnvironment.gate = None
        engine.weight_version = before
        episodes.close()
    versions = [(t.role, t.weight_version) for t in result.episode.turns if t.role == MODEL]
    assert versions == [(MODEL, before), (MODEL, before + 1)]
    assert result.weight_version == before  # the oldest turn's: staleness is never understated


# three 600-token greedy generations: ~10 s, the fast tier leaves it to make test
@pytest.mark.slow
def test_a_turn_cut_mid_way_continues_where_it_stopped(engine, tokenizer):
    # Greedy, no stop tokens: one 600-token turn. Cut it (turn timeout), continue it from the cut:
    # the same tokens as uncut, as two parts of one model turn.
    greedy = dict(max_new_tokens=600, temperature=0.0, stops=frozenset(), metadata={"turns": 1})
    episodes = _episodes(engine, tokenizer)
    try:
        [whole] = _run(episodes, [_request(**greedy)])
    finally:
        episodes.close()
    episodes = _episodes(engine, tokenizer, turn_timeout=CUT_SECONDS)
    try:
        with _paced(engine):
            [cut] = _run(episodes, [_request(**greedy)])
    finally:
        episodes.close()
    assert whole.finish_reason == "length" and len(whole.token_ids) == 600
    assert cut.finish_reason == "turn_timeout" and 0 < len(cut.token_ids) < 600
    assert cut.token_ids == whole.token_ids[: len(cut.token_ids)]
    prefix = dict(
        prefix_token_ids=tuple(cut.token_ids),
        prefix_log_probs=tuple(cut.log_probs),
        prefix_loss_mask=tuple(cut.episode.loss_mask),
        prefix_turns=tuple(cut.episode.turns),
    )
    episodes = _episodes(engine, tokenizer)
    try:
        [resumed] = _run(episodes, [_request(**greedy, **prefix)])
    finally:
        episodes.close()
    assert resumed.finish_reason == "length" and resumed.token_ids == whole.token_ids
    assert [t.role for t in resumed.episode.turns] == [MODEL, MODEL]  # one turn, in two parts
    assert resumed.log_probs == pytest.approx(whole.log_probs, abs=2e-4)
