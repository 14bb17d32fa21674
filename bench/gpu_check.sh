#!/usr/bin/env bash
# The GPU checks in one command, for a machine with CUDA, CuPy and torch (CI has no GPU):
# build the extensions, run every cuda-backend test row, then a short bench/gpu_bench.py.
#   bash bench/gpu_check.sh                 # logs under ./gpu_logs
#   LOGS=/tmp/x PYTEST_S=200 BENCH_S=150 BENCH="--H 256 --batch 64" bash bench/gpu_check.sh
# WHEELS=DIR installs the wheels in DIR first (--no-index, into /tmp/site): for a machine
# that cannot reach a package index. Each step has a time limit, so a slow one still leaves
# the others their time; every log is kept.
cd "$(dirname "$0")/.."
logs="${LOGS:-gpu_logs}"
mkdir -p "$logs"
if [ -n "${WHEELS:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl || exit 3
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L || true
python3 -c "import sys, numpy, cupy; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'cupy', cupy.__version__)" || exit 4
t0=$(date +%s)
python3 setup.py build_ext --inplace -j "$(nproc)" > "$logs/build.log" 2>&1
echo "build rc $? in $(( $(date +%s) - t0 ))s"
t0=$(date +%s)
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n $(( $(nproc) < 12 ? $(nproc) : 12 ))")
# shellcheck disable=SC2086
timeout "${PYTEST_S:-300}" python3 -m pytest -q $workers tests -k cuda -p no:cacheprovider -rf > "$logs/pytest_cuda.log" 2>&1
echo "pytest rc $? in $(( $(date +%s) - t0 ))s"
tail -25 "$logs/pytest_cuda.log"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout "${BENCH_S:-220}" python3 bench/gpu_bench.py ${BENCH:---H 256,1024 --batch 64,256 --rounds 2 --batches 2} > "$logs/gpu_bench.log" 2>&1
echo "bench rc $? in $(( $(date +%s) - t0 ))s"
tr '\r' '\n' < "$logs/gpu_bench.log" | grep -v "it/s\|^ *$"
