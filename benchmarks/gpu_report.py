"""docs/lab-benchmarks.md's GPU tables, generated from one run of benchmarks/gpu_figures.sh.

    python -m benchmarks.gpu_report [FOLDER] [--update-docs]

FOLDER (default benchmarks/results/gpu, the committed run; a later run replaces its files) holds
that run's `gpu_suite.json` and `sweep_workers.json` (either may be missing:
its tables then say so). The block `gpu` of docs/lab-benchmarks.md gets: the machine and
versions; the four targets with the measured figure and whether it is met; training (ours,
torch.nn.Transformer and fairseq per size and dtype: step time, target tokens/s, MFU, peak
memory, ours' speed over each); decoding (sentences/s per batch size); trials per hour by
number of sweep workers with the GPU's utilisation; and every part that did not run, with its
reason. Every figure is read from the JSON; nothing is typed in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline import docs_blocks

PAGE = docs_blocks.DOCS / "lab-benchmarks.md"
RESULTS = Path("benchmarks/results/gpu")
BLOCK = "gpu"
SUITE, SWEEP = "gpu_suite.json", "sweep_workers.json"

# The targets a GPU run is read against: (name, threshold). A shortfall is a finding.
MFU_TARGET = 0.40  # paper-base, bf16
FAIRSEQ_AMP_TARGET = 1.3  # ours' tokens/s over fairseq --amp, bf16
CTRANSLATE2_TARGET = 0.5  # ours' beam search sentences/s over CTranslate2 float16
WORKERS_TARGET = 4.0  # trials/hour at the best N over N = 1, Transformer-tiny
TARGET_SIZE = "base"
OURS_DECODER, CT2_DECODER = "ours_bfloat16", "ctranslate2_float16"
# The tables' order (JSON keys come back sorted): ours first, peers after, float32 before bf16
ORDER = ("ours", "torch", "fairseq_float32", "fairseq_fp16", "fairseq_amp", "float32",
         "bfloat16", "ours_float32", "ours_bfloat16", "ctranslate2_float16", "ctranslate2",
         "ctranslate2_int8", "fairseq")  # fmt: skip


def ordered(mapping: dict) -> list:
    """`mapping`'s items in ORDER (names it lacks last, by name; batch sizes by number)."""

    def key(item):
        name = item[0]
        if name.isdigit():
            return (0, int(name), "")
        return (1, ORDER.index(name) if name in ORDER else len(ORDER), name)

    return sorted(mapping.items(), key=key)


def load(folder: Path) -> tuple[dict | None, dict | None]:
    def read(name: str) -> dict | None:
        path = folder / name
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    return read(SUITE), read(SWEEP)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value >= target else "not met"


def targets(suite: dict | None, sweep: dict | None) -> list[list[str]]:
    """[target, figure, verdict] for each of the four targets."""
    rows = []
    bf16 = (suite or {}).get("train", {}).get(TARGET_SIZE, {}).get("results", {}).get("bfloat16")
    mfu = bf16["systems"]["ours"]["mfu"] if bf16 else None
    rows.append([f"paper-base bf16 MFU >= {MFU_TARGET:.0%}",
                 "-" if mfu is None else f"{mfu:.1%}", _verdict(mfu, MFU_TARGET)])  # fmt: skip
    over_amp = bf16["ours_over"].get("fairseq_amp") if bf16 else None
    rows.append([f"paper-base bf16 step >= {FAIRSEQ_AMP_TARGET}x fairseq --amp",
                 "-" if over_amp is None else f"{over_amp:.2f}x",
                 _verdict(over_amp, FAIRSEQ_AMP_TARGET)])  # fmt: skip
    decode = ((suite or {}).get("decode") or {}).get("results", {})
    ratios = {
        batch: r["sentences_per_s"][OURS_DECODER] / r["sentences_per_s"][CT2_DECODER]
        for batch, r in decode.items()
        if {OURS_DECODER, CT2_DECODER} <= set(r["sentences_per_s"])
    }
    worst = min(ratios.values()) if ratios else None
    figure = ", ".join(f"{ratio:.2f}x at batch {batch}" for batch, ratio in ratios.items())
    rows.append([f"beam search (bf16) >= {CTRANSLATE2_TARGET}x CTranslate2 float16",
                 figure or "-", _verdict(worst, CTRANSLATE2_TARGET)])  # fmt: skip
    runs = (sweep or {}).get("through_sweep", [])
    one = next((r["trials_per_hour"] for r in runs if r["workers"] == 1), None)
    best = max(runs, key=lambda r: r["trials_per_hour"], default=None)
    gain = best["trials_per_hour"] / one if one and best else None
    rows.append([f"trials/hour at the best N >= {WORKERS_TARGET:g}x N = 1 (Transformer-tiny)",
                 "-" if gain is None else f"{gain:.2f}x (N = {best['workers']})",
                 _verdict(gain, WORKERS_TARGET)])  # fmt: skip
    return rows


