"""The training engine on real FSDP2 shards over gloo: 2 spawned ranks, then 1.

Invariance (fp32): the loss and every parameter's gradient are the same for 1 or 2 ranks, for
any micro-batch split (fixed sizes, token budget) and for packed or padded rows, and equal to
plain transformers without FSDP. Checkpoints: save on 2 ranks -> load on 2 ranks -> continue
equals the uninterrupted run; the same checkpoint loads on 1 rank; the HF export reloads with
from_pretrained and gives the trainer's logits. SFT on the tiny model drives the loss down.
"""

from __future__ import annotations

import random

import pytest
import torch
from support.rank_harness import make_config, run_ranks
from transformers import AutoModelForCausalLM

from rollway.demo.tiny_model import make_tiny_model
from rollway.trainer.micro_batch import SequenceItem

pytestmark = pytest.mark.slow

PER_SAMPLE_VARIANTS = {
    "mbs1": {"micro_batch_size": 1},
    "mbs_all": {"micro_batch_size": 6},
    "dynamic": {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 48},
    "padded_mbs2": {"packing": False, "micro_batch_size": 2},
}
PER_TOKEN_VARIANTS = {
    "per_token_dynamic": {
        "calculate_per_token_loss": True,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 48,
    },
    "per_token_padded": {"calculate_per_token_loss": True, "packing": False, "micro_batch_size": 3},
}


def make_batch(seed: int, size: int = 6) -> list[SequenceItem]:
    rng = random.Random(seed)
    items = []
    for index in range(size):
        prompt = rng.randint(0, 4)
        response = rng.randint(3, 24)
        loss_mask = [1] * response
        if response > 5:  # a masked stretch inside the response, like a tool output
            loss_mask[2:4] = [0, 0]
        tokens = [rng.randint(3, 300) for _ in range(prompt + response)]
        items.append(SequenceItem(index, tokens, prompt, loss_mask))
    return items


BATCHES = [make_batch(seed) for seed in range(4)]
PROBE = make_batch(99, size=3)


