"""Where a result comes from: the commit, the machine and the locked environment.

`requirements.lock` pins every package of the environment the results were made with (pip
constraints; `make setup` installs from it, `make lock` re-resolves it from pyproject.toml).
Every results row records the lock's hash beside the commit, and `lock_problems` checks that
the lock satisfies pyproject.toml (tests/test_environment.py, run by CI).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pipeline.cli import main
from pipeline.cli import parser as cli_parser

REPO_ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = REPO_ROOT / "requirements.lock"
PYPROJECT = REPO_ROOT / "pyproject.toml"
LOCKED_EXTRAS = ("dev", "bench", "export")  # what `make setup` installs
# The lab's peer model (the `bench` extra: Hugging Face transformers) and what only it needs,
# as `make setup` installs them: in a folder beside the environment's packages, not among them.
# Nothing in pipeline/ imports them, but torchmetrics imports transformers wherever it finds it
# installed, which would cost every process that imports Lightning seconds of start-up
# (docs/test-suite.md). The lab puts the folder on its path where it builds a peer.
PEERS_DIR = Path(sys.prefix) / "peers"
HASH_CHARS = 16
# A copy of the work tree on a machine without git history (a remote GPU box) names the commit
# it was copied from here. The variable wins over `git rev-parse`: a copied .git can be stale.
COMMIT_ENV = "TRANSFORMER_ABLATIONS_COMMIT"
# What a result depends on in the checkout: uncommitted changes here make its commit `+dirty`.
CODE_PATHS = ("pipeline", "benchmarks", "conf", "ablations", "pyproject.toml", "requirements.lock")
NOT_CODE = ("ablations/results", "ablations/wandb", "benchmarks/results")  # what the code writes
DIRTY_HASH_CHARS = 8


def cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ('model name', 'cpu family', 'model',
    'flags', ...); empty where there is none (not Linux)."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # bf16 matmuls in hardware (AMX, AVX512-BF16)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    return set(cpuinfo().get("flags", "").split())


def cpu_id(fields: dict[str, str] | None = None) -> str | None:
    """'family F, model M' of the first processor (`cpuinfo`'s fields by default): which CPU
    family a hardware class's machine is, where one class spans several; None where
    /proc/cpuinfo names none."""
    fields = cpuinfo() if fields is None else fields
    if "cpu family" not in fields or "model" not in fields:
        return None
    return f"family {fields['cpu family']}, model {fields['model']}"


def hardware() -> str:
    """'<CPU model>, N cores[, bf16]' or the GPU's name: the machine a row was measured on."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}"
    fields = cpuinfo()
    model = fields["model name"] if "model name" in fields else platform.processor() or "CPU"
    bf16 = set(CPU_BF16_FLAGS) & cpu_flags()
    extra = f", {'/'.join(sorted(bf16))}" if bf16 else ""
    return f"{model}, {os.cpu_count()} cores{extra}"


def hardware_class(hardware: str) -> str:
    """The processor and its bf16 kernels, without the core or device count
    ('AMD EPYC, 2 cores, avx512_bf16' -> 'AMD EPYC, avx512_bf16'; 'NVIDIA H200 x 1' ->
    'NVIDIA H200')."""
    parts = [p for p in hardware.split(", ") if not re.fullmatch(r"\d+ cores?", p)]
    return re.sub(r" x \d+$", "", ", ".join(parts))


def run_class(hardware: str, processes: int) -> str:
    """`hardware_class`, and the processes that trained where more than one: their number sets
    the global batch, so a trial on four GPUs and one on one ran under different conditions
    ('NVIDIA H200 x 8', 4 -> 'NVIDIA H200, 4 processes'; one process: the class alone)."""
    machine = hardware_class(hardware)
    return machine if processes == 1 else f"{machine}, {processes} processes"


def machine_and_processes(run_class_name: str) -> tuple[str, int]:
    """`run_class`'s two parts: ('NVIDIA H200, 4 processes') -> ('NVIDIA H200', 4)."""
    found = re.search(r", (\d+) processes$", run_class_name)
    return (run_class_name[: found.start()], int(found[1])) if found else (run_class_name, 1)


def git_commit(repo: Path | None = None) -> str | None:
    """The checkout's HEAD (short), or the commit a launcher names in COMMIT_ENV."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    return _git(repo or REPO_ROOT, "rev-parse", "--short", "HEAD").strip() or None


def code_commit(repo: Path | None = None) -> str | None:
    """The commit the code comes from, `<commit>+dirty.<hash of the changes>` where the
    checkout's code (CODE_PATHS, without the records in NOT_CODE) has uncommitted changes: a
    record never names a commit whose code it did not run, and the same changes give the same
    name. A commit named in COMMIT_ENV is taken as it is (a copied tree has no history)."""
    repo = repo or REPO_ROOT
    commit = git_commit(repo)
    if commit is None or os.environ.get(COMMIT_ENV):
        return commit
    pathspec = [*CODE_PATHS, *(f":(exclude){path}" for path in NOT_CODE)]
    status = _git(repo, "status", "--porcelain", "--untracked-files=all", "--", *pathspec)
    if not status.strip():
        return commit
    digest = hashlib.sha256(_git(repo, "diff", "HEAD", "--binary", "--", *pathspec).encode())
    for line in sorted(status.splitlines()):
        if line.startswith("??"):  # an untracked file: its name and content
            path = repo / line[3:].strip('"')
            digest.update(line.encode())
            if path.is_file():
                digest.update(path.read_bytes())
    return f"{commit}+dirty.{digest.hexdigest()[:DIRTY_HASH_CHARS]}"


def _git(repo: Path, *args: str) -> str:
    """git's output in `repo`; empty where git fails (no git, not a checkout)."""
    try:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout if done.returncode == 0 else ""


def lock_hash(lock: Path = LOCK_FILE) -> str | None:
    """The first HASH_CHARS hex digits of the lock file's SHA-256 (None without a lock)."""
    if not lock.exists():
        return None
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:HASH_CHARS]


