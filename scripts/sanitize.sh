#!/usr/bin/env bash
# Build fastpar and its llama.cpp with sanitizers into a virtual environment of their own
# and run the test suite under them; docs/testing.md explains the choices.
#
#   scripts/sanitize.sh [asan|tsan] [pytest arguments...]
#
# pytest arguments, when given, replace the default selection below.
#
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (default); without pytest
#         arguments, the whole suite but tests/test_packaging.py (it builds and checks
#         the normal wheels: nothing of it runs sanitized code).
#   tsan  ThreadSanitizer; without pytest arguments, the tests of fastpar's threads: the
#         engine, thread, cleanup, server, C ABI, thread-governor and per-prompt tests.
#
# Every ASan and TSan report goes to a file under build/sanitize-<kind>/reports/ (so reports
# of child processes whose output a test captures are counted too). UBSan's own runtime
# (gcc links it apart from ASan's) ignores log_path and writes to stderr, so each UBSan
# report aborts its process instead: a death the test that started it sees, or pytest's own.
# Reports in pytest's output (build/sanitize-<kind>/pytest.log) are counted as well. The
# script prints how many there were and fails when pytest failed or any report was written.
# FASTPAR_SANITIZE_VENV chooses the environment's folder; CMAKE_ARGS passes through (ccache).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

kind="${1:-asan}"
[ $# -gt 0 ] && shift
case "$kind" in
  asan) sanitizers="address,undefined"; runtime=libasan.so
        default_tests=(tests -m "not packaging") ;;
  tsan) sanitizers="thread"; runtime=libtsan.so
        default_tests=(tests/test_engine.py tests/test_threads.py tests/test_cleanup.py tests/test_server.py
                       tests/test_capi.py tests/test_thread_governor.py tests/test_sampling_params.py) ;;
  *) echo "usage: $0 [asan|tsan] [pytest arguments...]" >&2; exit 2 ;;
esac
[ $# -gt 0 ] && tests=("$@") || tests=("${default_tests[@]}")

work="$root/build/sanitize-$kind"
venv="${FASTPAR_SANITIZE_VENV:-$work/venv}"
reports="$work/reports"
mkdir -p "$work"

cc="${CC:-cc}"
runtime_path="$("$cc" -print-file-name="$runtime")"
libstdcxx="$("$cc" -print-file-name=libstdc++.so.6)"
if [ ! -e "$runtime_path" ]; then
  echo "sanitize.sh: $cc has no $runtime (Debian: apt-get install libasan8 libubsan1 libtsan2)" >&2
  exit 2
fi

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
start=$(date +%s)
# Build without isolation, in a build folder of its own: the normal build stays as it is
# and this one is incremental too.
python -m pip install -q scikit-build-core pybind11 cmake ninja
FASTPAR_SANITIZE="$sanitizers" python -m pip install -q --no-build-isolation \
  -C build-dir="$work/cmake" -C cmake.build-type=RelWithDebInfo "$root[test]"
built=$(date +%s)
echo "== sanitize.sh: $kind build took $((built - start)) s"

rm -rf "$reports" && mkdir -p "$reports"
common="log_path=$reports/report:print_stacktrace=1"
# The sanitizer runtime must come first in the process: Python itself is not instrumented.
# libstdc++ right after it: ASan finds the real __cxa_throw when it starts, and Python does
# not load libstdc++ itself; without it the first C++ exception ends in "CHECK failed:
# real___cxa_throw != 0".
export LD_PRELOAD="$runtime_path:$libstdcxx${LD_PRELOAD:+:$LD_PRELOAD}"
# detect_leaks=0: CPython does not free everything at exit, which LeakSanitizer would report.
# allocator_may_return_null=1: an impossible allocation throws std::bad_alloc, as without
# ASan (tests ask for contexts too large on purpose), instead of ASan aborting.
export ASAN_OPTIONS="$common:detect_leaks=0:allocator_may_return_null=1:detect_stack_use_after_return=1:strict_init_order=1:suppressions=$root/scripts/sanitize/asan.supp"
export UBSAN_OPTIONS="$common:halt_on_error=1:abort_on_error=1:suppressions=$root/scripts/sanitize/ubsan.supp"
export TSAN_OPTIONS="$common:halt_on_error=0:second_deadlock_stack=1:suppressions=$root/scripts/sanitize/tsan.supp"

# Instrumented kernels are several times slower; on a machine shared with other work,
# OpenMP's default of spinning at every barrier then spent most of the run waiting for a
# descheduled thread (90% of samples in libgomp). The run is about memory and UB, not speed.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# The tests stretch their latency bounds, and skip resident-memory bounds under ASan
# (tests/conftest.py).
export FASTPAR_TEST_SANITIZER="$kind"

set +e
python -m pytest -p no:cacheprovider --basetemp="$work/tmp" "${tests[@]}" 2>&1 | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e
unset LD_PRELOAD
end=$(date +%s)

count=0
shopt -s nullglob
for f in "$reports"/report*; do
  n=$(grep -c -E "==[0-9]+==ERROR: |WARNING: ThreadSanitizer|: runtime error: |Sanitizer: CHECK failed" "$f" || true)
  # Anything else a sanitizer wrote is a report too.
  [ "$n" -eq 0 ] && [ -s "$f" ] && n=1
  count=$((count + n))
  echo "---- $f"
  cat "$f"
done
pattern="==[0-9]+==ERROR: |WARNING: ThreadSanitizer|: runtime error: |Sanitizer: CHECK failed"
n=$(grep -c -E "$pattern" "$work/pytest.log" || true)
if [ "$n" -gt 0 ]; then
  echo "---- in pytest's output:"
  grep -E "$pattern" "$work/pytest.log"
fi
count=$((count + n))
echo "== sanitize.sh: $kind ($sanitizers): pytest exit $status, $count sanitizer report(s), tests took $((end - built)) s"
[ "$status" -eq 0 ] && [ "$count" -eq 0 ]
