"""Import rules: the package's layers, and services that never import each other.

    cli, demo          the commands and the demo (above everything they use)
    deploy             launch code: `rollway run`, `rollway up`, chaos
    gateway            the Tinker API's process (it starts services, and sizes them with the planner)
    environment        the Environment service: rollout's environments served over gRPC
    openenv_host       the process that serves a user's OpenEnv app (it imports only common)
    the four services  dataloader, rollout, trainer, coordinator
    common             shared runtime (common/supervision: starting and watching a run's services)

A module imports only its own layer and those below, so neither the coordinator <-> deploy nor the
deploy <-> demo cycle can come back. Services never import each other: only the generated protos
(rollway.<service>.v1), the shared runtime (rollway.common) and, as the schema of a run config,
another service's settings module (rollway.<service>.config: torch-free dataclasses the
coordinator validates a whole run against before anything starts). Of the services only the
coordinator starts services (rollway.common.supervision). The gateway, a process above the
services, imports what a service may, supervision, and the run planner (rollway.coordinator.plan),
which sizes its trainers as `rollway run` sizes a run's. The Environment service hosts the
rollout's environments: of the rollout it imports those, its settings and its protos.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVICES = ("dataloader", "rollout", "trainer", "coordinator")
ROOT = Path(__file__).resolve().parents[3] / "services"
# Each layer and the top-level parts of `rollway` it may import (its own and those below).
LAYERS = {
    "common": {"common"},
    **{service: {"common", *SERVICES} for service in SERVICES},
    "gateway": {"common", *SERVICES, "gateway"},
    "environment": {"common", "rollout", "environment"},
    "openenv_host": {"common", "openenv_host"},
    "deploy": {"common", *SERVICES, "deploy"},
    "demo": {"common", *SERVICES, "deploy", "demo"},
    "cli": {"common", *SERVICES, "gateway", "deploy", "demo", "cli"},
}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {m for m in modules if m.startswith("rollway.")}


def allowed(service: str, module: str) -> bool:
    parts = module.split(".")
    if parts[1:3] == ["common", "supervision"]:
        return service in ("coordinator", "gateway")
    if service == "gateway" and parts[1:3] == ["coordinator", "plan"]:
        return True
    if service == "environment" and parts[1:3] == ["rollout", "environments"]:
        return True
    if parts[1] in ("common", service):
        return True
    if parts[1] in SERVICES:
        return len(parts) >= 3 and parts[2] in ("v1", "config")
    return False


def layer_of(path: Path) -> str:
    """`common`, a service, `deploy`, `demo` or `cli`: the first part of the path under services/."""
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def test_every_module_imports_only_its_own_layer_and_those_below():
    broken = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent == ROOT and path.name == "__init__.py":
            continue
        layer = layer_of(path)
        assert layer in LAYERS, f"{path.relative_to(ROOT)}: in no layer; add it to LAYERS"
        for module in sorted(imported_modules(path)):
            if module.split(".")[1] not in LAYERS[layer] | {"__version__"}:
                broken.append(f"{path.relative_to(ROOT)} ({layer}) imports {module}")
    assert not broken, "\n".join(broken)


def test_services_import_only_protos_common_and_settings_schemas_of_each_other():
    broken = []
    for service in (*SERVICES, "gateway", "environment", "openenv_host"):
        for path in sorted((ROOT / service).rglob("*.py")):
            if "/v1/" in str(path):
                continue
            for module in sorted(imported_modules(path)):
                if not allowed(service, module):
                    broken.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not broken, "\n".join(broken)


def test_settings_modules_stay_schemas():
    """A settings module imports only rollway.common and its own service's pure helpers, and no torch."""
    for service in SERVICES:
        path = ROOT / service / "config.py"
        tree = ast.parse(path.read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
        }
        assert "torch" not in roots, path
        for module in imported_modules(path):
            assert module.split(".")[1] in ("common", service), f"{path} imports {module}"
