"""The gateway's memory estimates (tinker/memory.py): a trainer is the run planner's trainer rank
(one home for the formula), and what one more LoRA tenant adds to a shared trainer is 5 fp32
copies (weights, gradients, AdamW's two moments, the copy kept while another tenant's are live)
of exactly the adapter parameters peft injects for all-linear."""

from __future__ import annotations

import transformers
from peft import LoraConfig, inject_adapter_in_model

from rollway.coordinator.plan.memory import trainer_rank_memory
from rollway.coordinator.plan.shape import read_model_shape
from rollway.gateway.memory import adapter_bytes, trainer_bytes
from rollway.trainer.config import TrainerConfig


def test_the_adapter_estimate_counts_the_parameters_peft_injects(tiny_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_adapter_in_model(LoraConfig(r=8, target_modules="all-linear"), model)
    num_adapter_parameters = sum(p.numel() for name, p in model.named_parameters() if ".lora_" in name)
    assert adapter_bytes(tiny_model_dir, 8) == num_adapter_parameters * 4 * 5
    assert adapter_bytes(tiny_model_dir, 8) < trainer_bytes(tiny_model_dir, 8) / 2  # a share, not a model


def test_a_trainer_is_estimated_as_the_run_planner_plans_one_rank_of_it(tiny_model_dir):
    shape = read_model_shape(str(tiny_model_dir))
    for lora_rank, dtype in ((0, "float32"), (8, "float32"), (0, "bfloat16")):
        trainer = TrainerConfig(
            hf_checkpoint=str(tiny_model_dir), world_size=1, dtype=dtype, lora_rank=lora_rank
        )
        planned = trainer_rank_memory(shape, trainer, trainer.max_tokens_per_gpu, on_gpu=False)
        assert trainer_bytes(tiny_model_dir, lora_rank, dtype) == planned.peak, (lora_rank, dtype)
    # Full fine-tuning holds at least fp32 weights, gradients and AdamW's two moments.
    assert trainer_bytes(tiny_model_dir, 0) >= 16 * shape.num_params
