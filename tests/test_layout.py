"""The shape of the source tree: short functions, short algorithm files, no import cycles.

The layer order itself (cli > bench > training > rollout > policy > credit > ground >
update_choices : model_names : command_line) and the cycles between sibling packages are import-linter
contracts in pyproject.toml, run by scripts/test.sh (``lint-imports``). This file checks what those contracts do not: function
and file lengths, and cycles between any two modules, a package's ``__init__`` included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "mcgpo"
MAX_FUNCTION_LINES = 80  # def line to last line
MAX_ALGORITHM_FILE_LINES = 300  # one estimator or preference step per file, read like a paper


def function_lengths(source: str) -> list[tuple[str, int, int]]:
    """(name, def line, lines from the def line to the last line) of every function and
    method in ``source``, nested ones included."""
    return [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def test_function_lengths_count_from_the_def_line_to_the_last_line():
    source = "@decorator\ndef f(\n    x,\n):\n    y = x\n\n    return y\n\n\nz = 1\n"
    # the decorator line is not counted; the def line, the blank line and return are (6)
    assert function_lengths(source) == [("f", 2, 6)]
    nested = "class A:\n    def m(self):\n        def g():\n            pass\n        return g\n"
    assert sorted(function_lengths(nested)) == [("g", 3, 2), ("m", 2, 4)]


def test_no_function_in_src_is_longer_than_80_lines():
    long = [
        f"{path.relative_to(SRC.parent)}:{line} {name} ({length} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for name, line, length in function_lengths(path.read_text(encoding="utf-8"))
        if length > MAX_FUNCTION_LINES
    ]
    assert not long, "functions over 80 lines: " + "; ".join(long)


@pytest.mark.parametrize("package", ["advantages", "preferences"])
def test_estimator_and_preference_files_stay_under_300_lines(package):
    files = sorted((SRC / package).glob("*.py"))
    assert files, package
    long = [
        f"{path.relative_to(SRC.parent)} ({n} lines)"
        for path in files
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_ALGORITHM_FILE_LINES
    ]
    assert not long, f"files over {MAX_ALGORITHM_FILE_LINES} lines: " + "; ".join(long)


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that import one another in a circle (the strongly
    connected components of the import graph; Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(imports.get(target, ())))))
            elif target in on_stack:
                low[module] = min(low[module], index[target])
    return sorted(cycles)


def test_import_cycles_finds_circles_and_only_them():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": {"e"}, "f": set()}
    assert import_cycles(graph) == [["a", "b", "c"], ["e", "e2"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_import_each_other():
    grimp = pytest.importorskip("grimp")  # installed with import-linter (the dev extra)
    # every import statement counts, those inside functions too
    graph = grimp.build_graph("mcgpo", cache_dir=None)
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert import_cycles(imports) == []
