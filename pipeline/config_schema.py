"""What a configuration holds and what makes one valid: a pydantic dataclass per section of
`conf/`, every key with its type, domain (range, choices, pattern), default and meaning, and
the checks that read two keys as model validators.

These classes hold every default: `conf/` holds only what a recipe changes. A value no stage
could use (a negative seed, a zero logging interval) is refused by the check stage, before DVC
deletes the last run's outputs; `pipeline.config` turns pydantic's refusal into a ConfigError
naming the key. Assigning to a key of a validated config validates the new value (a sweep
trial sets its paths and precision so). `pipeline.config_reference` derives the JSON Schema of
params.yaml and the reference table of docs/configuration.md from these classes.
"""

import dataclasses
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, Strict, ValidationError, model_validator
from pydantic.dataclasses import dataclass

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
NO_STEP_LIMIT = -1  # train.max_steps (Lightning's convention): train.max_epochs ends the run

# Unknown keys are refused; a number is finite; assigning to a key validates the value.
SECTION = ConfigDict(extra="forbid", allow_inf_nan=False, validate_assignment=True)
WHY = "why"  # a Field's json_schema_extra entry: said with a refusal of the key


# Strict types: YAML's `true` is no number and `"8"` no integer; an int is a float.
def Int(**domain: Any) -> Any:
    return Annotated[int, Strict(), Field(**domain)]


def Float(**domain: Any) -> Any:
    return Annotated[float, Strict(), Field(**domain)]


def Str(pattern: str | None = None, **domain: Any) -> Any:
    """A string; `pattern` must match it whole."""
    return Annotated[str, Strict(), Field(pattern=pattern and f"^{pattern}$", **domain)]


Bool = Annotated[bool, Strict()]
Name = Str(NAME_PATTERN)
Text = Str(min_length=1)  # a non-empty string


def Special(value: int, meaning: str) -> Any:
    """The integer `value` (not a float equal to it) with a meaning outside a key's range."""
    return Int(ge=value, le=value, description=meaning)


def key(default: Any = None, meaning: str = "", *, factory: Any = None, why: str = "") -> Any:
    """A key's default (or `factory` for a list or mapping) and meaning (the docs' table);
    `why`: the reason for its domain, said when a value is refused."""
    extra = {WHY: why} if why else None
    if factory is not None:
        return Field(default_factory=factory, description=meaning, json_schema_extra=extra)
    return Field(default=default, description=meaning, json_schema_extra=extra)


def refuse(key_name: str, message: str) -> ConfigError:
    return ConfigError(f"config key '{key_name}': {message}", key=key_name)


SECTIONS: dict[type, str] = {}  # each section's class -> its dotted place (filled below)


def section(cls: type) -> type:
    """`cls` as a pydantic dataclass of SECTION's rules, whose assignments that the schema
    refuses raise a ConfigError naming the key (as a refusal at load does)."""
    cls = dataclass(config=SECTION)(cls)
    validated_setattr = cls.__setattr__

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            validated_setattr(self, name, value)
        except ValidationError as err:
            raise _refused_value(type(self), name, value, err) from None

    cls.__setattr__ = __setattr__
    return cls


def changed(settings: Any, **values: Any) -> Any:
    """A copy of the section `settings` with `values` (a command's `--beam 3` over
    `eval.beam_size`), held to the schema: a value outside its key's domain raises the
    ConfigError naming the dotted key, as at load."""
    try:
        return dataclasses.replace(settings, **values)
    except ValidationError as err:
        first = err.errors()[0]
        name = ".".join(map(str, first["loc"]))
        raise _refused_value(type(settings), name, first.get("input"), err) from None


def _refused_value(cls: type, name: str, value: Any, err: ValidationError) -> ConfigError:
    where = f"{SECTIONS.get(cls, '')}.{name}".lstrip(".")
    return refuse(where, f"must be valid for it, got {value!r} ({err.errors()[0]['msg']})")


