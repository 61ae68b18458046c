"""The evaluate stage: average checkpoints, beam-search every split, score with sacreBLEU.

    checkpoints (train_dir) --average last/best N--> eval_dir/model.ckpt
    prepared/{split}.{src} --Tokenizer.encode_sources--> beam search
                           --Tokenizer.decode (detokenized)--> {split}.hyp
    {split}.hyp vs prepared/{split}.{tgt} --sacrebleu--> metrics_dir/eval.json

Checkpoint averaging (Vaswani et al. 2017, section 6.1: "averaging the last 5 checkpoints")
smooths the end of training; the averaged weights are saved as `eval_dir/model.ckpt`, a
Lightning checkpoint without optimizer state, which is also the model `pipeline.translate`
uses by default. Hypotheses are the detokenized 1-best (nbest lists beside them when
`eval.nbest > 1`), scored against the prepared reference text, never against subwords.

W&B (job_type "eval", or a sweep trial's run) gets the scores as `eval/{split}/{metric}` (apart
from training's greedy `val/bleu`) plus `test/{metric}` for the benchmark split (the first of
`data.test_splits`), a table of sample translations and the cross-attention heatmaps, which
are also written to `plots_dir/attention/` for `dvc plots`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pipeline import console
from pipeline.atomic import atomic_directory, atomic_write, write_json_atomic
from pipeline.config_schema import Config, DataConfig, EvalConfig
from pipeline.data.corpus import ParallelText, write_lines
from pipeline.data.prepared import read_prepared
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import DataError, not_a_file
from pipeline.evaluation import MODEL_CHECKPOINT, plots
from pipeline.evaluation.scoring import LITERATURE_METRIC, METRICS, score

log = logging.getLogger(__name__)

EVAL_METRICS_FILE = "eval.json"  # in metrics_dir
ATTENTION_DIR = "attention"  # in plots_dir
TRAIN_HINT = "run `dvc repro train` (or `python -m pipeline.stages.train`) first"
# What model.ckpt keeps of a training checkpoint (optimizer and loop states are dropped).
CHECKPOINT_KEYS = (
    "state_dict",
    "hyper_parameters",
    "pytorch-lightning_version",
    "global_step",
    "epoch",
)


# --------------------------------------------------------------------------- checkpoints


def model_checkpoint_path(cfg: Config) -> Path:
    """`eval_dir/model.ckpt`: the weights the evaluate stage scored (and translate uses)."""
    return Path(cfg.paths.eval_dir) / MODEL_CHECKPOINT


def source_checkpoints(cfg: Config) -> list[Path]:
    """`eval.checkpoint` when set, else the last/best `eval.average` checkpoints of training
    (newest/best first; fewer than asked for is a warning, none a DataError)."""
    from pipeline.training.checkpoints import select_checkpoints

    if cfg.eval.checkpoint:
        path = Path(cfg.eval.checkpoint)
        if problem := not_a_file(path):
            raise DataError(
                f"eval.checkpoint={path} {problem}; point it at a checkpoint under "
                f"{Path(cfg.paths.train_dir) / 'checkpoints'} or set it to null"
            )
        return [path]
    return select_checkpoints(cfg.paths.train_dir, cfg.eval.average, by=cfg.eval.average_by)


def check_trained_with(sources: Sequence[Path], cfg: Config) -> None:
    """Refuse checkpoints that another config made (params.yaml changed after the train stage
    ran, or under it): their scores would be recorded under parameters they were not trained
    with. Keys that cannot change the weights (RESUME_FREE_KEYS) may differ."""
    from pipeline.training.resume import check_same_run

    for path in sources:
        check_same_run(
            path,
            cfg,
            "These are not the checkpoints of the run the params describe: run the train "
            "stage first (`dvc repro`), or restore the value(s).",
        )


def write_model_checkpoint(sources: Sequence[Path], target: Path) -> dict:
    """Save the average of `sources` (or the single one) as a slim Lightning checkpoint:
    the hyperparameters of the first (newest/best) source, no optimizer state."""
    from pipeline.training.checkpoints import average_checkpoints, read_checkpoint

    first = read_checkpoint(sources[0])
    checkpoint = {key: first[key] for key in CHECKPOINT_KEYS if key in first}
    if len(sources) > 1:
        checkpoint["state_dict"] = average_checkpoints(list(sources))
    checkpoint["averaged_from"] = [str(path) for path in sources]
    # Into an open file: a full disk is then an OSError naming no torch internals.
    atomic_write(target, lambda f: torch.save(checkpoint, f))
    return checkpoint


def load_model(checkpoint: str | Path) -> torch.nn.Module:
    """The Transformer of a training (or `model.ckpt`) checkpoint, in eval mode on the CPU."""
    from pipeline.config import from_dict
    from pipeline.model.transformer import build_transformer
    from pipeline.training.checkpoints import MODEL_PREFIX, load_error, load_weights_only

    checkpoint = Path(checkpoint)
    if problem := not_a_file(checkpoint):
        raise DataError(f"checkpoint {checkpoint} {problem}; {TRAIN_HINT}")
    failed = "cannot load the model"
    # Weights only: a checkpoint is user input, and unpickling anything else can run code.
    saved = load_weights_only(checkpoint, failed, TRAIN_HINT)
    try:
        # The model's weights are the training module's under `model.`; the module's other
        # entries (optimizer, history) are not needed to translate, nor is Lightning.
        hyper = saved["hyper_parameters"]
        model = build_transformer(from_dict(hyper["config"]), hyper["vocab_size"])
        weights = {name.removeprefix(MODEL_PREFIX): value
                   for name, value in saved["state_dict"].items() if name.startswith(MODEL_PREFIX)}  # fmt: skip
        model.load_state_dict(weights)  # strict: every weight of the model, nothing else
    except Exception as err:  # a foreign file's contents fail in many ways
        raise load_error(checkpoint, err, failed, TRAIN_HINT) from None
    return model.float().eval()


def load_tokenizer(
    path: str | Path, model: torch.nn.Module | None = None, data: DataConfig | None = None
) -> Tokenizer:
    """The subword model at `path`, checked against the model's vocabulary size; with `data`
    (the config the model was trained with) reading and writing text as it did: its source
    eos and pre-tokenization (`Tokenizer.for_data`)."""
    tokenizer = Tokenizer.load(path) if data is None else Tokenizer.for_data(path, data)
    if model is not None and model.vocab_size != tokenizer.vocab_size:
        raise DataError(
            f"{path}: vocabulary of {tokenizer.vocab_size} pieces but the model was trained "
            f"with {model.vocab_size}; use the tokenizer the model was trained with (after "
            "`dvc repro tokenize`, re-run `dvc repro train`)"
        )
    return tokenizer


def tokenizer_path(cfg: Config) -> Path:
    """`paths.tokenized/spm.model`: the tokenize stage's joint subword model."""
    return Path(cfg.paths.tokenized) / MODEL_FILE


