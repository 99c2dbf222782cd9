"""The docs as a site (mkdocs.yml): every page under docs/ is in the navigation, every relative
link in README.md and docs/ reaches a file or folder that exists (and a heading, when it names
an anchor, by GitHub's heading ids), and the strict MkDocs build turns a page missing from the
navigation or a broken anchor into a failure. The link and navigation checks need only the
repository; the builds need the `docs` extra (mkdocs, mkdocs-material) and are skipped without
it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml with its `!!python/...` tags read as None (only the nav is needed here)."""


_ConfigLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def nav_pages(config: Path) -> list[str]:
    """Every page named in the config's nav, as a path under docs/."""
    pages: list[str] = []

    def walk(node) -> None:
        if isinstance(node, str):
            pages.append(node)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)

    walk(yaml.load(config.read_text(), Loader=_ConfigLoader)["nav"])
    return pages


def github_anchor(heading: str) -> str:
    """GitHub's id of a heading: the rendered text lower-cased, punctuation other than `-` and
    `_` dropped, each space a `-` (unicode letters kept)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_anchor(h) for h in HEADING.findall(text)}


def broken_links(page: Path) -> list[str]:
    """The relative links of a markdown file that reach nothing, each as `target: why`."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file or folder")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading with that id")
    return broken


def docs_pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
    nav = nav_pages(ROOT / "mkdocs.yml")
    assert sorted(set(nav)) == docs_pages()
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p}" for p in docs_pages())])
def test_relative_links_reach_a_file_and_a_heading(page):
    assert broken_links(ROOT / page) == []


def test_the_link_check_finds_a_missing_file_a_missing_anchor_and_passes_good_links(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "b.md").write_text("# Memory plan (computed)\n\n## Precision and pi_old (`x.y`)\n")
    page = tmp_path / "a.md"
    page.write_text(
        "# Top\n[ok](b.md#precision-and-pi_old-xy) [dir](data/) [self](#top) "
        "[web](https://example.org/x.md) `[code](gone.md)`\n"
        "[gone](gone.md) [bad anchor](b.md#memory-plan) [bad self](#nowhere)\n"
        "```\n[in a fence](gone2.md)\n```\n"
    )
    assert broken_links(page) == [
        "gone.md: no such file or folder",
        "b.md#memory-plan: b.md has no heading with that id",
        "#nowhere: a.md has no heading with that id",
    ]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


@pytest.fixture
def mkdocs_installed():
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the docs extra)")
    pytest.importorskip("material", reason="mkdocs-material is not installed (the docs extra)")


def test_the_strict_build_fails_on_a_page_missing_from_the_nav_and_a_broken_anchor(
    mkdocs_installed, tmp_path
):
    """The repository's own settings (INHERIT), on a two-page site: each defect alone fails."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[Guide](guide.md#the-run-folder)\n")
    (docs / "guide.md").write_text("# Guide\n\n## The run folder\n")

    def config(nav: str) -> Path:
        path = tmp_path / "mkdocs.yml"
        path.write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nnav:\n{nav}")
        return path

    both = "  - index.md\n  - guide.md\n"
    assert _build(config(both), tmp_path / "site").returncode == 0

    missing = _build(config("  - index.md\n"), tmp_path / "site")
    assert missing.returncode != 0
    assert 'not included in the "nav"' in missing.stderr and "guide.md" in missing.stderr

    (docs / "guide.md").write_text("# Guide\n\n## The folder of a run\n")
    anchor = _build(config(both), tmp_path / "site")
    assert anchor.returncode != 0
    assert "does not contain an anchor '#the-run-folder'" in anchor.stderr


def test_the_docs_build_in_strict_mode(mkdocs_installed, tmp_path):
    result = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "update" / "index.html").is_file()
