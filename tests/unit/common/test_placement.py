"""Ray placement as pure logic: the run's ray_* settings in the actors' bundles, what no cluster
could place (refused naming the setting), where a strategy would put each actor, and whether the
run survives the loss of any one node."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rollway.common.config import ConfigError, from_dict
from rollway.common.supervision.cluster_layout import Node, check_cluster, layout_text, node_losses, simulate
from rollway.common.supervision.placement import ActorSpec, PlacementError, PlacementSettings, plan_actors
from rollway.coordinator.config import CoordinatorConfig

TRAINER = SimpleNamespace(world_size=2)
HF_ROLLOUT = SimpleNamespace(
    rollout_engine="hf", sglang_urls=[], rollout_num_gpus=1, rollout_num_gpus_per_engine=1
)
SERVICES = ["trainer", "rollout", "dataloader"]


def actors(*resources: dict[str, float]) -> list[ActorSpec]:
    return [ActorSpec(f"a{i}", "trainer", i, dict(r)) for i, r in enumerate(resources)]


def cpu_nodes(*cpus: float) -> list[Node]:
    return [
        Node(f"10.0.0.{i + 1}", {"CPU": c, "memory": 1e9, f"node:10.0.0.{i + 1}": 1.0})
        for i, c in enumerate(cpus)
    ]


def test_the_ray_settings_shape_each_actors_bundle():
    config = from_dict(
        CoordinatorConfig,
        {
            "launcher": "ray",
            "ray_placement_strategy": "SPREAD",
            "ray_trainer_num_cpus": 4,
            "ray_trainer_num_gpus": 0.5,
            "ray_rollout_num_cpus": 2,
            "ray_dataloader_num_cpus": 0.5,
            "ray_trainer_resources": {"node_trainer": 1},
            "ray_dataloader_resources": {"cpu_pool": 0.25},
        },
    )
    settings = PlacementSettings.from_config(config)
    assert settings.strategy == "SPREAD"
    gpu_run = plan_actors({"trainer": TRAINER, "rollout": HF_ROLLOUT}, SERVICES, 8.0, settings)
    assert [(s.name, s.resources) for s in gpu_run] == [
        ("trainer-0", {"CPU": 4.0, "GPU": 0.5, "node_trainer": 1.0}),
        ("trainer-1", {"CPU": 4.0, "GPU": 0.5, "node_trainer": 1.0}),
        ("rollout-0", {"CPU": 2.0, "GPU": 1.0}),
        ("dataloader", {"CPU": 0.5, "cpu_pool": 0.25}),
    ]
    cpu_run = plan_actors({"trainer": TRAINER, "rollout": HF_ROLLOUT}, ["trainer"], 0.0, settings)
    assert [s.resources for s in cpu_run] == [{"CPU": 4.0, "node_trainer": 1.0}] * 2  # no GPU asked for


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"ray_placement_strategy": "SPREAD"}, "ray_placement_strategy: needs launcher ray"),
        (
            {"launcher": "ray", "ray_placement_strategy": "BALANCED"},
            "ray_placement_strategy: must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD",
        ),
        ({"launcher": "ray", "ray_trainer_num_cpus": 0}, "ray_trainer_num_cpus: must be positive (got 0)"),
        (
            {"launcher": "ray", "ray_trainer_num_gpus": -1},
            "ray_trainer_num_gpus: must not be negative (got -1)",
        ),
        (
            {"launcher": "ray", "ray_rollout_resources": {"GPU": 1}},
            "ray_rollout_resources: GPU is not a custom resource",
        ),
        (
            {"launcher": "ray", "ray_rollout_resources": {"a": -1}},
            "ray_rollout_resources: a: must be a non-negative number",
        ),
        ({"launcher": "ray", "ray_rollout_resources": "[1, 2]"}, "ray_rollout_resources: must be a mapping"),
    ],
)
def test_placement_settings_are_refused_at_parse_time_naming_the_setting(settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_dict(CoordinatorConfig, settings)


def test_a_resources_flag_is_a_yaml_mapping():
    config = from_dict(CoordinatorConfig, {"launcher": "ray", "ray_trainer_resources": "{node_trainer: 1}"})
    assert config.ray_trainer_resources == {"node_trainer": 1}


def test_what_no_node_could_hold_is_refused_naming_the_setting_and_the_nodes():
    nodes = [Node("10.0.0.1", {"CPU": 8.0, "GPU": 4.0}), Node("10.0.0.2", {"CPU": 2.0, "node_trainer": 1.0})]
    trainer = [ActorSpec("trainer-0", "trainer", 0, {"CPU": 1.0, "node_rollout": 1.0})]
    with pytest.raises(PlacementError) as missing:
        check_cluster(trainer, "PACK", nodes)
    assert str(missing.value) == (
        "ray_trainer_resources: trainer-0 asks for node_rollout 1, and no node of the Ray cluster has "
        "node_rollout; the nodes have: 10.0.0.1 (CPU 8, GPU 4); 10.0.0.2 (CPU 2, node_trainer 1)"
    )
    big = [ActorSpec("rollout-0", "rollout", 0, {"CPU": 12.0, "GPU": 2.0})]
    with pytest.raises(
        PlacementError, match=r"^ray_rollout_num_cpus: rollout-0 needs CPU 12, GPU 2 on one node"
    ):
        check_cluster(big, "PACK", nodes)
    # Each resource exists somewhere, but not together: every setting of the bundle is named.
    apart = [ActorSpec("trainer-0", "trainer", 0, {"CPU": 1.0, "GPU": 1.0, "node_trainer": 1.0})]
    with pytest.raises(
        PlacementError, match="^ray_trainer_num_cpus, ray_trainer_num_gpus, ray_trainer_resources: "
    ):
        check_cluster(apart, "PACK", nodes)
    three = actors({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0})
    with pytest.raises(
        PlacementError,
        match="^ray_placement_strategy: STRICT_SPREAD puts each of the run's 3 actors on a node of its own, and the Ray cluster has 2 nodes",
    ):
        check_cluster(three, "STRICT_SPREAD", nodes)
    with pytest.raises(
        PlacementError, match="^ray_placement_strategy: STRICT_PACK .* together they need CPU 9"
    ):
        check_cluster(actors(*[{"CPU": 3.0}] * 3), "STRICT_PACK", nodes)
    check_cluster(three, "PACK", nodes)  # fits: no error


def test_pack_fills_one_node_and_survives_a_node_loss_only_where_another_has_room():
    nodes = cpu_nodes(4, 4)
    specs = actors({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0})
    layout = simulate(specs, "PACK", nodes)
    assert layout.where == {"a0": "10.0.0.1", "a1": "10.0.0.1", "a2": "10.0.0.1"}
    assert layout.free["10.0.0.1"]["CPU"] == 1.0 and layout.free["10.0.0.2"]["CPU"] == 4.0
    assert node_losses(specs, "PACK", nodes, layout) == {}  # node 2 holds all three
    small = cpu_nodes(4, 2)
    layout = simulate(specs, "PACK", small)
    assert node_losses(specs, "PACK", small, layout) == {
        "10.0.0.1": "a0, a1, a2 (CPU 3) would not fit what the other nodes have left: 10.0.0.2 (CPU 2)"
    }


def test_pack_spills_over_when_no_node_holds_all():
    specs = actors({"CPU": 2.0}, {"CPU": 2.0}, {"CPU": 2.0})
    layout = simulate(specs, "PACK", cpu_nodes(4, 4, 4))
    assert layout.where == {"a0": "10.0.0.1", "a1": "10.0.0.1", "a2": "10.0.0.2"}


def test_spread_puts_each_actor_on_the_emptiest_node_that_fits():
    specs = actors({"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 1.0}, {"CPU": 3.0})
    layout = simulate(specs, "SPREAD", cpu_nodes(4, 4, 2))
    assert layout.where == {"a0": "10.0.0.1", "a1": "10.0.0.2", "a2": "10.0.0.3", "a3": "10.0.0.1"}
    assert node_losses(specs, "SPREAD", cpu_nodes(4, 4, 2), layout) == {}


def test_strict_spread_matches_bundles_to_nodes_and_needs_a_spare_node_to_survive():
    # Greedy in order would put the small bundle on the big node and leave no room for the big one.
    specs = actors({"CPU": 1.0}, {"CPU": 4.0})
    nodes = cpu_nodes(4, 1)
    layout = simulate(specs, "STRICT_SPREAD", nodes)
    assert layout.where == {"a0": "10.0.0.2", "a1": "10.0.0.1"}
    assert set(node_losses(specs, "STRICT_SPREAD", nodes, layout)) == {"10.0.0.1", "10.0.0.2"}
    spare = cpu_nodes(4, 1, 4)
    assert node_losses(specs, "STRICT_SPREAD", spare, simulate(specs, "STRICT_SPREAD", spare)) == {}


def test_strict_pack_needs_another_node_that_holds_them_all():
    specs = actors({"CPU": 2.0}, {"CPU": 2.0})
    nodes = cpu_nodes(4, 3)
    layout = simulate(specs, "STRICT_PACK", nodes)
    assert layout.where == {"a0": "10.0.0.1", "a1": "10.0.0.1"}
    assert list(node_losses(specs, "STRICT_PACK", nodes, layout)) == ["10.0.0.1"]
    assert simulate(specs, "STRICT_PACK", cpu_nodes(3, 3)).unplaced == ["a0", "a1"]


def test_layout_text_says_where_and_which_loss_the_run_does_not_survive():
    specs = actors({"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0})
    nodes = [Node("10.0.0.1", {"CPU": 2.0, "GPU": 1.0}), Node("10.0.0.2", {"CPU": 4.0})]
    text = layout_text(specs, "PACK", nodes)
    assert "  a0             CPU 1, GPU 1                     -> 10.0.0.1" in text
    assert "nodes: 10.0.0.1 (CPU 2, GPU 1); 10.0.0.2 (CPU 4)" in text
    assert text.endswith(
        "survives the loss of any one node: no\n"
        "  losing 10.0.0.1: a0, a1 (CPU 2, GPU 1) would not fit what the other nodes have left: 10.0.0.2 (CPU 4)"
    )
    one = layout_text(actors({"CPU": 1.0}), "PACK", cpu_nodes(2))
    assert one.endswith("losing 10.0.0.1: a0 would have nowhere to go: the cluster has no other node")


def test_plan_text_without_a_cluster_lists_the_actors_and_says_where_they_go_is_unknown():
    from pathlib import Path

    from rollway.coordinator.plan.text import ray_placement_text
    from rollway.deploy.launcher import parse_run_config

    example = Path(__file__).resolve().parents[3] / "deploy" / "ray" / "grpo-8gpu.yaml"
    configs = parse_run_config([str(example), "--launcher", "ray", "--ray-rollout-num-cpus", "2"], given={})
    text = ray_placement_text(configs, None, "nothing answers at 127.0.0.1:1")
    assert text.splitlines()[0] == (
        "Ray placement (PACK): no cluster reached (nothing answers at 127.0.0.1:1): the actors and what "
        "each needs on a cluster with GPUs only, not where they would go"
    )
    assert "  rollout-1      CPU 2, GPU 2" in text.splitlines()
    two_nodes = [Node("10.0.0.1", {"CPU": 8.0, "GPU": 4.0}), Node("10.0.0.2", {"CPU": 8.0, "GPU": 4.0})]
    text = ray_placement_text(configs, two_nodes, "the Ray cluster at H:6379")
    assert text.startswith("Ray cluster: the Ray cluster at H:6379\nRay placement (PACK;")
    assert (
        "  rollout-1      CPU 2, GPU 2                     -> 10.0.0.2" in text
    )  # 4 trainer GPUs fill node 1
    assert text.endswith(  # the dataloader went to node 1, which had CPUs left
        "survives the loss of any one node: no\n"
        "  losing 10.0.0.1: trainer-0, trainer-1, trainer-2, trainer-3, dataloader (CPU 5, GPU 4) would not fit "
        "what the other nodes have left: 10.0.0.2 (CPU 4, GPU 0)\n"
        "  losing 10.0.0.2: rollout-0, rollout-1 (CPU 4, GPU 4) would not fit what the other nodes have left: "
        "10.0.0.1 (CPU 3, GPU 0)"
    )
    small = [Node("10.0.0.1", {"CPU": 4.0, "GPU": 8.0})]
    assert ray_placement_text(configs, small, "c") == (
        "Ray placement: c: the run cannot be placed: the run's actors need 9 CPU in total and the Ray "
        "cluster has 4"
    )
