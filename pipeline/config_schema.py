"""What a configuration holds and what makes one valid: a dataclass per section of `conf/`,
each with the checks of its own values (`validate(prefix)`, naming the key it refuses), and
`validate`, which runs them all and the checks that read two sections.

Every key declares its domain beside its field (`key(default, ge=..., choices=...)`): its
type is the field's annotation, its range, choices or pattern the `Domain`. A section's
`validate` first holds each of its keys to its domain (`check_domains`), so a value no stage
could use (a negative seed, a zero logging interval) is refused by the check stage, before DVC
deletes the last run's outputs. `schema_leaves` lists every key with its type and domain.

`pipeline.config` reads files and Hydra compositions into these classes.
"""

from __future__ import annotations

import functools
import math
import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Optional, Union

from pipeline.data.budget import BATCH_BUDGETS
from pipeline.errors import ConfigError
from pipeline.model.length_penalty import LENGTH_NORMALIZATIONS

# data.tokenizer.pretokenizer: what the text goes through before the subword model reads it
PRETOKENIZERS = ("none", "moses")
# data.tokenizer.model_type: sentencepiece's model types, or subword-nmt's joint BPE
# (pipeline.data.subword_nmt) with one id per piece
TOKENIZER_MODEL_TYPES = ("bpe", "unigram", "word", "subword_nmt")
# model.init: how the Transformer's weights start (pipeline.model.transformer)
INITS = ("xavier", "fairseq")
# train.loss_normalization: how an update of several batches weighs them
# (pipeline.training.module.TranslationModule.on_before_optimizer_step)
LOSS_NORMALIZATIONS = ("batch", "update")
# train.accelerator and train.precision: what Lightning's Trainer takes (auto: resolved here,
# pipeline.training.hardware and pipeline.training.precision)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
PRECISIONS = ("auto", "64-true", "32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true",
              "64", "32", "16", "bf16")  # fmt: skip
# A seed: what torch.manual_seed, numpy's RandomState, Lightning's seed_everything and
# sentencepiece's random_seed all accept (an unsigned 32-bit integer)
SEED_LIMIT = 2**32
# data.tokenizer.vocab_size: above any subword vocabulary in use (the largest hold ~256k
# pieces); a larger one would only fail in the tokenizer, or build an embedding of gigabytes
MAX_VOCAB_SIZE = 2**20
# An environment variable's integer read by C code (runtime.onednn_primitive_cache)
C_INT_MAX = 2**31 - 1
# Names that become parts of file names: languages ({split}.{lang}.gz) and splits
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
SHA256_PATTERN = r"[0-9a-f]{64}"

DOMAIN = "domain"  # the dataclass field metadata key that holds a key's Domain


