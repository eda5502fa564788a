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
# elements of the compute dtype: ~10 hidden-sized tensors (norm inputs and outputs, q/k/v and the
# attention output, residuals) plus 4 intermediate-sized ones (gate, up, act(gate), act*up) of the
# MLP. Counted from HF's Qwen3/Llama decoder layer; it matches the one measurement of issue #26 (the
# 12-layer Qwen3-0.6B cut, fp32: ~2.8 MiB per token with the logits term) within ~10%.
ACTIVATION_HIDDEN_TENSORS = 10
ACTIVATION_INTERMEDIATE_TENSORS = 4
# With gradient checkpointing a layer keeps only its input (one hidden-sized tensor); one layer's
# full activations exist again while it is recomputed in backward.
CHECKPOINTED_HIDDEN_TENSORS = 1
# TiledMLP (trainer/tiled_mlp.py, as ALST) keeps only the MLP's input; its intermediates exist for
# one tile at a time, recomputed in backward.
TILED_MLP_HIDDEN_TENSORS = 1
# The logits term, per token and vocabulary entry: the logits in the compute dtype, their fp32
# log-softmax kept by autograd (trainer/log_probs.py, chunked but every chunk kept for backward) and
# the logits' gradient in the compute dtype: 2 x dtype + 4 bytes.
LOGITS_DTYPE_COPIES = 2
LOGITS_FP32_BYTES = 4
# Measured beyond weights + gradients + AdamW per trainable parameter at the step's peak: the
# fused AdamW and foreach clip_grad_norm_ passes, FSDP's gradient copy, and the free blocks malloc
# keeps (peak RSS counts them). Fitted (bench memory_plan, 2026-11-26) as the intercept of the peak
# at two token counts, less 16 bytes per parameter and the runtime: 6.3 bytes on the 12-layer
# Qwen3-0.6B cut (512 and 1024 tokens), 7.8 on the small preset (512 and 2048).
STEP_TRANSIENT_BYTES = 7
# The same with bf16 compute (fp32 masters): 3.2 bytes less per parameter on the 12-layer cut and
# 3.4 on the 28-layer one (full fine-tuning, 64 tokens, bench memory_plan 2026-11-26).
STEP_TRANSIENT_BYTES_BF16 = 4
# LoRA, fitted (bench memory_plan, 2026-11-26) on the 12- and 28-layer Qwen3-0.6B cuts with and
# without gradient checkpointing (rank 16 on every linear, 512 tokens): the step's peak is
# LoRA_ACTIVATION_FACTOR x the activations the formula above gives for full fine-tuning plus
# LORA_FROZEN_STEP_BYTES per frozen parameter (the four points leave 0.7 B and a factor of 1.9 to
# 2.2). The cause is measured, not established: peft's adapter path (dropout, A, B, the scaled
# add) keeps its own input and output of each of the seven adapted linears per layer for backward.
LORA_ACTIVATION_FACTOR = 2
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
    shape: ModelShape, trainer, tokens: int, on_gpu: bool, async_save: bool = False
) -> ServiceMemory:
    """One trainer rank at the peak of a step: its FSDP shard of the fp32 masters, gradients and
    AdamW state (trainable parameters only), the reference, and the activations of `tokens`;
    with `async_save`, the staged copy of a checkpoint being written meanwhile."""
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
    per_token = activation_bytes_per_token(shape, dtype, trainer.gradient_checkpointing, trainer.tiled_mlp)
    recompute = recompute_bytes(shape, dtype, tokens) if trainer.gradient_checkpointing else 0
    activations = per_token * tokens + recompute
    if trainer.lora_rank:
        activations *= LORA_ACTIVATION_FACTOR
    components[f"activations ({tokens} tokens)"] = activations
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


def activation_bytes_per_token(shape: ModelShape, dtype: str, checkpointing: bool, tiled_mlp: bool) -> int:
    """Bytes one token of a micro-batch keeps for backward: every layer's share plus the logits'."""
    if checkpointing:
        per_layer = CHECKPOINTED_HIDDEN_TENSORS * shape.hidden_size
    else:
        mlp = (
            TILED_MLP_HIDDEN_TENSORS * shape.hidden_size
            if tiled_mlp
            else ACTIVATION_INTERMEDIATE_TENSORS * shape.intermediate_size
        )
        per_layer = ACTIVATION_HIDDEN_TENSORS * shape.hidden_size + mlp
    logits = shape.vocab_size * (LOGITS_DTYPE_COPIES * DTYPE_BYTES[dtype] + LOGITS_FP32_BYTES)
    return shape.num_layers * per_layer * DTYPE_BYTES[dtype] + logits


