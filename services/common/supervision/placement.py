"""Which Ray actors a run needs and what each asks for (pure logic; no Ray import).

    trainer-0 .. trainer-{world_size-1}    one per FSDP rank      {CPU: 1, GPU: 1 on a GPU cluster}
    rollout-0 .. rollout-{engines-1}      one rollout service per engine
                                            {CPU: 1, GPU: rollout_num_gpus_per_engine on a GPU cluster}
    dataloader                              {CPU: 1}

engines = rollout_num_gpus / rollout_num_gpus_per_engine (SGLang: each rollout service runs one
server with tensor parallelism rollout_num_gpus_per_engine; hf: one in-process engine each).
Services the run config attaches to (trainer_addr, ...) get no actor, and neither does the
coordinator (it places the run). All bundles go into one placement group (PACK: trainer ranks and
engines on as few nodes as possible).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class PlacementError(ValueError):
    """The run cannot be laid out on this cluster; the message says why."""


@dataclass(frozen=True)
class ActorSpec:
    """One Ray actor hosting one service process (or one trainer worker rank)."""

    name: str
    service: str
    index: int
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def is_trainer_worker(self) -> bool:
        """Trainer ranks 1..N-1 run `python -m rollway.trainer.worker`, not a gRPC service."""
        return self.service == "trainer" and self.index > 0


def num_rollout_engines(rollout_config) -> int:
    """Rollout services to start: rollout_num_gpus / rollout_num_gpus_per_engine (at least one)."""
    per_engine = rollout_config.rollout_num_gpus_per_engine
    if rollout_config.rollout_num_gpus % per_engine:
        raise PlacementError(
            f"rollout_num_gpus ({rollout_config.rollout_num_gpus}) must be a multiple of "
            f"rollout_num_gpus_per_engine ({per_engine})"
        )
    return max(rollout_config.rollout_num_gpus // per_engine, 1)


def plan_actors(configs: dict, services: list[str], cluster_gpus: float) -> list[ActorSpec]:
    """The actors that start `services` of a run (`configs`: its trainer and rollout settings)."""
    trainer, rollout = configs["trainer"], configs["rollout"]
    use_gpus = cluster_gpus > 0
    if (
        "rollout" in services
        and rollout.rollout_engine == "sglang"
        and not rollout.sglang_urls
        and not use_gpus
    ):
        raise PlacementError("rollout_engine sglang needs GPUs, and this Ray cluster has none")
    specs: list[ActorSpec] = []
    if "trainer" in services:
        gpu = {"GPU": 1.0} if use_gpus else {}
        specs += [
            ActorSpec(f"trainer-{rank}", "trainer", rank, {"CPU": 1.0, **gpu})
            for rank in range(trainer.world_size)
        ]
    if "rollout" in services:
        per_engine = rollout.rollout_num_gpus_per_engine
        gpu = {"GPU": float(per_engine)} if use_gpus and not rollout.sglang_urls else {}
        specs += [
            ActorSpec(f"rollout-{i}", "rollout", i, {"CPU": 1.0, **gpu})
            for i in range(num_rollout_engines(rollout))
        ]
    if "dataloader" in services:
        specs.append(ActorSpec("dataloader", "dataloader", 0, {"CPU": 1.0}))
    needed_gpus = sum(s.resources.get("GPU", 0.0) for s in specs)
    if needed_gpus > cluster_gpus:
        raise PlacementError(f"the run needs {needed_gpus:g} GPUs and the Ray cluster has {cluster_gpus:g}")
    return specs


def check_fits(specs: list[ActorSpec], cluster: dict[str, float]) -> None:
    """Refuse at once (rather than wait for placement) when the cluster is too small in total."""
    for resource in ("CPU", "GPU"):
        needed = sum(s.resources.get(resource, 0.0) for s in specs)
        if needed > cluster.get(resource, 0.0):
            raise PlacementError(
                f"the run's actors need {needed:g} {resource} in total and the Ray cluster has "
                f"{cluster.get(resource, 0.0):g}"
            )


def describe(specs: list[ActorSpec]) -> str:
    """One line per actor, for the launcher's output."""
    return "\n".join(
        f"  {s.name:<14} " + ", ".join(f"{k} {v:g}" for k, v in sorted(s.resources.items())) for s in specs
    )
