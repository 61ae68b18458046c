"""Every kind of file a command reads, corrupted as hypothesis draws it: params.yaml and
dvc.lock (check stage), a study spec and its study.db (the sweep), a checkpoint and a subword
model (translate), a corpus file (check stage). Each command runs in this process as its
console script does (`pipeline.cli.main`) and must exit 2 naming the file, with no
traceback, and leave every file as it was."""

from __future__ import annotations

import contextlib
import io
import shutil
import sqlite3
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import GRID_SPEC, REPO_ROOT, snapshot, write_params

EXAMPLES = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip


def run(entry: Callable[[], object], cwd: Path, monkeypatch, stage: str | None = None) -> tuple:
    """(exit code, stderr) of `entry` run as a command in `cwd`."""
    from pipeline.cli import main

    stderr = io.StringIO()
    monkeypatch.chdir(cwd)
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exit:
        main(entry, stage=stage)
        raise SystemExit(0)
    return exit.value.code, stderr.getvalue()


def assert_refused(corrupt: Path, entry, cwd: Path, watched: Path, monkeypatch, stage=None):
    """`entry` exits 2 naming `corrupt` without a traceback; nothing under `watched` changed."""
    before = snapshot(watched)
    code, stderr = run(entry, cwd, monkeypatch, stage)
    assert code == 2, stderr[-3000:]
    assert corrupt.name in stderr.strip().splitlines()[-1], stderr[-3000:]
    assert "Traceback" not in stderr
    assert snapshot(watched) == before


def insert_byte(data: bytes, position: int, byte: int) -> bytes:
    return data[:position] + bytes([byte]) + data[position:]


# Bytes no YAML text may hold (a control character, a byte that is no UTF-8), anywhere.
NOT_YAML = st.sampled_from([0x00, 0x07, 0x80, 0xFF])
FRACTION = st.floats(0.0, 1.0)


def at(fraction: float, size: int, start: int = 0) -> int:
    return start + int(fraction * (size - start - 1))


def example_folder(tmp_path: Path) -> Path:
    """A folder of its own for one hypothesis example (the test's tmp_path is shared)."""
    return Path(tempfile.mkdtemp(dir=tmp_path))


def deflate_start(data: bytes) -> int:
    """Where a gzip member's compressed data starts: past its header and the optional extra
    field, file name, comment and header CRC (RFC 1952), which no reader checks."""
    flags, position = data[3], 10
    if flags & 4:
        position += 2 + int.from_bytes(data[position : position + 2], "little")
    for flag in (8, 16):
        if flags & flag:
            position = data.index(b"\0", position) + 1
    return position + 2 * bool(flags & 2)


# ---- params.yaml and dvc.lock: the check stage --------------------------------------------


@pytest.fixture
def workspace(tmp_path, multi30k_dir):
    folder = tmp_path / "workspace"
    folder.mkdir()
    write_params(folder, f"data.raw_dir={multi30k_dir}", "data.download=false")
    return folder


@EXAMPLES
@given(position=FRACTION, byte=NOT_YAML)
def test_a_corrupt_params_file_is_named(workspace, monkeypatch, position, byte):
    from pipeline.stages import check

    params = workspace / "params.yaml"
    clean = params.read_bytes()
    params.write_bytes(insert_byte(clean, at(position, len(clean) + 1), byte))
    try:
        assert_refused(params, check.run, workspace, workspace, monkeypatch, "check")
    finally:
        params.write_bytes(clean)


@EXAMPLES
@given(position=FRACTION, byte=NOT_YAML)
def test_a_corrupt_dvc_lock_is_named_when_a_refused_value_would_be_put_back(
    workspace, monkeypatch, position, byte
):
    """Under `dvc exp run`, a value the check stage refuses is put back as dvc.lock recorded
    it: an unreadable dvc.lock is named (the value stays, and so does the file)."""
    from pipeline.stages import check

    write_params(workspace, f"data.raw_dir={workspace}", "seed=-1")
    lock = workspace / "dvc.lock"
    clean = yaml.safe_dump({"schema": "2.0", "stages": {"check": {"params": {"params.yaml": {
        "seed": 1}}}}}).encode()  # fmt: skip
    lock.write_bytes(insert_byte(clean, at(position, len(clean) + 1), byte))
    monkeypatch.setenv("DVC_EXP_NAME", "corrupt-lock")
    assert_refused(lock, check.run, workspace, workspace, monkeypatch, "check")


