"""What the paper's Table 3 row beside a variant changes, against what the variant changes, and
the write-ups besides the paper (literature.yaml) that the report sets beside its findings.

The paper's base model is conf/model/base.yaml (its label smoothing the train default's), not
the study's base: a row of the same name can be another change, and the report names how."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from pipeline.sweep.spec import StudySpec, point_config

# Composed over conf/: the paper's base model, without the study's experiment
PAPER_BASE = ["~experiment", "model=base"]
# Rows that the spec takes at the variant's own value (the heads rows: h against h = 4), where
# what differs is the width that value divides: a head is d_model / h wide.
DIVIDED_WIDTH = {"model.heads": "model.d_model"}
LITERATURE = Path(__file__).with_name("literature.yaml")


def setting(cfg: Any, dotted: str) -> Any:
    """A config's value at a dotted key (`model.heads`)."""
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@cache
def _paper_base():
    from pipeline import config as config_lib

    return config_lib.compose(PAPER_BASE)


def unlike_paper(spec: StudySpec, variant: str) -> str | None:
    """How the variant's change differs from its row in the paper (None: the same change, or
    no row): a setting whose base value differs from the paper's base, or a head width."""
    if variant not in spec.paper:
        return None
    ours, changed, paper = (
        point_config(spec, {}),
        point_config(spec, spec.variants[variant]),
        _paper_base(),
    )
    notes = []
    for key in spec.variants[variant]:
        width = DIVIDED_WIDTH.get(key)
        if width is not None:
            if setting(changed, "model.head_dim") is not None:
                continue  # a head is model.head_dim wide, whatever it divides: no narrower
            d, wide, h = setting(ours, width), setting(paper, width), setting(changed, key)
            if d != wide:
                notes.append(
                    f"at {width.split('.')[-1]} {d} a head is {d}/{h} = {d / h:g} wide, "
                    f"{wide / d:g} times narrower than the paper's {wide}/{h} = {wide / h:g} at "
                    "the same h"
                )
            continue
        base, theirs = setting(ours, key), setting(paper, key)
        if base != theirs:
            notes.append(
                f"here {key} goes {base} → {setting(changed, key)} from our base's {base}; the "
                f"paper's base has {theirs}, and its row is {spec.paper[variant]['rows']}"
            )
    return "; ".join(notes) or None


@dataclass(frozen=True)
class WriteUp:
    """Another write-up's finding for one change of one setting (literature.yaml)."""

    name: str
    source: str
    key: str
    change: tuple[Any, Any]
    val_bleu: float
    test_bleu: float
    ppl: str


def write_ups(path: Path = LITERATURE) -> list[WriteUp]:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [WriteUp(name=name, source=" ".join(entry["source"].split()), key=entry["key"],
                    change=tuple(entry["change"]), val_bleu=entry["val_bleu"],
                    test_bleu=entry["test_bleu"], ppl=entry["ppl"])
            for name, entry in raw.items()]  # fmt: skip
