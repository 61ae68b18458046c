"""benchmarks.fairseq.train_peer: the parts of the fairseq side-by-side harness that run
in this project's environment without fairseq: Multi30k's Moses preprocessing (the files it
writes; pipeline.data.moses itself is tested in test_moses.py), the BPE and fairseq command lines (the recipe's
flags), checkpoint averaging, the parsers of fairseq's output, and train_throughput's fairseq
system (the hand-over to its worker, the skip without a venv). Building the fairseq venv
never happens here; the end-to-end runs are `slow` and need a venv built beforehand
(`python -m benchmarks.fairseq.train_peer --build-venv-only` builds it)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from benchmarks import common, train_throughput
from benchmarks.fairseq import step_speed, train_peer
from pipeline.evaluation.beam_decoding import pad_batch
from pipeline.portable_paths import relativize
from tests.conftest import REPO_ROOT
from tests.test_moses import OFFICIAL_TOK_DE

BLEU_LINE = (
    "Generate test with beam=5: BLEU4 = 41.02, 71.0/47.5/34.3/24.5 (BP=0.999, ratio=0.999, "
    "syslen=12096, reflen=12103)"
)


def args_for(*argv: str):
    return train_peer.build_parser().parse_args(["--out", "unused.json", *argv])


def flag_values(command: list[str]) -> dict[str, str | None]:
    """{--flag: value (None for a switch)} of a command line."""
    values, index = {}, 0
    while index < len(command):
        if command[index].startswith("--"):
            following = command[index + 1] if index + 1 < len(command) else "--"
            is_value = not following.startswith("--")
            values[command[index]] = following if is_value else None
            index += 2 if is_value else 1
        else:
            index += 1
    return values


# ---------------------------------------------------------------- preprocessing


def test_prepare_writes_every_subset_and_marks_done(tmp_path, multi30k_dir):
    args = args_for("--corpus", str(multi30k_dir), "--work-dir", str(tmp_path),
                    "--max-train-pairs", "20", "--max-eval-pairs", "5")  # fmt: skip
    layout = train_peer.Layout(tmp_path)
    settings = train_peer.data_settings(args)
    counts = train_peer.prepare(args, layout, settings)
    assert counts == {"train": 20, "valid": 5, "test": 5}
    test_de = layout.tok_file("test", "de").read_text().splitlines()
    assert test_de[:2] == [OFFICIAL_TOK_DE[1], OFFICIAL_TOK_DE[2]]
    assert train_peer.stage_done(layout.tok, settings)
    assert not train_peer.stage_done(layout.tok, {**settings, "max_train_pairs": 21})
    assert train_peer.is_smoke(args) and not train_peer.is_smoke(args_for())


# ---------------------------------------------------------------- BPE


def test_bpe_commands_learn_jointly_and_apply_per_language(tmp_path):
    args = args_for("--venv", str(tmp_path / "venv"))
    layout = train_peer.Layout(tmp_path / "work")
    (learn, stdin, stdout), *applies = train_peer.bpe_commands(args, layout)
    assert stdin is None and stdout is None
    assert learn[:2] == [
        str(tmp_path / "venv" / "bin" / "subword-nmt"),
        "learn-joint-bpe-and-vocab",
    ]
    assert learn[learn.index("-s") + 1] == "10000"  # merge operations
    inputs = learn[learn.index("--input") + 1 : learn.index("--input") + 3]
    assert inputs == [str(layout.tok_file("train", "en")), str(layout.tok_file("train", "de"))]
    vocabularies = learn[learn.index("--write-vocabulary") + 1 :]
    assert vocabularies == [str(layout.vocab("en")), str(layout.vocab("de"))]
    assert len(applies) == 6  # train, valid, test x en, de
    for command, source, target in applies:
        lang = source.suffix[1:]
        assert command[1] == "apply-bpe"
        assert flag_values(command)["--vocabulary"] == str(layout.vocab(lang))
        assert target == layout.bpe / source.name  # fairseq-preprocess reads bpe/{subset}.{lang}
        assert "--vocabulary-threshold" not in command  # task1-bpe.sh sets none
    preprocess = flag_values(train_peer.preprocess_command(args, layout))
    for subset, flag in (
        ("train", "--trainpref"),
        ("valid", "--validpref"),
        ("test", "--testpref"),
    ):
        assert Path(preprocess[flag]) == layout.bpe / subset
    assert "--joined-dictionary" in preprocess


# ---------------------------------------------------------------- fairseq command lines


def test_train_command_carries_the_recipe(tmp_path):
    args = args_for("--venv", str(tmp_path / "venv"))
    command = train_peer.train_command(args, train_peer.Layout(tmp_path / "work"))
    assert command[0].endswith("fairseq-train") and command[-1] == "--cpu"
    values = flag_values(command)
    expected = {
        "--arch": "transformer", "--share-all-embeddings": None,
        "--encoder-layers": "4", "--decoder-layers": "4",
        "--encoder-embed-dim": "128", "--decoder-embed-dim": "128",
        "--encoder-ffn-embed-dim": "256", "--decoder-ffn-embed-dim": "256",
        "--encoder-attention-heads": "4", "--decoder-attention-heads": "4",
        "--dropout": "0.3", "--attention-dropout": "0.0", "--activation-dropout": "0.0",
        "--optimizer": "adam", "--adam-betas": "(0.9, 0.98)", "--adam-eps": "1e-08",
        "--clip-norm": "25.0", "--lr": "0.005", "--lr-scheduler": "inverse_sqrt",
        "--warmup-updates": "2000", "--warmup-init-lr": "1e-07",
        "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": "0.1",
        "--max-tokens": "4096", "--update-freq": "2", "--max-update": "8000",
        "--patience": "10", "--save-interval": "1", "--keep-last-epochs": "10", "--seed": "1",
    }  # fmt: skip
    assert {flag: values.get(flag, "absent") for flag in expected} == expected
    # post-norm, sinusoidal positions, fp32: fairseq's defaults, so nothing may switch them
    for switch in ("--encoder-normalize-before", "--decoder-normalize-before",
                   "--encoder-learned-pos", "--decoder-learned-pos", "--fp16", "--bf16",
                   "--max-epoch"):  # fmt: skip
        assert switch not in values
    # every size explicit: not fairseq's own transformer_tiny architecture
    assert "transformer_tiny" not in command


def test_budget_and_size_options_reach_the_command(tmp_path):
    args = args_for("--max-update", "20", "--seed", "3", "--max-epoch", "2", "--layers", "6",
                    "--average-last", "4", "--keep-last-epochs", "7")  # fmt: skip
    layout = train_peer.Layout(tmp_path)
    values = flag_values(train_peer.train_command(args, layout))
    assert (values["--max-update"], values["--seed"], values["--max-epoch"]) == ("20", "3", "2")
    assert values["--encoder-layers"] == values["--decoder-layers"] == "6"
    assert values["--keep-last-epochs"] == "7"
    average = flag_values(train_peer.average_command(args, layout))
    assert average["--num-epoch-checkpoints"] == "4"
    assert average["--output"] == str(layout.averaged(4))


def test_generate_command_is_evaluate_sh(tmp_path):
    args = args_for()
    layout = train_peer.Layout(tmp_path)
    command = train_peer.generate_command(args, layout, "test")
    values = flag_values(command)
    assert values["--beam"] == "5" and values["--lenpen"] == "1.0"
    assert values["--gen-subset"] == "test" and "--remove-bpe" in values
    assert values["--path"] == str(layout.averaged(10)) and "--cpu" in values
    assert "--quiet" not in values  # the hypotheses are read from its output
    assert values["--required-batch-size-multiple"] == "1"  # no dropped last batch


def test_venv_commands_build_outside_with_torch_first_and_fairseq_without_deps(tmp_path):
    args = args_for("--venv", str(tmp_path / "venv"))
    report = tmp_path / "report.json"
    make, dry, install_torch, deps, install_fairseq = train_peer.venv_commands(args, report)
    assert make[1:] == ["-m", "venv", str(tmp_path / "venv")]
    assert dry[-1] == install_torch[-1] == "torch==2.13.0"
    assert "--dry-run" in dry and str(report) in dry
    assert "torch==2.13.0" in deps and "torchaudio" not in shlex.join(deps)
    for needed in ("hydra-core==1.3.2", "omegaconf==2.3.0", "subword-nmt==0.3.8", "sacremoses==0.2.0",
                   "numpy", "cython", "bitarray", "scikit-learn", "cffi"):  # fmt: skip
        assert needed in deps
    assert install_fairseq[-3:] == ["--no-deps", "--no-build-isolation", "fairseq-fixed==0.12.3.1"]
    assert not str(args.venv).startswith(str(train_peer.REPO_ROOT))


def test_device_cuda_drops_cpu_flag_and_keeps_gpus_visible(tmp_path, monkeypatch):
    """--device cpu (the default): fairseq's --cpu and no visible GPU; cuda: neither, the
    inherited CUDA_VISIBLE_DEVICES (and pip's PIP_* settings) passed on as they are."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels")
    layout = train_peer.Layout(tmp_path)
    for device, has_cpu, visible in (("cpu", True, ""), ("cuda", False, "0")):
        args = args_for("--device", device)
        train = train_peer.train_command(args, layout)
        generate = train_peer.generate_command(args, layout, "valid")
        assert ("--cpu" in train, "--cpu" in generate) == (has_cpu, has_cpu)
        env = train_peer.tool_env(args)
        assert env["CUDA_VISIBLE_DEVICES"] == visible
        assert (env["PIP_NO_INDEX"], env["PIP_FIND_LINKS"]) == ("1", "/wheels")
        assert train_peer.recipe(args)["device"] == device
        assert train_peer.recipe(args)["precision"] == "fp32"
    assert args_for().device == "cpu"


def test_system_site_packages_makes_the_venv_and_is_part_of_its_spec(tmp_path):
    plain = args_for("--venv", str(tmp_path / "venv"))
    shared = args_for("--venv", str(tmp_path / "venv"), "--system-site-packages")
    report = tmp_path / "report.json"
    assert "--system-site-packages" not in train_peer.venv_commands(plain, report)[0]
    make = train_peer.venv_commands(shared, report)[0]
    assert make[1:] == ["-m", "venv", "--system-site-packages", str(tmp_path / "venv")]
    assert "system_site_packages" not in train_peer.venv_spec(plain)  # old records still match
    assert train_peer.venv_spec(shared) == {**train_peer.venv_spec(plain),
                                               "system_site_packages": True}  # fmt: skip


def test_system_site_packages_venv_sees_the_packages_of_a_venv_python(tmp_path):
    """A venv made with --system-site-packages from a venv's interpreter (a GPU machine's
    torch venv; here this project's venv) sees that venv's packages too, before torch's dry run;
    a base interpreter's are already seen (nothing written), and without the flag there is no
    such step. Real venvs (without fairseq, torch or pip installs): the harness's steps up to
    the torch dry run."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    has = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sacrebleu') is None)"
    if (
        sys.prefix == sys.base_prefix
        or subprocess.run([str(base), "-c", has], timeout=300).returncode == 0
    ):
        pytest.skip("needs a venv with sacrebleu over a base Python without it")

    def run_steps(args, *wanted: str) -> Path:
        """Run the harness's build steps named `wanted`; the venv's site-packages."""
        names = train_peer.venv_step_names(args)
        commands = train_peer.venv_commands(args, tmp_path / "report.json")
        assert len(names) == len(commands)
        with open(tmp_path / "build.log", "a") as log:
            for name, command in zip(names, commands):
                if name in wanted:
                    train_peer.run_command(command, train_peer.tool_env(args), log)
        return next(Path(args.venv).glob("lib/python*/site-packages"))

    def imports(venv: Path) -> bool:
        check = [str(venv / "bin" / "python"), "-c", "import sacrebleu"]
        return subprocess.run(check, capture_output=True, timeout=300).returncode == 0

    plain = args_for("--venv", str(tmp_path / "plain"))
    assert train_peer.venv_step_names(plain) == train_peer.VENV_STEPS
    site_packages = run_steps(plain, "venv")
    assert not (site_packages / train_peer.SITE_PACKAGES_PTH).exists()
    assert not any("addsitedir" in f.read_text() for f in site_packages.glob("*.pth"))
    assert not imports(plain.venv)

    shared = args_for("--venv", str(tmp_path / "shared"), "--system-site-packages")
    assert shared.python == sys.executable  # the default --python: this project's venv
    names = train_peer.venv_step_names(shared)
    assert names[:3] == ("venv", train_peer.SITE_PACKAGES_STEP, "torch_dry_run")
    site_packages = run_steps(shared, "venv")
    pth = site_packages / train_peer.SITE_PACKAGES_PTH
    assert not imports(shared.venv)  # the bug: the base Python's packages only
    on_base = args_for("--venv", str(shared.venv), "--system-site-packages", "--python", str(base))
    run_steps(on_base, train_peer.SITE_PACKAGES_STEP)
    assert not pth.exists()  # a base Python's site-packages: already seen
    run_steps(shared, train_peer.SITE_PACKAGES_STEP)
    assert sysconfig.get_path("purelib") in pth.read_text()
    assert imports(shared.venv)


def test_venv_is_reused_or_refused_without_building_anything(tmp_path):
    """A venv built with the same specs is reused; a directory this harness did not build,
    or a path inside the repository, is refused and left alone."""
    built = tmp_path / "built"
    built.mkdir()
    args = args_for("--venv", str(built))
    record = {"spec": train_peer.venv_spec(args), "build_s": 600.0, "versions": {}}
    (built / train_peer.VENV_MARKER).write_text(json.dumps(record))
    assert train_peer.ensure_venv(args, env={}) == {**record, "reused": True}

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "pyvenv.cfg").write_text("home = /usr/bin\n")
    with pytest.raises(SystemExit, match="not built by this harness"):
        train_peer.ensure_venv(args_for("--venv", str(foreign)), env={})
    assert (foreign / "pyvenv.cfg").exists()
    inside = train_peer.REPO_ROOT / "no-such-fairseq-venv"
    with pytest.raises(SystemExit, match="inside the repository"):
        train_peer.ensure_venv(args_for("--venv", str(inside)), env={})
    assert not inside.exists()
    with pytest.raises(SystemExit, match="inside the repository"):
        train_peer.main(["--out", str(tmp_path / "r.json"), "--work-dir", str(inside)])
    assert not inside.exists()


def test_build_venv_only_builds_nothing_more_and_out_is_needed_otherwise(tmp_path, capsys):
    """--build-venv-only stops after the venv (here one already built: reused, nothing run)
    and needs no --out; a run without it does."""
    built = tmp_path / "built"
    built.mkdir()
    args = args_for("--venv", str(built))
    record = {"spec": train_peer.venv_spec(args), "build_s": 600.0, "versions": {}}
    (built / train_peer.VENV_MARKER).write_text(json.dumps(record))
    work = tmp_path / "work"
    returned = train_peer.main(["--build-venv-only", "--venv", str(built),
                                  "--work-dir", str(work)])  # fmt: skip
    assert returned == {**record, "reused": True} and not work.exists()
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == returned
    assert train_peer.built_venv(built) == record
    assert train_peer.built_venv(tmp_path / "absent") is None
    with pytest.raises(SystemExit):
        train_peer.main(["--venv", str(built), "--work-dir", str(work)])
    assert "--out is required" in capsys.readouterr().err


def test_cuda_torch_is_refused_unless_allowed():
    def report(version, requires):
        return {"install": [{"metadata": {"name": "torch", "version": version,
                                          "requires_dist": requires},
                             "download_info": {"url": "https://example/torch.whl"}}]}  # fmt: skip

    assert train_peer.check_torch_report(report("2.13.0+cpu", ["filelock"]), False) == "2.13.0+cpu"
    cuda = report("2.13.0", ["filelock", "nvidia-cublas-cu12==12.8; platform_system == 'Linux'"])
    with pytest.raises(SystemExit, match="CUDA build"):
        train_peer.check_torch_report(cuda, allow_cuda=False)
    assert train_peer.check_torch_report(cuda, allow_cuda=True) == "2.13.0"
    # a torch already present (--system-site-packages) that satisfies the spec: pip installs
    # nothing, whatever its build, and the venv's probe records its version
    assert train_peer.check_torch_report({"version": "1", "install": []}, False) is None


def test_tool_env_threads_and_no_project_python(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    env = train_peer.tool_env(args_for("--venv", str(tmp_path / "v"), "--threads", "2"))
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"
    assert env["PATH"].startswith(str(tmp_path / "v" / "bin"))
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"


def test_dry_run_builds_and_runs_nothing(tmp_path, capsys):
    venv, work = tmp_path / "venv", tmp_path / "work"
    payload = train_peer.main(["--out", str(tmp_path / "r.json"), "--venv", str(venv),
                                 "--work-dir", str(work), "--dry-run"])  # fmt: skip
    assert not venv.exists() and not work.exists() and not (tmp_path / "r.json").exists()
    printed = capsys.readouterr().out.splitlines()
    assert printed == payload["commands"] and any("fairseq-train" in c for c in printed)


# ---------------------------------------------------------------- checkpoint averaging


def fake_checkpoint(path: Path, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    state = {
        "model": {
            "encoder.weight": torch.randn(3, 4, generator=generator),
            "decoder.half": torch.randn(5, generator=generator).half(),
            "version": torch.tensor([seed * 3 + 1]),
        },
        "cfg": {"epoch": seed},
        "optimizer_history": [seed],
    }
    torch.save(state, path)
    return state


def test_average_last_epoch_checkpoints_is_the_elementwise_mean(tmp_path):
    states = {epoch: fake_checkpoint(tmp_path / f"checkpoint{epoch}.pt", epoch)
              for epoch in (1, 2, 9, 10)}  # fmt: skip
    fake_checkpoint(tmp_path / "checkpoint_last.pt", 99)
    fake_checkpoint(tmp_path / "checkpoint_best.pt", 98)
    chosen = train_peer.last_epoch_checkpoints(tmp_path, 3)
    assert [p.name for p in chosen] == ["checkpoint10.pt", "checkpoint9.pt", "checkpoint2.pt"]
    output = tmp_path / "avg.pt"
    train_peer.main(["average", "--inputs", str(tmp_path), "--num-epoch-checkpoints", "3",
                       "--output", str(output)])  # fmt: skip
    averaged = torch.load(output, weights_only=False)
    used = [states[e]["model"] for e in (10, 9, 2)]
    expected = torch.stack([m["encoder.weight"] for m in used]).mean(0)
    torch.testing.assert_close(averaged["model"]["encoder.weight"], expected)
    half_mean = torch.stack([m["decoder.half"].float() for m in used]).mean(0)
    assert averaged["model"]["decoder.half"].dtype == torch.float32
    torch.testing.assert_close(averaged["model"]["decoder.half"], half_mean)
    assert averaged["model"]["version"].item() == (31 + 28 + 7) // 3  # integers floor-divided
    assert averaged["cfg"] == {"epoch": 10}  # the rest is the newest checkpoint's


def test_averaging_loads_fairseq_state_weights_only(tmp_path, malicious_checkpoint):
    """fairseq's own state (argparse.Namespace, numpy values) loads; a checkpoint whose
    pickle would run code is refused by the command line, and the code never runs."""
    import numpy as np

    for epoch in (1, 2):
        state = fake_checkpoint(tmp_path / f"checkpoint{epoch}.pt", epoch)
        state["args"] = argparse.Namespace(arch="transformer", lr=[5e-4])
        state["extra_state"] = {"best": np.float64(3.5), "meters": np.arange(3)}
        torch.save(state, tmp_path / f"checkpoint{epoch}.pt")
    output = tmp_path / "avg.pt"
    train_peer.main(["average", "--inputs", str(tmp_path), "--num-epoch-checkpoints", "2",
                       "--output", str(output)])  # fmt: skip
    averaged = torch.load(output, weights_only=False)
    assert averaged["args"].arch == "transformer" and averaged["extra_state"]["best"] == 3.5

    evil = tmp_path / "evil"
    evil.mkdir()
    malicious_checkpoint.path.rename(evil / "checkpoint3.pt")
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fairseq.train_peer", "average", "--inputs", str(evil),
         "--num-epoch-checkpoints", "1", "--output", str(evil / "avg.pt")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},  # as tool_env runs it
    )  # fmt: skip
    assert not malicious_checkpoint.marker.exists(), "loading the checkpoint ran its code"
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"{evil / 'checkpoint3.pt'}: refused: loading it would build posix.system" in (
        result.stderr
    )
    assert not (evil / "avg.pt").exists()


def test_averaging_refuses_too_few_checkpoints(tmp_path):
    fake_checkpoint(tmp_path / "checkpoint1.pt", 1)
    with pytest.raises(SystemExit, match="1 epoch checkpoints"):
        train_peer.last_epoch_checkpoints(tmp_path, 2)


# ---------------------------------------------------------------- fairseq's output


def train_log_line(tag: str, stats: dict) -> str:
    return f"2026-05-01 10:00:00 | INFO | {tag} | {json.dumps(stats)}"


def test_parse_train_log_counts_updates_tokens_and_val_loss():
    lines = [
        "2026-05-01 10:00:00 | INFO | fairseq_cli.train | task: TranslationTask",
        train_log_line("train_inner", {"epoch": 1, "update": 0.5, "loss": "12"}),
        train_log_line("valid", {"epoch": 1, "valid_loss": "9.5", "valid_num_updates": "50"}),
        train_log_line(
            "train",
            {
                "epoch": 1,
                "train_loss": "11.0",
                "train_wpb": "7000.5",
                "train_num_updates": "50",
                "train_train_wall": "100",
                "train_wall": "110",
            },
        ),  # fmt: skip
        train_log_line("valid", {"epoch": 2, "valid_loss": "8.25", "valid_num_updates": "80"}),
        train_log_line(
            "train",
            {
                "epoch": 2,
                "train_loss": "9.0",
                "train_wpb": "7100",
                "train_num_updates": "80",
                "train_train_wall": "160",
                "train_wall": "175",
            },
        ),  # fmt: skip
        "2026-05-01 10:05:00 | INFO | fairseq_cli.train | early stop since valid performance "
        "hasn't improved for last 10 runs",
    ]
    parsed = train_peer.parse_train_log(lines)
    assert (parsed["epochs"], parsed["updates"]) == (2, 80)
    assert parsed["target_tokens"] == round(7000.5 * 50 + 7100 * 30)
    # train_wall is per epoch (fairseq resets the epoch's meters), wall is cumulative
    assert (parsed["train_wall_s"], parsed["fairseq_wall_s"]) == (260.0, 175.0)
    assert parsed["best_val_loss"] == 8.25 and parsed["stopped_early"]
    assert [r["val_loss"] for r in parsed["per_epoch"]] == [9.5, 8.25]


def test_parse_generate_orders_hypotheses_and_reads_bleu4():
    lines = [
        "S-1\tzwei hunde", "T-1\ttwo dogs", "H-1\t-0.5\tzwei hunde .", "D-1\t-0.5\tzwei hunde .",
        "P-1\t-0.1 -0.2", "S-0\tein mann", "H-0\t-0.3\tein mann .", "D-0\t-0.3\tein mann .",
        "2026-05-01 | INFO | fairseq_cli.generate | Translated 2 sentences",
        BLEU_LINE,
    ]  # fmt: skip
    hypotheses, bleu = train_peer.parse_generate(lines, expected=2)
    assert hypotheses == ["ein mann .", "zwei hunde ."]
    assert bleu["bleu4"] == 41.02 and bleu["reflen"] == 12103 and bleu["syslen"] == 12096
    assert bleu["precisions"] == [71.0, 47.5, 34.3, 24.5]
    with pytest.raises(SystemExit, match="missing"):
        train_peer.parse_generate(["D-1\t-0.5\tzwei hunde ."], expected=2)
    # fairseq 0.12 drops a last batch that is not a multiple of --required-batch-size-multiple
    with pytest.raises(SystemExit, match="translated 2 of 3"):
        train_peer.parse_generate(lines, expected=3)


# ---------------------------------------------------------------- end to end (fairseq venv)


@pytest.mark.slow
@pytest.mark.skipif(
    not (train_peer.DEFAULT_VENV / train_peer.VENV_MARKER).exists(),
    reason="no fairseq venv (built by `python -m benchmarks.fairseq.train_peer`, never by the tests)",
)
def test_smoke_run_end_to_end(tmp_path, multi30k_dir):
    """A few updates on a few hundred pairs through every stage with the real fairseq."""
    out = tmp_path / "result.json"
    payload = train_peer.main([
        "--out", str(out), "--corpus", str(multi30k_dir), "--work-dir", str(tmp_path / "work"),
        "--max-train-pairs", "400", "--max-eval-pairs", "40", "--bpe-merges", "500",
        "--max-update", "6", "--average-last", "2", "--warmup-updates", "4",
    ])  # fmt: skip
    # The record is the payload with the repository's and the cache's paths written portably.
    record = out.read_text()
    assert str(REPO_ROOT) not in record and str(train_peer.CACHE) not in record
    portable = relativize(json.dumps(payload, sort_keys=True), Path.cwd(), train_peer.CACHE)
    assert json.loads(record) == json.loads(portable)
    assert payload["smoke"] and payload["updates"] == 6 and payload["epochs"] >= 2
    assert payload["target_tokens"] > 0 and payload["tokens_per_s"] > 0
    assert len(payload["averaged_checkpoints"]) == 2
    for split in ("val", "test_2016_flickr"):
        result = payload["scores"][split]
        assert result["fairseq_bleu4"] is not None
        assert 0.0 <= result["bleu_tok_lc"] <= 100.0 and "bleu_lc" in result
        # beside the result: the detokenized translations its scores were computed from
        hypotheses = train_peer.hypotheses_path(out, split).read_text().splitlines()
        assert len(hypotheses) == 40 and any(hypotheses)


# ---------------------------------------------------------------- train_throughput's fairseq


def bench_config(**sizes):
    args = argparse.Namespace(overrides=["model.dropout=0.3", "train.label_smoothing=0.2"],
                              seed=None, **sizes)  # fmt: skip
    return common.bench_config(args)


def test_fairseq_handover_is_what_the_worker_reads(tmp_path):
    """train_throughput's hand-over: the worker reads back the very batch (same token ids,
    pad id, vocabulary size) and fairseq flags carrying our config's sizes and step."""
    cfg = bench_config(d_model=64, layers=2, heads=4, d_ff=128, vocab=1000)
    tokens = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
    rows = [[5, 6, 7, 8], [9, 10], [11]]
    batch = {
        "src": pad_batch(rows, 0),
        "tgt_in": pad_batch([[2, *row] for row in rows[::-1]], 0),
        "tgt_out": pad_batch([[*row, 3] for row in rows[::-1]], 0),
        "num_tgt_tokens": 10,
    }
    spec_path = train_throughput.write_fairseq_handover(tmp_path, cfg, batch, tokens, vocab=1000)
    read, spec = step_speed.read_handover(spec_path)
    assert set(read) == set(step_speed.BATCH_KEYS)
    for key in step_speed.BATCH_KEYS:
        assert torch.equal(read[key], batch[key])
    assert spec["vocab_size"] == 1000 and spec["special_ids"] == tokens
    assert spec["threads"] == torch.get_num_threads()
    assert spec["cpu_memory"] == {"mmap_threshold_mb": cfg.runtime.cpu_mmap_threshold_mb,
                                  "onednn_primitive_cache": cfg.runtime.onednn_primitive_cache}  # fmt: skip
    flags = flag_values(spec["flags"])
    expected = {
        "--arch": "transformer", "--share-all-embeddings": None, "--activation-fn": "relu",
        "--encoder-layers": "2", "--decoder-layers": "2",
        "--encoder-embed-dim": "64", "--decoder-embed-dim": "64",
        "--encoder-ffn-embed-dim": "128", "--decoder-ffn-embed-dim": "128",
        "--encoder-attention-heads": "4", "--decoder-attention-heads": "4",
        "--dropout": "0.3", "--attention-dropout": str(cfg.model.attention_dropout),
        "--activation-dropout": str(cfg.model.activation_dropout),
        "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": "0.2",
        "--optimizer": "adam", "--adam-betas": str(tuple(cfg.train.adam_betas)),
        "--adam-eps": str(cfg.train.adam_eps), "--seed": str(cfg.seed), "--cpu": None,
    }  # fmt: skip
    assert {flag: flags.get(flag, "absent") for flag in expected} == expected
    for switch in ("--encoder-normalize-before", "--encoder-learned-pos", "--bf16", "--fp16"):
        assert switch not in flags  # post-norm, sinusoidal, float32

    sample = step_speed.fairseq_sample(read, pad_id=spec["special_ids"]["pad_id"])
    net_input = sample["net_input"]
    assert torch.equal(net_input["src_tokens"], batch["src"])
    assert torch.equal(net_input["prev_output_tokens"], batch["tgt_in"])
    assert torch.equal(sample["target"], batch["tgt_out"])
    assert net_input["src_lengths"].tolist() == [4, 2, 1]
    assert sample["ntokens"] == batch["num_tgt_tokens"] and sample["nsentences"] == 3


