"""The evaluate stage: average checkpoints, beam-search every split, score with sacreBLEU.

    checkpoints (train_dir) --average last/best N--> eval_dir/model.ckpt
    prepared/{split}.{src} --Tokenizer.encode_sources--> beam search
                           --Tokenizer.decode (detokenized)--> {split}.hyp
    {split}.hyp vs prepared/{split}.{tgt} --sacrebleu--> metrics_dir/eval.json

The checkpoints are averaged into `eval_dir/model.ckpt` (`pipeline.evaluation.model_loading`)
and every split is decoded by `pipeline.evaluation.beam_decoding`. Hypotheses are the
detokenized 1-best (nbest lists beside them when `eval.nbest > 1`), scored against the
prepared reference text, never against subwords.

W&B (job_type "eval", or a sweep trial's run) gets the scores under the names of
`metrics/summary.json`: `test/{metric}` for the benchmark split (the first of
`data.test_splits`), `eval/{split}/{metric}` for every other split (apart from training's
`val/greedy_bleu`), a table of sample translations and the cross-attention heatmaps, which
are also written to `plots_dir/attention/` for `dvc plots`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from pipeline.atomic import atomic_directory, write_json_atomic
from pipeline.config_schema import Config
from pipeline.data.corpus import ParallelText, write_lines
from pipeline.data.positions import SOURCE, check_fits, longest
from pipeline.data.prepared import read_prepared
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.evaluation import plots
from pipeline.evaluation.beam_decoding import Translation, nbest_lines, translate_ids
from pipeline.evaluation.model_loading import (
    check_trained_with,
    load_model,
    load_tokenizer,
    model_checkpoint_path,
    source_checkpoints,
    tokenizer_path,
    write_model_checkpoint,
)
from pipeline.evaluation.outputs import ATTENTION_DIR, EVAL_METRICS_FILE, MODEL_CHECKPOINT
from pipeline.evaluation.scoring import LITERATURE_METRIC, METRICS, score

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- attention


def attention_heatmap(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    src_ids: Sequence[int],
    hyp_ids: Sequence[int],
    path: str | Path,
    title: str | None = None,
) -> torch.Tensor:
    """Plot the cross-attention of the model producing `hyp_ids` from `src_ids`.

    Row t of each panel is the decoder step fed [bos] + hyp[:t], which predicts (hyp + eos)[t],
    so the y labels are the hypothesis pieces and </s>. Returns the (layers, heads, T, S)
    weights that were drawn.
    """
    device = next(model.parameters()).device
    src = torch.as_tensor([list(src_ids)], dtype=torch.long, device=device)
    tgt_in = torch.as_tensor([[tokenizer.bos_id, *hyp_ids]], dtype=torch.long, device=device)
    with torch.inference_mode():
        weights = model.cross_attention_weights(src, tgt_in).cpu()
    src_labels = [tokenizer.piece(i) for i in src_ids]
    tgt_labels = [tokenizer.piece(i) for i in [*hyp_ids, tokenizer.eos_id]]
    plots.plot_attention(weights, src_labels, tgt_labels, path, title=title)
    return weights


def sample_indices(count: int, size: int) -> list[int]:
    """`count` indices spread evenly over a split of `size` sentences (first and last included)."""
    if count <= 0 or size <= 0:
        return []
    return sorted({int(round(x)) for x in np.linspace(0, size - 1, min(count, size))})


# --------------------------------------------------------------------------- the stage


def benchmark_split(cfg: Config) -> str | None:
    """The split reported as `test/*`: the first configured test split that is evaluated."""
    return next((s for s in cfg.data.test_splits if s in cfg.eval.splits), None)


# Besides METRICS, what W&B gets of each split's scores where they were computed.
EXTRA_WANDB_KEYS = ("bleu_lc_ci", LITERATURE_METRIC)


def wandb_metrics(results: dict, cfg: Config) -> dict[str, float]:
    """`test/{metric}` for the benchmark split and `eval/{split}/{metric}` for every other
    (beam search, averaged weights: apart from training's `val/greedy_bleu`), each score under
    one name, as `metrics/summary.json` names it; metrics are
    METRICS and, where computed, the 95% half-width of lowercased BLEU (`bleu_lc_ci`) and
    the literature's tokenized BLEU."""

    def of(split: str) -> dict[str, float]:
        keys = [*METRICS, *(k for k in EXTRA_WANDB_KEYS if results[split].get(k) is not None)]
        return {key: results[split][key] for key in keys}

    test = benchmark_split(cfg)
    return {f"{'test' if split == test else f'eval/{split}'}/{key}": value
            for split in cfg.eval.splits
            for key, value in of(split).items()}  # fmt: skip


def model_artifact(cfg: Config, results: dict, sources: Sequence[Path]):
    """The scored model as a W&B `model` artifact: the averaged checkpoint and the subword
    model it reads and writes with, its scores and what it was averaged from as metadata."""
    import wandb

    metadata = {
        "experiment": cfg.experiment_name,
        "averaged_from": [str(path) for path in sources],
        "signatures": results["signatures"],
        **{k: v for k, v in wandb_metrics(results, cfg).items() if k.startswith("test/")},
    }
    name = f"model-{cfg.experiment_name}".replace("/", "-")
    artifact = wandb.Artifact(name, type="model", metadata=metadata)
    artifact.add_file(str(model_checkpoint_path(cfg)), name=MODEL_CHECKPOINT)
    artifact.add_file(str(tokenizer_path(cfg)), name=MODEL_FILE)
    return artifact


def read_references(cfg: Config) -> dict[str, ParallelText]:
    """The prepared source/reference text of every `eval.splits` split, checked up front."""
    return read_prepared(
        cfg,
        cfg.eval.splits,
        missing_hint="list it in data.test_splits and run `dvc repro prepare`, "
        "or remove it from eval.splits",
    )


def run(cfg: Config, wandb_run=None) -> dict:
    """Evaluate the trained model on `eval.splits`; returns what it writes to eval.json.

    eval.json: `{split: {bleu, bleu_lc, chrf, ter, bleu_tok_lc, sentences}, ..., "signatures": {metric:
    sacrebleu signature}, "checkpoints_averaged": n, "wall_time_s": seconds}`. Writes `eval_dir/` atomically
    (model.ckpt, `{split}.hyp`, `{split}.nbest` when eval.nbest > 1) and
    `plots_dir/attention/{split}_{index}.png`. Logs to `wandb_run` when given (a sweep
    trial's run, left open), else to a new W&B run of job type "eval".
    """
    started = time.perf_counter()
    corpora = read_references(cfg)  # every input is checked before any compute is spent
    sources = source_checkpoints(cfg)
    check_trained_with(sources, cfg)

    results: dict = {}
    signatures: dict = {}
    translations: dict[str, list[Translation]] = {}
    keep = cfg.paths.outputs("eval_dir")  # the checkpoints (train_dir) among them
    if cfg.eval.checkpoint:
        keep["eval.checkpoint"] = cfg.eval.checkpoint
    with atomic_directory(cfg.paths.eval_dir, keep) as staging:
        write_model_checkpoint(sources, staging / MODEL_CHECKPOINT)
        model = load_model(staging / MODEL_CHECKPOINT)
        tokenizer = load_tokenizer(tokenizer_path(cfg), model, cfg.data)
        tokenizer.save(staging / MODEL_FILE)  # the model's folder translates wherever it goes
        src_ids = {split: tokenizer.encode_sources(c.src) for split, c in corpora.items()}
        sides = [(split, SOURCE, ids) for split, ids in src_ids.items()]
        check_fits(cfg, model.cfg.max_positions, longest(sides))  # before any decoding
        for split, corpus in corpora.items():
            translations[split] = translate_ids(
                model, tokenizer, src_ids[split], cfg.eval, desc=f"decode {split}"
            )
            hypotheses = [t.best for t in translations[split]]
            write_lines(staging / f"{split}.hyp", hypotheses)
            if cfg.eval.nbest > 1:
                write_lines(staging / f"{split}.nbest", nbest_lines(translations[split]))
            scores = score(
                hypotheses,
                corpus.tgt,
                lang=cfg.data.tgt_lang,
                bootstrap_samples=cfg.eval.bootstrap_samples,
            )
            signatures = scores.pop("signatures")
            results[split] = {**scores, "sentences": len(hypotheses)}
            log.info(
                "%s: BLEU %.2f, chrF %.2f, TER %.2f",
                split,
                *(scores[k] for k in ("bleu", "chrf", "ter")),
            )
    results["signatures"] = signatures
    results["checkpoints_averaged"] = len(sources)
    results["wall_time_s"] = time.perf_counter() - started  # averaging, decoding, scoring
    write_json_atomic(Path(cfg.paths.metrics_dir) / EVAL_METRICS_FILE, results)

    # For people: attention heatmaps and sample translations of the benchmark split.
    shown = benchmark_split(cfg) or cfg.eval.splits[0]
    corpus, shown_translations = corpora[shown], translations[shown]
    attention_dir = Path(cfg.paths.plots_dir) / ATTENTION_DIR
    attention_dir.mkdir(parents=True, exist_ok=True)
    for stale in attention_dir.glob("*.png"):  # from an earlier run with other settings
        stale.unlink()
    heatmaps = []
    for i in sample_indices(cfg.eval.heatmaps, len(corpus.src)):
        best = shown_translations[i].tokens[0] if shown_translations[i].tokens else []
        path = attention_dir / f"{shown}_{i:04d}.png"
        attention_heatmap(
            model,
            tokenizer,
            src_ids[shown][i],  # every source fits: checked before decoding
            best,
            path,
            title=f"{shown} #{i}: {corpus.src[i]}",
        )
        heatmaps.append((path, f"{shown} #{i}: {corpus.src[i]}"))
    samples = [
        (shown, i, corpus.src[i], corpus.tgt[i], shown_translations[i].best)
        for i in sample_indices(cfg.eval.samples, len(corpus.src))
    ]
    log_to_wandb(cfg, wandb_run, results, sources, samples, heatmaps)
    return results


def results_table(results: dict, cfg: Config) -> str:
    """The scores of every split as a plain-text table in 80 columns, with how many of the
    hypotheses differ (a model that repeats one sentence scores near zero for a reason), then
    where the hypotheses are and the BLEU signature.

        split             sentences  BLEU  BLEU lc (95% CI)  chrF   TER  distinct
        test_2016_flickr       1000  35.1   35.6 ± 1.3       61.2  47.9       989
        hypotheses: eval/<split>.hyp
    """
    header = ["split", "sentences", "BLEU", "BLEU lc (95% CI)", "chrF", "TER", "distinct"]
    rows = [header]
    for split in cfg.eval.splits:
        scores = results[split]
        lowercased = f"{scores['bleu_lc']:.1f}"
        if scores.get("bleu_lc_ci") is not None:
            lowercased += f" ± {scores['bleu_lc_ci']:.1f}"
        hypotheses = hypotheses_file(cfg, split)
        distinct = len(set(hypotheses.read_text(encoding="utf-8").splitlines()))
        rows.append([
            split, str(scores["sentences"]), f"{scores['bleu']:.1f}", lowercased,
            f"{scores['chrf']:.1f}", f"{scores['ter']:.1f}", str(distinct),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)  # names left, numbers right
                  for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]  # fmt: skip
    lines.append(f"hypotheses: {hypotheses_file(cfg, '<split>')}")
    signature = results.get("signatures", {}).get("bleu")
    if signature:
        lines.append(f"BLEU signature: {signature}")
    return "\n".join(lines)


def hypotheses_file(cfg: Config, split: str) -> Path:
    return Path(cfg.paths.eval_dir) / f"{split}.hyp"


def log_to_wandb(cfg, wandb_run, results, sources, samples, heatmaps) -> None:
    """Scores, a table of sample translations and the heatmaps, as one W&B step."""
    import wandb

    from pipeline.tracking import finish_run, start_wandb_run, write_config_file

    own_run = wandb_run is None
    run = start_wandb_run(cfg, job_type="eval") if own_run else wandb_run
    try:
        metrics = wandb_metrics(results, cfg)
        run.summary.update(metrics)
        run.config.update(
            {"eval_checkpoints": [str(p) for p in sources], "signatures": results["signatures"]},
            allow_val_change=True,
        )
        write_config_file(run)
        if own_run and cfg.logger.wandb.log_model:  # a sweep trial's model stays in its work dir
            run.log_artifact(model_artifact(cfg, results, sources), aliases=["latest"])
        table = wandb.Table(columns=["split", "index", "source", "reference", "hypothesis"])
        for row in samples:
            table.add_data(*row)
        payload = {**metrics, "eval/samples": table}
        for path, caption in heatmaps:  # one key each: the grids differ in size
            payload[f"eval/attention/{path.stem}"] = wandb.Image(str(path), caption=caption)
        run.log(payload)
    finally:
        if own_run:
            finish_run(run)
