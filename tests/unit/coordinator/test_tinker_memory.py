"""The gateway's estimate of what one more LoRA tenant adds to a shared trainer (tinker/memory.py):
5 fp32 copies (weights, gradients, AdamW's two moments, the copy kept while another tenant's are
live) of exactly the adapter parameters peft injects for all-linear."""

from __future__ import annotations

import transformers
from peft import LoraConfig, inject_adapter_in_model

from rollway.coordinator.tinker.memory import adapter_bytes, trainer_bytes


def test_the_adapter_estimate_counts_the_parameters_peft_injects(tiny_model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    inject_adapter_in_model(LoraConfig(r=8, target_modules="all-linear"), model)
    num_adapter_parameters = sum(p.numel() for name, p in model.named_parameters() if ".lora_" in name)
    assert adapter_bytes(tiny_model_dir, 8) == num_adapter_parameters * 4 * 5
    assert adapter_bytes(tiny_model_dir, 8) < trainer_bytes(tiny_model_dir, 8) / 2  # a share, not a model
