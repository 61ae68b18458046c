"""One trained model, two beam searches: is a parity gap in decoding?

Translates splits with a model of ours twice, with the same weights: by our beam search as
the evaluate stage runs it (`pipeline.model.decoding.beam_search`, `eval:` of the run's
params) and by fairseq 0.12's `SequenceGenerator` as `fairseq-generate` runs it in
`benchmarks.fairseq.train_peer` (beam and length penalty of `eval:`, fairseq's defaults otherwise:
max length 0 * |x| + 200, at least one token before eos, no unk penalty, left-padded sources).
Run it in the run's folder (its params.yaml, as `pipeline.evaluation.decoding_search`):

    python -m benchmarks.fairseq.decode_checkpoint --out results/parity/decoding/NAME.json
        [--splits val test_2016_flickr] [--checkpoint CKPT] [--venv VENV] [--threads 2]

The model is the one the evaluate stage scores (`eval/model.ckpt`, else the run's checkpoints
averaged as `eval:` says); each search's translations are written beside the JSON
(`NAME.<split>.<ours|fairseq>.hyp`), and `benchmarks.fairseq.parity` reads both back as rows of its
table (the model trained by ours, decoded by either search).

The weights go into fairseq's `TransformerModel` (built by fairseq from our sizes,
`benchmarks.fairseq.step_speed.build_task_and_model`) under fairseq's names, and fairseq's
positional table is given ours (fairseq's own sinusoids put every sine before every cosine
and start at position pad + 1). Before decoding, both models' logits on a probe batch must agree to float32
rounding, or nothing is decoded. The hypotheses are scored the way the fairseq harness scores
fairseq's (`train_peer.score_split`: against the split's raw references; a run on Wu et
al.'s own subword-nmt subwords, `benchmarks.fairseq.wu2021_segmentation`, has its `@@ ` joiners
removed and is Moses-detokenized first), with a paired bootstrap between the two, and each
hypothesis is scored by the model itself (length-normalised log-probability): where one
search returns a translation the model ranks lower than the other's, that search missed it.

The worker half runs in fairseq's venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`):
`<venv>/bin/python -m benchmarks.fairseq.decode_checkpoint --worker FOLDER`; only the standard library
and torch at module level.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.fairseq.train_peer import hypotheses_path
from pipeline.metric_names import FORMER_SUMMARY, MEAN_TOKENS_PER_SEC, current_names

SPEC_FILE = "spec.json"
WEIGHTS_FILE = "weights.pt"  # {"state_dict": fairseq names, "positions": (rows, d_model)}
SOURCES_FILE = "sources.json"  # source token ids per sentence, in the split's order
PROBE_FILE = "probe.pt"  # {"src", "tgt_in"}: the batch both models' logits are compared on
PROBE_LOGITS_FILE = "probe_logits.pt"
HYPOTHESES_FILE = "hypotheses.json"  # fairseq's best hypothesis per sentence, eos stripped
SECONDS_FILE = "seconds.json"  # with spec["timing_repeats"]: seconds of each timed decode
PROBE_SENTENCES = 16
# fairseq-generate's defaults where our eval: block has no say (fairseq 0.12 GenerationConfig)
FAIRSEQ_GENERATION = {"max_len_a": 0.0, "max_len_b": 200, "min_len": 1, "unk_penalty": 0.0}
HARNESS_SUBWORDS = "subword-nmt (Wu et al.)"  # a result's run.subwords: the harness's files


# ---------------------------------------------------------------- our model in fairseq's names

_SUBLAYERS = {  # ours -> fairseq, inside one layer
    "self_attn_residual.norm": "self_attn_layer_norm",
    "cross_attn_residual.norm": "encoder_attn_layer_norm",
    "ffn_residual.norm": "final_layer_norm",
    "ffn.linear1": "fc1",
    "ffn.linear2": "fc2",
    "self_attn.out_proj": "self_attn.out_proj",
    "cross_attn.out_proj": "encoder_attn.out_proj",
}
_IN_PROJ = {"self_attn.in_proj": "self_attn", "cross_attn.in_proj": "encoder_attn"}
_STACKS = {"encoder_layers": "encoder.layers", "decoder_layers": "decoder.layers"}
_FINAL_NORMS = {"encoder_norm": "encoder.layer_norm", "decoder_norm": "decoder.layer_norm"}


def fairseq_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Our Transformer's parameters under fairseq 0.12 TransformerModel's names (tied
    embeddings: one matrix as both embeddings and the output projection; q, k, v split from
    our stacked in_proj, [W^Q; W^K; W^V])."""
    if not model.cfg.tie_embeddings:
        raise ValueError("model.tie_embeddings is false: fairseq's peer shares all embeddings")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().float().clone()
        if name in ("src_embed.weight", "tgt_embed.weight", "output_projection.weight"):
            for target in ("encoder.embed_tokens", "decoder.embed_tokens",
                           "decoder.output_projection"):  # fmt: skip
                out[f"{target}.weight"] = tensor
            continue
        stack, _, rest = name.partition(".")
        if stack in _FINAL_NORMS:
            out[f"{_FINAL_NORMS[stack]}.{rest}"] = tensor
            continue
        if stack not in _STACKS:
            raise ValueError(f"{name}: no fairseq counterpart known")
        index, _, rest = rest.partition(".")
        module, _, kind = rest.rpartition(".")
        prefix = f"{_STACKS[stack]}.{index}"
        if module in _IN_PROJ:
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0)):
                out[f"{prefix}.{_IN_PROJ[module]}.{part}_proj.{kind}"] = chunk.clone()
        elif module in _SUBLAYERS:
            out[f"{prefix}.{_SUBLAYERS[module]}.{kind}"] = tensor
        else:
            raise ValueError(f"{name}: no fairseq counterpart known")
    return out