# ---- a corpus file: the check stage ---------------------------------------------------------


@EXAMPLES
@given(cut=st.booleans(), position=FRACTION)
def test_a_corrupt_corpus_file_is_named(tmp_path, multi30k_dir, monkeypatch, cut, position):
    """A gzip file truncated, or with a byte of its compressed data or trailer flipped (its
    header's time stamp and file name are read by no one, so they are left alone)."""
    from pipeline.stages import check

    folder = example_folder(tmp_path)
    for path in multi30k_dir.glob("*.gz"):
        (folder / path.name).symlink_to(path)
    corrupt = folder / "val.de.gz"
    data = bytearray((multi30k_dir / corrupt.name).read_bytes())
    corrupt.unlink()
    if cut:
        data = data[: at(position, len(data), 1)]
    else:
        data[at(position, len(data), deflate_start(data))] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    write_params(folder, f"data.raw_dir={folder}", "data.download=false")
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    assert_refused(corrupt, check.run, folder, folder, monkeypatch, "check")


# ---- a study spec and its storage: the sweep ------------------------------------------------


def sweep(spec: Path, *flags: str) -> Callable[[], object]:
    from pipeline.sweep.cli import cli

    root = spec.parent
    args = [str(spec), "--n-trials", "0", "--results-dir", str(root / "results"),
            "--work-dir", str(root / "work"), *flags]  # fmt: skip
    return lambda: cli(args)


@EXAMPLES
@given(position=FRACTION, byte=NOT_YAML)
def test_a_corrupt_study_spec_is_named(tmp_path, monkeypatch, position, byte):
    folder = example_folder(tmp_path)
    spec = folder / "spec.yaml"
    clean = yaml.safe_dump({**GRID_SPEC, "study": "corrupt"}).encode()
    spec.write_bytes(insert_byte(clean, at(position, len(clean) + 1), byte))
    assert_refused(spec, sweep(spec), REPO_ROOT, folder, monkeypatch)


@pytest.fixture(scope="module")
def study_db(tmp_path_factory) -> Path:
    """An Optuna storage as a sweep leaves it (the study created, its grid enqueued)."""
    import optuna

    path = tmp_path_factory.mktemp("storage") / "study.db"
    study = optuna.create_study(study_name="corrupt", storage=f"sqlite:///{path}")
    study.enqueue_trial({"variant": "base", "seed": 1})
    return path


@EXAMPLES
@given(cut=st.booleans(), position=FRACTION, byte=st.integers(0, 255))
def test_a_corrupt_study_storage_is_named(study_db, tmp_path, monkeypatch, cut, position, byte):
    """study.db truncated within its first page, or a byte of its header's magic string
    changed: no SQLite database (a change further in shows only where SQLite reads it)."""
    folder = example_folder(tmp_path)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump({**GRID_SPEC, "study": "corrupt"}))
    data = bytearray(study_db.read_bytes())
    with sqlite3.connect(study_db) as connection:
        page = connection.execute("PRAGMA page_size").fetchone()[0]
    connection.close()
    if cut:
        data = data[: at(position, page, 1)]
    else:
        index = at(position, 16)
        data[index] = byte if byte != data[index] else byte ^ 0xFF
    database = folder / "study.db"
    database.write_bytes(bytes(data))
    entry = sweep(spec, "--storage", f"sqlite:///{database}")
    assert_refused(database, entry, REPO_ROOT, folder, monkeypatch)


# ---- a checkpoint and a subword model: translate --------------------------------------------


