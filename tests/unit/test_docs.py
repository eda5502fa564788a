"""README.md and docs/*.md stay true.

Every command in their shell blocks (```sh, bash, shell, console) is in exactly one of three
lists below: run as written by tests/integration/test_docs_commands.py (RUN_HERE: cheap commands,
asserting on what they print or write), run by another test (TESTED_BY: its node id, checked to exist), or not runnable
in the suite (CANNOT_RUN_HERE: with the reason). The lists are checked both ways: a command the
docs gain needs an entry, and an entry whose command left the docs fails too. Links between the
pages (and their #anchors) and the repository paths they name in backticks must exist; the GRPO
step walk of docs/architecture.md must match the counts it states. These checks read files only
(a few seconds, in `make test-fast`).
"""

from __future__ import annotations

import ast
import glob
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# The tests that run RUN_HERE's commands (they start processes: not in the fast tier).
COMMAND_TESTS = ROOT / "tests" / "integration" / "test_docs_commands.py"

# Commands tests/integration/test_docs_commands.py runs as written: command -> its test there.
RUN_HERE = {
    "make run": "test_make_targets_run_what_the_docs_say",
    "make run-smollm2": "test_make_targets_run_what_the_docs_say",
    "make test": "test_make_targets_run_what_the_docs_say",
    "make test-fast": "test_make_targets_run_what_the_docs_say",
    ".venv/bin/rollway make-tiny-model /tmp/tiny": "test_the_first_runs_plan_what_the_readme_says",
    ".venv/bin/rollway plan sft.yaml": "test_the_first_runs_plan_what_the_readme_says",
    ".venv/bin/rollway plan grpo.yaml": "test_the_first_runs_plan_what_the_readme_says",
    "python -m rollway.dataloader --help": "test_a_service_lists_its_flags",
    ".venv/bin/rollway plot runs/RUN_ID": "test_plot_writes_the_charts_of_a_run",
    "python -c \"from rollway.demo.data import make_demo_data; make_demo_data('data', seed=0)\"": (
        "test_the_verifiers_example_makes_its_data"
    ),
}

# Commands another test runs (or the same thing through the same code): command -> node id.
TESTED_BY = {
    ".venv/bin/rollway run sft.yaml": (
        "tests/e2e/test_sft_run.py::test_sft_run_lowers_loss_and_streams_metrics_over_the_grpc_api"
    ),
    ".venv/bin/rollway run grpo.yaml": (
        "tests/integration/test_cli.py::test_a_killed_coordinator_is_restarted_and_the_run_succeeds"
    ),
    ".venv/bin/rollway serve trainer --hf-checkpoint /tmp/tiny --port 50052": (
        "tests/integration/test_cli.py::test_serve_help_lists_every_flag_of_that_service"
    ),
    ".venv/bin/rollway up --hold": (
        "tests/integration/test_cli.py::test_up_hold_serves_until_sigterm_then_stops_each_cleanly"
    ),
    ".venv/bin/rollway plan run.yaml": "tests/integration/test_cli.py::test_plan_prints_the_batch_arithmetic",
    ".venv/bin/rollway run run.yaml --trainer-addr H:P --rollout-addr H:P --dataloader-addr H:P": (
        "tests/e2e/test_demo.py::test_the_stopping_rule_runs_sft_in_chunks_on_the_same_services"
    ),
    ".venv/bin/rollway run run.yaml --launcher ray": (
        "tests/e2e/test_ray_launcher.py::test_grpo_on_ray_syncs_weights_from_the_trainer_actors_to_the_rollout_actor"
    ),
    ".venv/bin/rollway plan run.yaml --launcher ray": (
        "tests/e2e/test_ray_launcher.py::test_plan_says_where_each_actor_would_go_and_that_one_node_cannot_survive_its_loss"
    ),
    ".venv/bin/rollway dashboard runs/": "tests/e2e/test_dashboard_browser.py::test_finished_run_views",
    "python -m rollway.environment --environment custom "
    "--custom-generate-function-path my_env:GuessEnvironment --port 50070": (
        "tests/integration/test_remote_environment.py::test_episodes_run_against_an_environment_in_another_process"
    ),
    "rollway run cfg.yaml --environment remote --environment-url 127.0.0.1:50070": (
        "tests/integration/test_remote_environment.py::test_a_remote_environment_killed_mid_episode_fails_its_samples"
    ),
    "python -m rollway.openenv_host --openenv-app my_openenv:app --port 8000": (
        "tests/integration/test_openenv_environment.py::test_the_readme_example_runs_at_the_pinned_version"
    ),
    "rollway run cfg.yaml --environment openenv --openenv-url http://127.0.0.1:8000 "
    "--openenv-turns my_openenv:GuessTurns": (
        "tests/e2e/test_openenv_grpo.py::test_grpo_runs_on_a_managed_openenv_server_that_is_killed_and_restarted"
    ),
    'python -c "from rollway.rollout.environments.verifiers_env import export_prompts; '
    "export_prompts('vf_addition:load_taskset', 'prompts.jsonl')\"": (
        "tests/e2e/test_verifiers_grpo.py::test_readme_verifiers_example_runs_grpo_and_its_reward_rises"
    ),
    "PYTHONPATH=. rollway run vf_grpo.yaml": (
        "tests/e2e/test_verifiers_grpo.py::test_readme_verifiers_example_runs_grpo_and_its_reward_rises"
    ),
    "export TINKER_API_KEY=tml-my-secret": (
        "tests/e2e/test_tinker_readme.py::test_readme_tinker_loop_trains_saves_and_samples_through_rollway_gateway"
    ),
    'ROLLWAY_GATEWAY_TOKEN="$TINKER_API_KEY" rollway gateway --port 8765 --workdir gateway &': (
        "tests/e2e/test_tinker_readme.py::test_readme_tinker_loop_trains_saves_and_samples_through_rollway_gateway"
    ),
    "ROLLWAY_GATEWAY_URL=http://127.0.0.1:8765 python tinker_loop.py runs/tiny-model": (
        "tests/e2e/test_tinker_readme.py::test_readme_tinker_loop_trains_saves_and_samples_through_rollway_gateway"
    ),
}

