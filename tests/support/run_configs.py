"""The refusals of a run config, as the run-config tests read them."""

from __future__ import annotations

import pytest

from rollway.coordinator.run_config import RunConfigError, parse_run_config


def problems(config: dict) -> dict[str, str]:
    """parse_run_config's refusal of `config` as {setting: why}; fails the test if it is accepted."""
    with pytest.raises(RunConfigError) as refused:
        parse_run_config(config)
    return dict(refused.value.problems)
