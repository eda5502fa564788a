"""The pure half of the recovery's questions to Ray: which live node can host a bundle, what the
error says when none can, and how Ray's long messages are cut."""

from __future__ import annotations

from rollway.common.supervision import ray_nodes
from rollway.common.supervision.ray_group_actor import excerpt


def test_ray_internal_resources_are_left_out_of_what_a_node_has_free():
    free = {
        "CPU": 1.0,
        "CPU_group_0_8f97": 1.0,
        "bundle_group_8f97": 1000.0,
        "node:198.18.0.3": 1.0,
        "memory": 1e9,
        "object_store_memory": 1e8,
        "node_trainer": 1.0,
    }
    assert ray_nodes.plain_resources(free) == {"CPU": 1.0, "node_trainer": 1.0}


def test_a_bundle_fits_only_where_every_resource_it_asks_for_is_free():
    assert ray_nodes.hosts({"CPU": 1.0}, {"CPU": 1.0})
    assert not ray_nodes.hosts({"CPU": 0.5}, {"CPU": 1.0})
    assert not ray_nodes.hosts({"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0})
    assert ray_nodes.hosts({"CPU": 4.0}, {"CPU": 1.0, "GPU": 0.0})  # asking for none is no ask


def test_the_no_room_message_names_each_live_node_and_what_it_has_free():
    text = ray_nodes.describe_free({"198.18.0.2": {"CPU": 0.0}, "198.18.0.4": {}})
    assert text == "198.18.0.2: CPU 0 free; 198.18.0.4: nothing free"
    assert ray_nodes.describe_free({}) == "no live node is left"


def test_what_ray_says_is_cut_at_a_word_and_to_its_first_line():
    said = "The actor died because its node has died. " * 20 + "\nTraceback ..."
    cut = excerpt(said)
    assert len(cut) <= 304 and cut.endswith(" ...") and "Traceback" not in cut
    assert cut[:-4] == said[: len(cut) - 4] and said[len(cut) - 4] == " "  # a whole word
    assert excerpt("short") == "short"


def test_late_verdict_windows_are_the_measured_ones_with_rays_default_health_checks():
    """Outside a tuned cluster (no system config), Ray's defaults give 5 x (10 s + 3 s)."""
    assert ray_nodes.silent_verdict_s() == 65.0, "5 failed checks x (10 s timeout + 3 s period)"
    assert ray_nodes.long_spell_s() == 20.0, "a 20 s spell is long (a 10 s cut never got a verdict)"
    assert ray_nodes.late_verdict_s() == 75.0, "Ray decided 55-65 s after the cut: 75 s covers it"


def test_the_test_clusters_tuned_health_checks_give_quicker_verdicts():
    """HEALTH_CHECK_FAST keeps Ray's 10 s answer time: 3 x (10 s + 0.5 s) for a cut-off node."""
    from rollway.common.supervision import ray_health
    from rollway.deploy.netns_cluster import HEALTH_CHECK_FAST

    assert ray_health.silent_verdict_s(HEALTH_CHECK_FAST) == 31.5
    assert round(ray_health.long_spell_s(31.5), 2) == 9.69
    assert ray_health.silent_verdict_s() == 65.0
