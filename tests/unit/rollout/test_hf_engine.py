"""The hf engine in process: continuous batching against references, seeds, abort, weight hooks."""

import queue
import time

import pytest
import torch
from support.held_generation import held_decoding
from transformers import AutoModelForCausalLM

from rollway.common.weights_checksum import weights_checksum
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import EngineStateError, SampleRequest, WeightLoadError
from rollway.rollout.engines.hf import HFEngine
from rollway.rollout.sampling import SamplingParams

PROMPTS = [
    (1, 50, 60, 70),
    (1, 9),
    (1, 120, 121, 122, 123, 124, 125, 126),
    (1, 33, 44),
    (1, 200, 201, 202, 203),
]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _engine(path, **overrides) -> HFEngine:
    engine = HFEngine(RolloutConfig(hf_checkpoint=str(path), **overrides))
    engine.start()
    return engine


def _run(engine, requests, timeout=120):
    results = queue.Queue()
    handle = engine.submit(requests, results.put)
    out = [results.get(timeout=timeout) for _ in requests]
    return {r.request.index: r for r in out}, handle


def _requests(params_for, prompts=PROMPTS, n=1):
    return [
        SampleRequest(index=p * n + j, prompt_token_ids=prompt, params=params_for(p * n + j), prompt_key=p)
        for p, prompt in enumerate(prompts)
        for j in range(n)
    ]


def test_continuous_batching_greedy_matches_model_generate(tiny_model_dir, reference):
    # 2 rows at a time over 5 prompts of different lengths and budgets: rows leave at different
    # steps, and new rows join a running batch whose cache is longer or shorter than theirs.
    engine = _engine(tiny_model_dir, max_running_requests=2)
    budget = [30, 5, 17, 9, 24]
    try:
        results, _ = _run(
            engine, _requests(lambda i: SamplingParams(temperature=0.0, max_new_tokens=budget[i]))
        )
    finally:
        engine.stop()
    assert engine.batcher.num_forwards < sum(budget)  # rows really shared forwards
    for p, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt])
        expected = reference.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=budget[p],
            do_sample=False,
            eos_token_id=[0, 2],
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
        assert results[p].token_ids == expected
        assert results[p].finish_reason == ("stop" if expected[-1] in (0, 2) else "length")


def test_sampled_log_probs_equal_a_teacher_forced_forward(tiny_model_dir, reference):
    engine = _engine(tiny_model_dir, max_running_requests=3)
    try:
        params = lambda i: SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=40, seed=100 + i)  # noqa: E731
        results, _ = _run(engine, _requests(params, n=2))
    finally:
        engine.stop()
    for result in results.values():
        prompt, response = list(result.request.prompt_token_ids), result.token_ids
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + response])).logits[0].float()
        start = len(prompt) - 1
        log_probs = torch.log_softmax(logits[start : start + len(response)] / 0.7, dim=-1)
        expected = log_probs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, atol=1e-4, rtol=0)


# ~5 s of generation: the fast tier leaves it to make test
@pytest.mark.slow
def test_seeded_samples_do_not_depend_on_batching_or_batch_mates(tiny_model_dir):
    params = lambda i: SamplingParams(temperature=1.0, max_new_tokens=30, seed=7 + i)  # noqa: E731
    outputs = []
    for overrides in ({"max_running_requests": 8}, {"max_running_requests": 3}, {"hf_batching": "static"}):
        engine = _engine(tiny_model_dir, **overrides)
        try:
            outputs.append(_run(engine, _requests(params, n=3))[0])
            alone, _ = _run(engine, [_requests(params, n=3)[7]])
        finally:
            engine.stop()
        assert alone[7].token_ids == outputs[-1][7].token_ids
    for other in outputs[1:]:
        assert {i: r.token_ids for i, r in other.items()} == {i: r.token_ids for i, r in outputs[0].items()}
    # n samples of one prompt share the prefill but not the seed: they differ.
    assert len({tuple(outputs[0][i].token_ids) for i in range(3)}) == 3