def fairseq_positions(model: torch.nn.Module, pad_id: int) -> torch.Tensor:
    """Our positional rows as fairseq's table: fairseq looks position p (0-based) up at row
    pad + 1 + p, and pads at row pad (zeros)."""
    if model.cfg.positional != "sinusoidal":
        raise ValueError(f"model.positional={model.cfg.positional!r}: only sinusoidal positions "
                         "map onto fairseq's (its learned ones are another module)")  # fmt: skip
    rows = model.positional(model.cfg.max_positions).detach().float()
    return torch.cat([rows.new_zeros(pad_id + 1, rows.size(1)), rows])


# ---------------------------------------------------------------- the worker (fairseq venv)


def load_into_fairseq(model, weights: dict) -> None:
    """Every fairseq parameter from `weights` (an unknown or missing name is an error),
    fairseq's buffers as they are, and our positional table."""
    own = model.state_dict()
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    given = weights["state_dict"]
    unknown = sorted(set(given) - set(own))
    missing = sorted(parameters - set(given))
    if unknown or missing:
        raise SystemExit(f"fairseq_decode: names not in fairseq's model {unknown}, "
                         f"fairseq parameters not given {missing}")  # fmt: skip
    own.update(given)
    model.load_state_dict(own)
    for side in (model.encoder, model.decoder):
        side.embed_positions.weights = weights["positions"].clone()


def left_padded(sequences: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """(B, longest), padded on the left as fairseq's LanguagePairDataset pads sources."""
    longest = max(map(len, sequences))
    batch = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, ids in enumerate(sequences):
        batch[row, longest - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
    return batch


def fairseq_translate(model, task, spec: dict, sources: list[list[int]]) -> list[dict]:
    """fairseq's best hypothesis per source (tokens without eos, fairseq's score), batched as
    fairseq-generate batches a split: longest first, `batch_size` sentences each."""
    from fairseq.sequence_generator import SequenceGenerator

    generation = spec["generation"]
    dictionary = task.target_dictionary
    generator = SequenceGenerator(
        [model], dictionary, beam_size=generation["beam_size"],
        max_len_a=generation["max_len_a"], max_len_b=generation["max_len_b"],
        min_len=generation["min_len"], len_penalty=generation["length_penalty"],
        unk_penalty=generation["unk_penalty"], normalize_scores=True,
    )  # fmt: skip
    order = sorted(range(len(sources)), key=lambda i: (-len(sources[i]), i))
    results: list[dict] = [{} for _ in sources]
    size = generation["batch_size"]
    device = next(model.parameters()).device
    for start in range(0, len(order), size):
        batch = order[start : start + size]
        src = left_padded([sources[i] for i in batch], dictionary.pad()).to(device)
        sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(dictionary.pad()).sum(1)}}
        with torch.no_grad():
            outputs = generator.generate([model], sample, bos_token=spec["special_ids"]["bos_id"])
        for i, hypotheses in zip(batch, outputs):
            best = hypotheses[0]
            tokens = best["tokens"].tolist()
            if tokens and tokens[-1] == dictionary.eos():
                tokens = tokens[:-1]
            results[i] = {"tokens": tokens, "score": float(best["score"])}
    return results


