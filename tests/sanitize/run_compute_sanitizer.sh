#!/usr/bin/env bash
# On a GPU machine: compute-sanitizer's memcheck, racecheck, initcheck and
# synccheck over the CUDA tests: the C++ CUDA tests (GoogleTest) and a reduced
# pytest selection (graphs, streams, the bad-input corpus with its context
# checks, determinism, a short CUDA fuzz). Writes one log per tool and part to
# OUTDIR and a one-line summary per tool to OUTDIR/summary.txt; exits non-zero
# when a tool reports an error, a run fails or times out.
#
#   tests/sanitize/run_compute_sanitizer.sh OUTDIR [BUILD_DIR]
#
# BUILD_DIR (default build-sanitize-cuda) is configured and built with CUDA
# when it has no library yet. Environment: PYTHON (default python3), CUDA_ARCHS
# (default 90), TOOLS (default "memcheck racecheck initcheck synccheck"),
# TOOL_TIMEOUT (seconds per tool and part, default 300), PYTEST_K (pytest -k
# expression of the selection), FUZZ_CONFIGS (per op, default 5; 0: no fuzz).
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(realpath -m "${1:?usage: run_compute_sanitizer.sh OUTDIR [BUILD_DIR]}")
build=$(realpath -m "${2:-$root/build-sanitize-cuda}")
python=${PYTHON:-python3}
tools=${TOOLS:-memcheck racecheck initcheck synccheck}
limit=${TOOL_TIMEOUT:-300}
fuzz_configs=${FUZZ_CONFIGS:-5}
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "compute-sanitizer not found" | tee -a "$summary"; exit 2; }
"$python" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  { echo "no CUDA device visible to PyTorch" | tee -a "$summary"; exit 2; }

if [ ! -f "$build/libcustomconv.so" ] || [ ! -x "$build/customconv_cpp_tests" ]; then
  ninja=()
  command -v ninja >/dev/null && ninja=(-G Ninja)
  cmake -S "$root" -B "$build" "${ninja[@]}" -DCUSTOMCONV_CUDA=ON \
    -DCUSTOMCONV_CUDA_ARCHS="${CUDA_ARCHS:-90}" -DCUSTOMCONV_PYTHON="$python" >"$out/configure.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target customconv customconv_cpp_tests \
      >"$out/build.log" 2>&1 || { tail -40 "$out/build.log" "$out/configure.log"; exit 2; }
fi

export CUSTOMCONV_LIBRARY="$build/libcustomconv.so" PYTHONPATH="$root/python_stub"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=2
# Exact-size allocations, so that an access past a tensor's end is past its
# allocation too (the caching allocator would hide it inside a larger block).
# Without the caching allocator nothing can be allocated while a CUDA graph is
# being captured, so the graph tests are left out of the selections below.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
data="$out/test-data"  # per run, so that runs of several tools can share a build
"$python" "$root/tests/make_test_models.py" "$data" >"$out/test-models.log" 2>&1 ||
  { echo "making the test models failed: $out/test-models.log" | tee -a "$summary"; exit 2; }
export CUSTOMCONV_TEST_DATA="$data"

# The pytest selection: small cases of every op on CUDA, no huge tensors.
pytest_args=(-q -p no:cacheprovider -x
  "$root/tests/python/test_reliability_cuda.py"
  "$root/tests/python/test_bad_input_corpus.py"
  "$root/tests/python/test_deterministic_backward.py"
  -k "${PYTEST_K:-cuda and not 2_31 and not compiled and not graph}"
  -m "not unallocatable")

tool_flags() {  # the flags of one tool
  case $1 in
    memcheck) echo "" ;;  # (no --leak-check: cuBLAS's workspace and PyTorch's pinned host
                          # cache live until exit by design, and would be its only reports)
    racecheck) echo "--racecheck-report all" ;;
    initcheck) echo "" ;;  # (--track-unused-memory takes no value in this version)
    *) echo "" ;;
  esac
}

run_part() {  # run_part TOOL PART COMMAND... -> "PART: N errors (exit S)"
  local tool=$1 part=$2
  shift 2
  local log="$out/$tool-$part.log"
  # shellcheck disable=SC2046
  timeout "$limit" "$sanitizer" --tool "$tool" $(tool_flags "$tool") --error-exitcode 99 \
    --target-processes all --print-limit 200 "$@" >"$log" 2>&1
  local rc=$?
  local errors
  errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ error" "$log" | awk '{n += $3} END {print n + 0}')
  if [ "$rc" -eq 124 ]; then
    echo "$part: timed out after ${limit}s ($errors errors so far)"
  else
    echo "$part: $errors errors, exit $rc"
  fi
}

status=0
for tool in $tools; do
  t0=$SECONDS
  parts=()
  parts+=("$(run_part "$tool" cpp "$build/customconv_cpp_tests" \
    --gtest_filter='*Cuda*:*CUDA*:TorchScriptModelTest.RunsOnCuda*:-*Graph*:*2Pow31*')")
  parts+=("$(run_part "$tool" pytest "$python" -m pytest "${pytest_args[@]}")")
  if [ "$fuzz_configs" -gt 0 ]; then
    parts+=("$(run_part "$tool" fuzz "$python" "$root/tests/fuzz/fuzz_ops.py" --device cuda \
      --configs "$fuzz_configs" --seed 0)")
  fi
  line="$tool:"
  for p in "${parts[@]}"; do
    line="$line $p;"
    case $p in *": 0 errors, exit 0") ;; *) status=1 ;; esac
  done
  echo "$line $((SECONDS - t0)) s" | tee -a "$summary"
done
echo "logs and summary in $out"
exit $status
