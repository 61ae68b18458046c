"""W&B runs: offline files with the full config, the env/config mode rule, online->offline
fallback, and the reader for offline run files; real training against an unreachable server
(refusing, or silent) and with W&B disabled/offline, watching every connection attempt."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from pipeline import config as config_lib
from pipeline.config import to_dict
from pipeline.tracking import offline_run_dirs, read_offline_run, resolve_mode, start_wandb_run
from tests.conftest import redirect_paths


@pytest.fixture
def no_wandb_account(tmp_path, monkeypatch):
    """No API key anywhere W&B looks (env, ~/.netrc, its settings dir)."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("NETRC", raising=False)


def test_offline_run_holds_config_labels_and_history(make_config):
    cfg = make_config("experiment=smoke", "logger.wandb.tags=[smoke,unit]")
    run = start_wandb_run(cfg, job_type="train", name="unit-run")
    for step in range(1, 4):
        run.log({"train/loss": 1.0 / step, "trainer/global_step": step})
    run.summary["num_parameters"] = 1234
    run.finish()

    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    saved = read_offline_run(run_dir)
    assert saved["complete"]
    assert saved["config"] == to_dict(cfg)  # the full resolved config, nested
    assert saved["run"]["project"] == cfg.logger.wandb.project
    assert saved["run"]["job_type"] == "train"
    assert saved["run"]["group"] == "smoke"  # defaults to the experiment name
    assert saved["run"]["name"] == "unit-run"
    assert saved["run"]["tags"] == ["smoke", "unit"]
    losses = [row["train/loss"] for row in saved["history"] if "train/loss" in row]
    assert losses == pytest.approx([1.0, 0.5, 1 / 3])
    assert saved["summary"]["num_parameters"] == 1234


def test_a_password_on_the_command_line_stays_out_of_the_run(make_config, monkeypatch):
    """W&B records the command line in the run: a sweep's storage URL goes in masked."""
    url = "postgresql://postgres:s3cret-pw@127.0.0.1:5432/test"
    argv = ["pipeline/sweep.py", "ablations/smoke.yaml", "--storage", url]
    monkeypatch.setattr(sys, "argv", argv)
    cfg = make_config("experiment=smoke")
    run = start_wandb_run(cfg, job_type="trial", name="masked")
    assert sys.argv == argv  # the process keeps its real command line
    run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert read_offline_run(run_dir)["complete"]  # W&B's service writes on after finish()
    files = [p for p in Path(cfg.paths.wandb_dir).rglob("*") if p.is_file()]
    assert any(b"postgres:***@127.0.0.1" in p.read_bytes() for p in files)
    assert not [p for p in files if b"s3cret-pw" in p.read_bytes()]


def test_a_run_under_dvc_exp_run_is_named_after_the_experiment_and_its_config_is_a_file(
    make_config, monkeypatch
):
    """`dvc exp run` sets DVC_EXP_NAME for the stages it runs (dvc/repo/experiments/queue/
    base.py): a run without a name of its own takes it; an explicit name stays. The offline
    run's files/config.yaml holds the config as an online run's does."""
    import yaml

    cfg = make_config("experiment=smoke")
    monkeypatch.setenv("DVC_EXP_NAME", "tawny-sash")
    for job_type, name in (("train", None), ("trial", "smoke-base-seed1")):
        run = start_wandb_run(cfg, job_type=job_type, name=name)
        run.finish()
    runs = {(run := read_offline_run(d))["run"]["job_type"]: (d, run)
            for d in offline_run_dirs(cfg.paths.wandb_dir)}  # fmt: skip
    (run_dir, first), (_, second) = runs["train"], runs["trial"]
    assert first["run"]["name"] == "tawny-sash-train"
    assert second["run"]["name"] == "smoke-base-seed1"
    assert first["config"]["dvc_exp_name"] == "tawny-sash"
    written = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert written.pop("wandb_version") == 1
    assert set(written) == set(first["config"])
    for section in ("seed", "model", "train", "eval", "dvc_exp_name"):
        assert written[section]["value"] == first["config"][section]


def test_environment_mode_wins_over_the_config(make_config, monkeypatch, no_wandb_account):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_config("logger.wandb.mode=online")
    assert resolve_mode("online") == "offline"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no online attempt, hence no fallback warning
        run = start_wandb_run(cfg, job_type="eval", group="g1")
    assert run.offline
    run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert read_offline_run(run_dir)["run"]["group"] == "g1"