@section
class FilterConfig:
    """Length/ratio filter applied to training pairs (whitespace tokens)."""

    min_words: Int(ge=1) = key(1, "fewest words of either side", why="a pair with an empty side is no translation")  # fmt: skip
    max_words: Int(ge=1) = key(100, "most words of either side")
    max_ratio: Float(ge=1.0) = key(3.0, "max(len_src, len_tgt) / min(len_src, len_tgt)")
    apply_to: list[Name] = key(meaning="splits filtered", factory=lambda: ["train"])

    @model_validator(mode="after")
    def _words(self) -> "FilterConfig":
        if self.min_words > self.max_words:
            raise refuse("data.filter.min_words", f"must be <= data.filter.max_words = "
                         f"{self.max_words}, got {self.min_words}: every pair would be dropped")  # fmt: skip
        return self


@section
class LimitsConfig:
    """Bounds on what the corpus and its download may cost: a gzip bomb or a trickling server
    is refused naming the file or URL instead of filling memory or waiting for ever."""

    max_file_mb: Float(gt=0.0) = key(64.0, "decompressed MiB of one corpus file (the largest Multi30k file holds under 4)")  # fmt: skip
    max_line_bytes: Int(gt=0) = key(65536, "decompressed bytes of one line")
    download_read_timeout_s: Float(gt=0.0) = key(60.0, "seconds one network read may wait")
    download_deadline_s: Float(gt=0.0) = key(900.0, "seconds a whole file's download may take")
    download_min_rate_kb_s: Float(ge=0.0) = key(8.0, "average KiB/s a download must keep after the grace period")  # fmt: skip
    download_grace_s: Float(ge=0.0) = key(30.0, "seconds before the rate is measured")

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * (1 << 20))


@section
class TokenizerConfig:
    """Joint subword model trained on the training split only."""

    model_type: Literal[TOKENIZER_MODEL_TYPES] = key("bpe", "bpe, unigram: sentencepiece subwords; word: one id per whitespace-separated unit; subword_nmt: subword-nmt's joint BPE, one id per piece")  # fmt: skip
    vocab_size: Int(ge=5, le=MAX_VOCAB_SIZE) = key(8000, "pieces in the vocabulary, specials included; subword_nmt: merges learned", why="more than the 4 special ids")  # fmt: skip
    character_coverage: Float(ge=0.98, le=1.0) = key(1.0, "sentencepiece's character coverage")
    case_fold: Bool = key(False, "the model reads and writes lowercase (NFKC + fold)")
    source_eos: Bool = key(False, "every source sentence ends with eos, as fairseq encodes it")
    pretokenizer: Literal[PRETOKENIZERS] = key("none", "moses: Moses-tokenize before the subword model, detokenize after decoding")  # fmt: skip
    pad_id: Int(ge=0) = key(0, "padding id")
    unk_id: Int(ge=0) = key(1, "unknown-piece id")
    bos_id: Int(ge=0) = key(2, "beginning-of-sentence id")
    eos_id: Int(ge=0) = key(3, "end-of-sentence id")

    @model_validator(mode="after")
    def _specials(self) -> "TokenizerConfig":
        special = [self.pad_id, self.unk_id, self.bos_id, self.eos_id]
        if len(set(special)) != 4:
            raise refuse("data.tokenizer", "pad/unk/bos/eos ids must be distinct")
        if max(special) >= self.vocab_size:
            raise refuse("data.tokenizer", f"pad/unk/bos/eos ids must be below vocab_size = "
                         f"{self.vocab_size}, got {special}")  # fmt: skip
        return self


