#!/usr/bin/env bash
# What benchmarks/remote_jobs.sh and benchmarks/gpu_figures.sh read on a machine without
# internet, made here where pip's indexes are reachable, into ignored folders of the tree:
#
#   benchmarks/carry.sh [PYTHON_VERSION]    # the remote's Python (default 3.12)
#
#   .whl/                    benchmarks/remote_packages.txt at requirements.lock's versions, as
#                            wheels for that Python on x86-64 Linux (a package published only as
#                            source is built here, and must build to a pure-Python wheel)
#   .whl/fallback/           datasets with the dill and multiprocess it pins, at versions that
#                            take an older pyarrow (remote_jobs.sh installs them only where the
#                            carried datasets does not import)
#   .devrun/multi30k/        the corpus
#   .devrun/fairseq-wheels/  fairseq-fixed built as a pure-Python wheel without its C++ and Cython
#                            extensions and without its examples (the step timing and decoding
#                            use none of them), and the wheels of train_peer's dependencies that
#                            a CUDA image lacks
#
# About 45 MB in all; name .whl and .devrun in what travels with the tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION=${1:-3.12}
PYTHON=${PYTHON:-.venv/bin/python}
CORPUS=${MULTI30K_DIR:-../shared/data/multi30k}
PLATFORMS=()
for tag in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 \
    manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_39; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
FALLBACK=(datasets==4.0.0 dill==0.3.8 multiprocess==0.70.16)
# train_peer's DEPENDENCIES that a CUDA image lacks, with what they need in turn
FAIRSEQ_DEPENDENCIES=(hydra-core==1.3.2 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 bitarray
    cffi pycparser subword-nmt==0.3.8 sacremoses==0.2.0 mock setuptools wheel)
FAIRSEQ=fairseq-fixed==0.12.3.1

# `name==version` of requirements.lock for a name of remote_packages.txt
locked() {
    "$PYTHON" -c "
import sys
from packaging.utils import canonicalize_name
from pipeline.environment import read_lock
pins = read_lock()
for name in sys.argv[1:]:
    print(f'{name}=={pins[canonicalize_name(name)]}')" "$@"
}

# wheels of `spec`... for the remote into $1: a binary for its Python where one is published,
# else a pure-Python wheel built here from the source
wheels_into() {
    local folder=$1 spec
    shift
    mkdir -p "$folder"
    for spec in "$@"; do
        "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$VERSION" \
            --implementation cp "${PLATFORMS[@]}" -d "$folder" "$spec" 2>/dev/null && continue
        "$PYTHON" -m pip wheel -q --no-deps -w "$folder" "$spec"
        compgen -G "$folder/$(echo "${spec%%==*}" | tr '.-' '__')-*-py3-none-any.whl" >/dev/null ||
            { echo "$spec: no wheel for Python $VERSION and no pure-Python build" >&2 && exit 1; }
    done
}

rm -rf .whl .devrun/fairseq-wheels
mapfile -t packages < <(grep -v '^#' benchmarks/remote_packages.txt)
mapfile -t pinned < <(locked "${packages[@]}")
wheels_into .whl "${pinned[@]}"
wheels_into .whl/fallback "${FALLBACK[@]}"
wheels_into .devrun/fairseq-wheels "${FAIRSEQ_DEPENDENCIES[@]}"

source=$(mktemp -d)
trap 'rm -rf "$source"' EXIT
READTHEDOCS=1 "$PYTHON" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation \
    -d "$source" "$FAIRSEQ"
tar xzf "$source"/*.tar.gz -C "$source"
tree=$(echo "$source"/*/)
# READTHEDOCS: setup.py builds no extension; the examples are neither packaged nor linked in
rm -rf "$tree/fairseq/examples"
sed -i -e 's/^\( *\)os\.symlink(os\.path\.join("\.\.", "examples"), fairseq_examples)$/\1pass/' \
    -e 's/get_files(fairseq_examples)$/[]/' "$tree/setup.py"
READTHEDOCS=1 "$PYTHON" -m pip wheel -q --no-deps --no-build-isolation -w .devrun/fairseq-wheels "$tree"

mkdir -p .devrun
rm -rf .devrun/multi30k
cp -r "$CORPUS" .devrun/multi30k
du -sh .whl .devrun