def test_online_start_without_an_account_falls_back_to_offline(
    make_config, monkeypatch, no_wandb_account
):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = make_config("logger.wandb.mode=online", "logger.wandb.init_timeout=20")
    with pytest.warns(UserWarning, match="W&B online start failed .*logging offline"):
        run = start_wandb_run(cfg, job_type="train")
    assert run.offline
    run.log({"train/loss": 2.0})
    run.finish()
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert read_offline_run(run_dir)["history"][0]["train/loss"] == 2.0


def test_a_run_prints_one_line_where_it_is_and_how_to_upload_it(make_config, tmp_path):
    """W&B's own banner and its history of sparklines stay off the console, also where the
    environment does not ask W&B to be silent: one line per run, through a pipe."""
    cfg = make_config("experiment=smoke")
    code = textwrap.dedent(f"""
        from pipeline import config
        from pipeline.tracking import finish_run, start_wandb_run
        cfg = config.compose(["experiment=smoke", "paths.wandb_dir={cfg.paths.wandb_dir}"])
        run = start_wandb_run(cfg, job_type="train")
        for step in range(1, 4):
            run.log({{"train/loss": 1.0 / step, "trainer/global_step": step}})
        run.summary["test/bleu"] = 3.0
        finish_run(run)
    """)
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "false"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    assert (done.stdout + done.stderr).splitlines() == [
        f"W&B: offline run saved; upload it with `wandb sync {run_dir}`"
    ]
    assert read_offline_run(run_dir)["summary"]["test/bleu"] == 3.0


def test_disabled_mode_writes_no_run(make_config, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = make_config("logger.wandb.mode=disabled")
    run = start_wandb_run(cfg, job_type="train")
    run.log({"train/loss": 1.0})
    run.finish()
    assert offline_run_dirs(cfg.paths.wandb_dir) == []


def test_reader_rejects_other_files(tmp_path):
    (tmp_path / "run-x.wandb").write_bytes(b"not a wandb log")
    with pytest.raises(ValueError, match="not a W&B run file"):
        read_offline_run(tmp_path)


# ---------------------------------------------------------------------- outages, real training

# Trains `cfg.json` (argv[1]) with `trainer.run` and writes `result.json` beside it: the metrics,
# the seconds from run() to the first callback hook (W&B starts before it) and the end time;
# and, from the last exit handler, `events.json`: every Python-level connect, DNS lookup and
# process start of the whole run, exit included (audit hooks see them in every library).
TRAIN_SCRIPT = textwrap.dedent(
    """
    import atexit, json, os, sys, time
    events = []
    def audit(event, args):
        if event == "socket.connect":
            events.append(["connect", str(args[1])])
        elif event == "socket.getaddrinfo":
            events.append(["dns", str(args[0])])
        elif event == "subprocess.Popen":
            events.append(["spawn", os.path.basename(str(args[0]))])
    sys.addaudithook(audit)
    folder = os.path.dirname(os.path.abspath(sys.argv[1]))
    def save_events():  # registered first, so it runs after the libraries' exit handlers
        with open(os.path.join(folder, "events.json"), "w") as f:
            json.dump(events, f)
    atexit.register(save_events)

    from lightning.pytorch.callbacks import Callback
    from pipeline.config import from_dict
    from pipeline.training.trainer import run

    class Started(Callback):
        def setup(self, trainer, module, stage):
            self.at = time.monotonic()

    with open(sys.argv[1]) as f:
        cfg = from_dict(json.load(f))
    started, began = Started(), time.monotonic()
    metrics = run(cfg, callbacks=[started])
    result = {"metrics": metrics, "setup_s": started.at - began, "ended": time.time()}
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
    """
)
TINY_RUN = [
    "experiment=smoke",
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "train.max_tokens=3000",
    "train.max_steps=4",
    "train.val_check_interval=2",
    "train.val_bleu_max_sentences=4",
    "train.log_every_n_steps=1",
    "train.progress_bar=false",
    "train.precision=bf16-mixed",  # not auto: runs compared across processes train alike
]


def _train(tokenized_smoke, root: Path, env: dict, *overrides: str, strace: bool = False):
    """Run TRAIN_SCRIPT on the tiny config in a subprocess; (result, stderr, exit delay s,
    connect() calls strace saw in any process or None)."""
    cfg = config_lib.compose([f"data.raw_dir={tokenized_smoke.data.raw_dir}", *TINY_RUN,
                              *overrides])  # fmt: skip
    cfg = redirect_paths(cfg, root)
    cfg.paths.prepared = tokenized_smoke.paths.prepared
    cfg.paths.tokenized = tokenized_smoke.paths.tokenized
    root.mkdir(parents=True, exist_ok=True)
    (root / "cfg.json").write_text(json.dumps(to_dict(cfg)))
    (root / "train_run.py").write_text(TRAIN_SCRIPT)
    command = [sys.executable, "train_run.py", "cfg.json"]
    if strace:
        # --seccomp-bpf: only connect() stops the traced processes, the rest runs at full speed
        command = ["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=connect",
                   "-o", "strace.txt", *command]  # fmt: skip
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    exited = time.time()
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads((root / "result.json").read_text())
    outcome["events"] = json.loads((root / "events.json").read_text())
    connects = None
    if strace:
        lines = (root / "strace.txt").read_text().splitlines()
        connects = [line.split(" ", 1)[1] for line in lines if "connect(" in line]
    return outcome, result.stderr, exited - outcome["ended"], connects, cfg


def _wandb_env(**changes) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **changes}
    env.pop("WANDB_MODE", None)  # the config's logger.wandb.mode decides unless a test sets it
    env.pop("WANDB_SILENT", None)  # as users run it (silence skips W&B's ~10 s account lookup)
    env.pop("WANDB_SERVICE", None)  # this process's W&B service, if a test started one
    env.update({k: v for k, v in changes.items() if k == "WANDB_MODE"})
    return env