def worker_main(folder: Path) -> None:
    from benchmarks.fairseq.step_speed import build_task_and_model, quiet_fairseq

    quiet_fairseq()
    spec = json.loads((folder / SPEC_FILE).read_text())
    torch.set_num_threads(spec["threads"])
    weights = torch.load(folder / WEIGHTS_FILE, weights_only=True)
    _, task, model = build_task_and_model(spec)
    load_into_fairseq(model, weights)
    device = torch.device(spec.get("device", "cpu"))
    model.to(device).eval()
    probe = torch.load(folder / PROBE_FILE, weights_only=True, map_location=device)
    pad = task.source_dictionary.pad()
    with torch.no_grad():
        logits, _ = model(probe["src"], probe["src"].ne(pad).sum(1), probe["tgt_in"])
    torch.save(logits.cpu(), folder / PROBE_LOGITS_FILE)
    sources = json.loads((folder / SOURCES_FILE).read_text())
    hypotheses = fairseq_translate(model, task, spec, sources)
    (folder / HYPOTHESES_FILE).write_text(json.dumps(hypotheses) + "\n")
    seconds = []  # the first decode above was the warm-up
    for _ in range(spec.get("timing_repeats", 0)):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fairseq_translate(model, task, spec, sources)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    (folder / SECONDS_FILE).write_text(json.dumps(seconds) + "\n")


# ---------------------------------------------------------------- the client (our venv)


def probe_batch(src_ids: Sequence[Sequence[int]], bos_id: int, pad_id: int) -> dict:
    """The first PROBE_SENTENCES sources, and as their target prefixes bos + the same ids
    (any real ids serve: the probe checks that two implementations compute one function)."""
    from pipeline.evaluation.beam_decoding import pad_batch

    chosen = [list(ids) for ids in src_ids[:PROBE_SENTENCES]]
    prefixes = [[bos_id, *ids[:-1]] for ids in chosen]
    return {"src": pad_batch(chosen, pad_id), "tgt_in": pad_batch(prefixes, pad_id)}


def probe_difference(model, probe: dict, fairseq_logits: torch.Tensor, pad_id: int) -> float:
    """Largest |ours - fairseq| over the probe's non-pad target positions, in units of what
    float32 rounding allows there (`pipeline.rounding.logit_tolerances`): above 1, the two
    compute other functions of the same weights."""
    from pipeline.rounding import logit_tolerances

    with torch.no_grad():
        ours = model(probe["src"], probe["tgt_in"]).float()
    theirs = fairseq_logits.float()
    real = probe["tgt_in"].ne(pad_id)
    keys = max(probe["src"].size(1), probe["tgt_in"].size(1))
    # the larger of the two sides' bounds: each side rounds its own logits
    bounds = torch.maximum(logit_tolerances(model, ours, keys),
                           logit_tolerances(model, theirs, keys))  # fmt: skip
    excess = (ours - theirs).abs().amax(dim=-1) / bounds
    return float(excess[real].max())


def model_scores(model, src_ids, hypotheses, eval_cfg, eos_id: int,
                 bos_id: int) -> list[tuple[float, float]]:  # fmt: skip
    """Each hypothesis's log-probability under the model, eos included, divided by the
    length penalty of `eval_cfg` (what beam search ranks finished hypotheses by), and how far
    float32 rounding may move it (`pipeline.rounding.log_prob_tolerance`, over the same
    normaliser): (score, tolerance) per hypothesis; batched by `eval_cfg.max_tokens`."""
    from pipeline.evaluation.beam_decoding import hypothesis_log_probs, summed_log_prob
    from pipeline.model.length_penalty import length_normalizer
    from pipeline.rounding import log_prob_tolerance

    rows = hypothesis_log_probs(model, src_ids, hypotheses, bos_id=bos_id,
                                max_tokens=eval_cfg.max_tokens)  # fmt: skip
    scored = []
    for source, log_probs, tokens in zip(src_ids, rows, hypotheses):
        normalizer = length_normalizer(len(tokens) + 1, eval_cfg.length_penalty,
                                       eval_cfg.length_normalization)  # fmt: skip
        keys = max(min(len(source), model.cfg.max_positions), len(tokens) + 1)
        scored.append((summed_log_prob(log_probs, tokens, eos_id) / normalizer,
                       log_prob_tolerance(model, log_probs, keys) / normalizer))  # fmt: skip
    return scored


