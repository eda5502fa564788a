"""deploy/Dockerfile and the root .dockerignore, without a container engine.

The build context is computed from .dockerignore with the rules of Docker's pattern matcher
(moby/patternmatcher: `**`, `!` exceptions, the last matching pattern wins, a path is excluded when
it or one of its parent folders is); where docker-compose 1.29 is installed, the same context is
also taken from docker-py, whose `exclude_paths` is what 1.29 sends to the engine. The Dockerfile's
install step runs as a shell script with pip and the system tools replaced by recorders.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from support.sglang_servers import VERSIONS, sglang_venv

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


# --- .dockerignore ------------------------------------------------------------------------------


def read_dockerignore(text: str) -> list[tuple[bool, re.Pattern]]:
    """(is_exception, regex) per pattern, as moby's ignorefile.ReadAll and Pattern.compile do."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        line = posixpath.normpath(line[1:].strip() if exception else line)
        line = line[1:] if len(line) > 1 and line.startswith("/") else line
        patterns.append((exception, re.compile(_pattern_regex(line))))
    return patterns


def _pattern_regex(pattern: str) -> str:
    regex, i = "^", 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
            regex += ".*" if i == len(pattern) else "(.*/)?"
            continue
        if ch == "*":
            regex += "[^/]*"
        elif ch == "?":
            regex += "[^/]"
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            regex += re.escape(pattern[i])
        elif ch in "[]":
            regex += ch
        else:
            regex += re.escape(ch)
        i += 1
    return regex + "$"


def is_excluded(path: str, patterns) -> bool:
    """moby's PatternMatcher.MatchesOrParentMatches: the last pattern matching path or a parent wins."""
    parents = path.split("/")[:-1]
    excluded = False
    for exception, regex in patterns:
        if exception != excluded:
            continue  # an exclusion cannot change an excluded path, nor an exception an included one
        if regex.match(path) or any(regex.match("/".join(parents[: i + 1])) for i in range(len(parents))):
            excluded = not exception
    return excluded


def build_context(root: Path) -> dict[str, int]:
    """Files (relative path -> size) that a build with context `root` receives."""
    text = (root / ".dockerignore").read_text()
    patterns = read_dockerignore(text)
    exceptions = [line.strip()[1:].strip() for line in text.splitlines() if line.strip().startswith("!")]
    files = {}
    for directory, dirnames, filenames in os.walk(root):
        relative = Path(directory).relative_to(root).as_posix()
        prefix = "" if relative == "." else relative + "/"
        # Like the engine, skip a folder that is excluded unless an exception names something in it.
        dirnames[:] = [
            d
            for d in dirnames
            if not is_excluded(prefix + d, patterns)
            or any(e.startswith(prefix + d + "/") for e in exceptions)
        ]
        for name in filenames:
            if not is_excluded(prefix + name, patterns):
                files[prefix + name] = (Path(directory) / name).lstat().st_size
    return files


def dockerfile_copy_sources() -> list[str]:
    sources = []
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if words and words[0] in ("COPY", "ADD"):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


# A working checkout: what the image needs, and what a developer's tree also holds.
KEEP = [
    "pyproject.toml",
    "README.md",
    "services/__init__.py",
    "services/common/server.py",
    "services/common/v1/common_pb2.py",
    "services/common/v1/descriptors.binpb",
    "services/rollout/engines/hf.py",
]
DROP = [
    ".venv/lib/python3.11/site-packages/torch/__init__.py",
    ".venv/bin/python",
    ".git/HEAD",
    ".git/objects/ab/cdef",
    "runs/demo/runs/sft/metrics.jsonl",
    "bench/results/bench.json",
    "bench/bench_dataloader.py",
    ".pytest_cache/v/cache/lastfailed",
    ".ruff_cache/0.17.5/123",
    ".cache/huggingface/hub/x",
    "node_modules/@grpc/grpc-js/package.json",
    "tests/e2e/node_modules/@grpc/proto-loader/index.js",
    "rollway.egg-info/PKG-INFO",
    "services/rollway.egg-info/SOURCES.txt",
    "services/__pycache__/__init__.cpython-311.pyc",
    "services/common/__pycache__/server.cpython-311.pyc",
    "services/common/v1/__pycache__/common_pb2.cpython-311.pyc",
    "services/node_modules/x.js",
    "tiny-model/config.json",
    "tests/integration/test_deploy_image.py",
    "protos/rollway/common/v1/common.proto",
    "deploy/configs/grpo-gpu.yaml",
    "Makefile",
]


@pytest.fixture
def checkout(tmp_path) -> Path:
    for path in KEEP + DROP:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(path)
    shutil.copy(ROOT / ".dockerignore", tmp_path / ".dockerignore")
    return tmp_path


def test_the_build_context_holds_what_the_dockerfile_copies_and_nothing_else(checkout):
    assert dockerfile_copy_sources() == ["pyproject.toml", "README.md", "services"]
    assert sorted(build_context(checkout)) == sorted(KEEP)


def test_the_build_context_of_this_checkout_is_small_and_complete():
    context = build_context(ROOT)
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", *dockerfile_copy_sources()],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    missing = [path for path in tracked if path and (ROOT / path).is_file() and path not in context]
    assert missing == []  # everything the Dockerfile copies that git tracks is sent
    outside = sorted({path.split("/")[0] for path in context} - set(dockerfile_copy_sources()))
    assert outside == []
    assert not [p for p in context if "__pycache__" in p or ".egg-info" in p or p.endswith(".pyc")]
    assert sum(context.values()) < 20 * 2**20, f"{sum(context.values()) / 2**20:.1f} MiB"