@dataclass(frozen=True)
class Domain:
    """The values one key may hold, beyond its annotated type (an Optional one may be null).

    ge/gt/le/lt: its range (numbers; a float must be finite); `also`: values accepted outside
    the range, each with its meaning ({-1: "keep every checkpoint"}); choices; a pattern a
    string matches whole; nonempty (a string or a list); length (a list's); items: the domain
    of each item of a list or value of a mapping, keys: of each key of a mapping. A key typed
    Any takes a string among `choices`, an integer in the range, or a list of `items`."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    also: dict = field(default_factory=dict)
    choices: tuple = ()
    pattern: str | None = None
    nonempty: bool = False
    length: int | None = None
    items: Domain | None = None
    keys: Domain | None = None
    note: str = ""  # why the domain is what it is, said with a refusal

    def range_text(self) -> str:
        low = f"[{_num(self.ge)}" if self.ge is not None else (
            f"({_num(self.gt)}" if self.gt is not None else None)  # fmt: skip
        high = f"{_num(self.le)}]" if self.le is not None else (
            f"{_num(self.lt)})" if self.lt is not None else None)  # fmt: skip
        if low and high:
            return f"in {low}, {high}"
        if low:
            return f"{'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"{'<=' if self.le is not None else '<'} {high[:-1]}"
        return ""

    def in_range(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def key(default: Any = MISSING, *, factory: Any = MISSING, **domain: Any) -> Any:
    """A dataclass field with its domain: `vocab_size: int = key(8000, ge=5)`."""
    return field(default=default, default_factory=factory, metadata={DOMAIN: Domain(**domain)})


_TYPE_NAMES = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def domain_problem(value: Any, hint: Any, domain: Domain) -> str | None:
    """What is wrong with `value` for a key of type `hint` and `domain` ("must be ..., got
    ..."), or None where it is one of the key's values."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        inner = [arg for arg in args if arg is not type(None)][0]
        problem = domain_problem(value, inner, domain)
        return problem and problem.replace("must be ", "must be null or ", 1)
    if any(type(value) is type(special) and value == special for special in domain.also):
        return None
    if hint is Any:
        if not (domain.choices or domain.items or domain.range_text()):
            return None  # any value (a config override's, say: checked where it is composed)
        if isinstance(value, str) and value in domain.choices or _is_int(value) and (
                domain.in_range(value)):  # fmt: skip
            return None
        if isinstance(value, list) and domain.items is not None:
            return _items_problem(value, int, domain.items)
        what = " or ".join(filter(None, [
            f"one of {list(domain.choices)}" if domain.choices else "",
            _also_text(domain) + f"an integer {domain.range_text()}".rstrip(),
            f"a list of integers {domain.items.range_text()}" if domain.items else ""]))  # fmt: skip
        return f"must be {what}, got {value!r}"
    if origin is list:
        if not isinstance(value, list):
            return f"must be a list, got {value!r}"
        if domain.length is not None and len(value) != domain.length:
            return f"must be a list of {domain.length} items, got {value!r}"
        if domain.nonempty and not value:
            return "must be a list of at least one item, got []"
        return _items_problem(value, args[0] if args else Any, domain.items or Domain())
    if origin is dict:
        if not isinstance(value, dict):
            return f"must be a mapping, got {value!r}"
        for name, item in value.items():
            problem = domain_problem(name, args[0], domain.keys or Domain()) if args else None
            problem = problem or (args and domain_problem(item, args[1], domain.items or Domain()))
            if problem:
                return f"entry {name!r}: {problem}"
        return None
    return _scalar_problem(value, hint, domain)


def _items_problem(value: list, hint: Any, domain: Domain) -> str | None:
    for index, item in enumerate(value):
        problem = domain_problem(item, hint, domain)
        if problem:
            return f"item {index}: {problem}"
    return None


def _also_text(domain: Domain) -> str:
    return "".join(f"{value!r} ({meaning}) or " for value, meaning in domain.also.items())


def _scalar_problem(value: Any, hint: Any, domain: Domain) -> str | None:
    kind = _TYPE_NAMES.get(hint, str(hint))
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = _is_int(value)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
            value)  # fmt: skip
    else:
        ok = isinstance(value, hint)
    note = f" ({domain.note})" if domain.note else ""
    if not ok:
        return f"must be {kind}, got {value!r}{note}"
    if hint in (int, float) and not domain.in_range(value):
        why = f"{kind}; {domain.note}" if domain.note else kind
        return f"must be {_also_text(domain)}{domain.range_text()}, got {value!r} ({why})"
    if hint is str:
        if domain.choices and value not in domain.choices:
            return f"must be one of {list(domain.choices)}, got {value!r}{note}"
        if domain.nonempty and not value:
            return f"must be a non-empty string, got ''{note}"
        if domain.pattern is not None and not re.fullmatch(domain.pattern, value):
            return f"must match {domain.pattern}, got {value!r}{note}"
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_domains(section: Any, prefix: str) -> None:
    """Hold each key of `section` (not its subsections) to its type and domain; the first
    that is outside is refused, named `<prefix>.<key>`."""
    hints = _hints(type(section))
    for f in fields(section):
        if is_dataclass(hints[f.name]):
            continue
        domain = f.metadata.get(DOMAIN, Domain())  # none declared: its type alone (a test fails)
        problem = domain_problem(getattr(section, f.name), hints[f.name], domain)
        _check(problem is None, f"{prefix}.{f.name}".lstrip("."), str(problem))


