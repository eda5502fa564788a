"""`rollway plan`'s text and ValidateRun's plan: the batch arithmetic of a run, its micro-batches,
CPU threads and how its number of steps is settled (steps.py); with launcher ray, its actors and
where they would go on the cluster (common/supervision/placement.py, cluster_layout.py); the memory
plan's table, and why a run that does not fit is refused."""

from __future__ import annotations

from rollway.coordinator.plan import steps
from rollway.coordinator.plan.coefficients import GIB
from rollway.coordinator.plan.memory import MemoryPlan, ServiceMemory


def plan(configs: dict[str, object], end_of_data: str = "") -> str:
    """The batch arithmetic of a run, as text; `end_of_data` says how its steps were settled
    (steps.py: num_rollout wins and the data loops, or num_epoch epochs of the data's rows)."""
    c, t = configs["coordinator"], configs["trainer"]
    samples = c.samples_per_rollout
    steps_per_rollout = samples // c.global_batch_size
    per_rank = c.global_batch_size // max(t.world_size, 1)
    num_steps = c.num_rollout or _epoch_steps(configs)
    lines = [
        f"mode                     {'SFT' if c.is_sft else 'RL (' + c.advantage_estimator + ')'}"
        + (" async" if c.async_mode else ""),
        f"prompts per rollout      {c.rollout_batch_size}",
        f"samples per prompt       {1 if c.is_sft else c.n_samples_per_prompt}",
        f"samples per rollout      {samples}",
        f"global batch size        {c.global_batch_size} samples",
        f"optimizer steps/rollout  {steps_per_rollout}",
        f"trainer ranks            {t.world_size} ({per_rank} samples per rank per step)",
        *micro_batch_lines(configs, per_rank),
        cpu_threads_line(configs),
        f"rollouts                 {num_steps or 'num_epoch epochs (rows not readable here)'}",
        f"end of data              {end_of_data or _end_of_data(configs)}",
    ]
    if num_steps:
        lines.append(f"optimizer steps total    {num_steps * steps_per_rollout}")
    return "\n".join(lines)


def _epoch_steps(configs: dict[str, object]) -> int | None:
    """Steps of a num_rollout 0 run: num_epoch epochs of the data, where it is readable here."""
    c, d = configs["coordinator"], configs["dataloader"]
    return steps.num_steps(0, d.num_epoch, c.rollout_batch_size, steps.check_data(d).num_rows)


def _end_of_data(configs: dict[str, object]) -> str:
    """How a run's number of steps is settled (steps.py), from the data where readable here."""
    c, d = configs["coordinator"], configs["dataloader"]
    num_rows = steps.check_data(d).num_rows
    return steps.end_of_data_text(c.num_rollout, d.num_epoch, c.rollout_batch_size, num_rows)


def cpu_threads_line(configs: dict[str, object]) -> str:
    """The torch threads of the services that compute, on CPU on this machine (common/cpu_threads.py):
    the rollout engine's only where the run uses a rollout service (an SFT run starts none)."""
    from rollway.common.cpu_threads import resolve_cpu_threads, usable_cores
    from rollway.coordinator.run_config import RunConfig

    t, r = configs["trainer"], configs["rollout"]
    parts = [f"{resolve_cpu_threads(t.cpu_threads, t.world_size)} per trainer rank"]
    if "rollout" in RunConfig(**configs, given={}).services_used():
        parts.append(f"{resolve_cpu_threads(r.cpu_threads)} for the CPU rollout engine")
    return f"CPU threads              {', '.join(parts)} (on CPU here: {usable_cores()} usable cores)"


def micro_batch_lines(configs: dict[str, object], per_rank: int) -> list[str]:
    """How one rank's share of a step is cut into micro-batches (trainer/train_plan.py)."""
    c, t = configs["coordinator"], configs["trainer"]
    layout = "packed rows" if t.packing else "one padded row per sample"
    if not t.dynamic_batching:
        size = t.samples_per_micro_batch
        count = -(-per_rank // size)
        return [f"micro-batches            {count} per rank of {size} samples ({layout})"]
    budget = t.max_tokens_per_gpu
    # The samples of a prompt hold it once in a packed row (trainer/micro_batch.py) where the
    # attention kernel can show it to each of them: RL groups then cost prompt + n responses.
    shared = (
        not c.is_sft
        and c.n_samples_per_prompt > 1
        and t.packing
        and t.attn_implementation != "flash_attention_2"
    )
    if shared:
        layout += f", the {c.n_samples_per_prompt} samples of a prompt share it"
    lines = [f"micro-batches            by token budget: up to {budget} tokens each per rank ({layout})"]
    # The longest sample the data settings allow: SFT conversations are capped by
    # rollout_max_prompt_len; RL samples by prompt + rollout_max_response_len.
    max_prompt = configs["dataloader"].rollout_max_prompt_len
    longest = max_prompt if c.is_sft else (max_prompt + c.rollout_max_response_len if max_prompt else 0)
    n = c.n_samples_per_prompt
    group = max_prompt + n * c.rollout_max_response_len
    if longest and shared and group <= budget:
        fits = max(budget // group, 1)
        count = -(-per_rank // (fits * n))
        lines.append(
            f"micro-batch layout       groups of {n} samples of up to {group} tokens (prompt once): "
            f">= {fits} groups ({fits * n} samples) per micro-batch, at most {count} "
            f"micro-batch{'es' if count > 1 else ''} per rank per step"
        )
    elif longest:
        fits = max(budget // longest, 1)  # packed or padded, a sample costs at most `longest`
        count = -(-per_rank // fits)
        lines.append(
            f"micro-batch layout       samples of up to {longest} tokens: >= {fits} per micro-batch, "
            f"at most {count} micro-batch{'es' if count > 1 else ''} per rank per step"
        )
    else:
        lines.append(
            f"micro-batch layout       as many samples as fit {budget} tokens (e.g. {max(budget // 256, 1)} "
            f"of 256 tokens); set rollout_max_prompt_len to bound the count"
        )
    return lines


def ray_placement_text(configs: dict[str, object], nodes: list | None, source: str) -> str:
    """The run's Ray actors and their resources; on `nodes` (the cluster's, read from `source`)
    where each would go and whether the run survives the loss of any one node; without nodes, the
    actors and requirements only (as on a GPU cluster), saying so."""
    from rollway.common.supervision import cluster_layout, placement
    from rollway.coordinator.run_config import RunConfig

    run = RunConfig(**configs, given={})
    addresses = run.addresses()
    services = [name for name in run.services_used() if not addresses.get(name)]
    settings = placement.PlacementSettings.from_config(configs["coordinator"])
    parts = {"trainer": configs["trainer"], "rollout": configs["rollout"]}
    gpus = float("inf") if nodes is None else sum(n.resources.get("GPU", 0.0) for n in nodes)
    try:
        specs = placement.plan_actors(parts, services, gpus, settings)
        if nodes is not None:
            placement.check_fits(specs, cluster_layout.total_resources(nodes))
            cluster_layout.check_cluster(specs, settings.strategy, nodes)
    except placement.PlacementError as exc:
        return f"Ray placement: {source}: the run cannot be placed: {exc}"
    if nodes is None:
        return (
            f"Ray placement ({settings.strategy}): no cluster reached ({source}): the actors and what "
            f"each needs on a cluster with GPUs only, not where they would go\n{placement.describe(specs)}"
        )
    return f"Ray cluster: {source}\n" + cluster_layout.layout_text(specs, settings.strategy, nodes)


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
