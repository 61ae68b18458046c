"""The documentation: README is a short front page, the docs/ site builds with every page in its
nav and every link and anchor found, neither speaks of how the project was made, and every test,
module, option and config key they name exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline import docs_blocks
from pipeline.config_schema import defaults
from tests.conftest import REPO_ROOT

README = REPO_ROOT / "README.md"
PAGES = sorted((REPO_ROOT / "docs").glob("*.md"))  # docs/figures/ holds charts only
README_MAX_BYTES = 15 * 1024
# A page of the site reads in one sitting: a longer one is split by topic.
PAGE_MAX_BYTES = 15 * 1024
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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_docs_page_is_short(page):
    assert page.stat().st_size < PAGE_MAX_BYTES, f"{page.name}: split it into pages by topic"


def nav_pages(entries) -> list[str]:
    """The page files that mkdocs.yml's nav lists, sections walked."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_the_nav_lists_every_page_once():
    nav = nav_pages(yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    assert sorted(nav) == sorted(page.name for page in PAGES)


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
    for command in ("make repro", "make test", "dvc exp run -S experiment=smoke",
                    "python -m pipeline.sweep", "--workers", "pipeline.translate",
                    "from pipeline.translate import Translator", "make exps", "dvc plots show",
                    "optuna-dashboard", "wandb sync"):  # fmt: skip
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


# ---------------------------------------------------------------- what the pages name exists

TEST_REF = re.compile(r"\b((?:tests/)?(?:lab/)?test_\w+\.py)(?:::(test_\w+))?")
TESTS_PATH = re.compile(r"\btests/[\w./-]*\w")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
COMMAND = re.compile(r"python -m ([\w.]*\w)((?:\s+(?!#|\||&&|;|>)\S+)*)")
OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")
# Argument helpers shared by several commands: an option may be defined there.
SHARED_ARGUMENTS = ("pipeline/cli.py", "pipeline/docs_blocks.py", "benchmarks/common.py")
OTHER_MODULES = ("pytest", "mkdocs", "pip", "venv")  # not the project's
CONFIG_KEY = re.compile(r"(?<![\w/.-])((?:data|model|train|eval|logger|paths)(?:\.\w+)+)")
# `train.json`, `eval/model.ckpt`, `train.cs.gz`: file names that look like keys
FILE_SUFFIXES = {"json", "ckpt", "yaml", "py", "gz", "md", "bin", "tsv", "hyp", "nbest", "png"}
CONFIG_MAPPINGS = ("data.sha256.", "data.text_files.")
DOCS_LINK = re.compile(r"\]\(docs/([\w-]+\.md)(?:#([\w-]+))?\)")


def defined_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def missing_tests(text: str, tests: Path) -> list[str]:
    """`test_x.py::test_y` and `tests/...` references whose file or test function is absent."""
    missing = []
    for match in TEST_REF.finditer(text):
        name = match.group(1).removeprefix("tests/")
        found = [f for f in (tests / name, tests / "lab" / name) if f.is_file()]
        if not found:
            missing.append(match.group(0))
        elif match.group(2) and match.group(2) not in defined_functions(found[0]):
            missing.append(match.group(0))
    for match in TESTS_PATH.finditer(text):
        placeholder = text[match.end() : match.end() + 1] == "<"  # tests/test_<module>.py
        if not placeholder and not (tests.parent / match.group(0)).exists():
            missing.append(match.group(0))
    return missing


def code_snippets(text: str):
    """Every line of a fenced block (`\\` continuations joined) and every inline code span."""
    for block in FENCE.findall(text):
        yield from block.replace("\\\n", " ").splitlines()
    for paragraph in re.split(r"\n\s*\n", FENCE.sub("", text)):
        yield from re.findall(r"`([^`]+)`", paragraph.replace("\n", " "))


def missing_commands(text: str, root: Path) -> list[str]:
    """`python -m X --option` where module X, or its option, is absent (an option counts as
    present when its quoted name is in the module's source or a shared argument helper)."""
    shared = "".join((root / name).read_text(encoding="utf-8") for name in SHARED_ARGUMENTS)
    missing = []
    for snippet in code_snippets(text):
        for match in COMMAND.finditer(snippet):
            module = match.group(1)
            if module in OTHER_MODULES or snippet[match.end(1) :].startswith(".<"):
                continue  # `python -m pipeline.stages.<stage>`: a placeholder
            path = root.joinpath(*module.split("."))
            sources = [f for f in (path.with_suffix(".py"), path / "__main__.py") if f.is_file()]
            if not sources:
                missing.append(f"python -m {module}")
                continue
            # a package's options may be defined in any of its modules
            files = sorted(path.glob("*.py")) if (path / "__main__.py").is_file() else sources[:1]
            code = "".join(f.read_text(encoding="utf-8") for f in files) + shared
            missing += [f"python -m {module} {option}" for option in OPTION.findall(match.group(2))
                        if f'"{option}"' not in code and f"'{option}'" not in code]  # fmt: skip
    return missing


def config_keys() -> set[str]:
    keys = set()

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            keys.add(prefix + key)
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")

    walk(defaults(), "")
    return keys


def missing_config_keys(text: str, keys: set[str]) -> list[str]:
    """Dotted config keys (`train.max_steps`) that the typed config does not have; below a
    mapping of names (`data.text_files.train`) anything goes."""
    found = (m.group(1) for m in CONFIG_KEY.finditer(text))
    return [key for key in found if key.rsplit(".", 1)[-1] not in FILE_SUFFIXES
            and key not in keys and not key.startswith(CONFIG_MAPPINGS)]  # fmt: skip


def heading_anchors(page: Path) -> set[str]:
    """The ids Python-Markdown's toc gives the page's headings (its default slugify)."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.replace("`", "")).strip().lower())
            for h in headings}  # fmt: skip


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.name)
def test_named_tests_modules_options_and_config_keys_exist(page):
    text = page.read_text(encoding="utf-8")
    assert not missing_tests(text, REPO_ROOT / "tests")
    assert not missing_commands(text, REPO_ROOT)
    assert not missing_config_keys(text, config_keys())


def test_readme_links_find_their_docs_page_and_heading():
    for page, anchor in DOCS_LINK.findall(README.read_text(encoding="utf-8")):
        target = REPO_ROOT / "docs" / page
        assert target.is_file(), page
        assert not anchor or anchor in heading_anchors(target), f"{page}#{anchor}"


def test_the_existence_checks_find_what_they_look_for(tmp_path):
    text = ("`test_docs.py::test_gone`, `test_nowhere.py`, `tests/lab/gone/`, `tests/test_<module>.py`,\n"
            "`python -m pipeline.gone`, `python -m pipeline.sweep s.yaml --no-such-flag` and\n"
            "```bash\npython -m pipeline.sweep s.yaml --workers 2 \\\n    --also-gone # --not-this\n```\n"
            "`train.max_stepz`, `train.max_steps`, `data.text_files.train`, `eval/model.ckpt`")  # fmt: skip
    assert missing_tests(text, REPO_ROOT / "tests") == [
        "test_docs.py::test_gone", "test_nowhere.py", "tests/lab/gone"]  # fmt: skip
    assert missing_commands(text, REPO_ROOT) == [
        "python -m pipeline.sweep --also-gone", "python -m pipeline.gone",
        "python -m pipeline.sweep --no-such-flag"]  # fmt: skip
    assert missing_config_keys(text, config_keys()) == ["train.max_stepz"]
    page = tmp_path / "p.md"
    page.write_text(
        "# Security\n## Many trials per machine, and several machines\n## `--workers` N\n"
    )
    assert heading_anchors(page) == {
        "security",
        "many-trials-per-machine-and-several-machines",
        "-workers-n",
    }


def test_readme_sets_up_with_two_commands_and_names_the_environment_alone():
    """On a fresh machine: one command runs the main job, one the tests (which CI runs as the
    README writes it); `make setup` is named as the way to get only the environment."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    block, prose = section.split("```bash\n", 1)[1].split("```", 1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make repro", "make test"]
    assert "`make setup`" in prose
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == commands[1]
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert "\nsetup: $(INSTALLED)  ## " in makefile