def segmented_by_subword_nmt(cfg) -> bool:
    """A run on Wu et al.'s subword-nmt text (`benchmarks.fairseq.wu2021_segmentation`): its pieces are
    Moses tokens split by `@@ ` joiners."""
    return cfg.data.source == "text" and cfg.data.tokenizer.model_type == "word"


def hypothesis_texts(tokenizer, hypotheses: Sequence[Sequence[int]], cfg) -> list[str]:
    """Hypothesis ids as the text that is scored (see `segmented_by_subword_nmt`)."""
    from pipeline.data.moses import moses_detokenize
    from pipeline.data.subword_nmt import join
    from pipeline.evaluation.beam_decoding import one_line

    texts = [one_line(tokenizer.decode(ids)) for ids in hypotheses]
    if segmented_by_subword_nmt(cfg):
        texts = moses_detokenize([join(text) for text in texts], cfg.data.tgt_lang)
    return texts


def run_worker(venv: Path, folder: Path,
               module: str = "benchmarks.fairseq.decode_checkpoint") -> None:  # fmt: skip
    """`module`'s worker half (`--worker FOLDER`) in fairseq's venv, with the fairseq
    harness's environment."""
    from benchmarks.fairseq import train_peer

    harness = train_peer.build_parser().parse_args(["--venv", str(venv)])
    if train_peer.built_venv(venv) is None:
        raise SystemExit(f"no fairseq venv at {venv}: build it with "
                         "`python -m benchmarks.fairseq.train_peer --build-venv-only`")  # fmt: skip
    command = [train_peer.venv_bin(harness, "python"), "-m", module, "--worker", str(folder)]
    subprocess.run(command, env=train_peer.tool_env(harness), cwd=train_peer.REPO_ROOT,
                   check=True)  # fmt: skip