@section
class DataConfig:
    name: Text = key("multi30k", "the corpus's name")
    source: Literal["multi30k", "text", "hf"] = key("multi30k", "where the pairs come from")
    src_lang: Name = key("en", "source language")
    tgt_lang: Name = key("de", "target language")
    raw_dir: Text = key("../shared/data/multi30k", "the raw corpus (env MULTI30K_DIR overrides)")
    download: Bool = key(True, "fetch from url when raw_dir has no copy")
    url: Str() = key("", "where <split>.<lang>.gz is fetched from (https)")
    allow_unverified: list[Str(rf"{NAME_PATTERN}\.{NAME_PATTERN}\.gz")] = key(
        meaning="downloaded files ({split}.{lang}.gz) accepted without a checksum",
        factory=list, why="names downloaded files as {split}.{lang}.gz, e.g. test_2016_flickr.cs.gz",
    )  # fmt: skip
    sha256: dict[Str(), Str("[0-9a-f]{64}")] = key(meaning="file name -> SHA-256", factory=dict)
    train_split: Name = key("train", "the training split")
    val_split: Name = key("val", "the validation split")
    test_splits: list[Name] = key(meaning="the test splits", factory=lambda: ["test_2016_flickr"])
    text_files: dict[Name, dict[Literal["src", "tgt"], Text]] = key(
        meaning="source=text: {split: {src: path, tgt: path}}", factory=dict)  # fmt: skip
    hf_path: Str() = key("", "source=hf: datasets.load_dataset's path")
    hf_name: Optional[Text] = key(None, "source=hf: datasets.load_dataset's name")
    max_train_pairs: Optional[Int(ge=1)] = key(None, "first N training pairs; null: all")
    filter: FilterConfig = Field(default_factory=FilterConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)

    @model_validator(mode="after")
    def _languages(self) -> "DataConfig":
        if self.src_lang == self.tgt_lang:
            raise refuse("data.tgt_lang", "must differ from data.src_lang")
        return self


@section
class ModelConfig:
    """The encoder-decoder of section 3; each Table 3 ablation axis is one key."""

    d_model: Int(ge=1) = key(512, "model width")
    heads: Int(ge=1) = key(8, "attention heads")
    head_dim: Optional[Int(ge=1)] = key(None, "d_k = d_v of every head; null: d_model / heads")
    encoder_layers: Int(ge=1) = key(6, "encoder layers")
    decoder_layers: Int(ge=1) = key(6, "decoder layers")
    d_ff: Int(ge=1) = key(2048, "inner width of the feed-forward sublayers")
    dropout: Float(ge=0.0, lt=1.0) = key(0.1, "P_drop: embeddings + positions and every sublayer output")  # fmt: skip
    attention_dropout: Float(ge=0.0, lt=1.0) = key(0.0, "on the attention weights")
    activation_dropout: Float(ge=0.0, lt=1.0) = key(0.0, "inside the FFN, after the ReLU")
    positional: Literal["sinusoidal", "learned"] = key("sinusoidal", "positional encoding")
    max_positions: Int(ge=1) = key(256, "learned table size; also the decode length cap")
    norm_first: Bool = key(False, "pre-norm (post-norm as in the paper)")
    tie_embeddings: Bool = key(True, "source, target and output embeddings share one matrix")
    fused_attention: Bool = key(True, "F.scaled_dot_product_attention fast path")
    init: Literal[INITS] = key("xavier", "xavier: every matrix Xavier-uniform, biases zero; fairseq: fairseq 0.12's")  # fmt: skip

    @model_validator(mode="after")
    def _heads(self) -> "ModelConfig":
        if self.head_dim is None and self.d_model % self.heads:
            raise refuse("model.heads", f"{self.heads} heads do not divide model.d_model="
                         f"{self.d_model} (d_k = d_model / heads must be an integer); pick a "
                         "divisor of d_model or set model.head_dim")  # fmt: skip
        return self


