"""No two modules import each other, not even through a function-local import.

A cycle hidden behind an import inside a function is still two modules that
each need the other; only imports under ``if TYPE_CHECKING:`` (which never
run) are left out. The graph covers ``core/nxrt``, every plugin package
under ``plugins/`` and every tool package under ``tools/`` (the fuzzer). Edges:

- ``import a.b`` and ``from a.b import name`` depend on ``a.b``; but
  ``from a import b`` where ``a.b`` is a module depends on ``a.b`` itself;
- relative imports are resolved against the importing module's package;
- a module importing one of its own ancestor packages is not counted: the
  package's ``__init__`` is its public face, not a peer.
"""

from __future__ import annotations

import ast
import textwrap
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` of its file."""

    source: str
    target: str
    line: int


def package_roots(root: Path = ROOT) -> dict[str, Path]:
    """Import name -> folder of each package in the graph: nxrt, every plugin and tool package."""
    roots = {"nxrt": root / "core" / "nxrt"}
    inits = [*root.glob("plugins/*/*/__init__.py"), *root.glob("tools/*/*/__init__.py")]
    for init in sorted(inits):
        roots[init.parent.name] = init.parent
    return roots


def find_modules(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file below each root."""
    modules = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every import statement that can run: module level and inside functions, classes, ifs.

    The body of ``if TYPE_CHECKING:`` is skipped; its ``else`` branch runs, so it is kept.
    """
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The deepest module of the graph that ``name`` is or lies in (``None``: outside)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]):
    """The dotted names one import statement depends on."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if modules[module].name != "__init__.py":
            package.pop()
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    targets = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        targets.append(submodule if submodule in modules else base)
    return targets


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every import between two modules of the graph (ancestor packages left out)."""
    edges = set()
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            for name in _targets(module, node, modules):
                target = _known(name, modules)
                if target is None or target == module or module.startswith(target + "."):
                    continue
                edges.add(Edge(module, target, node.lineno))
    return sorted(edges, key=lambda e: (e.source, e.target, e.line))


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for edge in edges:
        succ[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(succ[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(succ[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(components)


def shortest_cycle(component: list[str], edges: list[Edge]) -> list[Edge]:
    """One shortest cycle through the component's first module, edge by edge."""
    members = set(component)
    first: dict[tuple[str, str], Edge] = {}
    for edge in edges:
        if edge.source in members and edge.target in members:
            first.setdefault((edge.source, edge.target), edge)
    start = component[0]
    came_from: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for (source, target), edge in first.items():
            if source != node:
                continue
            if target == start:
                path = [edge]
                while path[0].source != start:
                    path.insert(0, came_from[path[0].source])
                return path
            if target not in came_from:
                came_from[target] = edge
                queue.append(target)
    raise AssertionError(f"{component} is not a cycle")


def describe(component: list[str], edges: list[Edge], modules: dict[str, Path]) -> str:
    cycle = shortest_cycle(component, edges)
    steps = [
        f"    {e.source} -> {e.target}  ({modules[e.source].relative_to(ROOT)}:{e.line})"
        for e in cycle
    ]
    return f"cycle among {', '.join(component)}:\n" + "\n".join(steps)


def test_no_module_imports_another_that_imports_it_back():
    modules = find_modules(package_roots())
    edges = import_edges(modules)
    components = strongly_connected(sorted(modules), edges)
    report = "\n".join(describe(c, edges, modules) for c in components)
    print(report)
    assert not components, f"{len(components)} import cycle(s):\n{report}"


# -- the graph builder itself, on a package made for it -----------------------------------------


def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / "core" / "nxrt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return find_modules(package_roots(root))


def pairs(modules: dict[str, Path]) -> set[tuple[str, str]]:
    return {(e.source, e.target) for e in import_edges(modules)}


def test_function_local_imports_count_and_type_checking_ones_do_not(tmp_path):
    modules = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from nxrt import c
                else:
                    import nxrt.d
                def f():
                    from nxrt.b import thing
            """,
            "b.py": "thing = 1\n",
            "c.py": "",
            "d.py": "",
        },
    )
    assert pairs(modules) == {("nxrt.a", "nxrt.b"), ("nxrt.a", "nxrt.d")}


def test_from_package_import_submodule_is_an_edge_to_the_submodule(tmp_path):
    modules = write_package(
        tmp_path,
        {
            "__init__.py": "hookimpl = None\n",
            "ops/__init__.py": "from . import nn\nfrom .nn import relu\n",
            "ops/nn.py": "from .. import hookimpl\nfrom ..ops import _table\nrelu = 1\n",
            "ops/_table.py": "",
            "plugin.py": "from nxrt.ops import nn, relu\n",
        },
    )
    assert pairs(modules) == {
        ("nxrt.ops", "nxrt.ops.nn"),
        ("nxrt.ops.nn", "nxrt.ops._table"),  # not nxrt or nxrt.ops: its own ancestors
        ("nxrt.plugin", "nxrt.ops.nn"),
        ("nxrt.plugin", "nxrt.ops"),
    }


def test_a_cycle_is_found_and_described(tmp_path):
    modules = write_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "import nxrt.b\n",
            "b.py": "def f():\n    from nxrt import c\n",
            "c.py": "from nxrt.a import x\n",
            "d.py": "import nxrt.a\n",
        },
    )
    edges = import_edges(modules)
    (component,) = strongly_connected(sorted(modules), edges)
    assert component == ["nxrt.a", "nxrt.b", "nxrt.c"]
    assert [(e.source, e.target, e.line) for e in shortest_cycle(component, edges)] == [
        ("nxrt.a", "nxrt.b", 1),
        ("nxrt.b", "nxrt.c", 2),
        ("nxrt.c", "nxrt.a", 1),
    ]