def decode_with_fairseq(model, cfg, special: dict, src_ids, generation: dict, *, venv: Path,
                        threads: int, device: str = "cpu",
                        timing_repeats: int = 0) -> tuple[float, list[dict], list[float]]:  # fmt: skip
    """Our model's weights in fairseq on `device`, its logits checked against ours on a probe
    batch, then fairseq's beam search over `src_ids`, and `timing_repeats` more decodes of all
    of them timed in the worker (the first decode is their warm-up) -> (`probe_difference`,
    fairseq's best hypothesis per source: {"tokens": ids without eos, "score": fairseq's
    normalised score}, seconds of each timed decode)."""
    from benchmarks.train_throughput import fairseq_flags

    pad_id = special["pad_id"]
    probe = probe_batch(src_ids, special["bos_id"], pad_id)
    with tempfile.TemporaryDirectory(prefix="fairseq-decode-") as scratch:
        folder = Path(scratch)
        spec = {"flags": fairseq_flags(cfg, device), "vocab_size": model.vocab_size,
                "special_ids": special, "threads": threads, "generation": generation,
                "device": device, "timing_repeats": timing_repeats}  # fmt: skip
        (folder / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        torch.save({"state_dict": fairseq_state_dict(model),
                    "positions": fairseq_positions(model, pad_id)}, folder / WEIGHTS_FILE)  # fmt: skip
        torch.save(probe, folder / PROBE_FILE)
        (folder / SOURCES_FILE).write_text(json.dumps([list(ids) for ids in src_ids]) + "\n")
        run_worker(venv, folder)
        fairseq_logits = torch.load(folder / PROBE_LOGITS_FILE, weights_only=True)
        hypotheses = json.loads((folder / HYPOTHESES_FILE).read_text())
        seconds = json.loads((folder / SECONDS_FILE).read_text())
    difference = probe_difference(model, probe, fairseq_logits, pad_id)
    if difference > 1:
        raise SystemExit(f"the model in fairseq computes other logits than ours (a difference "
                         f"{difference:.2f} times what float32 rounding allows): not comparing")  # fmt: skip
    return difference, hypotheses, seconds


def references_for(cfg, split: str, prepared_targets: Sequence[str]) -> list[str]:
    """What each pipeline scores against: a subword-nmt run's raw references, normalised as
    the fairseq harness has them (`train_peer.score_split`); otherwise the prepared split, as
    our evaluate stage."""
    from benchmarks.fairseq import train_peer

    if not segmented_by_subword_nmt(cfg):
        return list(prepared_targets)
    raw = train_peer.raw_references(Path(cfg.data.raw_dir), split, cfg.data.tgt_lang)
    if len(raw) != len(prepared_targets):
        raise SystemExit(f"{split}: {len(prepared_targets)} segmented sentences but "
                         f"{len(raw)} raw references in {cfg.data.raw_dir}")  # fmt: skip
    return raw


SEARCHES = ("ours", "fairseq")
OUR_SEARCH_KEYS = ("beam_size", "length_penalty", "length_normalization", "max_len_a", "max_len_b")


def compare_split(model, tokenizer, cfg, split: str, generation: dict, *, venv: Path,
                  threads: int) -> tuple[dict, dict[str, list[str]]]:  # fmt: skip
    """Both searches over `split`: (its entry of the result, the translations per search)."""
    import dataclasses

    from benchmarks.train_throughput import special_ids
    from pipeline.data.prepared import read_prepared
    from pipeline.evaluation.beam_decoding import translate_ids
    from pipeline.evaluation.scoring import length_ratio, paired_bootstrap, score

    corpus = read_prepared(cfg, [split])[split]
    src_ids = tokenizer.encode_sources(corpus.src)
    references = references_for(cfg, split, corpus.tgt)
    difference, fairseq_out, _ = decode_with_fairseq(
        model, cfg, special_ids(tokenizer), src_ids, generation, venv=venv, threads=threads
    )
    ours_eval = dataclasses.replace(cfg.eval, nbest=1)
    ours_out = translate_ids(model, tokenizer, src_ids, ours_eval, desc=f"our beam search, {split}")
    tokens = {"ours": [t.tokens[0] if t.tokens else [] for t in ours_out],
              "fairseq": [h["tokens"] for h in fairseq_out]}  # fmt: skip
    texts = {name: hypothesis_texts(tokenizer, ids, cfg) for name, ids in tokens.items()}
    model_score = {name: model_scores(model, src_ids, ids, cfg.eval, tokenizer.eos_id,
                                      tokenizer.bos_id) for name, ids in tokens.items()}  # fmt: skip
    paired = paired_bootstrap(texts["fairseq"], texts["ours"], references, metrics=("bleu_lc",))
    # One search's hypothesis scores higher only beyond what rounding may move either score.
    diffs = [(o - f, max(o_tol, f_tol))
             for (o, o_tol), (f, f_tol) in zip(model_score["ours"], model_score["fairseq"])]  # fmt: skip
    entry = {
        "sentences": len(src_ids),
        "probe_logit_difference_over_rounding_bound": difference,
        "scores": {
            name: {
                **score(texts[name], references, lang=cfg.data.tgt_lang),
                "length_ratio": length_ratio(texts[name], references),
            }
            for name in SEARCHES
        },  # fmt: skip
        "paired_bootstrap_bleu_lc": {
            "ours_minus_fairseq": paired["bleu_lc"].system - paired["bleu_lc"].baseline,
            "p_value": paired["bleu_lc"].p_value,
        },
        "identical_hypotheses": sum(a == b for a, b in zip(*tokens.values())),
        "model_score": {
            "ours_higher": sum(d > tolerance for d, tolerance in diffs),
            "fairseq_higher": sum(d < -tolerance for d, tolerance in diffs),
            "mean": {
                name: sum(s for s, _ in scored) / len(scored)
                for name, scored in model_score.items()
            },  # fmt: skip
        },
    }
    return entry, texts


def training_record(cfg) -> dict | None:
    """What the run's metrics say of its training (train.json), if it has finished."""
    path = Path(cfg.paths.metrics_dir) / "train.json"
    if not path.exists():
        return None
    train = current_names(json.loads(path.read_text()), FORMER_SUMMARY)
    keys = ("steps", "epochs", "wall_time_s", MEAN_TOKENS_PER_SEC, "train/target_tokens",
            "precision", "val/loss", "best_step")  # fmt: skip
    return {key: train.get(key) for key in keys}


def compare(cfg, checkpoint: Path, splits: Sequence[str], out: Path, *, venv: Path,
            threads: int, extra: dict | None = None) -> dict:  # fmt: skip
    """Decode each of `splits` with `checkpoint` by both searches; writes `out` and each
    search's translations beside it (`hypotheses_path`); returns what `out` holds."""
    from benchmarks.fairseq import train_peer
    from pipeline.atomic import write_json_atomic
    from pipeline.environment import provenance
    from pipeline.evaluation.model_loading import load_model, load_tokenizer, tokenizer_path

    made_with = provenance()  # at the start: commits made while it runs are not its code
    model = load_model(checkpoint)
    tokenizer = load_tokenizer(tokenizer_path(cfg), model, cfg.data)
    harness = train_peer.build_parser().parse_args([])
    generation = {"beam_size": cfg.eval.beam_size, "length_penalty": cfg.eval.length_penalty,
                  "batch_size": harness.gen_batch_size, **FAIRSEQ_GENERATION}  # fmt: skip
    entries, translations = {}, {}
    for split in splits:
        entries[split], translations[split] = compare_split(
            model, tokenizer, cfg, split, generation, venv=venv, threads=threads
        )
    # the harness's segmented files, or the tokenizer the run learned itself
    subwords = HARNESS_SUBWORDS if segmented_by_subword_nmt(cfg) else cfg.data.tokenizer.model_type
    result = {
        "benchmark": "fairseq_decode",
        "checkpoint": str(checkpoint),
        "run": {"experiment": cfg.experiment_name, "seed": cfg.seed,
                "max_steps": cfg.train.max_steps, "init": cfg.model.init, "subwords": subwords},
        "training": training_record(cfg),
        **(extra or {}),
        "searches": {"ours": {key: getattr(cfg.eval, key) for key in OUR_SEARCH_KEYS},
                     "fairseq": generation},
        "splits": entries,
        "provenance": made_with,
    }  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    for split, texts in translations.items():
        for search, lines in texts.items():
            hypotheses_path(out, split, search).write_text("\n".join(lines) + "\n")
    write_json_atomic(out, result)
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from benchmarks.fairseq.train_peer import DEFAULT_VENV

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the result JSON")
    parser.add_argument("--splits", nargs="+", help="default: data.val_split")
    parser.add_argument("--checkpoint", type=Path, help="default: the run's eval/model.ckpt")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="fairseq's venv")
    parser.add_argument("--train-command", default="",
                        help="the command that trained the run, for the parity table's row")  # fmt: skip
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    return parser.parse_args(argv)


