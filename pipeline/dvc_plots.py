"""DVC's plots pages that work offline: DVC's page template with Vega inside.

DVC's own page loads Vega, Vega-Lite and Vega-Embed from a CDN; without a network its charts
stay blank. This writes DVC's page template with vl-convert's bundle of the three inlined
(about 0.9 MB), for the Vega-Lite major version DVC's plot templates are written in. The
repository's copy is .dvc/offline-plots.html, DVC's `plots.html_template` in .dvc/config, so
`dvc plots show`, `dvc plots diff` and `make plots` draw offline; after a change of
vl-convert-python, write it again:

    python -m pipeline.dvc_plots .dvc/offline-plots.html"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from pipeline.atomic import write_text_atomic
from pipeline.cli import main
from pipeline.errors import PipelineError

SCRIPTS = "{scripts}"  # where DVC's page puts its CDN <script> tags


def vega_lite_version() -> str:
    """The newest Vega-Lite that vl-convert bundles in the major version of DVC's templates."""
    import vl_convert
    from dvc_render.vega_templates import LinearTemplate

    schema = LinearTemplate.DEFAULT_CONTENT["$schema"]  # .../vega-lite/v5.json
    major = re.search(r"/v(\d+)\.json$", schema).group(1)
    versions = [v for v in vl_convert.get_vegalite_versions() if v.split(".")[0] == major]
    if not versions:
        raise PipelineError(
            f"vl-convert-python {vl_convert.__version__} bundles no Vega-Lite {major}.x, which "
            "DVC's plot templates use: install a vl-convert-python that does (pyproject.toml)"
        )
    return versions[-1]


def page() -> str:
    """DVC's page template with the Vega libraries inline instead of its CDN scripts."""
    import vl_convert
    from dvc_render.html import PAGE_HTML

    bundle = vl_convert.javascript_bundle(vl_version=vega_lite_version())
    return PAGE_HTML.replace(SCRIPTS, f"<script>{bundle}</script>")


def write(path: Path) -> Path:
    text = page()
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        write_text_atomic(path, text)
    return path


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.dvc_plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("template", type=Path, help="where to write the HTML template")
    print(f"offline plot template: {write(parser.parse_args(argv).template)}")


if __name__ == "__main__":
    main(cli)
