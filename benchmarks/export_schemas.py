"""Extract the names, types and allowed values of each launcher's arguments or config keys from
its own source at a pinned commit, into ``planner/cli/export_schemas/<stack>.json``.

    python -m benchmarks.export_schemas --mirror megatron=/path/to/Megatron-LM.git ...

Each mirror is a git directory (a clone or bare repository) holding the pinned commit; the
files are read with ``git show COMMIT:PATH`` and parsed with ``ast`` or ``yaml``, never
imported, so no launcher needs to install here. A data file records its repository, file(s)
and commit, and per key ``type`` (int, float, str, bool, list, dict, flag: an argparse switch
taking no value, or null: any) and ``choices`` where the source lists them.

Megatron-LM: every ``add_argument`` in ``megatron/training/arguments.py``, and the flags its
``ArgumentGroupFactory(Config, exclude=[...])`` makes from a config dataclass's fields
(``megatron/training/argument_utils.py``'s rules: ``--field-name``; a bool defaulting to False
is a store_true switch, one defaulting to True gets ``--no-``/``--disable-``; Optional[T] is T,
Literal gives choices, ``argparse_meta`` in the field's metadata overrides). DeepSpeed: the
key constants of ``deepspeed/runtime/constants.py`` with their defaults' types, and the fields
of the ZeRO and bf16/fp16 pydantic models; the launcher's flags
(``deepspeed/launcher/runner.py``) as ``launcher:--flag``. torchtitan (v0.2.2, the last TOML release): the
dataclass fields of ``torchtitan/config/job_config.py``, as ``section.key``. MaxText: every
top-level key of ``base.yml`` with its default's type.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parents[1] / "planner" / "cli" / "export_schemas"
SOURCES = {
    "megatron": {"repository": "NVIDIA/Megatron-LM", "commit": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
                 "files": ["megatron/training/arguments.py", "megatron/training/argument_utils.py"]},
    "maxtext": {"repository": "AI-Hypercomputer/maxtext", "commit": "e591f30cbbf217ed67ef71263ec0538239f9c3b8",
                "files": ["src/maxtext/configs/base.yml"]},
    "deepspeed": {"repository": "deepspeedai/DeepSpeed", "commit": "edaa7221267243c7be7fb49c5d5f5c4fb97b4641",
                  "files": ["deepspeed/runtime/constants.py", "deepspeed/runtime/zero/config.py", "deepspeed/runtime/precision_config.py",
                            "deepspeed/launcher/runner.py", "deepspeed/runtime/activation_checkpointing/config.py"]},
    "torchtitan": {"repository": "pytorch/torchtitan", "commit": "v0.2.2", "files": ["torchtitan/config/job_config.py"]},
}
_SIMPLE = {"int": "int", "float": "float", "str": "str", "bool": "bool", "list": "list", "dict": "dict"}


def git_show(mirror: Path, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(mirror), "show", f"{commit}:{path}"], check=True, capture_output=True, text=True).stdout


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def _annotation(node: ast.AST | None) -> tuple[str | None, list[Any] | None]:
    """(type, choices) of a field annotation: Optional/``| None`` stripped, Literal's values."""
    if node is None:
        return None, None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [p for p in (node.left, node.right) if not (isinstance(p, ast.Constant) and p.value is None)]
        return _annotation(parts[0]) if len(parts) == 1 else (None, None)
    if isinstance(node, ast.Subscript):
        outer = ast.unparse(node.value).split(".")[-1]
        if outer == "Optional":
            return _annotation(node.slice)
        if outer == "Literal":
            values = _literal(node.slice)
            values = list(values) if isinstance(values, tuple) else [values]
            return {bool: "bool", int: "int", float: "float"}.get(type(values[0]), "str"), values
        if outer in ("list", "List", "tuple", "Tuple"):
            return "list", None
        if outer in ("dict", "Dict"):
            return "dict", None
        if outer == "Union":
            parts = [p for p in node.slice.elts if not (isinstance(p, ast.Constant) and p.value is None)]
            return _annotation(parts[0]) if len(parts) == 1 else (None, None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _annotation(ast.parse(node.value, mode="eval").body)
    return _SIMPLE.get(ast.unparse(node)), None


def _argparse_entry(call: ast.Call) -> tuple[list[str], dict[str, Any]]:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = _literal(kw["action"]) if "action" in kw else None
    if action in ("store_true", "store_false", "store_const"):
        entry: dict[str, Any] = {"type": "flag"}
    else:
        kind = ast.unparse(kw["type"]) if "type" in kw else "str"
        entry = {"type": _SIMPLE.get(kind)}  # a converter the source defines (a lambda, an enum lookup) checks nothing here
        if "nargs" in kw:
            entry["nargs"] = _literal(kw["nargs"])
    if "choices" in kw and isinstance(_literal(kw["choices"]), (list, tuple)):
        entry["choices"] = list(_literal(kw["choices"]))
    return names, entry


def _classes(mirror: Path, commit: str) -> dict[str, tuple[ast.ClassDef, str]]:
    """Every class of megatron/ by name (first definition wins), with its file."""
    files = subprocess.run(["git", "-C", str(mirror), "ls-tree", "-r", "--name-only", commit, "megatron/"], check=True,
                           capture_output=True, text=True).stdout.split()
    found: dict[str, tuple[ast.ClassDef, str]] = {}
    for path in files:
        if not path.endswith(".py") or "/tests/" in path:
            continue
        text = git_show(mirror, commit, path)
        if "@dataclass" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, (node, path))
    return found


