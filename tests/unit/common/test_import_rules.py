"""Services never import each other: only the generated protos (rollway.<service>.v1), the shared
runtime (rollway.common) and, as the schema of a run config, another service's settings module
(rollway.<service>.config: torch-free dataclasses the coordinator validates a whole run against
before anything starts). The coordinator also uses the launch code (rollway.deploy)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVICES = ("dataloader", "rollout", "trainer", "coordinator")
ROOT = Path(__file__).resolve().parents[3] / "services"


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
    if parts[1] in ("common", service):
        return True
    if parts[1] in SERVICES:
        return len(parts) >= 3 and parts[2] in ("v1", "config")
    return service == "coordinator" and parts[1] == "deploy"


def test_services_import_only_protos_common_and_settings_schemas_of_each_other():
    broken = []
    for service in SERVICES:
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