# --------------------------------------------------------------------------- decoding


@dataclass
class Translation:
    """One source sentence's n-best list: detokenized text, subword ids and beam scores."""

    texts: list[str]
    tokens: list[list[int]]
    scores: list[float]

    @property
    def best(self) -> str:
        return self.texts[0] if self.texts else ""


def length_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that each batch's padded source (sentences x longest)
    stays within `max_tokens`; sorting by length keeps the padding small. Empty sentences
    are left out (they translate to an empty line)."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and lengths[batches[-1][0]] * (len(batches[-1]) + 1) <= max_tokens:
            batches[-1].append(i)  # the first index of a batch is its longest sentence
        else:
            batches.append([i])
    return batches


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, longest) LongTensor, right-padded with pad_id."""
    batch = torch.full((len(sequences), max(map(len, sequences))), pad_id, dtype=torch.long)
    for row, ids in enumerate(sequences):
        batch[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    return batch


def translate_ids(
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    src_ids: Sequence[Sequence[int]],
    eval_cfg: EvalConfig,
    desc: str = "decode",
    progress: bool = True,
) -> list[Translation]:
    """Beam-search every source (`Tokenizer.encode_sources` ids), batched by `eval.max_tokens`.

    Sources longer than the model's `max_positions` are cut there (with a warning). Batches
    go to the model's device, with a progress bar on stderr unless `progress` is false.
    Returns one Translation per source, in input order.
    """
    from pipeline.model.decoding import beam_search

    device = next(model.parameters()).device

    limit = model.cfg.max_positions
    too_long = sum(len(ids) > limit for ids in src_ids)
    if too_long:
        log.warning("%d source sentence(s) longer than %d subwords were truncated", too_long, limit)
    src_ids = [list(ids[:limit]) for ids in src_ids]
    results = [Translation([], [], []) for _ in src_ids]
    batches = length_batches([len(ids) for ids in src_ids], eval_cfg.max_tokens)
    with torch.inference_mode():
        shown = (
            console.track(batches, desc=desc, unit="batch", leave=False) if progress else batches
        )
        for batch in shown:
            src = pad_batch([src_ids[i] for i in batch], tokenizer.pad_id).to(device)
            nbest_lists = beam_search(
                model,
                src,
                bos_id=tokenizer.bos_id,
                eos_id=tokenizer.eos_id,
                beam_size=eval_cfg.beam_size,
                length_penalty=eval_cfg.length_penalty,
                length_normalization=eval_cfg.length_normalization,
                max_len_a=eval_cfg.max_len_a,
                max_len_b=eval_cfg.max_len_b,
                nbest=eval_cfg.nbest,
            )
            for i, hypotheses in zip(batch, nbest_lists):
                results[i] = Translation(
                    texts=[one_line(tokenizer.decode(h.tokens)) for h in hypotheses],
                    tokens=[list(h.tokens) for h in hypotheses],
                    scores=[float(h.score) for h in hypotheses],
                )
    return results


@torch.no_grad()
def hypothesis_log_probs(
    model: torch.nn.Module,
    src_ids: Sequence[Sequence[int]],
    hypotheses: Sequence[Sequence[int]],
    *,
    bos_id: int,
    max_tokens: int,
) -> list[torch.Tensor]:
    """The model's float32 log-probs, teacher-forced, at every position of each hypothesis
    (tokens without bos/eos) and the eos after it: (len(tokens) + 1, vocab) per hypothesis,
    row t the distribution its token t is drawn from, so the entries of its tokens and eos sum
    to log P(tokens + eos | src), what beam search scores a finished hypothesis by
    (`summed_log_prob`). Sources are cut at `model.cfg.max_positions`, as `translate_ids`
    cuts them, and batched as it batches them (`max_tokens`, e.g. `eval.max_tokens`)."""
    limit, pad_id = model.cfg.max_positions, model.pad_id
    device = next(model.parameters()).device
    sources = [list(ids)[:limit] for ids in src_ids]
    targets = [[bos_id, *tokens] for tokens in hypotheses]
    rows: list[torch.Tensor] = [torch.empty(0)] * len(targets)
    lengths = [max(len(s), len(t)) for s, t in zip(sources, targets)]  # never 0: bos
    for batch in length_batches(lengths, max_tokens):
        src = pad_batch([sources[i] for i in batch], pad_id).to(device)
        tgt_in = pad_batch([targets[i] for i in batch], pad_id).to(device)
        # A position sees only those before it: the padding after a hypothesis changes nothing.
        log_probs = torch.log_softmax(model(src, tgt_in).float(), dim=-1)
        for row, i in enumerate(batch):
            rows[i] = log_probs[row, : len(targets[i])]
    return rows


def summed_log_prob(log_probs: torch.Tensor, tokens: list[int], eos_id: int) -> float:
    """log P(tokens + eos | src) from `hypothesis_log_probs`' rows of that hypothesis."""
    target = torch.tensor([*tokens, eos_id], device=log_probs.device)
    return float(log_probs.gather(1, target[:, None]).sum())