def schema_leaves(cls: type, prefix: str = "") -> list[tuple[str, Any, Domain | None]]:
    """(dotted key, type, domain or None) of every key under `cls`, its subsections' too."""
    found = []
    hints = _hints(cls)
    for f in fields(cls):
        name = f"{prefix}.{f.name}".lstrip(".")
        if is_dataclass(hints[f.name]):
            found += schema_leaves(hints[f.name], name)
        else:
            found.append((name, hints[f.name], f.metadata.get(DOMAIN)))
    return found


NO_STEP_LIMIT = -1  # train.max_steps (Lightning's convention): train.max_epochs ends the run


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': {message}", key=key)


@dataclass
class FilterConfig:
    """Length/ratio filter applied to training pairs (whitespace tokens)."""

    min_words: int = key(1, ge=1, note="a pair with an empty side is no translation")
    max_words: int = key(100, ge=1)
    max_ratio: float = key(3.0, ge=1.0)  # max(len_src, len_tgt) / min(...)
    apply_to: list[str] = key(factory=lambda: ["train"], items=Domain(pattern=NAME_PATTERN))

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        _check(
            self.min_words <= self.max_words,
            f"{prefix}.min_words",
            f"must be <= {prefix}.max_words = {self.max_words}, got {self.min_words}: every "
            "pair would be dropped",
        )


@dataclass
class LimitsConfig:
    """Bounds on what the corpus and its download may cost: a gzip bomb or a trickling server
    is refused naming the file or URL instead of filling memory or waiting for ever."""

    max_file_mb: float = key(512.0, gt=0.0)  # decompressed bytes of one corpus file, in MiB
    # decompressed bytes of one line (a sentence is far shorter)
    max_line_bytes: int = key(65536, gt=0)
    download_read_timeout_s: float = key(60.0, gt=0.0)  # one network read
    download_deadline_s: float = key(900.0, gt=0.0)  # a whole file's download
    # average KiB/s, measured once the grace period is over
    download_min_rate_kb_s: float = key(8.0, ge=0.0)
    download_grace_s: float = key(30.0, ge=0.0)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * (1 << 20))


@dataclass
class TokenizerConfig:
    """Joint subword model (sentencepiece) trained on the training split only."""

    # bpe | unigram: sentencepiece subwords learned here; word: one id per whitespace-separated
    # unit of text segmented elsewhere; subword_nmt: subword-nmt's joint BPE learned here, as
    # the Multi30k dataset's task1-bpe.sh does, one id per piece
    model_type: str = key("bpe", choices=TOKENIZER_MODEL_TYPES)
    # pieces in the vocabulary, specials included; subword_nmt: merges learned (its -s), the
    # vocabulary is then every piece of the segmented training text
    vocab_size: int = key(8000, ge=5, le=MAX_VOCAB_SIZE, note="more than the 4 special ids")
    # sentencepiece's own range
    character_coverage: float = key(1.0, ge=0.98, le=1.0)
    # lowercase everything the model reads and writes (NFKC + fold)
    case_fold: bool = key(False)
    source_eos: bool = key(False)  # every source sentence ends with eos, as fairseq encodes it
    # none | moses: Moses-tokenize the text before the subword model, detokenize after decoding
    pretokenizer: str = key("none", choices=PRETOKENIZERS)
    # Fixed special ids, shared by tokenizer, model and decoding.
    pad_id: int = key(0, ge=0)
    unk_id: int = key(1, ge=0)
    bos_id: int = key(2, ge=0)
    eos_id: int = key(3, ge=0)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        special = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        _check(len(set(special)) == 4, prefix, "pad/unk/bos/eos ids must be distinct")
        _check(
            max(special) < self.vocab_size,
            prefix,
            f"pad/unk/bos/eos ids must be below vocab_size = {self.vocab_size}, got {special}",
        )


