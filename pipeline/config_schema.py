"""What a configuration holds and what makes one valid: a dataclass per section of `conf/`,
each with the checks of its own values (`validate(prefix)`, naming the key it refuses), and
`validate`, which runs them all and the checks that read two sections.

`pipeline.config` reads files and Hydra compositions into these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

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


def _check(condition: bool, key: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"config key '{key}': {message}")


def _check_one_of(value: str, choices, key: str) -> None:
    _check(value in choices, key, f"must be one of {sorted(choices)}, got '{value}'")


@dataclass
class FilterConfig:
    """Length/ratio filter applied to training pairs (whitespace tokens)."""

    min_words: int = 1
    max_words: int = 100
    max_ratio: float = 3.0  # max(len_src, len_tgt) / min(...)
    apply_to: list[str] = field(default_factory=lambda: ["train"])

    def validate(self, prefix: str) -> None:
        _check(self.max_ratio >= 1.0, f"{prefix}.max_ratio", "must be >= 1")


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

    def validate(self, prefix: str) -> None:
        _check(
            self.model_type in TOKENIZER_MODEL_TYPES,
            f"{prefix}.model_type",
            f"must be one of {', '.join(TOKENIZER_MODEL_TYPES)}, got '{self.model_type}'",
        )
        _check(
            self.pretokenizer in PRETOKENIZERS,
            f"{prefix}.pretokenizer",
            f"must be one of {', '.join(PRETOKENIZERS)}, got '{self.pretokenizer}'",
        )
        special = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        _check(len(set(special)) == 4, prefix, "pad/unk/bos/eos ids must be distinct")
        _check(self.vocab_size > len(special), f"{prefix}.vocab_size", "too small")


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

    def validate(self, prefix: str) -> None:
        _check(
            self.source in ("multi30k", "text", "hf"),
            f"{prefix}.source",
            "must be multi30k, text or hf",
        )
        _check(
            self.src_lang != self.tgt_lang,
            f"{prefix}.tgt_lang",
            f"must differ from {prefix}.src_lang",
        )
        for name in self.allow_unverified:
            _check(
                isinstance(name, str) and name.endswith(".gz") and name.count(".") >= 2
                and "/" not in name,
                f"{prefix}.allow_unverified",
                f"names downloaded files as {{split}}.{{lang}}.gz (e.g. test_2016_flickr.cs.gz), "
                f"got {name!r}",
            )  # fmt: skip
        self.tokenizer.validate(f"{prefix}.tokenizer")
        self.filter.validate(f"{prefix}.filter")


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

    def validate(self, prefix: str) -> None:
        _check(self.d_model > 0, f"{prefix}.d_model", f"must be positive, got {self.d_model}")
        _check(self.heads > 0, f"{prefix}.heads", f"must be positive, got {self.heads}")
        _check(
            self.d_model % self.heads == 0,
            f"{prefix}.heads",
            f"{self.heads} heads do not divide {prefix}.d_model={self.d_model} (d_k = d_model / "
            "heads must be an integer); pick a divisor of d_model",
        )
        _check(self.encoder_layers >= 1, f"{prefix}.encoder_layers", "must be >= 1")
        _check(self.decoder_layers >= 1, f"{prefix}.decoder_layers", "must be >= 1")
        _check(self.d_ff > 0, f"{prefix}.d_ff", "must be positive")
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, key)
            _check(0.0 <= value < 1.0, f"{prefix}.{key}", f"must be in [0, 1), got {value}")
        _check(
            self.positional in ("sinusoidal", "learned"),
            f"{prefix}.positional",
            f"must be 'sinusoidal' or 'learned', got '{self.positional}'",
        )
        _check(self.max_positions > 0, f"{prefix}.max_positions", "must be positive")
        _check_one_of(self.init, INITS, f"{prefix}.init")


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

    def validate(self, prefix: str) -> None:
        _check(
            0.0 <= self.label_smoothing < 1.0,
            f"{prefix}.label_smoothing",
            f"must be in [0, 1), got {self.label_smoothing}",
        )
        _check(self.max_tokens > 0, f"{prefix}.max_tokens", "must be positive")
        _check_one_of(self.batch_budget, BATCH_BUDGETS, f"{prefix}.batch_budget")
        _check(self.warmup_steps > 0, f"{prefix}.warmup_steps", "must be positive")
        _check(self.lr_factor > 0, f"{prefix}.lr_factor", "must be positive")
        _check(
            self.cooldown_steps == 0 or 0 < self.cooldown_steps <= self.max_steps,
            f"{prefix}.cooldown_steps",
            f"must be 0 or in [1, {prefix}.max_steps = {self.max_steps}], got "
            f"{self.cooldown_steps}",
        )
        _check(
            len(self.adam_betas) == 2, f"{prefix}.adam_betas", "must be two numbers [beta1, beta2]"
        )
        _check(
            self.accumulate_grad_batches >= 1, f"{prefix}.accumulate_grad_batches", "must be >= 1"
        )
        _check_one_of(self.loss_normalization, LOSS_NORMALIZATIONS, f"{prefix}.loss_normalization")
        _check(
            self.max_steps > 0 or self.max_epochs > 0,
            f"{prefix}.max_steps",
            "set max_steps or max_epochs",
        )
        _check(self.val_check_interval > 0, f"{prefix}.val_check_interval", "must be positive")
        _check(
            self.progress_every > 0,
            f"{prefix}.progress_every",
            f"must be positive, got {self.progress_every}",
        )
        _check(
            self.ddp_timeout > 0,
            f"{prefix}.ddp_timeout",
            f"must be positive, got {self.ddp_timeout}",
        )
        _check(
            isinstance(self.num_nodes, int) and self.num_nodes >= 1,
            f"{prefix}.num_nodes",
            f"must be a whole number >= 1 (machines that train together), got {self.num_nodes!r}",
        )
        _check(
            self.float32_matmul_precision in ("highest", "high", "medium"),
            f"{prefix}.float32_matmul_precision",
            f"must be highest, high or medium (torch.set_float32_matmul_precision), got "
            f"{self.float32_matmul_precision!r}",
        )
        # Lightning's save_top_k: -1 keeps every validation's checkpoint, k >= 1 the newest/best
        # k; 0 keeps none (only last.ckpt), and the evaluate stage would have nothing to average.
        _check(
            self.save_top_k == -1 or self.save_top_k >= 1,
            f"{prefix}.save_top_k",
            f"must be -1 (keep every checkpoint) or >= 1 (keep the newest/best that many, for "
            f"the evaluate stage to average), got {self.save_top_k}",
        )


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

    def validate(self, prefix: str) -> None:
        _check(self.loss_chunk_rows > 0, f"{prefix}.loss_chunk_rows", "must be positive")
        for key in ("cpu_mmap_threshold_mb", "onednn_primitive_cache"):
            value = getattr(self, key)
            _check(
                value is None or value > 0,
                f"{prefix}.{key}",
                f"must be positive or null, got {value}",
            )
        _check(self.bf16_min_speedup > 0, f"{prefix}.bf16_min_speedup", "must be positive")


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

    def validate(self, prefix: str) -> None:
        _check(self.beam_size >= 1, f"{prefix}.beam_size", "must be >= 1")
        _check(
            1 <= self.nbest <= self.beam_size,
            f"{prefix}.nbest",
            f"must be in [1, {prefix}.beam_size]",
        )
        _check(self.average >= 1, f"{prefix}.average", "must be >= 1")
        # A hypothesis has at most floor(max_len_a * source tokens + max_len_b) tokens.
        for key in ("max_len_a", "max_len_b"):
            value = getattr(self, key)
            _check(
                value >= 0,
                f"{prefix}.{key}",
                f"must be >= 0, got {value} (at most {prefix}.max_len_a * source length + "
                f"{prefix}.max_len_b tokens are generated; a negative term cuts translations "
                "short)",
            )
        _check(
            self.max_len_a + self.max_len_b >= 1,
            f"{prefix}.max_len_b",
            f"{prefix}.max_len_a + {prefix}.max_len_b must be >= 1, got {self.max_len_a} + "
            f"{self.max_len_b}: a one-token source would get an empty translation",
        )
        _check(
            self.average_by in ("last", "best"),
            f"{prefix}.average_by",
            "must be 'last' or 'best'",
        )
        _check_one_of(
            self.length_normalization, LENGTH_NORMALIZATIONS, f"{prefix}.length_normalization"
        )
        _check(
            self.bootstrap_samples == 0 or self.bootstrap_samples >= 2,
            f"{prefix}.bootstrap_samples",
            "must be 0 (no interval) or >= 2",
        )


@dataclass
class WandbConfig:
    project: str = "transformer-ablations"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    mode: str = "offline"  # offline | online | disabled; env WANDB_MODE wins (wandb's own rule)
    init_timeout: float = 30.0  # seconds before an online init falls back to offline
    log_model: bool = True  # the evaluate stage's model.ckpt + spm.model as a `model` artifact

    def validate(self, prefix: str) -> None:
        _check(
            self.mode in ("offline", "online", "disabled"),
            f"{prefix}.mode",
            "must be offline, online or disabled",
        )


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def validate(self, prefix: str) -> None:
        self.wandb.validate(f"{prefix}.wandb")


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

    def outputs(self, *leaving_out: str) -> dict[str, str]:
        """`{"paths.<name>": path}` of every stage output but those named in `leaving_out`:
        what a command replacing a folder must not delete."""
        return {f"paths.{name}": path for name, path in vars(self).items()
                if name not in leaving_out}  # fmt: skip


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

    def validate(self) -> None:
        """Each section's own checks, then those that read two sections."""
        for name in ("data", "model", "train", "runtime", "eval", "logger"):
            getattr(self, name).validate(name)
        t, e = self.train, self.eval
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