def test_the_matcher_follows_dockers_rules():
    patterns = read_dockerignore("# c\n/a\n**/b\n!a/keep\n*.log\n!important.log\nx/**/y\n")
    assert is_excluded("a", patterns) and is_excluded("a/deep/file", patterns)
    assert not is_excluded("a/keep", patterns) and not is_excluded("a/keep/inner", patterns)
    assert is_excluded("b", patterns) and is_excluded("p/q/b/file", patterns)
    assert is_excluded("debug.log", patterns) and not is_excluded("important.log", patterns)
    assert not is_excluded("dir/debug.log", patterns)  # `*` does not cross folders
    assert is_excluded("x/y", patterns) and is_excluded("x/1/2/y", patterns)
    assert not is_excluded("c", patterns)


def _docker_py_python() -> str | None:
    """The interpreter of docker-compose 1.x (it carries docker-py)."""
    path = shutil.which("docker-compose")
    if path is None:
        return None
    with open(path, "rb") as f:
        first = f.readline().decode(errors="replace")
    python = first[2:].strip().split()[0] if first.startswith("#!") else ""
    if (
        not python
        or subprocess.run([python, "-c", "import docker.utils.build"], capture_output=True).returncode
    ):
        return None
    return python


@pytest.mark.skipif(
    _docker_py_python() is None,
    reason="docker-compose 1.x with docker-py is not installed (apt-get install docker-compose); "
    "the tests above apply Docker's rules without it",
)
def test_docker_py_sends_the_same_context(checkout):
    """docker-py's exclude_paths is what docker-compose 1.29 tars up for `build`."""
    script = (
        "import json, os, sys\n"
        "from docker.utils.build import exclude_paths\n"
        "root = sys.argv[1]\n"
        "with open(os.path.join(root, '.dockerignore')) as f:\n"
        "    patterns = [l.strip() for l in f.read().splitlines() if l.strip() and l.strip()[0] != '#']\n"
        "paths = exclude_paths(root, patterns, dockerfile='deploy/Dockerfile')\n"
        "print(json.dumps(sorted(p for p in paths if os.path.isfile(os.path.join(root, p)))))\n"
    )
    (checkout / "deploy" / "Dockerfile").write_text("FROM scratch\n")
    result = subprocess.run(
        [_docker_py_python(), "-c", script, str(checkout)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    sent = set(json.loads(result.stdout)) - {".dockerignore", "deploy/Dockerfile"}  # always sent
    assert sorted(sent) == sorted(KEEP)


# --- the install step ---------------------------------------------------------------------------


def install_step() -> tuple[str, dict[str, str]]:
    """The Dockerfile's RUN that installs rollway, and the defaults of its build arguments."""
    text = DOCKERFILE.read_text().replace("\\\n", "")
    defaults = dict(re.findall(r"^ARG (\w+)=(.*)$", text.split("\nFROM ", 1)[1], re.M))
    (script,) = [line[4:] for line in text.splitlines() if line.startswith("RUN ") and "VARIANT" in line]
    return script, defaults


def run_install_step(tmp_path: Path, **build_args: str) -> list[list[str]]:
    """Runs the step with pip, python and the user/folder tools recording their arguments instead."""
    script, defaults = install_step()
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    log.write_text("")
    for tool in ("pip", "python", "useradd", "mkdir", "chown"):
        (tools / tool).write_text(
            f'#!/bin/sh\nprintf "%s" {tool} >> "$CALLS"\n'
            'for a in "$@"; do printf "\\037%s" "$a" >> "$CALLS"; done\nprintf "\\n" >> "$CALLS"\n'
        )
        (tools / tool).chmod(0o755)
    env = {
        **defaults,
        **build_args,
        "PATH": f"{tools}:/usr/bin:/bin",
        "CALLS": str(log),
    }
    result = subprocess.run(
        ["sh", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return [line.split("\x1f") for line in log.read_text().splitlines()]


@pytest.mark.parametrize(
    "build_args, index",
    [
        ({"VARIANT": "cpu"}, "https://download.pytorch.org/whl/cpu"),
        ({"VARIANT": "gpu"}, "https://download.pytorch.org/whl/cu128"),
        (
            {"VARIANT": "cpu", "TORCH_INDEX": "https://mirror.example/torch/cpu"},
            "https://mirror.example/torch/cpu",
        ),
        ({"VARIANT": "gpu", "TORCH_INDEX": "cu126"}, "https://download.pytorch.org/whl/cu126"),
    ],
)
def test_torch_comes_from_the_torch_index_build_argument(tmp_path, build_args, index):
    calls = run_install_step(tmp_path, **build_args)
    torch = [c for c in calls if c[0] == "pip" and any(a.startswith("torch==") for a in c)]
    assert torch == [["pip", "install", "torch==2.13.0", "--index-url", index]]
    assert ["pip", "install", ".[ml]"] in calls  # the rest from pip's own index, torch pin satisfied


@pytest.mark.sglang
def test_the_gpu_image_pins_a_tested_sglang_release_with_its_torch(tmp_path):
    _, defaults = install_step()
    version = defaults["SGLANG_VERSION"]
    assert version in VERSIONS  # a release the adapter's tests run against real servers
    calls = run_install_step(tmp_path, VARIANT="gpu")
    assert ["pip", "install", f"sglang[all]=={version}"] in calls
    # The torch the image installs first is the one that release pins (its own wheel metadata).
    (metadata,) = sglang_venv(version).glob(f"lib/python*/site-packages/sglang-{version}.dist-info/METADATA")
    assert re.findall(r"^Requires-Dist: torch==(\S+)$", metadata.read_text(), re.M) == [
        defaults["TORCH_VERSION"]
    ]