@dataclass
class DataConfig:
    name: str = key("multi30k", nonempty=True)
    source: str = key("multi30k", choices=("multi30k", "text", "hf"))
    src_lang: str = key("en", pattern=NAME_PATTERN)
    tgt_lang: str = key("de", pattern=NAME_PATTERN)
    raw_dir: str = key("../shared/data/multi30k", nonempty=True)  # env MULTI30K_DIR overrides
    download: bool = key(True)  # fetch from `url` when raw_dir has no copy
    url: str = key("")  # checked where it is fetched (pipeline.data.download)
    # file name -> checksum
    sha256: dict[str, str] = key(factory=dict, items=Domain(pattern=SHA256_PATTERN))
    # Downloaded file names ({split}.{lang}.gz) accepted without a checksum in `sha256`, each
    # named on purpose; any other file without one is refused.
    allow_unverified: list[str] = key(
        factory=list,
        items=Domain(pattern=rf"{NAME_PATTERN}\.{NAME_PATTERN}\.gz",
                     note="names downloaded files as {split}.{lang}.gz, e.g. "
                     "test_2016_flickr.cs.gz"),
    )  # fmt: skip
    train_split: str = key("train", pattern=NAME_PATTERN)
    val_split: str = key("val", pattern=NAME_PATTERN)
    test_splits: list[str] = key(
        factory=lambda: ["test_2016_flickr"], items=Domain(pattern=NAME_PATTERN)
    )
    # source=text: {split: {src: path, tgt: path}}
    text_files: dict[str, dict[str, str]] = key(
        factory=dict, keys=Domain(pattern=NAME_PATTERN), items=Domain(keys=Domain(
            choices=("src", "tgt")), items=Domain(nonempty=True)))  # fmt: skip
    # source=hf: datasets.load_dataset(hf_path, hf_name) with a `translation` column
    hf_path: str = key("")
    hf_name: Optional[str] = key(None, nonempty=True)
    # first N training pairs (smoke runs); null: all of them
    max_train_pairs: Optional[int] = key(None, ge=1)
    filter: FilterConfig = field(default_factory=FilterConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        _check(
            self.src_lang != self.tgt_lang,
            f"{prefix}.tgt_lang",
            f"must differ from {prefix}.src_lang",
        )
        self.tokenizer.validate(f"{prefix}.tokenizer")
        self.filter.validate(f"{prefix}.filter")
        self.limits.validate(f"{prefix}.limits")


@dataclass
class ModelConfig:
    """The encoder-decoder of section 3; each Table 3 ablation axis is one field."""

    d_model: int = key(512, ge=1)
    heads: int = key(8, ge=1)
    encoder_layers: int = key(6, ge=1)
    decoder_layers: int = key(6, ge=1)
    d_ff: int = key(2048, ge=1)
    # P_drop: embeddings+positions and every sublayer output
    dropout: float = key(0.1, ge=0.0, lt=1.0)
    attention_dropout: float = key(0.0, ge=0.0, lt=1.0)  # on the attention weights
    activation_dropout: float = key(0.0, ge=0.0, lt=1.0)  # inside the FFN, after the ReLU
    positional: str = key("sinusoidal", choices=("sinusoidal", "learned"))
    max_positions: int = key(256, ge=1)  # learned table size; also the decode length cap
    norm_first: bool = key(False)  # post-norm as in the paper; pre-norm as an option
    # source, target and output embeddings share one matrix
    tie_embeddings: bool = key(True)
    fused_attention: bool = key(True)  # F.scaled_dot_product_attention fast path
    # xavier: every matrix Xavier-uniform, biases zero; fairseq: as fairseq 0.12 (the FFN and
    # the q/k/v biases keep nn.Linear's default; pipeline.model.transformer)
    init: str = key("xavier", choices=INITS)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        _check(
            self.d_model % self.heads == 0,
            f"{prefix}.heads",
            f"{self.heads} heads do not divide {prefix}.d_model={self.d_model} (d_k = d_model / "
            "heads must be an integer); pick a divisor of d_model",
        )


@dataclass
class TrainConfig:
    max_steps: int = key(8000, ge=1, also={-1: "no limit: max_epochs"})
    max_epochs: int = key(-1, ge=1, also={-1: "no limit: max_steps"})
    # per batch, padded source + target tokens (see batch_budget)
    max_tokens: int = key(4096, ge=1)
    # How a batch is held to max_tokens: "sum", B * (max_src + max_tgt); "max", B * max(max_src,
    # max_tgt) as fairseq's --max-tokens (pipeline.data.budget)
    batch_budget: str = key("sum", choices=BATCH_BUDGETS)
    accumulate_grad_batches: int = key(1, ge=1)
    # An update's loss: "batch", the mean of its batches' per-token losses; "update", its summed
    # loss over all its target tokens (every batch and rank) by their number, as fairseq's
    loss_normalization: str = key("batch", choices=LOSS_NORMALIZATIONS)
    # lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    lr_factor: float = key(1.0, gt=0.0)
    warmup_steps: int = key(4000, ge=1)
    # The last cooldown_steps of max_steps scale that lr down linearly to 0 (0: eq. 3 alone)
    cooldown_steps: int = key(0, ge=0)
    adam_betas: list[float] = key(
        factory=lambda: [0.9, 0.98], length=2, items=Domain(ge=0.0, lt=1.0)
    )
    adam_eps: float = key(1e-9, gt=0.0)
    weight_decay: float = key(0.0, ge=0.0)
    label_smoothing: float = key(0.1, ge=0.0, lt=1.0)
    gradient_clip_val: float = key(0.0, ge=0.0)  # 0 disables clipping
    val_check_interval: int = key(500, ge=1)  # optimizer steps between validations
    val_bleu: bool = key(True)  # greedy-decode the validation set for val/bleu
    val_bleu_max_sentences: Optional[int] = key(None, ge=1)  # None: the whole split
    accelerator: str = key("auto", choices=ACCELERATORS)
    # "auto", -1 (every device), a number of devices or a list of device indices
    devices: Any = key("auto", choices=("auto",), ge=1, also={-1: "every device"},
                       items=Domain(ge=0))  # fmt: skip
    num_nodes: int = key(1, ge=1, note="machines that train together")
    strategy: str = key("auto", nonempty=True)  # auto picks DDP when more than one device
    # Seconds a DDP rank waits in a collective for the others before the job fails (a dead or
    # hung rank ends the job instead of stalling it); keep above the longest one-rank pause
    # (a checkpoint write, logger.wandb.init_timeout).
    ddp_timeout: float = key(1800.0, gt=0.0)
    # auto: bf16-mixed where it is faster (training.precision)
    precision: str = key("auto", choices=PRECISIONS)
    num_workers: int = key(0, ge=0)
    # best checkpoints by val/bleu, kept for averaging. Lightning's save_top_k: 0 keeps none
    # (only last.ckpt), and the evaluate stage would have nothing to average.
    save_top_k: int = key(10, ge=1, also={-1: "keep every checkpoint"},
                          note="the newest/best that many, for the evaluate stage to average")  # fmt: skip
    # validations without val/bleu improving
    early_stopping_patience: Optional[int] = key(None, ge=1)
    resume: bool = key(True)
    compile: bool = key(False)
    # GPU: torch.set_float32_matmul_precision
    float32_matmul_precision: str = key("highest", choices=("highest", "high", "medium"))
    log_every_n_steps: int = key(50, ge=1)
    progress_bar: bool = key(True)  # the console's progress (pipeline.training.progress)
    # without a terminal: a progress line every this many steps
    progress_every: int = key(100, ge=1)
    deterministic: bool = key(False)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        _check(
            self.cooldown_steps == 0 or self.cooldown_steps <= self.max_steps,
            f"{prefix}.cooldown_steps",
            f"must be 0 or in [1, {prefix}.max_steps = {self.max_steps}], got "
            f"{self.cooldown_steps}",
        )


@dataclass
class RuntimeConfig:
    """How fast and where the recipe runs on this host, not what it learns: kept apart from
    `train` so a recipe reads the same on every machine."""

    # precision auto on a CPU: bf16 matmuls must be this much faster
    bf16_min_speedup: float = key(1.1, gt=0.0)
    # target tokens per chunk of the fused output layer + loss
    loss_chunk_rows: int = key(256, ge=1)
    # each chunk's softmax + loss + gradient as one compiled function
    compile_loss: bool = key(True)
    cpu_speed_paths: bool = key(True)  # CPU-only speed paths (pipeline.kernels); false: generic
    # CPU only (pipeline.training.cpu_memory): heap-allocate activations up to this many MiB
    # and never trim the heap; cache this many oneDNN kernels. None keeps the defaults.
    cpu_mmap_threshold_mb: Optional[int] = key(32, ge=1)
    onednn_primitive_cache: Optional[int] = key(16384, ge=1, le=C_INT_MAX)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)


