#!/usr/bin/env bash
# On a GPU machine: configure, build (CUDA for one arch), run the whole ctest
# suite with the CUDA tests live, and write logs and a summary to OUTDIR.
#
#   bash bench/gpu_check.sh OUTDIR
#
# env: PYTHON, CUDA_ARCHS=90, BUILD_DIR, CUTLASS_INCLUDE_DIR (else found through the
# nvidia-cutlass Python package); CTEST_REGEX (ctest -R); TARGET (build only that target, e.g.
# customconv); CTEST=0 skips ctest; PYTEST=0 skips pytest; PYTEST_FILES (a
# glob, default tests/python/test_*.py); BENCH_OPS (e.g. depthwise,filter2d)
# also runs bench/bench.py on them (BENCH_DTYPES: its --dtypes), writing
# OUTDIR/bench/. RELIABILITY=1 also runs, next to the tests and on the last GPU,
# the long CUDA fuzz (one process per op, FUZZ_CONFIGS per op, default 5000,
# within FUZZ_SECONDS; 0 skips it), compute-sanitizer's tools (SANITIZERS, default
# all four; SANITIZER_SECONDS per tool and part) and the demo serving 10,000
# requests on 16 threads and on 1 (OUTDIR/reliability/).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-gpu-results}")
PY=${PYTHON:-python3}
BUILD=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"

step() {  # step NAME COMMAND...: runs COMMAND with output in OUT/NAME.log, prints the outcome
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-10s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$OUT/summary.txt"
  return $rc
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
} > "$OUT/summary.txt" 2>&1

step configure cmake -S . -B "$BUILD" -G Ninja -DCUSTOMCONV_CUDA=ON \
  -DCUSTOMCONV_BUILD_TESTS=ON -DCUSTOMCONV_BUILD_DEMO=ON \
  -DCUSTOMCONV_CUDA_ARCHS="${CUDA_ARCHS:-90}" -DCUSTOMCONV_PYTHON="$PY" \
  ${CUTLASS_INCLUDE_DIR:+-DCUTLASS_INCLUDE_DIR="$CUTLASS_INCLUDE_DIR"} || exit 1
step build cmake --build "$BUILD" -j "$(nproc)" ${TARGET:+--target "$TARGET"} ||
  { tail -40 "$OUT/build.log"; exit 1; }
reliability() {  # the long-running checks of docs/reliability.md, on the last GPU
  local dir="$OUT/reliability" gpu
  gpu=$(( $($PY -c "import torch; print(torch.cuda.device_count())") - 1 ))
  mkdir -p "$dir"
  local op fuzz_ops=
  [ "${FUZZ_SECONDS:-360}" = 0 ] || fuzz_ops="conv2d im2col col2im depthwise_conv2d filter2d trilinear_interpolation"
  for op in $fuzz_ops; do  # one process per op
    (
      export CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH="$PWD/python_stub" CUSTOMCONV_LIBRARY="$PWD/$BUILD/libcustomconv.so"
      timeout $(( ${FUZZ_SECONDS:-360} + 60 )) "$PY" tests/fuzz/fuzz_ops.py --device cuda --ops "$op" \
        --configs "${FUZZ_CONFIGS:-5000}" --seed 1 --time-limit "${FUZZ_SECONDS:-360}" --threads 2 \
        --json "$dir/fuzz-cuda-$op.json" > "$dir/fuzz-cuda-$op.log" 2>&1
      echo "fuzz $op rc=$?" >> "$dir/summary.txt"
    ) &
  done
  local tool
  for tool in ${SANITIZERS-memcheck racecheck initcheck synccheck}; do  # one process per tool, side by side
    (
      export CUDA_VISIBLE_DEVICES=$gpu
      TOOLS=$tool FUZZ_CONFIGS=3 TOOL_TIMEOUT=${SANITIZER_SECONDS:-120} \
        bash tests/sanitize/run_compute_sanitizer.sh "$dir/compute-sanitizer-$tool" "$BUILD" \
        > "$dir/compute-sanitizer-$tool.log" 2>&1
      echo "compute-sanitizer $tool rc=$?" >> "$dir/summary.txt"
    ) &
  done
  (
    export CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH="$PWD/python_stub" CUSTOMCONV_LIBRARY="$PWD/$BUILD/libcustomconv.so"
    "$PY" cpp_demo/make_model.py --out "$BUILD/demo-serve" > "$dir/demo.log" 2>&1
    local m="$BUILD/demo-serve"
    for t in 16 1; do
      "$BUILD/customconv_demo" --model "$m/model.pt" --inputs "$m/inputs.pt" --expected "$m/expected.pt" \
        --device cuda --threads "$t" --iters 10000 >> "$dir/demo.log" 2>&1
      echo "demo cuda threads=$t rc=$?" >> "$dir/summary.txt"
    done
  ) &
}
if [ "${RELIABILITY:-0}" != 0 ]; then reliability; fi

# The pytest files run once, directly and one process per file (so their
# pass/skip counts show and a crash loses one file only); ctest runs the rest.
if [ "${CTEST:-1}" != 0 ]; then
  step ctest ctest --test-dir "$BUILD" -j 4 -E '^python\.' ${CTEST_REGEX:+-R "$CTEST_REGEX"} --output-on-failure
fi
run_pytest() {
  local rc=0 f
  for f in ${PYTEST_FILES:-tests/python/test_*.py}; do
    echo "==== $f"
    env PYTHONPATH="$PWD/python_stub" CUSTOMCONV_LIBRARY="$PWD/$BUILD/libcustomconv.so" \
      "$PY" -X faulthandler -m pytest -q -rs -p no:cacheprovider "$f" || rc=$?
  done
  return $rc
}
if [ "${PYTEST:-1}" != 0 ]; then step pytest run_pytest; fi
if [ -n "${BENCH_OPS:-}" ]; then
  step bench env CUSTOMCONV_LIBRARY="$PWD/$BUILD/libcustomconv.so" \
    "$PY" bench/bench.py --device cuda --ops "$BENCH_OPS" ${BENCH_DTYPES:+--dtypes "$BENCH_DTYPES"} --out "$OUT/bench"
fi

wait  # the reliability checks
if [ -f "$OUT/reliability/summary.txt" ]; then
  { echo "---- reliability"; cat "$OUT/reliability/summary.txt"
    cat "$OUT"/reliability/compute-sanitizer-*/summary.txt 2>/dev/null
    for f in "$OUT"/reliability/fuzz-cuda-*.log; do tail -4 "$f"; done
    grep -E "latency|throughput|mismatch|requests" "$OUT/reliability/demo.log"; } >> "$OUT/summary.txt"
fi
echo "---- failed or skipped tests" >> "$OUT/summary.txt"
if [ -f "$OUT/ctest.log" ]; then
  grep -E "\*\*\*Failed|Not Run|\*\*\*Skipped|Exception" "$OUT/ctest.log" >> "$OUT/summary.txt"
  grep -E "tests passed|Total Test time" "$OUT/ctest.log" >> "$OUT/summary.txt"
fi
[ -f "$OUT/pytest.log" ] && grep -E "^FAILED|^ERROR|Fatal Python|Segmentation" "$OUT/pytest.log" | head -40 >> "$OUT/summary.txt"
[ -f "$OUT/pytest.log" ] && grep -E "^==== |passed|failed" "$OUT/pytest.log" | grep -v "^FAILED" >> "$OUT/summary.txt"
cat "$OUT/summary.txt"
[ -f "$OUT/bench/cuda.md" ] && grep -A100 "^Geometric-mean" "$OUT/bench/cuda.md"
exit 0