def _factory_flags(cls: str, classes: dict[str, tuple[ast.ClassDef, str]], exclude: set[str]) -> dict[str, dict[str, Any]]:
    """The flags ``ArgumentGroupFactory(cls)`` makes: the dataclass's fields and its bases'."""
    if cls not in classes:
        return {}
    node, _ = classes[cls]
    flags: dict[str, dict[str, Any]] = {}
    for base in node.bases:
        flags |= _factory_flags(ast.unparse(base).split(".")[-1], classes, exclude)
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)) or stmt.target.id in exclude:
            continue
        name = stmt.target.id
        if "ClassVar" in ast.unparse(stmt.annotation) or name.startswith("_"):
            continue
        kind, choices = _annotation(stmt.annotation)
        default = stmt.value
        meta: dict[str, Any] = {}
        if isinstance(default, ast.Call) and ast.unparse(default.func).endswith("field"):
            kws = {k.arg: k.value for k in default.keywords}
            default = kws.get("default")
            if isinstance(kws.get("metadata"), ast.Dict):
                for k, v in zip(kws["metadata"].keys, kws["metadata"].values):
                    if _literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                        meta = {_literal(mk): mv for mk, mv in zip(v.keys, v.values)}
        names = [f"--{name.replace('_', '-')}"]
        entry: dict[str, Any] = {"type": kind}
        if kind == "bool":
            entry = {"type": "flag"}
            if _literal(default) is True:
                names = [f"--no-{name.replace('_', '-')}", f"--disable-{name.replace('_', '-')}"]
        elif choices:
            entry["choices"] = choices
        if "arg_names" in meta and isinstance(_literal(meta["arg_names"]), list):
            names = _literal(meta["arg_names"])
        if "type" in meta:
            entry["type"] = _SIMPLE.get(ast.unparse(meta["type"]))
        if "choices" in meta and isinstance(_literal(meta["choices"]), (list, tuple)):
            entry["choices"] = list(_literal(meta["choices"]))
        if "nargs" in meta:
            entry["nargs"] = _literal(meta["nargs"])
        if meta.get("action") is not None and _literal(meta["action"]) in ("store_true", "store_false"):
            entry = {"type": "flag"}
        for flag in names:
            flags[flag] = entry
    return flags


def megatron(mirror: Path, commit: str) -> dict[str, dict[str, Any]]:
    tree = ast.parse(git_show(mirror, commit, "megatron/training/arguments.py"))
    classes = _classes(mirror, commit)
    keys: dict[str, dict[str, Any]] = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        lists = {t.id: _literal(s.value) for s in ast.walk(func) if isinstance(s, ast.Assign)
                 for t in s.targets if isinstance(t, ast.Name) and isinstance(_literal(s.value), list)}
        for call in (n for n in ast.walk(func) if isinstance(n, ast.Call)):
            fn = ast.unparse(call.func)
            if fn.endswith("add_argument"):
                names, entry = _argparse_entry(call)
                keys |= dict.fromkeys(names, entry)
            elif fn == "ArgumentGroupFactory" and call.args:
                ex = next((k.value for k in call.keywords if k.arg == "exclude"), None)
                excluded = set(lists.get(ex.id, []) if isinstance(ex, ast.Name) else (_literal(ex) or []) if ex else [])
                keys |= _factory_flags(ast.unparse(call.args[0]), classes, excluded)
    return dict(sorted(keys.items()))