@dataclass
class EvalConfig:
    beam_size: int = key(5, ge=1)
    # alpha of length_normalization (0: none)
    length_penalty: float = key(1.0, ge=0.0)
    # gnmt: log P / ((5 + |Y|) / 6) ** alpha; fairseq: log P / |Y| ** alpha (its --lenpen)
    length_normalization: str = key("gnmt", choices=LENGTH_NORMALIZATIONS)
    # A hypothesis has at most floor(max_len_a * source tokens + max_len_b) tokens; a negative
    # term would cut translations short.
    max_len_a: float = key(1.2, ge=0.0)
    max_len_b: int = key(10, ge=0)
    nbest: int = key(1, ge=1)
    max_tokens: int = key(8192, ge=1)  # source tokens per decoding batch
    # average the last N (or best N) checkpoints; 1 = no averaging
    average: int = key(10, ge=1)
    average_by: str = key("last", choices=("last", "best"))
    # explicit checkpoint; None = the train stage's
    checkpoint: Optional[str] = key(None, nonempty=True)
    # The splits to translate and score; None: the val split and every data.test_splits. A
    # list must hold every test split: a configured test set is never silently left out.
    splits: Optional[list[str]] = key(None, items=Domain(pattern=NAME_PATTERN))
    heatmaps: int = key(3, ge=0)  # cross-attention heatmap PNGs (layers x heads grid)
    samples: int = key(20, ge=0)  # rows in the W&B table of sample translations
    # Resamples of each split for the 95% bootstrap half-width of lowercased BLEU (0: none)
    bootstrap_samples: int = key(1000, ge=2, also={0: "no interval"})

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)
        _check(
            self.nbest <= self.beam_size,
            f"{prefix}.nbest",
            f"must be in [1, {prefix}.beam_size]",
        )
        _check(
            self.max_len_a + self.max_len_b >= 1,
            f"{prefix}.max_len_b",
            f"{prefix}.max_len_a + {prefix}.max_len_b must be >= 1, got {self.max_len_a} + "
            f"{self.max_len_b}: a one-token source would get an empty translation",
        )


