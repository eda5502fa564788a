"""Which Ray actors a run needs, what each asks for, and where they would go (pure logic; no Ray
import).

    trainer-0 .. trainer-{world_size-1}    one per FSDP rank      {CPU: ray_trainer_num_cpus,
                                                                    GPU: ray_trainer_num_gpus on a GPU cluster}
    rollout-0 .. rollout-{engines-1}      one rollout service per engine
                                            {CPU: ray_rollout_num_cpus,
                                             GPU: rollout_num_gpus_per_engine on a GPU cluster}
    dataloader                              {CPU: ray_dataloader_num_cpus}
    each plus ray_<service>_resources (custom resources: node labels such as {node_trainer: 1})

engines = rollout_num_gpus / rollout_num_gpus_per_engine (SGLang: each rollout service runs one
server with tensor parallelism rollout_num_gpus_per_engine; hf: one in-process engine each).
Services the run config attaches to (trainer_addr, ...) get no actor, and neither does the
coordinator (it places the run). All bundles go into one placement group with the run's
ray_placement_strategy (Ray's PACK, SPREAD, STRICT_PACK, STRICT_SPREAD).

Where they would go on a cluster's nodes, and whether the run survives a node's loss:
cluster_layout.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
SERVICES = ("trainer", "rollout", "dataloader")
# Resources every Ray node reports that say nothing about placement here (memory is not requested).
_HIDDEN = ("memory", "object_store_memory")


class PlacementError(ValueError):
    """The run cannot be laid out on this cluster; the message says why."""


@dataclass(frozen=True)
class ServiceSettings:
    """The settings a RayServiceGroup reads: one config per component (a run config is one; the
    gateway makes one for a trainer alone). Each is that service's settings dataclass."""

    coordinator: object  # its launcher and ray_* settings
    trainer: object
    rollout: object
    dataloader: object


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


@dataclass(frozen=True)
class PlacementSettings:
    """What a run asks of Ray: the coordinator's ray_* settings (defaults: theirs)."""

    strategy: str = "PACK"
    num_cpus: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(SERVICES, 1.0))
    trainer_num_gpus: float = 1.0
    resources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, coordinator) -> PlacementSettings:
        """From a CoordinatorConfig (its ray_placement_strategy, ray_<service>_num_cpus, ...)."""
        return cls(
            strategy=coordinator.ray_placement_strategy,
            num_cpus={s: getattr(coordinator, f"ray_{s}_num_cpus") for s in SERVICES},
            trainer_num_gpus=coordinator.ray_trainer_num_gpus,
            resources={s: dict(getattr(coordinator, f"ray_{s}_resources")) for s in SERVICES},
        )

    def bundle(self, service: str, gpus: float) -> dict[str, float]:
        """One actor's bundle: its CPUs, `gpus` where it has any, its custom resources."""
        bundle = {"CPU": float(self.num_cpus.get(service, 1.0))}
        if gpus > 0:
            bundle["GPU"] = float(gpus)
        bundle.update({k: float(v) for k, v in self.resources.get(service, {}).items() if v > 0})
        return bundle


def setting_of(service: str, resource: str) -> str:
    """The run setting that asks for `resource` on a `service` actor (for error messages)."""
    if resource == "CPU":
        return f"ray_{service}_num_cpus"
    if resource == "GPU":
        return "ray_trainer_num_gpus" if service == "trainer" else "rollout_num_gpus_per_engine"
    return f"ray_{service}_resources"


def num_rollout_engines(rollout_config) -> int:
    """Rollout services to start: rollout_num_gpus / rollout_num_gpus_per_engine (at least one)."""
    per_engine = rollout_config.rollout_num_gpus_per_engine
    if rollout_config.rollout_num_gpus % per_engine:
        raise PlacementError(
            f"rollout_num_gpus ({rollout_config.rollout_num_gpus}) must be a multiple of "
            f"rollout_num_gpus_per_engine ({per_engine})"
        )
    return max(rollout_config.rollout_num_gpus // per_engine, 1)


def plan_actors(
    configs: dict, services: list[str], cluster_gpus: float, settings: PlacementSettings | None = None
) -> list[ActorSpec]:
    """The actors that start `services` of a run (`configs`: its trainer and rollout settings;
    `settings`: its ray_* settings, the defaults without)."""
    settings = settings or PlacementSettings()
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
        bundle = settings.bundle("trainer", settings.trainer_num_gpus if use_gpus else 0.0)
        specs += [
            ActorSpec(f"trainer-{rank}", "trainer", rank, dict(bundle)) for rank in range(trainer.world_size)
        ]
    if "rollout" in services:
        per_engine = rollout.rollout_num_gpus_per_engine
        bundle = settings.bundle("rollout", per_engine if use_gpus and not rollout.sglang_urls else 0.0)
        specs += [
            ActorSpec(f"rollout-{i}", "rollout", i, dict(bundle)) for i in range(num_rollout_engines(rollout))
        ]
    if "dataloader" in services:
        specs.append(ActorSpec("dataloader", "dataloader", 0, settings.bundle("dataloader", 0.0)))
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
    return "\n".join(f"  {s.name:<14} {resources_text(s.resources)}" for s in specs)


def resources_text(resources: Mapping[str, float]) -> str:
    """`CPU 1, GPU 2, node_trainer 1`: CPU and GPU first, without Ray's memory and node:<ip> entries."""
    shown = [k for k in resources if k not in _HIDDEN and not k.startswith("node:")]
    ordered = sorted(shown, key=lambda k: (k not in ("CPU", "GPU"), k))
    return ", ".join(f"{k} {resources[k]:g}" for k in ordered) or "nothing"