def _history(wandb_dir: str) -> list[dict]:
    (run_dir,) = offline_run_dirs(wandb_dir)
    saved = read_offline_run(run_dir)
    assert saved["complete"]
    return [{k: v for k, v in row.items() if not k.startswith("_") and "per_sec" not in k}
            for row in saved["history"]]  # fmt: skip


@contextlib.contextmanager
def silent_server():
    """A TCP server that accepts connections and never answers (a hung W&B server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the server's accept loop did not stop"
        for connection in accepted:
            connection.close()
        server.close()


def _refusing_url() -> str:
    """A local port nothing listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.slow
def test_unreachable_server_costs_at_most_init_timeout_and_trains_like_offline(
    tokenized_smoke, tmp_path, no_wandb_account
):
    init_timeout = 5.0
    offline, _, offline_exit, _, offline_cfg = _train(tokenized_smoke, tmp_path / "offline",
                                                      _wandb_env())  # fmt: skip
    fake_key = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}  # 40 characters
    online = ["logger.wandb.mode=online", f"logger.wandb.init_timeout={init_timeout}"]
    with silent_server() as silent_url:
        for name, url in [("silent", silent_url), ("refusing", _refusing_url())]:
            env = _wandb_env(WANDB_BASE_URL=url, **fake_key)
            outcome, stderr, exit_delay, _, cfg = _train(tokenized_smoke, tmp_path / name, env,
                                                         *online)  # fmt: skip
            delay = outcome["setup_s"] - offline["setup_s"]
            print(f"W&B server {name}: start {delay:+.2f} s, exit {exit_delay:.2f} s vs offline "
                  f"{offline_exit:.2f} s")  # fmt: skip
            assert "W&B online start failed" in stderr and url in stderr
            # Two runs on shared cores differ by noise that grows with the machine's load: up
            # to the offline run's own start-up, plus 3 s. The bound still fails a start that
            # waits W&B's default (90 s) instead of init_timeout.
            noise = offline["setup_s"] + 3
            assert delay < init_timeout + noise
            assert exit_delay < offline_exit + noise
            # The same training and the same W&B history, kept offline (`wandb sync` later).
            for key in ("val/loss", "steps", "num_parameters"):
                assert outcome["metrics"][key] == offline["metrics"][key], key
            assert outcome["metrics"]["last"] == offline["metrics"]["last"]
            assert _history(cfg.paths.wandb_dir) == _history(offline_cfg.paths.wandb_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "mode"), [("env", "disabled"), ("config", "disabled"), ("config", "offline")]
)
def test_disabled_and_offline_training_open_no_network_connection(
    tokenized_smoke, tmp_path, where, mode
):
    """Every connect() of every process (strace, where installed) and every Python-level
    connect, DNS lookup and process start (audit hooks): disabled opens no socket at all,
    offline only the local socket of W&B's own service; neither reaches for the network."""
    env = _wandb_env(WANDB_MODE=mode) if where == "env" else _wandb_env()
    # A reachable-looking server, to be sure nothing tries it.
    env["WANDB_BASE_URL"] = "http://192.0.2.1:8080"  # TEST-NET-1: never routed
    overrides = [f"logger.wandb.mode={mode}"] if where == "config" else []
    outcome, _, _, connects, cfg = _train(tokenized_smoke, tmp_path, env, *overrides,
                                          strace=shutil.which("strace") is not None)  # fmt: skip
    assert outcome["metrics"]["steps"] == 4
    events = outcome["events"]
    assert not [e for e in events if e[0] == "dns"], events
    if mode == "disabled":
        assert events == [], events  # no connection, no lookup, no W&B service process
        assert offline_run_dirs(cfg.paths.wandb_dir) == []
    else:
        assert "wandb-core" in [e[1] for e in events if e[0] == "spawn"]  # its local service
        assert all(e[1].startswith("/") for e in events if e[0] == "connect"), events  # AF_UNIX
        assert len(offline_run_dirs(cfg.paths.wandb_dir)) == 1
    if connects is not None:
        network = [c for c in connects if "AF_INET" in c]
        local = [c for c in connects if "AF_UNIX" in c and "nscd" not in c]
        print(f"{where} {mode}: connect() calls {connects}")
        assert network == []
        if mode == "disabled":
            assert local == []  # (glibc's user-name lookups may ask nscd: not W&B, not network)
        else:  # W&B's service socket, connected to from another process: strace followed it
            assert any("wandb" in c for c in local), connects


