#!/usr/bin/env bash
# The GPU figures of docs/lab-benchmarks.md in one run, on a machine without internet and without
# .git (a copy of the work tree on a GPU box):
#   1. the GPU suite (benchmarks/gpu_suite.py): ours vs torch.nn.Transformer vs fairseq fp32,
#      --fp16 and --amp at Transformer-tiny and paper-base sizes, bf16 and TF32, MFU, peak
#      memory; decoding ours vs CTranslate2 vs fairseq at batch 1, 16 and 128;
#   2. trials per hour of 1, 4 and 16 sweep workers sharing the card
#      (benchmarks/sweep_workers.py --through-sweep on benchmarks/specs/workers_tiny.yaml).
#
#   benchmarks/gpu_figures.sh <commit> <out-dir>
#
# <commit> is recorded as the runs' commit. Carried with the tree as for remote_jobs.sh, made
# by benchmarks/carry.sh: .whl/ (and .whl/fallback/), .devrun/multi30k/ and
# .devrun/fairseq-wheels/ (without it the suite skips fairseq). Each step has its
# own time limit (GPU_SUITE_S, SWEEP_S), so that one that overruns leaves the other's figures;
# sweep_workers writes its JSON after every N. What comes back in <out-dir>: gpu_suite.json,
# sweep_workers.json, machine.txt (card, driver, libraries, packages) and the logs. It exits 1
# where a step failed or ran out of time (what it wrote is kept), else 0.
# tests/lab/test_gpu_figures.py runs it on a CPU with small settings: GPU_FIGURES_TOKENIZED (a
# tokenize stage's output to use instead of tokenizing), GPU_SUITE_OPTIONS, GPU_FIGURES_WORKERS,
# GPU_FIGURES_TRIALS_PER_WORKER and GPU_FIGURES_SPEC.
set -u
# shellcheck source=benchmarks/remote_jobs.sh
source "$(dirname "${BASH_SOURCE[0]}")/remote_jobs.sh"

GPU_SUITE_S=${GPU_SUITE_S:-240}
SWEEP_S=${SWEEP_S:-240}
WORKERS=${GPU_FIGURES_WORKERS:-1 4 16}
TRIALS_PER_WORKER=${GPU_FIGURES_TRIALS_PER_WORKER:-2}
SPEC=${GPU_FIGURES_SPEC:-benchmarks/specs/workers_tiny.yaml}
# shellcheck disable=SC2206 # the words of the variable are the options
SUITE_OPTIONS=(${GPU_SUITE_OPTIONS:-})

machine() {
    echo "== nvidia-smi"
    command -v nvidia-smi >/dev/null && nvidia-smi
    echo "== CUDA libraries the loader knows"
    ldconfig -p 2>/dev/null | grep -E 'libcublas|libcudart|libcudnn' || echo "none"
    echo "== MPS"
    command -v nvidia-cuda-mps-control || echo "nvidia-cuda-mps-control: not installed"
    echo "== CPU"
    grep -m1 "model name" /proc/cpuinfo
    echo "cores: $(nproc --all), usable: $("$PYTHON" -c "import os; print(len(os.sched_getaffinity(0)))")"
    echo "== packages carried"
    "$PYTHON" -m pip freeze --path "$SITE" 2>/dev/null
    echo "== packages"
    "$PYTHON" -m pip freeze 2>/dev/null
}

main() {
    local out=$2 device=cpu
    export TRANSFORMER_ABLATIONS_COMMIT=$1
    mkdir -p "$out" "$LOGS"
    install || exit 1
    machine >"$out/machine.txt" 2>&1
    "$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && device=cuda
    local fairseq=$RUNS/no-fairseq-venv  # the suite names what is missing and skips fairseq
    if [[ ! -d $ROOT/.devrun/fairseq-wheels ]]; then
        echo "no fairseq wheels carried (.devrun/fairseq-wheels): the suite skips fairseq"
    elif fairseq_venv; then
        fairseq=$FAIRSEQ_VENV
    else
        echo "fairseq's venv did not build: the suite skips fairseq"
    fi

    # one vocabulary for every size of the suite: tokenized once (params.yaml as `dvc exp run`)
    local data=$RUNS/suite-data tokenized=${GPU_FIGURES_TOKENIZED:-}
    if [[ -z $tokenized ]]; then
        mkdir -p "$data"
        (cd "$data" && "$PYTHON" -m pipeline.params "~experiment" data.tokenizer.vocab_size=10000 \
            -o params.yaml && "$PYTHON" -m pipeline.stages.prepare &&
            "$PYTHON" -m pipeline.stages.tokenize) >"$LOGS/suite-data.log" 2>&1 ||
            { tail "$LOGS/suite-data.log"; exit 1; }
        tokenized=$data/data/tokenized
    fi

    echo "== $(date -u +%T) GPU suite on $device (at most $GPU_SUITE_S s)"
    OMP_NUM_THREADS=4 MKL_NUM_THREADS=4 timeout "$GPU_SUITE_S" "$PYTHON" -m benchmarks.gpu_suite \
        --device "$device" --tokenized "$tokenized" --fairseq-venv "$fairseq" \
        --out "$out/gpu_suite.json" "${SUITE_OPTIONS[@]}" >"$LOGS/gpu_suite.log" 2>&1
    step_ended $?
    grep -v '^{' "$LOGS/gpu_suite.log" | tail -40

    echo "== $(date -u +%T) sweep workers $WORKERS (at most $SWEEP_S s)"
    # shellcheck disable=SC2086 # the numbers of workers are words
    env -u OMP_NUM_THREADS -u MKL_NUM_THREADS timeout "$SWEEP_S" "$PYTHON" -m benchmarks.sweep_workers \
        --through-sweep $WORKERS --n-trials "$TRIALS_PER_WORKER" --spec "$SPEC" \
        --out "$out/sweep_workers.json" >"$LOGS/sweep_workers.log" 2>&1
    step_ended $?
    grep -v '^{' "$LOGS/sweep_workers.log" | tail -15
    echo "== $(date -u +%T) done"
    cp "$LOGS"/gpu_suite.log "$LOGS"/sweep_workers.log "$out/"
    if [[ -f $LOGS/fairseq-venv.log ]]; then
        tail -c 200000 "$LOGS/fairseq-venv.log" >"$out/fairseq-venv.log"
    fi
    return "$failed"
}

# A step's exit status, shown; any but 0 (124: over its time limit) makes the run's own 1.
failed=0
step_ended() {
    echo "exit $1"
    (($1 == 0)) || failed=1
}

main "$@"