@section
class TrainConfig:
    max_steps: Union[Special(-1, "no limit: max_epochs"), Int(ge=1)] = key(8000, "optimizer steps; -1: no limit (max_epochs)")  # fmt: skip
    max_epochs: Union[Special(-1, "no limit: max_steps"), Int(ge=1)] = key(
        -1, "epochs; -1: no limit (max_steps)"
    )
    max_tokens: Int(ge=1) = key(4096, "padded source + target tokens per batch (see batch_budget)")  # fmt: skip
    batch_budget: Literal[tuple(BATCH_BUDGETS)] = key("sum", "sum: B * (max_src + max_tgt); max: B * max(max_src, max_tgt), fairseq's --max-tokens")  # fmt: skip
    accumulate_grad_batches: Int(ge=1) = key(1, "batches per optimizer step")
    loss_normalization: Literal[LOSS_NORMALIZATIONS] = key("batch", "batch: the mean of the batches' per-token losses; update: the summed loss over all the update's target tokens (fairseq's)")  # fmt: skip
    lr_factor: Float(gt=0.0) = key(2.0, "lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)")  # fmt: skip
    warmup_steps: Int(ge=1) = key(4000, "linear warm-up steps")
    cooldown_steps: Int(ge=0) = key(0, "the last steps of max_steps scale the lr down linearly to 0 (0: equation 3 alone)")  # fmt: skip
    adam_betas: Annotated[list[Float(ge=0.0, lt=1.0)], Field(min_length=2, max_length=2)] = key(
        meaning="Adam's (beta1, beta2)", factory=lambda: [0.9, 0.98])  # fmt: skip
    adam_eps: Float(gt=0.0) = key(1e-9, "Adam's epsilon")
    weight_decay: Float(ge=0.0) = key(0.0, "AdamW weight decay")
    label_smoothing: Float(ge=0.0, lt=1.0) = key(0.1, "label smoothing epsilon")
    gradient_clip_val: Float(ge=0.0) = key(0.0, "gradient norm clip; 0 disables clipping")
    val_check_interval: Int(ge=1) = key(500, "optimizer steps between validations")
    val_bleu: Bool = key(True, "greedy-decode the validation set for val/greedy_bleu")
    val_bleu_max_sentences: Optional[Int(ge=1)] = key(None, "sentences decoded for val/greedy_bleu; null: the whole split")  # fmt: skip
    accelerator: Literal[ACCELERATORS] = key("auto", "Lightning's accelerator")
    devices: Union[Literal["auto"], Special(-1, "every device"), Int(ge=1), list[Int(ge=0)]] = key(
        "auto", "auto, -1 (every device), a number of devices or a list of device indices")  # fmt: skip
    num_nodes: Int(ge=1) = key(1, "machines that train together")
    strategy: Text = key("auto", "Lightning's strategy; auto picks DDP when more than one device")  # fmt: skip
    ddp_timeout: Float(gt=0.0) = key(1800.0, "seconds a DDP rank waits in a collective for the others")  # fmt: skip
    precision: Literal[PRECISIONS] = key("auto", "auto: bf16-mixed where it is faster")
    num_workers: Int(ge=0) = key(0, "data loader worker processes")
    save_top_k: Union[Special(-1, "keep every checkpoint"), Int(ge=1)] = key(
        10, "best checkpoints by val/greedy_bleu kept for averaging; -1: every checkpoint",
        why="the newest/best that many, for the evaluate stage to average")  # fmt: skip
    early_stopping_patience: Optional[Int(ge=1)] = key(None, "validations without improvement before stopping; null: never")  # fmt: skip
    resume: Bool = key(True, "resume the stage's own last checkpoint")
    compile: Bool = key(False, "torch.compile the model")
    float32_matmul_precision: Literal["highest", "high", "medium"] = key("high", "GPU: torch.set_float32_matmul_precision (high: TF32 tensor cores)")  # fmt: skip
    log_every_n_steps: Int(ge=1) = key(50, "steps between logged training metrics")
    progress_bar: Bool = key(True, "the console's progress")
    progress_every: Int(ge=1) = key(100, "without a terminal: a progress line every this many steps")  # fmt: skip
    deterministic: Bool = key(False, "deterministic algorithms only")

    @model_validator(mode="after")
    def _cooldown(self) -> "TrainConfig":
        if self.cooldown_steps and self.cooldown_steps > self.max_steps:
            raise refuse("train.cooldown_steps", "must be 0 or in [1, train.max_steps = "
                         f"{self.max_steps}], got {self.cooldown_steps}")  # fmt: skip
        return self


