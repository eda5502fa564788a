"""SFT with two trainer ranks on two nodes of a namespace cluster, and the loss of rank 1's node.

The uninterrupted run is the reference: the run that loses trainer rank 1's node (kill -9 of every
process there) must complete by itself, each step logged once, with bit-identical final weights.
"""

from __future__ import annotations

import pytest
from support.cluster_runs import ClusterRun, report, sft_settings

NUM_STEPS = 6


@pytest.fixture(scope="module")
def sft_reference(netns_cluster, tiny_model_dir, demo_data_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sft-reference")
    run = ClusterRun.start(
        netns_cluster, workdir, sft_settings(tiny_model_dir, demo_data_dir, workdir, "sft-ref")
    )
    assert run.wait_end() == 0, run.log_tail()
    return run


def test_sft_with_two_trainer_ranks_on_two_nodes(cluster, sft_reference):
    run = sft_reference
    assert "run sft-ref SUCCEEDED" in run.log_path.read_text()
    placed = run.placement()
    assert set(placed) == {"trainer-0", "trainer-1", "dataloader"}
    nodes = {name: actor["node"] for name, actor in placed.items()}
    assert len(set(nodes.values())) == 3, nodes  # one actor per node: 1 CPU each, the head has none
    assert cluster.nodes[0].ip not in nodes.values()
    losses = [r["sft/loss"] for r in run.records()]
    assert run.steps() == list(range(NUM_STEPS))
    assert all(loss > 0 for loss in losses) and losses[-1] < losses[0], losses


def test_losing_trainer_rank_1s_node_completes_bit_identical(
    cluster, sft_reference, tiny_model_dir, demo_data_dir, tmp_path
):
    run = ClusterRun.start(
        cluster, tmp_path, sft_settings(tiny_model_dir, demo_data_dir, tmp_path, "sft-rank1")
    )
    run.wait_steps(2)
    before = run.placement()
    lost = cluster.node_of(before["trainer-1"]["node"])
    fault = run.fault_now()
    cluster.kill_node(lost)
    verdict = cluster.wait_dead(lost)
    try:
        next_step = run.next_step_seconds(fault)
        report(
            f"(d) SFT trainer-1 node {lost} killed: Ray's verdict {verdict:.1f}s, next step {next_step:.1f}s"
        )
    except AssertionError:
        report(f"(d) SFT trainer-1 node {lost} killed: Ray's verdict {verdict:.1f}s, no step after it")
        raise
    assert run.wait_end() == 0, run.log_tail()
    after = run.placement()
    # torchelastic's rule: every rank restarted (new actors), the dataloader untouched
    assert [after[f"trainer-{r}"]["generation"] for r in (0, 1)] == [1, 1], run.describe()
    assert after["dataloader"]["generation"] == 0
    assert after["trainer-1"]["node"] != before["trainer-1"]["node"]
    assert cluster.node_of(after["trainer-1"]["node"]) != lost
    assert run.steps() == list(range(NUM_STEPS))  # each step once (a redone step replaces its record)
    assert [r["sft/loss"] for r in run.records()] == [r["sft/loss"] for r in sft_reference.records()]
    assert run.weights_digest() == sft_reference.weights_digest()
