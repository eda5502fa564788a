"""Shared prefixes and logits at target positions only (micro_batch.py, attention.py, engine.py).

A packed row holds its samples as a prefix tree (a GRPO group's prompt once, responses that
begin alike once), and lm_head runs only where a response token is predicted. Neither may change
the maths: the log-probs, every policy-loss metric and every gradient equal those of each sample
run alone (the old path: one plain per-sample forward), for sdpa and eager attention; on real
FSDP2 (one gloo rank, spawned) in tests/integration/trainer/test_shared_prompts_ranks.py.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollway.common.config import from_dict
from rollway.trainer.attention import (
    BLOCK_COST_RATIO,
    LAYOUT_KWARG,
    AttentionSequence,
    TreeBlock,
    hf_attn_implementation,
    model_inputs,
    row_units,
)
from rollway.trainer.config import TrainerConfig
from rollway.trainer.engine import TrainerEngine, accepts_logits_to_keep
from rollway.trainer.micro_batch import SequenceItem, build_micro_batch
from rollway.trainer.train_plan import plan_train_steps

TEMPERATURE = 0.7


def grouped_batch(seed: int, groups: int = 3, group_size: int = 3) -> list[SequenceItem]:
    """GRPO-like: `groups` prompts x `group_size` responses of varied length, plus one lone sample,
    with masked stretches, +/- advantages and rollout log-probs."""
    rng = random.Random(seed)
    items: list[SequenceItem] = []
    for g in range(groups + 1):
        prompt = [rng.randint(3, 300) for _ in range(rng.randint(2, 9))]
        for _ in range(group_size if g < groups else 1):
            response = rng.randint(2, 10)
            # Responses from 3 tokens: members of a group often begin alike (deeper tree branches).
            mask = [1] * response
            if response > 5:
                mask[2:4] = [0, 0]
            extras = {
                "advantages": [rng.uniform(-1.5, 1.5)] * response,
                "rollout_log_probs": [-rng.uniform(4.5, 6.5) for _ in range(response)],
            }
            tokens = prompt + [rng.randint(3, 5) for _ in range(response)]
            items.append(SequenceItem(len(items), tokens, len(prompt), mask, extras, source="ab"[g % 2]))
    rng.shuffle(items)  # group members need not be neighbours in the request
    for index, item in enumerate(items):
        item.index = index
    return items


ITEMS = grouped_batch(0)
SHARED = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 4096}  # the group in one row


@pytest.fixture(autouse=True)
def one_thread():
    """The reference forwards on one thread: on a busy 2-core machine two OpenMP threads wait on
    each other (measured ~100x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def alone_log_probs(model, item: SequenceItem, temperature: float = 1.0) -> torch.Tensor:
    """The old path: the sample on its own, full logits, log-softmax, its response's log-probs."""
    ids = torch.tensor([item.token_ids])
    logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float() / temperature, -1)
    return logp.gather(-1, ids[0, 1:, None])[item.response_start - 1 :, 0]


def test_a_group_holds_its_prompt_once_and_plans_as_one_unit():
    settings = from_dict(TrainerConfig, {"hf_checkpoint": "unused", **SHARED})
    per_rank, efficiency = plan_train_steps(ITEMS, settings, 1)
    assert len(per_rank[0][0].micro_batches) == 1 and efficiency <= 1.0
    mb = build_micro_batch(ITEMS, packing=True, pad_multiple=1, pad_token_id=0, share_prefixes=True)
    prompts = {tuple(item.token_ids[: item.response_start]) for item in ITEMS}
    assert mb.num_tokens < sum(map(len, prompts)) + sum(len(i) - i.response_start for i in ITEMS)
    assert len(set(mb.segment_parents.tolist())) > 3  # branches below the prompts too
    assert mb.logit_columns.numel() == sum(len(i) - i.response_start for i in ITEMS)  # responses only


