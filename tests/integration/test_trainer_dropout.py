"""Dropout is off in training unless kept: the trainer trains the policy the rollout engine samples.

A GPT-2-style tiny model with every dropout at 0.1 (resid, embd, attn): the rollout engine (the hf
engine, in process, eval mode) generates samples with their log-probs; a real trainer process
trains on them. With dropout off (the default) the trainer's log-probs in training equal the
engine's (train/train_rollout_kl 0); with keep_dropout they do not, and the trainer warns once.
"""

from __future__ import annotations

import queue

import pytest
import torch
from support.processes import ServiceProcess
from support.trainer_steps import struct
from transformers import GPT2Config, GPT2LMHeadModel

from rollway.common.client import open_channel
from rollway.common.v1 import common_pb2
from rollway.demo.tiny_model import build_tokenizer
from rollway.rollout.config import RolloutConfig
from rollway.rollout.engines.base import SampleRequest
from rollway.rollout.engines.hf import HFEngine
from rollway.rollout.sampling import SamplingParams
from rollway.trainer.v1 import trainer_pb2 as pb
from rollway.trainer.v1 import trainer_pb2_grpc

pytestmark = pytest.mark.slow

PROMPTS = [(1, 50, 60), (1, 51, 61, 71)]
N_SAMPLES = 2


def make_gpt2_model(out_dir):
    tokenizer = build_tokenizer(model_max_length=128)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=128, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, summary_first_dropout=0.1,
        bos_token_id=0, eos_token_id=2, pad_token_id=0,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def rollout_samples(model_dir) -> list[common_pb2.Sample]:
    """Samples from the rollout engine, with its log-probs and GRPO advantages (rewards alternate)."""
    engine = HFEngine(RolloutConfig(hf_checkpoint=str(model_dir)))
    engine.start()
    try:
        requests = [
            SampleRequest(
                index=p * N_SAMPLES + j,
                prompt_token_ids=prompt,
                params=SamplingParams(temperature=1.0, max_new_tokens=12, seed=p * N_SAMPLES + j),
                prompt_key=p,
            )
            for p, prompt in enumerate(PROMPTS)
            for j in range(N_SAMPLES)
        ]
        finished = queue.Queue()
        engine.submit(requests, finished.put)
        results = sorted((finished.get(timeout=120) for _ in requests), key=lambda r: r.request.index)
    finally:
        engine.stop()
    rewards = [float(k % 2) for k in range(len(results))]
    advantages = [2 * r - 1 for r in rewards]  # GRPO's +-1 for a group of two with rewards 0 and 1
    return [
        common_pb2.Sample(
            group_index=r.request.prompt_key,
            index=r.request.index,
            prompt_token_ids=r.request.prompt_token_ids,
            response_token_ids=r.token_ids,
            loss_mask=[1] * len(r.token_ids),
            rollout_log_probs=r.log_probs,
            reward=rewards[k],
            raw_reward=rewards[k],
            advantages=[float(advantages[k])] * len(r.token_ids),
        )
        for k, r in enumerate(results)
    ]


def train_step(stub, step_id: int, samples) -> dict[str, float]:
    header = pb.TrainStepHeader(step_id=step_id, num_samples=len(samples))
    requests = [
        pb.TrainStepRequest(header=header),
        pb.TrainStepRequest(samples=pb.SampleChunk(samples=samples)),
    ]
    return dict(stub.TrainStep(iter(requests)).metrics)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return make_gpt2_model(tmp_path_factory.mktemp("gpt2-dropout"))


def test_training_log_probs_equal_the_rollout_engines_unless_dropout_is_kept(gpt2_dir, tmp_path):
    samples = rollout_samples(gpt2_dir)
    assert all(len(s.response_token_ids) > 0 for s in samples)
    args = ["--hf-checkpoint", str(gpt2_dir), "--dtype", "float32", "--loss-type", "policy_loss"]
    with ServiceProcess("trainer", args, tmp_path) as trainer, open_channel(trainer.address) as channel:
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        stub.Init(pb.InitRequest(run_id="dropout-off", config=struct({"lr": 0.0})))
        metrics = train_step(stub, 0, samples)
        # Step 0: the trainer's training forward is the engine's policy (fp32, no dropout).
        assert metrics["train/train_rollout_kl"] < 1e-9
        assert metrics["train/train_rollout_logprob_abs_diff"] < 1e-5
        assert metrics["train/pg_clipfrac"] == 0.0
        assert "keep_dropout" not in trainer.log_text()

        stub.EndRun(pb.EndRunRequest(run_id="dropout-off"))
        stub.Init(pb.InitRequest(run_id="dropout-kept", config=struct({"lr": 0.0, "keep_dropout": True})))
        kept = train_step(stub, 0, samples)
        # Dropout 0.1 perturbs every training forward: the trained policy is not the sampled one.
        assert kept["train/train_rollout_kl"] > 1e-3
        assert kept["train/train_rollout_logprob_abs_diff"] > 1e-2
        stub.Init(pb.InitRequest(run_id="dropout-kept", config=struct({"lr": 0.0, "keep_dropout": True})))
        train_step(stub, 1, samples)
        assert trainer.log_text().count("keep_dropout: training with dropout") == 1
