"""Weights & Biases runs: offline by default, online when asked, never a crash for lack of a
network.

Every run carries the full resolved config, a job type (train, eval, sweep, report), a group
(the experiment or study) and the config's tags. Files live under `cfg.paths.wandb_dir`
(W&B's own layout: `<wandb_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb`); upload an
offline run later with `wandb sync <that folder>`.

The mode is `logger.wandb.mode` unless the environment sets `WANDB_MODE` (W&B's documented
switch, so `WANDB_MODE=online dvc exp run` works without editing the config): an explicit
`wandb.init(mode=...)` would override the environment, hence the one environment read here.
If an online start fails (no API key, no network, `logger.wandb.init_timeout` passed) the run
starts offline with a warning.

Every wait on the W&B server is bounded by `init_timeout`, exit included, so an outage costs at
most about that much (tests/test_tracking.py runs real servers that refuse, stay silent, or
answer HEAD but hold every POST):
- the server must first answer one HTTP request within it (a refused connection falls back at
  once, a server that accepts but never answers after `init_timeout`);
- W&B's own start waits `init_timeout` (its `init_timeout` setting) for the run's creation, and
  skips the account lookup it does only to print "logged in as" (`x_disable_viewer`: two
  fixed 5 s tries on a server that does not answer);
- an online run's `run.finish()` (and W&B's exit handler) waits at most `init_timeout` for
  the upload (W&B's `finish_timeout`; W&B then warns and names `wandb sync`): the run's
  folder holds all of it, and `wandb sync <run folder>` uploads what was not sent (an offline
  run waits on no server and writes everything);
- W&B's usage telemetry is off unless the environment asks for it (`WANDB_ERROR_REPORTING`,
  W&B's documented switch, set to false where unset): it would POST to
  `<server>/sdk/otel/v1/metrics` from this process and from W&B's service at exit, with
  10 s timeouts of its own, and reach for the network even when the run fell back offline.
A run that is not online (offline, disabled, or fallen back) sets W&B's process-wide mode to
its own too: `offline` connects only to the local socket of W&B's own service process,
`disabled` to nothing at all.

W&B's own console output (a banner at the start, a history of sparklines and sync hints at the
end: half of what a smoke run printed) is off (`silent`); `finish_run` ends a run with one line
instead: where an offline run is and the `wandb sync` command that uploads it, or an online
run's page.

Under `dvc exp run`, DVC names the experiment in the environment (`DVC_EXP_NAME`): a run
started without an explicit name is called `<experiment>-<job type>` and carries the name in
its config (`dvc_exp_name`), so that `dvc exp show` and the W&B runs point at each other. An
offline run's folder also gets `files/config.yaml` (W&B's own layout of it, which only an
online run writes by itself), so its config is readable without W&B's tools.

Training logs through Lightning's W&B logger, in `pipeline.training.wandb_logger`: this
module does not import Lightning, so evaluating and reporting start without it.

`read_offline_run` reads a run's `.wandb` file back (config, history, summary) with W&B's own
protocol buffers: W&B 0.31 ships no reader, and tests and reports need one.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.request
import warnings
import zlib
from pathlib import Path
from typing import Any

from pipeline.config import to_dict
from pipeline.config_schema import Config
from pipeline.dvc_env import DVC_EXP_NAME
from pipeline.redaction import hide_passwords

MODE_ENV = "WANDB_MODE"
CONFIG_FILE = "config.yaml"  # in a run's files/ folder
TELEMETRY_ENV = "WANDB_ERROR_REPORTING"
_MODE_ALIASES = {"dryrun": "offline", "run": "online"}


def resolve_mode(configured: str) -> str:
    """`WANDB_MODE` from the environment if set, else the configured mode."""
    mode = os.environ.get(MODE_ENV) or configured
    return _MODE_ALIASES.get(mode, mode)


def start_wandb_run(cfg: Config, job_type: str, name: str | None = None, group: str | None = None):
    """Start a W&B run for `cfg` (see the module docstring for mode and fallback)."""
    os.environ.setdefault(TELEMETRY_ENV, "false")  # read when W&B's service process starts
    import wandb
    from wandb.sdk import wandb_setup

    settings = cfg.logger.wandb
    directory = Path(cfg.paths.wandb_dir)
    directory.mkdir(parents=True, exist_ok=True)
    config = to_dict(cfg)
    dvc_experiment = os.environ.get(DVC_EXP_NAME)
    if dvc_experiment:
        config["dvc_exp_name"] = dvc_experiment
        name = name or f"{dvc_experiment}-{job_type}"
    init_args: dict[str, Any] = {
        "project": settings.project,
        "entity": settings.entity,
        "group": group or settings.group or cfg.experiment_name,
        "job_type": job_type,
        "name": name,
        "tags": list(settings.tags),
        "config": config,
        "dir": str(directory),
    }
    timeout = settings.init_timeout
    mode = resolve_mode(settings.mode)
    if mode == "online":
        # Every wait on the server bounded by init_timeout (see the module docstring); set
        # process-wide too, as W&B's login and its exit read those settings, not the run's.
        bounded = wandb.Settings(init_timeout=timeout, finish_timeout=timeout,
                                 x_disable_viewer=True, silent=True)  # fmt: skip
        base_url = wandb_setup.singleton().settings.base_url  # env, `wandb login --host`
        failure = no_answer(base_url, timeout)
        if failure is None:
            wandb.setup(bounded)
            try:
                with _passwords_hidden_from_argv():
                    return wandb.init(mode="online", settings=bounded, **init_args)
            except Exception as err:  # no API key, no network, timeout: W&B raises several
                failure = f"{type(err).__name__}: {err}"
        warnings.warn(
            f"W&B online start failed ({failure}); logging offline under {directory} instead "
            "(upload later with `wandb sync`)",
            stacklevel=2,
        )
        mode = "offline"
    # The process-wide mode too: W&B's usage telemetry (if asked for) follows it, not the
    # run's, and would reach for the server at exit (a DNS lookup; ~20 s when it is silent).
    # An offline run waits on no server: its finish is unbounded again (finish_timeout 0, W&B's
    # default), so that it writes everything.
    wandb.setup(wandb.Settings(mode=mode, finish_timeout=0.0, silent=True))
    with _passwords_hidden_from_argv():
        run = wandb.init(
            mode=mode, settings=wandb.Settings(init_timeout=timeout, silent=True), **init_args
        )
    write_config_file(run)
    return run


def run_line(run) -> str | None:
    """The one line a finished run leaves on the console (None for a disabled run)."""
    if run is None or getattr(run, "disabled", False):
        return None
    if getattr(run, "offline", False):
        folder = Path(run.dir).parent  # run.dir is the run's files/ folder
        return f"W&B: offline run saved; upload it with `wandb sync {folder}`"
    return f"W&B: {run.url}"


def finish_run(run, exit_code: int = 0) -> None:
    """`run.finish()`, then `run_line(run)` on stdout (W&B's own summary is silenced)."""
    line = run_line(run)
    run.finish(exit_code=exit_code)
    if line:
        print(line, flush=True)


@contextlib.contextmanager
def _passwords_hidden_from_argv():
    """W&B records the command line (`sys.argv[1:]`) in the run's metadata when it starts: a
    sweep's `--storage postgresql://user:password@...` would land in the run's files and on
    the server. It reads the masked copy; the process keeps the real one (DDP ranks re-run
    it)."""
    real = sys.argv
    sys.argv = [hide_passwords(arg) for arg in real]
    try:
        yield
    finally:
        sys.argv = real


def write_config_file(run) -> None:
    """`files/config.yaml` of an offline run, as an online run's (`key: {value: ...}`): the
    config is otherwise only inside the `.wandb` file. Call again after `run.config.update`."""
    import yaml

    if not getattr(run, "offline", False) or getattr(run, "disabled", False):
        return  # online: W&B writes it; disabled: no folder
    config = {key: {"value": value} for key, value in dict(run.config).items()}
    text = "wandb_version: 1\n\n" + yaml.safe_dump(config, sort_keys=False)
    from pipeline.atomic import write_text_atomic

    write_text_atomic(Path(run.dir) / CONFIG_FILE, text)


def no_answer(url: str, timeout: float) -> str | None:
    """Why `url` gives no HTTP answer (of any status) within `timeout` seconds; None if it
    answers."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout).close()
    except urllib.error.HTTPError:
        return None  # an answer, if not a welcome one
    except (OSError, ValueError) as err:  # refused, unreachable, unresolvable, timed out
        reason = getattr(err, "reason", None) or err
        return f"{url} gave no answer within logger.wandb.init_timeout={timeout:g} s: {reason}"
    return None


# ---------------------------------------------------------------------- reading offline runs

# A .wandb file is a LevelDB-style log: a 7-byte header, then 32 KiB blocks of records, each
# with a 7-byte header (CRC-32 seeded with the type byte, length, type); a record that does not
# fit a block continues in the next (FIRST, MIDDLE..., LAST).
_FILE_HEADER = struct.Struct("<4sHB")
_RECORD_HEADER = struct.Struct("<IHB")
_FILE_IDENT, _FILE_MAGIC = b":W&B", 0xBEE1
_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def offline_run_dirs(wandb_dir: str | os.PathLike) -> list[Path]:
    """The offline run folders under a `paths.wandb_dir`, oldest first."""
    return sorted((Path(wandb_dir) / "wandb").glob("offline-run-*"))


def _records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    ident, magic, _version = _FILE_HEADER.unpack_from(data, 0)
    if ident != _FILE_IDENT or magic != _FILE_MAGIC:
        raise ValueError(f"{path}: not a W&B run file")
    records, pending, pos = [], b"", _FILE_HEADER.size
    while pos + _RECORD_HEADER.size <= len(data):
        left_in_block = _BLOCK - pos % _BLOCK
        if left_in_block < _RECORD_HEADER.size:  # block trailer padding
            pos += left_in_block
            continue
        checksum, length, kind = _RECORD_HEADER.unpack_from(data, pos)
        payload = data[pos + _RECORD_HEADER.size : pos + _RECORD_HEADER.size + length]
        if kind == 0 or len(payload) < length:  # zero padding, or a run still being written
            break
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) != checksum:
            raise ValueError(f"{path}: checksum mismatch at byte {pos}")
        pos += _RECORD_HEADER.size + length
        if kind == _FULL:
            records.append(payload)
        elif kind == _FIRST:
            pending = payload
        elif kind == _MIDDLE:
            pending += payload
        elif kind == _LAST:
            records.append(pending + payload)
    return records


def _set_item(target: dict, item) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = json.loads(item.value_json)


def read_offline_run(run_dir: str | os.PathLike, wait_s: float = 30.0) -> dict:
    """An offline run's `run` info (project, group, job_type, tags), `config`, `history`
    (one dict per logged step), `summary` and `artifacts` (name, type, aliases, metadata,
    files), read from its `run-<id>.wandb` file.

    W&B's service writes the file asynchronously, also after `run.finish()` has returned, so
    this waits up to `wait_s` seconds for the run's exit record; `complete` says if it came.
    """
    run_dir = Path(run_dir)
    files = list(run_dir.glob("run-*.wandb"))
    if len(files) != 1:
        raise FileNotFoundError(f"{run_dir}: expected one run-*.wandb file, found {len(files)}")
    deadline = time.monotonic() + wait_s
    while True:
        result = _parse_run_file(files[0])
        if result["complete"] or time.monotonic() > deadline:
            return result
        time.sleep(0.1)


def _parse_run_file(path: Path) -> dict:
    from wandb.proto import wandb_internal_pb2

    result: dict[str, Any] = {"run": {}, "config": {}, "history": [], "summary": {},
                              "artifacts": []}  # fmt: skip
    result["complete"] = False
    for payload in _records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            result["run"] = {"id": run.run_id, "project": run.project, "group": run.run_group,
                             "job_type": run.job_type, "name": run.display_name,
                             "tags": list(run.tags)}  # fmt: skip
            for item in run.config.update:
                _set_item(result["config"], item)
        elif kind == "config":
            for item in record.config.update:
                _set_item(result["config"], item)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set_item(row, item)
            result["history"].append(row)
        elif kind == "summary":
            for item in record.summary.update:
                _set_item(result["summary"], item)
        elif kind == "artifact":
            artifact = record.artifact
            result["artifacts"].append({
                "name": artifact.name, "type": artifact.type, "aliases": list(artifact.aliases),
                "metadata": json.loads(artifact.metadata) if artifact.metadata else {},
                "files": sorted(entry.path for entry in artifact.manifest.contents),
            })  # fmt: skip
        elif kind == "exit":
            result["complete"] = True
    result["config"].pop("_wandb", None)  # W&B's own bookkeeping
    return result