def sft_batch(seed: int, size: int = 12) -> list[SequenceItem]:
    """Chat-like SFT samples: a fixed template, prompts and answers from a few tokens."""
    rng = random.Random(seed)
    items = []
    for index in range(size):
        prompt = [1, 2, 3] + [rng.randint(10, 13) for _ in range(rng.randint(1, 4))] + [4]
        response = [rng.randint(20, 22) for _ in range(rng.randint(1, 3))] + [5]
        items.append(SequenceItem(index, prompt + response, len(prompt), [1] * len(response)))
    return items


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("batch", ["grpo", "sft"])
def test_shared_prefix_row_gives_every_response_its_log_probs_alone(tiny_model_dir, attn, batch):
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=hf_attn_implementation(attn)
    ).eval()
    items = ITEMS if batch == "grpo" else sft_batch(1)
    mb = build_micro_batch(items, packing=True, pad_multiple=16, pad_token_id=0, share_prefixes=True)
    assert mb.num_tokens < 0.8 * sum(map(len, items))
    with torch.no_grad():
        inputs = model_inputs(mb, attn, torch.float32, torch.device("cpu"))
        logits = model(**inputs, logits_to_keep=mb.logit_columns).logits
        logp = torch.log_softmax(logits[0].float(), -1).gather(-1, mb.target_ids[0, :, None])[:, 0]
        for index, _, first, end in mb.spans:
            expected = alone_log_probs(model, items[index])
            torch.testing.assert_close(logp[first:end], expected, atol=2e-5, rtol=1e-5)


# sdpa attends a shared prefix tree as gathered sequences, as masked blocks, or as chosen per
# subtree (attention.row_units); the groups' prompts here begin with one template, as chats do.
SDPA_LAYOUTS = {"gathered": 0.0, "blocks": math.inf, "chosen": BLOCK_COST_RATIO}
TEMPLATE = [1, 2, 3, 4, 5]
TEMPLATED = [
    SequenceItem(i.index, TEMPLATE + i.token_ids, len(TEMPLATE) + i.response_start, i.loss_mask, i.extras)
    for i in ITEMS
]


def sdpa_response_log_probs(model, items, block_cost_ratio: float, temperature: float = 1.0):
    """Each response's log-probs from one shared-prefix row, sdpa with the layout pinned."""
    mb = build_micro_batch(items, packing=True, pad_multiple=16, pad_token_id=0, share_prefixes=True)
    inputs = model_inputs(mb, "sdpa", torch.float32, torch.device("cpu"), block_cost_ratio)
    groups = inputs[LAYOUT_KWARG].groups
    logits = model(**inputs, logits_to_keep=mb.logit_columns).logits
    logp = torch.log_softmax(logits[0].float() / temperature, -1).gather(-1, mb.target_ids[0, :, None])[:, 0]
    return {index: logp[first:end] for index, _, first, end in mb.spans}, groups


@pytest.mark.parametrize("layout", list(SDPA_LAYOUTS))
def test_both_sdpa_layouts_of_a_tree_give_the_log_probs_and_gradients_of_each_sample_alone(
    tiny_model_dir, layout
):
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=hf_attn_implementation("sdpa")
    )
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    values, groups = sdpa_response_log_probs(model, TEMPLATED, SDPA_LAYOUTS[layout], TEMPERATURE)
    # gathered: a sequence per tree segment; blocks: the row's one tree, and the padding;
    # chosen: the template a sequence, each group a block below it (the template its prefix)
    expected_units = {"gathered": range(13, 100), "blocks": [2], "chosen": range(3, 9)}[layout]
    assert sum(count for count, _ in groups) in expected_units
    loss = expected_loss = 0.0
    for item in TEMPLATED:
        expected = alone_log_probs(reference, item, TEMPERATURE)
        torch.testing.assert_close(values[item.index], expected, atol=2e-5, rtol=1e-5)
        weight = item.extras["advantages"][0]
        loss = loss + weight * values[item.index].sum()
        expected_loss = expected_loss + weight * expected.sum()
    loss.backward()
    expected_loss.backward()
    for (name, param), (_, ref) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        # a sum of log-probs: gradients up to ~20, float32 rounding ~1e-5 of that
        torch.testing.assert_close(param.grad, ref.grad, rtol=1e-4, atol=5e-5, msg=name)


