"""Tests README.md and docs/: the README stays a five-minute read, every command in it runs as
written and prints what it shows, and every link and code name in README and docs/ exists.

The README's shell blocks hold either commands alone (one per line) or examples: a ``$ command``
line followed by an excerpt of its output. The commands run in README order in one temporary
directory (``plan validate plan.json`` reads the file an earlier ``plan ... --out plan.json``
wrote), as ``python -m planner.cli`` (what the ``plan`` script runs) with a 100-column terminal.
An excerpt line must match an output line with whitespace runs collapsed; ``…`` in it stands for
any text (timings that vary from run to run).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
MAX_README_BYTES = 12 * 1024
SETUP_COMMANDS = ('pip install -e . && plan --model llama3-8b --mesh 8x4',
                  'pip install -e ".[test]" && python -m pytest')
# Commands checked for their text only: installing, and running the tests.
TEXT_ONLY = re.compile(r'^(pip install -e (\.|"\.\[test\]")|python -m pytest( .*)?|(PYTHON=\S+ )?\.ci/run( .*)?)$')
# Files the docs cite from other projects' code (a framework's source), not this project's.
OTHER_PROJECTS_FILES = {"deepspeed/runtime/zero/stage_1_and_2.py", "train.py", "training/arguments.py"}
PROJECT_PACKAGES = ("costmodel", "planner", "search", "validate", "benchmarks")
SHELL_LANGUAGES = {"", "sh", "bash", "console", "shell"}


@dataclass(frozen=True)
class Example:
    """A README command to run, with the output lines it shows (none for a bare command)."""

    command: str
    excerpt: tuple[str, ...] = ()
    language: str = "sh"


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """The fenced code blocks of a Markdown text as (language, lines).

    >>> fenced_blocks("a\\n```python\\nx = 1\\n```\\n")
    [('python', ['x = 1'])]
    """
    blocks, language, lines = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                blocks.append((language, lines))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def readme_commands(text: str) -> list[Example]:
    """Every command line of the text's shell blocks, with its output excerpt, and every Python block.

    >>> [e.command for e in readme_commands("```\\n$ plan hardware\\nh100-sxm ...\\n```\\n")]
    ['plan hardware']
    """
    examples: list[Example] = []
    for language, lines in fenced_blocks(text):
        if language == "python":
            examples.append(Example("\n".join(lines), language="python"))
        elif language in SHELL_LANGUAGES and any(line.startswith("$ ") for line in lines):
            for line in lines:
                if line.startswith("$ "):
                    examples.append(Example(line[2:].strip()))
                elif line.strip():
                    examples[-1] = Example(examples[-1].command, (*examples[-1].excerpt, line))
        elif language in SHELL_LANGUAGES:
            examples += [Example(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return examples


def _without_comment(command: str) -> str:
    return re.sub(r"\s+#.*$", "", command).strip()


def runnable(examples: list[Example]) -> list[Example]:
    """The ``plan ...`` commands to run, in order, each once (``pip install ... && plan ...`` runs its ``plan`` part)."""
    seen: dict[str, Example] = {}
    for example in examples:
        parts = [example.command] if example.language == "python" else [_without_comment(p) for p in example.command.split(" && ")]
        for part in parts:
            if example.language == "python" or part.split()[0] == "plan":
                before = seen.get(part, Example(part, language=example.language))
                seen[part] = Example(part, before.excerpt + example.excerpt, example.language)
    return list(seen.values())


EXAMPLES = readme_commands(README.read_text())
TO_RUN = runnable(EXAMPLES)


def _normalized(line: str) -> str:
    return re.sub(r"([━─═])\1+", r"\1", " ".join(line.split()))


def excerpt_matches(excerpt_line: str, output: str) -> bool:
    """Whether an output line shows the excerpt line (whitespace runs collapsed; ``…`` is any text).

    >>> excerpt_matches("│ step time │ … (MFU 45.7%", "│ step time    │ 1.748 s (MFU 45.7%, 299,901 │")
    True
    """
    pattern = ".*?".join(re.escape(piece) for piece in _normalized(excerpt_line).split("…"))
    return any(re.search(pattern, _normalized(line)) for line in output.splitlines())


class _Runner:
    """Runs the README's commands in order in one directory, each at most once."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.results: list[subprocess.CompletedProcess] = []
        self.env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}

    def result(self, index: int) -> subprocess.CompletedProcess:
        while len(self.results) <= index:
            example = TO_RUN[len(self.results)]
            if example.language == "python":
                argv, stdin = [sys.executable, "-"], example.command
            else:
                argv, stdin = [sys.executable, "-m", "planner.cli", *shlex.split(example.command)[1:]], None
            self.results.append(subprocess.run(argv, input=stdin, cwd=self.workdir, env=self.env, capture_output=True,
                                               text=True, timeout=120))
        return self.results[index]


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> _Runner:
    return _Runner(tmp_path_factory.mktemp("readme"))