def recompute_bytes(shape: ModelShape, dtype: str, tokens: int) -> int:
    """Checkpointing recomputes one layer at a time: its full activations, for the whole micro-batch."""
    mlp = ACTIVATION_INTERMEDIATE_TENSORS * shape.intermediate_size
    full_layer = ACTIVATION_HIDDEN_TENSORS * shape.hidden_size + mlp
    return full_layer * tokens * DTYPE_BYTES[dtype]


def rollout_memory(
    shape: ModelShape, rollout, max_samples: int, sample_tokens: int, on_gpu: bool
) -> ServiceMemory:
    """The rollout engine: the weights in --dtype and a KV cache for the samples decoded together."""
    dtype = resolve_dtype(rollout.dtype, on_gpu and rollout.device in ("auto", "cuda"))
    running = min(rollout.max_running_requests, max_samples) if max_samples else rollout.max_running_requests
    kv_tokens = running * sample_tokens
    components = {
        f"engine weights ({dtype})": shape.num_params * DTYPE_BYTES[dtype],
        f"KV cache ({running} samples x {sample_tokens} tokens)": shape.kv_bytes_per_token
        * DTYPE_BYTES[dtype]
        * kv_tokens,
        "runtime (torch, gRPC)": ROLLOUT_PROCESS_OVERHEAD,
    }
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
    notes = []
    if rollout.rollout_engine == "sglang" and not sglang_on_cpu(rollout):  # (#37: said on a CPU run)
        notes.append(
            f"sglang takes sglang_mem_fraction_static {rollout.sglang_mem_fraction_static} of its GPU"
        )
    return ServiceMemory("rollout", components, notes=notes)


def sglang_on_cpu(rollout) -> bool:
    """The sglang servers are launched on the CPU (rollout/engines/sglang_cpu.py's settings)."""
    args = list(rollout.sglang_extra_args)
    on_cpu_device = any(a == "--device" and args[i + 1 : i + 2] == ["cpu"] for i, a in enumerate(args))
    return on_cpu_device or "--device=cpu" in args or "SGLANG_USE_CPU_ENGINE=1" in rollout.sglang_env


@dataclass
class MemoryPlan:
    """A run's predicted memory on the machine that starts its services."""

    services: list[ServiceMemory]
    budget: int  # bytes the run may use (USABLE_FRACTION of the machine's or the given memory)
    tokens: int  # the trainer's micro-batch token budget the plan is for
    max_tokens: int | None  # the largest micro-batch token budget that fits (None: no trainer)
    notes: list[str] = field(default_factory=list)
    on_gpu: bool = False

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
        out.append(rollout_memory(shape, r, c.samples_per_rollout, sample, on_gpu))
    max_tokens = None
    if "trainer" in services:
        tokens = micro_batch_tokens(configs)
        out.append(trainer_rank_memory(shape, t, tokens, on_gpu, c.async_save))
        max_tokens = largest_micro_batch(shape, configs, out, usable, on_gpu)
    for s in out:
        notes.extend(s.notes)
    return MemoryPlan(out, usable, micro_batch_tokens(configs), max_tokens, notes, on_gpu)


def micro_batch_tokens(configs: dict[str, object]) -> int:
    """The most tokens one micro-batch of a rank holds: the token budget (dynamic batching), or
    its fixed number of samples times the longest sample the data settings allow."""
    c, d, t = configs["coordinator"], configs["dataloader"], configs["trainer"]
    if t.dynamic_batching:
        return t.max_tokens_per_gpu
    prompt = d.rollout_max_prompt_len or ASSUMED_PROMPT_TOKENS
    longest = prompt if c.is_sft else prompt + c.rollout_max_response_len
    return t.samples_per_micro_batch * longest


def largest_micro_batch(
    shape: ModelShape, configs, services: list[ServiceMemory], usable: int, on_gpu: bool
) -> int:
    """The largest micro-batch token budget (a multiple of pad_to_multiple) whose plan fits `usable`
    bytes: the peak grows linearly with it, once per trainer rank; 0 when none does."""
    t = configs["trainer"]
    best, step = 0, max(t.pad_to_multiple, 1)
    low, high = 0, 1 << 24  # tokens, in units of `step`
    others = sum(s.peak * s.count for s in services if s.name != "trainer rank")

    def total(tokens: int) -> int:
        rank = trainer_rank_memory(shape, t, tokens, on_gpu, configs["coordinator"].async_save)
        return others + rank.peak * rank.count

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
