"""Choose decoding settings on the validation split, never on test: the checkpoint-averaging
window x beam size x length penalty, each scored with sacreBLEU on `data.val_split` only.

    python -m pipeline.evaluation.decoding_search [--average 3 5 10] [--beam-size 5]
        [--length-penalty 0.6 1.0 1.4 2.0] [--metric bleu] [--checkpoint eval/model.ckpt]

Reads the run's params.yaml (as the DVC stages do) and its training checkpoints; prints a
table and writes every row and the best to `metrics_dir/decoding_search.json`. `--checkpoint`
searches beam and length penalty for a model averaged already (a run whose training
checkpoints are on another machine: its `eval/model.ckpt`). Put the best
into the experiment's `eval:` block and `dvc repro evaluate`. The length ratio (hypothesis /
reference tokens, sacreBLEU's) is reported beside each score: a setting chosen for a ratio
far from 1 on val may not transfer to test.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sacrebleu.metrics import BLEU

from pipeline.atomic import write_json_atomic
from pipeline.cli import main
from pipeline.cli import parser as cli_parser
from pipeline.config_schema import changed
from pipeline.errors import PipelineError
from pipeline.evaluation.scoring import LITERATURE_METRIC, score

# The model (torch) and the run's config load in the functions that use them: `--help` and a
# usage error are answered without them.
if TYPE_CHECKING:
    from pipeline.config_schema import Config

SEARCH_METRICS_FILE = "decoding_search.json"  # in metrics_dir
ROW_METRICS = ("bleu", "bleu_lc", "chrf", "ter", LITERATURE_METRIC)


GIVEN_CHECKPOINT = "given"  # a row's `average` when the model came averaged (--checkpoint)


def _models(cfg: Config, averages: Sequence[int], checkpoint: Path | None, scratch: str):
    """(average, model checkpoint) per averaging window of the run's checkpoints, or the given
    checkpoint alone."""
    from pipeline.evaluation.model_loading import write_model_checkpoint
    from pipeline.training.checkpoints import select_checkpoints

    if checkpoint is not None:
        yield GIVEN_CHECKPOINT, Path(checkpoint)
        return
    for average in averages:
        sources = select_checkpoints(cfg.paths.train_dir, average, by=cfg.eval.average_by)
        averaged = Path(scratch) / f"average-{average}.ckpt"
        write_model_checkpoint(sources, averaged)
        yield len(sources), averaged


def search(
    cfg: Config,
    averages: Sequence[int],
    beam_sizes: Sequence[int],
    length_penalties: Sequence[float],
    metric: str = "bleu",
    checkpoint: Path | None = None,
) -> dict:
    """Score every (average, beam size, length penalty) on the validation split (with
    `checkpoint`: that model, every beam size and length penalty); returns
    `{"split", "metric", "rows": [...], "best": row}` and writes it to metrics_dir."""
    from pipeline.data.positions import SOURCE, check_fits, longest
    from pipeline.data.prepared import read_prepared
    from pipeline.evaluation.beam_decoding import translate_ids
    from pipeline.evaluation.model_loading import load_model, load_tokenizer, tokenizer_path

    # Every value held to its key's domain before a checkpoint is averaged or a sentence read.
    for average in averages:
        changed(cfg.eval, average=average)
    grid = {(beam_size, length_penalty): changed(cfg.eval, beam_size=beam_size,
                                                 length_penalty=length_penalty, nbest=1)
            for beam_size in beam_sizes for length_penalty in length_penalties}  # fmt: skip
    split = cfg.data.val_split
    corpus = read_prepared(cfg, [split])[split]
    rows: list[dict] = []
    tokenizer, src_ids = None, None
    with tempfile.TemporaryDirectory(prefix="decoding-search-") as scratch:
        for average, averaged in _models(cfg, averages, checkpoint, scratch):
            model = load_model(averaged)
            if tokenizer is None:  # one tokenizer for all: checked against the first model
                tokenizer = load_tokenizer(tokenizer_path(cfg), model, cfg.data)
                src_ids = tokenizer.encode_sources(corpus.src)
                check_fits(cfg, model.cfg.max_positions, longest([(split, SOURCE, src_ids)]))
            for (beam_size, length_penalty), settings in grid.items():
                desc = f"average {average}, beam {beam_size}, lp {length_penalty}"
                translations = translate_ids(model, tokenizer, src_ids, settings, desc=desc)
                hypotheses = [t.best for t in translations]
                scores = score(hypotheses, corpus.tgt, lang=cfg.data.tgt_lang)
                bleu = BLEU().corpus_score(hypotheses, [list(corpus.tgt)])
                rows.append({
                    "average": average, "beam_size": beam_size,
                    "length_penalty": length_penalty,
                    **{key: scores[key] for key in ROW_METRICS},
                    "length_ratio": bleu.sys_len / bleu.ref_len,
                })  # fmt: skip
    result = {"split": split, "metric": metric, "rows": rows,
              "best": max(rows, key=lambda row: row[metric])}  # fmt: skip
    write_json_atomic(Path(cfg.paths.metrics_dir) / SEARCH_METRICS_FILE, result)
    return result


def format_table(result: dict) -> str:
    header = "average  beam  lp     bleu   bleu_lc  tok_lc  chrf   ratio"
    lines = [header, "-" * len(header)]
    for row in result["rows"]:
        mark = "  <- best" if row is result["best"] else ""
        lines.append(
            f"{row['average']:>7}  {row['beam_size']:>4}  {row['length_penalty']:<5}"
            f"  {row['bleu']:5.2f}  {row['bleu_lc']:7.2f}  {row[LITERATURE_METRIC]:6.2f}"
            f"  {row['chrf']:5.2f}"
            f"  {row['length_ratio']:.3f}{mark}"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = cli_parser("pipeline.evaluation.decoding_search", __doc__)
    parser.add_argument(
        "--average",
        type=int,
        nargs="+",
        default=[3, 5, 10],
        help="averaging windows: the last N checkpoints (eval.average)",
    )
    parser.add_argument(
        "--beam-size", type=int, nargs="+", default=[5], help="beam sizes (eval.beam_size)"
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        nargs="+",
        default=[0.6, 1.0, 1.4, 2.0],
        help="alphas of eval.length_normalization (eval.length_penalty)",
    )
    parser.add_argument(
        "--metric",
        choices=["bleu", "bleu_lc", "chrf", LITERATURE_METRIC],
        default="bleu",
        help="what picks the best row (default: bleu)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        help="a model averaged already: search beam and length penalty only",
    )
    return parser.parse_args(argv)


def run(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.checkpoint is not None and not args.checkpoint.is_file():
        raise PipelineError(f"--checkpoint {args.checkpoint}: no such file")
    from pipeline import config

    result = search(config.load(), args.average, args.beam_size, args.length_penalty,
                    args.metric, checkpoint=args.checkpoint)  # fmt: skip
    print(format_table(result))
    return result


if __name__ == "__main__":
    main(run)
