"""Wu et al. (2021)'s Transformer-tiny recipe run with fairseq itself, beside ours.

    python -m benchmarks.fairseq.train_peer --out results/fairseq_peer.json [--max-update 8000] [...]
    python -m benchmarks.fairseq.train_peer --build-venv-only   # stage 1 alone (train_throughput's fairseq)

Wu et al. (2021), "Good for Misconceived Reasons", report 41.0 lowercased BLEU on test2016
(LividWo/Revisit-MMT: README-baseline.md, evaluate.sh). This harness runs the toolkit that
produced it on this machine, end to end, and scores its output with this project's scoring, so
the two systems are compared by one yardstick. `--help` gives every setting and its default:

 1. venv      fairseq's own venv outside the repository (`--venv`; fairseq is never a dependency
              of this package): torch (a CUDA build refused after a pip dry run, unless
              `--allow-cuda-torch`), fairseq's dependencies, subword-nmt, sacremoses, then
              fairseq-fixed 0.12.3.1 with `--no-deps` (torchaudio left out). Reused while its
              specs are unchanged.
 2. prepare   the dataset's `scripts/task1-tokenize.sh` (lowercase, Moses punctuation
              normalisation, Moses tokenizer with escaping) in sacremoses:
              `pipeline.data.moses.moses_tokenize`, our own `pretokenizer: moses`.
 3. bpe       joint subword-nmt BPE learned on en+de train, applied per file with its
              language's vocabulary, as `scripts/task1-bpe.sh` does.
 4. binarize  `fairseq-preprocess --joined-dictionary`.
 5. train     `fairseq-train --arch transformer` with every size explicit (fairseq's own
              `transformer_tiny` is another model), shared embeddings, their fork's
              `--clip-norm 25`, `--max-tokens 4096 --update-freq 2` (their 2 GPUs on one
              device), float32 (`--device cuda`: on the GPU, still float32).
 6. average   the mean of the last `--average-last` epoch checkpoints: fairseq's
              `scripts/average_checkpoints.py` (not shipped by fairseq-fixed), run in the venv.
 7. generate  `fairseq-generate --beam 5 --remove-bpe` on val and test2016 with
              `--required-batch-size-multiple 1` (fairseq 0.12 drops a last batch that is not a
              multiple of it: its issue #5036), so every sentence is translated.
 8. score     fairseq's BLEU4 line (the number Wu et al. report) and this project's scoring of
              the Moses-detokenized hypotheses against the raw references (`bleu_lc`,
              `bleu_tok_lc`, exactly as our evaluation computes them).

The result (recipe, updates, epochs, target tokens, wall and CPU times, tokens/s, scores, every
command, hardware) goes to `--out` as JSON and is stdout's last line. Everything runs in
`--work-dir`, outside the repository; data stages are reused while their settings hold, an
interrupted `fairseq-train` of the same command resumes from `checkpoint_last.pt`, another
command in that work dir is refused. `--max-train-pairs` / `--max-eval-pairs` make a smoke run
(`smoke: true`); `--dry-run` prints the commands. Offline GPU machine: `--device cuda
--system-site-packages --torch-spec torch==X --allow-cuda-torch` uses the machine's torch; pip's
PIP_NO_INDEX / PIP_FIND_LINKS point the rest at local wheels. fairseq runs on `--threads` (1)
threads with no loader processes, so its tokens/s compare with our one-thread numbers.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

# Only the standard library at module level: `python -m benchmarks.fairseq.train_peer average ...`
# runs inside the fairseq venv, which has torch but none of this project's packages.

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "transformer-ablations"
DEFAULT_VENV = CACHE / "fairseq-venv"
DEFAULT_WORK_DIR = CACHE / "fairseq-peer"
DEFAULT_CORPUS = REPO_ROOT.parent / "shared" / "data" / "multi30k"  # as conf/data/multi30k.yaml
CORPUS_ENV = "MULTI30K_DIR"  # pipeline.config.RAW_DIR_ENV

TORCH_SPEC = "torch==2.13.0"
FAIRSEQ_SPEC = "fairseq-fixed==0.12.3.1"
# fairseq-fixed 0.12.3.1's install_requires without torchaudio, plus the build tools that
# `--no-build-isolation` needs and the data tools; the data tools are pinned (their output is
# part of the recipe), sacremoses to the version of requirements.lock.
DEPENDENCIES = (
    "setuptools", "wheel", "numpy", "cython", "hydra-core==1.3.2", "omegaconf==2.3.0", "regex",
    "sacrebleu", "tqdm", "bitarray", "scikit-learn", "packaging", "cffi",
    "subword-nmt==0.3.8", "sacremoses==0.2.0",
)  # fmt: skip
VENV_MARKER = ".fairseq-peer.json"  # written last: a venv without it is an unfinished build
VENV_BUILDING = ".fairseq-peer-building"  # written first: a venv this harness may replace
DONE = ".done.json"  # a finished stage's settings, beside its outputs
# fairseq's subset names for our splits (fairseq-preprocess --trainpref/--validpref/--testpref)
SUBSETS = ("train", "valid", "test")
EPOCH_CHECKPOINT = re.compile(r"checkpoint(\d+)\.pt")
BLEU_LINE = re.compile(
    r"Generate (?P<subset>\S+) with beam=(?P<beam>\d+): BLEU4 = (?P<bleu>[\d.]+), "
    r"(?P<precisions>[\d./]+) \(BP=(?P<bp>[\d.]+), ratio=(?P<ratio>[\d.]+), "
    r"syslen=(?P<syslen>\d+), reflen=(?P<reflen>\d+)\)"
)


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = parser.add_argument
    paths = parser.add_argument_group("paths")
    paths.add_argument("--out", type=Path, default=None,
                       help="where the JSON result goes (required unless --build-venv-only)")  # fmt: skip
    paths.add_argument("--corpus", type=Path, default=None,
                       help=f"Multi30k task 1 raw files {{split}}.{{lang}}[.gz]; default: "
                       f"${CORPUS_ENV} or {DEFAULT_CORPUS}")  # fmt: skip
    paths.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="fairseq's own venv")
    paths.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                       help="data, checkpoints, logs and outputs of the run")  # fmt: skip
    paths.add_argument("--python", default=sys.executable,
                       help="interpreter the venv is made from (its base Python)")  # fmt: skip

    env = parser.add_argument_group("fairseq environment")
    env.add_argument("--torch-spec", default=TORCH_SPEC)
    env.add_argument("--torch-index-url", default=None,
                     help="e.g. https://download.pytorch.org/whl/cpu where pip's default "
                     "index would give a CUDA build")  # fmt: skip
    env.add_argument("--allow-cuda-torch", action="store_true",
                     help="accept a torch build that pulls CUDA libraries")  # fmt: skip
    env.add_argument("--fairseq-spec", default=FAIRSEQ_SPEC)
    env.add_argument("--system-site-packages", action="store_true",
                     help="make the venv with `python -m venv --system-site-packages`: a torch "
                     "already there that satisfies --torch-spec is used, nothing installed")  # fmt: skip

    data = parser.add_argument_group("data (Multi30k task 1, scripts/task1-*.sh)")
    data.add_argument("--src", default="en")
    data.add_argument("--tgt", default="de")
    data.add_argument("--train-split", default="train")
    data.add_argument("--val-split", default="val")
    data.add_argument("--test-split", default="test_2016_flickr")
    data.add_argument("--bpe-merges", type=int, default=10000, help="joint BPE merge operations")
    data.add_argument("--vocabulary-threshold", type=int, default=None,
                      help="apply-bpe --vocabulary-threshold (task1-bpe.sh sets none)")  # fmt: skip
    data.add_argument("--max-train-pairs", type=int, default=None, help="smoke runs only")
    data.add_argument("--max-eval-pairs", type=int, default=None, help="smoke runs only")

    model = parser.add_argument_group("model (Wu et al.'s Transformer-tiny, sizes explicit)")
    model.add_argument("--layers", type=int, default=4, help="encoder and decoder layers each")
    model.add_argument("--embed-dim", type=int, default=128, help="d_model")
    model.add_argument("--ffn-dim", type=int, default=256)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--dropout", type=float, default=0.3)
    model.add_argument("--attention-dropout", type=float, default=0.0)
    model.add_argument("--activation-dropout", type=float, default=0.0)

    optim = parser.add_argument_group("training")
    optim.add_argument("--lr", type=float, default=0.005)
    optim.add_argument("--adam-betas", default="(0.9, 0.98)")
    optim.add_argument("--adam-eps", type=float, default=1e-8)
    optim.add_argument("--clip-norm", type=float, default=25.0,
                       help="their fairseq fork's default (0.12's is 0: no clipping)")  # fmt: skip
    optim.add_argument("--warmup-updates", type=int, default=2000)
    optim.add_argument("--warmup-init-lr", type=float, default=1e-7)
    optim.add_argument("--label-smoothing", type=float, default=0.1)
    optim.add_argument("--max-tokens", type=int, default=4096, help="per batch, per side")
    optim.add_argument("--update-freq", type=int, default=2,
                       help="batches per update: their 2 GPUs on one device")  # fmt: skip
    optim.add_argument("--max-update", type=int, default=8000)
    optim.add_argument("--max-epoch", type=int, default=0, help="0: no limit")
    optim.add_argument("--patience", type=int, default=10, help="epochs without a better val loss")
    optim.add_argument("--save-interval", type=int, default=1, help="epochs per checkpoint")
    optim.add_argument("--keep-last-epochs", type=int, default=None,
                       help="epoch checkpoints kept on disk (default: --average-last)")  # fmt: skip
    optim.add_argument("--seed", type=int, default=1)

    evaluation = parser.add_argument_group("evaluation (evaluate.sh)")
    evaluation.add_argument("--average-last", type=int, default=10, help="epoch checkpoints")
    evaluation.add_argument("--beam", type=int, default=5)
    evaluation.add_argument("--lenpen", type=float, default=1.0)
    evaluation.add_argument("--gen-batch-size", type=int, default=128)
    evaluation.add_argument("--gen-batch-multiple", type=int, default=1,
                            help="fairseq-generate --required-batch-size-multiple: fairseq "
                            "0.12 drops a last batch that is not a multiple of it (its issue "
                            "#5036; 8, its default, loses 6 of the 1014 val sentences)")  # fmt: skip

    run = parser.add_argument_group("run")
    run.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                     help="where fairseq trains and generates (cuda: no --cpu, GPUs visible)")  # fmt: skip
    run.add_argument("--threads", type=int, default=1, help="OpenMP/MKL threads of fairseq")
    run.add_argument("--num-workers", type=int, default=0, help="fairseq data-loading processes")
    run.add_argument("--log-interval", type=int, default=50, help="updates between train logs")
    add("--dry-run", action="store_true", help="print the commands, run nothing")
    add("--build-venv-only", action="store_true",
        help="build (or reuse) the fairseq venv, print its record and stop: what "
        "benchmarks.train_throughput's fairseq system needs")  # fmt: skip
    return parser


def default_corpus() -> Path:
    return Path(os.environ.get(CORPUS_ENV) or DEFAULT_CORPUS)


def corpus_dir(args: argparse.Namespace) -> Path:
    return Path(args.corpus) if args.corpus else default_corpus()


def keep_last_epochs(args: argparse.Namespace) -> int:
    return args.average_last if args.keep_last_epochs is None else args.keep_last_epochs


def is_smoke(args: argparse.Namespace) -> bool:
    return args.max_train_pairs is not None or args.max_eval_pairs is not None


# ---------------------------------------------------------------- the work dir


class Layout:
    """Where each stage's files go under `--work-dir`."""

    def __init__(self, work_dir: Path):
        self.root = Path(work_dir)
        self.tok = self.root / "tok"  # {subset}.{lang}: lowercased, normalised, tokenized
        self.bpe = self.root / "bpe"  # codes, vocab.{lang}, {subset}.{lang}
        self.data_bin = self.root / "data-bin"
        self.checkpoints = self.root / "checkpoints"
        self.generate = self.root / "generate"
        self.logs = self.root / "logs"

    def tok_file(self, subset: str, lang: str) -> Path:
        return self.tok / f"{subset}.{lang}"

    def bpe_file(self, subset: str, lang: str) -> Path:
        return self.bpe / f"{subset}.{lang}"

    @property
    def codes(self) -> Path:
        return self.bpe / "codes"

    def vocab(self, lang: str) -> Path:
        return self.bpe / f"vocab.{lang}"

    def averaged(self, count: int) -> Path:
        return self.checkpoints / f"checkpoint_last{count}_avg.pt"


