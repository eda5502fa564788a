"""The memory model's coefficients (plan/memory.py): every one a named constant with where it comes
from. Calibrating the model against measured peaks (issue #26, bench/bench_memory_plan.py) edits
these, not the formulas."""

from __future__ import annotations

GIB = 1024**3

# --- coefficients (bytes, or elements per token) ---------------------------------------------
# Trainer parameters are fp32 masters whatever --dtype is (trainer/sharding.py: MixedPrecisionPolicy
# casts them for compute), and so are their gradients (reduce_dtype float32).
MASTER_BYTES = 4
GRAD_BYTES = 4
# torch.optim.AdamW keeps exp_avg and exp_avg_sq, each like its fp32 parameter (trainer/optimizer.py).
ADAMW_STATES = 2
# The reference model is loaded fp32 (trainer/reference.py -> model_loading.load_model), frozen.
REFERENCE_BYTES = 4
# Activations kept for backward, per token and decoder layer, without gradient checkpointing, in
# elements of the compute dtype. Counted tensor by tensor (autograd's saved tensors of the trainer's
# forward, one- and three-layer Qwen3, Llama and Gemma models, 2026-11-28): the MLP keeps 4
# intermediate-sized tensors (gate, up, act(gate), act*up); the attention keeps q after RoPE, the
# attention output and o_proj's input (3 of the q width, heads x head_dim, which is 2x hidden in
# Qwen3-0.6B but 1x in SmolLM2) and k and v (2 of the KV width); Qwen3's per-head q/k RMSNorm keeps
# its input and output of each (2 more of each width); the rest are hidden-sized (the two RMSNorms'
# inputs and outputs, the residual adds). Counting q and KV at their own widths is what carries
# the formula from Qwen3 (q wider than hidden) to Llama and Gemma shapes: the old count, 10 hidden
# + 4 intermediate, fitted on Qwen3 alone, put Qwen3's attention widths into "hidden".
ACTIVATION_HIDDEN_TENSORS = 7
ACTIVATION_Q_TENSORS = 3
ACTIVATION_KV_TENSORS = 2
ACTIVATION_QK_NORM_TENSORS = 2  # of each of q and k, where the model normalises them (Qwen3)
ACTIVATION_INTERMEDIATE_TENSORS = 4
# With gradient checkpointing a layer keeps only its input (one hidden-sized tensor); one layer's
# full activations exist again while it is recomputed in backward.
CHECKPOINTED_HIDDEN_TENSORS = 1
# TiledMLP (trainer/tiled_mlp.py, as ALST) keeps only the MLP's input; its intermediates exist for
# one tile at a time, recomputed in backward.
TILED_MLP_HIDDEN_TENSORS = 1
# The logits term, per target position (the trainer computes logits only where a response token
# is predicted: micro_batch.py's logit_columns, so prompts cost no logits) and vocabulary entry:
# the logits in the compute dtype and their fp32 log-softmax, kept for backward
# (trainer/log_probs.py: chunked, but every chunk's output is kept), then in backward the logits'
# gradient in the compute dtype: 2 x dtype + 4 bytes. LOGITS_EXTRA_BYTES is what the peaks measured
# beyond that: backward's gather and log-softmax gradients ([chunk, vocab] each, fp32) overlap that
# for part of the step (a one-layer model's forward+backward peaked 8 bytes per entry above its
# forward's, 2026-11-28). 2 is the fit over the 21 fp32 rows of Qwen3, SmolLM2 and the Gemma-like
# shape (bench memory_plan, 2026-11-28: 14 bytes in all; 12 left SmolLM2 at 4096 tokens -8%, 16
# put the Gemma-like shape, a 256,000-entry vocabulary, +18% at 1024 tokens).
LOGITS_DTYPE_COPIES = 2
LOGITS_FP32_BYTES = 4
LOGITS_EXTRA_BYTES = 2
# Measured beyond weights + gradients + AdamW per trainable parameter at the step's peak: the
# fused AdamW and foreach clip_grad_norm_ passes, FSDP's gradient copy, and the free blocks malloc
# keeps (peak RSS counts them). Fitted (bench memory_plan, 2026-11-26) as the intercept of the peak
# at two token counts, less 16 bytes per parameter and the runtime: 6.3 bytes on the 12-layer
# Qwen3-0.6B cut (512 and 1024 tokens), 7.8 on the small preset (512 and 2048); refitted
# (2026-11-28) with the wider Qwen3 layer count and the targets-only logits above, on the Qwen3,
# SmolLM2 and Gemma-like rows together: 6 (7 put the 28-layer cut +10%).
STEP_TRANSIENT_BYTES = 6
# The same with bf16 compute (fp32 masters): 3.2 bytes less per parameter on the 12-layer cut and
# 3.4 on the 28-layer one (full fine-tuning, 64 tokens, bench memory_plan 2026-11-26).
STEP_TRANSIENT_BYTES_BF16 = 4
# LoRA, fitted (bench memory_plan, 2026-11-26 and 2026-11-28) on the 12- and 28-layer Qwen3-0.6B
# cuts, SmolLM2 and the Gemma-like shape, with and without gradient checkpointing (rank 16 on every
# linear, 512-2048 tokens): the step's peak is LORA_ACTIVATION_FACTOR x the activations (layers and
# logits) the formulas above give for full fine-tuning, LORA_CHECKPOINTED_FACTOR x with gradient
# checkpointing, plus LORA_FROZEN_STEP_BYTES per frozen parameter. SmolLM2 with checkpointing grew
# 1.55 GiB from 1024 to 2048 tokens, 2.3x the formula's slope: the cause is measured, not
# established (peft's adapter path - A, B, the scaled add - keeps its own tensors per adapted
# linear, and under checkpointing they are recomputed beside the logits' gradients).
LORA_ACTIVATION_FACTOR = 1.75
LORA_CHECKPOINTED_FACTOR = 2.5
LORA_FROZEN_STEP_BYTES = 0.7
# At load rank 0 holds the checkpoint's full fp32 state dict while its shards are filled.
LOAD_FULL_COPY_BYTES = 4
# async_save (trainer/async_save.py) copies each rank's model and optimizer state dicts before
# writing them in the background, and the copy lives through the next step: every fp32 weight and
# the AdamW state of the trainable ones once more (checkpoint.stage clones every tensor).
ASYNC_SAVE_STAGED_COPIES = 1
# Memory of a process before any model: Python, torch, transformers, gRPC (measured on this project's
# services at start-up, ~0.5 GiB RSS for a torch service, ~0.3 GiB for the dataloader with its
# tokenizer and the coordinator): a round guess until calibrated.
TORCH_PROCESS_OVERHEAD = int(0.5 * GIB)
# The trainer service's, measured: peak RSS 0.44 GiB training the ~1M tiny preset (512 tokens),
# 0.38 GiB after loading it (bench memory_plan, 2026-11-26).
TRAINER_PROCESS_OVERHEAD = int(0.4 * GIB)
LIGHT_PROCESS_OVERHEAD = int(0.3 * GIB)
# The rollout service (hf engine), measured (bench memory_plan's rollout rows, 2026-11-26): 0.38 GiB
# with the tiny preset loaded and generating.
ROLLOUT_PROCESS_OVERHEAD = int(0.38 * GIB)
# A real SGLang CPU server (0.5.23, the CPU route: deploy/sglang-cpu) is three processes - the
# launcher with its tokenizer, the scheduler that holds the model and the KV pool, the
# detokenizer - each with Python, torch and SGLang imported: their summed peak RSS less the
# model's weights and the KV pool (--max-total-tokens x the KV bytes of a token): 1.95 GiB with the
# ~1M tiny preset (bench memory_plan's sglang rows, 2026-11-28). The servers peak while the model
# loads (SmolLM2's 3.10 GiB was reached before the first request): the checkpoint's mapped pages
# are resident beside the loaded weights then, one more copy of the weights at most
# (SGLANG_LOAD_COPIES; SmolLM2's row is then +6.6%).
SGLANG_CPU_RUNTIME = int(1.95 * GIB)
SGLANG_LOAD_COPIES = 1
# The hf engine prefills the prompts it admits together in forwards of at most this many tokens
# (rollout/engines/hf_batcher.py MAX_PREFILL_TOKENS): an eval set of 200 64-token prompts is one
# 12,800-token forward. Inference keeps one layer's tensors at a time: the MLP's gate, up,
# act(gate) and product (intermediate-sized), the norm output and the residual (hidden), q, k and
# v. SmolLM2's eval row peaked 0.62 GiB above weights + KV + runtime, the Gemma-like one 1.15
# (bench memory_plan, 2026-11-28); this term and the sampling one below explain both within 10%.
PREFILL_FORWARD_TOKENS = 16384
PREFILL_INTERMEDIATE_TENSORS = 4
PREFILL_HIDDEN_TENSORS = 2
# Sampling a token for each running sample (rollout/sampling.py): the model's last-position
# logits and their fp32 copies - scaled by the temperature, the log-softmax, and for sampled rows
# the probabilities and their CDF - [running, vocabulary] each: 16 bytes per entry (4 copies).
SAMPLING_BYTES_PER_ENTRY = 16
# The rollout's KV cache when neither rollout_max_context_len nor rollout_max_prompt_len bounds a
# sample: this many prompt tokens are assumed before the response (the plan says so).
ASSUMED_PROMPT_TOKENS = 512
# Fraction of the budget the plan lets a run use: the kernel, page cache and allocator slack need
# the rest.
USABLE_FRACTION = 0.9

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
