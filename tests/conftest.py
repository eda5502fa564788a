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
SGLANG_PAIR = "sglang_pair"


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
    _run_sglang_pair_users_together(items)
    _group_for_workers(items)
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def _run_sglang_pair_users_together(items) -> None:
    # The tests on the shared SGLang servers run one after the other, where the first of them is,
    # a release's after another's, so that each release's pair starts once and is up only while
    # they run (pytest_runtest_teardown stops it after the last).
    users = [item for item in items if SGLANG_PAIR in item.fixturenames]
    if users:
        from support.sglang_servers import pair_release_order

        first = items.index(users[0])
        users.sort(key=pair_release_order)
        others = [item for item in items if SGLANG_PAIR not in item.fixturenames]
        items[:] = others[:first] + users + others[first:]


def _group_for_workers(items) -> None:
    # `make test` runs the suite on parallel workers, a group of tests on one worker
    # (tests/support/workers.py). There the longest groups go first, so that the workers end together.
    from support.workers import RAY, SGLANG, worker_group

    for item in items:
        group = worker_group(item.nodeid)
        if (item.get_closest_marker("ray") and group != RAY) or (
            SGLANG_PAIR in item.fixturenames and group != SGLANG
        ):
            raise pytest.UsageError(
                f"{item.nodeid}: a test that starts Ray, or uses the shared SGLang pair, must be in a "
                "module named for it, so that it runs on the one worker of its group (tests/support/workers.py)"
            )
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one test after another, the order stays the files'
        first = {RAY, SGLANG, "tests/realmodel/test_smollm2.py"}
        items.sort(key=lambda item: worker_group(item.nodeid) not in first)  # stable: each order within stays


def pytest_configure(config):
    from support.workers import pin_to_own_cores

    pin_to_own_cores()


def pytest_xdist_make_scheduler(config, log):
    from support.workers import make_scheduler

    return make_scheduler(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)  # the test's own fixtures first: a module's services attached to the pair go first
    finally:
        pairs = getattr(item.session, "sglang_pairs", None)
        if pairs is not None and (nextitem is None or SGLANG_PAIR not in nextitem.fixturenames):
            pairs.stop()


@pytest.fixture(scope="session")
def sglang_pair(request, tiny_model_dir, tmp_path_factory):
    """`sglang_pair(version)`: two SGLang servers of `version` on the tiny model, shared by the
    tests that only attach to servers (tests/support/sglang_servers.py, SharedServerPairs)."""
    from support.sglang_servers import SharedServerPairs

    pairs = SharedServerPairs(tiny_model_dir, tmp_path_factory.mktemp("sglang-pair"))
    request.session.sglang_pairs = pairs
    yield pairs.pair
    pairs.stop()


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