def split_of(args: argparse.Namespace, subset: str) -> str:
    """Our split name of a fairseq subset."""
    return {"train": args.train_split, "valid": args.val_split, "test": args.test_split}[subset]


def venv_bin(args: argparse.Namespace, tool: str) -> str:
    return str(Path(args.venv) / "bin" / tool)


# ---------------------------------------------------------------- 1. the fairseq venv


def venv_spec(args: argparse.Namespace) -> dict:
    """What a built venv must have been built with to be reused (`system_site_packages` only
    where set, so the records of venvs built without it still match)."""
    spec = {
        "torch": args.torch_spec,
        "torch_index_url": args.torch_index_url,
        "fairseq": args.fairseq_spec,
        "dependencies": list(DEPENDENCIES),
    }
    if args.system_site_packages:
        spec["system_site_packages"] = True
    return spec


def pip(args: argparse.Namespace, *arguments: str) -> list[str]:
    return [venv_bin(args, "python"), "-m", "pip", "install", *arguments]


def torch_install_args(args: argparse.Namespace) -> list[str]:
    index = ["--index-url", args.torch_index_url] if args.torch_index_url else []
    return [args.torch_spec, *index]


VENV_STEPS = ("venv", "torch_dry_run", "torch", "dependencies", "fairseq")
SITE_PACKAGES_STEP = "site_packages"  # after "venv", with --system-site-packages only
SITE_PACKAGES_PTH = "fairseq-peer-python.pth"

