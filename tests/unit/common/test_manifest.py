"""Checkpoint files: manifest verification, atomic replace, latest pointer resolution."""

from __future__ import annotations

import json

import pytest

from rollway.common.manifest import (
    CheckpointError,
    atomic_write_text,
    tree_bytes,
    verify_manifest,
    write_manifest,
)
from rollway.trainer import checkpoint


def make_checkpoint(root, step: int) -> None:
    tmp = checkpoint.temp_dir(root, step)
    (tmp / "model").mkdir(parents=True)
    (tmp / "model" / "shard.distcp").write_bytes(b"weights" * 100)
    checkpoint.finalize(tmp, root, step, {"global_step": step, "extra_state": {"next_rollout_id": step + 1}})


def test_manifest_detects_changed_missing_and_truncated_files(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 10)
    manifest = write_manifest(tmp_path)
    assert sorted(manifest["files"]) == ["a", "sub/b"]
    verify_manifest(tmp_path)
    (tmp_path / "sub" / "b").write_bytes(b"z" * 10)  # same size, different bytes
    with pytest.raises(CheckpointError, match=r"sub/b: sha256 does not match the manifest"):
        verify_manifest(tmp_path)
    (tmp_path / "a").write_bytes(b"x" * 3)
    with pytest.raises(CheckpointError, match=r"/a: size 3 != 10"):
        verify_manifest(tmp_path)
    (tmp_path / "a").unlink()
    with pytest.raises(CheckpointError, match=r"/a: missing"):
        verify_manifest(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json: missing"):
        verify_manifest(tmp_path)


def test_finalize_renames_atomically_and_moves_latest(tmp_path):
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 7)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "7"
    assert checkpoint.resolve(tmp_path) == tmp_path / "iter_0000007"
    meta = checkpoint.verify(checkpoint.resolve(tmp_path / "iter_0000003"))
    assert meta["extra_state"] == {"next_rollout_id": 4}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_a_save_killed_half_way_never_becomes_latest(tmp_path):
    make_checkpoint(tmp_path, 3)
    half = checkpoint.temp_dir(tmp_path, 9)  # shards written, never finalized
    (half / "model").mkdir(parents=True)
    (half / "model" / "shard.distcp").write_bytes(b"partial")
    assert checkpoint.resolve(tmp_path) == tmp_path / "iter_0000003"
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    assert checkpoint.resolve(tmp_path) == tmp_path / "iter_0000003"  # highest complete iter_*


def test_saving_the_same_step_again_replaces_it(tmp_path):
    make_checkpoint(tmp_path, 5)
    make_checkpoint(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", "latest_checkpointed_iteration.txt"]
    checkpoint.verify(tmp_path / "iter_0000005")


def test_resolve_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        checkpoint.resolve(tmp_path)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("12")
    with pytest.raises(CheckpointError, match="names iter_0000012, which does not exist"):
        checkpoint.resolve(tmp_path)


def test_atomic_write_text_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "f.json"
    atomic_write_text(target, json.dumps({"a": 1}))
    atomic_write_text(target, json.dumps({"a": 2}))
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


def test_a_corrupt_latest_falls_back_to_the_newest_that_verifies(tmp_path):
    for step in (3, 5, 7):
        make_checkpoint(tmp_path, step)
    shard = tmp_path / "iter_0000007" / "model" / "shard.distcp"
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated
    meta = tmp_path / "iter_0000005" / "meta.json"
    meta.write_text(meta.read_text().replace('"global_step": 5', '"global_step": 6'))  # edited, same size
    found = checkpoint.resolve_verified(tmp_path)
    assert found.directory == tmp_path / "iter_0000003" and found.meta["global_step"] == 3
    assert found.skipped == [
        f"{shard}: size 690 != 700 in the manifest",
        f"{meta}: sha256 does not match the manifest (corrupt)",
    ]
    # A checkpoint named directly is never replaced by another one.
    with pytest.raises(CheckpointError, match="size 690 != 700"):
        checkpoint.resolve_verified(tmp_path / "iter_0000007")


def test_a_bad_latest_pointer_falls_back_and_a_save_beyond_it_is_ignored(tmp_path):
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 4)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")  # iter 4 renamed, pointer not moved
    assert checkpoint.resolve_verified(tmp_path).directory == tmp_path / "iter_0000003"
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("x\x00")
    found = checkpoint.resolve_verified(tmp_path)
    assert found.directory == tmp_path / "iter_0000004"
    assert found.skipped == [
        f"{tmp_path / 'latest_checkpointed_iteration.txt'}: not a step number ('x\\x00')"
    ]
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("9")
    found = checkpoint.resolve_verified(tmp_path)
    assert (found.directory.name, found.skipped[0].split(": ")[1]) == (
        "iter_0000004",
        "names iter_0000009, which does not exist",
    )


def test_when_no_checkpoint_verifies_the_error_names_the_directory_and_every_reason(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2)
    (tmp_path / "iter_0000001" / "manifest.json").unlink()
    (tmp_path / "iter_0000002" / "model" / "shard.distcp").unlink()
    with pytest.raises(CheckpointError) as info:
        checkpoint.resolve_verified(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: no checkpoint verifies ({tmp_path}/iter_0000002/model/shard.distcp: missing; "
        f"{tmp_path}/iter_0000001/manifest.json: missing (incomplete checkpoint))"
    )
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        checkpoint.resolve_verified(tmp_path / "iter_0000001" / "model")


def test_tree_bytes_counts_every_file_below(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "shard.bin").write_bytes(b"\0" * 1000)
    (tmp_path / "meta.json").write_text("{}")
    assert tree_bytes(tmp_path) == 1002
