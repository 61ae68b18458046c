"""pipeline.config: composition from conf/, params.yaml in sync, validation naming the key."""

from __future__ import annotations

import functools

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.errors import ConfigError
from tests.conftest import REPO_ROOT, run_stage, write_params


def test_params_yaml_is_the_composed_default():
    """params.yaml (what `dvc repro` reads) must equal conf/ composed with no overrides."""
    committed = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "params.yaml"))
    composed = OmegaConf.to_container(config_lib.compose_dict())
    assert committed == composed, "params.yaml is stale: run `make params`"


def _leaves(tree: dict, prefix: str = "") -> dict:
    """{"model.heads": 4, ...}; an empty mapping is a leaf (a value a file sets)."""
    found = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found.update(_leaves(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def restated(conf=config_lib.CONF_DIR) -> list[str]:
    """`<file>: <key>` for every value a file of conf/ sets to what the key holds without it:
    a group file (data/, model/, ...) to the schema's default, a preset to what the groups it
    builds on give (the schema's defaults, then `override /model: base`, ...)."""
    declared = _leaves(config_schema.defaults())
    found = []
    for path in sorted(conf.glob("*.yaml")) + sorted(conf.glob("*/*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        group = path.parent.name
        if group == "experiment":  # its value against the composition it overrides
            picks = [f"{name.rpartition('/')[2]}={option}" for entry in raw.get("defaults", [])
                     if isinstance(entry, dict) for name, option in entry.items()]  # fmt: skip
            base = _leaves(OmegaConf.to_container(config_lib.compose_dict(["~experiment", *picks])))
            prefix = ""
        else:
            base, prefix = declared, "" if path.parent == conf else f"{group}."
        sets = _leaves({key: value for key, value in raw.items() if key != "defaults"}, prefix)
        found += [f"{path.relative_to(conf)}: {key}" for key, value in sets.items()
                  if key != "experiment_name" and key in base and base[key] == value]  # fmt: skip
    return found


def test_conf_sets_only_what_a_recipe_changes():
    """The schema holds every default; a file of conf/ that restates one (or a preset that
    restates what its groups give) fails here: two places would say the same value, and one
    day disagree."""
    assert restated() == []


def test_a_restated_default_is_found(tmp_path):
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(config_lib.CONF_DIR, conf)
    train = conf / "train" / "default.yaml"
    train.write_text(train.read_text() + "lr_factor: 2.0\nwarmup_steps: 3999\n")
    smoke = conf / "experiment" / "smoke.yaml"
    smoke.write_text(smoke.read_text().replace("model:\n", "model:\n  heads: 4\n"))
    assert restated(conf) == [
        "experiment/smoke.yaml: model.heads",
        "train/default.yaml: train.lr_factor",
    ]


def test_the_schemas_defaults_are_what_the_recipes_ran_with():
    """Where the schema and conf/ once disagreed, the schema now holds conf/'s value (the one
    `dvc repro` ran with)."""
    cfg = config_lib.compose(["~experiment"])
    assert cfg.train.lr_factor == 2.0 and cfg.train.float32_matmul_precision == "high"
    assert cfg.data.limits.max_file_mb == 64
    assert config_schema.defaults()["train"]["lr_factor"] == 2.0


def leaf_values(tree: dict, prefix: str = "") -> dict[str, object]:
    """{dotted key: value} of a YAML mapping's leaves (a list is a leaf)."""
    leaves = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            leaves |= leaf_values(value, f"{prefix}{key}.")
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


@pytest.mark.parametrize(
    "preset", sorted(p.stem for p in (config_lib.CONF_DIR / "experiment").glob("*.yaml"))
)
def test_every_preset_composes_to_exactly_the_values_it_writes(preset):
    """Each conf/experiment preset composes (every key in the schema, every value inside its
    domain: else compose raises, naming the key) and the config holds each value the preset's
    file writes, read from the file itself (a key the schema dropped or renamed would not)."""
    written = yaml.safe_load((config_lib.CONF_DIR / "experiment" / f"{preset}.yaml").read_text())
    written.pop("defaults", None)  # Hydra's composition order, not a value
    composed = leaf_values(config_lib.to_dict(config_lib.compose([f"experiment={preset}"])))
    assert written and {key: composed.get(key, "missing") for key in leaf_values(written)} == (
        leaf_values(written)
    )
    assert config_lib.compose([]) == config_lib.compose(["experiment=multi30k_tiny"])  # default


def test_override_reaches_the_typed_config():
    cfg = config_lib.compose(["model.heads=8", "train.max_steps=7"])
    assert cfg.model.heads == 8 and cfg.train.max_steps == 7


def test_a_composition_asked_again_is_a_copy_and_an_edited_conf_composes_anew(tmp_path):
    """compose keeps what it composed in this process: the same request gives an equal config
    the caller may change without changing the next one's, and a conf/ file edited between two
    requests is read again."""
    import shutil

    conf = tmp_path / "conf"
    shutil.copytree(config_lib.CONF_DIR, conf)
    first = config_lib.compose_dict(["model.heads=8"], conf)
    first.model.heads = 2
    again = config_lib.compose(["model.heads=8"], conf)
    assert again.model.heads == 8 and again == config_lib.compose(["model.heads=8"], conf)

    train = conf / "train" / "default.yaml"  # log_every_n_steps: left to train/ by the recipe
    original = train.read_text()
    for every in (11, 12):  # the same size, at once: read again all the same
        train.write_text(original + f"log_every_n_steps: {every}\n")
        assert config_lib.compose(["model.heads=8"], conf).train.log_every_n_steps == every


def test_experiment_preset_selects_values():
    smoke = config_lib.compose(["experiment=smoke"])
    assert smoke.experiment_name == "smoke"
    assert smoke.data.max_train_pairs <= 2000
    assert smoke.train.max_steps <= 500 and smoke.model.d_model <= 128


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.heads=3", "model.heads"),
        ("model.dropout=1.5", "model.dropout"),
        ("model.positional=rotary", "model.positional"),
        ("model.init=orthogonal", "model.init"),
        ("data.tokenizer.pretokenizer=spacy", "data.tokenizer.pretokenizer"),
        ("data.tokenizer.model_type=char", "data.tokenizer.model_type"),
        ("train.label_smoothing=-0.1", "train.label_smoothing"),
        ("eval.nbest=9", "eval.nbest"),
        ("eval.length_normalization=average", "eval.length_normalization"),
        ("train.batch_budget=padded", "train.batch_budget"),
        ("train.loss_normalization=mean", "train.loss_normalization"),
        ("eval.bootstrap_samples=1", "eval.bootstrap_samples"),  # one resample: no interval
        ("train.cooldown_steps=9000", "train.cooldown_steps"),  # longer than max_steps
        ("train.cooldown_steps=-1", "train.cooldown_steps"),
        ("model.heads=abc", "model.heads"),
        ("+model.bogus=1", "model.bogus"),
        ("+train.max_tokns=10", "train.max_tokns"),
        ("runtime.loss_chunk_rows=0", "runtime.loss_chunk_rows"),
        ("runtime.bf16_min_speedup=0", "runtime.bf16_min_speedup"),
    ],
)
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        config_lib.compose([override])


@pytest.mark.parametrize(
    ("refused", "key", "allowed", "accepted"),
    [
        # 0 keeps no step-/best- checkpoint: training would finish, evaluate find none to average
        (["train.save_top_k=0"], "train.save_top_k", "must be -1 (keep every checkpoint) or >= 1",
         ["train.save_top_k=-1", "eval.average=10"]),  # Lightning's "keep all"
        (["train.save_top_k=-2"], "train.save_top_k", "must be -1 (keep every checkpoint) or >= 1",
         ["train.save_top_k=1", "eval.average=1"]),
        # evaluate would average fewer checkpoints than asked for (unless it takes one given)
        (["train.save_top_k=4", "eval.average=5"], "train.save_top_k", "set it to -1 or >= 5",
         ["train.save_top_k=1", "eval.average=5", "eval.checkpoint=model.ckpt"]),
        # at most floor(a * source length + b) tokens: empty or truncated hypotheses
        (["eval.max_len_b=-100"], "eval.max_len_b", "must be >= 0, got -100",
         ["eval.max_len_a=2", "eval.max_len_b=0"]),
        (["eval.max_len_a=-0.5"], "eval.max_len_a", "must be >= 0, got -0.5",
         ["eval.max_len_a=0", "eval.max_len_b=200"]),  # fairseq's default: a fixed limit
        (["eval.max_len_a=0", "eval.max_len_b=0"], "eval.max_len_b", "must be >= 1",
         ["eval.max_len_a=0", "eval.max_len_b=1"]),
    ],
)  # fmt: skip
def test_meaningless_checkpoint_and_length_limits_are_refused(refused, key, allowed, accepted):
    """Refused naming the key and the allowed range; the legitimate neighbour still passes."""
    with pytest.raises(ConfigError) as error:
        config_lib.compose(refused)
    assert str(error.value).startswith(f"config key '{key}': ")
    assert allowed in str(error.value)
    config_lib.compose(accepted)


@pytest.mark.parametrize(
    ("stage", "override", "key"),
    [
        ("train", "train.save_top_k=0", "train.save_top_k"),
        ("evaluate", "eval.max_len_b=-100", "eval.max_len_b"),
    ],
)
def test_stage_cli_refuses_a_meaningless_value_before_any_compute(tmp_path, stage, override, key):
    """The stage reads params.yaml (composed, not validated, as `make params` writes it) and
    exits 2 with the key named, having written nothing: no data read, no model built."""
    write_params(tmp_path, "experiment=smoke", override)
    result = run_stage(stage, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: config key '{key}': must be ")
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


UNREADABLE_PARAMS = {  # what params.yaml holds -> where the error says it fails
    "binary bytes": (bytes(range(128, 256)) * 4, "params.yaml:1: not UTF-8 text (byte 0x80"),
    "an unclosed list": (b"seed: 1\nmodel:\n  heads: [4, 8\n", "params.yaml:4:1: not valid YAML"),
    "a NUL byte": (b"seed: 1\ntrain:\n  lr\x00: 1\n", "params.yaml:3:5: not valid YAML"),
}


@pytest.mark.parametrize(
    ("stage", "content"),
    [("check", "binary bytes"), ("train", "binary bytes"), ("check", "an unclosed list"),
     ("train", "an unclosed list"), ("evaluate", "a NUL byte"), ("summarize", "a NUL byte")],
)  # fmt: skip
def test_a_params_file_that_is_not_yaml_is_refused_naming_its_line(tmp_path, stage, content):
    """Binary bytes or invalid YAML in params.yaml: exit 2 naming the file and line, no
    traceback, nothing written."""
    data, message = UNREADABLE_PARAMS[content]
    (tmp_path / "params.yaml").write_bytes(data)
    result = run_stage(stage, tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"error: {message}"), result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    assert (tmp_path / "params.yaml").read_bytes() == data


def test_unknown_key_in_params_file_names_file_and_key(tmp_path):
    raw = OmegaConf.to_container(config_lib.compose_dict())
    raw["train"]["learning_rate"] = 1.0
    path = tmp_path / "params.yaml"
    OmegaConf.save(raw, path)
    with pytest.raises(ConfigError, match=r"params\.yaml.*train\.learning_rate"):
        config_lib.load(path)


def test_missing_params_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config_lib.load(tmp_path / "params.yaml")


def test_env_overrides_raw_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(config_lib.RAW_DIR_ENV, str(tmp_path))
    assert config_lib.compose().data.raw_dir == str(tmp_path)


# A committed record written while the host knobs sat in `train` (never rewritten)
OLD_LAYOUT_RECORD = REPO_ROOT / "results" / "multi30k_tiny_rerun.en-de" / "params.yaml"


def test_a_record_with_host_knobs_under_train_loads_them_into_runtime(tmp_path):
    raw = yaml.safe_load(OLD_LAYOUT_RECORD.read_text())
    recorded = {key: raw["train"][key] for key in config_schema.RUNTIME_KEYS}  # the older layout
    assert "runtime" not in raw
    cfg = config_lib.load(OLD_LAYOUT_RECORD)
    assert {key: getattr(cfg.runtime, key) for key in config_schema.RUNTIME_KEYS} == recorded
    # values other than the defaults move as well, by every loader
    raw["train"].update(compile_loss=False, loss_chunk_rows=64, onednn_primitive_cache=None)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    for cfg in (config_lib.load(path), config_lib.from_dict(raw)):
        assert cfg.runtime.compile_loss is False and cfg.runtime.loss_chunk_rows == 64
        assert cfg.runtime.onednn_primitive_cache is None
    raw["runtime"] = {"compile_loss": True}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"'train\.compile_loss'.*runtime\.compile_loss"):
        config_lib.load(path)


def test_dict_round_trip():
    cfg = config_lib.compose(["experiment=smoke"])
    assert config_lib.from_dict(config_lib.to_dict(cfg)) == cfg


def test_wu2021_preset_is_their_recipe():
    """conf/experiment/multi30k_wu2021.yaml against Wu et al.'s fairseq flags (the docstring of
    benchmarks/fairseq/train_peer.py), where this pipeline has the setting."""
    from pipeline.training.module import inverse_sqrt_rate

    cfg = config_lib.compose(["experiment=multi30k_wu2021"])
    d, m, t, e = cfg.data, cfg.model, cfg.train, cfg.eval
    assert (d.src_lang, d.tgt_lang, d.filter.apply_to) == ("en", "de", [])
    assert (d.tokenizer.pretokenizer, d.tokenizer.case_fold, d.tokenizer.source_eos) == (
        "moses", True, True)  # fmt: skip
    # task1-bpe.sh: subword-nmt, 10000 merges
    assert (d.tokenizer.model_type, d.tokenizer.vocab_size) == ("subword_nmt", 10000)
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.d_ff, m.heads) == (4, 4, 128, 256, 4)
    assert (m.dropout, m.attention_dropout, m.activation_dropout) == (0.3, 0.0, 0.0)
    assert (m.norm_first, m.positional, m.tie_embeddings) == (False, "sinusoidal", True)
    assert m.init == "fairseq"  # the peer's, fairseq 0.12 (their fork's: xavier)
    assert (t.adam_betas, t.adam_eps, t.weight_decay) == ([0.9, 0.98], 1e-8, 0.0)
    assert (t.label_smoothing, t.gradient_clip_val) == (0.1, 25.0)
    # --max-tokens 4096 (fairseq's bound, B * max(src, tgt)) on 2 GPUs: 2 batches an update
    assert (t.max_steps, t.warmup_steps, t.max_tokens, t.accumulate_grad_batches) == (
        8000, 2000, 4096, 2)  # fmt: skip
    assert (t.batch_budget, t.loss_normalization) == ("max", "update")
    # --lr 0.005 is the peak, reached at the last warm-up update, then lr * sqrt(2000 / update)
    rate = functools.partial(
        inverse_sqrt_rate, d_model=m.d_model, warmup_steps=t.warmup_steps, factor=t.lr_factor
    )
    assert rate(2000) == pytest.approx(0.005, rel=1e-6)
    assert rate(1000) == pytest.approx(0.0025, rel=1e-6)
    assert rate(8000) == pytest.approx(0.005 * (2000 / 8000) ** 0.5, rel=1e-6)
    assert max(rate(s) for s in range(1, 8001)) == rate(2000)
    # --patience 10 on val loss: validation computes the loss only, which then stops early
    assert (t.val_bleu, t.early_stopping_patience) == (False, 10)
    assert (e.average, e.average_by, e.beam_size, e.length_penalty) == (10, "last", 5, 1.0)
    assert t.save_top_k >= e.average


@pytest.mark.slow
def test_wu2021_validates_once_per_epoch(tmp_path, multi30k_dir):
    """fairseq validates and saves a checkpoint per epoch: the preset's val_check_interval is
    the updates of one epoch of its own tokenized training split, at its batch size."""
    from pipeline.data.datamodule import TranslationDataModule
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize
    from tests.conftest import redirect_paths

    cfg = config_lib.compose([f"data.raw_dir={multi30k_dir}", "experiment=multi30k_wu2021"])
    cfg = redirect_paths(cfg, tmp_path)
    prepare(cfg)
    tokenize(cfg)
    datamodule = TranslationDataModule(cfg)
    datamodule.setup("fit")
    batches = len(datamodule.train_dataloader())
    updates = -(-batches // cfg.train.accumulate_grad_batches)  # a last odd batch: an update
    assert cfg.train.val_check_interval == updates


def _config_cli(*args: str, cwd=REPO_ROOT):
    """`python -m pipeline.params <args>` (`transformer-config`), printing with `-o -`."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pipeline.params", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.heads=3", "model.heads"),  # does not divide d_model
        ("model.dropout=1.5", "model.dropout"),
        ("model.hedas=4", "model.hedas"),  # no such key
        ("train.max_steps=many", "train.max_steps"),  # wrong type
    ],
)
def test_config_cli_validates_as_the_stages_do(override, key):
    """`python -m pipeline.params <bad override> -o -` prints no config: exit 2, the key
    named, no traceback."""
    result = _config_cli(override, "-o", "-")
    assert result.returncode == 2, result.stdout[:500]
    assert result.stdout == ""
    assert key in result.stderr and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_config_cli_help_and_a_good_override():
    helped = _config_cli("--help")
    assert helped.returncode == 0 and "usage: python -m pipeline.params" in helped.stdout
    assert "Traceback" not in helped.stderr
    printed = _config_cli("experiment=smoke", "model.heads=2", "-o", "-")
    assert printed.returncode == 0, printed.stderr
    assert OmegaConf.create(printed.stdout).model.heads == 2


def test_config_cli_output_keeps_the_old_file_when_it_refuses(tmp_path):
    target = tmp_path / "params.yaml"
    written = _config_cli("experiment=smoke", "-o", str(target))
    assert written.returncode == 0, written.stderr
    before = target.read_text()
    assert OmegaConf.create(before).experiment_name == "smoke"
    refused = _config_cli("model.heads=3", "-o", str(target))
    assert refused.returncode == 2 and "model.heads" in refused.stderr
    assert target.read_text() == before


# The smoke preset's translations must differ from sentence to sentence: a learning rate that
# collapses the model onto one output for every input (2 distinct of 1000) fails it.
SMOKE_MIN_DISTINCT_RATIO = 0.5


@pytest.mark.slow
def test_smoke_preset_translates_rather_than_repeating_one_sentence(smoke_stage_run):
    hypotheses = (smoke_stage_run.root / "eval" / "test_2016_flickr.hyp").read_text().splitlines()
    assert len(hypotheses) == 1000
    ratio = len(set(hypotheses)) / len(hypotheses)
    assert ratio > SMOKE_MIN_DISTINCT_RATIO, f"{ratio:.3f} of the translations differ"


def test_eval_splits_default_to_val_and_every_test_split():
    cfg = config_lib.compose(["data.test_splits=[test_2016_flickr,test_2017_flickr]"])
    assert cfg.eval.splits == ["val", "test_2016_flickr", "test_2017_flickr"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.test_splits=[test_2016_flickr,test_2017_flickr]", "eval.splits=[val,test_2016_flickr]"],
         r"leaves out \['test_2017_flickr'\] of data.test_splits"),
        (["eval.splits=[val,test_2017_flickr]"], r"leaves out \['test_2016_flickr'\]"),
        (["eval.splits=[val,test_2016_flickr,test_2099]"], r"\['test_2099'\] not among"),
    ],
)  # fmt: skip
def test_a_test_split_left_unevaluated_is_an_error(overrides, message):
    with pytest.raises(ConfigError, match=r"config key 'eval.splits': .*" + message):
        config_lib.compose(overrides)


def test_a_negative_max_steps_is_named_as_such_not_as_a_missing_one():
    with pytest.raises(ConfigError) as error:
        config_lib.compose(["train.max_steps=-5"])
    message = str(error.value)
    assert message.startswith("config key 'train.max_steps': must be -1 (no limit: max_epochs)")
    assert "got -5" in message and "set train.max_steps or train.max_epochs" not in message
    with pytest.raises(ConfigError, match=r"both are -1: no limit"):
        config_lib.compose(["train.max_steps=-1"])  # no step limit and no epoch limit
    config_lib.compose(["train.max_steps=-1", "train.max_epochs=2"])  # Lightning's convention


def test_a_raw_dir_outside_the_repository_is_found_from_dvcs_temporary_copy(tmp_path):
    """`dvc exp run --queue` runs the stages in `<repo>/.dvc/tmp/exps/<copy>/`: the default
    `../shared/data/multi30k` means the folder beside the repository there too; paths inside
    the repository and absolute ones stay as they are."""
    from pipeline.config import outside_the_workspace

    copy = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    beside = str(tmp_path / "shared" / "data" / "multi30k")
    assert outside_the_workspace("../shared/data/multi30k", cwd=copy) == beside
    assert outside_the_workspace("data/raw", cwd=copy) == "data/raw"
    assert outside_the_workspace(beside, cwd=copy) == beside
    assert outside_the_workspace("../shared", cwd=tmp_path / "repo") == "../shared"


@pytest.mark.parametrize(
    ("override", "nearest"),
    [("+model.headz=8", "model.heads"), ("+train.lr_factr=2", "train.lr_factor"),
     ("+modle.heads=8", "model"), ("+model.zzzzzz=3", None)],
)  # fmt: skip
def test_the_check_stage_names_the_key_nearest_to_an_unknown_one(tmp_path, override, nearest):
    """What `dvc exp run -S +model.headz=8` leaves in params.yaml: the check stage exits 2
    naming the key and the declared key nearest to it, where one is close."""
    write_params(tmp_path, override)
    result = run_stage("check", tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    unknown = override.lstrip("+").split("=")[0]
    if nearest is None:
        assert f"config key '{unknown}'" in result.stderr and "did you mean" not in result.stderr
    else:
        unknown = unknown if "." in nearest else unknown.split(".")[0]
        assert f"config key '{unknown}': " in result.stderr
        assert result.stderr.rstrip().endswith(f"did you mean '{nearest}'?"), result.stderr


@pytest.mark.slow
def test_a_typo_in_a_dvc_set_key_is_dvcs_error_and_with_plus_the_check_stages(tmp_path):
    """docs/configuration.md: `dvc exp run -S model.headz=8` is refused by DVC's Hydra before any stage (exit
    255, naming the key); `-S +model.headz=8`, as that message suggests, reaches the check
    stage, which exits 2 naming the key nearest to it, without printing the whole section."""
    from tests.test_dvc_pipeline import copy_repository, sh

    repo = copy_repository(tmp_path / "repo")
    typo = sh(["dvc", "exp", "run", "-S", "model.headz=8"], repo, check=False)
    output = typo.stdout + typo.stderr
    assert typo.returncode == 255, output[-3000:]
    assert "Could not override 'model.headz'" in output and "+model.headz=8" in output
    added = sh(["dvc", "exp", "run", "-S", "+model.headz=8"], repo, check=False)
    output = added.stdout + added.stderr
    assert added.returncode == 255, output[-3000:]
    assert "failed to reproduce 'check'" in output and "exited with 2" in output, output[-3000:]
    assert "config key 'model.headz'" in output and "did you mean 'model.heads'?" in output
    assert "'d_model':" not in output, output[-3000:]
