#!/usr/bin/env bash
# One leg of `make test` on another torch than the main one (2.13.0): the oldest and newest releases
# pyproject.toml admits. In a venv of its own (.venv-<version>), build torch_shard against that torch in
# a folder of its own (build-leg-<version>/: the extension's file name does not say which torch it was
# built for, so two builds cannot share torch_shard/), then run the single-process tests (pytest -m "not
# distributed") and examples/gpu_smoke.py on 4 CPU ranks under torchrun, whose exit code must be 0.
#
#   scripts/torch_leg.sh VERSION [PYTHON]      (make test-legs, make test-leg-VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$1
PYTHON=${2:-python3}
ROOT=$PWD
VENV=$ROOT/.venv-$VERSION
PY=$VENV/bin/python
OUT=$ROOT/build-leg-$VERSION
STAMP=$VENV/.deps-5
log() { echo "[torch $VERSION] $*"; }

# 1. The venv. Releases newer than the machine's pip cap (torch<=2.14.1 in /etc/xdg/pip on some
#    machines) are fetched past it: the cap is about this machine's disk, not about what we support.
if [ ! -f "$STAMP" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install --quiet "setuptools>=77" wheel
  PIP_CONSTRAINT=/dev/null "$PY" -m pip install --quiet "torch==$VERSION"
  "$PY" -m pip install --quiet -r requirements/test.txt
  touch "$STAMP"
fi
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
"$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" -c "$ROOT/pyproject.toml" -m "not distributed" "$ROOT/tests"
checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT
OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo "$PY" -m torch.distributed.run --standalone --nproc-per-node=4 \
    "$ROOT/examples/gpu_smoke.py" --device cpu --timeout 180 --checkpoint-dir "$checkpoints"
log "single-process tests and gpu_smoke.py --device cpu passed; torchrun exited with 0"
