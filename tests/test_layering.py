"""The layout of core: which subpackage may import which, and no import cycles.

Read from the source (``ast``), not by importing: an import inside a function
is lazy and may go anywhere; a module-level import is a layer edge; an import
under ``if TYPE_CHECKING:`` is a type-level edge. The package root's own
type-checking imports (the names ``nxrt.X`` re-exports lazily) are not edges:
nothing runs them.
"""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

from nxrt import _moved

CORE = Path(__file__).resolve().parent.parent / "core"
#: Each subpackage, and what it may import at module level (the root is the EP-author API).
MAY_IMPORT = {
    "root": {"root"},
    "moe": {"root"},
    "pipeline": {"root", "moe"},
    "ort": {"root", "moe", "pipeline"},
    "capi": {"root", "ort"},
    "tools": {"root", "moe", "pipeline", "ort", "capi", "tools"},
}
#: Type-level edges allowed beyond MAY_IMPORT: the EP API names the expert residency
#: manager the session hands MoE kernels.
MAY_NAME = {"root": {"moe"}}
#: The EP-author vocabulary from the bottom up: each module may name only those before it,
#: at module or at type level (an EP holds a kernel table; a descriptor builds an EP).
VOCABULARY = [
    "nxrt.kernel",
    "nxrt.subgraph",
    "nxrt.registry",
    "nxrt.epcontext",
    "nxrt.provider",
    "nxrt.ep_registry",
]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((CORE / "nxrt").rglob("*.py")):
        parts = path.relative_to(CORE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return "root" if len(parts) <= 2 else parts[1]


def edges() -> dict[str, dict[str, set[str]]]:
    """``{"module": {...}, "type": {...}}``: each module's nxrt imports of that kind."""
    known = modules()
    found: dict[str, dict[str, set[str]]] = {"module": {}, "type": {}}
    for module, path in known.items():
        for kind, targets in imports_of(module, path, set(known)).items():
            found[kind][module] = targets
    return found


def imports_of(module: str, path: Path, known: set[str]) -> dict[str, set[str]]:
    """The nxrt modules ``module`` imports, by kind (``module`` or ``type``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    mine: dict[str, set[str]] = {"module": set(), "type": set()}

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def add(name: str, kind: str, from_package: bool = False) -> None:
        if not name.startswith("nxrt"):
            return
        target = resolve(name)
        if target and target != module and not (target == "nxrt" and not from_package):
            mine[kind].add(target)

    def visit(body: list[ast.stmt], kind: str) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                if module != "nxrt":  # the root's lazy re-exports
                    visit(node.body, "type")
                visit(node.orelse, kind)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []), kind)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body, kind)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, kind)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                add(base, kind, from_package=True)
                for alias in node.names:
                    add(f"{base}.{alias.name}", kind)

    visit(ast.parse(path.read_text()).body, "module")
    return mine


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_every_subpackage_says_what_it_owns_and_may_import():
    for name, path in modules().items():
        if path.name == "__init__.py" and name not in ("nxrt", "nxrt.capi"):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "May import" in doc, f"{name}'s docstring names no layer rule"


def test_each_subpackage_imports_only_the_layers_below_it():
    found = edges()
    wrong = []
    for kind, graph in found.items():
        for module, targets in graph.items():
            allowed = MAY_IMPORT[layer(module)] | {layer(module)}
            if kind == "type":
                allowed = allowed | MAY_NAME.get(layer(module), set())
            wrong += [
                f"{module} -> {t} ({kind})"
                for t in sorted(targets)
                if t != "nxrt" and layer(t) not in allowed
            ]
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_module_level_import_cycle():
    assert cycles(edges()["module"]) == []


def test_no_type_level_cycle():
    found = edges()
    graph = {m: found["module"][m] | found["type"][m] for m in found["module"]}
    assert cycles(graph) == []


def test_the_ep_vocabulary_names_only_what_lies_below_it():
    found = edges()
    wrong = []
    for height, module in enumerate(VOCABULARY):
        named = found["module"][module] | found["type"][module]
        above = named & set(VOCABULARY[height:])
        wrong += [f"{module} names {other}" for other in sorted(above)]
    assert wrong == []


def test_the_layering_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The checks above fail on a wrong import (so they are not vacuous)."""
    assert layer("nxrt.kernel") == "root" and layer("nxrt.pipeline.stages") == "pipeline"
    found = edges()
    assert "nxrt.pipeline.stages" in found["module"]["nxrt.ort.session"]
    assert "nxrt.pipeline.executor" not in found["type"]["nxrt.subgraph"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [{"a", "b"}]


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_module_path_still_imports_with_a_deprecation_warning(old):
    new = _moved.MOVED[old]
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        monkey = sys.modules.pop(name)
        assert monkey is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)
    sys.modules.pop(old, None)


@pytest.mark.parametrize("old", sorted(_moved.MOVED_NAMES), ids="{0[0]}.{0[1]}".format)
def test_a_name_that_moved_still_imports_from_its_old_module_with_a_warning(old):
    module, name = old
    new = _moved.MOVED_NAMES[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(importlib.import_module(module), name)
    assert found is getattr(importlib.import_module(new), name)
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught)


def test_a_name_that_never_existed_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="Nonexistent"):
        importlib.import_module("nxrt.registry").Nonexistent  # noqa: B018
    with pytest.raises(ImportError):
        exec("from nxrt.kernel import Nonexistent", {})