@pytest.fixture(scope="module")
def model_files(tokenized_smoke, tmp_path_factory) -> tuple[Path, Path]:
    """A checkpoint of the smoke model (untrained: its bytes are what is read) and its
    subword model, with the files beside it."""
    from pipeline.config import to_dict
    from pipeline.data.tokenizer import Tokenizer
    from pipeline.model.transformer import build_transformer
    from pipeline.training.checkpoint_io import AtomicCheckpointIO

    folder = tmp_path_factory.mktemp("model")
    tokenized = folder / "tokenized"
    shutil.copytree(tokenized_smoke.paths.tokenized, tokenized)
    spm = tokenized / "spm.model"
    vocab = Tokenizer.load(spm).vocab_size
    model = build_transformer(tokenized_smoke, vocab)
    checkpoint = folder / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({
        "state_dict": {f"model.{name}": value for name, value in model.state_dict().items()},
        "global_step": 1,
        "hyper_parameters": {"config": to_dict(tokenized_smoke), "vocab_size": vocab},
    }, checkpoint)  # fmt: skip
    return checkpoint, spm


def translate(checkpoint: Path, spm: Path, cwd: Path) -> Callable[[], object]:
    """The translate command on a line written to `cwd`/input.txt."""
    from pipeline.translate import translate as command

    (cwd / "input.txt").write_text("two dogs are playing in the snow .\n")
    args = ["--checkpoint", str(checkpoint), "--tokenizer", str(spm), "--input",
            str(cwd / "input.txt")]  # fmt: skip
    return lambda: command(args)


def test_the_intact_model_files_translate(model_files, tmp_path, monkeypatch):
    """The baseline of the two tests below: intact, the same command succeeds."""
    checkpoint, spm = model_files
    code, stderr = run(translate(checkpoint, spm, tmp_path), tmp_path, monkeypatch)
    assert code == 0, stderr[-3000:]


def tensor_data(path: Path) -> tuple[int, int]:
    """(offset, size) of the largest tensor record's data in a checkpoint's archive."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    with open(path, "rb") as f:
        f.seek(record.header_offset)
        header = f.read(30)
    name, extra = (int.from_bytes(header[i : i + 2], "little") for i in (26, 28))
    return record.header_offset + 30 + name + extra, record.file_size


def export(checkpoint: Path, spm: Path) -> Callable[[], object]:
    from pipeline.export import export as command

    args = ["--checkpoint", str(checkpoint), "--tokenizer", str(spm), "--out",
            str(checkpoint.parent / "ct2")]  # fmt: skip
    return lambda: command(args)


@EXAMPLES
@given(cut=st.booleans(), position=FRACTION)
def test_a_corrupt_checkpoint_is_named(model_files, tmp_path, monkeypatch, cut, position):
    """A checkpoint truncated, or a byte of its tensor data flipped (which torch alone loads
    as other weights), given to translate and to export."""
    checkpoint, spm = model_files
    corrupt = example_folder(tmp_path) / "last.ckpt"
    data = bytearray(checkpoint.read_bytes())
    if cut:
        data = data[: at(position, len(data))]
    else:
        offset, size = tensor_data(checkpoint)
        data[offset + at(position, size)] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    for entry in (translate(corrupt, spm, corrupt.parent), export(corrupt, spm)):
        assert_refused(corrupt, entry, corrupt.parent, corrupt.parent, monkeypatch)


@EXAMPLES
@given(position=FRACTION)
def test_a_corrupt_subword_model_is_named(model_files, tmp_path, monkeypatch, position):
    """The subword model truncated within its pieces: not a model, or one of fewer pieces
    than the checkpoint's vocabulary."""
    checkpoint, spm = model_files
    folder = example_folder(tmp_path) / "tokenized"
    shutil.copytree(spm.parent, folder)
    corrupt = folder / spm.name
    data = spm.read_bytes()
    corrupt.write_bytes(data[: at(position, len(data) // 2)])
    assert_refused(corrupt, translate(checkpoint, corrupt, folder), folder, folder, monkeypatch)
