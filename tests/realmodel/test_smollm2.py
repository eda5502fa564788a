"""rollway on a model someone else trained: SmolLM2-135M-Instruct (tests/realmodel/conftest.py).

One seeded GRPO run and one short SFT run, each asserting every fact of its kind:
- the ChatML template renders through the dataloader's own encoder with the SFT loss mask exactly
  on the assistant's tokens (its answer and <|im_end|>), nothing of the system or user turns;
- GRPO on "What is A + B? Answer with just the number." raises greedy held-out accuracy by at
  least 0.3; the trainer's log-probs of the sampled tokens equal the hf engine's
  (train/train_rollout_logprob_abs_diff); every sample that stops ends at <|im_end|>;
- the SFT export loads in plain transformers, embeddings still tied, holds the trainer's final
  weights bit for bit (the sha256 the run logs of them; so transformers computes the trainer's
  log-probs), and
  gives the answers of the conversations it was trained on more probability than the base model.
test_smollm2_sglang.py holds the converted model on a real SGLang server to the trainer's log-probs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rollway.demo.smollm2 import grpo_config, make_data, question

# The bound. Measured (2026-11-28, hf engine, 8 steps of 8 prompts x 8 samples, lr 2e-5,
# NUM_EVAL held-out sums): with 16 new tokens (the answer and <|im_end|> take ~4), held-out accuracy
# 0.094 -> 0.562 (seed 0), 0.500 (seed 1), 0.625 (seed 2): gains 0.47, 0.41, 0.53, in 108-126 s on
# a quiet 2-core machine; with 32 new tokens the gains were 0.52, 0.45, 0.63 in ~190 s. Cheaper
# settings did not hold the bound on every seed: 6 steps at lr 3e-5 with 16 new tokens gained 0.52,
# 0.08 and 0.58 (seeds 0, 1, 2), at lr 5e-5 seed 1 collapsed to 0.0, and 6 steps at lr 3e-5 with 32
# tokens gained 0.16 on seed 1.
MIN_ACCURACY_GAIN = 0.3
GRPO_STEPS = 8
RESPONSE_LEN = 16
NUM_EVAL = 64
SFT_STEPS = 4


def launch(config: dict, workdir: Path, timeout: float) -> Path:
    path = workdir / f"{config['run_id']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "rollway.cli", "run", str(path)],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return Path(config["run_dir"]) / config["run_id"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("smollm2-data"), seed=0, num_eval=NUM_EVAL)


def test_the_chatml_template_masks_exactly_the_assistant_tokens(real_model_dir):
    from rollway.dataloader.encoder import Encoder, load_tokenizer
    from rollway.dataloader.rows import Row

    tokenizer = load_tokenizer(str(real_model_dir))
    encoder = Encoder(tokenizer, sft=True, apply_chat_template=True)
    messages = [{"role": "user", "content": question(37, 45)}, {"role": "assistant", "content": "82"}]
    encoded = encoder.encode(Row(row_index=0, input=messages))
    expected = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert encoded.token_ids == list(expected)  # the model's own tokenisation of its template
    trained = [t for t, m in zip(encoded.token_ids, encoded.loss_mask, strict=True) if m]
    assert tokenizer.decode(trained) == "82<|im_end|>"
    first = encoded.loss_mask.index(1)
    prompt = tokenizer.decode(encoded.token_ids[:first])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n"), prompt
    assert question(37, 45) in prompt
    assert not any(encoded.loss_mask[first + len(trained) :])  # nothing after the turn's end


def test_grpo_raises_held_out_accuracy_with_matching_log_probs(real_model_dir, data_dir, tmp_path):
    config = grpo_config(tmp_path / "runs", real_model_dir, data_dir, steps=GRPO_STEPS, seed=0)
    config["rollout_max_response_len"] = RESPONSE_LEN
    config["save_debug_rollout_data"] = str(tmp_path / "rollouts")
    run_dir = launch(config, tmp_path, timeout=900)
    records = metrics(run_dir)
    accuracy = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    gain = accuracy[-1] - accuracy[0]
    print(f"held-out accuracy {accuracy[0]:.3f} -> {accuracy[-1]:.3f} in {GRPO_STEPS} GRPO steps")
    assert gain >= MIN_ACCURACY_GAIN, f"held-out accuracy {accuracy}"
    diffs = [
        r["train/train_rollout_logprob_abs_diff"]
        for r in records
        if "train/train_rollout_logprob_abs_diff" in r
    ]
    assert len(diffs) == GRPO_STEPS and max(diffs) < 1e-4, diffs

    from transformers import AutoTokenizer

    from rollway.common.v1 import common_pb2
    from rollway.coordinator.debug_data import load_rollout

    im_end = AutoTokenizer.from_pretrained(real_model_dir).convert_tokens_to_ids("<|im_end|>")
    stopped = 0
    for rollout_id in range(GRPO_STEPS):
        for sample in load_rollout(str(tmp_path / "rollouts"), rollout_id):
            response = list(sample.response_token_ids)
            assert im_end not in response[:-1], "generation went on past <|im_end|>"
            if sample.finish_reason == common_pb2.FINISH_REASON_STOP:
                assert response[-1] == im_end
                stopped += 1
    assert stopped >= 32, f"only {stopped} samples stopped at <|im_end|>"


def test_the_sft_export_loads_in_transformers_and_holds_the_trained_steps(real_model_dir, data_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = {
        "run_id": "smollm2-sft",
        "run_dir": str(tmp_path / "runs"),
        "hf_checkpoint": str(real_model_dir),
        "loss_type": "sft_loss",
        "prompt_data": [str(data_dir / "sft.parquet")],
        "input_key": "messages",
        "apply_chat_template": True,
        "num_rollout": SFT_STEPS,
        "rollout_batch_size": 16,
        "global_batch_size": 16,
        "lr": 1e-5,
        "seed": 0,
        "use_dynamic_batch_size": True,
        "max_tokens_per_gpu": 2048,  # the memory plan fits it on 16 GiB machines
        "save_hf": str(tmp_path / "export"),
        # The trainer's weights after each step, as a sha256 (determinism.jsonl), to hold the export
        # to: a run checkpoint (1.6 GB of weights and AdamW state, saved, converted and loaded back)
        # cost the test more than its four steps.
        "debug_determinism": True,
    }
    run_dir = launch(config, tmp_path, timeout=600)
    losses = [r["sft/loss"] for r in metrics(run_dir) if "sft/loss" in r]
    assert len(losses) == SFT_STEPS and losses[-1] < losses[0], losses

    export_dir = Path(json.loads((run_dir / "result.json").read_text())["hf_export_dir"])
    assert export_dir.parent == tmp_path / "export", export_dir
    tokenizer = AutoTokenizer.from_pretrained(export_dir)
    export = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32).eval()
    assert export.config.tie_word_embeddings and export.lm_head.weight is export.model.embed_tokens.weight
    # The export is the trainer's final weights bit for bit (the sha256 of every parameter, tied
    # once, by name, dtype, shape and bytes: common/weights_checksum.py), so plain transformers
    # computes the trainer's log-probs from it.
    from rollway.common.weights_checksum import weights_checksum

    steps = [json.loads(line) for line in (run_dir / "determinism.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(SFT_STEPS)), steps
    exported, num_tensors = weights_checksum(export.named_parameters(), torch.float32)
    assert "model.embed_tokens.weight" in dict(export.named_parameters()) and num_tensors > 0
    assert exported == steps[-1]["weights"], "the export is not the trainer's final weights"
    assert steps[0]["weights"] != steps[-1]["weights"], "the trainer's weights did not change"
    messages = [{"role": "user", "content": question(23, 58)}, {"role": "assistant", "content": "81"}]
    ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")[
        "input_ids"
    ]
    answer = slice(-3, -1)  # "81" then <|im_end|>, before the template's trailing newline

    def answer_log_prob(model) -> float:
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids).logits[0, :-1], dim=-1)
        targets = ids[0, 1:]
        return float(log_probs.gather(1, targets[:, None])[answer].sum())

    assert answer_log_prob(export) > answer_log_prob(base)  # the SFT steps are in the export


def test_import_gguf_kept_tied_embeddings_the_template_and_the_logits(real_model_dir):
    written = json.loads((real_model_dir / "rollway-import.json").read_text())  # deploy/real-model/install.sh
    assert written["architecture"] == "LlamaForCausalLM"
    assert written["num_parameters"] == 134_515_008  # the tied embedding counted once
    assert written["vocab_size"] == 49_152 and written["tie_word_embeddings"] and written["chat_template"]
    assert written["max_logit_difference"] == 0.0  # the directory reproduces the GGUF model exactly
    config = json.loads((real_model_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
