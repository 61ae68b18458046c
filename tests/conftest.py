"""Shared fixtures: real configs composed from conf/, the real Multi30k corpus, tmp output dirs."""

from __future__ import annotations

import gzip
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import config as config_lib
from pipeline import config_schema

# One intra-op thread for the tests and every process they start: with torch's default of one
# thread per core, two processes on this 2-core machine (DDP ranks, sweep workers, pytest beside
# a stage) oversubscribe the cores and run 10-40x slower. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Every DVC command would otherwise start a daemon process to send a usage report (about a
# CPU-second each, with no network here to send it to).
os.environ.setdefault("DVC_NO_ANALYTICS", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
# Counts as the docs' prose writes them ("over four runs"), for tests that rebuild a sentence
NUMBER_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))

# ---- float tolerances ----------------------------------------------------------------------
# (the worst-case float32 rounding bounds are pipeline.rounding's, shared with the benchmarks)

# A resumed run against the same run trained straight through, on one machine: the resumed one
# repeats the same operations on the same batches with the same random state and kernels, so
# the two are equal to the bit, whatever the CPU (both runs are on the one machine; only a
# kernel that picks its reduction order by memory alignment could differ, in the last bits).
# 1e-6 admits last-bit noise at these weights' size (|w| < 1: a few float32 ulps); a resume that
# is not exact (a batch skipped or repeated, an optimizer state lost) moves weights by ~lr.
RESUMED_RUN_ATOL = 1e-6


def sample_std_tolerance(n: int, kurtosis: float = 3.0, standard_errors: float = 5.0) -> float:
    """A relative tolerance for the sample standard deviation of `n` independent draws: the
    standard error of a sample std is σ sqrt((kurtosis - 1) / (4 n)) (kurtosis 3 for a
    normal distribution, 1.8 for a uniform one); `standard_errors` of them."""
    return standard_errors * ((kurtosis - 1) / (4 * n)) ** 0.5


# The fixtures `build_once` builds for every worker of a run (tests that ask for them wait
# while one worker builds them), as `shared_build` registers them.
BUILT_ONCE: set[str] = set()


def shared_build(fixture):
    """Marks a fixture (under its `@pytest.fixture`) as one that `build_once` builds: the
    collection order then hands out the first test asking for it before the others."""
    BUILT_ONCE.add(fixture.__name__)
    return fixture


def pytest_collection_modifyitems(items):
    """The slow end-to-end tests first (their order otherwise kept): pytest-xdist hands tests
    out in this order, so the long ones run side by side at the start and the short ones fill
    in at the end, instead of one long test running alone while the other worker idles.
    Within each part, the first test to ask for a fixture built once comes before the others
    that ask for it: the other worker takes other tests while it is built, not the same
    fixture to wait on."""
    asked: set[str] = set()

    def waits(item) -> bool:
        shared = {name for name in getattr(item, "fixturenames", ()) if name in BUILT_ONCE}
        later = bool(shared) and shared <= asked
        asked.update(shared)
        return later

    order = {id(item): (item.get_closest_marker("slow") is None, waits(item)) for item in items}
    items.sort(key=lambda item: order[id(item)])


