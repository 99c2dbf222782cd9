"""Every ```python block of docs/**/*.md runs as printed (README.md's: tests/test_readme.py).

Each block runs in a fresh namespace, in a fresh temporary working directory, in this
process. What the markdown says right before a block (an HTML comment, blank lines between
allowed) changes that, and the test reads only these three forms:

* ``<!-- not run: REASON -->``: the block cannot run on a CPU test box (a GPU, WebShop's own
  data files, ...); the test skips it with REASON, and a marker without a reason fails.
* ``<!-- runs after the block above -->``: the block continues the one above it on the same
  page (its namespace and working directory), as a reader types them one after the other.
* ``<!-- runs after: mcgpo ARGS -->``: the command line runs first (through
  :func:`mcgpo.cli.main`, in the block's working directory): the files the block reads.

A value a block shows in a comment is checked too: an expression statement whose comment
starts with a string literal (``env.expert_action()  # "go to cabinet 5"``) must give that
string; a literal ending in ``...`` or left open (the text goes on) gives its start.

A block whose page needs an optional extra (:data:`EXTRAS`) is skipped when the extra is
missing here (``pytest.importorskip``), never marked. Blocks are found with the fence
pattern the command-line check uses (tests/test_docs_commands.py).
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import shlex
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from test_docs_commands import FENCE, ROOT

DOCS = sorted((ROOT / "docs").rglob("*.md"))
# The module an optional extra brings, by page: without it the page's blocks are skipped.
EXTRAS = {
    "docs/envs/alfworld.md": "alfworld",
    "docs/envs/textworld-express.md": "textworld_express",
    "docs/training.md": "pandas",
    "docs/integrations/verl.md": "pandas",
}
MARKER = re.compile(r"^<!--\s*(not run:|runs after the block above|runs after:)(.*?)-->\s*$")


@dataclass(frozen=True)
class Block:
    where: str  # page:line of the fence
    code: str
    marker: str = ""  # "not run:", "runs after the block above", "runs after:" or ""
    argument: str = ""  # the reason, or the command line

    @property
    def page(self) -> str:
        return self.where.rsplit(":", 1)[0]


def python_blocks(text: str, page: str) -> list[Block]:
    """The ```python blocks of a markdown text, each with the marker right before it."""
    blocks, lines = [], text.splitlines()
    inside, fence, start, body = False, "", 0, []
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if not inside and match:
            inside, fence, start, body = True, match.group(2), number, []
            language = match.group(3).strip().split(" ")[0].lower()
        elif inside and match and match.group(2).startswith(fence) and not match.group(3).strip():
            inside = False
            if language in ("python", "py"):
                marker, argument = _marker_before(lines, start)
                blocks.append(Block(f"{page}:{start}", "\n".join(body) + "\n", marker, argument))
        elif inside:
            body.append(line)
    return blocks


def _marker_before(lines: list[str], fence_line: int) -> tuple[str, str]:
    i = fence_line - 2  # the line before the fence, 0-based
    while i >= 0 and not lines[i].strip():
        i -= 1
    found = MARKER.match(lines[i].strip()) if i >= 0 else None
    if found is None:
        return "", ""
    return found.group(1), found.group(2).strip()


def docs_blocks() -> list[Block]:
    found = []
    for page in DOCS:
        name = str(page.relative_to(ROOT))
        found.extend(python_blocks(page.read_text(encoding="utf-8"), name))
    return found


def chain(blocks: list[Block], block: Block) -> list[Block]:
    """The blocks that run for ``block``: those above it it runs after, then itself."""
    i = blocks.index(block)
    start = i
    while blocks[start].marker == "runs after the block above":
        if start == 0 or blocks[start - 1].page != block.page:
            raise AssertionError(f"{blocks[start].where}: no block above it on its page")
        start -= 1
    return blocks[start : i + 1]


# ---------------------------------------------------------------------- shown values
def shown_value(comment: str) -> tuple[str, bool] | None:
    """The string a comment shows (``# "text"``) and whether it is only its start."""
    text = comment.lstrip("#").strip()
    if not text.startswith(('"', "'")):
        return None
    try:
        first = next(tokenize.generate_tokens(io.StringIO(text).readline))
        value = ast.literal_eval(first.string) if first.type == tokenize.STRING else None
    except (tokenize.TokenError, SyntaxError, ValueError):
        value = None
    if isinstance(value, str):
        if value.endswith(("...", "…")):
            return value.rstrip(".…").rstrip(), True
        return value, False
    body = re.split(r"\.\.\.|…", text[1:], maxsplit=1)[0].rstrip()  # an open literal
    return (body, True) if body else None


def with_value_checks(code: str, where: str) -> ast.Module:
    """The block's code with each shown value checked where its expression is evaluated."""
    comments = {
        token.start[0]: token.string
        for token in tokenize.generate_tokens(io.StringIO(code).readline)
        if token.type == tokenize.COMMENT
    }
    tree = ast.parse(code, where)
    for i, node in enumerate(tree.body):
        shown = shown_value(comments.get(node.end_lineno or 0, ""))
        if isinstance(node, ast.Expr) and shown is not None:
            call = ast.Call(
                ast.Name("__shown__", ast.Load()),
                [node.value, *(ast.Constant(v) for v in (*shown, page_line(where, node.lineno)))],
                [],
            )
            tree.body[i] = ast.copy_location(ast.Expr(call), node)
    return ast.fix_missing_locations(tree)


def page_line(where: str, line: int) -> str:
    """``page:N`` of a block's line ``line`` (1 = the line after the fence)."""
    page, fence = where.rsplit(":", 1)
    return f"{page}:{int(fence) + line}"


def check_shown(value: object, text: str, prefix: bool, where: str) -> None:
    if not isinstance(value, str):
        return  # a tuple or a number shown with its text: the words are read, not checked
    got = value[: len(text)] if prefix else value
    assert got == text, f"{where}: the docs show {text!r}{' ...' if prefix else ''}, got {got!r}"


def run_blocks(blocks: list[Block], workdir: Path) -> dict:
    """Run the blocks in one namespace in ``workdir``; the namespace they leave."""
    from mcgpo.cli import main

    namespace: dict = {"__name__": "__docs__", "__shown__": check_shown}
    before = Path.cwd()
    os.chdir(workdir)
    try:
        for block in blocks:
            if block.marker == "not run:":
                raise AssertionError(f"{block.where}: a block marked not run is run after")
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # fmt: skip
                if block.marker == "runs after:":
                    argv = shlex.split(block.argument)
                    assert argv[0] == "mcgpo", f"{block.where}: runs after {block.argument!r}"
                    assert main(argv[1:]) == 0, f"{block.where}: {block.argument} failed"
                code = compile(with_value_checks(block.code, block.where), block.where, "exec")
                exec(code, namespace)
    finally:
        os.chdir(before)
    return namespace


BLOCKS = docs_blocks()


def test_the_docs_hold_python_blocks_and_most_of_them_run():
    assert len(BLOCKS) >= 12
    not_run = [b for b in BLOCKS if b.marker == "not run:"]
    assert len(not_run) <= len(BLOCKS) // 4, [b.where for b in not_run]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_every_docs_python_block_runs(block, tmp_path):
    if block.marker == "not run:":
        assert block.argument, f"{block.where}: <!-- not run: --> needs a reason after the colon"
        pytest.skip(f"{block.where}: not run: {block.argument}")
    if block.page in EXTRAS:
        pytest.importorskip(EXTRAS[block.page])
    run_blocks(chain(BLOCKS, block), tmp_path)


# ---------------------------------------------------------------------- the check itself
PAGE = """\
Text.

```python
import mcgpo
table = mcgpo.StepTable
```

<!-- runs after the block above -->

```python
mcgpo.no_such_function(table)
```

<!-- not run: needs a GPU -->
```python
import torch; torch.cuda.current_device()
```

<!-- not run:    -->
```python
pass
```

```bash
mcgpo train
```
"""


def test_the_check_reads_the_markers_and_catches_drift(tmp_path):
    blocks = python_blocks(PAGE, "page.md")
    assert [(b.where, b.marker, b.argument) for b in blocks] == [
        ("page.md:3", "", ""),
        ("page.md:10", "runs after the block above", ""),
        ("page.md:15", "not run:", "needs a GPU"),
        ("page.md:20", "not run:", ""),
    ]
    assert blocks[0].code == "import mcgpo\ntable = mcgpo.StepTable\n"
    assert chain(blocks, blocks[1]) == blocks[:2]
    assert "table" in run_blocks(blocks[:1], tmp_path)
    with pytest.raises(AttributeError, match="no_such_function"):  # drift: a renamed function
        run_blocks(chain(blocks, blocks[1]), tmp_path)
    with pytest.raises(pytest.skip.Exception, match="needs a GPU"):
        test_every_docs_python_block_runs(blocks[2], tmp_path)
    with pytest.raises(AssertionError, match="needs a reason"):
        test_every_docs_python_block_runs(blocks[3], tmp_path)
    with pytest.raises(AssertionError, match="no block above"):
        chain(blocks[1:], blocks[1])


def test_a_value_the_docs_show_is_checked(tmp_path):
    assert shown_value('# "go to cabinet 5"  (the expert)') == ("go to cabinet 5", False)
    assert shown_value('# "" -> "held" -> "heated,held"') == ("", False)
    assert shown_value('# "Your task is to pick up objects ..."') == ("Your task is to pick up objects", True)  # fmt: skip
    assert shown_value('# "Back to Search [SEP] Page 1') == ("Back to Search [SEP] Page 1", True)
    assert shown_value('# "you see ...\n') == ("you see", True)
    assert shown_value("# the gold path's next action") is None
    page = '```python\nword = "household"\nword.upper()  # "HOUSE ..."\nword  # "household"\n```\n'
    run_blocks(python_blocks(page, "page.md"), tmp_path)  # shown as it is: passes
    wrong = python_blocks(page.replace('word  # "household"', 'word  # "webshop"'), "page.md")
    with pytest.raises(AssertionError, match=r"page.md:4: the docs show 'webshop', got 'household'"):  # fmt: skip
        run_blocks(wrong, tmp_path)
    # the docs' own shown values are read (a checker that finds none checks nothing)
    shown = [
        line
        for block in BLOCKS
        for line in block.code.splitlines()
        if "#" in line and shown_value(line[line.index("#") :]) is not None
    ]
    assert len(shown) >= 8, shown