@section
class RuntimeConfig:
    """How fast and where the recipe runs on this host, not what it learns: kept apart from
    `train` so a recipe reads the same on every machine."""

    bf16_min_speedup: Float(gt=0.0) = key(1.1, "precision auto on a CPU: bf16 matmuls must be this much faster")  # fmt: skip
    loss_chunk_rows: Int(ge=1) = key(256, "target tokens per chunk of the fused output layer + loss")  # fmt: skip
    compile_loss: Bool = key(True, "each chunk's softmax + loss + gradient as one compiled function")  # fmt: skip
    cpu_speed_paths: Bool = key(True, "CPU-only speed paths (pipeline.kernels); false: generic")
    cpu_mmap_threshold_mb: Optional[Int(ge=1)] = key(32, "CPU: heap-allocate activations up to this many MiB; null: the C library's default")  # fmt: skip
    onednn_primitive_cache: Optional[Int(ge=1, le=C_INT_MAX)] = key(16384, "CPU: oneDNN kernels cached; null: oneDNN's default")  # fmt: skip


@section
class EvalConfig:
    beam_size: Int(ge=1) = key(5, "beam width")
    length_penalty: Float(ge=0.0) = key(1.0, "alpha of length_normalization (0: none)")
    length_normalization: Literal[tuple(LENGTH_NORMALIZATIONS)] = key("gnmt", "gnmt: log P / ((5 + |Y|) / 6) ** alpha; fairseq: log P / |Y| ** alpha")  # fmt: skip
    max_len_a: Float(ge=0.0) = key(1.2, "a hypothesis has at most max_len_a * source tokens + max_len_b tokens")  # fmt: skip
    max_len_b: Int(ge=0) = key(10, "see max_len_a")
    nbest: Int(ge=1) = key(1, "hypotheses kept per sentence")
    max_tokens: Int(ge=1) = key(8192, "source tokens per decoding batch")
    average: Int(ge=1) = key(10, "checkpoints averaged (1: no averaging)")
    average_by: Literal["last", "best"] = key("last", "the last or the best checkpoints")
    checkpoint: Optional[Text] = key(None, "an explicit checkpoint; null: the train stage's")
    splits: Optional[list[Name]] = key(None, "splits translated and scored; null: the val split and every data.test_splits")  # fmt: skip
    heatmaps: Int(ge=0) = key(3, "cross-attention heatmap PNGs")
    samples: Int(ge=0) = key(20, "rows in the W&B table of sample translations")
    bootstrap_samples: Union[Special(0, "no interval"), Int(ge=2)] = key(1000, "resamples for the 95% bootstrap half-width of BLEU; 0: none")  # fmt: skip

    @model_validator(mode="after")
    def _lengths(self) -> "EvalConfig":
        if self.nbest > self.beam_size:
            raise refuse("eval.nbest", "must be in [1, eval.beam_size]")
        if self.max_len_a + self.max_len_b < 1:
            raise refuse("eval.max_len_b", f"eval.max_len_a + eval.max_len_b must be >= 1, got "
                         f"{self.max_len_a} + {self.max_len_b}: a one-token source would get an "
                         "empty translation")  # fmt: skip
        return self


@section
class WandbConfig:
    project: Text = key("transformer-ablations", "W&B project")
    entity: Optional[Text] = key(None, "W&B entity")
    group: Optional[Text] = key(None, "W&B group")
    tags: list[Text] = key(meaning="W&B tags", factory=list)
    mode: Literal["offline", "online", "disabled"] = key("offline", "env WANDB_MODE wins")
    init_timeout: Float(gt=0.0) = key(30.0, "seconds before an online start falls back to offline")  # fmt: skip
    log_model: Bool = key(True, "the evaluate stage's model.ckpt + spm.model as a `model` artifact")  # fmt: skip


@section
class LoggerConfig:
    wandb: WandbConfig = Field(default_factory=WandbConfig)


