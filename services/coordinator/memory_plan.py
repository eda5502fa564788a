"""The memory a run will need, predicted before it starts, from the model's config.json (never its
weights) and the run's settings: per service and trainer rank, the expected peak by component.

    config.json -> ModelShape (model_shape.py: parameters counted from the decoder's shapes)
    run settings -> trainer rank: weights, grads, AdamW, reference, activations(tokens)
                    rollout:      engine weights, KV cache
                    every process: a fixed runtime overhead

Every coefficient is a named constant below with where it comes from: calibrating the model
against measured peaks (issue #26) edits the constants, not the formulas. No torch here, so
`rollway plan` and `rollway run`'s check stay instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rollway.coordinator.config import EVAL_PAGES_IN_FLIGHT
from rollway.coordinator.model_shape import ModelShape, read_model_shape

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


def resolve_dtype(name: str, on_gpu: bool) -> str:
    """--dtype as the services resolve it (auto: bfloat16 on CUDA, float32 on CPU)."""
    return ("bfloat16" if on_gpu else "float32") if name == "auto" else name


@dataclass
class ServiceMemory:
    """One process's predicted peak, by component (bytes)."""

    name: str
    components: dict[str, int]
    count: int = 1  # processes like it (trainer ranks)
    notes: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return sum(self.components.values())