def one_line(text: str) -> str:
    """Collapse whitespace (newlines included) so every hypothesis stays on its own line."""
    return " ".join(text.split())


def nbest_lines(translations: Sequence[Translation]) -> list[str]:
    """`sentence index <tab> beam score <tab> hypothesis`, n lines per sentence, best first."""
    return [
        f"{i}\t{score:.4f}\t{text}"
        for i, t in enumerate(translations)
        for text, score in zip(t.texts, t.scores)
    ]


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
    """`eval/{split}/{metric}` for every split (beam search, averaged weights: kept apart from
    training's greedy `val/bleu`), plus `test/{metric}` for the benchmark split; metrics are
    METRICS and, where computed, the 95% half-width of lowercased BLEU (`bleu_lc_ci`) and
    the literature's tokenized BLEU."""

    def of(split: str) -> dict[str, float]:
        keys = [*METRICS, *(k for k in EXTRA_WANDB_KEYS if results[split].get(k) is not None)]
        return {key: results[split][key] for key in keys}

    flat = {f"eval/{split}/{key}": value for split in cfg.eval.splits
            for key, value in of(split).items()}  # fmt: skip
    test = benchmark_split(cfg)
    if test is not None:
        flat.update({f"test/{key}": value for key, value in of(test).items()})
    return flat


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
    src_ids: dict[str, list[list[int]]] = {}
    translations: dict[str, list[Translation]] = {}
    keep = cfg.paths.outputs("eval_dir")  # the checkpoints (train_dir) among them
    if cfg.eval.checkpoint:
        keep["eval.checkpoint"] = cfg.eval.checkpoint
    with atomic_directory(cfg.paths.eval_dir, keep) as staging:
        write_model_checkpoint(sources, staging / MODEL_CHECKPOINT)
        model = load_model(staging / MODEL_CHECKPOINT)
        tokenizer = load_tokenizer(tokenizer_path(cfg), model, cfg.data)
        tokenizer.save(staging / MODEL_FILE)  # the model's folder translates wherever it goes
        for split, corpus in corpora.items():
            src_ids[split] = tokenizer.encode_sources(corpus.src)
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
            src_ids[shown][i][: model.cfg.max_positions],
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
    """The scores of every split as a plain-text table, with the hypotheses' files and how
    many of them differ (a model that repeats one sentence scores near zero for a reason).

        split             sentences  BLEU  BLEU lc (95% CI)  chrF   TER  distinct  hypotheses
        test_2016_flickr       1000  35.1   35.6 ± 1.3       61.2  47.9      989  eval/test_2016_flickr.hyp
    """
    header = ["split", "sentences", "BLEU", "BLEU lc (95% CI)", "chrF", "TER", "distinct",
              "hypotheses"]  # fmt: skip
    rows = [header]
    for split in cfg.eval.splits:
        scores = results[split]
        lowercased = f"{scores['bleu_lc']:.1f}"
        if scores.get("bleu_lc_ci") is not None:
            lowercased += f" ± {scores['bleu_lc_ci']:.1f}"
        hypotheses = Path(cfg.paths.eval_dir) / f"{split}.hyp"
        distinct = len(set(hypotheses.read_text(encoding="utf-8").splitlines()))
        rows.append([
            split, str(scores["sentences"]), f"{scores['bleu']:.1f}", lowercased,
            f"{scores['chrf']:.1f}", f"{scores['ter']:.1f}", str(distinct), str(hypotheses),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    left = {0, len(header) - 1}  # names left-aligned, numbers right-aligned
    lines = [
        "  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                  for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    ]  # fmt: skip
    signature = results.get("signatures", {}).get("bleu")
    if signature:
        lines.append(f"BLEU signature: {signature}")
    return "\n".join(lines)


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