@section
class PathsConfig:
    """Where stages write; DVC declares each of these as an output."""

    prepared: Text = key("data/prepared", "the prepare stage's corpus")
    tokenized: Text = key("data/tokenized", "the tokenize stage's subword model and splits")
    train_dir: Text = key("models/train", "the train stage's checkpoints")
    eval_dir: Text = key("eval", "the evaluate stage's translations and model")
    metrics_dir: Text = key("metrics", "every stage's record")
    plots_dir: Text = key("plots", "learning curves")
    wandb_dir: Text = key("wandb_runs", "offline W&B runs")
    corpus_record: Text = key("data/corpus.json", "the check stage's SHA-256 per raw corpus file")  # fmt: skip

    def outputs(self, *leaving_out: str) -> dict[str, str]:
        """`{"paths.<name>": path}` of every stage output but those named in `leaving_out`:
        what a command replacing a folder must not delete."""
        return {f"paths.{name}": path for name, path in vars(self).items()
                if name not in leaving_out}  # fmt: skip


@section
class Config:
    # In params.yaml's order: the sections conf/config.yaml composes, then its own keys.
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    seed: Int(ge=0, lt=SEED_LIMIT) = key(1234, "seeds torch, numpy and sentencepiece", why="what torch, numpy and sentencepiece seed")  # fmt: skip
    experiment_name: Text = key("default", "the experiment's name in records and W&B")
    paths: PathsConfig = Field(default_factory=PathsConfig)

    @model_validator(mode="after")
    def _across_sections(self) -> "Config":
        t, e = self.train, self.eval
        if t.max_steps < 0 and t.max_epochs < 0:
            raise refuse("train.max_steps", "set train.max_steps or train.max_epochs (both are "
                         "-1: no limit)")  # fmt: skip
        if not e.checkpoint and t.save_top_k != -1 and t.save_top_k < e.average:
            raise refuse("train.save_top_k", f"keeps {t.save_top_k} checkpoints, fewer than the "
                         f"eval.average={e.average} that the evaluate stage averages: set it to "
                         f"-1 or >= {e.average}, or lower eval.average")  # fmt: skip
        _check_eval_splits(self)
        return self


def _place_sections(cls: type, prefix: str = "") -> None:
    for name, info in cls.__pydantic_fields__.items():
        if hasattr(info.annotation, "__pydantic_fields__"):  # a section
            SECTIONS[info.annotation] = f"{prefix}{name}"
            _place_sections(info.annotation, f"{prefix}{name}.")


_place_sections(Config)

# The host knobs (RuntimeConfig) that older records hold under `train.`
RUNTIME_KEYS = tuple(RuntimeConfig.__dataclass_fields__)


def _check_eval_splits(cfg: Config) -> None:
    """Resolve eval.splits=null to the val split and every test split; refuse a list that
    leaves a test split out (it would go unscored) or names a split the corpus lacks."""
    d, e = cfg.data, cfg.eval
    if e.splits is None:
        e.splits = [d.val_split, *d.test_splits]
    unscored = [split for split in d.test_splits if split not in e.splits]
    if unscored:
        raise refuse("eval.splits", f"{e.splits} leaves out {unscored} of data.test_splits: "
                     "every configured test split is evaluated; add it to eval.splits, or set "
                     "eval.splits to null (the val split and every test split)")  # fmt: skip
    known = [d.train_split, d.val_split, *d.test_splits]
    unknown = [split for split in e.splits if split not in known]
    if unknown:
        raise refuse("eval.splits", f"{unknown} not among the corpus's splits {known}: list a "
                     "test split in data.test_splits (eval.splits=null then evaluates it too)")  # fmt: skip
    if not e.splits:
        raise refuse("eval.splits", "must name at least one split")


def defaults() -> dict:
    """Every key's declared default, as params.yaml holds it (eval.splits null, not yet
    resolved to the splits it means)."""
    import dataclasses

    found = {}
    for name, info in Config.__pydantic_fields__.items():
        value = info.get_default(call_default_factory=True)
        found[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return found