def test_the_readme_is_a_five_minute_read():
    assert README.stat().st_size < MAX_README_BYTES, f"README.md is {README.stat().st_size} bytes; move detail to docs/"


def test_the_readme_gives_the_two_setup_commands_and_the_ci_entry_point():
    commands = [example.command for example in EXAMPLES]
    assert all(setup in commands for setup in SETUP_COMMANDS)
    assert ".ci/run" in README.read_text() and (ROOT / ".ci" / "run").exists()


def test_every_readme_command_is_run_or_known():
    for example in EXAMPLES:
        if example.language == "python":
            continue
        for part in (_without_comment(p) for p in example.command.split(" && ")):
            module = re.fullmatch(r"python -m (benchmarks\.\w+)", part)
            assert part.split()[0] == "plan" or TEXT_ONLY.match(part) or module, f"README command not checked: {part}"
            if module:
                assert (ROOT / (module.group(1).replace(".", "/") + ".py")).exists(), part


@pytest.mark.parametrize("index", range(len(TO_RUN)), ids=[e.command[:60] if e.language == "sh" else "python block" for e in TO_RUN])
def test_a_readme_command_runs_as_written_and_prints_what_it_shows(runner, index):
    example = TO_RUN[index]
    result = runner.result(index)
    assert result.returncode == 0, f"{example.command}\nexit {result.returncode}\n{result.stderr[-3000:]}"
    missing = [line for line in example.excerpt if not excerpt_matches(line, result.stdout)]
    assert not missing, "\n".join([f"{example.command}: README shows lines its output lacks:", *missing, "--- output:", result.stdout])


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _prose(page: Path) -> str:
    return re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_an_existing_file(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(ROOT)}: link to {target}: no such file"
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file), f"{page.relative_to(ROOT)}: link to {target}: no heading with that anchor"


def _code_names(page: Path) -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", _prose(page)))


def _defines(module_file: Path, name: str) -> bool:
    tree = ast.parse(module_file.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return name in names


def _module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    return next((file for file in (base / "__init__.py", base.with_suffix(".py")) if file.exists()), None)


def _dotted_name_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_file = _module_file(".".join(parts[:cut]))
        if module_file is not None:
            if cut == len(parts):
                return True
            # A package's lazy exports (planner.plan) are named only in its __all__.
            exported = getattr(importlib.import_module(".".join(parts[:cut])), "__all__", ())
            return _defines(module_file, parts[cut]) or parts[cut] in exported
    return False


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_module_path_and_name_the_docs_cite_exists(page):
    where = page.relative_to(ROOT)
    packages = "|".join(PROJECT_PACKAGES)
    for name in _code_names(page):
        if name.endswith(".py") and name not in OTHER_PROJECTS_FILES:
            assert "/" in name and (ROOT / name).exists(), f"{where}: `{name}` is not a file of the project (give its path)"
        elif re.fullmatch(rf"({packages}|tests|docs)/[\w./-]+", name) and name != "benchmarks/out/":
            assert (ROOT / name).exists(), f"{where}: `{name}` does not exist"
        elif re.fullmatch(rf"({packages})(\.\w+)+", name):
            assert _dotted_name_exists(name), f"{where}: `{name}` names no module or top-level name"