def test_stop_tokens_stop_strings_and_length(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    try:
        free, _ = _run(
            engine, _requests(lambda i: SamplingParams(temperature=0.0, max_new_tokens=30), PROMPTS[:1])
        )
        tokens, text = free[0].token_ids, free[0].text
        stop_token = tokens[5]
        by_token, _ = _run(
            engine,
            _requests(
                lambda i: SamplingParams(
                    temperature=0.0, max_new_tokens=30, stop_token_ids=frozenset({stop_token})
                ),
                PROMPTS[:1],
            ),
        )
        stop_text = engine.batcher.tokenizer.decode(tokens[10:12])
        by_string, _ = _run(
            engine,
            _requests(
                lambda i: SamplingParams(temperature=0.0, max_new_tokens=30, stop=(stop_text,)), PROMPTS[:1]
            ),
        )
    finally:
        engine.stop()
    assert free[0].finish_reason == "length" and len(tokens) == 30
    first = tokens.index(stop_token)
    assert by_token[0].token_ids == tokens[: first + 1] and by_token[0].finish_reason == "stop"
    assert by_string[0].finish_reason == "stop"
    assert (
        by_string[0].token_ids == tokens[: len(by_string[0].token_ids)] and len(by_string[0].token_ids) <= 12
    )
    assert stop_text not in by_string[0].text and text.startswith(by_string[0].text)


def test_abort_ends_running_and_waiting_samples(tiny_model_dir):
    engine = _engine(tiny_model_dir, max_running_requests=2)
    try:
        results = queue.Queue()

        def long(i):
            return SamplingParams(temperature=1.0, max_new_tokens=900, stop_token_ids=frozenset(), seed=i)

        # Held after 30 tokens: the running samples are still running at the abort, however fast
        # the machine decodes.
        with held_decoding(30):
            handle = engine.submit(_requests(long), results.put)
            while engine.batcher.num_forwards < 20:
                time.sleep(0.01)
            assert engine.abort(handle) == 5
            out = [results.get(timeout=30) for _ in range(5)]
            assert engine.idle
    finally:
        engine.stop()
    assert all(r.finish_reason == "abort" for r in out)
    started = [r for r in out if r.token_ids]
    assert len(started) == 2 and all(len(r.token_ids) == len(r.log_probs) < 900 for r in started)


def test_stop_reports_every_waiting_and_running_sample_as_aborted(tiny_model_dir):
    # 2 rows run and 3 wait when the engine stops: all 5 come back aborted, each once, and the
    # running ones keep the tokens generated so far (a Generate stream waits for every sample).
    engine = _engine(tiny_model_dir, max_running_requests=2)
    results = queue.Queue()
    requests = _requests(lambda i: SamplingParams(temperature=0.0, max_new_tokens=1000))
    try:
        with held_decoding(30):  # the running rows are still running at the stop, on any machine
            engine.submit(requests, results.put)
            deadline = time.monotonic() + 60
            while engine.batcher.num_forwards < 5:
                assert time.monotonic() < deadline, "generation never started"
                time.sleep(0.01)
            engine.stop()
    finally:
        engine.stop()
    out = [results.get(timeout=10) for _ in requests]
    assert results.empty() and not engine.running
    assert sorted(r.request.index for r in out) == list(range(len(PROMPTS)))
    assert all(r.finish_reason == "abort" and len(r.token_ids) == len(r.log_probs) for r in out)
    assert sum(1 for r in out if r.token_ids) == 2


def test_in_flight_counts_each_sample_once_while_rows_join_and_leave(tiny_model_dir):
    # Rows move waiting -> admitting -> live -> done on the batcher thread; a row seen in two of
    # those at once would be counted (and aborted) twice.
    engine = _engine(tiny_model_dir, max_running_requests=2)
    budget = [40, 5, 25, 9, 30]
    try:
        results = queue.Queue()
        requests = _requests(lambda i: SamplingParams(temperature=0.0, max_new_tokens=budget[i]))
        engine.submit(requests, results.put)
        seen = []
        while results.qsize() < len(requests):
            seen.append(engine.num_in_flight)
            time.sleep(0.002)
    finally:
        engine.stop()
    assert max(seen) == len(requests) and min(seen) >= 0


def test_load_weights_validates_then_copies_in_place(tiny_model_dir, reference):
    engine = _engine(tiny_model_dir)
    try:
        digest, count = engine.weights_checksum()
        assert (digest, count) == weights_checksum(reference.named_parameters(), torch.float32)
        names = dict(engine.named_parameters())
        name = "model.layers.0.mlp.up_proj.weight"
        with pytest.raises(WeightLoadError, match="unknown tensor 'nope'"):
            engine.load_weights([("nope", torch.zeros(1))])
        with pytest.raises(WeightLoadError, match=r"has shape \(2, 2\)"):
            engine.load_weights([(name, torch.zeros(2, 2))])
        with pytest.raises(WeightLoadError, match="has dtype torch.bfloat16"):
            engine.load_weights([(name, torch.zeros_like(names[name], dtype=torch.bfloat16))])
        new = torch.full_like(names[name], 0.01)
        assert engine.load_weights([(name, new)]) == 1
        assert torch.equal(dict(engine.named_parameters())[name], new)
        assert engine.weights_checksum()[0] != digest
        # Release drops the weights; resume reloads the checkpoint (version back to 0).
        engine.weight_version = 5
        engine.release_memory(["weights"])
        with pytest.raises(EngineStateError):
            engine.submit(_requests(lambda i: SamplingParams()), lambda r: None)
        with pytest.raises(EngineStateError):
            engine.weights_checksum()
        engine.resume_memory(["weights"])
        assert engine.weights_checksum() == (digest, count) and engine.weight_version == 0
    finally:
        engine.stop()


def test_prompt_log_probs_score_what_sampling_would(tiny_model_dir):
    # A sampled continuation scored as a prompt gets the log-probs it was sampled with: the prompt
    # scoring (compute_logprobs in the Tinker gateway) and sampling see one distribution.
    engine = _engine(tiny_model_dir)
    try:
        [result] = _run(engine, _requests(lambda i: SamplingParams(temperature=0.7, max_new_tokens=6, seed=3),
                                          prompts=[PROMPTS[0]]))[0].values()  # fmt: skip
        tokens = [*PROMPTS[0], *result.token_ids]
        scored = engine.prompt_log_probs(tokens, temperature=0.7)
    finally:
        engine.stop()
    assert len(scored) == len(tokens) - 1
    torch.testing.assert_close(
        torch.tensor(scored[len(PROMPTS[0]) - 1 :]), torch.tensor(result.log_probs), atol=1e-4, rtol=0
    )
