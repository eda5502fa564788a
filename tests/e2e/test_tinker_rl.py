"""An RL loop in the tinker cookbook's style, through `rollway gateway` with the unmodified SDK:
sample with the current weights (save_weights_for_sampler), score on the demo's addition task,
importance_sampling with group-centred advantages, optim_step.

The reward is the verifiers example's (correct + 0.5 * starts_with_digit, docs/environments.md,
"verifiers environments") plus a readability term (see score), with that example's settings for the tiny
model's random weights: a large step, short answers, most tokens end the answer. Fixed seeds; the
reward must rise, every update must move the policy in its advantages' direction, and the
trainer's log-probs of the sampled tokens must equal the sampler's.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import tinker
from support.gateway import TOKEN, running_gateway
from tinker import types

pytestmark = pytest.mark.slow
NUM_PROMPTS, GROUP_SIZE, MAX_TOKENS, NUM_STEPS = 4, 8, 4, 6
LEARNING_RATE = 1e-2
# Most tokens end the answer, so that it ends within MAX_TOKENS (as in test_verifiers_grpo.py).
STOP_TOKENS = list(range(3, 300))
SAMPLING_SEED = 1


def score(text: str, label: str) -> float:
    """The verifiers example's rubric, correct (weight 1) + starts_with_digit (0.5), plus
    starts_readable (0.25: an ASCII letter or digit first). Under this plain chat prompt the tiny
    model wrote no digit in 512 samples (4 prompts x 16, seeds 0-3), so the first two parts are 0
    on every sample; about a quarter of its answers start readable, a part it can learn."""
    answer = text.strip()
    readable = answer[:1].isascii() and answer[:1].isalnum()
    return float(answer == label) + 0.5 * float(answer[:1].isdigit()) + 0.25 * float(readable)


def rl_datum(
    prompt: list[int], sampled: list[int], sampled_logprobs: list[float], advantage: float
) -> types.Datum:
    """The cookbook's layout: inputs and targets shifted by one; prompt positions carry zeros."""
    tokens = prompt + sampled
    num_prompt_targets = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": [0.0] * num_prompt_targets + sampled_logprobs,
            "advantages": [0.0] * num_prompt_targets + [advantage] * len(sampled),
        },
    )


def sequence_logprob(training, data: list[types.Datum], num_prompt_targets: list[int]) -> np.ndarray:
    """Each datum's summed log-prob of its sampled tokens under the current weights."""
    out = training.forward(data, "importance_sampling").result()
    return np.array(
        [
            o["logprobs"].to_numpy()[n:].sum()
            for o, n in zip(out.loss_fn_outputs, num_prompt_targets, strict=True)
        ]
    )


def test_rl_loop_reward_rises_and_sampler_and_trainer_agree(tmp_path, tiny_model_dir, demo_data_dir):
    questions = pq.read_table(demo_data_dir / "rl.parquet").to_pylist()[:NUM_PROMPTS]
    with (
        running_gateway(tmp_path) as (base_url, _),
        tinker.ServiceClient(base_url=base_url, api_key=TOKEN) as service,  # closed before the gateway
    ):
        training = service.create_lora_training_client(base_model=str(tiny_model_dir), rank=0).result()
        tokenizer = training.get_tokenizer()
        chats = [[{"role": "user", "content": q["prompt"]}] for q in questions]
        prompts = [
            tokenizer.encode(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False))
            for c in chats
        ]
        params = types.SamplingParams(
            max_tokens=MAX_TOKENS, temperature=1.0, seed=SAMPLING_SEED, stop=STOP_TOKENS
        )
        mean_rewards = []
        for step in range(NUM_STEPS):
            sampler_path = training.save_weights_for_sampler(f"step-{step}").result().path
            sampler = service.create_sampling_client(model_path=sampler_path).result()
            futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP_SIZE, params) for p in prompts]
            data, num_prompt_targets, advantages, sampled_logprobs = [], [], [], []
            rewards_all = []
            for prompt, question, future in zip(prompts, questions, futures, strict=True):
                sequences = future.result().sequences
                assert len(sequences) == GROUP_SIZE
                rewards = np.array(
                    [score(tokenizer.decode(s.tokens, skip_special_tokens=True), question["label"])
                     for s in sequences]
                )  # fmt: skip
                rewards_all.extend(rewards)
                for seq, advantage in zip(sequences, rewards - rewards.mean(), strict=True):
                    assert 1 <= len(seq.tokens) <= MAX_TOKENS and len(seq.logprobs) == len(seq.tokens)
                    data.append(rl_datum(prompt, list(seq.tokens), list(seq.logprobs), float(advantage)))
                    num_prompt_targets.append(len(prompt) - 1)
                    advantages.append(float(advantage))
                    sampled_logprobs.append(np.asarray(seq.logprobs))
            mean_rewards.append(float(np.mean(rewards_all)))
            if not any(a != 0 for a in advantages):  # every group scored alike: nothing to learn
                continue
            before = sequence_logprob(training, data, num_prompt_targets)
            result = training.forward_backward(data, "importance_sampling").result()
            # The loss's inputs and outputs agree: the trainer's log-probs of the sampled tokens are
            # the sampler's, so the importance ratio starts at 1 and the loss is -sum(advantages).
            for out, n, logprobs in zip(
                result.loss_fn_outputs, num_prompt_targets, sampled_logprobs, strict=True
            ):
                np.testing.assert_allclose(out["logprobs"].to_numpy()[n:], logprobs, atol=2e-4)
            expected_loss = -sum(a * len(lp) for a, lp in zip(advantages, sampled_logprobs, strict=True))
            assert result.metrics["loss:sum"] == pytest.approx(expected_loss, abs=1e-2)
            training.optim_step(types.AdamParams(learning_rate=LEARNING_RATE, eps=1e-8)).result()
            after = sequence_logprob(training, data, num_prompt_targets)
            # The update raised the likelihood of samples with positive advantage over negative ones.
            assert float(np.dot(np.asarray(advantages), after - before)) > 0, (advantages, after - before)
        print("mean reward per step:", [round(r, 3) for r in mean_rewards])
    assert sum(mean_rewards[-2:]) / 2 > sum(mean_rewards[:2]) / 2 + 0.1, mean_rewards
