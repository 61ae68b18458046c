#!/usr/bin/env bash
# Run a list of jobs on a remote machine that has no internet and no .git (a copy of the work
# tree, e.g. a rented GPU box), where each command may run only a few minutes: the jobs start in
# the background and outlive the command that started them, later commands report progress,
# and a last one packs the results for the trip back. The same script runs on a CPU machine
# (no GPU steps then); tests/lab/test_remote_jobs.py runs it end to end there.
#
# Why not `dvc queue` or several `python -m pipeline.sweep` workers alone: DVC experiments
# need a git repository, and neither starts fairseq runs, installs carried wheels offline or
# packs the results into parts small enough to copy back.
#
# Carried with the tree (ignored paths, never committed; `benchmarks/carry.sh` makes them):
#   .whl/                  wheels of the lock's packages the remote image lacks
#   .devrun/multi30k/      the corpus
#   .devrun/fairseq-wheels fairseq jobs: fairseq-fixed==0.12.3.1 and the wheels of its dependencies
# Each command that starts or reads jobs must carry every folder they still read.
#
# On the remote machine, in the tree's root:
#   benchmarks/remote_jobs.sh start <commit> <job>...   # the jobs, in the background
#   benchmarks/remote_jobs.sh wait_jobs <seconds>       # progress until every job ended or time is up
#   benchmarks/remote_jobs.sh collect [models]          # $OUT/results.tgz.part-* (15 MB parts)
# <commit> is recorded as each run's commit (the copy has no .git to tell it).
# Jobs:
#   study:<spec>                  `python -m pipeline.sweep <spec> --workers <points left>`
#   dvc:<name>:<overrides>        the stages of dvc.yaml in their order, in a folder of their
#                                 own, on the params.yaml `dvc exp run -S <override>...` writes
#   wu:<name>:<overrides>         dvc:<name>:experiment=multi30k_wu2021 <overrides>
#   fairseq:<name>:<options>      python -m benchmarks.fairseq.train_peer <options> --device cuda
# Everything a job writes lives under $RUNS, outside the tree, so that a later command that
# copies the tree again (replacing tracked files) leaves it alone.
# What comes back (`cat results.tgz.part-* | tar xz`): logs/; results/<study>/ (records and a
# consistent snapshot of study.db: copy them into ablations/results/); dvc/<name>/ (params,
# metrics, hypotheses, made_on.json, and with `models` the averaged eval/model.ckpt), to record
# with
#   python -m pipeline.results record <row> --command ... --metrics-dir dvc/<name>/metrics \
#       --params dvc/<name>/params.yaml --eval-dir dvc/<name>/eval --made-on dvc/<name>/made_on.json
# and fairseq/<name>.json with its hypotheses (results/parity/).
set -u
ROOT=$(pwd)
RUNS=${REMOTE_JOBS_RUNS:-/tmp/remote-jobs}
WHEELS=${REMOTE_JOBS_WHEELS:-.whl}  # carried
SITE=${REMOTE_JOBS_SITE:-/tmp/site}  # ... installed
PYTHON=${PYTHON:-python3}
LOGS=$RUNS/logs
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-disabled}
export MULTI30K_DIR=${MULTI30K_DIR:-$ROOT/.devrun/multi30k}
export PYTHONPATH=$SITE:$ROOT OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# torch takes the fewer of the two, so MKL's follows OMP's unless set
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-$OMP_NUM_THREADS}

# Points of `spec` not yet COMPLETE in the SQLite storage file `$2` (all: no file yet).
points_left() {
    "$PYTHON" -c "
import os, sys, optuna
from pipeline.sweep import load_spec
spec, path = load_spec(sys.argv[1]), sys.argv[2]
trials = []
if os.path.exists(path):
    trials = optuna.load_study(study_name=spec.study, storage=f'sqlite:///{path}').get_trials()
done = {tuple(sorted(t.params.items())) for t in trials if t.state.name == 'COMPLETE'}
print(len(spec.grid()) - len(done))" "$1" "$2"
}

start_study() {
    local spec=$1 study
    study=$("$PYTHON" -c "import sys; from pipeline.sweep import load_spec; print(load_spec(sys.argv[1]).study)" "$spec")
    mkdir -p "$RUNS/results"
    [[ -d ablations/results/$study ]] && cp -r "ablations/results/$study" "$RUNS/results/"
    local left
    left=$(points_left "$spec" "$RUNS/results/$study/study.db") || return 1
    ((left > 0)) || { echo "study $study: every point is complete" && return 0; }
    echo "study $study: starting $left workers"
    # one launcher, `left` workers sharing the GPU (the MPS daemon started above)
    setsid nohup nice -n 5 "$PYTHON" -m pipeline.sweep "$spec" --workers "$left" \
        --results-dir "$RUNS/results" --work-dir "$RUNS/sweeps" >"$LOGS/$study-workers.log" 2>&1 &
}

start_dvc() {
    local name=$1 overrides=$2 folder=$RUNS/dvc/$1
    mkdir -p "$folder"
    # shellcheck disable=SC2086 # the overrides are words
    (cd "$folder" && "$PYTHON" -m pipeline.params $overrides -o params.yaml &&
        "$PYTHON" -m pipeline.environment >made_on.json) || return 1
    echo "dvc: $name ($overrides)"
    setsid nohup bash -c "cd $folder && for stage in prepare tokenize train evaluate; do $PYTHON -m pipeline.stages.\$stage || exit; done" \
        >"$LOGS/dvc-$name.log" 2>&1 &
}

FAIRSEQ_VENV=${REMOTE_JOBS_FAIRSEQ_VENV:-/tmp/fairseq-venv}

