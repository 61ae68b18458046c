"""fairseq's training step, timed beside ours by `benchmarks.train_throughput`.

fairseq lives in its own venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`), so its
step runs in a worker process of that venv:

    <fairseq venv>/bin/python -m benchmarks.fairseq.step_speed HANDOVER/spec.json

train_throughput writes the hand-over (`write_handover`): the batch it times every system on
(`batch.pt`: src, tgt_in, tgt_out, the same token ids) and `spec.json`: fairseq-train's flags
(sizes, dropouts, criterion, Adam, all from our config), the vocabulary size and special ids
(fairseq's dictionary is given ours, so the pad id is the same), the thread count and the
host memory settings. The worker builds everything the way fairseq-train does (its parser,
`TranslationTask.build_model/build_criterion`, `optim.build_optimizer`: on a CPU fairseq's own
Adam), prints one JSON line (parameter count, versions), then runs one step per `step` line on
stdin and answers each with a JSON line. train_throughput times those calls interleaved with
its other systems, so every system gets the same warm-up, rounds and slow-downs (the pipe's
round trip, well under a millisecond against a step of ~1 s, is inside fairseq's time).

The step is `Trainer.train_step`'s core: zero grads, `task.train_step` (forward, label-smoothed
loss, backward), gradients x 1 / target tokens, `optimizer.step()`; not its logging, nan checks
or gradient norm (ours computes none without clipping either). float32 only: fairseq 0.12's
`--bf16` implies `--tpu` (options.parse_args_and_arch; the trainer then asks torch_xla for its
device) and `--amp` is CUDA's autocast and GradScaler, so a CPU trains fairseq in float32.

Only the standard library and torch at module level (and `pipeline.training.cpu_memory`, which
is standard library only): the venv has none of this project's dependencies.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

SPEC_FILE = "spec.json"
BATCH_FILE = "batch.pt"
BATCH_KEYS = ("src", "tgt_in", "tgt_out")
STEP = "step"  # the one request on the worker's stdin
# fairseq's only training precision on a CPU (see the module docstring)
PRECISION = "float32"
NO_CPU_BF16 = (
    "fairseq 0.12 has no bf16 mode on a CPU (--bf16 implies --tpu, --amp is CUDA autocast): "
    "it is timed in float32 only"
)


# ---------------------------------------------------------------- the hand-over


def write_handover(folder: Path, batch: dict[str, torch.Tensor], spec: dict) -> Path:
    """The batch's token tensors and the spec into `folder`; returns the spec's path."""
    folder = Path(folder)
    torch.save({key: batch[key].cpu() for key in BATCH_KEYS}, folder / BATCH_FILE)
    path = folder / SPEC_FILE
    path.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    return path


def read_handover(spec_path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    spec_path = Path(spec_path)
    batch = torch.load(spec_path.parent / BATCH_FILE, weights_only=True)
    return batch, json.loads(spec_path.read_text())


def fairseq_sample(batch: dict[str, torch.Tensor], pad_id: int) -> dict:
    """The batch as fairseq's criterion reads a sample: the same source, decoder input and
    target tokens; `ntokens` (the loss's denominator) counts the non-pad targets."""
    src, target = batch["src"], batch["tgt_out"]
    return {
        "net_input": {
            "src_tokens": src,
            "src_lengths": src.ne(pad_id).sum(dim=1),
            "prev_output_tokens": batch["tgt_in"],
        },
        "target": target,
        "ntokens": int(target.ne(pad_id).sum()),
        "nsentences": target.size(0),
    }


# ---------------------------------------------------------------- the worker (fairseq venv)


def shared_dictionary(vocab_size: int, special_ids: dict[str, int]):
    """A fairseq Dictionary of `vocab_size` placeholder symbols whose pad/bos/eos/unk are
    our tokenizer's ids (fairseq's own would put pad at 1); the model reads only its size and
    pad id."""
    from fairseq.data import Dictionary

    dictionary = Dictionary(add_special_symbols=False)
    for index in range(vocab_size):
        dictionary.add_symbol(f"<piece{index}>")
    dictionary.pad_index = special_ids["pad_id"]
    dictionary.bos_index = special_ids["bos_id"]
    dictionary.eos_index = special_ids["eos_id"]
    dictionary.unk_index = special_ids["unk_id"]
    return dictionary


def build_task_and_model(spec: dict):
    """(fairseq config, TranslationTask, model) as fairseq-train builds them from
    `spec["flags"]`, on our vocabulary."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.tasks.translation import TranslationTask

    args = options.parse_args_and_arch(options.get_training_parser(), ["unused", *spec["flags"]])
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(cfg.common.seed)
    dictionary = shared_dictionary(spec["vocab_size"], spec["special_ids"])
    task = TranslationTask(cfg.task, dictionary, dictionary)
    return cfg, task, task.build_model(cfg.model)


def build_optimizer(cfg, params: list):
    """The optimizer fairseq's Trainer builds (`Trainer._build_optimizer`): its AMP wrapper
    (autocast + loss scaling) for `--amp`, its FP16 wrapper (fp16 weights, fp32 master copy,
    loss scaling) for `--fp16`, else the plain optimizer."""
    from fairseq import optim

    if cfg.common.amp:
        return optim.AMPOptimizer.build_optimizer(cfg, params)
    if cfg.common.fp16:
        return optim.FP16Optimizer.build_optimizer(cfg, params)
    return optim.build_optimizer(cfg.optimizer, params)


def build_step(spec: dict, batch: dict[str, torch.Tensor]):
    """(step function, model) built as fairseq-train builds them from `spec["flags"]`, on
    `spec["device"]` (cpu, or cuda with fairseq's precision flags)."""
    from fairseq import utils

    cfg, task, model = build_task_and_model(spec)
    device = torch.device(spec.get("device", "cpu"))
    if cfg.common.fp16 and not cfg.common.amp:
        model = model.half()  # as fairseq's Trainer does for --fp16
    model.to(device).train()
    dictionary = task.target_dictionary
    criterion = task.build_criterion(cfg.criterion).to(device)
    optimizer = build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    sample = fairseq_sample(batch, dictionary.pad())
    if device.type == "cuda":
        sample = utils.move_to_cuda(sample, device=device)
    scaled = cfg.common.fp16 or cfg.common.amp

    def step() -> None:  # Trainer.train_step without its bookkeeping
        optimizer.zero_grad()
        _, sample_size, _ = task.train_step(sample, model, criterion, optimizer, update_num=0)
        optimizer.multiply_grads(1.0 / sample_size)
        if scaled:  # fp16 loss scaling: the Trainer's overflow check, then a skipped update
            try:
                optimizer.clip_grad_norm(0.0)
            except OverflowError:
                return
        optimizer.step()

    return step, model


def quiet_fairseq() -> None:
    """fairseq 0.12 through newer hydra and torch prints pages of deprecation notes and
    hydra's debug log on every start, none of them about the work at hand."""
    logging.basicConfig(level=logging.WARNING)
    warnings.simplefilter("ignore", (UserWarning, FutureWarning))


def worker_main(argv: Sequence[str]) -> None:
    """Serve `step` requests on stdin; answers go to the real stdout, anything else printed
    (fairseq's warnings) to stderr."""
    answers, sys.stdout = sys.stdout, sys.stderr
    quiet_fairseq()
    import fairseq

    from pipeline.training.cpu_memory import configure_cpu_memory

    (spec_path,) = argv
    batch, spec = read_handover(Path(spec_path))
    configure_cpu_memory(**spec["cpu_memory"])
    torch.set_num_threads(spec["threads"])
    step, model = build_step(spec, batch)

    def answer(payload: dict) -> None:
        answers.write(json.dumps(payload, sort_keys=True) + "\n")
        answers.flush()

    answer({
        "parameters": sum(p.numel() for p in model.parameters()),
        "fairseq": fairseq.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "precision": next((f[2:] for f in ("--amp", "--fp16") if f in spec["flags"]), PRECISION),
    })  # fmt: skip
    cuda = spec.get("device", "cpu").startswith("cuda")
    for request in sys.stdin:
        if request.strip() != STEP:
            raise SystemExit(f"fairseq_step: unknown request {request!r}")
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() if cuda else None
        answer({"seconds": time.perf_counter() - start, "peak_memory_bytes": peak})


# ---------------------------------------------------------------- the client (our venv)


class FairseqStepWorker:
    """A running worker: `info` is its first line (parameters, versions); calling it runs one
    step and returns the worker's own seconds for it."""

    def __init__(self, python: str, spec_path: Path, env: dict, cwd: Path) -> None:
        command = [python, "-m", "benchmarks.fairseq.step_speed", str(spec_path)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, cwd=cwd, text=True)  # fmt: skip
        self.info = self._read()
        self.peak_memory_bytes: int | None = None  # on CUDA: the worker's, after its last step

    def __call__(self) -> float:
        self.process.stdin.write(STEP + "\n")
        self.process.stdin.flush()
        answer = self._read()
        self.peak_memory_bytes = answer.get("peak_memory_bytes")
        return answer["seconds"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            raise RuntimeError(f"the fairseq worker ended (exit {code}); its stderr is above")
        return json.loads(line)

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()

    def __enter__(self) -> FairseqStepWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    worker_main(sys.argv[1:])
