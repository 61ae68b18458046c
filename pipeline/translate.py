"""Translate sentences with the trained model: one line in, one line out.

    echo "A man is riding a bike." | python -m pipeline.translate
    python -m pipeline.translate --input news.en --output news.de --beam 5
    python -m pipeline.translate --nbest 3 --length-penalty 0.6 --device cuda < news.en

From Python (CTranslate2's and fairseq's naming: beam_size, num_hypotheses, length_penalty):

    from pipeline.translate import Translator
    translator = Translator.from_checkpoint("eval/model.ckpt", device="cpu")
    translator.translate(["A man is riding a bike."])             # ["Ein Mann fährt ..."]
    translator.translate_batch(["..."], num_hypotheses=3)         # texts and scores, best first

Input is normalised exactly as `prepare` normalises the corpus (NFC, whitespace collapsed),
encoded with the joint subword model (Moses-tokenized first where the model was trained so,
`data.tokenizer.pretokenizer`), beam-searched in batches of `eval.max_tokens` source tokens and
detokenized; an empty input line gives an empty output line. The config (decoding settings
`eval`, where the subword model is) is `--params` where given; with `--checkpoint` alone, the
one saved in the checkpoint (the model's own recipe, from any folder); with neither,
./params.yaml, whose `paths.eval_dir/model.ckpt` (the averaged checkpoint the evaluate stage
scored) is the model. `--beam` and `--length-penalty` go over its `eval`. The subword model
is the `spm.model` beside the checkpoint (the evaluate stage and `export` write it there, so a
copied model folder translates anywhere), else `paths.tokenized/spm.model` of the repository
the checkpoint is in, from whatever folder it is called. The Python API is quiet; the command
shows a progress bar on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.cli import PARAMS_FILE, main, positive_int
from pipeline.cli import parser as cli_parser
from pipeline.data.corpus import normalize, read_lines
from pipeline.data.tokenizer import MODEL_FILE
from pipeline.errors import ConfigError, DataError, not_a_file
from pipeline.evaluation.outputs import MODEL_CHECKPOINT


class Translator:
    """A trained model with its subword model, ready to translate sentences.

    Sentences are normalised as `prepare` normalises the corpus and read and written as the
    model was trained (source eos, Moses pre-tokenization); decoding settings default to the
    `eval` section of the config the model was trained with.
    """

    def __init__(
        self, model, tokenizer, eval_cfg: config_schema.EvalConfig, progress: bool = False
    ):
        self.model, self.tokenizer, self.eval_cfg = model, tokenizer, eval_cfg
        self.progress = progress

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | Path,
        tokenizer: str | Path | None = None,
        device: str = "cpu",
        config: config_schema.Config | None = None,
        progress: bool = False,
    ) -> Translator:
        """`checkpoint`: a training checkpoint or the evaluate stage's `model.ckpt`;
        `tokenizer`: its spm.model (default: `find_tokenizer`; `config` defaults to the config
        saved in the checkpoint); `device`: "cpu", "cuda", "cuda:1"; `progress`: a progress
        bar on stderr while translating."""
        # torch and the model code load only now: `--help` and usage errors answer at once.
        from pipeline.evaluation.model_loading import load_model, load_tokenizer

        checkpoint = Path(checkpoint)
        torch_device = resolve_device(device)
        if config is None:
            config = checkpoint_config(checkpoint)
        spm_model = Path(tokenizer) if tokenizer else find_tokenizer(checkpoint, config)
        if not spm_model.is_file():
            raise DataError(
                f"tokenizer {spm_model} not found: create it with `dvc repro tokenize`, "
                "or pass the spm.model the model was trained with"
            )
        model = load_model(checkpoint).to(torch_device)
        tokenizer = load_tokenizer(spm_model, model, config.data)
        return cls(model, tokenizer, config.eval, progress=progress)

    def translate_batch(
        self,
        sources: Sequence[str],
        beam_size: int | None = None,
        num_hypotheses: int = 1,
        length_penalty: float | None = None,
    ) -> list:
        """One `Translation` (its `texts`, `scores` and subword `tokens`, best first) per
        source; an empty source gives an empty list of hypotheses."""
        from pipeline.evaluation.beam_decoding import translate_ids

        beam = beam_size or self.eval_cfg.beam_size
        if not 1 <= num_hypotheses <= beam:
            raise ConfigError(
                f"num_hypotheses={num_hypotheses} must be in [1, beam_size={beam}]: a beam "
                "of k keeps k hypotheses"
            )
        settings = config_schema.changed(
            self.eval_cfg,
            beam_size=beam,
            nbest=num_hypotheses,
            length_penalty=self.eval_cfg.length_penalty if length_penalty is None
            else length_penalty,
        )  # fmt: skip
        src_ids = self.tokenizer.encode_sources([normalize(line) for line in sources])
        return translate_ids(
            self.model, self.tokenizer, src_ids, settings, desc="translate", progress=self.progress
        )

    def translate(self, sources: Sequence[str], **options) -> list[str]:
        """The best translation of each source (options as `translate_batch`'s)."""
        return [t.best for t in self.translate_batch(sources, **options)]


def checkpoint_config(checkpoint: Path) -> config_schema.Config:
    """The config a checkpoint was trained with (saved in it); DataError where the file is
    missing or not a checkpoint."""
    from pipeline.training.checkpoints import read_checkpoint

    if problem := not_a_file(checkpoint):
        raise DataError(f"checkpoint {checkpoint} {problem}: pass the path of a model.ckpt")
    return config_lib.from_dict(read_checkpoint(checkpoint)["hyper_parameters"]["config"])


def find_tokenizer(checkpoint: str | Path, config: config_schema.Config) -> Path:
    """The subword model a checkpoint translates with: `spm.model` beside it, else
    `paths.tokenized/spm.model` from the working folder, else from the nearest folder above
    the checkpoint that has one (the repository it was trained in). The first candidate when
    none exists, for the error message."""
    checkpoint = Path(checkpoint)
    tokenized = Path(config.paths.tokenized) / MODEL_FILE
    candidates = [checkpoint.parent / MODEL_FILE, tokenized]
    if not tokenized.is_absolute():
        candidates += [folder / tokenized for folder in checkpoint.resolve().parents]
    return next((path for path in candidates if path.is_file()), tokenized)


def resolve_device(name: str):
    """`--device`: a torch device that exists here, or a ConfigError saying why not."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise ConfigError(f"device '{name}': {err} (use cpu, cuda or cuda:N)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0 or (device.index or 0) >= count:
            raise ConfigError(
                f"device '{name}': this machine has {count} CUDA device(s); use --device cpu"
            )
    elif device.type != "cpu":
        raise ConfigError(f"device '{name}': use cpu, cuda or cuda:N")
    return device


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli_parser("pipeline.translate", __doc__)
    parser.add_argument(
        "--params",
        help="config: decoding settings, where the model and subword model are (default: "
        "the checkpoint's own with --checkpoint, else params.yaml)",
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="model checkpoint (default: <paths.eval_dir>/model.ckpt)"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="sentencepiece model (default: spm.model beside the checkpoint, else "
        "<paths.tokenized>/spm.model)",
    )
    parser.add_argument(
        "--beam",
        type=positive_int,
        help="beam size (default: eval.beam_size, or --nbest where that is larger)",
    )
    parser.add_argument(
        "--nbest",
        type=positive_int,
        default=1,
        help="translations per sentence, best first, as `index<TAB>score<TAB>text` lines "
        "(at most --beam; default: 1, plain lines)",
    )
    parser.add_argument(
        "--length-penalty",
        type=float,
        help="alpha of eval.length_normalization (default: eval.length_penalty)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    parser.add_argument(
        "--input", type=Path, help="source text, one sentence a line (default: stdin)"
    )
    parser.add_argument("--output", type=Path, help="where translations go (default: stdout)")
    return parser.parse_args(argv)


def load_params(path: str | None) -> config_schema.Config:
    """`--params`, else ./params.yaml; where there is none, the message says how to translate
    with a model alone."""
    if path is None and not Path(PARAMS_FILE).exists():
        raise ConfigError(
            f"{PARAMS_FILE} not found: run from the repository root, or pass "
            "--checkpoint <model.ckpt> (it translates with its own config's settings)"
        )
    return config_lib.load(path or PARAMS_FILE)


def translate(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    resolve_device(args.device)  # before anything is read
    if args.length_penalty is not None:  # held to eval.length_penalty's domain, as early
        config_schema.changed(config_schema.EvalConfig(), length_penalty=args.length_penalty)
    if args.beam and args.nbest > args.beam:
        raise ConfigError(f"--nbest {args.nbest} is more than --beam {args.beam}: raise --beam")
    if args.params is None and args.checkpoint is not None:
        # A model alone translates with its own recipe's settings, from any folder.
        checkpoint = args.checkpoint
        cfg = checkpoint_config(checkpoint)
    else:
        cfg = load_params(args.params)
        default_checkpoint = Path(cfg.paths.eval_dir) / MODEL_CHECKPOINT
        checkpoint = args.checkpoint or default_checkpoint
        if problem := not_a_file(checkpoint):
            raise DataError(
                f"checkpoint {checkpoint} {problem}: train and evaluate with `dvc repro "
                f"evaluate` (it runs `dvc repro train` first and writes {default_checkpoint}), "
                f"or pass --checkpoint {Path(cfg.paths.train_dir) / 'checkpoints'}/<name>.ckpt"
            )
    spm_model = args.tokenizer or find_tokenizer(checkpoint, cfg)
    if not spm_model.is_file():
        raise DataError(
            f"tokenizer {spm_model} not found: create it with `dvc repro tokenize`, "
            "or pass --tokenizer PATH/spm.model"
        )
    # n best need a beam of n at least: without --beam, the configured beam grows to it.
    beam = args.beam or max(cfg.eval.beam_size, args.nbest)

    lines = read_lines(args.input) if args.input is not None else read_stdin_lines()
    translator = Translator.from_checkpoint(
        checkpoint, spm_model, args.device, config=cfg, progress=True
    )
    translations = translator.translate_batch(
        lines, beam_size=beam, num_hypotheses=args.nbest, length_penalty=args.length_penalty
    )
    if args.nbest == 1:
        text = "".join(f"{t.best}\n" for t in translations)
    else:
        from pipeline.evaluation.beam_decoding import nbest_lines

        text = "".join(f"{line}\n" for line in nbest_lines(translations))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
    else:  # UTF-8 whatever the locale says
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.flush()


def read_stdin_lines() -> list[str]:
    """Lines of standard input, decoded as UTF-8 (like the corpus files), split at "\\n"."""
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(
            f"<stdin>:{line}: invalid UTF-8 at byte offset {err.start}; send UTF-8 text"
        ) from None
    lines = text.removeprefix("\ufeff").split("\n")  # a byte-order mark is not text
    if lines[-1] == "":
        lines.pop()
    return lines


def console() -> None:
    """The `transformer-translate` command (pyproject.toml)."""
    main(lambda: translate(sys.argv[1:]))


if __name__ == "__main__":
    console()