def reference(model_dir, items, per_token: bool):
    """Loss and gradients of plain transformers (no FSDP, one sample at a time)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    total_tokens = sum(sum(it.loss_mask[1 if it.response_start == 0 else 0 :]) for it in items)
    loss = 0.0
    for item in items:
        ids = torch.tensor([item.token_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        nll = -logp.gather(-1, ids[0, 1:, None])[:, 0]
        mask = torch.tensor([0] * item.response_start + item.loss_mask, dtype=torch.float32)[1:]
        if per_token:
            loss = loss + (nll * mask).sum() / total_tokens
        else:
            loss = loss + (nll * mask).sum() / mask.sum().clamp(min=1) / len(items)
    loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("untied"), seed=1, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir, untied_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-ranks")
    config = make_config(tiny_model_dir, lr=1e-3)
    untied = make_config(untied_model_dir)
    return run_ranks(
        2,
        [
            (
                "gradients",
                {"config": config, "items": BATCHES[0], "variants": PER_SAMPLE_VARIANTS | PER_TOKEN_VARIANTS},
            ),
            (
                "save_and_resume",
                {"config": config, "batches": BATCHES, "root": str(tmp / "ckpt"), "probe": PROBE},
            ),
            (
                "gradients",
                {"config": untied, "items": BATCHES[0], "variants": {"mbs1": PER_SAMPLE_VARIANTS["mbs1"]}},
            ),
        ],
        tmp,
    )


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir, tmp_path_factory, two_ranks):
    tmp = tmp_path_factory.mktemp("one-rank")
    config = make_config(tiny_model_dir, lr=1e-3)
    sft_batch = make_batch(7, size=4)
    # Start-up settings that change how the model runs, not what it computes.
    other_engine = make_config(
        tiny_model_dir, attn_implementation="eager", gradient_checkpointing=True, fsdp_cpu_offload=True
    )
    return run_ranks(
        1,
        [
            (
                "gradients",
                {"config": config, "items": BATCHES[0], "variants": PER_SAMPLE_VARIANTS | PER_TOKEN_VARIANTS},
            ),
            (
                "load_and_continue",
                {"config": config, "batches": BATCHES[2:], "directory": two_ranks[1]["final"]},
            ),
            (
                "train",
                {"config": make_config(tiny_model_dir, lr=3e-3, clip_grad=0.0), "batches": [sft_batch] * 30},
            ),
            (
                "gradients",
                {
                    "config": other_engine,
                    "items": BATCHES[0],
                    "variants": {"dynamic": PER_SAMPLE_VARIANTS["dynamic"]},
                },
            ),
        ],
        tmp,
    )


def assert_same_gradients(a: dict, b: dict, atol: float = 2e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(
    "variants", [PER_SAMPLE_VARIANTS, PER_TOKEN_VARIANTS], ids=["per_sample", "per_token"]
)
def test_loss_and_gradients_do_not_depend_on_split_ranks_or_packing(
    two_ranks, one_rank, tiny_model_dir, variants
):
    per_token = variants is PER_TOKEN_VARIANTS
    expected_loss, expected_grads = reference(tiny_model_dir, BATCHES[0], per_token)
    assert 5.0 < expected_loss < 7.0  # ~ln(vocab) for a random tiny model
    for results in (two_ranks[0], one_rank[0]):
        for name in variants:
            metrics, grads = results[name]
            assert metrics["train/loss"] == pytest.approx(expected_loss, abs=1e-5), name
            assert_same_gradients(grads, {k: expected_grads[k] for k in grads})
    # The two aggregations differ on this batch (samples have different lengths).
    per_sample_loss = two_ranks[0]["mbs1"][0]["train/loss"]
    per_token_loss = two_ranks[0]["per_token_dynamic"][0]["train/loss"]
    assert abs(per_sample_loss - per_token_loss) > 1e-4
    assert two_ranks[0]["mbs1"][0]["train/per_token_loss"] == pytest.approx(per_token_loss, abs=1e-5)


def test_eager_attention_checkpointing_and_offload_give_the_same_gradients(one_rank, tiny_model_dir):
    expected_loss, expected_grads = reference(tiny_model_dir, BATCHES[0], per_token=False)
    metrics, grads = one_rank[3]["dynamic"]
    assert metrics["train/loss"] == pytest.approx(expected_loss, abs=1e-5)
    assert_same_gradients(grads, {k: expected_grads[k] for k in grads})


def test_untied_embeddings_are_sharded_on_their_own(two_ranks, untied_model_dir):
    expected_loss, expected_grads = reference(untied_model_dir, BATCHES[0], per_token=False)
    metrics, grads = two_ranks[2]["mbs1"]
    assert "lm_head.weight" in grads and "model.embed_tokens.weight" in grads
    assert metrics["train/loss"] == pytest.approx(expected_loss, abs=1e-5)
    assert_same_gradients(grads, {k: expected_grads[k] for k in grads})


def test_resume_on_two_ranks_equals_uninterrupted_run(two_ranks):
    run = two_ranks[1]
    assert [m["train/loss"] for m in run["resumed"]] == pytest.approx(
        [m["train/loss"] for m in run["uninterrupted"]], abs=1e-6
    )
    assert [m["train/grad_norm"] for m in run["resumed"]] == pytest.approx(
        [m["train/grad_norm"] for m in run["uninterrupted"]], rel=1e-5
    )
    engine_checksum, resumed_checksum = run["checksums"]
    assert engine_checksum == resumed_checksum  # bit-identical weights after the same 2 steps
    assert run["before"][1]["train/loss"] < run["before"][0]["train/loss"] + 1.0  # trained, sane numbers


def test_checkpoint_saved_on_two_ranks_loads_on_one(two_ranks, one_rank):
    continued = one_rank[1]
    uninterrupted = two_ranks[1]["uninterrupted"]
    assert [m["train/loss"] for m in continued] == pytest.approx(
        [m["train/loss"] for m in uninterrupted], abs=1e-5
    )


def test_hf_export_reloads_with_the_trainers_logits(two_ranks):
    run = two_ranks[1]
    model = AutoModelForCausalLM.from_pretrained(f"{run['final']}/hf", dtype=torch.float32)
    for row, item in enumerate(PROBE):
        logits = model(input_ids=torch.tensor([item.token_ids])).logits[0]
        torch.testing.assert_close(logits, run["probe_logits"][row, : len(item)], atol=1e-5, rtol=1e-5)


def test_sft_drives_the_loss_down(one_rank):
    losses = [m["train/loss"] for m in one_rank[2]]
    assert losses[0] > 5.0
    assert losses[-1] < 0.2
    assert losses[-1] < losses[len(losses) // 2] < losses[0]
