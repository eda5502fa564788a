"""Agents written against the real `openai` client run episodes through a real rollout service's
OpenAI-compatible endpoint: a tool call over several turns (the sample is exactly the recorded
requests: token ids, masks, log-probs, weight versions), docs/environments.md's example agent, streaming,
the completions API, a rewritten history refused, a failing agent, 64 concurrent async agents
with nothing lost or mixed up, an episode whose turns straddle a weight update, and plain /v1
requests (no episode) served by the current policy."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import openai
import pytest
from openai import OpenAI
from support.ports import free_port
from support.processes import ServiceProcess, start_together
from support.tool_calling_model import ANSWER, QUESTION, make_tool_calling_model
from support.waiting import wait_until

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.rollout.v1 import rollout_pb2, rollout_pb2_grpc

pytestmark = pytest.mark.slow

TESTS_DIR = str(Path(__file__).resolve().parents[1])
STOP = common_pb2.FINISH_REASON_STOP
ENV = {"PYTHONPATH": TESTS_DIR + ":" + os.environ.get("PYTHONPATH", "")}


def _agent_service(model_dir, workdir, agent: str, *extra: str) -> ServiceProcess:
    args = [
        "--hf-checkpoint", str(model_dir),
        "--dtype", "float32",
        "--environment", "agent",
        "--agent-function-path", agent,
        "--agent-request-timeout", "60",
        *extra,
    ]  # fmt: skip
    return ServiceProcess("rollout", args, workdir, env=ENV)


@pytest.fixture(scope="module")
def tool_model(tiny_model_dir, tmp_path_factory):
    return make_tool_calling_model(tiny_model_dir, tmp_path_factory.mktemp("tool-model"))


@pytest.fixture(scope="module")
def rollout(tool_model, tmp_path_factory):
    with _agent_service(
        tool_model, tmp_path_factory.mktemp("rollout"), "support.openai_agents:by_metadata"
    ) as svc:
        yield rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))


def _generate(
    stub, agent: str, record: Path, text: str = QUESTION, label: str = ANSWER, **sampling
) -> common_pb2.Sample:
    prompt = rollout_pb2.Prompt(text=text, label=label)
    prompt.metadata.update({"agent": agent, "record": str(record), **sampling.pop("metadata", {})})
    params = {"temperature": 0.0, "max_new_tokens": 128, **sampling}
    request = rollout_pb2.GenerateRequest(
        prompts=[prompt], n_samples_per_prompt=1, sampling_params=common_pb2.SamplingParams(**params)
    )
    [reply] = list(stub.Generate(request, timeout=120))
    return reply.sample


def _model_spans(sample) -> list[tuple[int, int]]:
    spans, start = [], 0
    for turn in sample.turns:
        if turn.role == "model":
            spans.append((start, start + turn.num_tokens))
        start += turn.num_tokens
    return spans


def test_a_tool_calling_agent_episode_is_exactly_its_recorded_requests(rollout, tmp_path):
    record = tmp_path / "record.json"
    sample = _generate(rollout, "recording_calculator_agent", record)
    turns = json.loads(record.read_text())
    assert sample.finish_reason == STOP and sample.reward == 1.0 and not sample.reward_error
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    # The model called the tool (parsed into OpenAI tool_calls), then answered with its result.
    [call] = turns[0]["message"]["tool_calls"]
    assert turns[0]["finish_reason"] == "tool_calls"
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": "2 + 3"}
    assert turns[1]["message"]["content"] == ANSWER and turns[1]["finish_reason"] == "stop"
    # The sample's prompt is the first request as rendered; each request's prompt is everything
    # recorded before it; the response is the turns' tokens with the tool message between them.
    recorded = [t["rollway"] for t in turns]
    prompt, response = list(sample.prompt_token_ids), list(sample.response_token_ids)
    assert prompt == recorded[0]["prompt_token_ids"]
    spans = _model_spans(sample)
    assert len(spans) == len(recorded) == 2
    mask = [0] * len(response)
    for (start, end), turn in zip(spans, recorded, strict=True):
        assert turn["prompt_token_ids"] == prompt + response[:start]
        assert response[start:end] == turn["completion_token_ids"]
        assert list(sample.rollout_log_probs[start:end]) == pytest.approx(turn["completion_log_probs"], abs=0)
        mask[start:end] = [1] * (end - start)
    assert prompt + response == recorded[-1]["prompt_token_ids"] + recorded[-1]["completion_token_ids"]
    assert list(sample.loss_mask) == mask and 0 in mask  # 1 exactly on the model's tokens
    env_start, env_end = spans[0][1], spans[1][0]
    assert list(sample.rollout_log_probs[env_start:env_end]) == [0.0] * (env_end - env_start)
    # The log-probs the client got (logprobs=True) are those recorded and trained on.
    for turn in turns:
        assert turn["logprobs"] == turn["rollway"]["completion_log_probs"]
    assert [t.weight_version for t in sample.turns if t.role == "model"] == [
        t["weight_version"] for t in recorded
    ]


def test_the_readme_example_agent_earns_its_reward(rollout, tmp_path):
    sample = _generate(rollout, "calculator_agent", tmp_path / "unused.json")
    assert sample.finish_reason == STOP and sample.reward == 1.0
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    assert '"calculator"' in sample.response_text and sample.response_text.endswith(ANSWER)


@pytest.mark.parametrize("label, reward", [(ANSWER, 1.0), ("6", 0.0)])
def test_without_a_reward_from_the_agent_the_runs_reward_function_scores_the_last_turn(
    rollout, tmp_path, label, reward
):
    # The service's --reward is the default, exact_match: the last model turn against the label.
    sample = _generate(rollout, "scored_calculator_agent", tmp_path / "unused.json", label=label)
    assert sample.finish_reason == STOP and not sample.reward_error
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    assert sample.reward == reward


def test_streamed_chunks_add_up_to_the_same_seeded_turn(rollout, tmp_path):
    records = {}
    for stream in (False, True):
        path = tmp_path / f"stream-{stream}.json"
        sample = _generate(
            rollout, "streaming_agent", path, temperature=1.0, seed=7, metadata={"stream": stream}
        )
        assert sample.finish_reason == STOP
        records[stream] = json.loads(path.read_text())
    plain, streamed = records[False], records[True]
    assert streamed["content"] == plain["content"] and streamed["tool_calls"] == plain["tool_calls"]
    assert streamed["num_chunks"] > 2 and streamed["finish"] in ("stop", "tool_calls")


def test_a_rewritten_history_is_refused_and_a_posted_reward_counts(rollout, tmp_path):
    record = tmp_path / "rewrite.json"
    sample = _generate(rollout, "history_rewriting_agent", record, temperature=1.0, seed=1, max_new_tokens=8,
                       stop_token_ids=list(range(3, 300)))  # fmt: skip
    status, message = json.loads(record.read_text())["refused"]
    assert status == 400 and "messages[0] differs" in message
    assert sample.finish_reason == STOP and sample.reward == 0.25
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    assert "go" in sample.response_text and "something else" not in sample.response_text


def test_the_completions_api_appends_only_what_the_prompt_adds(rollout, tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    record = tmp_path / "completions.json"
    sample = _generate(rollout, "completions_agent", record, temperature=1.0, seed=2, max_new_tokens=8,
                       stop_token_ids=list(range(3, 300)))  # fmt: skip
    texts = json.loads(record.read_text())["texts"]
    assert sample.finish_reason == STOP and sample.reward == 1.0
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    start = sample.turns[0].num_tokens
    env_ids = list(sample.response_token_ids[start : start + sample.turns[1].num_tokens])
    assert AutoTokenizer.from_pretrained(tiny_model_dir).decode(env_ids) == " then?"
    assert sample.response_text == texts[0] + " then?" + texts[1]


def test_a_failing_agent_fails_its_sample_and_the_service_goes_on(rollout, tmp_path):
    sample = _generate(rollout, "failing_agent", tmp_path / "unused.json")
    assert sample.finish_reason == common_pb2.FINISH_REASON_FAILED
    assert "the agent raised: RuntimeError: the agent's own bug" in sample.reward_error
    assert _generate(rollout, "calculator_agent", tmp_path / "unused.json").reward == 1.0


def test_pause_abort_ends_an_episode_waiting_for_its_agent_at_once(rollout, tmp_path):
    between, go = tmp_path / "between", tmp_path / "go"
    metadata = {"between_turns": str(between), "go": str(go)}
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(
            _generate, rollout, "weight_update_agent", tmp_path / "unused.json", temperature=1.0, seed=6,
            max_new_tokens=8, stop_token_ids=list(range(3, 300)), metadata=metadata,
        )  # fmt: skip
        wait_until(between.exists, 60, "the agent's first turn")
        aborted_at = time.monotonic()
        rollout.Pause(rollout_pb2.PauseRequest(mode=rollout_pb2.PAUSE_MODE_ABORT), timeout=30)
        sample = pending.result(timeout=30)
        seconds = time.monotonic() - aborted_at
    rollout.Resume(rollout_pb2.ResumeRequest(), timeout=30)
    go.write_text("")  # the agent goes on; its episode is over (404)
    # Not after --agent-request-timeout (60 s) nor the agent's own 60 s wait: at once.
    assert seconds < 10
    assert sample.finish_reason == common_pb2.FINISH_REASON_ABORT
    assert [t.role for t in sample.turns] == ["model"]


def test_64_concurrent_async_agents_lose_nothing_and_mix_nothing(tiny_model_dir, tmp_path):
    num = 64
    prompts = []
    for i in range(num):
        prompt = rollout_pb2.Prompt(text=f"marker-{i}")
        prompt.metadata.update({"marker": f"marker-{i}"})
        prompts.append(prompt)
    request = rollout_pb2.GenerateRequest(
        prompts=prompts,
        n_samples_per_prompt=1,
        # Most tokens end the random model's turn, so its turns end with "stop".
        sampling_params=common_pb2.SamplingParams(
            temperature=1.0, max_new_tokens=8, seed=3, stop_token_ids=list(range(3, 300))
        ),
    )
    extra = ["--num-environment-workers", str(num + 8), "--max-running-requests", str(num)]
    with _agent_service(tiny_model_dir, tmp_path, "support.openai_agents:marker_agent", *extra) as svc:
        stub = rollout_pb2_grpc.RolloutServiceStub(open_channel(svc.address))
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        start = time.monotonic()
        samples = [r.sample for r in stub.Generate(request, timeout=300)]
        seconds = time.monotonic() - start
    print(f"64 concurrent agent episodes: {seconds:.1f} s")
    assert sorted(s.index for s in samples) == list(range(num))
    for s in samples:
        marker = f"marker-{s.index}"
        assert s.finish_reason == STOP, (s.index, s.finish_reason, s.reward_error)
        assert [t.role for t in s.turns] == ["model", "environment", "model"]
        assert s.reward == float(s.index)  # each agent's own reward came back to its own sample
        assert marker in tokenizer.decode(list(s.prompt_token_ids))
        env = s.turns[1].num_tokens
        env_ids = list(s.response_token_ids[s.turns[0].num_tokens :][:env])
        assert f"again {marker}" in tokenizer.decode(env_ids)
        assert list(s.loss_mask) == [1] * s.turns[0].num_tokens + [0] * env + [1] * s.turns[2].num_tokens


def test_an_episode_goes_on_across_a_weight_update(tiny_model_dir, tmp_path):
    from rollway.coordinator.remote import Services
    from rollway.coordinator.weight_sync import WeightSyncSettings, init_weight_group, sync_weights

    trainer = ServiceProcess(
        "trainer", ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32"], tmp_path
    )
    rollout = _agent_service(tiny_model_dir, tmp_path, "support.openai_agents:weight_update_agent")
    with ExitStack() as stack:
        start_together(stack, {"trainer": trainer, "rollout": rollout})
        services = Services.connect(trainer=trainer.address, rollouts=[rollout.address])
        settings = WeightSyncSettings(bucket_size_bytes=256 * 1024, timeout_seconds=30.0, max_attempts=1)
        init_weight_group(services, settings)
        between, go, record = tmp_path / "between", tmp_path / "go", tmp_path / "versions.json"
        prompt = rollout_pb2.Prompt(text="hello")
        prompt.metadata.update({"between_turns": str(between), "go": str(go), "record": str(record)})
        request = rollout_pb2.GenerateRequest(
            prompts=[prompt],
            n_samples_per_prompt=1,
            sampling_params=common_pb2.SamplingParams(
                temperature=1.0, max_new_tokens=8, seed=5, stop_token_ids=list(range(3, 300))
            ),
        )
        with ThreadPoolExecutor(1) as pool:  # the Generate call runs while this thread updates weights
            pending = pool.submit(
                lambda: [r.sample for r in services.rollouts[0].Generate(request, timeout=120)]
            )
            wait_until(between.exists, 60, "the agent's first turn")
            # The agent waits between its turns while the trainer pushes version 1 (no pause: the
            # episode is not generating; its next turn is submitted after the update).
            sync_weights(services, 1, settings, pause=False)
            go.write_text("")
            [sample] = pending.result(timeout=120)
        services.close()
    assert sample.finish_reason == STOP and sample.reward == 1.0
    assert [t.role for t in sample.turns] == ["model", "environment", "model"]
    assert [t.weight_version for t in sample.turns if t.role == "model"] == [0, 1]
    assert json.loads(record.read_text()) == [0, 1]
    assert sample.weight_version == 0  # a sample carries the version of its oldest tokens


def test_a_turn_cut_by_the_token_limit_reaches_the_agent_and_ends_the_episode(rollout, tmp_path):
    record = tmp_path / "cut.json"
    sample = _generate(rollout, "cut_turn_agent", record, max_new_tokens=4)
    wait_until(record.exists, 30, "the agent's record (it goes on after its episode ended)")
    seen = json.loads(record.read_text())
    assert sample.finish_reason == common_pb2.FINISH_REASON_LENGTH
    assert [(t.role, t.num_tokens) for t in sample.turns] == [("model", 4)]
    assert seen["finish"] == "length" and seen["tokens"] == 4 and seen["next_status"] in (404, 409)


def test_the_services_auth_token_guards_the_endpoint(tiny_model_dir, tmp_path):
    from rollway.common.client import ClientConfig

    token = "agents-token"
    service = _agent_service(
        tiny_model_dir, tmp_path, "support.openai_agents:auth_agent", "--auth-token", token
    )
    with service:
        stub = rollout_pb2_grpc.RolloutServiceStub(
            open_channel(service.address, ClientConfig(auth_token=token))
        )
        record = tmp_path / "auth.json"
        sample = _generate(
            stub,
            "auth_agent",
            record,
            temperature=1.0,
            seed=4,
            max_new_tokens=8,
            stop_token_ids=list(range(3, 300)),
        )
    assert sample.reward == 1.0 and not sample.reward_error
    seen = json.loads(record.read_text())
    assert seen["wrong_key_status"] == 401 and seen["models"] == [str(tiny_model_dir)]


def test_plain_v1_requests_serve_the_current_policy(tiny_model_dir, tmp_path):
    port = free_port()
    args = ["--hf-checkpoint", str(tiny_model_dir), "--dtype", "float32", "--openai-api-port", str(port)]
    with ServiceProcess("rollout", args, tmp_path):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        request = dict(
            model="policy", messages=[{"role": "user", "content": "What is 2 + 3?"}], temperature=1.0, seed=11,
            max_tokens=12,
        )  # fmt: skip
        plain = client.chat.completions.create(**request, logprobs=True)
        content = "".join(
            c.choices[0].delta.content or "" for c in client.chat.completions.create(**request, stream=True)
        )
        assert content == plain.choices[0].message.content and plain.usage.completion_tokens > 0
        recorded = plain.model_extra["rollway"]
        [choice] = recorded["choices"]
        assert [t.logprob for t in plain.choices[0].logprobs.content] == choice["completion_log_probs"]
        assert (
            len(choice["completion_token_ids"]) == plain.usage.completion_tokens
            and choice["weight_version"] == 0
        )
        two = client.completions.create(model="policy", prompt="What is", n=2, max_tokens=4, temperature=1.0)
        assert [c.index for c in two.choices] == [0, 1]
        assert [m.id for m in client.models.list()] == [str(tiny_model_dir)]
        with pytest.raises(openai.BadRequestError, match="sampling_params.temperature"):
            client.chat.completions.create(**{**request, "temperature": -1.0})
        with pytest.raises(openai.BadRequestError, match="messages must be a non-empty list"):
            client.chat.completions.create(**{**request, "messages": []})
