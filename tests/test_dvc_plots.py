"""DVC's plots pages draw offline: the repository's page template (.dvc/config) has Vega inline,
and `dvc plots diff` as README gives it writes a page that loads nothing from the network."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT, page_references

DVC = Path(sys.executable).parent / "dvc"
TIMEOUT = 300  # seconds: one DVC command


def configured_template() -> Path:
    from dvc.repo import Repo

    with Repo(str(REPO_ROOT)) as repo:
        return Path(repo.dvc_dir) / repo.config["plots"]["html_template"]


def test_the_repositorys_page_template_is_the_one_the_generator_writes():
    from pipeline.dvc_plots import page

    template = configured_template()
    assert template.is_file(), f"{template} (plots.html_template in .dvc/config) is missing"
    assert template.read_text(encoding="utf-8") == page(), (
        f"{template} is stale: python -m pipeline.dvc_plots {template.relative_to(REPO_ROOT)}"
    )


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True, timeout=TIMEOUT)  # fmt: skip


def test_plots_diff_of_two_revisions_draws_both_curves_offline(tmp_path):
    """`dvc plots diff <rev> <rev>` with nothing but the repository's DVC config: one chart
    with both revisions' points, Vega defined inline before the chart asks for it."""
    repo = tmp_path / "repo"
    shutil.copytree(
        REPO_ROOT / ".dvc", repo / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache")
    )
    git(repo, "init", "-q")
    curves = {"first": [3.0, 2.0], "second": [2.5, 1.25]}
    for name, losses in curves.items():
        points = [{"step": step, "loss": loss} for step, loss in enumerate(losses)]
        (repo / "curve.json").write_text(json.dumps(points))
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", name)
        git(repo, "tag", name)

    result = subprocess.run([str(DVC), "plots", "diff", "first", "second", "--targets",
                             "curve.json"], cwd=repo, capture_output=True, text=True,
                            timeout=TIMEOUT)  # fmt: skip
    assert result.returncode == 0, result.stderr
    page = (repo / "dvc_plots" / "index.html").read_text(encoding="utf-8")

    remote = [ref for ref in page_references(page) if ref.startswith(("http:", "https:", "//"))]
    assert not remote, f"the page loads {remote}"
    assert 0 < page.index("window.vegaEmbed=") < page.index("vegaEmbed('#")
    assert page.count("vegaEmbed('#") == 1
    for losses in curves.values():
        assert all(f'"loss": {loss}' in page or f'"loss":{loss}' in page for loss in losses)
