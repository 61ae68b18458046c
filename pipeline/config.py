"""Typed, validated configuration: the one place settings are read.

`conf/` (Hydra groups) is composed into `params.yaml` by DVC (`dvc exp run -S ...`) or by
`compose()` here (sweeps, tests). Either way the result is merged into the dataclasses below,
so an unknown key or a wrongly typed value fails with the key named, and `validate()` rejects
impossible combinations (heads not dividing d_model, ...) before any compute is spent.
Nothing below this module reads files or the environment for settings, with one documented
exception: `MULTI30K_DIR` overrides `data.raw_dir` (applied in `load`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pipeline.data.budget import BATCH_BUDGETS
from pipeline.errors import ConfigError
from pipeline.model.length_penalty import LENGTH_NORMALIZATIONS

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RAW_DIR_ENV = "MULTI30K_DIR"
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


@dataclass
class FilterConfig:
    """Length/ratio filter applied to training pairs (whitespace tokens)."""

    min_words: int = 1
    max_words: int = 100
    max_ratio: float = 3.0  # max(len_src, len_tgt) / min(...)
    apply_to: list[str] = field(default_factory=lambda: ["train"])


@dataclass
class TokenizerConfig:
    """Joint subword model (sentencepiece) trained on the training split only."""

    # bpe | unigram: sentencepiece subwords learned here; word: one id per whitespace-separated
    # unit of text segmented elsewhere; subword_nmt: subword-nmt's joint BPE learned here, as
    # the Multi30k dataset's task1-bpe.sh does, one id per piece
    model_type: str = "bpe"
    # pieces in the vocabulary, specials included; subword_nmt: merges learned (its -s), the
    # vocabulary is then every piece of the segmented training text
    vocab_size: int = 8000
    character_coverage: float = 1.0
    case_fold: bool = False  # lowercase everything the model reads and writes (NFKC + fold)
    source_eos: bool = False  # every source sentence ends with eos, as fairseq encodes it
    # none | moses: Moses-tokenize the text before the subword model, detokenize after decoding
    pretokenizer: str = "none"
    # Fixed special ids, shared by tokenizer, model and decoding.
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3


@dataclass
class DataConfig:
    name: str = "multi30k"
    source: str = "multi30k"  # multi30k | text | hf
    src_lang: str = "en"
    tgt_lang: str = "de"
    raw_dir: str = "../shared/data/multi30k"  # env MULTI30K_DIR overrides
    download: bool = True  # fetch from `url` when raw_dir has no copy
    url: str = ""
    sha256: dict[str, str] = field(default_factory=dict)  # file name -> checksum
    # Downloaded file names ({split}.{lang}.gz) accepted without a checksum in `sha256`, each
    # named on purpose; any other file without one is refused.
    allow_unverified: list[str] = field(default_factory=list)
    train_split: str = "train"
    val_split: str = "val"
    test_splits: list[str] = field(default_factory=lambda: ["test_2016_flickr"])
    # source=text: {split: {src: path, tgt: path}}
    text_files: dict[str, dict[str, str]] = field(default_factory=dict)
    # source=hf: datasets.load_dataset(hf_path, hf_name) with a `translation` column
    hf_path: str = ""
    hf_name: Optional[str] = None
    max_train_pairs: Optional[int] = None  # first N training pairs (smoke runs)
    filter: FilterConfig = field(default_factory=FilterConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)


@dataclass
class ModelConfig:
    """The encoder-decoder of section 3; each Table 3 ablation axis is one field."""

    d_model: int = 512
    heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1  # P_drop: embeddings+positions and every sublayer output
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # inside the FFN, after the ReLU
    positional: str = "sinusoidal"  # sinusoidal | learned
    max_positions: int = 256  # learned table size; also the decode length cap
    norm_first: bool = False  # post-norm as in the paper; pre-norm as an option
    tie_embeddings: bool = True  # source, target and output embeddings share one matrix
    fused_attention: bool = True  # F.scaled_dot_product_attention fast path
    # xavier: every matrix Xavier-uniform, biases zero; fairseq: as fairseq 0.12 (the FFN and
    # the q/k/v biases keep nn.Linear's default; pipeline.model.transformer)
    init: str = "xavier"


@dataclass
class TrainConfig:
    max_steps: int = 8000
    max_epochs: int = -1
    max_tokens: int = 4096  # per batch, padded source + target tokens (see batch_budget)
    # How a batch is held to max_tokens: "sum", B * (max_src + max_tgt); "max", B * max(max_src,
    # max_tgt) as fairseq's --max-tokens (pipeline.data.budget)
    batch_budget: str = "sum"
    accumulate_grad_batches: int = 1
    # An update's loss: "batch", the mean of its batches' per-token losses; "update", its summed
    # loss over all its target tokens (every batch and rank) by their number, as fairseq's
    loss_normalization: str = "batch"
    lr_factor: float = 1.0  # lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)
    warmup_steps: int = 4000
    # The last cooldown_steps of max_steps scale that lr down linearly to 0 (0: eq. 3 alone)
    cooldown_steps: int = 0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    gradient_clip_val: float = 0.0  # 0 disables clipping
    val_check_interval: int = 500  # optimizer steps between validations
    val_bleu: bool = True  # greedy-decode the validation set for val/bleu
    val_bleu_max_sentences: Optional[int] = None  # None: the whole split
    accelerator: str = "auto"
    devices: Any = "auto"  # int, list or "auto"
    num_nodes: int = 1
    strategy: str = "auto"  # auto picks DDP when more than one device
    # Seconds a DDP rank waits in a collective for the others before the job fails (a dead or
    # hung rank ends the job instead of stalling it); keep above the longest one-rank pause
    # (a checkpoint write, logger.wandb.init_timeout).
    ddp_timeout: float = 1800.0
    precision: str = "auto"  # auto: bf16-mixed where it is faster (training.precision)
    num_workers: int = 0
    save_top_k: int = 10  # best checkpoints by val/bleu, kept for averaging
    early_stopping_patience: Optional[int] = None  # validations without val/bleu improving
    resume: bool = True
    compile: bool = False
    float32_matmul_precision: str = "highest"  # GPU: torch.set_float32_matmul_precision
    log_every_n_steps: int = 50
    progress_bar: bool = True  # the console's progress (pipeline.training.progress)
    progress_every: int = 100  # without a terminal: a progress line every this many steps
    deterministic: bool = False


@dataclass
class RuntimeConfig:
    """How fast and where the recipe runs on this host, not what it learns: kept apart from
    `train` so a recipe reads the same on every machine."""

    bf16_min_speedup: float = 1.1  # precision auto on a CPU: bf16 matmuls must be this much faster
    loss_chunk_rows: int = 256  # target tokens per chunk of the fused output layer + loss
    compile_loss: bool = True  # each chunk's softmax + loss + gradient as one compiled function
    cpu_speed_paths: bool = True  # CPU-only speed paths (pipeline.kernels); false: generic
    # CPU only (pipeline.training.cpu_memory): heap-allocate activations up to this many MiB
    # and never trim the heap; cache this many oneDNN kernels. None keeps the defaults.
    cpu_mmap_threshold_mb: Optional[int] = 32
    onednn_primitive_cache: Optional[int] = 16384


@dataclass
class EvalConfig:
    beam_size: int = 5
    length_penalty: float = 1.0  # alpha of length_normalization
    # gnmt: log P / ((5 + |Y|) / 6) ** alpha; fairseq: log P / |Y| ** alpha (its --lenpen)
    length_normalization: str = "gnmt"
    max_len_a: float = 1.2  # max output length = a * src_len + b
    max_len_b: int = 10
    nbest: int = 1
    max_tokens: int = 8192  # source tokens per decoding batch
    average: int = 10  # average the last N (or best N) checkpoints; 1 = no averaging
    average_by: str = "last"  # last | best
    checkpoint: Optional[str] = None  # explicit checkpoint; None = the train stage's
    # The splits to translate and score; None: the val split and every data.test_splits. A
    # list must hold every test split: a configured test set is never silently left out.
    splits: Optional[list[str]] = None
    heatmaps: int = 3  # cross-attention heatmap PNGs (layers x heads grid)
    samples: int = 20  # rows in the W&B table of sample translations
    # Resamples of each split for the 95% bootstrap half-width of lowercased BLEU (0: none)
    bootstrap_samples: int = 1000


@dataclass
class WandbConfig:
    project: str = "transformer-ablations"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    mode: str = "offline"  # offline | online | disabled; env WANDB_MODE wins (wandb's own rule)
    init_timeout: float = 30.0  # seconds before an online init falls back to offline
    log_model: bool = True  # the evaluate stage's model.ckpt + spm.model as a `model` artifact


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class PathsConfig:
    """Where stages write; DVC declares each of these as an output."""

    prepared: str = "data/prepared"
    tokenized: str = "data/tokenized"
    train_dir: str = "models/train"
    eval_dir: str = "eval"
    metrics_dir: str = "metrics"
    plots_dir: str = "plots"
    wandb_dir: str = "wandb_runs"
    # The check stage's record of the raw corpus (SHA-256 per file): the prepare stage's input
    corpus_record: str = "data/corpus.json"


@dataclass
class Config:
    seed: int = 1234
    experiment_name: str = "default"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)


# The host knobs (RuntimeConfig) that older records hold under `train.`
RUNTIME_KEYS = tuple(f.name for f in fields(RuntimeConfig))


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': {message}")


def _check_one_of(value: str, choices, key: str) -> None:
    _check(value in choices, key, f"must be one of {sorted(choices)}, got '{value}'")


def validate(cfg: Config) -> Config:
    """Reject impossible combinations before any compute is spent."""
    m, t, d, e, r = cfg.model, cfg.train, cfg.data, cfg.eval, cfg.runtime
    _check(m.d_model > 0, "model.d_model", f"must be positive, got {m.d_model}")
    _check(m.heads > 0, "model.heads", f"must be positive, got {m.heads}")
    _check(
        m.d_model % m.heads == 0,
        "model.heads",
        f"{m.heads} heads do not divide model.d_model={m.d_model} (d_k = d_model / heads "
        "must be an integer); pick a divisor of d_model",
    )
    _check(m.encoder_layers >= 1, "model.encoder_layers", "must be >= 1")
    _check(m.decoder_layers >= 1, "model.decoder_layers", "must be >= 1")
    _check(m.d_ff > 0, "model.d_ff", "must be positive")
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        value = getattr(m, key)
        _check(0.0 <= value < 1.0, f"model.{key}", f"must be in [0, 1), got {value}")
    _check(
        m.positional in ("sinusoidal", "learned"),
        "model.positional",
        f"must be 'sinusoidal' or 'learned', got '{m.positional}'",
    )
    _check(m.max_positions > 0, "model.max_positions", "must be positive")
    _check_one_of(m.init, INITS, "model.init")
    _check(
        0.0 <= t.label_smoothing < 1.0,
        "train.label_smoothing",
        f"must be in [0, 1), got {t.label_smoothing}",
    )
    _check(t.max_tokens > 0, "train.max_tokens", "must be positive")
    _check_one_of(t.batch_budget, BATCH_BUDGETS, "train.batch_budget")
    _check(r.loss_chunk_rows > 0, "runtime.loss_chunk_rows", "must be positive")
    for key in ("cpu_mmap_threshold_mb", "onednn_primitive_cache"):
        value = getattr(r, key)
        _check(
            value is None or value > 0, f"runtime.{key}", f"must be positive or null, got {value}"
        )
    _check(t.warmup_steps > 0, "train.warmup_steps", "must be positive")
    _check(t.lr_factor > 0, "train.lr_factor", "must be positive")
    _check(
        t.cooldown_steps == 0 or 0 < t.cooldown_steps <= t.max_steps,
        "train.cooldown_steps",
        f"must be 0 or in [1, train.max_steps = {t.max_steps}], got {t.cooldown_steps}",
    )
    _check(len(t.adam_betas) == 2, "train.adam_betas", "must be two numbers [beta1, beta2]")
    _check(t.accumulate_grad_batches >= 1, "train.accumulate_grad_batches", "must be >= 1")
    _check_one_of(t.loss_normalization, LOSS_NORMALIZATIONS, "train.loss_normalization")
    _check(t.max_steps > 0 or t.max_epochs > 0, "train.max_steps", "set max_steps or max_epochs")
    _check(t.val_check_interval > 0, "train.val_check_interval", "must be positive")
    _check(
        t.progress_every > 0, "train.progress_every", f"must be positive, got {t.progress_every}"
    )
    _check(r.bf16_min_speedup > 0, "runtime.bf16_min_speedup", "must be positive")
    _check(t.ddp_timeout > 0, "train.ddp_timeout", f"must be positive, got {t.ddp_timeout}")
    _check(
        isinstance(t.num_nodes, int) and t.num_nodes >= 1,
        "train.num_nodes",
        f"must be a whole number >= 1 (machines that train together), got {t.num_nodes!r}",
    )
    _check(
        t.float32_matmul_precision in ("highest", "high", "medium"),
        "train.float32_matmul_precision",
        f"must be highest, high or medium (torch.set_float32_matmul_precision), got "
        f"{t.float32_matmul_precision!r}",
    )
    # Lightning's save_top_k: -1 keeps every validation's checkpoint, k >= 1 the newest/best k;
    # 0 keeps none (only last.ckpt), and the evaluate stage would have nothing to average.
    _check(
        t.save_top_k == -1 or t.save_top_k >= 1,
        "train.save_top_k",
        f"must be -1 (keep every checkpoint) or >= 1 (keep the newest/best that many, for "
        f"the evaluate stage to average), got {t.save_top_k}",
    )
    _check(
        bool(e.checkpoint) or t.save_top_k == -1 or t.save_top_k >= e.average,
        "train.save_top_k",
        f"keeps {t.save_top_k} checkpoints, fewer than the eval.average={e.average} that the "
        f"evaluate stage averages: set it to -1 or >= {e.average}, or lower eval.average",
    )
    _check(d.source in ("multi30k", "text", "hf"), "data.source", "must be multi30k, text or hf")
    _check(d.src_lang != d.tgt_lang, "data.tgt_lang", "must differ from data.src_lang")
    for name in d.allow_unverified:
        _check(
            isinstance(name, str) and name.endswith(".gz") and name.count(".") >= 2
            and "/" not in name,
            "data.allow_unverified",
            f"names downloaded files as {{split}}.{{lang}}.gz (e.g. test_2016_flickr.cs.gz), "
            f"got {name!r}",
        )  # fmt: skip
    _check(
        d.tokenizer.model_type in TOKENIZER_MODEL_TYPES,
        "data.tokenizer.model_type",
        f"must be one of {', '.join(TOKENIZER_MODEL_TYPES)}, got '{d.tokenizer.model_type}'",
    )
    _check(
        d.tokenizer.pretokenizer in PRETOKENIZERS,
        "data.tokenizer.pretokenizer",
        f"must be one of {', '.join(PRETOKENIZERS)}, got '{d.tokenizer.pretokenizer}'",
    )
    special = [d.tokenizer.pad_id, d.tokenizer.unk_id, d.tokenizer.bos_id, d.tokenizer.eos_id]
    _check(len(set(special)) == 4, "data.tokenizer", "pad/unk/bos/eos ids must be distinct")
    _check(d.tokenizer.vocab_size > len(special), "data.tokenizer.vocab_size", "too small")
    _check(d.filter.max_ratio >= 1.0, "data.filter.max_ratio", "must be >= 1")
    _check(e.beam_size >= 1, "eval.beam_size", "must be >= 1")
    _check(1 <= e.nbest <= e.beam_size, "eval.nbest", "must be in [1, eval.beam_size]")
    _check(e.average >= 1, "eval.average", "must be >= 1")
    # A hypothesis has at most floor(max_len_a * source tokens + max_len_b) tokens.
    for key in ("max_len_a", "max_len_b"):
        value = getattr(e, key)
        _check(
            value >= 0,
            f"eval.{key}",
            f"must be >= 0, got {value} (at most eval.max_len_a * source length + "
            "eval.max_len_b tokens are generated; a negative term cuts translations short)",
        )
    _check(
        e.max_len_a + e.max_len_b >= 1,
        "eval.max_len_b",
        f"eval.max_len_a + eval.max_len_b must be >= 1, got {e.max_len_a} + {e.max_len_b}: a "
        "one-token source would get an empty translation",
    )
    _check(e.average_by in ("last", "best"), "eval.average_by", "must be 'last' or 'best'")
    _check_eval_splits(cfg)
    _check_one_of(e.length_normalization, LENGTH_NORMALIZATIONS, "eval.length_normalization")
    _check(
        e.bootstrap_samples == 0 or e.bootstrap_samples >= 2,
        "eval.bootstrap_samples",
        "must be 0 (no interval) or >= 2",
    )
    _check(
        cfg.logger.wandb.mode in ("offline", "online", "disabled"),
        "logger.wandb.mode",
        "must be offline, online or disabled",
    )
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


def with_runtime_section(raw: DictConfig | dict, origin: str = "saved config") -> DictConfig | dict:
    """`raw` in today's layout: records and checkpoints written before the host
    knobs had their own section hold them as `train.<key>`; each moves to `runtime.<key>`. A
    config holding one under both names is refused (which value ran is unknown)."""
    train = raw.get("train")
    moved = [key for key in RUNTIME_KEYS if isinstance(train, (dict, DictConfig)) and key in train]
    if not moved:
        return raw
    if isinstance(raw, DictConfig):
        raw = OmegaConf.to_container(raw, resolve=False)
        train = raw["train"]
    runtime = dict(raw.get("runtime") or {})
    for key in moved:
        if key in runtime:
            raise ConfigError(
                f"{origin}: config key 'train.{key}': set as well as 'runtime.{key}' (its "
                f"place now); keep only runtime.{key}"
            )
        runtime[key] = train[key]
    train = {key: value for key, value in train.items() if key not in moved}
    return {**raw, "train": train, "runtime": runtime}


def _to_config(raw: DictConfig | dict, origin: str) -> Config:
    schema = OmegaConf.structured(Config)
    raw = with_runtime_section(raw, origin)
    try:
        merged = OmegaConf.merge(schema, raw)
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or "?"
        first_line = str(err.msg).splitlines()[0]
        raise ConfigError(f"{origin}: config key '{key}': {first_line}") from None
    return cfg


def leaves(tree, prefix: str) -> dict:
    """{"model.heads": 4, ...}: the leaf values of the (dict) subtree at dotted `prefix`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    found = {}
    for key, value in tree.items():
        found.update(leaves(value, f"{prefix}.{key}"))
    return found


