"""Parsing a run config in a fresh interpreter imports no torch (config errors and --help stay instant)."""

from __future__ import annotations

import subprocess
import sys


def test_parsing_a_run_config_imports_no_torch():
    code = "import sys, rollway.coordinator.run_config; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
