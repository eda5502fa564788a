"""The memory a run will need, predicted before it starts, from the model's config.json (never its
weights) and the run's settings: per service and trainer rank, the expected peak by component.

    config.json -> ModelShape (shape.py: parameters counted from the decoder's shapes)
    run settings -> trainer rank: weights, grads, AdamW, reference, activations(tokens)
                    rollout:      engine weights, KV cache
                    every process: a fixed runtime overhead

Every coefficient is a named constant in coefficients.py with where it comes from: calibrating
the model against measured peaks (issue #26) edits those, not the formulas. No torch here, so
`rollway plan` and `rollway run`'s check stay instant.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rollway.coordinator.config import EVAL_PAGES_IN_FLIGHT
from rollway.coordinator.plan.batch import micro_batch_tokens, step_micro_batch, step_share
from rollway.coordinator.plan.coefficients import (
    ACTIVATION_HIDDEN_TENSORS,
    ACTIVATION_INTERMEDIATE_TENSORS,
    ACTIVATION_KV_TENSORS,
    ACTIVATION_Q_TENSORS,
    ACTIVATION_QK_NORM_TENSORS,
    ADAMW_STATES,
    ASSUMED_PROMPT_TOKENS,
    ASYNC_SAVE_STAGED_COPIES,
    CHECKPOINTED_HIDDEN_TENSORS,
    DTYPE_BYTES,
    GRAD_BYTES,
    LIGHT_PROCESS_OVERHEAD,
    LOAD_FULL_COPY_BYTES,
    LOGITS_DTYPE_COPIES,
    LOGITS_EXTRA_BYTES,
    LOGITS_FP32_BYTES,
    LORA_ACTIVATION_FACTOR,
    LORA_CHECKPOINTED_FACTOR,
    LORA_FROZEN_STEP_BYTES,
    MASTER_BYTES,
    PREFILL_FORWARD_TOKENS,
    PREFILL_HIDDEN_TENSORS,
    PREFILL_INTERMEDIATE_TENSORS,
    REFERENCE_BYTES,
    ROLLOUT_PROCESS_OVERHEAD,
    SAMPLING_BYTES_PER_ENTRY,
    SGLANG_CPU_RUNTIME,
    SGLANG_LOAD_COPIES,
    STEP_TRANSIENT_BYTES,
    STEP_TRANSIENT_BYTES_BF16,
    TILED_MLP_HIDDEN_TENSORS,
    TRAINER_PROCESS_OVERHEAD,
    USABLE_FRACTION,
)
from rollway.coordinator.plan.shape import ModelShape, read_model_shape


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
