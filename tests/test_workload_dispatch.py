"""No module outside the workload types (`costmodel.workloads`) asks which workload it holds.

The cost model, the search, the planner, the validator and the benchmarks ask the workload object
for its terms (`costmodel.workloads.base.WorkloadBase`) or look its lowering up in a table keyed by
its name (`validate.lowering.WORKLOAD_PROGRAMS`); none tests its identity. The source is read with
`ast`, so docstrings and comments may name workloads freely.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import costmodel.workloads as workloads

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("costmodel", "search", "planner", "validate", "benchmarks")
EXEMPT = ROOT / "costmodel" / "workloads"
WORKLOAD_NAMES = set(workloads.WORKLOAD_KINDS)
WORKLOAD_CLASSES = {name for name in dir(workloads) if isinstance(getattr(workloads, name), type)}
FLAG_ATTRIBUTES = {"is_lora", "is_inference"}
COMPARISONS = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot, ast.In, ast.NotIn)


def _names_workload(node: ast.expr) -> bool:
    """Whether an operand is a workload or its name: ``train.workload``, ``workload.kind``, ``WorkloadKind.DECODE``, ``"decode"``."""
    if isinstance(node, ast.Constant):
        return node.value in WORKLOAD_NAMES
    text = ast.unparse(node)
    return re.search(r"workload(\.kind|\.value)?$", text, re.IGNORECASE) is not None or "WorkloadKind." in text


def _questions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FLAG_ATTRIBUTES:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops) \
                and any(_names_workload(operand) for operand in (node.left, *node.comparators)):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass") \
                and len(node.args) == 2 and any(name in WORKLOAD_CLASSES for name in _class_names(node.args[1])):
            found.append((node.lineno, ast.unparse(node)))
    return found


def _class_names(node: ast.expr) -> list[str]:
    parts = node.elts if isinstance(node, ast.Tuple) else [node]
    return [p.id if isinstance(p, ast.Name) else p.attr for p in parts if isinstance(p, (ast.Name, ast.Attribute))]


def test_no_module_outside_the_workload_types_asks_which_workload_it_holds():
    offenders = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if EXEMPT in path.parents:
                continue
            for line, what in _questions(ast.parse(path.read_text(), filename=str(path))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not offenders, "ask the workload object instead (costmodel.workloads):\n" + "\n".join(offenders)


def test_the_scan_catches_each_kind_of_question():
    source = """
if train.is_lora: pass
if train.workload.kind == "decode": pass
if plan.train.workload is WorkloadKind.DECODE: pass
if workload in (WorkloadKind.PREFILL, WorkloadKind.DECODE): pass
if isinstance(train.workload, LoraFinetune): pass
if kind == "gpt2": pass
"""
    assert [line for line, _ in _questions(ast.parse(source))] == [2, 3, 4, 5, 6]
