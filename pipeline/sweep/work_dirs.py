"""A study's work folder (`<work-dir>/<study>-<key>/`): where its trials train, keyed by the
study's identity, with the file that names the study (`pipeline.clean` reads it)."""

from __future__ import annotations

from pathlib import Path

STUDY_FILE = ".study.json"  # in a study's work folder: the study it belongs to
STUDY_KEY_LENGTH = 12  # hex digits of the identity hash in a study's work folder name


def study_identity(storage_url: str, study_id: int) -> str:
    """The study as one string: its storage's URL (password removed, an SQLite file by its
    absolute path) and its id in that storage."""
    from sqlalchemy.engine import make_url

    from pipeline.redaction import hide_password

    url = storage_url
    parsed = make_url(storage_url)
    if parsed.drivername.startswith("sqlite") and parsed.database:
        url = f"{parsed.drivername}:///{Path(parsed.database).resolve()}"
    return f"{hide_password(url)}#{study_id}"


def study_work_dir(work_root: Path, study: str, storage_url: str, study_id: int) -> Path:
    """`<work_root>/<study>-<key>`: the study's trials' work folders, keyed by its identity, so
    that studies of one name in two storages (two clones of the repository, a study created
    anew) never resume or overwrite each other's trials."""
    import hashlib

    identity = study_identity(storage_url, study_id).encode("utf-8")
    return work_root / f"{study}-{hashlib.sha256(identity).hexdigest()[:STUDY_KEY_LENGTH]}"


def claim_study_work_dir(work_root: Path, study: str, storage_url: str, study_id: int) -> Path:
    """The study's work folder (`study_work_dir`), created with the file naming its study."""
    from pipeline.atomic import write_json_atomic
    from pipeline.redaction import hide_password

    folder = study_work_dir(work_root, study, storage_url, study_id)
    if not (folder / STUDY_FILE).exists():
        write_json_atomic(folder / STUDY_FILE, {"study": study, "storage":
                          hide_password(storage_url), "study_id": study_id})  # fmt: skip
    return folder