# Run by the new venv's python with `--python` as its argument: a venv made with
# --system-site-packages from a venv's interpreter sees the *base* interpreter's packages, not
# that venv's; a .pth file adds `--python`'s site-packages directories the new venv does not
# already see (site.addsitedir: their own .pth files count too). None missing (a plain system
# Python), nothing written.
LINK_SITE_PACKAGES = (
    "import json, os, site, subprocess, sys, sysconfig;"
    "dirs = json.loads(subprocess.run([sys.argv[1], '-c', 'import json, site;"
    " print(json.dumps(site.getsitepackages()))'], capture_output=True, text=True,"
    " check=True).stdout);"
    "seen = {os.path.realpath(p) for p in sys.path};"
    "missing = [d for d in dirs if os.path.isdir(d) and os.path.realpath(d) not in seen];"
    "pth = os.path.join(sysconfig.get_path('purelib'), sys.argv[2]);"
    "missing and open(pth, 'w').write(''.join("
    "f'import site; site.addsitedir({d!r})\\n' for d in missing));"
    "print(f'{sys.argv[1]}: site-packages added in {pth}:' if missing else"
    " f'{sys.argv[1]}: its site-packages already seen', *missing)"
)


def venv_step_names(args: argparse.Namespace) -> tuple[str, ...]:
    """The names of `venv_commands`, in their order."""
    if not args.system_site_packages:
        return VENV_STEPS
    return (VENV_STEPS[0], SITE_PACKAGES_STEP, *VENV_STEPS[1:])


def venv_commands(args: argparse.Namespace, torch_report: Path) -> list[list[str]]:
    """The build, in order: venv, torch (a dry run first, checked by `check_torch_report`),
    fairseq's dependencies (torch pinned again so nothing replaces it), fairseq itself. With
    `--system-site-packages` the venv sees the base Python's packages and, a step of its own
    before torch's dry run, those of `--python` (when a venv itself, e.g. a GPU machine's
    torch venv); pip installs none that already satisfies its requirement."""
    system = ["--system-site-packages"] if args.system_site_packages else []
    link = [[venv_bin(args, "python"), "-c", LINK_SITE_PACKAGES, args.python, SITE_PACKAGES_PTH]]
    return [
        [args.python, "-m", "venv", *system, str(args.venv)],
        *(link if args.system_site_packages else []),
        pip(
            args, "--dry-run", "--no-deps", "--report", str(torch_report), *torch_install_args(args)
        ),
        pip(args, *torch_install_args(args)),
        pip(args, *DEPENDENCIES, args.torch_spec),
        pip(args, "--no-deps", "--no-build-isolation", args.fairseq_spec),
    ]


def check_torch_report(report: dict, allow_cuda: bool) -> str | None:
    """The torch version pip would install; a CUDA build is refused unless `allow_cuda`. None
    where pip would install nothing: a torch already present (`--system-site-packages`)
    satisfies the spec, is used as it is, and its version is recorded by the venv's probe."""
    items = [i for i in report["install"] if i["metadata"]["name"].lower() == "torch"]
    if not items:
        return None
    (item,) = items
    version = item["metadata"]["version"]
    requires = item["metadata"].get("requires_dist") or []
    cuda = any(r.lower().startswith("nvidia-") for r in requires) or "+cu" in version
    if cuda and not allow_cuda:
        raise SystemExit(
            f"pip would install torch {version}, a CUDA build ({item['download_info']['url']}); "
            "fairseq runs on the CPU here: pass --torch-index-url "
            "https://download.pytorch.org/whl/cpu (or --torch-spec of a +cpu build), or "
            "--allow-cuda-torch to accept it"
        )
    return version


VERSIONS_PROBE = (
    "import json, fairseq, torch, numpy, sacremoses, sacrebleu; from importlib import metadata;"
    "print(json.dumps({'fairseq': fairseq.__version__, 'torch': torch.__version__,"
    " 'torch_cuda': torch.version.cuda, 'numpy': numpy.__version__,"
    " 'sacremoses': metadata.version('sacremoses'), 'sacrebleu': sacrebleu.__version__,"
    " 'subword_nmt': metadata.version('subword-nmt'), 'python': __import__('sys').version}))"
)


def built_venv(venv: Path) -> dict | None:
    """The build record of a finished venv at `venv`, None where none was finished."""
    marker = Path(venv) / VENV_MARKER
    return json.loads(marker.read_text()) if marker.exists() else None