def machine_line(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """'machine: <CPU model>, N cores[, bf16 flags] (CPU family F, model M)': the CPU class a
    run of the suite had (its time and its bf16 rounding depend on it)."""
    from pipeline import environment

    fields = environment.cpuinfo(cpuinfo)
    ids = ", ".join(f"{name} {fields[key]}" for key, name in
                    (("cpu family", "CPU family"), ("model", "model")) if key in fields)  # fmt: skip
    return f"machine: {environment.hardware()}" + (f" ({ids})" if ids else "")


def pytest_terminal_summary(terminalreporter):
    """The machine, on the last lines of the output, which is what a CI log keeps."""
    terminalreporter.write_line(machine_line())


# ---- fixtures built once per test run ------------------------------------------------------


def shared_root(tmp_path_factory) -> Path:
    """The folder every pytest-xdist worker of this run can see: the parent of the workers'
    own base folders (the base folder itself without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build_once(folder: Path, build) -> Path:
    """`build()` fills `folder` once per test run, whichever worker asks first: the others wait
    on a file lock and then read what it built. A read-only fixture costs its build once,
    not once per worker. A build that failed is not tried again: the others fail at once,
    naming it."""
    from filelock import FileLock

    done, failed = folder / ".built", folder.with_name(folder.name + ".failed")
    with FileLock(folder.with_name(folder.name + ".lock")):
        if failed.exists():
            pytest.fail(f"building {folder.name} failed in another worker:\n{failed.read_text()}")
        if not done.exists():
            import shutil
            import traceback

            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                build()
            except BaseException:
                failed.write_text(traceback.format_exc()[-5000:])
                raise
            done.touch()
    return folder


@pytest.fixture(autouse=True, scope="session")
def _offline_wandb():
    """W&B has no server here: every test run is offline unless a test says otherwise."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_DISABLE_GIT", "true")


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The real corpus, beside the repository (never copied into it)."""
    path = Path(os.environ.get(config_lib.RAW_DIR_ENV, SHARED_MULTI30K))
    if not (path / "train.en.gz").exists():
        pytest.fail(f"Multi30k corpus not found at {path}; set {config_lib.RAW_DIR_ENV}")
    return path


def gzip_head(source: Path, dest: Path, count: int | None = None) -> None:
    """The first `count` lines of gzipped `source` (all: None) as gzipped `dest`, replacing it."""
    with gzip.open(source, "rt", encoding="utf-8") as handle:
        lines = handle.readlines()[:count]
    dest.unlink(missing_ok=True)
    with gzip.open(dest, "wt", encoding="utf-8") as handle:
        handle.writelines(lines)


def redirect_paths(cfg: config_schema.Config, root: Path) -> config_schema.Config:
    """Point every output directory of `cfg` under `root` (tests never write into the repo)."""
    for name in vars(cfg.paths):
        setattr(cfg.paths, name, str(root / getattr(cfg.paths, name)))
    return cfg


def with_a_long_source(cfg: config_schema.Config, root: Path, split: str, index: int) -> Path:
    """`cfg` reading a copy of its prepared corpus (under `root`) in which `split`'s source
    line `index + 1` is longer than the model's position table; returns that source file."""
    import shutil

    cfg.paths.prepared = str(shutil.copytree(cfg.paths.prepared, root / "prepared"))
    source = root / "prepared" / f"{split}.{cfg.data.src_lang}"
    text = source.read_text(encoding="utf-8").split("\n")
    text[index] = " ".join([text[index]] * cfg.model.max_positions)  # a subword or more each
    source.write_text("\n".join(text), encoding="utf-8")
    return source


def write_params(directory: Path, *overrides: str) -> None:
    """conf/ composed with `overrides` into directory/params.yaml, as DVC writes it for `dvc
    exp run -S`: composed, not validated (the stages validate; `python -m pipeline.params`
    refuses a bad value before writing anything)."""
    from omegaconf import OmegaConf

    params = OmegaConf.to_yaml(config_lib.compose_dict(list(overrides)))
    (Path(directory) / "params.yaml").write_text(params)


def set_key(tree: dict, dotted: str, value) -> dict:
    """A deep copy of `tree` with the key at `dotted` ("data.tokenizer.vocab_size") = value."""
    import copy

    tree = copy.deepcopy(tree)
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


def run_stage(
    stage: str, cwd: Path, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`python -m pipeline.stages.<stage>` as `dvc repro` runs it: reading ./params.yaml in
    `cwd`; stdout/stderr captured as text."""
    return subprocess.run(
        [sys.executable, "-m", f"pipeline.stages.{stage}"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(params=[True, False], ids=["cpu_speed_paths", "generic_paths"])
def speed_paths(request):
    """The `SpeedPaths` a test installs in the model: the test runs twice, with the CPU-only
    speed paths and with the paper's (generic) paths a GPU takes, so both meet the same oracle."""
    from pipeline.kernels import SpeedPaths

    return SpeedPaths.on_cpu(request.param)


@pytest.fixture
def small_disk(tmp_path):
    """A real 16 MiB tmpfs mounted at tmp_path/disk (needs root; skips where it cannot be
    mounted), and `fill(free)`, which leaves only `free` bytes of it unused."""
    import subprocess
    from types import SimpleNamespace

    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def fill(free: int) -> None:
        stat = os.statvfs(mount)
        with open(mount / ".filler", "ab") as filler:
            filler.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - free))

    yield SimpleNamespace(path=mount, fill=fill)
    subprocess.run(["umount", "--lazy", str(mount)], check=True, timeout=300)


def git(folder: Path, *args: str) -> str:
    """git's output in `folder` (fails the test where git fails)."""
    done = subprocess.run(
        ["git", *args], cwd=folder, capture_output=True, text=True, check=True, timeout=300
    )
    return done.stdout.strip()


@pytest.fixture
def worktree(tmp_path):
    """A clean checkout of this repository's HEAD in a git worktree of its own (removed after)."""
    path = tmp_path / "worktree"
    git(REPO_ROOT, "worktree", "add", "--detach", "--quiet", str(path), "HEAD")
    yield path
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, timeout=300)


