"""A run's inputs, read here before it starts, as the services it starts would read them: the
model (its config.json: a model directory, with room in its context for a prompt and a response)
and the training data (files and columns; from its row count, the run's number of steps).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rollway.coordinator.plan.steps import (
    DataShape,
    check_data,
    end_of_data_problems,
    end_of_data_text,
    num_steps,
)

if TYPE_CHECKING:
    from rollway.coordinator.run_config import RunConfig


# Where config.json gives a model's context length (transformers' names across architectures).
CONTEXT_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def plan_steps(run: RunConfig, problems: list[tuple[str, str]], check_files: bool) -> set[str]:
    """Check the training data (files, columns) and settle the run's number of steps up front
    (plan/steps.py: num_rollout wins and the data loops; num_rollout 0 runs num_epoch epochs).
    Appends to `problems`; returns the settings whose problems are preconditions (a missing file)."""
    c, d = run.coordinator, run.dataloader
    uses_data = "dataloader" in run.services_used()
    # Only a dataloader the coordinator starts here reads the files here (Ray: on the cluster's nodes).
    started = uses_data and not run.addresses()["dataloader"] and c.launcher == "local"
    shape = check_data(d)
    if not started:  # an attached dataloader reads its files where it runs, with its own keys
        shape = DataShape(shape.num_rows, [])
    elif not check_files:  # a config written for another machine: only the files here are checked
        shape = DataShape(shape.num_rows, [p for p in shape.problems if not p[2]])
    found = shape.problems if uses_data else []
    if uses_data and (check_files or shape.num_rows is not None or d.num_epoch <= 0):
        found += end_of_data_problems(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape)
    problems += [(setting, problem) for setting, problem, _ in found]
    run.num_rows = shape.num_rows
    if uses_data and not found:
        # Worded before num_rollout is settled: a num_epoch run reads "num_epoch E x R rows / ...".
        run.end_of_data = end_of_data_text(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape.num_rows)
        c.num_rollout = num_steps(c.num_rollout, d.num_epoch, c.rollout_batch_size, shape.num_rows)
    return {setting for setting, _, precondition in found if precondition}


def model_problems(run: RunConfig, reported: set[str]) -> list[tuple[str, str]]:
    """The model the started services would load, read from its config.json (no torch): a
    directory that is no model, or a context too short for any prompt plus a full response.

    Only for services the coordinator starts: an attached service reads its model where it runs
    (maybe another machine) and validates its own settings."""
    addresses = run.addresses()
    started = [name for name in run.services_used() if not addresses[name]]
    path = str(run.given.get("hf_checkpoint") or "")
    if not started or not path or "hf_checkpoint" in reported:
        return []
    config_json = Path(path) / "config.json"
    if not Path(path).is_dir():
        problem = "is not a directory" if Path(path).exists() else "does not exist"
        return [("hf_checkpoint", f"{path} {problem} (the run starts {', '.join(started)}, which load it)")]
    try:
        model_config = json.loads(config_json.read_text())
    except FileNotFoundError:
        return [("hf_checkpoint", f"{path} is not a Hugging Face model directory (no config.json)")]
    except (OSError, ValueError) as exc:
        return [("hf_checkpoint", f"{config_json} cannot be read as JSON: {exc}")]
    if not isinstance(model_config, dict):
        return [("hf_checkpoint", f"{config_json} is not a model config (a JSON object)")]
    if "rollout" not in started or "loss_type" in reported:
        # Only the rollout service generates: nothing else needs room for a response. A refused
        # loss_type leaves the run's mode unknown (SFT starts no rollout): no knock-on rule (#38).
        return []
    return _context_problems(run, model_config, config_json)


def _context_problems(run: RunConfig, model_config: dict, config_json: Path) -> list[tuple[str, str]]:
    """Every prompt has at least one token: a response of rollout_max_response_len must leave room."""
    response_len = run.coordinator.rollout_max_response_len
    prompt_len = run.dataloader.rollout_max_prompt_len
    if run.rollout.rollout_max_context_len:
        context_len = run.rollout.rollout_max_context_len
        source = f"rollout_max_context_len {context_len}"
    else:
        text_config = model_config.get("text_config") or {}
        found = [
            (k, c[k])
            for c in (model_config, text_config)
            for k in CONTEXT_LENGTH_KEYS
            if isinstance(c.get(k), int)
        ]
        if not found:
            return []  # the model does not say; the rollout service checks each request
        key, context_len = found[0]
        source = f"the model's context of {context_len} tokens ({key} in {config_json})"
    if response_len >= context_len:
        return [
            (
                "rollout_max_response_len",
                f"{response_len} leaves no room for a prompt in {source}: "
                f"every prompt would be refused; lower it below {context_len}",
            )
        ]
    if prompt_len and prompt_len + response_len > context_len:
        return [
            (
                "rollout_max_response_len",
                f"{response_len} plus rollout_max_prompt_len {prompt_len} exceeds {source}: prompts "
                f"of up to {prompt_len} tokens are admitted but would be refused; lower either so "
                f"that their sum is at most {context_len}",
            )
        ]
    return []