def ensure_venv(args: argparse.Namespace, env: dict) -> dict:
    """Build the venv (or reuse one built with the same specs); returns its build record."""
    venv, marker = Path(args.venv), Path(args.venv) / VENV_MARKER
    if venv.resolve().is_relative_to(REPO_ROOT):
        raise SystemExit(f"--venv {venv} is inside the repository; fairseq's venv lives outside")
    if (record := built_venv(venv)) is not None:
        if record.get("spec") == venv_spec(args):
            print(f"fairseq venv: reusing {venv} (built in {record['build_s']:.0f} s)",
                  file=sys.stderr)  # fmt: skip
            return {**record, "reused": True}
        print(f"fairseq venv: {venv} was built with other specs; rebuilding", file=sys.stderr)
    if venv.exists() and any(venv.iterdir()):
        if not (marker.exists() or (venv / VENV_BUILDING).exists()):
            raise SystemExit(f"--venv {venv} exists and was not built by this harness; pick "
                             "another path (it is never overwritten)")  # fmt: skip
        shutil.rmtree(venv)  # an unfinished or outdated build of ours
    venv.mkdir(parents=True, exist_ok=True)
    (venv / VENV_BUILDING).touch()  # `python -m venv` keeps what a directory holds
    start = time.perf_counter()
    report_path = venv.parent / f".{venv.name}-torch-report.json"
    log = venv.parent / f"{venv.name}-build.log"
    steps = {}
    with open(log, "w") as log_file:
        names = venv_step_names(args)
        for name, command in zip(names, venv_commands(args, report_path), strict=True):
            step_start = time.perf_counter()
            run_command(command, env, log_file)
            steps[name] = time.perf_counter() - step_start
            if name == "torch_dry_run":  # refuse a CUDA torch before downloading it
                check_torch_report(json.loads(report_path.read_text()), args.allow_cuda_torch)
                report_path.unlink()
    build_s = time.perf_counter() - start
    versions = json.loads(venv_output(args, env, "-c", VERSIONS_PROBE))
    freeze = venv_output(args, env, "-m", "pip", "freeze")
    (venv / "freeze.txt").write_text(freeze)
    record = {"spec": venv_spec(args), "build_s": build_s, "steps_s": steps,
              "versions": versions, "log": str(log)}  # fmt: skip
    marker.write_text(json.dumps(record, indent=2) + "\n")
    (venv / VENV_BUILDING).unlink()
    print(f"fairseq venv: built {venv} in {build_s:.0f} s", file=sys.stderr)
    return {**record, "reused": False}