def test_fairseq_system_is_skipped_with_a_reason_without_its_venv(tmp_path):
    cpu = torch.device("cpu")
    absent = tmp_path / "absent"
    reason = train_throughput.fairseq_unavailable(absent, cpu)
    assert reason == (f"no fairseq venv at {absent}; build it with "
                      f"`python -m benchmarks.fairseq.train_peer --build-venv-only --venv {absent}`")  # fmt: skip
    unfinished = tmp_path / "unfinished"  # a build that stopped before its marker
    (unfinished / "bin").mkdir(parents=True)
    assert "no fairseq venv" in train_throughput.fairseq_unavailable(unfinished, cpu)
    default = train_throughput.fairseq_unavailable(train_peer.DEFAULT_VENV, torch.device("cuda"))
    assert "CPU" in default
    built = tmp_path / "built"
    built.mkdir()
    (built / train_peer.VENV_MARKER).write_text(json.dumps({"spec": {}}))
    assert train_throughput.fairseq_unavailable(built, cpu) is None


@pytest.mark.slow
@pytest.mark.skipif(
    train_peer.built_venv(train_peer.DEFAULT_VENV) is None,
    reason="no fairseq venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`)",
)
def test_train_throughput_times_fairseq_at_our_sizes(tokenized_smoke, capsys):
    """The real fairseq in its venv, beside ours: the same parameter count, a positive step
    time in float32, and its float32 step against our bf16 one, so named, in the bf16 round."""
    payload = train_throughput.main([
        "--tokenized", tokenized_smoke.paths.tokenized, "--systems", "ours", "fairseq",
        "--d-model", "64", "--layers", "2", "--heads", "4", "--d-ff", "128",
        "--repeats", "1", "--warmup", "1", "--device", "cpu", "--target-tokens", "300",
        "--peak-size", "256", "--dtype", "float32", "bfloat16",
    ])  # fmt: skip
    assert payload["skipped"] == {}
    assert payload["parameters"]["fairseq"] == payload["parameters"]["ours"] > 0
    float32, bfloat16 = payload["results"]["float32"], payload["results"]["bfloat16"]
    assert set(float32["step_ms"]) == {"ours", "fairseq"}
    assert set(bfloat16["step_ms"]) == {"ours", "fairseq_float32"}
    for result, name in ((float32, "fairseq"), (bfloat16, "fairseq_float32")):
        assert result["step_ms"][name] > 0
        assert result["ratio"][name] == pytest.approx(
            result["tgt_tokens_per_s"]["ours"] / result["tgt_tokens_per_s"][name]
        )
    assert step_speed.NO_CPU_BF16 in capsys.readouterr().out
