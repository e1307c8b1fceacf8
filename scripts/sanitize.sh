#!/usr/bin/env bash
# Build torch_shard._C (and the test-only torch_shard._testing_C) with AddressSanitizer and UndefinedBehaviorSanitizer in its own folder
# (build-sanitize/, the normal build is untouched) and run the C++-heavy tests against it, with the
# sanitizer runtime preloaded into the (uninstrumented) Python interpreter. Any report fails the run.
#
#   scripts/sanitize.sh [PYTHON]      (make sanitize)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
OUT=build-sanitize
mkdir -p "$OUT"

# 1-2. Build in $OUT, never in the source tree, and a package tree that imports the sanitized
#      libraries (scripts/build_out_of_tree.sh).
source scripts/build_out_of_tree.sh
build_out_of_tree "$PY" "$OUT" TORCH_SHARD_SANITIZE=1

# 3. Run. The interpreter is not instrumented, so the runtimes are preloaded; leak checking is off
#    (CPython and torch keep allocations alive until exit by design); UBSan stops at the first report.
ASAN_LIB=$(gcc -print-file-name=libasan.so)
UBSAN_LIB=$(gcc -print-file-name=libubsan.so)
LOG="$OUT/reports"
rm -rf "$LOG"
mkdir -p "$LOG"
export LD_PRELOAD="$ASAN_LIB $UBSAN_LIB"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$PWD/$LOG/asan"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$LOG/ubsan"
export PYTHONPATH="$PWD/$OUT/pkg"
ROOT=$PWD
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")
# Run from the build folder: the current directory comes first on sys.path, and the source tree's
# own torch_shard (with the normal library) must not shadow the sanitized one.
cd "$OUT"
status=0
"$PY" - <<'PYCHECK' || status=$?
import torch_shard._C as c, sys
assert "build-sanitize" in c.__file__, c.__file__
print("sanitized library:", c.__file__)
PYCHECK
if [ "$status" -eq 0 ]; then
  "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" \
      "$ROOT"/tests/test_layout.py "$ROOT"/tests/test_properties.py \
      "$ROOT"/tests/test_sharded_tensor_impl.py "$ROOT"/tests/test_reshard_properties.py \
      "$ROOT"/tests/test_lookup_one_rank.py "$ROOT"/tests/test_lookup_ops_aten_kernels.py "$ROOT"/tests/test_agreement.py \
      "$ROOT"/tests/test_every_layout.py "$ROOT"/tests/test_core.py || status=$?
fi
unset LD_PRELOAD
cd "$ROOT"
if compgen -G "$LOG/*" > /dev/null; then
  echo "sanitizer reports:" >&2
  cat "$LOG"/* >&2
  status=1
fi
if [ "$status" -eq 0 ]; then
  echo "sanitize: no reports"
fi
exit "$status"
