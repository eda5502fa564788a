"""A model directory as StartRun sees it, for the run-config tests."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def model_dir(tmp_path):
    """A model directory as far as StartRun looks: config.json with a 1024-token context."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "max_position_embeddings": 1024}))
    return model