def machine_line(suite: dict | None, sweep: dict | None) -> str:
    record = suite or sweep
    provenance = record["provenance"]
    versions = (suite or {}).get("versions", {})
    parts = [provenance["hardware"]]
    if versions.get("driver"):
        parts.append(f"driver {versions['driver']}")
    parts.append(f"torch {versions.get('torch') or record.get('torch')}")
    cuda = versions.get("cuda") or record.get("cuda")
    if cuda:
        parts.append(f"CUDA {cuda}")
    if versions.get("cudnn"):
        parts.append(f"cuDNN {versions['cudnn']}")
    parts.append(f"commit {provenance['commit']}")
    return "Measured on " + ", ".join(parts) + "."


def training_table(suite: dict) -> str:
    rows = []
    for size, result in suite["train"].items():
        for dtype, r in ordered(result["results"]):
            for name, s in ordered(r["systems"]):
                over = r["ours_over"].get(name)
                rows.append([size, dtype, name, f"{s['step_ms']:,.1f}",
                             f"{s['tgt_tokens_per_s']:,.0f}", f"{s['mfu']:.1%}",
                             _mib(s["peak_memory_bytes"]),
                             "-" if over is None else f"{over:.2f}"])  # fmt: skip
    header = ["size", "dtype", "system", "step ms", "target tokens/s", "MFU", "peak memory MiB",
              "ours / system"]  # fmt: skip
    return docs_blocks.markdown_table(header, rows)


def decoding_table(decode: dict) -> str:
    rows = []
    for batch, r in ordered(decode["results"]):
        ours = r["sentences_per_s"].get(OURS_DECODER)
        for name, rate in ordered(r["sentences_per_s"]):
            over = "-" if ours is None or name.startswith("ours") else f"{ours / rate:.2f}"
            rows.append([batch, name, f"{rate:,.1f}", over])
    return docs_blocks.markdown_table(
        ["batch", "decoder", "sentences/s", "ours bf16 / decoder"], rows
    )


def workers_table(sweep: dict) -> str:
    rows = []
    for r in sweep["through_sweep"]:
        gpu = r.get("gpu", {})
        utilisation = gpu.get("utilisation_mean_percent")
        rows.append([str(r["workers"]), str(r["trials"]), f"{r['wall_s']:,.0f}",
                     f"{r['trials_per_hour']:,.0f}",
                     "-" if utilisation is None else f"{utilisation:.0f}%",
                     _mib(gpu.get("memory_used_max_bytes"))])  # fmt: skip
    header = ["workers", "trials", "wall s", "trials/hour", "GPU utilisation (mean)",
              "GPU memory MiB (max)"]  # fmt: skip
    return docs_blocks.markdown_table(header, rows)


def block(suite: dict | None, sweep: dict | None) -> str:
    if suite is None and sweep is None:
        return "No GPU run is recorded yet.\n"
    out = [
        machine_line(suite, sweep),
        "",
        docs_blocks.markdown_table(["target", "measured", ""], targets(suite, sweep)),
    ]
    if suite is not None:
        sizes = ", ".join(f"{size}: {r['batch']['tgt_tokens']:,} target tokens a batch"
                          for size, r in suite["train"].items())  # fmt: skip
        out += [f"**Training**, one step ({sizes}; median of {suite['repeats']} timed "
                "rounds, systems interleaved; MFU against the card's dense bf16 peak, "
                f"{suite['peak']['dense_bf16_flops_per_s'] / 1e12:,.3g} TFLOP/s, "
                f"{suite['peak']['source']}):", "", training_table(suite)]  # fmt: skip
        if suite.get("decode"):
            d = suite["decode"]
            out += [f"**Decoding** {d['split']}, beam {d['beam_size']}, "
                    f"{d['decoder_steps_per_sentence']} decoder steps a sentence "
                    f"({d['size']} model, untrained weights):", "", decoding_table(d)]  # fmt: skip
    if sweep is not None:
        out += [f"**Sweep workers** sharing the card (`{sweep['spec']}`, trials per worker: "
                f"{sweep['n_trials'] or 'the whole grid'}):", "", workers_table(sweep)]  # fmt: skip
    skipped = {**(suite or {}).get("skipped", {})}
    if skipped:
        out += ["Not measured:", ""]
        out += [f"- `{key}`: {reason}" for key, reason in sorted(skipped.items())]
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=RESULTS,
                        help="a run's folder: gpu_suite.json, sweep_workers.json")  # fmt: skip
    docs_blocks.add_update_argument(parser, str(PAGE))
    args = parser.parse_args(argv)
    text = block(*load(args.folder))
    if args.update_docs is not None:
        docs_blocks.fill(args.update_docs / PAGE, BLOCK, text)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
