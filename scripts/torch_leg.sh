#!/usr/bin/env bash
# One leg of `make test` on another torch or Python than the main one (2.13.0 on python3): the oldest
# and newest torch setup.py admits, every Python pyproject.toml admits (the Makefile's TORCH_LEGS). In
# a venv of its own, build torch_shard against that torch in a folder of its own
# (build-leg-<version>-py<python>/: two builds for different torches cannot share torch_shard/), then
# run the single-process tests (pytest -m "not distributed", without tests/test_docs.py),
# tests/test_redistribute.py (4 ranks: the DTensor interop builds DTensors from torch's own DTensorSpec
# and constructor, which a torch release may change), examples/gpu_smoke.py and the demo on 4 CPU ranks
# under torchrun, whose exit codes must be 0.
#
# The venv (about 5 GB: a CUDA build of torch) is kept between runs and clones in
# $TORCH_SHARD_CACHE/venvs/torch-<version>-<key>, the key a hash of what it is made from: the torch
# version, the Python, requirements/test.txt and the install commands below. It is made in one go,
# under a lock, and marked complete last; on every use its `pip freeze` must still equal the one taken
# when it was made (anything installed or removed by hand since, and it is made anew), and after 7 days
# it is made anew (the test requirements are not all pinned). torch_shard is never installed into it:
# the build goes to build-leg-<version>-py<python>/. The main leg's .venv is always made from scratch, so a
# requirement missing from requirements/test.txt fails there whatever these venvs hold.
#
#   scripts/torch_leg.sh VERSION [PYTHON]      (make test-legs, make test-leg-VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$1
PYTHON=${2:-python3}
ROOT=$PWD
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
OUT=$ROOT/build-leg-$VERSION-py$PYVER
log() { echo "[torch $VERSION, Python $PYVER] $*"; }

# 1. The venv. Releases newer than the machine's pip cap (torch<=2.14.1 in /etc/xdg/pip on some
#    machines) are fetched past it: the cap is about this machine's disk, not about what we support.
RECIPE='pip install "setuptools>=77" wheel; PIP_CONSTRAINT=/dev/null pip install "torch==VERSION"; pip install -r requirements/test.txt'
CACHE=${TORCH_SHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torch_shard}
KEY=$({ echo "$RECIPE $VERSION"; "$PYTHON" -c 'import sys; print(sys.version)'; cat requirements/test.txt; } |
  sha256sum | cut -c1-12)
mkdir -p "$CACHE/venvs"
VENV=$CACHE/venvs/torch-$VERSION-py$PYVER-$KEY
PY=$VENV/bin/python
make_venv() {
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install --quiet "setuptools>=77" wheel
  PIP_CONSTRAINT=/dev/null "$PY" -m pip install --quiet "torch==$VERSION"
  "$PY" -m pip install --quiet -r requirements/test.txt
  "$PY" -m pip freeze --all >"$VENV/.freeze"
}
exec 9>"$CACHE/venvs/.torch-$VERSION-py$PYVER.lock"
flock 9
start=$(date +%s)
if [ ! -f "$VENV/.freeze" ]; then
  log "making $VENV"
  make_venv
elif [ -n "$(find "$VENV/.freeze" -mmin +10080)" ]; then
  log "making $VENV anew (older than 7 days)"
  make_venv
elif ! "$PY" -m pip freeze --all 2>/dev/null | cmp -s - "$VENV/.freeze"; then
  log "making $VENV anew (its packages changed since it was made)"
  make_venv
else
  log "reusing $VENV (made $(date -r "$VENV/.freeze" '+%F %R'), packages as made)"
fi
touch "$VENV/.used"
# Other venvs of this torch (other requirements) unused for a day go.
find "$CACHE/venvs" -maxdepth 2 -path "$CACHE/venvs/torch-$VERSION-*/.used" -mmin +1440 |
  while read -r used; do log "removing unused $(dirname "$used")"; rm -rf "$(dirname "$used")"; done
flock -u 9
log "venv ready in $(($(date +%s) - start)) s"
export PATH="$VENV/bin:$PATH"
installed=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
[ "$installed" = "$VERSION" ] || { log "the venv has torch $installed"; exit 1; }

# 2. Build in $OUT and a package tree that imports the new libraries (scripts/build_out_of_tree.sh).
start=$(date +%s)
source scripts/build_out_of_tree.sh
build_out_of_tree "$PY" "$OUT"
log "built in $(($(date +%s) - start)) s"

# 3. Run from the build folder (the current directory comes first on sys.path, and the source tree's
#    torch_shard holds the main build's library).
export PYTHONPATH="$OUT/pkg"
cd "$OUT"
"$PY" - <<PYCHECK
import torch, torch_shard._C as c
assert c.__file__.startswith("$OUT"), c.__file__
print("[torch $VERSION] torch", torch.__version__, "library", c.__file__)
PYCHECK
# tests/test_docs.py is left out: this venv has no Sphinx, and the docs are checked by the main leg.
"$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -m "not distributed" \
    --ignore="$ROOT/tests/test_docs.py" "$ROOT/tests"
"$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" "$ROOT/tests/test_redistribute.py"
checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT
OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo "$PY" -m torch.distributed.run --standalone --nproc-per-node=4 \
    "$ROOT/examples/gpu_smoke.py" --device cpu --timeout 180 --checkpoint-dir "$checkpoints"
# The demo too: `make demo` must run with every admitted torch (it once called a collective that torch
# 2.11 lacks, found only on a GPU machine).
OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo "$PY" -m torch.distributed.run --standalone --nproc-per-node=4 \
    "$ROOT/examples/demo.py"
log "single-process tests, test_redistribute.py, gpu_smoke.py --device cpu and the demo passed; torchrun exited with 0"