# fairseq's own venv over the image's torch (built once; a later call reuses it): pip reads
# the carried wheels, offline. Sets venv_options for train_peer.
fairseq_venv() {
    venv_options="--device cuda --system-site-packages --venv $FAIRSEQ_VENV
        --torch-spec torch==$("$PYTHON" -c "import torch; print(torch.__version__.split('+')[0])")"
    mkdir -p "$LOGS"
    # shellcheck disable=SC2086
    PIP_NO_INDEX=1 PIP_FIND_LINKS=$ROOT/.devrun/fairseq-wheels \
        "$PYTHON" -m benchmarks.fairseq.train_peer --build-venv-only $venv_options \
        >>"$LOGS/fairseq-venv.log" 2>&1 || { tail -20 "$LOGS/fairseq-venv.log"; return 1; }
}

start_fairseq() {
    local name=$1 options=$2 venv_options
    mkdir -p "$RUNS/fairseq"
    fairseq_venv || return 1
    echo "fairseq: $name ($options)"
    # shellcheck disable=SC2086
    setsid nohup "$PYTHON" -m benchmarks.fairseq.train_peer --out "$RUNS/fairseq/$name.json" \
        $venv_options --work-dir "$RUNS/fairseq-work/$name" $options \
        >"$LOGS/fairseq-$name.log" 2>&1 &
}

# The carried wheels into $SITE, then a check that the project's packages import. Where one
# does not (the image's own version of a shared dependency is too old for a carried one), the
# wheels of $WHEELS/fallback, made for older versions, are put over them and checked again.
install() {
    mkdir -p "$LOGS"
    local wheels
    for wheels in "$WHEELS" "$WHEELS/fallback"; do
        if compgen -G "$wheels/*.whl" >/dev/null; then
            "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" "$wheels"/*.whl >>"$LOGS/pip.log" 2>&1 ||
                { tail "$LOGS/pip.log"; return 1; }
        fi
        "$PYTHON" -c "import torch, lightning, optuna, datasets, dvclive, hydra, sacremoses, wandb
print('torch', torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU')" \
            2>>"$LOGS/pip.log" && return 0
        echo "the carried packages do not import with $wheels (see $LOGS/pip.log)"
    done
    tail "$LOGS/pip.log"
    return 1
}

start() {
    export TRANSFORMER_ABLATIONS_COMMIT=$1
    shift
    install || exit 1
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L
        # MPS lets the small kernels of many processes share the GPU instead of time-slicing it
        nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "no MPS: time-slicing"
    fi
    "$PYTHON" -m pip freeze --path "$SITE" >"$RUNS/freeze-carried.txt" 2>/dev/null
    "$PYTHON" -m pip freeze >"$RUNS/freeze.txt" 2>/dev/null
    local job kind name rest failed=0
    for job in "$@"; do  # every job's kind checked before any starts
        [[ $job =~ ^(study|dvc|wu|fairseq): ]] || { echo "unknown job $job" && exit 2; }
    done
    for job in "$@"; do  # a job that cannot start leaves the others running
        IFS=: read -r kind name rest <<<"$job"
        case $kind in
        study) start_study "$name" ;;
        dvc) start_dvc "$name" "$rest" ;;
        wu) start_dvc "$name" "experiment=multi30k_wu2021 $rest" ;;
        fairseq) start_fairseq "$name" "$rest" ;;
        esac || { echo "NOT STARTED: $job" && failed=1; }
    done
    return $failed
}

# This run's jobs: every one has $RUNS in its command line (a stage, in its parent shell's).
running() { pgrep -f -- "$RUNS/" | wc -l; }

progress() {
    echo "== $(date -u +%T) processes: $(running); study records: $(find "$RUNS/results" -path '*/trials/*' -name run.json 2>/dev/null | wc -l)"
    command -v nvidia-smi >/dev/null &&
        nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    local log
    for log in "$LOGS"/*.log; do
        printf '%s: %s\n' "$(basename "$log")" "$(tr '\r' '\n' <"$log" | grep -v '^\s*$' | tail -1 | cut -c1-160)"
    done
}

wait_jobs() {
    local until=$((SECONDS + $1))
    while ((SECONDS < until)) && (($(running) > 0)); do
        progress
        # never past the deadline: the caller's next step (collect) must fit in its call
        local left=$((until - SECONDS)) poll=${REMOTE_JOBS_POLL:-60}
        ((left > 0)) && sleep $((left < poll ? left : poll))
    done
    progress
}

collect() {
    local models=()
    [[ ${1:-} == models ]] || models=(--exclude '*.ckpt')
    cd "$RUNS" || exit 1
    local storage
    for storage in results/*/study.db; do  # a consistent copy while workers may still write
        [[ -f $storage ]] && "$PYTHON" -c "import sqlite3, sys
sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" "$storage" "$storage.snapshot"
    done
    # what a result needs, no checkpoints or data; in parts small enough to copy back
    # shellcheck disable=SC2046
    tar czf - --exclude study.db --exclude wandb "${models[@]}" --transform 's/study\.db\.snapshot$/study.db/' logs freeze*.txt \
        $(ls -d results dvc/*/params.yaml dvc/*/made_on.json dvc/*/metrics dvc/*/eval dvc/*/plots \
            fairseq 2>/dev/null) |
        split -b 15M - "$OUT/results.tgz.part-"
    rm -f results/*/study.db.snapshot
    ls -la "$OUT"
}

# Run as a command (`remote_jobs.sh start ...`); sourced (gpu_figures.sh), only define.
if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    "$@"
fi
