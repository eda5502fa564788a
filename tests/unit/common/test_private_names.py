"""A module's `_private` names are its own: no other module under services/ reads or imports them.

Parts of a service talk through public names (STYLE.md), so that "go to definition" finds the
interface a part offers, and a module can change its internals without breaking another one.
Checked from the source (ast), like test_import_rules.py:

    from rollway.x import _name          another module's private name, imported
    something._name                       another module's private name, reached through an object
                                          or a module (self._name and cls._name are the owner's)

An attribute counts as another module's when some module under services/ defines that private
name (a function, class, class member or `self._name = ...`) and the module using it does not:
what a class of this module defines, its methods may read on any instance of it. Dunder names
are public by design; the generated protos (v1/) are not ours to check.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3] / "services"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def source_files(root: Path = ROOT) -> list[Path]:
    return [path for path in sorted(root.rglob("*.py")) if "v1" not in path.relative_to(root).parts]


def defined_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: its functions, classes, class members and attributes it sets."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {name for name in names if is_private(name)}


def violations(path: Path, tree: ast.AST, own: set[str], everyone: set[str], root: Path = ROOT) -> list[str]:
    where = path.relative_to(root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rollway."):
            for alias in node.names:
                if is_private(alias.name):
                    found.append(f"{where}:{node.lineno} imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in everyone and node.attr not in own:
                found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}")
    return found


def private_name_uses(root: Path = ROOT) -> list[str]:
    trees = {path: ast.parse(path.read_text()) for path in source_files(root)}
    defined = {path: defined_private_names(tree) for path, tree in trees.items()}
    everyone = set().union(*defined.values())
    return [
        use for path, tree in trees.items() for use in violations(path, tree, defined[path], everyone, root)
    ]


def test_no_module_under_services_uses_another_modules_private_names():
    uses = private_name_uses()
    assert not uses, "\n".join(uses)


def test_the_rule_sees_a_private_name_imported_or_reached_through_an_object(tmp_path):
    """The rule can fail: a planted use of another module's private name is reported."""
    (tmp_path / "owner.py").write_text("def _helper():\n    pass\n\nclass Box:\n    def __init__(self):\n"
                                       "        self._items = []\n        self.__dict__.clear()\n")  # fmt: skip
    (tmp_path / "user.py").write_text("from rollway.owner import _helper\n\ndef peek(box):\n"
                                      "    return box._items, box.__dict__\n")  # fmt: skip
    assert private_name_uses(tmp_path) == [
        "user.py:1 imports rollway.owner._helper",
        "user.py:4 reads box._items",
    ]
