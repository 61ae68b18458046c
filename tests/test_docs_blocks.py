"""pipeline.docs_blocks: the one writer of the documentation's generated blocks."""

from __future__ import annotations

import pytest

from pipeline import docs_blocks
from pipeline.errors import DataError


def test_fill_rewrites_only_the_named_block_and_read_returns_it(tmp_path):
    page = tmp_path / "page.md"
    a, b = docs_blocks.markers("a"), docs_blocks.markers("a:summary")
    page.write_text(f"# T\n\n{a[0]}\nold\n{a[1]}\nmiddle\n{b[0]}\nkept\n{b[1]}\n")
    docs_blocks.fill(page, "a", "new\n")
    assert page.read_text() == f"# T\n\n{a[0]}\nnew\n{a[1]}\nmiddle\n{b[0]}\nkept\n{b[1]}\n"
    assert (
        docs_blocks.read(page, "a") == "new\n" and docs_blocks.read(page, "a:summary") == "kept\n"
    )


def test_a_page_without_the_block_is_an_error_naming_page_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n")
    with pytest.raises(DataError, match=r"page\.md: no '<!-- results:begin -->'"):
        docs_blocks.fill(page, "results", "x\n")


def test_columns_cuts_a_table_to_the_named_columns_in_their_order():
    table = "intro\n\n| a | b | c |\n|---|---|---|\n| 1 | `x` | 3 |\n| 4 | y | 6 |\n\n- notes\n"
    assert docs_blocks.columns(table, ["c", "a"]) == "| c | a |\n|---|---|\n| 3 | 1 |\n| 6 | 4 |\n"
    with pytest.raises(DataError, match="no column 'd'"):
        docs_blocks.columns(table, ["a", "d"])


def test_links_into_result_folders_go_through_the_pages_figures_links(tmp_path):
    results = tmp_path / "ablations" / "results" / "table3"
    results.mkdir(parents=True)
    docs = tmp_path / "docs"
    (docs / "figures").mkdir(parents=True)
    (docs / "figures" / "ablations").symlink_to("../../ablations/results")
    assert docs_blocks.link_prefix(results, docs / "page.md") == "figures/ablations/table3/"
    # elsewhere (README at the root): relative to the page's folder
    assert docs_blocks.link_prefix(results, tmp_path / "README.md") == "ablations/results/table3/"