def venv_output(args: argparse.Namespace, env: dict, *arguments: str) -> str:
    """The stdout of the venv's python run with `arguments`."""
    return subprocess.run([venv_bin(args, "python"), *arguments], env=env, capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


# ---------------------------------------------------------------- running tools


def tool_env(args: argparse.Namespace) -> dict:
    """The environment of every fairseq-venv process: its bin first, none of ours, the thread
    count, and torch.load's pre-2.6 default (fairseq 0.12 unpickles its own checkpoints)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}  # fmt: skip
    threads = str(args.threads)
    env.update(
        PATH=f"{Path(args.venv) / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS=threads,
        MKL_NUM_THREADS=threads,
        MAX_JOBS=threads,  # torch's C++ extension builds (fairseq's libnat, libbase)
        TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1",
        PYTHONUNBUFFERED="1",
    )
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # cuda: left as inherited
    return env


def run_command(
    command: Sequence[str],
    env: dict,
    log_file,
    *,
    stdin: Path | None = None,
    stdout: Path | None = None,
    echo: bool = False,
    cwd: Path | None = None,
) -> list[str]:
    """Run `command`; its output goes to `stdout` (a file) or is returned as lines, and is
    copied to `log_file` (and stderr with `echo`). A failure exits naming the log."""
    log_file.write(f"$ {shlex.join(command)}\n")
    log_file.flush()
    lines: list[str] = []
    with (
        open(stdin, "rb") if stdin else open(os.devnull, "rb") as source,
        open(stdout, "w") if stdout else open(os.devnull, "w") as sink,
    ):
        process = subprocess.Popen(
            list(command), stdin=source, stdout=subprocess.PIPE if stdout is None else sink,
            stderr=subprocess.STDOUT if stdout is None else log_file, env=env, text=True,
            cwd=cwd,
        )  # fmt: skip
        if stdout is None:
            for line in process.stdout:
                lines.append(line.rstrip("\n"))
                log_file.write(line)
                if echo:
                    sys.stderr.write(line)
        code = process.wait()
    log_file.flush()
    if code != 0:
        tail = "\n".join(lines[-20:])
        raise SystemExit(f"{shlex.join(command)} failed (exit {code}); log: "
                         f"{getattr(log_file, 'name', '?')}\n{tail}")  # fmt: skip
    return lines


def children_cpu_s() -> float:
    """User + system CPU seconds of the finished child processes so far: on a shared machine
    tokens per CPU second tell the speed of the code, tokens per wall second the share it got."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stage_done(directory: Path, settings: dict) -> bool:
    marker = directory / DONE
    return marker.exists() and json.loads(marker.read_text()) == settings


def mark_done(directory: Path, settings: dict) -> None:
    (directory / DONE).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def fresh_dir(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)


# ---------------------------------------------------------------- 2. prepare


def raw_file(corpus: Path, split: str, lang: str) -> Path:
    gz = corpus / f"{split}.{lang}.gz"
    return gz if gz.exists() or not (corpus / f"{split}.{lang}").exists() else gz.with_suffix("")


def read_raw(corpus: Path, split: str, lang: str, limit: int | None = None) -> list[str]:
    from pipeline.data.corpus import read_lines

    lines = read_lines(raw_file(corpus, split, lang))
    return lines[:limit] if limit is not None else lines


def data_settings(args: argparse.Namespace) -> dict:
    import sacremoses

    corpus = corpus_dir(args).resolve()
    return {
        "corpus": str(corpus),
        "files": {
            f"{split_of(args, s)}.{lang}": _file_digest(raw_file(corpus, split_of(args, s), lang))
            for s in SUBSETS
            for lang in (args.src, args.tgt)
        },
        "max_train_pairs": args.max_train_pairs,
        "max_eval_pairs": args.max_eval_pairs,
        "sacremoses": sacremoses.__version__,
    }


def _file_digest(path: Path) -> str:
    if not path.exists():
        raise SystemExit(f"{path}: not found; point --corpus (or ${CORPUS_ENV}) at Multi30k task 1")
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def prepare(args: argparse.Namespace, layout: Layout, settings: dict) -> dict:
    """Write tok/{subset}.{lang}: task1-tokenize.sh's text, as our pipeline's
    `data.tokenizer.pretokenizer: moses` makes it; returns the sentence count per subset."""
    from pipeline.data.moses import moses_tokenize

    corpus = corpus_dir(args)
    counts = {}
    fresh_dir(layout.tok)
    for subset in SUBSETS:
        limit = args.max_train_pairs if subset == "train" else args.max_eval_pairs
        split, sides = split_of(args, subset), {}
        for lang in (args.src, args.tgt):
            sides[lang] = moses_tokenize(read_raw(corpus, split, lang, limit), lang)
            layout.tok_file(subset, lang).write_text("\n".join(sides[lang]) + "\n")
        if len(sides[args.src]) != len(sides[args.tgt]):
            raise SystemExit(f"{split}: {args.src} and {args.tgt} differ in length")
        counts[subset] = len(sides[args.src])
    mark_done(layout.tok, settings)
    return counts


# ---------------------------------------------------------------- 3. BPE


def bpe_commands(args: argparse.Namespace, layout: Layout) -> list[tuple[list[str], Path, Path]]:
    """(command, stdin, stdout) of task1-bpe.sh: joint learning on both train sides, then
    apply-bpe to every file with its language's vocabulary. stdin/stdout None: none."""
    learn = [
        venv_bin(args, "subword-nmt"), "learn-joint-bpe-and-vocab",
        "--input", str(layout.tok_file("train", args.src)), str(layout.tok_file("train", args.tgt)),
        "-s", str(args.bpe_merges), "-o", str(layout.codes),
        "--write-vocabulary", str(layout.vocab(args.src)), str(layout.vocab(args.tgt)),
    ]  # fmt: skip
    commands = [(learn, None, None)]
    threshold = ([] if args.vocabulary_threshold is None
                 else ["--vocabulary-threshold", str(args.vocabulary_threshold)])  # fmt: skip
    for subset in SUBSETS:
        for lang in (args.src, args.tgt):
            apply = [venv_bin(args, "subword-nmt"), "apply-bpe", "-c", str(layout.codes),
                     "--vocabulary", str(layout.vocab(lang)), *threshold]  # fmt: skip
            commands.append((apply, layout.tok_file(subset, lang), layout.bpe_file(subset, lang)))
    return commands


# ---------------------------------------------------------------- 4.-7. fairseq


def preprocess_command(args: argparse.Namespace, layout: Layout) -> list[str]:
    return [
        venv_bin(args, "fairseq-preprocess"),
        "--source-lang", args.src, "--target-lang", args.tgt,
        "--trainpref", str(layout.bpe / "train"),
        "--validpref", str(layout.bpe / "valid"),
        "--testpref", str(layout.bpe / "test"),
        "--destdir", str(layout.data_bin),
        "--joined-dictionary", "--workers", "1",
    ]  # fmt: skip


def model_flags(args: argparse.Namespace) -> list[str]:
    """fairseq's `--arch transformer` with every size explicit (`args`: layers, embed_dim,
    ffn_dim, heads, dropout, attention_dropout, activation_dropout) and one embedding matrix
    for source, target and output; post-norm and sinusoidal positions are its defaults."""
    options = {"--arch": "transformer"}
    for side in ("encoder", "decoder"):
        options.update({
            f"--{side}-layers": args.layers,
            f"--{side}-embed-dim": args.embed_dim,
            f"--{side}-ffn-embed-dim": args.ffn_dim,
            f"--{side}-attention-heads": args.heads,
        })  # fmt: skip
    options.update({
        "--activation-fn": "relu", "--dropout": args.dropout,
        "--attention-dropout": args.attention_dropout,
        "--activation-dropout": args.activation_dropout,
    })  # fmt: skip
    return ["--share-all-embeddings", *flag_list(options)]


def flag_list(options: dict) -> list[str]:
    """{--flag: value} as command-line words."""
    return [word for flag, value in options.items() for word in (flag, str(value))]


def train_command(args: argparse.Namespace, layout: Layout) -> list[str]:
    """fairseq-train with Wu et al.'s recipe, every size explicit (README-baseline.md)."""
    options = {
        "--task": "translation", "--source-lang": args.src, "--target-lang": args.tgt,
        "--optimizer": "adam", "--adam-betas": args.adam_betas, "--adam-eps": args.adam_eps,
        "--weight-decay": 0.0, "--clip-norm": args.clip_norm,
        "--lr": args.lr, "--lr-scheduler": "inverse_sqrt",
        "--warmup-updates": args.warmup_updates, "--warmup-init-lr": args.warmup_init_lr,
        "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": args.label_smoothing,
        "--max-tokens": args.max_tokens, "--update-freq": args.update_freq,
        "--max-update": args.max_update, "--patience": args.patience,
        "--save-dir": layout.checkpoints, "--save-interval": args.save_interval,
        "--keep-last-epochs": keep_last_epochs(args), "--seed": args.seed,
        "--num-workers": args.num_workers,
        "--log-format": "json", "--log-interval": args.log_interval,
    }  # fmt: skip
    if args.max_epoch:
        options["--max-epoch"] = args.max_epoch
    command = [venv_bin(args, "fairseq-train"), str(layout.data_bin), *model_flags(args)]
    return [*command, *flag_list(options), *device_flags(args)]


def device_flags(args: argparse.Namespace) -> list[str]:
    """fairseq's `--cpu` for `--device cpu`; nothing for cuda (fairseq's default device)."""
    return ["--cpu"] if args.device == "cpu" else []


def average_command(args: argparse.Namespace, layout: Layout) -> list[str]:
    return [
        venv_bin(args, "python"), "-m", "benchmarks.fairseq.train_peer", "average",
        "--inputs", str(layout.checkpoints), "--num-epoch-checkpoints", str(args.average_last),
        "--output", str(layout.averaged(args.average_last)),
    ]  # fmt: skip


def generate_command(args: argparse.Namespace, layout: Layout, subset: str) -> list[str]:
    return [
        venv_bin(args, "fairseq-generate"), str(layout.data_bin),
        "--task", "translation", "--source-lang", args.src, "--target-lang", args.tgt,
        "--path", str(layout.averaged(args.average_last)), "--gen-subset", subset,
        "--beam", str(args.beam), "--lenpen", str(args.lenpen),
        "--batch-size", str(args.gen_batch_size),
        "--required-batch-size-multiple", str(args.gen_batch_multiple), "--remove-bpe",
        "--num-workers", str(args.num_workers), *device_flags(args),
    ]  # fmt: skip


def last_epoch_checkpoints(directory: Path, count: int) -> list[Path]:
    """The `count` highest-numbered checkpoint{epoch}.pt, newest first (fairseq's
    average_checkpoints.py --num-epoch-checkpoints)."""
    found = sorted(
        ((int(m.group(1)), name) for name in os.listdir(directory)
         if (m := EPOCH_CHECKPOINT.fullmatch(name))),
        reverse=True,
    )  # fmt: skip
    if len(found) < count:
        raise SystemExit(
            f"{directory}: {len(found)} epoch checkpoints, but --average-last {count} needs "
            f"{count}; train more epochs or average fewer"
        )
    return [Path(directory) / name for _, name in found[:count]]


def fairseq_checkpoint_globals() -> list:
    """What fairseq 0.12's checkpoints pickle beyond tensors and plain containers, allowed
    when `average` loads them weights-only: the legacy `args` (argparse.Namespace) and numpy
    arrays, scalars and dtypes in its training state. None of these runs code when built."""
    import numpy as np

    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtypes = {type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFD"}
    return [argparse.Namespace, multiarray._reconstruct, multiarray.scalar, np.ndarray,
            np.dtype, *dtypes]  # fmt: skip


def load_fairseq_checkpoint(path: Path) -> dict:
    """torch.load, weights-only with `fairseq_checkpoint_globals`: a file that would build
    anything else (and so might run code) is refused, naming it and what it holds."""
    import pickle

    import torch

    with torch.serialization.safe_globals(fairseq_checkpoint_globals()):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            raise SystemExit(
                f"{path}: refused: loading it would build {', '.join(unsafe) or 'objects'}, "
                "which can run code; fairseq checkpoints hold only tensors, plain containers, "
                "argparse.Namespace and numpy values"
            ) from None


def average_checkpoints(paths: Sequence[Path]) -> dict:
    """The element-wise mean of the checkpoints' model parameters, in the first one's state
    (fairseq's scripts/average_checkpoints.py: fp16 read as fp32, integers floor-divided)."""
    import torch

    sums: dict = collections.OrderedDict()
    keys, state = None, None
    for path in paths:
        loaded = load_fairseq_checkpoint(path)
        if state is None:  # the other entries (cfg, optimizer state...) of the first one
            state = loaded
        params = loaded["model"]
        if keys is None:
            keys = list(params)
        elif list(params) != keys:
            raise KeyError(f"{path}: parameters {list(params)} differ from {keys}")
        for key in keys:
            value = params[key].float() if params[key].dtype == torch.float16 else params[key]
            sums[key] = value.clone() if key not in sums else sums[key] + value
    state["model"] = collections.OrderedDict(
        (key, total / len(paths) if total.is_floating_point() else total // len(paths))
        for key, total in sums.items()
    )
    return state


def average_main(argv: Sequence[str]) -> None:
    """`python -m benchmarks.fairseq.train_peer average --inputs DIR --num-epoch-checkpoints N
    --output FILE` (inside the fairseq venv): the flags of fairseq's script."""
    import torch

    parser = argparse.ArgumentParser(prog="fairseq_peer average")
    parser.add_argument("--inputs", type=Path, required=True)
    parser.add_argument("--num-epoch-checkpoints", type=int, required=True)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    paths = last_epoch_checkpoints(args.inputs, args.num_epoch_checkpoints)
    state = average_checkpoints(paths)
    partial = args.output.with_name(args.output.name + ".part")
    torch.save(state, partial)
    partial.replace(args.output)
    print(json.dumps({"averaged": [p.name for p in paths], "output": str(args.output)}))


# ---------------------------------------------------------------- reading fairseq's output


def parse_train_log(lines: Iterable[str]) -> dict:
    """Per-epoch train/valid statistics from `fairseq-train --log-format json`: updates,
    target tokens (each epoch's mean target tokens per update, `wpb`, times its updates),
    the seconds fairseq spent in training steps (`train_wall`, reset every epoch: summed here;
    validation and checkpointing excluded), its cumulative wall clock (`wall`), val losses,
    and whether --patience stopped it."""
    epochs: dict[int, dict] = {}
    stopped_early = False
    for line in lines:
        if "early stop since valid performance hasn't improved" in line:
            stopped_early = True
        for tag in ("train", "valid"):
            marker = f"| {tag} | {{"
            if marker in line:
                stats = json.loads(line[line.index(marker) + len(marker) - 1 :])
                epochs.setdefault(int(stats["epoch"]), {})[tag] = stats
    updates, tokens, rows = 0, 0.0, []
    for epoch in sorted(epochs):
        train, valid = epochs[epoch].get("train"), epochs[epoch].get("valid")
        row = {"epoch": epoch}
        if train:
            done = int(float(train["train_num_updates"]))
            row.update(
                updates=done,
                target_tokens=float(train["train_wpb"]) * (done - updates),
                train_wall_s=float(train["train_train_wall"]),
                wall_s=float(train["train_wall"]),
                train_loss=float(train["train_loss"]),
            )
            tokens += row["target_tokens"]
            updates = done
        if valid:
            row["val_loss"] = float(valid["valid_loss"])
        rows.append(row)
    trained = [r for r in rows if "updates" in r]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return {
        "epochs": len(trained),
        "updates": updates,
        "target_tokens": round(tokens),
        "train_wall_s": sum(r["train_wall_s"] for r in trained),
        "fairseq_wall_s": trained[-1]["wall_s"] if trained else 0.0,
        "best_val_loss": min(val) if val else None,
        "stopped_early": stopped_early,
        "per_epoch": rows,
    }


def parse_generate(lines: Sequence[str], expected: int) -> tuple[list[str], dict | None]:
    """fairseq-generate's detokenized hypotheses (D-lines) in source order, one for each of
    the `expected` sentences, and its BLEU4 summary line as numbers (None when it printed
    none)."""
    hypotheses: dict[int, str] = {}
    bleu = None
    for line in lines:
        if line.startswith("D-"):
            head, _score, *text = line.split("\t")
            hypotheses[int(head[2:])] = text[0] if text else ""
        elif (match := BLEU_LINE.search(line)) is not None:
            bleu = {
                "bleu4": float(match["bleu"]),
                "precisions": [float(p) for p in match["precisions"].split("/")],
                "bp": float(match["bp"]),
                "ratio": float(match["ratio"]),
                "syslen": int(match["syslen"]),
                "reflen": int(match["reflen"]),
                "line": match.group(0),
            }
    missing = sorted(set(range(expected)) - set(hypotheses))
    if missing or len(hypotheses) != expected:
        raise SystemExit(
            f"fairseq-generate translated {len(hypotheses)} of {expected} sentences (missing "
            f"ids {missing[:10]}...); a dropped last batch: see --gen-batch-multiple"
        )
    return [hypotheses[i] for i in range(len(hypotheses))], bleu


def raw_references(corpus: Path, split: str, lang: str, limit: int | None = None) -> list[str]:
    """The raw references of `split`, normalised as `prepare` does: what both systems'
    translations are scored against."""
    from pipeline.data.corpus import normalize

    return [normalize(line) for line in read_raw(corpus, split, lang, limit)]


def score_split(args: argparse.Namespace, subset: str, detokenized: list[str]) -> dict:
    """This project's scores of fairseq's detokenized output against the raw references."""
    from pipeline.evaluation.scoring import score

    references = raw_references(corpus_dir(args), split_of(args, subset), args.tgt,
                                args.max_eval_pairs)  # fmt: skip
    return score(detokenized, references, lang=args.tgt)


def hypotheses_path(out: Path, split: str, search: str | None = None) -> Path:
    """Where the detokenized translations of `split` go beside the result `out` (what a paired
    bootstrap against another system reads: `benchmarks.fairseq.parity`); `search` names one of
    several searches of one checkpoint (`benchmarks.fairseq.decode_checkpoint`)."""
    searched = f".{search}" if search is not None else ""
    return out.with_name(f"{out.stem}.{split}{searched}.hyp")


# ---------------------------------------------------------------- the run


def recipe(args: argparse.Namespace) -> dict:
    """The settings that define the result (sizes, optimisation, data, decoding)."""
    keys = (
        "src", "tgt", "bpe_merges", "vocabulary_threshold", "max_train_pairs", "max_eval_pairs",
        "layers", "embed_dim", "ffn_dim", "heads", "dropout", "attention_dropout",
        "activation_dropout", "lr", "adam_betas", "adam_eps", "clip_norm", "warmup_updates",
        "warmup_init_lr", "label_smoothing", "max_tokens", "update_freq", "max_update",
        "max_epoch", "patience", "save_interval", "seed", "average_last", "beam", "lenpen",
    )  # fmt: skip
    return {key: getattr(args, key) for key in keys} | {"precision": "fp32", "device": args.device}


def bpe_lines(args: argparse.Namespace, layout: Layout) -> list[str]:
    """`bpe_commands` as shell lines, with their redirections."""
    return [
        shlex.join(c) + (f" < {i} > {o}" if i else "") for c, i, o in bpe_commands(args, layout)
    ]


def dry_run(args: argparse.Namespace, layout: Layout) -> dict:
    commands = [shlex.join(c) for c in venv_commands(args, Path("torch-report.json"))]
    commands += bpe_lines(args, layout)
    commands += [shlex.join(c) for c in (
        preprocess_command(args, layout), train_command(args, layout),
        average_command(args, layout), generate_command(args, layout, "valid"),
        generate_command(args, layout, "test"))]  # fmt: skip
    for command in commands:
        print(command)
    return {"commands": commands}


def run(args: argparse.Namespace) -> dict:
    from pipeline import environment
    from pipeline.data.moses import moses_detokenize

    layout = Layout(args.work_dir)
    if args.dry_run:
        return dry_run(args, layout)
    if layout.root.resolve().is_relative_to(REPO_ROOT):
        raise SystemExit(f"--work-dir {layout.root} is inside the repository; pick one outside")
    start = time.perf_counter()
    made_on = environment.provenance()  # the commit this run starts from, not the one it ends at
    env = tool_env(args)
    wall: dict[str, float] = {}
    venv = ensure_venv(args, env)
    wall["venv_build"] = venv["build_s"] if not venv["reused"] else 0.0
    gpu = venv_gpu(args, env) if args.device == "cuda" else None
    layout.logs.mkdir(parents=True, exist_ok=True)
    commands: list[str] = []

    settings = data_settings(args)
    reused = []  # stages whose outputs an earlier run with the same settings left
    step = time.perf_counter()
    if stage_done(layout.tok, settings):
        reused.append("prepare")
    else:
        print("prepare: lowercase, Moses normalise + tokenize", file=sys.stderr)
        prepare(args, layout, settings)
    wall["prepare"] = time.perf_counter() - step

    bpe_settings = {**settings, "bpe_merges": args.bpe_merges,
                    "vocabulary_threshold": args.vocabulary_threshold, "venv": venv["versions"]}  # fmt: skip
    step = time.perf_counter()
    with open(layout.logs / "bpe.log", "a") as log:
        if stage_done(layout.bpe, bpe_settings):
            reused.append("bpe")
        else:
            print(f"bpe: {args.bpe_merges} joint merges", file=sys.stderr)
            fresh_dir(layout.bpe)
            for command, stdin, stdout in bpe_commands(args, layout):
                run_command(command, env, log, stdin=stdin, stdout=stdout)
            mark_done(layout.bpe, bpe_settings)
    commands += bpe_lines(args, layout)
    wall["bpe"] = time.perf_counter() - step

    step = time.perf_counter()
    command = preprocess_command(args, layout)
    with open(layout.logs / "preprocess.log", "a") as log:
        if stage_done(layout.data_bin, bpe_settings):
            reused.append("binarize")
        else:
            fresh_dir(layout.data_bin)
            run_command(command, env, log)
            mark_done(layout.data_bin, bpe_settings)
    commands.append(shlex.join(command))
    wall["binarize"] = time.perf_counter() - step
    dictionary = (layout.data_bin / f"dict.{args.tgt}.txt").read_text().splitlines()

    training, resumed = train(args, layout, env, bpe_settings)
    commands.append(shlex.join(train_command(args, layout)))
    wall["train"] = training.pop("process_wall_s")

    step = time.perf_counter()
    command = average_command(args, layout)
    with open(layout.logs / "average.log", "a") as log:
        averaged = json.loads(run_command(command, env, log, cwd=REPO_ROOT)[-1])
    commands.append(shlex.join(command))
    wall["average"] = time.perf_counter() - step

    scores = {}
    for subset in ("valid", "test"):
        step = time.perf_counter()
        command = generate_command(args, layout, subset)
        with open(layout.logs / f"generate-{subset}.log", "w") as log:
            lines = run_command(command, env, log)
        commands.append(shlex.join(command))
        expected = len(layout.bpe_file(subset, args.tgt).read_text().splitlines())
        hypotheses, fairseq_bleu = parse_generate(lines, expected)
        layout.generate.mkdir(exist_ok=True)
        (layout.generate / f"{subset}.hyp.tok").write_text("\n".join(hypotheses) + "\n")
        detokenized = moses_detokenize(hypotheses, args.tgt)
        split = split_of(args, subset)
        (layout.generate / f"{split}.hyp").write_text("\n".join(detokenized) + "\n")
        wall[f"generate_{subset}"] = time.perf_counter() - step
        scores[split] = {"fairseq_bleu4": fairseq_bleu, **score_split(args, subset, detokenized)}
    wall["total"] = time.perf_counter() - start

    tokens, cpu_s = training["target_tokens"], training.get("process_cpu_s")
    payload = {
        "benchmark": "fairseq_peer",
        "system": f"fairseq {venv['versions']['fairseq']} (fairseq-fixed), Wu et al. 2021 recipe",
        "smoke": is_smoke(args),
        "recipe": recipe(args),
        "dictionary_types": len(dictionary),  # + 4 specials in the model's embedding
        "updates": training["updates"],
        "epochs": training["epochs"],
        "resumed": resumed,
        "stopped_early": training["stopped_early"],
        "target_tokens": tokens,
        "train_wall_s": training["train_wall_s"],
        "tokens_per_s": tokens / training["train_wall_s"] if training["train_wall_s"] else None,
        "tokens_per_s_wall": tokens / wall["train"] if wall["train"] and not resumed else None,
        # the fairseq-train process's CPU time, start-up and per-epoch validation included
        "train_cpu_s": cpu_s,
        "tokens_per_cpu_s": tokens / cpu_s if cpu_s and not resumed else None,
        "best_val_loss": training["best_val_loss"],
        "per_epoch": training["per_epoch"],
        "averaged_checkpoints": averaged["averaged"],
        "scores": scores,
        "wall_s": wall,
        "reused_stages": reused,
        "venv": {key: venv[key] for key in ("build_s", "steps_s", "versions", "reused")},
        "command": shlex.join([sys.executable, "-m", "benchmarks.fairseq.train_peer", *args.argv]),
        "commands": commands,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "work_dir": str(layout.root),
        **made_on,
    }
    if gpu is not None:  # the GPU fairseq ran on, as the venv's torch names it
        payload["hardware"] = f"{gpu['name']} x {gpu['count']}"
    return payload


GPU_PROBE = (
    "import json, torch; ok = torch.cuda.is_available();"
    "print(json.dumps({'available': ok, 'count': torch.cuda.device_count() if ok else 0,"
    " 'name': torch.cuda.get_device_name(0) if ok else None}))"
)


def venv_gpu(args: argparse.Namespace, env: dict) -> dict:
    """{available, count, name} of the GPUs the venv's torch sees; refuses `--device cuda`
    where it sees none."""
    gpu = json.loads(venv_output(args, env, "-c", GPU_PROBE).splitlines()[-1])
    if not gpu["available"]:
        raise SystemExit(f"--device cuda, but the torch of {args.venv} sees no GPU")
    return gpu


def train(args: argparse.Namespace, layout: Layout, env: dict, data: dict) -> tuple[dict, bool]:
    """fairseq-train, unless this command already finished here. An interrupted run of the
    same command resumes from checkpoint_last.pt (fairseq's own resume); a different command
    over existing checkpoints is refused. The statistics are read from the train log beside
    the checkpoints (every invocation appends to it), the process's wall and CPU seconds from
    summary.json (of the invocation that finished)."""
    command = train_command(args, layout)
    record = {"command": command, "data": data}
    started = layout.checkpoints / "command.json"
    summary = layout.checkpoints / "summary.json"
    train_log = layout.checkpoints / "train.log"
    if started.exists() and json.loads(started.read_text()) != record:
        raise SystemExit(
            f"{layout.checkpoints} holds checkpoints of another command or data; pass "
            "another --work-dir (or remove that one) to train this one"
        )
    if started.exists() and summary.exists():
        print(f"train: done before, {summary}", file=sys.stderr)
        process = json.loads(summary.read_text())
    else:
        process = {"resumed": (layout.checkpoints / "checkpoint_last.pt").exists()}
        layout.checkpoints.mkdir(parents=True, exist_ok=True)
        started.write_text(json.dumps(record, indent=2) + "\n")
        print(f"train: {shlex.join(command)}", file=sys.stderr)
        step, cpu = time.perf_counter(), children_cpu_s()
        with open(train_log, "a") as log:
            run_command(command, env, log, echo=True)
        process["process_wall_s"] = time.perf_counter() - step
        process["process_cpu_s"] = children_cpu_s() - cpu
        summary.write_text(json.dumps(process, indent=2) + "\n")
    result = parse_train_log(train_log.read_text().splitlines())
    result["process_wall_s"] = process.get("process_wall_s")
    result["process_cpu_s"] = process.get("process_cpu_s")
    return result, process["resumed"]


def print_summary(payload: dict) -> None:
    print(f"{payload['system']}: {payload['updates']} updates, {payload['epochs']} epochs, "
          f"{payload['target_tokens']:,} target tokens, {payload['tokens_per_s'] or 0:,.0f} "
          f"target tokens/s ({payload['threads']} thread(s), fp32), venv build "
          f"{payload['venv']['build_s']:.0f} s")  # fmt: skip
    for split, result in payload["scores"].items():
        fairseq_bleu = result["fairseq_bleu4"]["bleu4"] if result["fairseq_bleu4"] else None
        print(f"  {split}: fairseq BLEU4 {fairseq_bleu}, bleu_tok_lc {result['bleu_tok_lc']:.2f}, "
              f"bleu_lc {result['bleu_lc']:.2f}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["average"]:
        average_main(argv[1:])
        return None
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if args.build_venv_only:
        record = ensure_venv(args, tool_env(args))
        print(json.dumps(record, sort_keys=True), flush=True)
        return record
    if args.out is None and not args.dry_run:
        parser.error("--out is required (unless --build-venv-only or --dry-run)")
    payload = run(args)
    if not args.dry_run:
        from pipeline.atomic import write_text_atomic
        from pipeline.portable_paths import relativize

        args.out.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
        write_text_atomic(args.out, relativize(text, Path.cwd(), CACHE))
        generated = Layout(Path(payload["work_dir"])).generate
        for split in payload["scores"]:
            shutil.copyfile(generated / f"{split}.hyp", hypotheses_path(args.out, split))
        print_summary(payload)
        print(json.dumps(payload, sort_keys=True), flush=True)
    return payload


if __name__ == "__main__":
    main()
