"""The import order of docs/design.md, read from the source: costmodel ← search ← planner ←
validate ← planner/cli (← benchmarks), no module-level circles, and imports inside functions
only where they keep a heavy dependency (jax, ortools, matplotlib) off a command's cold start.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("costmodel", "search", "planner", "validate", "benchmarks")
HEAVY = ("jax", "jaxlib", "ortools", "matplotlib", "flax", "optax", "penzai", "transformers", "torch")

# What may be imported inside a function, and why: a heavy library, or a project module that
# imports one at module level (the test checks it does), kept off the cold start of the commands
# that do not need it.
LAZY_IMPORTS = {
    "jax": "only the reference model's arrays and PartitionSpec pytrees: plan's search reads parameter shapes and specs as tuples",
    "matplotlib": "only the PNG writers (the pipeline timeline, plan compare's figure) draw",
    "planner.inspect": "plan inspect traces a model (JAX) only when one is given; --mesh alone reads the fabric",
    "planner.intraop.stage": "OR-Tools and jaxpr extraction only for --planner ilp and the per-op search planners",
}


def layer(module: str) -> int:
    """Where a module sits in the import order: it may import only modules of its layer or below."""
    if module.startswith("planner.cli"):
        return 4
    return {"costmodel": 0, "search": 1, "planner": 2, "validate": 3, "benchmarks": 5}[module.split(".")[0]]


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    lazy: bool  # inside a function
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, path: Path, known: set[str]) -> list[Import]:
    """Every import of a project module or a heavy dependency, skipping ``if TYPE_CHECKING:`` blocks."""
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking_only(child):
                continue
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                names = [child.module, *(f"{child.module}.{alias.name}" for alias in child.names)]
            for name in names:
                target = name if name in known else None
                if target is None and name.split(".")[0] in HEAVY:
                    target = name.split(".")[0]
                if target is not None and target != module:
                    found.append(Import(module, target, lazy, child.lineno))
            visit(child, lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return found


def _all_imports() -> list[Import]:
    modules = _modules()
    known = set(modules)
    return [imp for module, path in modules.items() for imp in _imports(module, path, known)]


def _project(imports: list[Import]) -> list[Import]:
    return [i for i in imports if i.imported.split(".")[0] in PACKAGES]


def test_module_level_imports_point_one_way():
    wrong = [f"{i.importer}:{i.line} imports {i.imported}" for i in _project(_all_imports())
             if layer(i.imported) > layer(i.importer)]
    assert not wrong, "imports against costmodel ← search ← planner ← validate ← planner/cli:\n" + "\n".join(wrong)


def test_no_module_level_circles():
    graph = nx.DiGraph((i.importer, i.imported) for i in _project(_all_imports()) if not i.lazy)
    assert not list(nx.simple_cycles(graph))


def _reaches_heavy(graph: nx.DiGraph, module: str) -> bool:
    return module in graph and any(m in HEAVY for m in nx.descendants(graph, module))


def _module_level_graph(imports: list[Import]) -> nx.DiGraph:
    return nx.DiGraph((i.importer, i.imported) for i in imports if not i.lazy)


def test_imports_inside_functions_are_heavy_and_listed_with_their_reason():
    """An import inside a function is listed in `LAZY_IMPORTS`, and a listed project module
    really pulls in a heavy library at module level (else it belongs at the top of the file)."""
    imports = _all_imports()
    graph = _module_level_graph(imports)
    lazy = {i.imported: i for i in imports if i.lazy and i.importer.split(".")[0] != "benchmarks"}
    unlisted = sorted(f"{i.importer}:{i.line} imports {name}" for name, i in lazy.items() if name not in LAZY_IMPORTS)
    assert not unlisted, "imports inside functions not in LAZY_IMPORTS:\n" + "\n".join(unlisted)
    light = sorted(name for name in LAZY_IMPORTS if name not in HEAVY and not _reaches_heavy(graph, name))
    assert not light, f"listed as heavy but import no heavy library at module level (import them at the top): {light}"
    stale = sorted(set(LAZY_IMPORTS) - set(lazy))
    assert not stale, f"LAZY_IMPORTS lists imports that are gone: {stale}"


@pytest.mark.parametrize("module", ["planner.cli.main", "planner.cli.commands.plan_cmd", "planner.cli.commands.simulate_cmd",
                                    "costmodel.step.simulator"])
def test_light_modules_do_not_import_jax_at_module_level(module):
    """`plan` and `plan simulate` start without JAX: nothing they load imports a heavy library at module level."""
    imports = _all_imports()
    graph = _module_level_graph(imports)
    reached = nx.descendants(graph, module) if module in graph else set()
    carriers = sorted(m for m in reached if set(graph.successors(m)) & set(HEAVY))
    assert not carriers, f"{module} reaches a heavy library at import time through {carriers}"
