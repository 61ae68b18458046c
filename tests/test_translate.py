"""`python -m pipeline.translate` as a user runs it: a subprocess, stdin in, stdout out."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline.config import to_dict
from pipeline.errors import ConfigError
from tests.conftest import REPO_ROOT


def write_params(cfg, path: Path) -> Path:
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))), encoding="utf-8")
    return path


def run_translate(*args: str, stdin: str = "", cwd: Path = REPO_ROOT, timeout: float = 300):
    return subprocess.run(
        [sys.executable, "-m", "pipeline.translate", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def test_missing_checkpoint_names_the_path_and_the_fix(make_config, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    result = run_translate("--params", str(params), stdin="A dog runs.\n")
    expected = tmp_path / "eval" / "model.ckpt"
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: checkpoint {expected} not found")
    assert "dvc repro evaluate" in result.stderr and "dvc repro train" in result.stderr
    assert "--checkpoint" in result.stderr

    explicit = tmp_path / "elsewhere.ckpt"
    result = run_translate("--params", str(params), "--checkpoint", str(explicit))
    assert result.returncode == 2
    assert f"checkpoint {explicit} not found" in result.stderr


def test_missing_tokenizer_names_the_path_and_the_fix(make_config, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    checkpoint = tmp_path / "some.ckpt"
    checkpoint.write_bytes(b"not read: the tokenizer is checked first")
    result = run_translate("--params", str(params), "--checkpoint", str(checkpoint))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    expected = tmp_path / "data" / "tokenized" / "spm.model"
    assert result.stderr.startswith(f"error: tokenizer {expected} not found")
    assert "dvc repro tokenize" in result.stderr


def test_missing_params_file(tmp_path):
    result = run_translate("--params", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "absent.yaml not found" in result.stderr and "Traceback" not in result.stderr


def test_outside_a_repository_without_params_the_error_says_to_pass_a_checkpoint(tmp_path):
    result = run_translate(cwd=tmp_path, stdin="A dog runs.\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: params.yaml not found")
    assert "--checkpoint" in result.stderr
    assert "pipeline.config > params.yaml" not in result.stderr


def test_a_missing_checkpoint_alone_is_not_found_from_the_command_and_the_api(tmp_path):
    """`--checkpoint` without `--params` needs no params.yaml: a checkpoint that is not there
    is named as not found, by the command and by the Python API alike."""
    from pipeline.errors import DataError
    from pipeline.translate import Translator

    absent = tmp_path / "absent" / "model.ckpt"
    result = run_translate("--checkpoint", str(absent), cwd=tmp_path, stdin="A dog runs.\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: checkpoint {absent} not found")
    with pytest.raises(DataError, match=f"checkpoint {re.escape(str(absent))} not found"):
        Translator.from_checkpoint(absent)


def test_invalid_utf8_on_stdin_names_the_line(make_config, tmp_path):
    cfg = make_config()
    params = write_params(cfg, tmp_path / "params.yaml")
    for path in (tmp_path / "model.ckpt", tmp_path / "spm.model"):
        path.write_bytes(b"placeholder: input is read before either is loaded")
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.translate", "--params", str(params)]
        + [
            "--checkpoint",
            str(tmp_path / "model.ckpt"),
            "--tokenizer",
            str(tmp_path / "spm.model"),
        ],
        input=b"A dog.\nA \xff cat.\n",
        capture_output=True,
        cwd=REPO_ROOT,
        timeout=300,
    )
    assert result.returncode == 2
    assert b"<stdin>:2: invalid UTF-8" in result.stderr and b"Traceback" not in result.stderr


def test_bad_beam_is_a_usage_error(tmp_path):
    result = run_translate("--beam", "0")
    assert result.returncode == 2
    assert "--beam: must be >= 1" in result.stderr


@pytest.fixture(scope="module")
def smoke_model(trained_smoke, tmp_path_factory) -> tuple[Path, Path]:
    """params.yaml of the trained smoke run and the model.ckpt evaluate would write."""
    from pipeline.evaluation.model_loading import source_checkpoints, write_model_checkpoint

    root = tmp_path_factory.mktemp("translate")
    checkpoint = root / "model.ckpt"
    write_model_checkpoint(source_checkpoints(trained_smoke), checkpoint)
    return write_params(trained_smoke, root / "params.yaml"), checkpoint


def in_process_translations(cfg, checkpoint: Path, sentences: list[str], beam: int) -> list[str]:
    """The evaluate stage's decoding of the same sentences (prepare's normalisation applied)."""
    import dataclasses

    from pipeline.data.corpus import normalize
    from pipeline.evaluation import beam_decoding, model_loading

    model = model_loading.load_model(checkpoint)
    tokenizer = model_loading.load_tokenizer(model_loading.tokenizer_path(cfg), model, cfg.data)
    eval_cfg = dataclasses.replace(cfg.eval, beam_size=beam, nbest=1)
    src_ids = tokenizer.encode_sources([normalize(s) for s in sentences])
    return [t.best for t in beam_decoding.translate_ids(model, tokenizer, src_ids, eval_cfg)]


@pytest.mark.slow
def test_translate_stdin_matches_the_evaluate_stage(trained_smoke, smoke_model):
    params, checkpoint = smoke_model
    val = (Path(trained_smoke.paths.prepared) / "val.en").read_text(encoding="utf-8")
    sentences = val.split("\n")[:6]
    # Messy input: extra spaces, a tab, NFD umlaut; and an empty line that must stay a line.
    messy = ["  " + sentences[0] + "  ", sentences[1].replace(" ", " \t ", 1), "", *sentences[2:]]
    messy.append(unicodedata.normalize("NFD", "A man in a café."))
    # Beam 1: the 40-step smoke model's wider beams end at once (empty lines prove little).
    result = run_translate(
        "--params", str(params), "--checkpoint", str(checkpoint), "--beam", "1",
        stdin="\n".join(messy) + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(messy)  # one line out per line in
    outputs = lines[:-1]
    assert outputs[2] == "" and all(o for k, o in enumerate(outputs) if k != 2)
    expected = in_process_translations(trained_smoke, checkpoint, [m for m in messy if m], beam=1)
    assert [o for k, o in enumerate(outputs) if k != 2] == expected
    # Normalisation made the messy lines translate like the clean ones.
    clean = in_process_translations(trained_smoke, checkpoint, sentences[:2], beam=1)
    assert outputs[:2] == clean


@pytest.mark.slow
def test_translate_files_with_beam_one_is_greedy(trained_smoke, smoke_model, tmp_path):
    from pipeline.data.tokenizer import Tokenizer
    from pipeline.evaluation import model_loading
    from pipeline.model.decoding import greedy_decode

    params, checkpoint = smoke_model
    test = (Path(trained_smoke.paths.prepared) / "test_2016_flickr.en").read_text(encoding="utf-8")
    source = tmp_path / "in.en"
    source.write_text("\n".join(test.split("\n")[:8]) + "\n", encoding="utf-8")
    output = tmp_path / "out" / "translated.de"
    result = run_translate(
        "--params", str(params), "--checkpoint", str(checkpoint),
        "--input", str(source), "--output", str(output), "--beam", "1",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    translated = output.read_text(encoding="utf-8").split("\n")[:-1]

    model = model_loading.load_model(checkpoint)
    tokenizer = Tokenizer.load(model_loading.tokenizer_path(trained_smoke))
    eval_cfg = trained_smoke.eval
    greedy = []
    for line in source.read_text(encoding="utf-8").split("\n")[:-1]:
        ids = greedy_decode(
            model,
            torch.tensor([tokenizer.encode(line)]),
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            max_len_a=eval_cfg.max_len_a,
            max_len_b=eval_cfg.max_len_b,
        )[0]
        greedy.append(tokenizer.decode(ids))
    assert translated == greedy


def test_a_checkpoint_that_would_run_code_is_refused(make_config, malicious_checkpoint, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"not read: the checkpoint is refused first")
    result = run_translate(
        "--params", str(params), "--checkpoint", str(malicious_checkpoint.path),
        "--tokenizer", str(spm), stdin="A dog.\n",
    )  # fmt: skip
    assert not malicious_checkpoint.marker.exists(), "loading the checkpoint ran its code"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {malicious_checkpoint.path}: refused")
    assert "posix.system" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda:7"], "device 'cuda:7': this machine has"),
        (["--device", "toaster"], "device 'toaster'"),
        (["--beam", "2", "--nbest", "3"], "--nbest 3 is more than --beam 2"),
        (["--length-penalty", "-1"], "config key 'eval.length_penalty': must be valid"),
        (["--length-penalty", "nan"], "config key 'eval.length_penalty': must be valid"),
    ],
)
def test_bad_device_nbest_or_length_penalty_is_refused_before_anything_is_read(
    tmp_path, args, message
):
    result = run_translate(*args, cwd=tmp_path)  # no params.yaml there: refused before
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_nbest_length_penalty_and_device_match_the_python_api(trained_smoke, smoke_model):
    """`--nbest 3 --beam 3 --length-penalty 0.6 --device cpu`: three `index<TAB>score<TAB>text`
    lines per sentence, best first, as `Translator.translate_batch` gives them in-process."""
    from pipeline.translate import Translator

    params, checkpoint = smoke_model
    val = (Path(trained_smoke.paths.prepared) / "val.en").read_text(encoding="utf-8")
    sentences = val.split("\n")[:3]
    result = run_translate(
        "--params", str(params), "--checkpoint", str(checkpoint), "--beam", "3", "--nbest", "3",
        "--length-penalty", "0.6", "--device", "cpu", stdin="\n".join(sentences) + "\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [int(r[0]) for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for i in range(3):
        scores = [float(r[1]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)

    translator = Translator.from_checkpoint(checkpoint, device="cpu")  # tokenizer: the saved one
    batch = translator.translate_batch(sentences, beam_size=3, num_hypotheses=3, length_penalty=0.6)
    assert [r[2] for r in rows] == [text for t in batch for text in t.texts]
    # The CLI prints scores to 4 decimals: its rounding (5e-5) is what sets the tolerance.
    assert [float(r[1]) for r in rows] == pytest.approx([s for t in batch for s in t.scores],
                                                        abs=1e-4)  # fmt: skip
    # The 1-best of the API is what the evaluate stage's decoding gives.
    assert translator.translate(sentences, beam_size=1) == in_process_translations(
        trained_smoke, checkpoint, sentences, beam=1
    )
    # Another length penalty changes the scores it ranks by.
    other = translator.translate_batch(sentences, beam_size=3, num_hypotheses=3,
                                       length_penalty=0.0)  # fmt: skip
    assert [t.scores for t in other] != [t.scores for t in batch]
    # One outside the key's domain: the ConfigError naming it, as the command's.
    with pytest.raises(ConfigError, match=r"^config key 'eval.length_penalty': must be valid"):
        translator.translate_batch(sentences, length_penalty=-0.5)


def test_a_checkpoint_path_that_is_a_folder_says_so(make_config, tmp_path):
    params = write_params(make_config(), tmp_path / "params.yaml")
    result = run_translate("--params", str(params), "--checkpoint", str(tmp_path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: checkpoint {tmp_path} is a folder, not a file:")


@pytest.mark.slow
def test_nbest_without_a_beam_raises_the_configured_beam(trained_smoke, smoke_model):
    """README's `--nbest 3` after the smoke run, whose eval.beam_size is 2: three translations
    per sentence, as `--beam 3 --nbest 3` gives them (not exit 2)."""
    params, checkpoint = smoke_model
    assert trained_smoke.eval.beam_size == 2
    sentences = "A dog runs on the beach.\nTwo men are talking.\n"
    common = ("--params", str(params), "--checkpoint", str(checkpoint), "--nbest", "3")
    asked = run_translate(*common, stdin=sentences)
    assert asked.returncode == 0, asked.stderr
    assert [line.split("\t")[0] for line in asked.stdout.splitlines()] == ["0"] * 3 + ["1"] * 3
    assert asked.stdout == run_translate(*common, "--beam", "3", stdin=sentences).stdout


@pytest.mark.slow
def test_a_checkpoint_alone_translates_outside_the_repository_with_its_own_settings(
    trained_smoke, smoke_model, tmp_path
):
    """`--checkpoint <abs path>` from a folder without params.yaml: the smoke model decodes
    with the smoke recipe's settings (eval.beam_size 2, saved in the checkpoint), as the
    Python API does and as `--params` of the smoke run does; flags go over them."""
    from pipeline.translate import Translator

    params, checkpoint = smoke_model
    assert trained_smoke.eval.beam_size == 2
    sentences = ["A dog runs on the beach.", "Two men are talking."]
    stdin = "\n".join(sentences) + "\n"
    alone = run_translate("--checkpoint", str(checkpoint), cwd=tmp_path, stdin=stdin)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.splitlines() == Translator.from_checkpoint(checkpoint).translate(sentences)
    with_params = run_translate("--params", str(params), "--checkpoint", str(checkpoint),
                                cwd=tmp_path, stdin=stdin)  # fmt: skip
    assert alone.stdout == with_params.stdout
    nbest = run_translate("--checkpoint", str(checkpoint), "--nbest", "3", cwd=tmp_path,
                          stdin=stdin)  # fmt: skip
    assert nbest.returncode == 0, nbest.stderr
    assert [line.split("\t")[0] for line in nbest.stdout.splitlines()] == ["0"] * 3 + ["1"] * 3


API_FROM_ELSEWHERE = """
import sys
from pipeline.translate import Translator
print(Translator.from_checkpoint(sys.argv[1]).translate(["A man is riding a bike."])[0])
"""


@pytest.mark.slow
def test_the_python_api_translates_from_any_folder_and_quietly(smoke_stage_run, tmp_path):
    """README's `Translator.from_checkpoint("eval/model.ckpt")` from another working folder
    (the checkpoint's config names its subword model relative to the repository), and from a
    copy of the model's folder alone: no progress bar unless asked."""
    model_dir = smoke_stage_run.root / "eval"
    copied = Path(shutil.copytree(model_dir, tmp_path / "copied_model"))
    for checkpoint in (model_dir / "model.ckpt", copied / "model.ckpt"):
        result = subprocess.run(
            [sys.executable, "-c", API_FROM_ELSEWHERE, str(checkpoint)],
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip(), "a translation"
        assert "translate" not in result.stderr and "batch" not in result.stderr, result.stderr