def maxtext(mirror: Path, commit: str) -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(git_show(mirror, commit, SOURCES["maxtext"]["files"][0]))
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): None}
    return {k: {"type": names.get(type(v))} for k, v in sorted(data.items())}


def _key_constants(source: str, prefix: str = "") -> dict[str, dict[str, Any]]:
    """``NAME = "key"`` constants, each typed by its ``NAME_DEFAULT`` (None: any type)."""
    tree = ast.parse(source)
    consts = {t.id: s.value for s in tree.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    names = {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict", type(None): None}
    keys: dict[str, dict[str, Any]] = {}
    for const, value in consts.items():
        key = _literal(value)
        if const.endswith("_DEFAULT") or not isinstance(key, str) or not key.islower():
            continue
        default = consts.get(f"{const}_DEFAULT")
        keys[prefix + key] = {"type": names.get(type(_literal(default))) if default is not None else None}
    return keys


def deepspeed(mirror: Path, commit: str) -> dict[str, dict[str, Any]]:
    keys = _key_constants(git_show(mirror, commit, "deepspeed/runtime/constants.py"))
    checkpointing = _key_constants(git_show(mirror, commit, "deepspeed/runtime/activation_checkpointing/config.py"),
                                   prefix="activation_checkpointing.")
    keys |= {k: v for k, v in checkpointing.items() if k != "activation_checkpointing.activation_checkpointing"}
    keys["activation_checkpointing"] = {"type": "dict"}
    keys |= {k: {"type": "dict"} for k in _key_constants(git_show(mirror, commit, "deepspeed/runtime/zero/config.py"))}
    for path, section in (("deepspeed/runtime/zero/config.py", "zero_optimization"), ("deepspeed/runtime/precision_config.py", None)):
        for cls in (n for n in ast.walk(ast.parse(git_show(mirror, commit, path))) if isinstance(n, ast.ClassDef)):
            prefix = section or {"DeepSpeedBF16Config": "bf16", "DeepSpeedFP16Config": "fp16"}.get(cls.name)
            if prefix is None or (section and cls.name != "DeepSpeedZeroConfig"):
                continue
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    kind, choices = _annotation(stmt.annotation)
                    if ast.unparse(stmt.annotation) == "ZeroStageEnum":
                        kind, choices = "int", [0, 1, 2, 3]
                    keys[f"{prefix}.{stmt.target.id}"] = {"type": kind, **({"choices": choices} if choices else {})}
    runner = ast.parse(git_show(mirror, commit, "deepspeed/launcher/runner.py"))
    for call in (n for n in ast.walk(runner) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("add_argument")):
        names, entry = _argparse_entry(call)
        keys |= {f"launcher:{name}": entry for name in names}
    return dict(sorted(keys.items()))


def torchtitan(mirror: Path, commit: str) -> dict[str, dict[str, Any]]:
    tree = ast.parse(git_show(mirror, commit, "torchtitan/config/job_config.py"))
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    sections = {}
    if "JobConfig" in classes:
        for stmt in classes["JobConfig"].body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                sections[stmt.target.id] = ast.unparse(stmt.annotation)
    keys: dict[str, dict[str, Any]] = {}
    for section, cls in sections.items():
        for stmt in getattr(classes.get(cls), "body", []):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                kind, choices = _annotation(stmt.annotation)
                keys[f"{section}.{stmt.target.id}"] = {"type": kind, **({"choices": choices} if choices else {})}
    return dict(sorted(keys.items()))


EXTRACTORS = {"megatron": megatron, "maxtext": maxtext, "deepspeed": deepspeed, "torchtitan": torchtitan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", action="append", default=[], help="STACK=GIT_DIR, one per stack to extract")
    args = parser.parse_args()
    for item in args.mirror:
        stack, path = item.split("=", 1)
        source = SOURCES[stack]
        keys = EXTRACTORS[stack](Path(path), source["commit"])
        commit = subprocess.run(["git", "-C", path, "rev-parse", f"{source['commit']}^{{commit}}"], check=True,
                                capture_output=True, text=True).stdout.strip()
        data = {"repository": f"https://github.com/{source['repository']}", "commit": commit, "files": source["files"],
                "extracted_by": "python -m benchmarks.export_schemas", "keys": keys}
        (OUT / f"{stack}.json").write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
        print(f"{stack}: {len(keys)} keys from {source['repository']}@{commit[:12]}")


if __name__ == "__main__":
    main()