# ------------------------------------------------ a server that answers HEAD but holds POSTs

# Starts a W&B run from `cfg.json` (argv[1]) with `start_wandb_run`, logs three steps, finishes
# it and writes `result.json` beside it: whether it fell back offline, the seconds spent in the
# start and in `finish()`, and the end time (the parent measures the exit after it).
RUN_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import wandb  # imported before the clock starts: the start is W&B's, not Python's
    from pipeline.config import from_dict
    from pipeline.tracking import start_wandb_run

    folder = os.path.dirname(os.path.abspath(sys.argv[1]))
    with open(sys.argv[1]) as f:
        cfg = from_dict(json.load(f))
    began = time.monotonic()
    run = start_wandb_run(cfg, job_type="train")
    started, offline = time.monotonic(), run.offline
    for step in range(1, 4):
        run.log({"train/loss": 1.0 / step, "trainer/global_step": step})
    run.finish()
    result = {"offline": offline, "start_s": started - began,
              "finish_s": time.monotonic() - started, "ended": time.time()}
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(result, f)
    """
)


def _graphql_answer(server_url: str, request: dict) -> dict:
    """Just enough of W&B's GraphQL API for wandb-core to start a run and list its files."""
    variables = request.get("variables") or {}
    operation = request.get("operationName")
    if operation == "UpsertBucket":
        project = {"id": "cA==", "name": variables.get("project") or "p",
                   "entity": {"id": "ZQ==", "name": "e"}}  # fmt: skip
        bucket = {"id": "Yg==", "name": variables.get("name") or "r", "displayName": "r",
                  "project": project}  # fmt: skip
        return {"upsertBucket": {"bucket": bucket, "inserted": True}}
    if operation == "Viewer":
        return {"viewer": {"id": "dQ==", "entity": "e", "username": "u", "email": "",
                           "flags": "{}", "teams": {"edges": []}}}  # fmt: skip
    if operation == "CreateRunFiles":
        files = [{"name": name, "uploadUrl": f"{server_url}/upload/{name}"}
                 for name in variables.get("files", [])]  # fmt: skip
        return {"createRunFiles": {"runID": "cg==", "uploadHeaders": [], "files": files}}
    if operation == "ServerFeaturesQuery":
        return {"serverInfo": {"features": []}}
    return {}