def study_folder(work: Path, results: Path, study: str) -> Path:
    """The work folder of a new study `study` in its default storage under `results` (the
    first study of a fresh SQLite file has id 1), as `pipeline.sweep` keys it."""
    from types import SimpleNamespace

    from pipeline.sweep.storage import default_storage
    from pipeline.sweep.work_dirs import study_work_dir

    return study_work_dir(work, study, default_storage(SimpleNamespace(study=study), results), 1)


class RunsCommand:
    """Unpickling this runs a shell command: the payload of a malicious checkpoint."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture
def malicious_checkpoint(tmp_path):
    """A checkpoint whose pickled `hyper_parameters` runs `touch <marker>` when unpickled
    (`torch.load(weights_only=False)` would run it), shaped like ours otherwise."""
    import shlex
    from types import SimpleNamespace

    import torch

    marker = tmp_path / "code-ran"
    path = tmp_path / "evil.ckpt"
    payload = RunsCommand(f"touch {shlex.quote(str(marker))}")
    torch.save({"state_dict": {}, "global_step": 0, "pytorch-lightning_version": "2.6.6",
                "hyper_parameters": {"config": payload, "vocab_size": 8}}, path)  # fmt: skip
    return SimpleNamespace(path=path, marker=marker)


@pytest.fixture
def make_config(tmp_path, multi30k_dir):
    """Compose conf/ with Hydra overrides, outputs under tmp_path, data from the real corpus."""

    def _make(*overrides: str, root: Path | None = None) -> config_schema.Config:
        cfg = config_lib.compose([f"data.raw_dir={multi30k_dir}", *overrides])
        return redirect_paths(cfg, root or tmp_path)

    return _make


# ---- data fixtures (owner: data agent) -----------------------------------------------------

# Slices of the real corpus, plain text (easy to break), and snapshots of folders
SPLITS = ("train", "val", "test_2016_flickr")
SLICE = 40  # lines per split in the sliced copies


def raw_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        return handle.read().split("\n")[:-1]


# A valid study spec: one grid point of the smoke experiment (tests change one key of it).
GRID_SPEC = {
    "study": "domains",
    "kind": "grid",
    "base_experiment": "smoke",
    "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
    "seeds": [1],
    "variants": {"base": {}},
}


def gzip_bomb(path: Path, megabytes: int, line: bytes) -> None:
    """`megabytes` MiB of `line` over and over, gzipped: about a thousandth of that on disk."""
    block = line * ((1 << 20) // len(line))
    with gzip.open(path, "wb", compresslevel=9) as handle:
        for _ in range(megabytes):
            handle.write(block)


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under root (relative path -> bytes), to prove nothing changed."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def sliced_corpus(tmp_path, multi30k_dir) -> Path:
    """The first SLICE lines of every en/de split, as plain UTF-8 files (easy to break)."""
    folder = tmp_path / "raw"
    folder.mkdir()
    for split in SPLITS:
        for lang in ("en", "de"):
            lines = raw_lines(multi30k_dir / f"{split}.{lang}.gz")[:SLICE]
            (folder / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def sliced_config(make_config, sliced_corpus, tmp_path):
    def _make(*overrides: str) -> config_schema.Config:
        return make_config(f"data.raw_dir={sliced_corpus}", "data.download=false", *overrides)

    return _make


@pytest.fixture(scope="session")
@shared_build
def tokenized_smoke(tmp_path_factory, multi30k_dir) -> config_schema.Config:
    """`experiment=smoke` with prepare + tokenize run once per test run (`build_once`).

    Shared by every test of every worker: treat it as read-only (`copy.deepcopy` it before changing a
    value, and point paths.train_dir etc. elsewhere with `redirect_paths` if a test writes).
    """
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize

    root = shared_root(tmp_path_factory) / "tokenized_smoke"
    cfg = config_lib.compose([f"data.raw_dir={multi30k_dir}", "experiment=smoke"])
    cfg = redirect_paths(cfg, root)
    build_once(root, lambda: (prepare(cfg), tokenize(cfg)))
    return cfg


@pytest.fixture(scope="session")
@shared_build
def tokenized_multi30k(tmp_path_factory, multi30k_dir) -> config_schema.Config:
    """The default config (en->de, all 29000 training pairs, joint BPE 8000) prepared and
    tokenized once per test run; read-only like `tokenized_smoke`."""
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize

    root = shared_root(tmp_path_factory) / "tokenized_multi30k"
    cfg = redirect_paths(config_lib.compose([f"data.raw_dir={multi30k_dir}"]), root)
    build_once(root, lambda: (prepare(cfg), tokenize(cfg)))
    return cfg


# ---- evaluation fixtures (owner: evaluation agent) -----------------------------------------


@pytest.fixture(scope="session")
@shared_build
def trained_smoke(tmp_path_factory, tokenized_smoke) -> config_schema.Config:
    """`tokenized_smoke` trained once per test run by `trainer.run` (experiment=smoke: 40
    steps, step checkpoints at 20 and 40), shared by every worker. Read-only:
    `copy.deepcopy` it and point eval_dir/metrics_dir/plots_dir/wandb_dir elsewhere to write."""
    import copy

    from pipeline.training.trainer import run

    cfg = copy.deepcopy(tokenized_smoke)
    root = shared_root(tmp_path_factory) / "trained_smoke"
    for name in ("train_dir", "eval_dir", "metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(root / name))
    cfg.train.progress_bar = False
    build_once(root, lambda: run(cfg))
    return cfg


@pytest.fixture(scope="session")
@shared_build
def smoke_stage_run(tmp_path_factory, multi30k_dir):
    """`experiment=smoke` through the four stage commands, as `make repro > log` runs them
    (stdout a pipe, not a terminal), once per test run: `.root` (params.yaml and
    every output) and `.results` ({stage: CompletedProcess}, text captured). Read-only."""
    import json
    from types import SimpleNamespace

    root = shared_root(tmp_path_factory) / "smoke_stages"
    record = root / "stages.json"  # what each stage printed, for every worker to read

    def build() -> None:
        write_params(root, "experiment=smoke")
        env = {**os.environ, config_lib.RAW_DIR_ENV: str(multi30k_dir), "WANDB_MODE": "offline"}
        results = {}
        for stage in ("prepare", "tokenize", "train", "evaluate"):
            result = run_stage(stage, root, env=env, timeout=900)
            assert result.returncode == 0, result.stderr[-3000:]
            results[stage] = [result.args, result.returncode, result.stdout, result.stderr]
        record.write_text(json.dumps(results))

    build_once(root, build)
    results = json.loads(record.read_text())
    results = {stage: subprocess.CompletedProcess(*result) for stage, result in results.items()}
    return SimpleNamespace(root=root, results=results)


def frameworks_loaded_by(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args` run in a fresh interpreter (exit 0 expected) that then prints,
    on its last line, which of torch, Lightning, Optuna and W&B the command loaded."""
    code = (f"import runpy, sys; sys.argv = [{module!r}, *{list(args)!r}]\n"
            "try:\n"
            f"    runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
            "except SystemExit as done:\n"
            "    assert done.code in (0, None), done.code\n"
            "print(sorted(m for m in ('torch', 'lightning', 'optuna', 'wandb') if m in sys.modules))")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def page_references(page: str) -> list[str]:
    """Every src= and href= of an HTML page."""
    from html.parser import HTMLParser

    class References(HTMLParser):
        def __init__(self):
            super().__init__()
            self.found: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.found += [value for key, value in attrs if key in ("src", "href") and value]

    parser = References()
    parser.feed(page)
    return parser.found