@dataclass
class WandbConfig:
    project: str = key("transformer-ablations", nonempty=True)
    entity: Optional[str] = key(None, nonempty=True)
    group: Optional[str] = key(None, nonempty=True)
    tags: list[str] = key(factory=list, items=Domain(nonempty=True))
    # offline | online | disabled; env WANDB_MODE wins (wandb's own rule)
    mode: str = key("offline", choices=("offline", "online", "disabled"))
    # seconds before an online init falls back to offline
    init_timeout: float = key(30.0, gt=0.0)
    # the evaluate stage's model.ckpt + spm.model as a `model` artifact
    log_model: bool = key(True)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self, prefix: str) -> None:
        self.wandb.validate(f"{prefix}.wandb")


@dataclass
class PathsConfig:
    """Where stages write; DVC declares each of these as an output."""

    prepared: str = key("data/prepared", nonempty=True)
    tokenized: str = key("data/tokenized", nonempty=True)
    train_dir: str = key("models/train", nonempty=True)
    eval_dir: str = key("eval", nonempty=True)
    metrics_dir: str = key("metrics", nonempty=True)
    plots_dir: str = key("plots", nonempty=True)
    wandb_dir: str = key("wandb_runs", nonempty=True)
    # The check stage's record of the raw corpus (SHA-256 per file): the prepare stage's input
    corpus_record: str = key("data/corpus.json", nonempty=True)

    def validate(self, prefix: str) -> None:
        check_domains(self, prefix)

    def outputs(self, *leaving_out: str) -> dict[str, str]:
        """`{"paths.<name>": path}` of every stage output but those named in `leaving_out`:
        what a command replacing a folder must not delete."""
        return {f"paths.{name}": path for name, path in vars(self).items()
                if name not in leaving_out}  # fmt: skip