def subtree(tree: dict, dotted: str):
    """tree["model"]["heads"] for "model.heads" (None where a part is missing)."""
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def load(path: str | os.PathLike = "params.yaml") -> Config:
    """Read a composed params file (what DVC stages see) into a validated Config."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            f"{path} not found: run from the repository root, or compose one with "
            "`python -m pipeline.config > params.yaml`"
        )
    raw = OmegaConf.load(path)
    return finalize(_to_config(raw, str(path)))


def compose(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> Config:
    """Compose conf/ with Hydra overrides (`model.heads=4`, `experiment=smoke`)."""
    return finalize(_to_config(compose_dict(overrides, config_dir), str(config_dir)))


def compose_dict(overrides: list[str] | None = None, config_dir: Path = CONF_DIR) -> DictConfig:
    """The raw composed DictConfig: what DVC writes into params.yaml."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(str(Path(config_dir).resolve()), version_base=None):
            return hydra_compose("config", overrides=list(overrides or []))
    except HydraException as err:
        raise ConfigError(f"{config_dir}: {err}") from None


def finalize(cfg: Config) -> Config:
    """Apply the documented environment override, then validate."""
    env_dir = os.environ.get(RAW_DIR_ENV)
    if env_dir:
        cfg.data.raw_dir = env_dir
    return validate(cfg)


