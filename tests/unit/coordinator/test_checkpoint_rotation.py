"""save_total_limit: keep the newest N complete run checkpoints, never the one a resume needs."""

from __future__ import annotations

from pathlib import Path

from rollway.coordinator import run_state
from rollway.coordinator.checkpoint_rotation import rotate, to_delete
from rollway.coordinator.run_state import LATEST_FILE, STATE_FILE, candidates


def make_save(root: Path, complete: list[int], incomplete: list[int] = (), latest: int | None = None) -> Path:
    """Fake run checkpoints: complete ones hold coordinator.json, incomplete ones only trainer/."""
    for step in [*complete, *incomplete]:
        directory = run_state.checkpoint_dir(root, step)
        (directory / "trainer").mkdir(parents=True)
        (directory / "trainer" / "weights.bin").write_bytes(b"\0" * 16)
        if step in complete:
            (directory / STATE_FILE).write_text("{}")
    if latest is not None:
        (root / LATEST_FILE).write_text(run_state.checkpoint_dir(root, latest).name + "\n")
    return root


def names(root: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("rollout_")) for p in root.glob("rollout_*"))


def test_unset_limit_keeps_everything(tmp_path):
    save = make_save(tmp_path, complete=[1, 2, 3, 4], latest=4)
    assert rotate(save, 0) == []
    assert names(save) == [1, 2, 3, 4]


def test_limit_keeps_the_newest_complete_ones(tmp_path):
    save = make_save(tmp_path, complete=[1, 2, 3, 4], latest=4)
    deleted = rotate(save, 2)
    assert [p.name for p in deleted] == ["rollout_0000001", "rollout_0000002"]
    assert names(save) == [3, 4]
    assert candidates(save)[0].name == "rollout_0000004"  # resume still finds the latest
    assert not list(save.glob(".tmp-*"))  # nothing half-deleted left behind


def test_limit_one_keeps_only_the_latest(tmp_path):
    save = make_save(tmp_path, complete=[1, 2, 3], latest=3)
    rotate(save, 1)
    assert names(save) == [3]
    assert [p.name for p in candidates(save)] == ["rollout_0000003"]


def test_incomplete_and_in_progress_checkpoints_are_left_alone(tmp_path):
    # 5: a save still writing (no coordinator.json); 6: complete but the pointer not yet moved.
    save = make_save(tmp_path, complete=[1, 2, 3, 6], incomplete=[0, 5], latest=3)
    rotate(save, 1)
    assert names(save) == [0, 3, 5, 6]


def test_the_pointed_checkpoint_is_kept_even_when_newer_ones_exist(tmp_path):
    # The pointer names 2; 3 and 4 are newer than it (never used by resume): 2 must survive.
    assert to_delete(["rollout_1", "rollout_2", "rollout_3", "rollout_4"], "rollout_2", 1) == ["rollout_1"]


def test_no_usable_pointer_deletes_nothing(tmp_path):
    save = make_save(tmp_path, complete=[1, 2, 3])
    assert rotate(save, 1) == []
    (save / LATEST_FILE).write_text("rollout_0000009\n")  # names a checkpoint that is not there
    assert rotate(save, 1) == []
    assert names(save) == [1, 2, 3]


def test_the_load_checkpoint_is_protected(tmp_path):
    save = make_save(tmp_path, complete=[1, 2, 3, 4], latest=4)
    rotate(save, 1, protect=[run_state.checkpoint_dir(save, 1), tmp_path.parent / "elsewhere"])
    assert names(save) == [1, 4]


def test_a_half_deleted_checkpoint_is_never_resumed_from(tmp_path):
    # A crash inside rotate leaves the renamed directory: partial, so resume skips and removes it.
    save = make_save(tmp_path, complete=[1, 2], latest=2)
    (save / "rollout_0000001").rename(save / ".tmp-deleting-rollout_0000001")
    assert [p.name for p in candidates(save)] == ["rollout_0000002"]