# Commands that cannot run in the suite: command -> why.
CANNOT_RUN_HERE = {
    ".venv/bin/rollway run run.yaml --lr 1e-5": (
        "run.yaml (docs/configuration.md) names Qwen3-0.6B and /data files, absent here; flags over a "
        "config are tested by tests/integration/test_cli.py::test_config_errors_name_the_setting_before_anything_starts"
    ),
    ".venv/bin/rollway run run.yaml": (
        "the same 0.6B config; the dashboard line a run prints is asserted by tests/e2e/test_dashboard_browser.py"
    ),
}

# Repository paths the docs may name that a checkout does not hold: outputs of `make bench`.
GENERATED = ("bench/results/",)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    return FENCE.findall(text)


def shell_commands(text: str) -> list[str]:
    """The commands of a page's shell blocks: continuations joined, comments and prompts dropped."""
    commands = []
    for language, body in fenced_blocks(text):
        if language not in SHELL_LANGUAGES:
            continue
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            line = re.sub(r"\s{2,}#.*$", "", line).strip().removeprefix("$ ")
            if line and not line.startswith("#"):
                commands.append(" ".join(line.split()))
    return commands


def documented_commands() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for command in shell_commands(page.read_text()):
            found.setdefault(command, []).append(page.name)
    return found


def block_starting(page: Path, first_line: str) -> str:
    for _, body in fenced_blocks(page.read_text()):
        if body.startswith(first_line):
            return body
    raise AssertionError(f"{page.name} has no code block starting with {first_line!r}")


def prose(text: str) -> str:
    """A page without its fenced blocks (links and paths in code are the code's business)."""
    return FENCE.sub("", text)


def test_every_documented_command_is_run_tested_or_excused_and_every_entry_is_documented():
    listed = [*RUN_HERE, *TESTED_BY, *CANNOT_RUN_HERE]
    assert len(listed) == len(set(listed)), "a command is in more than one list"
    documented = documented_commands()
    unlisted = {c: pages for c, pages in documented.items() if c not in listed}
    assert not unlisted, f"commands in the docs that no test runs or excuses: {unlisted}"
    stale = [c for c in listed if c not in documented]
    assert not stale, f"listed commands no longer in the docs: {stale}"