@contextlib.contextmanager
def holding_server(answer_graphql: bool = False):
    """A real HTTP server that answers HEAD and GET at once but holds every POST and PUT
    unanswered until it stops (with `answer_graphql`, it answers GraphQL and holds the run's
    file stream and uploads); yields (url, the (method, path) of every request)."""
    import http.server

    requests: list[tuple[str, str]] = []
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_HEAD(self) -> None:
            requests.append((self.command, self.path))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def do_POST(self) -> None:
            requests.append((self.command, self.path))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not (answer_graphql and self.path == "/graphql"):
                stop.wait(timeout=600)  # held: no answer, the connection stays open
                return
            answer = json.dumps({"data": _graphql_answer(url, json.loads(body))}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        do_PUT = do_POST

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url, requests
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the server did not stop"


def _start_and_finish(make_config, root: Path, env: dict, *overrides: str):
    """Run RUN_SCRIPT in a subprocess; (result, stderr, exit delay s, cfg)."""
    cfg = make_config(*overrides, root=root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "cfg.json").write_text(json.dumps(to_dict(cfg)))
    (root / "run.py").write_text(RUN_SCRIPT)
    result = subprocess.run([sys.executable, "run.py", "cfg.json"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    exited = time.time()
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads((root / "result.json").read_text())
    return outcome, result.stderr, exited - outcome["ended"], cfg


UNBOUNDED_WAIT_S = 10.0  # W&B's own wait on a held request (an account lookup, a telemetry POST)


@pytest.mark.slow
def test_a_server_holding_posts_costs_at_most_init_timeout_exit_included(
    make_config, tmp_path, no_wandb_account
):
    """A server that answers HEAD but holds POSTs would cost W&B's own waits (account lookups;
    then its usage telemetry POSTed to /sdk/otel/v1/metrics at exit, 10 s a try). Every wait is
    bounded by init_timeout, no telemetry is sent, nothing of the run is lost (`wandb sync`
    uploads it later). Two servers: one holds every POST (the start falls back offline), one
    takes the run but holds its file stream and uploads (finish gives up)."""
    init_timeout = 3.0
    # Two runs' start-up differs by CPU load, not by the server: allow half of the smallest
    # unbounded wait this guards against, so one such wait still fails the test on any machine.
    margin = UNBOUNDED_WAIT_S / 2
    env = _wandb_env(PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    env.pop("WANDB_ERROR_REPORTING", None)  # as users run it: telemetry not asked for, not off
    baseline, _, baseline_exit, _ = _start_and_finish(make_config, tmp_path / "offline", env)
    online = ["logger.wandb.mode=online", f"logger.wandb.init_timeout={init_timeout}"]
    fake_key = {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567"}  # 40 characters
    for name, answer_graphql in [("holds-posts", False), ("holds-uploads", True)]:
        with holding_server(answer_graphql) as (url, requests):
            outcome, stderr, exit_delay, cfg = _start_and_finish(
                make_config, tmp_path / name, {**env, "WANDB_BASE_URL": url, **fake_key}, *online
            )
        start = outcome["start_s"] - baseline["start_s"]
        print(f"{name}: start {start:+.2f} s, finish {outcome['finish_s']:.2f} s, exit "
              f"{exit_delay:.2f} s (offline: finish {baseline['finish_s']:.2f} s, exit "
              f"{baseline_exit:.2f} s); requests {sorted(set(requests))}")  # fmt: skip
        posted = {path for method, path in requests if method != "HEAD"}
        assert not [path for path in posted if "otel" in path], posted  # no usage telemetry
        assert ("HEAD", "/") in requests  # it was reached, and answered
        assert start < init_timeout + margin
        assert outcome["finish_s"] < init_timeout + margin
        assert exit_delay < baseline_exit + margin
        wandb_dir = Path(cfg.paths.wandb_dir) / "wandb"
        if answer_graphql:  # started online; what was not uploaded stays in its run folder
            assert not outcome["offline"]
            assert "/graphql" in posted and any("file_stream" in path for path in posted)
            assert "wandb sync" in stderr
            (run_dir,) = wandb_dir.glob("run-*")
        else:  # fell back offline after init_timeout
            assert outcome["offline"]
            assert "W&B online start failed" in stderr and "/graphql" in stderr
            assert posted == {"/graphql"}  # the run's creation, nothing else
            (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
        saved = read_offline_run(run_dir)
        assert saved["complete"] and saved["config"] == to_dict(cfg)
        losses = [row["train/loss"] for row in saved["history"] if "train/loss" in row]
        assert losses == pytest.approx([1.0, 0.5, 1 / 3])
