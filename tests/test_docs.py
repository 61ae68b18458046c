"""The documentation: README is a short front page, the docs/ site builds with every page in its
nav and every link and anchor found, and neither speaks of how the project was made."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pipeline import docs_blocks
from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))  # docs/figures/ holds charts only
README_MAX_BYTES = 15 * 1024
# How the project was built is no part of what it does (`grep -rniwE` over README.md and docs/).
WORKPLACE_WORDS = re.compile(r"\b(lent|lent_gpu|session [0-9]+|device tool)\b", re.IGNORECASE)
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
ISSUE_NUMBER = re.compile(r"(?<![\w/])#[0-9]+\b")
BLOCK = re.compile(r"<!-- ([\w:.-]+):begin -->.*?<!-- \1:end -->", re.DOTALL)


def prose(text: str) -> str:
    """The hand-written text: without the generated blocks (tables of records, which may name
    the commit and the machine of each result)."""
    return BLOCK.sub("", text)


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from nav or a nav entry
    without its page is a warning, and strict mode fails on it."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    for page in PAGES:
        assert (tmp_path / page.stem / "index.html").exists() or page.stem == "index"
    # the charts that the generated blocks show are in the site
    assert (tmp_path / "figures/ablations/table3/bleu_per_variant.png").exists()
    assert not list(tmp_path.glob("figures/**/*.json"))  # the result folders' records are not


def test_a_broken_link_fails_the_strict_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# A\n\n[gone](gone.md)\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nnav:\n  - index.md\n")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0 and "gone.md" in done.stderr


def test_readme_is_a_short_front_page():
    assert README.stat().st_size <= README_MAX_BYTES
    text = README.read_text(encoding="utf-8")
    for command in ("make repro", "make test", "python -m pipeline.sweep", "pipeline.translate",
                    "dvc exp show", "dvc plots show", "optuna-dashboard", "wandb sync"):  # fmt: skip
        assert command in text, command
    assert docs_blocks.read(README, "results:headline").startswith("| recipe |")


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_no_workplace_words_commit_hashes_or_issue_numbers(page):
    text = page.read_text(encoding="utf-8")
    assert not WORKPLACE_WORDS.findall(text)
    assert not COMMIT_HASH.findall(prose(text))
    assert not ISSUE_NUMBER.findall(prose(text))


def test_the_history_checks_find_what_they_look_for():
    assert WORKPLACE_WORDS.findall("On a lent GPU (the device tool), session 5's host")
    assert COMMIT_HASH.findall("fixed in e978b99") and not COMMIT_HASH.findall("deadbeef 1234567")
    assert ISSUE_NUMBER.findall("(README, #19)") and not ISSUE_NUMBER.findall("torchmetrics#3434")
    assert prose("a\n<!-- x:begin -->\ne978b99\n<!-- x:end -->\nb") == "a\n\nb"
