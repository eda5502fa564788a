"""Fixtures shared by every test: the tiny model (built once per session), service processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests never touch the network: Hugging Face libraries must load everything from disk.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

UNIT = Path(__file__).parent / "unit"


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    # The fast tier is tests/unit (in-process); tests/integration and tests/e2e start processes,
    # servers and ranks, so every test there is slow without each module having to say so.
    for item in items:
        if UNIT not in item.path.parents:
            item.add_marker(pytest.mark.slow)
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A freshly built tiny Qwen3 model + tokenizer directory (the same one the demo uses)."""
    from rollway.demo.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def demo_data_dir(tmp_path_factory):
    """The demo task's datasets (sft.parquet, rl.parquet, eval.parquet) for seed 0."""
    from rollway.demo.data import make_demo_data

    out = tmp_path_factory.mktemp("demo-data")
    make_demo_data(out, seed=0)
    return out
