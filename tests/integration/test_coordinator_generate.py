"""The coordinator's Generate fan-out against real rollout services: stopping early aborts the rest;
held-out evaluation in pages (coordinator/evaluation.py), one Generate per page, samples the same
as the whole eval set in one request."""

from __future__ import annotations

import time

import pytest
from support.processes import ServiceProcess

from rollway.common.v1 import common_pb2
from rollway.coordinator.evaluation import Evaluator
from rollway.coordinator.remote import Services
from rollway.rollout.v1 import rollout_pb2

PROMPTS = [rollout_pb2.Prompt(token_ids=[1, 40 + g], group_index=g) for g in range(4)]


@pytest.fixture(scope="module")
def rollout_addresses(tiny_model_dir, tmp_path_factory):
    # One sample decoded at a time per service: when the first sample is back the others are
    # still waiting or generating, so stopping then must abort them.
    args = ["--hf-checkpoint", str(tiny_model_dir), "--reward", "none", "--max-running-requests", "1"]
    workdir = tmp_path_factory.mktemp("generate")
    with ServiceProcess("rollout", args, workdir) as one, ServiceProcess("rollout", args, workdir) as two:
        yield [one.address, two.address]


@pytest.fixture(scope="module")
def services(rollout_addresses):
    connected = Services.connect(rollouts=rollout_addresses)
    yield connected
    connected.close()


def _sampling(max_new_tokens: int) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)


def _aborted(services: Services) -> int:
    return sum(info.num_samples_aborted for info in services.rollout_info())


def _generated(services: Services) -> int:
    return sum(info.num_samples_generated for info in services.rollout_info())


def test_every_sample_comes_back_in_group_order(services):
    samples = services.generate(PROMPTS, 2, _sampling(4), "", "all")
    assert [s.group_index for s in samples] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(a.index < b.index for a, b in zip(samples[::2], samples[1::2], strict=True))
    assert all(len(s.response_token_ids) == 4 for s in samples)


def test_enough_cancels_every_call_and_the_services_abort_what_is_left(services):
    before, generated_before = _aborted(services), _generated(services)
    seen = []

    def enough(sample):
        seen.append(sample)
        return True  # the first sample is enough

    started = time.monotonic()
    samples = services.generate(PROMPTS, 2, _sampling(300), "", "early", enough=enough)
    elapsed = time.monotonic() - started
    assert 1 <= len(samples) <= 2 and len(samples) == len(seen)  # at most one per service
    assert all(len(s.response_token_ids) == 300 for s in samples)
    deadline = time.monotonic() + 30
    while any(i.num_samples_in_flight for i in services.rollout_info()) and time.monotonic() < deadline:
        time.sleep(0.05)  # an aborted row leaves the engine's batch at its next step
    assert all(info.num_samples_in_flight == 0 for info in services.rollout_info())
    # Every sample is accounted once: returned, finished in the instant of the cancel (its message
    # was on the way; rows that joined together finish together), or aborted.
    aborted = _aborted(services) - before
    finished = _generated(services) - generated_before - aborted  # the count includes aborted ones
    assert aborted + finished == 8 and finished >= len(samples)
    assert aborted >= 8 - 2 * len(samples)  # at most one more per service finished with the first
    # 8 samples of 300 tokens one at a time would take 4x longer than the first one alone.
    assert elapsed < 30, elapsed


N_SAMPLES = 2


@pytest.fixture(scope="module")
def eval_services(rollout_addresses, tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("evaluation")
    data = ["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(demo_data_dir / "rl.parquet"),
            "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
            "--eval-prompt-data", "add", f"{demo_data_dir / 'eval.parquet'}@[0:10]"]  # fmt: skip
    with ServiceProcess("dataloader", data, workdir) as dataloader:
        connected = Services.connect(dataloader=dataloader.address, rollouts=rollout_addresses)
        yield connected
        connected.close()


def _evaluate(services: Services, prompts_per_generate: int, monkeypatch) -> tuple[list[int], dict, dict]:
    """Prompts per Generate call, the metrics, and each group's responses."""
    calls, responses = [], {}
    generate = services.generate

    def counted(prompts, *args, **kwargs):  # the real fan-out, its calls counted
        samples = generate(prompts, *args, **kwargs)
        calls.append(len(prompts))
        for s in sorted(samples, key=lambda s: s.index):
            responses.setdefault(s.group_index, []).append(list(s.response_token_ids))
        return samples

    monkeypatch.setattr(services, "generate", counted)
    # Sampled, seeded: a page seeded as its part of the whole request samples the same tokens.
    sampling = common_pb2.SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=4, seed=7)
    evaluator = Evaluator(services, ["add"], n_samples=N_SAMPLES, sampling=sampling, reward="exact_match",
                          prompts_per_generate=prompts_per_generate)  # fmt: skip
    metrics = evaluator.evaluate(f"pages-{prompts_per_generate}")
    monkeypatch.undo()
    return calls, metrics, responses


def test_pages_of_eval_prompts_sample_what_one_request_samples(eval_services, monkeypatch):
    """Pages of 4 prompts (each split over the two services), seeded and sampled."""
    calls, paged, paged_responses = _evaluate(eval_services, 4, monkeypatch)
    assert sorted(calls) == [2, 4, 4]  # 10 eval prompts in pages of 4 (two at once): none holds more
    calls, whole, whole_responses = _evaluate(eval_services, 10, monkeypatch)
    assert calls == [10]
    assert sorted(paged_responses) == list(range(10))  # a group index per prompt, across pages
    assert all(len(r) == N_SAMPLES for r in paged_responses.values())
    assert paged_responses == whole_responses
    assert paged.pop("perf/eval_time") > 0 and whole.pop("perf/eval_time") > 0
    assert paged == whole and {"eval/add", "eval/add/pass@1", "eval/add/pass@2", "eval/accuracy"} == set(
        paged
    )