def run_model(cfg, given: Path | None, scratch: Path) -> tuple[Path, list[str]]:
    """The model to decode and the checkpoints it averages: `given`; else the evaluate
    stage's `eval/model.ckpt`; else what the evaluate stage would average (`eval.average`
    and `eval.average_by` over the run's checkpoints), written into `scratch`."""
    from pipeline.evaluation.model_loading import (
        model_checkpoint_path,
        source_checkpoints,
        write_model_checkpoint,
    )
    from pipeline.training.checkpoints import load_weights_only

    if given is not None and not Path(given).is_file():
        raise SystemExit(f"--checkpoint {given}: no such file")
    path = Path(given) if given is not None else model_checkpoint_path(cfg)
    if path.is_file():
        saved = load_weights_only(path)
        return path, list(saved.get("averaged_from", [str(path)]))
    target = scratch / "model.ckpt"
    return target, write_model_checkpoint(source_checkpoints(cfg), target)["averaged_from"]


def cli(argv: Sequence[str] | None = None) -> None:
    from pipeline import config

    args = parse_args(argv)
    cfg = config.load()
    with tempfile.TemporaryDirectory(prefix="fairseq-decode-model-") as scratch:
        checkpoint, averaged_from = run_model(cfg, args.checkpoint, Path(scratch))
        result = compare(cfg, checkpoint, args.splits or [cfg.data.val_split], args.out,
                         venv=args.venv, threads=args.threads,
                         extra={"averaged_from": averaged_from,
                                "train_command": args.train_command,
                                "command": " ".join(["python -m benchmarks.fairseq.decode_checkpoint",
                                                     *(argv or sys.argv[1:])])})  # fmt: skip
    for split, entry in result["splits"].items():
        scores = {name: round(entry["scores"][name]["bleu_lc"], 2) for name in SEARCHES}
        print(
            f"{split}: BLEU lc {scores}, ours - fairseq's search "
            f"{entry['paired_bootstrap_bleu_lc']}, identical {entry['identical_hypotheses']} "
            f"of {entry['sentences']}, model score {entry['model_score']}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(Path(sys.argv[2]))
    else:
        from pipeline.cli import main

        main(cli)