def test_a_subtree_goes_as_one_block_where_that_costs_less_than_its_sequences():
    def row(template: int, prompt: int, responses: list[int], prompts: int = 1):
        """`prompts` prompts under a shared template segment (if any), each with `responses`."""
        segments, parents = [0] * template, [-1] if template else []
        for _ in range(prompts):
            segments += [len(parents)] * prompt
            parent = len(parents)
            parents.append(0 if template else -1)
            for length in responses:
                segments += [len(parents)] * length
                parents.append(parent)
        return torch.tensor([segments + [-1] * 3]), torch.tensor(parents)

    # GRPO-like: (18 + 8 x 8)^2 / 2 against 18^2 + 8 x 26^2: one block, then the padding.
    short = row_units(*row(0, 18, [8] * 8))
    assert [type(unit) for unit in short] == [TreeBlock, AttentionSequence]
    block = short[0]
    assert block.prefix == () and block.segments[:2] == ((0, 18), (18, 8))
    assert block.parents == (-1,) + (0,) * 8
    allowed = block.allowed(84)
    assert allowed[20, :21].all() and not allowed[20, 21:].any()  # the prompt, itself so far
    assert not allowed[30, 18:26].any()  # never a sibling
    assert allowed[26:34, 26:34].equal(torch.ones(8, 8, dtype=torch.bool).tril())
    assert not allowed[:82, 82:].any() and allowed[83, :84].all()  # padding: unseen, sees up to itself
    # Long responses: (4 + 8 x 40)^2 / 2 against 4^2 + 8 x 44^2: sequences.
    long = row_units(*row(0, 4, [40] * 8))
    assert all(isinstance(unit, AttentionSequence) for unit in long) and len(long) == 10
    assert len(row_units(*row(0, 18, [8] * 8), block_cost_ratio=0.0)) == 10
    # Prompts under one chat template: the whole row as a block costs more than the template as a
    # sequence and each prompt's subtree as a block, whose prefix is the template.
    templated = row_units(*row(5, 13, [8] * 8, prompts=16))
    assert [type(unit) for unit in templated] == [AttentionSequence] + [TreeBlock] * 16 + [AttentionSequence]
    assert templated[1].prefix == ((0, 5),) and len(templated[1]) == 5 + 13 + 64
    first_response = templated[1].allowed(82)[5 + 13 + 2]
    assert first_response[: 5 + 13 + 3].all() and not first_response[5 + 13 + 3 :].any()


def test_a_model_without_logits_to_keep_gets_the_same_target_logits(tiny_model_dir):
    """engine.logits falls back to full logits and picks the target columns itself."""

    class FullLogitsOnly(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, position_ids, use_cache, **kwargs):
            return self.inner(input_ids=input_ids, position_ids=position_ids, use_cache=use_cache, **kwargs)

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32, attn_implementation=hf_attn_implementation("sdpa")
    ).eval()
    engine = SimpleNamespace(
        config=SimpleNamespace(attn_implementation="sdpa"),
        compute_dtype=torch.float32,
        info=SimpleNamespace(device=torch.device("cpu")),
        model=model,
    )
    mb = build_micro_batch(ITEMS, packing=True, pad_multiple=16, pad_token_id=0, share_prefixes=True)
    assert accepts_logits_to_keep(model) and not accepts_logits_to_keep(FullLogitsOnly(model))
    with torch.no_grad():
        kept = TrainerEngine.logits(engine, mb)
        picked = TrainerEngine.logits(engine, mb, model=FullLogitsOnly(model))
    assert kept.shape == (1, mb.logit_columns.numel(), model.config.vocab_size)
    torch.testing.assert_close(kept, picked, atol=1e-5, rtol=1e-5)
