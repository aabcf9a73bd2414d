#!/usr/bin/env bash
# The fuzz targets (docs/reliability.md#fuzzing), built with clang's libFuzzer, AddressSanitizer and UBSan.
#   tools/fuzz.sh build                  configure and build them in build-fuzz/ (FUZZ_BUILD overrides)
#   tools/fuzz.sh run SECONDS [TARGET..] fuzz each target for SECONDS (all targets when none named);
#                                        FUZZ_RUNS=N stops a target sooner, after N executions;
#                                        FUZZ_SEED=N fixes libFuzzer's random seed
#   tools/fuzz.sh regress [TARGET..]     run every committed seed and past crash once, no fuzzing
#   tools/fuzz.sh smoke SECONDS TARGET   regress, then run with FUZZ_SEED 1 unless set; exits 77 (skipped)
#                                        when the targets are not built
# A run starts from the committed corpus (tests/fuzz/corpus/T) and every input that ever crashed
# (tests/fuzz/regressions/T); what it learns goes to build-fuzz/corpus/T, crashes to build-fuzz/findings/T.
# Exit status: non-zero when a target found a crash, a leak, a timeout or an out-of-memory input.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
ALL_TARGETS=(safetensors gguf tokenizer manifest jsonl chat_template)
# limits that turn a hang or a runaway allocation into a finding: an input may take 10 s and 2 GiB
LIMITS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

build() {
  command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing; run: bash .ci/deps.sh fuzz" >&2; exit 1; }
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  [ -f "$BUILD/build.ninja" ] || cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ "${launcher[@]}" >/dev/null
  cmake --build "$BUILD" -j "${JOBS:-2}"
}

binary() {
  local bin="$BUILD/fuzz_$1"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built; run: tools/fuzz.sh build" >&2; exit 1; }
  echo "$bin"
}

inputs() {  # the committed seeds and regression files of a target
  local t=$1
  find "tests/fuzz/corpus/$t" "tests/fuzz/regressions/$t" -type f 2>/dev/null | sort
}

run() {
  local seconds=$1; shift
  local targets=("$@"); ((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
  local failed=()
  for t in "${targets[@]}"; do
    local bin; bin=$(binary "$t")
    mkdir -p "$BUILD/corpus/$t" "$BUILD/findings/$t"
    local dirs=("$BUILD/corpus/$t" "tests/fuzz/corpus/$t")
    [ -d "tests/fuzz/regressions/$t" ] && dirs+=("tests/fuzz/regressions/$t")
    local log="$BUILD/findings/$t/run-$$.log"  # one per process: two may fuzz one target, sharing its corpus
    local options=(-max_total_time="$seconds")
    [ -n "${FUZZ_RUNS:-}" ] && options+=(-runs="$FUZZ_RUNS")
    [ -n "${FUZZ_SEED:-}" ] && options+=(-seed="$FUZZ_SEED")
    echo "fuzz: $t for ${seconds}s${FUZZ_RUNS:+ or $FUZZ_RUNS executions} (log: $log)"
    if "$bin" "${LIMITS[@]}" "${options[@]}" -print_final_stats=1 \
        -artifact_prefix="$BUILD/findings/$t/" "${dirs[@]}" >"$log" 2>&1; then
      grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$log" | sed "s/^/fuzz: $t /"
    else
      failed+=("$t"); tail -40 "$log" >&2
      echo "fuzz: $t FAILED; the input is in $BUILD/findings/$t/ (keep it in tests/fuzz/regressions/$t/ once fixed)" >&2
    fi
  done
  ((${#failed[@]} == 0)) || { echo "fuzz: findings in: ${failed[*]}" >&2; exit 1; }
}

regress() {
  local targets=("$@"); ((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")
  for t in "${targets[@]}"; do
    local bin; bin=$(binary "$t")
    mapfile -t files < <(inputs "$t")
    ((${#files[@]})) || { echo "fuzz: $t has no committed inputs" >&2; exit 1; }
    "$bin" "${LIMITS[@]}" "${files[@]}" >"$BUILD/regress-$t.log" 2>&1 \
      || { tail -40 "$BUILD/regress-$t.log" >&2; echo "fuzz: $t failed on a committed input" >&2; exit 1; }
    echo "fuzz: $t: ${#files[@]} committed inputs, no finding"
  done
}

case "${1:-}" in
  build) build ;;
  run) shift; [ $# -ge 1 ] || { echo "usage: tools/fuzz.sh run SECONDS [TARGET...]" >&2; exit 2; }; run "$@" ;;
  regress) shift; regress "$@" ;;
  smoke)
    shift; [ $# -eq 2 ] || { echo "usage: tools/fuzz.sh smoke SECONDS TARGET" >&2; exit 2; }
    [ -x "$BUILD/fuzz_$2" ] || { echo "fuzz: skipped: $BUILD/fuzz_$2 is not built (make fuzz-build builds it)"; exit 77; }
    # a fixed seed: a fresh CI folder mutates the same inputs in every run (open-ended fuzzing is `run`)
    regress "$2" && FUZZ_SEED=${FUZZ_SEED:-1} run "$1" "$2" ;;
  *) sed -n '2,/^# Exit status/p' "$0" >&2; exit 2 ;;
esac