def test_the_commands_run_here_have_their_test():
    tree = ast.parse(COMMAND_TESTS.read_text())
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert set(RUN_HERE.values()) <= names, set(RUN_HERE.values()) - names


@pytest.mark.parametrize("node_id", sorted(set(TESTED_BY.values())))
def test_the_tests_named_for_commands_exist(node_id):
    path, name = node_id.split("::")
    assert (ROOT / path).is_file(), f"{path} does not exist"
    tree = ast.parse((ROOT / path).read_text())
    names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert name in names, f"{path} has no {name}"


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings."""
    headings = re.findall(r"^#+ (.+)$", prose(page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files_and_headings_that_exist(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists() or (anchor and anchor not in anchors(resolved)):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_repository_paths_named_in_backticks_exist(page):
    pattern = r"`((?:services|tests|bench|deploy|docs|protos)/[^`\s]*)`"
    named = re.findall(pattern, prose(page.read_text()))
    missing = [
        path
        for path in named
        if not path.startswith(GENERATED)
        and not (glob.glob(str(ROOT / path)) if any(c in path for c in "*?[") else (ROOT / path).exists())
    ]
    assert not missing, f"{page.name} names paths that do not exist: {missing}"


def grpo_step_walk() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    walk = text[text.index("## One synchronous GRPO step") :]
    return walk[: walk.index("\n## ", 1)]


def test_the_grpo_step_walk_matches_its_counts():
    walk = grpo_step_walk()
    stated = re.search(r"\*\*Files: (\d+), returns: (\d+)\*\*", walk)
    assert stated, "the walk no longer states its counts"
    lines = re.findall(r"^\d+\. `([^`]+)` - (.*)$", walk, re.M)
    assert lines, "the walk has no numbered files"
    files = [path for path, _ in lines]
    returns = [i for i, f in enumerate(files) if f in files[:i]]
    assert (len(set(files)), len(returns)) == (int(stated[1]), int(stated[2]))
    # Every return, and only a return, is marked with its kind; the stated counts by kind hold.
    kinds = [re.search(r"\*\[(phase|lookup|ping-pong)\]\*$", rest) for _, rest in lines]
    assert [i for i, kind in enumerate(kinds) if kind] == returns, (
        "a return without its kind, or a kind on a first visit"
    )
    by_kind = re.search(r"\*\*by\s+kind: phase (\d+), lookup (\d+), ping-pong (\d+)\*\*", walk)
    assert by_kind, "the walk no longer states its returns by kind"
    counted = [sum(1 for k in kinds if k and k[1] == name) for name in ("phase", "lookup", "ping-pong")]
    assert counted == [int(n) for n in by_kind.groups()]


def names_defined(path: Path) -> set[str]:
    """The functions and classes a module defines, and its classes' methods as Class.method."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body if hasattr(item, "name"))
    return names


def names_not_defined(walk: str) -> list[str]:
    """Names a walk line says are in its file but are not defined there. A line reads
    "N. `path` - `name` -> `name`: what happens"; the names before its first colon are the file's,
    and those in parentheses say where a call comes from (another file's)."""
    wrong = []
    for number, path, rest in re.findall(r"^(\d+)\. `([^`]+\.py)` - (.*)$", walk, re.M):
        head = re.split(r":(?=\s)(?=(?:[^`]*`[^`]*`)*[^`]*$)", rest, maxsplit=1)[0]
        head = re.sub(r"\([^)]*\)", "", head)
        defined = names_defined(ROOT / path)
        wrong += [
            f"{number}. {path}: {name}"
            for name in re.findall(r"`([A-Za-z_][\w.]*)`", head)
            if name not in defined
        ]
    return wrong


def test_each_function_on_a_walk_line_is_defined_in_that_lines_file():
    assert names_not_defined(grpo_step_walk()) == []
    planted = "1. `services/trainer/engine.py` - `TrainerEngine.train` -> `no_such_pass`: made up.\n"
    assert names_not_defined(planted) == ["1. services/trainer/engine.py: no_such_pass"]