@dataclass
class Config:
    seed: int = key(1234, ge=0, lt=SEED_LIMIT, note="what torch, numpy and sentencepiece seed")
    experiment_name: str = key("default", nonempty=True)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def validate(self) -> None:
        """Each key held to its domain, each section's own checks, then those that read two
        sections."""
        check_domains(self, "")
        for name in ("data", "model", "train", "runtime", "eval", "logger", "paths"):
            getattr(self, name).validate(name)
        t, e = self.train, self.eval
        _check(
            t.max_steps > 0 or t.max_epochs > 0,
            "train.max_steps",
            "set train.max_steps or train.max_epochs (both are -1: no limit)",
        )
        _check(
            bool(e.checkpoint) or t.save_top_k == -1 or t.save_top_k >= e.average,
            "train.save_top_k",
            f"keeps {t.save_top_k} checkpoints, fewer than the eval.average={e.average} that the "
            f"evaluate stage averages: set it to -1 or >= {e.average}, or lower eval.average",
        )
        _check_eval_splits(self)


# The host knobs (RuntimeConfig) that older records hold under `train.`
RUNTIME_KEYS = tuple(f.name for f in fields(RuntimeConfig))


def validate(cfg: Config) -> Config:
    """Reject impossible combinations before any compute is spent."""
    cfg.validate()
    return cfg


def _check_eval_splits(cfg: Config) -> None:
    """Resolve eval.splits=None to the val split and every test split; refuse a list that
    leaves a test split out (it would go unscored) or names a split the corpus lacks."""
    d, e = cfg.data, cfg.eval
    if e.splits is None:
        e.splits = [d.val_split, *d.test_splits]
    unscored = [split for split in d.test_splits if split not in e.splits]
    _check(
        not unscored,
        "eval.splits",
        f"{e.splits} leaves out {unscored} of data.test_splits: every configured test split is "
        "evaluated; add it to eval.splits, or set eval.splits to null (the val split and every "
        "test split)",
    )
    known = [d.train_split, d.val_split, *d.test_splits]
    unknown = [split for split in e.splits if split not in known]
    _check(
        not unknown,
        "eval.splits",
        f"{unknown} not among the corpus's splits {known}: list a test split in "
        "data.test_splits (eval.splits=null then evaluates it too)",
    )
    _check(bool(e.splits), "eval.splits", "must name at least one split")