def run_in_terminal(command: list[str], cwd, env, columns: int = 120, timeout: float = 600) -> str:
    """Run `command` with stdout and stderr on a pseudo-terminal `columns` wide (Python's
    `pty`); its output, carriage returns and all. It must exit 0."""
    import fcntl
    import pty
    import struct
    import termios

    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=child, stderr=child)  # fmt: skip
    os.close(child)
    chunks, deadline = [], time.monotonic() + timeout
    # Read until the terminal closes or the command has exited and its output is drained: a
    # daemon it started may hold the terminal open for ever.
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if not ready:
            if process.poll() is not None:
                break
            continue
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: every holder of the terminal's other side closed it
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    output = b"".join(chunks)[-3000:]
    try:
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"{command} still ran after {timeout} s:\n{output!r}") from None
    assert code == 0, output
    return b"".join(chunks).decode("utf-8", errors="replace")


def split_loss(module, loader) -> tuple[float, float]:
    """The label-smoothed loss of `module` (eval mode) over `loader`'s batches: per target token
    of the whole split, and the plain mean of the batches' per-token means."""
    import torch

    module.eval()
    sums, counts = [], []
    with torch.inference_mode():
        for batch in loader:
            loss_sum, _, tokens = module._loss(batch)
            sums.append(float(loss_sum))
            counts.append(tokens)
    return sum(sums) / sum(counts), sum(s / n for s, n in zip(sums, counts)) / len(counts)