def to_dict(cfg: Config) -> dict:
    """Plain dict of the resolved config (for W&B, checkpoints, reports)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def from_dict(raw: dict) -> Config:
    """Rebuild a Config saved by `to_dict` (checkpoints, sweep trials)."""
    return validate(_to_config(OmegaConf.create(raw), "saved config"))


def cli(argv: list[str] | None = None) -> None:
    """Print the composed config as YAML (what `make params` writes to params.yaml), after
    validating it as the stages will: a bad value exits 2 naming the key, printing nothing."""
    import sys

    from pipeline.cli import parser

    cli_parser = parser(
        "pipeline.config",
        "Compose conf/ with Hydra overrides, validate it, and print it as YAML.",
        epilog="example: python -m pipeline.config experiment=smoke model.heads=4 -o params.yaml",
    )
    cli_parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE",
        help="Hydra overrides: model.heads=4, experiment=smoke, ~experiment",
    )  # fmt: skip
    cli_parser.add_argument(
        "-o", "--output", type=Path,
        help="write the YAML there (atomically: a refused config leaves the old file as it "
        "was, which `> params.yaml` would empty) instead of to stdout",
    )  # fmt: skip
    args = cli_parser.parse_args(argv)
    if args.output is not None:  # the one writer of params files, which says what it wrote
        from pipeline import params

        print(params.write(args.overrides, args.output), file=sys.stderr)
        return
    raw = compose_dict(args.overrides)
    finalize(_to_config(raw, f"{CONF_DIR} with {' '.join(args.overrides) or 'no overrides'}"))
    sys.stdout.write(OmegaConf.to_yaml(raw))


def console() -> None:
    """The `transformer-config` command (pyproject.toml)."""
    from pipeline.cli import main

    main(cli)


if __name__ == "__main__":  # python -m pipeline.config [overrides...] -o params.yaml
    console()
