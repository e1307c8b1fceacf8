#!/usr/bin/env bash
# Install a torch_shard wheel as a user would and run it there (make test-wheel, part of make test):
# a fresh venv in a temporary folder outside the source tree, `pip install WHEEL` alone (its metadata
# must bring the torch it was built for), then the test requirements; then, from a folder holding only
# copies of tests/, examples/ and pyproject.toml, so that nothing of the source tree can be imported,
# examples/demo.py on 4 ranks under torchrun and the single-process tests (pytest -m "not distributed",
# without tests/test_docs.py). The wheel carries the product library alone: the tests of the test-only
# ops (torch_shard._testing_C) skip here, saying so, and run in the main suite.
#
#   scripts/wheel_check.sh WHEEL TORCH_VERSION [PYTHON]     (TORCH_VERSION: the torch it was built with)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TORCH=$2
PYTHON=${3:-python3}
log() { echo "[wheel] $*"; }

# 1. The wheel's own claims: a version that names the torch it was built for, and a requirement on that
#    torch's minor release (so, built with pip's build isolation, it was built against that torch).
IFS=. read -r major minor _ <<<"$TORCH"
name=$(basename "$WHEEL")
case "$name" in
  "torch_shard-"*"+pt$major$minor"*"-"*.whl) ;;
  *) log "$name: the version does not carry +pt$major$minor<flavour>"; exit 1 ;;
esac
requires=$("$PYTHON" - "$WHEEL" <<'PYMETA'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    test_library = [n for n in wheel.namelist() if n.startswith("torch_shard/_testing_C")]
    if test_library:
        sys.exit(f"[wheel] the wheel carries the test library: {test_library}")
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(meta).decode().splitlines():
        if line.startswith("Requires-Dist: "):
            print(line[len("Requires-Dist: "):])
PYMETA
)
echo "$requires" | grep -qx "torch==$major\.$minor\.\*" ||
  { log "$name does not require torch==$major.$minor.*: $requires"; exit 1; }
log "$name requires: $(echo "$requires" | tr '\n' ' ')"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/torch_shard_wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
case "$WORK" in "$ROOT"/*) log "$WORK is inside the source tree"; exit 1 ;; esac

# 2. A fresh venv; the wheel first and alone, so that its requirements decide the torch.
"$PYTHON" -m venv "$WORK/venv"
PY=$WORK/venv/bin/python
"$PY" -m pip install --quiet "$WHEEL"
"$PY" -m pip install --quiet -r requirements/test.txt
"$PY" -m pip check

# 3. A folder with copies of the tests and examples only.
mkdir "$WORK/run"
cp -r tests examples pyproject.toml "$WORK/run/"
cd "$WORK/run"
export PATH="$WORK/venv/bin:$PATH"
"$PY" - "$WORK/venv" <<'PYCHECK'
import importlib.util
import sys

import torch
import torch_shard
import torch_shard._C as c

venv = sys.argv[1]
for path in (torch_shard.__file__, c.__file__):
    assert path.startswith(venv), f"{path} is not the installed wheel's"
assert importlib.util.find_spec("torch_shard._testing_C") is None, "the test library is installed"
print(f"[wheel] torch {torch.__version__}, torch_shard {torch_shard.__version__} from {torch_shard.__file__}")
print(f"[wheel] its library's build record: {torch_shard._build_record}")
PYCHECK
OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo torchrun --standalone --nproc-per-node=4 examples/demo.py
# tests/test_docs.py is left out: this venv has no Sphinx and this folder no docs/; the main leg checks them.
"$PY" -m pytest -q -p no:cacheprovider -m "not distributed" --ignore=tests/test_docs.py tests
log "installed in a fresh venv; demo and single-process tests passed"