def provenance() -> dict:
    """What every results row records about how it was made: the commit, the lock's hash, the
    hardware and, where /proc/cpuinfo names them, the CPU's family and model (`cpu_id`). Where
    the installed packages differ from the lock (a remote machine's own image),
    `environment_differences` counts them: the lock's hash alone would claim an environment
    the run did not have."""
    recorded = {
        "commit": code_commit(),
        "environment_lock": lock_hash(LOCK_FILE),
        "hardware": hardware(),
    }
    cpu = cpu_id()
    if cpu is not None:
        recorded["cpu_id"] = cpu
    differences = installed_differences(LOCK_FILE)
    if differences:
        recorded["environment_differences"] = len(differences)
    return recorded


def read_lock(lock: Path = LOCK_FILE) -> dict[str, str]:
    """{canonical name: pinned version} of a `name==version` constraints file."""
    pins = {}
    for number, line in enumerate(lock.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{lock}:{number}: not a 'name==version' pin: {line!r}")
        pins[canonicalize_name(name)] = version.strip()
    return pins


def project_requirements(pyproject: Path = PYPROJECT) -> list[Requirement]:
    """The dependencies and the locked extras' requirements of pyproject.toml."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    listed = list(project["dependencies"])
    for extra in LOCKED_EXTRAS:
        listed += project.get("optional-dependencies", {}).get(extra, [])
    return [Requirement(text) for text in listed]


def lock_problems(pyproject: Path = PYPROJECT, lock: Path = LOCK_FILE) -> list[str]:
    """Each requirement of pyproject.toml the lock leaves unpinned or pins outside its range."""
    pins = read_lock(lock)
    problems = []
    for requirement in project_requirements(pyproject):
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is None:
            problems.append(f"{requirement} is not pinned in {lock.name}")
        elif not requirement.specifier.contains(pinned, prereleases=True):
            problems.append(f"{requirement} is not satisfied by {lock.name}'s =={pinned}")
    return problems


def installed_version(name: str) -> str | None:
    """The version of `name` installed in this environment or in its peers' folder (None: in
    neither)."""
    found = metadata.distributions(name=name, path=[*sys.path, str(PEERS_DIR)])
    return next((dist.version for dist in found), None)


def installed_differences(lock: Path = LOCK_FILE) -> list[str]:
    """Each locked package whose installed version differs (or that is not installed)."""
    differences = []
    for name, pinned in read_lock(lock).items():
        installed = installed_version(name)
        if installed is None:
            differences.append(f"{name}=={pinned} is not installed")
            continue
        if installed.split("+")[0] != pinned.split("+")[0]:
            differences.append(f"{name}=={pinned} is installed as {installed}")
    return differences


CLI_DOC = """Print this machine's provenance as JSON: the commit, the hardware, the lock's hash (and
how many installed packages differ from the lock).

A run made on another machine is recorded with this JSON from there:

    python -m pipeline.environment > made-on.json
    python -m pipeline.results record <name> --command "..." --made-on made-on.json
"""


def cli(argv: list[str] | None = None) -> None:
    cli_parser("pipeline.environment", CLI_DOC).parse_args(argv)
    print(json.dumps(provenance(), indent=2))


if __name__ == "__main__":
    main(cli)
