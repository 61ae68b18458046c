#!/usr/bin/env bash
# The long runs of issues #18 and #19 on a lent GPU machine (the `device` tool's `run`), which
# gets a copy of the work tree without .git, has no internet, and holds its own torch (CUDA).
# Prepared here, on the machine with pip (wheels and corpus in folders that .git/info/exclude
# lists, `/.whl/` and `/.devrun/`: ignored, so never committed, and named in the run's carry):
#   python -m pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl \
#       <the lock's packages that the GPU image lacks>
#   cp -r ../shared/data/multi30k .devrun/multi30k
#   (fairseq jobs) fairseq-fixed==0.12.3.1's sdist and the wheels of its dependencies that the
#   image lacks (hydra-core 1.3.2, omegaconf 2.3.0, antlr4 4.9.3, bitarray, subword-nmt,
#   sacremoses, cffi) in .devrun/fairseq-wheels: a `run` carries at most 64 MiB, so a call
#   that carries these may leave .whl out (what an earlier call installed stays there).
# There, in the tree's root (each a `run` of at most 10 minutes; the jobs outlive a call):
#   scripts/lent_gpu.sh start <commit> [table3] [wu:<name>:<override>...] \
#       [fairseq:<name>:<benchmarks.fairseq_peer options>...]              # background jobs
#   scripts/lent_gpu.sh wait_jobs <seconds>  # progress until every job ended or time is up
#   scripts/lent_gpu.sh collect            # $OUT/results.tgz.part-*: records, metrics, hypotheses,
#                                          # each Wu run's averaged model (eval/model.ckpt: decoding searches)
# Issue the next `run` at once when one returns: a machine idle for 30 s is given back, and
# the jobs die with it. Everything a job writes lives under $RUNS, outside the tree: each
# `run` copies the tree again, replacing tracked files (a study's storage, its records).
# Back here: `cat results.tgz.part-* | tar xz`; a Wu run is recorded with
#   python -m pipeline.results record <name> --command ... --metrics-dir wu/<name>/metrics \
#       --params wu/<name>/params.yaml --eval-dir wu/<name>/eval --made-on wu/<name>/made_on.json
# and the study's records and storage are copied from results/table3 into ablations/results/.
# A Wu et al. run is the DVC stages of dvc.yaml in their order in its own folder, on the
# params.yaml that `dvc exp run -S experiment=multi30k_wu2021 -S <override>` would write;
# the Table-3 study is `python -m pipeline.sweep ablations/table3.yaml` workers, one per
# point left.
set -u
ROOT=$(pwd)
RUNS=/tmp/lent-gpu
LOGS=$RUNS/logs
export PYTHONUNBUFFERED=1 WANDB_MODE=${WANDB_MODE:-disabled} MULTI30K_DIR=$ROOT/.devrun/multi30k
export PYTHONPATH=/tmp/site:$ROOT OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

start() {
    export TRANSFORMER_ABLATIONS_COMMIT=$1
    shift
    mkdir -p "$LOGS"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl >"$LOGS/pip.log" 2>&1 || { tail "$LOGS/pip.log"; exit 1; }
    nvidia-smi -L
    python3 -c "import torch, lightning, optuna, datasets, dvclive, hydra, sacremoses
print('torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 1
    # MPS lets the small kernels of many processes share the GPU instead of time-slicing it
    nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "no MPS: time-slicing"
    python3 -m pip freeze >"$RUNS/freeze.txt" 2>/dev/null
    local job
    for job in "$@"; do
        case $job in
        table3)
            local left
            left=$(python3 -c "
import optuna
from pipeline.sweep import load_spec
spec = load_spec('ablations/table3.yaml')
study = optuna.load_study(study_name=spec.study, storage='sqlite:///ablations/results/table3/study.db')
done = {(t.params['variant'], t.params['seed']) for t in study.get_trials() if t.state.name == 'COMPLETE'}
print(len(spec.grid()) - len(done))")
            echo "table3: starting $left workers"
            mkdir -p "$RUNS/results" && cp -r ablations/results/table3 "$RUNS/results/"
            for i in $(seq 1 "$left"); do
                setsid nohup nice -n 5 python3 -m pipeline.sweep ablations/table3.yaml \
                    --results-dir "$RUNS/results" --work-dir "$RUNS/sweeps" \
                    >"$LOGS/table3-worker-$i.log" 2>&1 &
                sleep 3
            done
            ;;
        wu:*)
            IFS=: read -r _ name overrides <<<"$job"
            mkdir -p "$RUNS/wu/$name"
            (cd "$RUNS/wu/$name" && python3 -m pipeline.config experiment=multi30k_wu2021 \
                $overrides >params.yaml && python3 -m pipeline.environment >made_on.json) || exit 1
            echo "wu: $name ($overrides)"
            setsid nohup bash -c "cd $RUNS/wu/$name && for stage in prepare tokenize train evaluate; do python3 -m pipeline.stages.\$stage || exit; done" \
                >"$LOGS/wu-$name.log" 2>&1 &
            ;;
        fairseq:*)
            IFS=: read -r _ name options <<<"$job"
            mkdir -p "$RUNS/fairseq"
            local venv_options
            venv_options="--device cuda --system-site-packages --venv /tmp/fairseq-venv
                --torch-spec torch==$(python3 -c "import torch; print(torch.__version__.split('+')[0])")"
            # its own venv over the image's torch, built once before the jobs share it; pip
            # reads the carried wheels, offline
            export PIP_NO_INDEX=1 PIP_FIND_LINKS=$ROOT/.devrun/fairseq-wheels
            python3 -m benchmarks.fairseq_peer --build-venv-only $venv_options \
                >>"$LOGS/fairseq-venv.log" 2>&1 || { tail -20 "$LOGS/fairseq-venv.log"; exit 1; }
            echo "fairseq: $name ($options)"
            setsid nohup python3 -m benchmarks.fairseq_peer --out "$RUNS/fairseq/$name.json" \
                $venv_options --work-dir "$RUNS/fairseq-work/$name" $options \
                >"$LOGS/fairseq-$name.log" 2>&1 &
            ;;
        *) echo "unknown job $job" && exit 2 ;;
        esac
    done
}

running() { pgrep -f "pipeline\.(sweep|stages)|fairseq" | wc -l; }

progress() {
    echo "== $(date -u +%T) processes: $(running); table3 records: $(ls "$RUNS/results/table3/trials" 2>/dev/null | wc -l)"
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
        sleep 60
    done
    progress
}

collect() {
    cd "$RUNS" || exit 1
    local study=results/table3/study.db
    if [[ -f $study ]]; then  # a consistent copy while workers may still write to it
        python3 -c "import sqlite3; sqlite3.connect('$study').backup(sqlite3.connect('study-snapshot.db'))"
    fi
    # what a result needs, no checkpoints or data; in parts under the tool's 16 MiB a file
    tar czf - --exclude study.db logs freeze.txt $(ls -d study-snapshot.db results 2>/dev/null) \
        $(ls -d wu/*/params.yaml wu/*/made_on.json wu/*/metrics wu/*/eval wu/*/plots 2>/dev/null) \
        $(ls -d fairseq 2>/dev/null) |
        split -b 15M - "$OUT/results.tgz.part-"
    ls -la "$OUT"
}

"$@"
