#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer run on the CPU: configures a
# CPU-only build with CUSTOMCONV_SANITIZE=ON in its own directory, builds the
# library and the C++ tests, runs the GoogleTest suite, then a few pytest files
# with the ASan runtime preloaded into Python. Any report fails the run.
#
#   tests/sanitize/run_asan.sh [BUILD_DIR] [LOG_DIR]     (defaults: build-asan, BUILD_DIR/sanitize-logs)
#
# Environment: PYTHON (interpreter with torch; default python3), JOBS (build
# jobs; default nproc), PYTEST_FILES (space-separated, relative to the
# repository; default below; empty: none), GTEST_FILTER.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath -m "${1:-$root/build-asan}")
logs=$(realpath -m "${2:-$build/sanitize-logs}")
python=${PYTHON:-python3}
jobs=${JOBS:-$(nproc)}
pytest_files=${PYTEST_FILES-tests/python/test_bad_input_corpus.py tests/python/test_errors.py tests/python/test_im2col_col2im_match_torch.py tests/python/test_deterministic_backward.py}
mkdir -p "$logs"

ninja=()
command -v ninja >/dev/null && ninja=(-G Ninja)
cmake -S "$root" -B "$build" "${ninja[@]}" -DCUSTOMCONV_CUDA=OFF -DCUSTOMCONV_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUSTOMCONV_PYTHON="$python" >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 2; }
cmake --build "$build" -j "$jobs" --target customconv customconv_cpp_tests >"$logs/build.log" 2>&1 ||
  { tail -30 "$logs/build.log"; exit 2; }

supp="$root/tests/sanitize"
# Leaks are checked in the C++ tests (lsan.supp: what libtorch keeps until exit
# by design); Python frees little at exit, so leak checking is off there.
# allocator_may_return_null: an allocation past what any machine has (the
# corpus asks for 2^48 bytes) fails as it does with the system allocator, with
# PyTorch's "can't allocate memory" error, instead of an ASan report.
export ASAN_OPTIONS="allocator_may_return_null=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0:strict_init_order=1:check_initialization_order=1:detect_odr_violation=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export CUSTOMCONV_LIBRARY="$build/libcustomconv.so" PYTHONPATH="$root/python_stub"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=2
asan_runtime=$(${CXX:-c++} -print-file-name=libasan.so)
ubsan_runtime=$(${CXX:-c++} -print-file-name=libubsan.so)
preload="$asan_runtime $ubsan_runtime"

status=0
summary="$logs/summary.txt"
: >"$summary"
record() {  # record NAME STATUS LOG
  local verdict=clean
  [ "$2" -ne 0 ] && verdict="FAILED (exit $2)"
  grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$3" && verdict="FAILED (sanitizer report)"
  echo "$1: $verdict; log $3" | tee -a "$summary"
  [ "$verdict" = clean ] || status=1
}

# The TorchScript files the C++ tests load, written by Python with the sanitized library.
data="$build/test-data"
LD_PRELOAD="$preload" ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
  "$python" "$root/tests/make_test_models.py" "$data" >"$logs/test-models.log" 2>&1
record "test models" $? "$logs/test-models.log"

CUSTOMCONV_TEST_DATA="$data" "$build/customconv_cpp_tests" --gtest_filter="${GTEST_FILTER:-*}" \
  >"$logs/cpp-tests.log" 2>&1
record "C++ tests ($(grep -Eo '[0-9]+ tests? from [0-9]+ test suites? ran' "$logs/cpp-tests.log" | head -1))" \
  $? "$logs/cpp-tests.log"

for f in $pytest_files; do
  name=$(basename "$f" .py)
  (cd "$root" && LD_PRELOAD="$preload" ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
    "$python" -m pytest -q -p no:cacheprovider "$f") >"$logs/$name.log" 2>&1
  rc=$?
  record "$f ($(tail -1 "$logs/$name.log"))" $rc "$logs/$name.log"
done
echo "summary: $summary"
exit $status