def trainer_rank_memory(
    shape: ModelShape,
    trainer,
    tokens: int,
    on_gpu: bool,
    async_save: bool = False,
    targets: int | None = None,
) -> ServiceMemory:
    """One trainer rank at the peak of a step: its FSDP shard of the fp32 masters, gradients and
    AdamW state (trainable parameters only), the reference, and the activations of a micro-batch
    of `tokens` of which `targets` (default: all) predict a response token and get logits; with
    `async_save`, the staged copy of a checkpoint being written meanwhile."""
    world = max(trainer.world_size, 1)
    dtype = resolve_dtype(trainer.dtype, on_gpu)
    trainable = lora_params(shape, trainer.lora_rank, trainer.lora_target_modules)
    total = shape.num_params + trainable if trainer.lora_rank else shape.num_params
    where = " (host: fsdp_cpu_offload)" if trainer.fsdp_cpu_offload and on_gpu else ""
    trained = "LoRA adapters" if trainer.lora_rank else "all"
    components = {
        f"weights (fp32 masters, 1/{world}){where}": total * MASTER_BYTES // world,
        f"gradients (fp32, {trained}){where}": trainable * GRAD_BYTES // world,
        f"AdamW state ({ADAMW_STATES} x fp32){where}": trainable * ADAMW_STATES * MASTER_BYTES // world,
    }
    if dtype != "float32" or world > 1:  # the gathered compute copy of the largest FSDP unit
        unit = max(shape.vocab_size * shape.hidden_size, shape.num_params // max(shape.num_layers, 1))
        components[f"gathered {dtype} unit"] = unit * DTYPE_BYTES[dtype]
    if async_save:
        staged = (total + trainable * ADAMW_STATES) * MASTER_BYTES * ASYNC_SAVE_STAGED_COPIES
        components["async_save staged copy (weights + AdamW, fp32)"] = staged // world
    if uses_reference(trainer):
        components["reference model (fp32, 1/world, host)"] = shape.num_params * REFERENCE_BYTES // world
    targets = tokens if targets is None else min(targets, tokens)
    per_token = layer_activation_bytes_per_token(
        shape, dtype, trainer.gradient_checkpointing, trainer.tiled_mlp
    )
    recompute = recompute_bytes(shape, dtype, tokens) if trainer.gradient_checkpointing else 0
    activations = per_token * tokens + recompute + logits_bytes_per_target(shape, dtype) * targets
    if trainer.lora_rank:
        factor = LORA_CHECKPOINTED_FACTOR if trainer.gradient_checkpointing else LORA_ACTIVATION_FACTOR
        activations = int(activations * factor)
    components[f"activations ({tokens} tokens, logits at {targets})"] = activations
    frozen = total - trainable if trainer.lora_rank else 0
    components["step transients (optimizer, allocator)"] = step_transient_bytes(trainable, frozen, dtype)
    components["runtime (torch, gRPC)"] = TRAINER_PROCESS_OVERHEAD
    above = load_peak_bytes(total, world) - sum(components.values())
    if above > 0:  # LoRA: the load's two copies outweigh the step (peak RSS never comes down)
        components["model load (rank 0: checkpoint + shards)"] = above
    notes = []
    if trainer.fsdp_cpu_offload and not on_gpu:
        notes.append("fsdp_cpu_offload does nothing on CPU: everything is host memory here")
    return ServiceMemory("trainer rank", components, count=world, notes=notes)


def step_transient_bytes(trainable: int, frozen: int = 0, dtype: str = "float32") -> int:
    """What a step holds beyond its states and activations, measured per trainable parameter
    (the fused AdamW and gradient-clipping passes, the gradient's reduce copy, malloc's retained
    free blocks; measured lower with bf16 compute, cause not established) and, with LoRA,
    per frozen one."""
    per_param = STEP_TRANSIENT_BYTES if dtype == "float32" else STEP_TRANSIENT_BYTES_BF16
    return trainable * per_param + int(frozen * LORA_FROZEN_STEP_BYTES)


def load_peak_bytes(params: int, world: int) -> int:
    """Rank 0 at start-up: the checkpoint's full fp32 state dict next to its own fp32 shard,
    plus the runtime (model_loading.py, sharding.py: freed after set_model_state_dict)."""
    return params * LOAD_FULL_COPY_BYTES + params * MASTER_BYTES // world + TRAINER_PROCESS_OVERHEAD


def uses_reference(trainer) -> bool:
    """A separate reference model is built (KL as a loss or a reward penalty, not LoRA's own base)."""
    kl = trainer.use_kl_loss or bool(trainer.kl_coef)
    return kl and not (trainer.lora_rank and not trainer.ref_load)


def lora_params(shape: ModelShape, rank: int, targets: list[str]) -> int:
    """Trainable parameters: every parameter, or with LoRA the adapters (A: r x in, B: out x r) of
    the targeted linears (all-linear: q, k, v, o, gate, up, down)."""
    if not rank:
        return shape.num_params
    h, q, kv, i = (
        shape.hidden_size,
        shape.num_heads * shape.head_dim,
        shape.num_kv_heads * shape.head_dim,
        shape.intermediate_size,
    )
    linears = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    chosen = linears if "all-linear" in targets else {k: v for k, v in linears.items() if k in targets}
    return shape.num_layers * sum(rank * (n_in + n_out) for n_in, n_out in chosen.values())


def layer_elements_per_token(shape: ModelShape) -> int:
    """Elements one decoder layer keeps per token for backward (no checkpointing, no tiling)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    attention = ACTIVATION_Q_TENSORS * q + ACTIVATION_KV_TENSORS * kv
    if shape.qk_norm:
        attention += ACTIVATION_QK_NORM_TENSORS * (q + kv)
    mlp = ACTIVATION_INTERMEDIATE_TENSORS * shape.intermediate_size
    return ACTIVATION_HIDDEN_TENSORS * shape.hidden_size + attention + mlp


def layer_activation_bytes_per_token(
    shape: ModelShape, dtype: str, checkpointing: bool, tiled_mlp: bool
) -> int:
    """Bytes one token of a micro-batch keeps for backward in the decoder layers."""
    if checkpointing:
        per_layer = CHECKPOINTED_HIDDEN_TENSORS * shape.hidden_size
    elif tiled_mlp:
        mlp = ACTIVATION_INTERMEDIATE_TENSORS * shape.intermediate_size
        per_layer = layer_elements_per_token(shape) - mlp + TILED_MLP_HIDDEN_TENSORS * shape.hidden_size
    else:
        per_layer = layer_elements_per_token(shape)
    return shape.num_layers * per_layer * DTYPE_BYTES[dtype]


def logits_bytes_per_target(shape: ModelShape, dtype: str) -> int:
    """Bytes the logits and their log-softmax cost at one target position, at the step's peak."""
    per_entry = LOGITS_DTYPE_COPIES * DTYPE_BYTES[dtype] + LOGITS_FP32_BYTES + LOGITS_EXTRA_BYTES
    return shape.vocab_size * per_entry


def activation_bytes_per_token(
    shape: ModelShape, dtype: str, checkpointing: bool, tiled_mlp: bool, target_fraction: float = 1.0
) -> int:
    """Bytes one token of a micro-batch keeps for backward: every layer's share plus the logits',
    where `target_fraction` of the tokens predict a response token."""
    layers = layer_activation_bytes_per_token(shape, dtype, checkpointing, tiled_mlp)
    return layers + int(logits_bytes_per_target(shape, dtype) * target_fraction)


def recompute_bytes(shape: ModelShape, dtype: str, tokens: int) -> int:
    """Checkpointing recomputes one layer at a time: its full activations, for the whole micro-batch."""
    return layer_elements_per_token(shape) * tokens * DTYPE_BYTES[dtype]


def rollout_memory(
    shape: ModelShape,
    rollout,
    max_samples: int,
    sample_tokens: int,
    on_gpu: bool,
    eval_samples: int = 0,
    prompts: int = 1,
    prompt_tokens: int = 0,
) -> ServiceMemory:
    """The rollout engine: the weights in --dtype and a KV cache for the samples decoded together:
    a rollout's `max_samples`, or an eval's `eval_samples` in flight where more (its pages of
    eval_batch_size prompts, admitted together up to max_running_requests); the prefill
    of `prompts` distinct prompts of `prompt_tokens` admitted together, and the sampling of every
    running sample's next token. With the sglang engine the model lives in its servers
    (sglang_server_memory), not in this process."""
    if rollout.rollout_engine == "sglang":
        notes = []
        if on_gpu:
            notes.append(
                f"sglang takes sglang_mem_fraction_static {rollout.sglang_mem_fraction_static} of its GPU"
            )
        return ServiceMemory("rollout", {"runtime (torch, gRPC)": ROLLOUT_PROCESS_OVERHEAD}, notes=notes)
    dtype = resolve_dtype(rollout.dtype, on_gpu and rollout.device in ("auto", "cuda"))
    batch = max(max_samples, eval_samples)
    running = min(rollout.max_running_requests, batch) if batch else rollout.max_running_requests
    kv_tokens = running * sample_tokens
    which = ", the eval set" if eval_samples > max_samples and running > max_samples else ""
    components = {
        f"engine weights ({dtype})": shape.num_params * DTYPE_BYTES[dtype],
        f"KV cache ({running} samples x {sample_tokens} tokens{which})": shape.kv_bytes_per_token
        * DTYPE_BYTES[dtype]
        * kv_tokens,
        "runtime (torch, gRPC)": ROLLOUT_PROCESS_OVERHEAD,
    }
    prefill = min(PREFILL_FORWARD_TOKENS, min(prompts, running) * prompt_tokens)
    if prefill:
        components[f"prefill ({prefill} prompt tokens in one forward)"] = (
            prefill * prefill_elements_per_token(shape) * DTYPE_BYTES[dtype]
        )
    components[f"sampling ({running} x {shape.vocab_size} logits)"] = (
        running * shape.vocab_size * SAMPLING_BYTES_PER_ENTRY
    )
    # Loading a checkpoint stored in another dtype (Qwen3 ships bf16; the CPU engine runs fp32), the
    # checkpoint's mapped pages are resident beside the converted weights until the load ends:
    # the 12-layer Qwen3-0.6B cut peaked 0.53 GiB above weights + KV + runtime, its bf16 file
    # is 0.64 GiB (bench memory_plan, 2026-11-26). A KV cache larger than that is the peak instead.
    stored = DTYPE_BYTES.get(shape.stored_dtype, 0) if shape.stored_dtype != dtype else 0
    kv = components[next(k for k in components if k.startswith("KV cache"))]
    if shape.num_params * stored > kv:
        components[f"load: {shape.stored_dtype} checkpoint pages beyond the KV cache"] = (
            shape.num_params * stored - kv
        )
    return ServiceMemory("rollout", components)


def prefill_elements_per_token(shape: ModelShape) -> int:
    """Elements one prompt token holds in the layer being prefilled (inference: one at a time)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    mlp = PREFILL_INTERMEDIATE_TENSORS * shape.intermediate_size
    return mlp + PREFILL_HIDDEN_TENSORS * shape.hidden_size + q + 2 * kv


def sglang_servers_launched(rollout) -> int:
    """SGLang servers the rollout service launches itself (none when given sglang_urls)."""
    if rollout.rollout_engine != "sglang" or rollout.sglang_urls:
        return 0
    return max(rollout.rollout_num_gpus // max(rollout.rollout_num_gpus_per_engine, 1), 1)


def sglang_max_total_tokens(rollout) -> int | None:
    """--max-total-tokens of sglang_extra_args (the KV pool's size in tokens), if given."""
    args = [part for arg in rollout.sglang_extra_args for part in str(arg).split()]
    for i, arg in enumerate(args):
        if arg == "--max-total-tokens" and i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
        if arg.startswith("--max-total-tokens=") and arg.split("=", 1)[1].isdigit():
            return int(arg.split("=", 1)[1])
    return None


def sglang_server_memory(shape: ModelShape, rollout, on_gpu: bool = False) -> ServiceMemory:
    """One SGLang server the rollout launches (its three processes): on a CPU, its runtime, the
    model in --dtype and its KV pool; on a GPU, the runtime only (the rest is GPU memory)."""
    servers = max(sglang_servers_launched(rollout), 1)
    components = {"runtime (3 processes: Python, torch, SGLang)": SGLANG_CPU_RUNTIME}
    notes = []
    if not on_gpu:
        dtype = resolve_dtype(rollout.dtype, False)
        components[f"weights ({dtype})"] = shape.num_params * DTYPE_BYTES[dtype]
        components["load: checkpoint pages beside the weights"] = (
            shape.num_params * DTYPE_BYTES[dtype] * SGLANG_LOAD_COPIES
        )
        pool = sglang_max_total_tokens(rollout)
        if pool is None:
            notes.append("sglang on CPU without --max-total-tokens sizes its KV pool from free memory")
        else:
            components[f"KV pool ({pool} tokens)"] = shape.kv_bytes_per_token * DTYPE_BYTES[dtype] * pool
    return ServiceMemory("sglang server", components, count=servers, notes=notes)


@dataclass
class MemoryPlan:
    """A run's predicted memory on the machine that starts its services."""

    services: list[ServiceMemory]
    budget: int  # bytes the run may use (USABLE_FRACTION of the machine's or the given memory)
    tokens: int  # the trainer's micro-batch token budget the plan is for
    max_tokens: int | None  # the largest micro-batch token budget that fits (None: no trainer)
    notes: list[str] = field(default_factory=list)
    on_gpu: bool = False
    step_tokens: int | None = None  # RL: the most tokens a step's samples put in a rank's rows

    @property
    def total(self) -> int:
        return sum(s.peak * s.count for s in self.services)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget


def plan_memory(
    configs: dict[str, object], budget: int, services: list[str], on_gpu: bool = False
) -> MemoryPlan:
    """The memory of the `services` a run starts here (all on one machine: a CPU run's view), for
    `budget` bytes of memory; ModelShapeError when the model's config is missing or unknown."""
    c, d, t, r = configs["coordinator"], configs["dataloader"], configs["trainer"], configs["rollout"]
    shape = read_model_shape(t.hf_checkpoint or r.hf_checkpoint)
    usable = int(budget * USABLE_FRACTION)
    out = [ServiceMemory("coordinator", {"runtime (gRPC)": LIGHT_PROCESS_OVERHEAD})]
    notes = [f"model: {shape.model_type}, {shape.num_params / 1e6:.1f}M parameters"]
    if on_gpu:
        notes.append(
            "a GPU is here: the sum is compared as if one memory; per-GPU placement is not modelled yet"
        )
    else:
        notes.append("CPU: every service and rank shares this machine's memory")
    if "dataloader" in services:
        out.append(ServiceMemory("dataloader", {"runtime (tokenizer, gRPC)": LIGHT_PROCESS_OVERHEAD}))
    if "rollout" in services:
        prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
        sample = r.rollout_max_context_len or prompt + c.rollout_max_response_len
        if not (r.rollout_max_context_len or d.rollout_max_prompt_len):
            notes.append(
                f"KV cache: prompts assumed of {ASSUMED_PROMPT_TOKENS} tokens (set rollout_max_prompt_len)"
            )
        evals = eval_samples(c, r)
        prompts = max(c.rollout_batch_size, evals // max(c.n_samples_per_eval_prompt, 1))
        out.append(rollout_memory(shape, r, c.samples_per_rollout, sample, on_gpu, evals, prompts, prompt))
        if sglang_servers_launched(r):
            out.append(sglang_server_memory(shape, r, on_gpu))
    max_tokens = step_tokens = None
    if "trainer" in services:
        tokens, targets = step_micro_batch(configs)
        out.append(trainer_rank_memory(shape, t, tokens, on_gpu, c.async_save, targets))
        max_tokens = largest_micro_batch(shape, configs, out, usable, on_gpu)
        step_tokens = None if c.is_sft else step_share(configs)[0]
    for s in out:
        notes.extend(s.notes)
    return MemoryPlan(
        out, usable, micro_batch_tokens(configs), max_tokens, notes, on_gpu=on_gpu, step_tokens=step_tokens
    )


def eval_samples(coordinator, rollout) -> int:
    """Samples an eval has in the engine at once: pages of eval_prompts_per_generate prompts,
    EVAL_PAGES_IN_FLIGHT of them generating together (evaluation.py), or the whole eval set where
    smaller (the eval files' lines where they are JSON lines, else as many as the engine admits)."""
    if not coordinator.eval_prompt_data or coordinator.train_only:
        return 0
    in_flight = EVAL_PAGES_IN_FLIGHT * coordinator.eval_prompts_per_generate
    prompts = 0
    for path in coordinator.eval_prompt_data[1::2]:
        try:
            with open(path, "rb") as lines:
                prompts += sum(1 for line in lines if line.strip())
        except OSError:
            prompts = in_flight
            break
        if not str(path).endswith((".jsonl", ".json")):
            prompts = in_flight
            break
    return min(prompts, in_flight) * coordinator.n_samples_per_eval_prompt


def micro_batch_tokens(configs: dict[str, object]) -> int:
    """The most tokens one micro-batch of a rank holds: the token budget (dynamic batching), or
    its fixed number of samples times the longest sample the data settings allow."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    if t.dynamic_batching:
        return t.max_tokens_per_gpu
    prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
    longest = prompt if c.is_sft else prompt + c.rollout_max_response_len
    return t.samples_per_micro_batch * longest


def step_micro_batch(configs: dict[str, object]) -> tuple[int, int]:
    """The tokens of a rank's largest micro-batch and its target positions (the tokens whose
    logits are computed). SFT: the token budget, every token a target (an upper bound: the plan
    knows neither the rows' lengths nor the share of assistant tokens). RL: the budget, but never
    more than one optimizer step's samples can fill (step_share: micro-batches are cut from one
    step's samples), with the responses' share of targets."""
    budget = micro_batch_tokens(configs)
    if configs["coordinator"].is_sft:
        return budget, budget
    row_tokens, targets = step_share(configs)
    tokens = min(budget, row_tokens)
    return tokens, tokens * targets // max(row_tokens, 1)


def step_share(configs: dict[str, object]) -> tuple[int, int]:
    """RL: the most tokens one optimizer step's samples put in a rank's rows, and their target
    positions: in a row a group's shared prompt is once (trainer: shared prefixes, sdpa and eager),
    and only the responses are targets. SmolLM2's GRPO at 4,096 tokens: 64 samples fill 2,816, and
    counting the whole budget predicted 10.7 GiB where 6.7 was measured (#37)."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
    response = c.rollout_max_response_len
    samples = -(-c.global_batch_size // max(t.world_size, 1))
    if t.attn_implementation in ("sdpa", "eager"):  # the trainer's SHARED_PREFIX_KERNELS
        groups = -(-samples // max(c.n_samples_per_prompt, 1))
        return groups * prompt + samples * response, samples * response
    return samples * (prompt + response), samples * response


def largest_micro_batch(
    shape: ModelShape, configs, services: list[ServiceMemory], usable: int, on_gpu: bool
) -> int:
    """The largest micro-batch token budget (a multiple of pad_to_multiple) whose plan fits `usable`
    bytes: the peak grows linearly with it, once per trainer rank; 0 when none does. In RL a budget
    beyond what a step's samples fill holds no more: when that fits, it is the answer."""
    t, c = configs["trainer"], configs["coordinator"]
    best, step = 0, max(t.pad_to_multiple, 1)
    others = sum(s.peak * s.count for s in services if s.name != "trainer rank")
    cap, targets = (None, None) if c.is_sft else step_share(configs)
    fraction = 1.0 if cap is None else targets / max(cap, 1)

    def total(tokens: int) -> int:  # a micro-batch of `tokens`, its targets as the step's share
        tokens = tokens if cap is None else min(tokens, cap)
        rank = trainer_rank_memory(shape, t, tokens, on_gpu, c.async_save, int(tokens * fraction))
        return others + rank.peak * rank.count

    if cap is not None and total(cap) <= usable:
        return -(-cap // step) * step
    low, high = 0, 1 << 24  # tokens, in units of `step`
    while low <= high:  # the peak is monotone in the token budget: bisect
        mid = (low + high) // 2
        if total(mid * step) <= usable:
            best, low = mid * step, mid + 1
        else:
            high = mid - 1
    return best


def available_memory() -> int:
    """Bytes of memory this machine can give a run now (MemAvailable; Linux), or 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def gpu_present() -> bool:
    """A CUDA GPU on this machine, seen without importing torch (the NVIDIA driver's /proc entry)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def memory_text(plan: MemoryPlan) -> str:
    """`rollway plan`'s memory table: each service's components in GiB, the total and the budget."""
    lines = ["memory (predicted peak, GiB)"]
    for s in plan.services:
        count = f" x {s.count}" if s.count > 1 else ""
        lines.append(f"  {s.name}{count}: {s.peak / GIB:.2f}")
        lines.extend(f"    {name:<44} {size / GIB:8.2f}" for name, size in s.components.items())
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(f"  total {plan.total / GIB:.2f} of {plan.budget / GIB:.2f} usable: {verdict}")
    if plan.max_tokens is not None:
        lines.append(
            f"  largest micro-batch that fits: {plan.max_tokens} tokens per rank "
            f"(the plan's micro-batch: {plan.tokens} tokens)"
        )
        if plan.step_tokens is not None and plan.step_tokens < plan.tokens:
            lines.append(
                f"  a step's samples fill at most {plan.step_tokens} tokens per rank: the plan counts "
                "those, a larger budget holds no more"
            )
    lines.extend(f"  note: {n}" for n in plan.notes)
    return "\n".join(lines)


def refusal(plan: MemoryPlan, configs: dict[str, object]) -> str:
    """Why a run that does not fit is refused: the numbers, and what would make it fit."""
    t = configs["trainer"]
    biggest = max(plan.services, key=lambda s: s.peak * s.count)
    advice = []
    if plan.max_tokens is not None and 0 < plan.max_tokens < plan.tokens:
        advice.append(f"--max-tokens-per-gpu {plan.max_tokens}")
    rollout = next((s for s in plan.services if s.name == "rollout"), None)
    if rollout and _part(rollout, "KV cache") > _part(rollout, "engine weights"):
        advice.append("a smaller --max-running-requests or rollout_max_prompt_len")
    if not t.gradient_checkpointing:
        advice.append("--gradient-checkpointing")
    if not t.lora_rank:
        advice.append("LoRA (--lora-rank 16)")
    # bf16 halves the weights everywhere, but on a CPU without native bf16 a step is ~18x slower
    # (docs/performance.md, the bf16 study): worth suggesting only where a GPU trains.
    if plan.on_gpu and t.dtype == "float32":
        advice.append("--dtype bfloat16")
    advice.append("--ignore-memory-plan to run anyway")
    return (
        f"the run needs {plan.total / GIB:.2f} GiB by the memory plan, {plan.budget / GIB:.2f} GiB usable here "
        f"(the largest part: {biggest.name} {biggest.peak / GIB:.2f} GiB"
        + (", even without activations)" if plan.max_tokens == 0 else ")")
        + f"; try {', '.join(advice)}"
    )


def _part(service: ServiceMemory, prefix: str) -> int:
    return sum(v for k, v in service.components.items() if k.startswith(prefix))


def services_started_here(configs: dict[str, object]) -> list[str]:
    """The services a local run starts on this machine: those it uses and gives no address for
    (launcher ray places them on its cluster: none here)."""
    from rollway.coordinator.run_config import RunConfig

    if configs["coordinator"].launcher != "local":
        return []
    run = RunConfig(**configs, given={})
    addresses = run.addresses()
    return [name for name in run.services_used() if not addresses.get(name)]


def default_micro_batch(plan: MemoryPlan, configs: dict[str, object], given: dict) -> int | None:
    """The token budget a run whose user left max_tokens_per_gpu unset gets when the default does
    not fit: the largest that fits, if it still holds the longest sample the data settings allow
    (a longer sample is refused by the trainer mid-run); None: keep the setting."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    if plan.fits or plan.max_tokens is None or not t.dynamic_batching:
        return None
    if {"max_tokens_per_gpu", "max-tokens-per-gpu"} & set(given):
        return None
    prompt = d.rollout_max_prompt_len
    longest = prompt if c.is_sft else prompt + c.rollout_max_response_len
    return plan.max_tokens if prompt and plan.max_tokens >= longest else None
