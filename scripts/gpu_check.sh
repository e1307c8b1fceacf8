#!/usr/bin/env bash
# make gpu-check: everything torch_shard should do on a machine with one or more GPUs, in one command.
#   1. build the extension in place against the installed (CUDA) torch;
#   2. examples/gpu_smoke.py on NCCL, one rank per GPU;
#   3. examples/gpu_smoke.py with 4 ranks on GPU 0 over gloo (CUDA kernels and placements, shards staged
#      through host memory);
#   4. scripts/sync_free_check.py: steady-state scatter, gather, reshard and redistribute on NCCL (with
#      gloo for CPU tensors), one rank per GPU, under torch.cuda.set_sync_debug_mode("error");
#   5. the whole test suite in the one-gpu mode (TORCH_SHARD_TEST_DEVICE=one-gpu: every rank's shards
#      on cuda:0, gloo), or with a GPU per rank (4 and more) on CUDA + NCCL as well.
# Each step prints one summary line "gpu-check: <step>: PASS|FAIL (<seconds> s) <detail>"; the full
# output goes to $GPU_CHECK_LOG (default build/gpu-check.log). Exit code 1 if any step failed.
#
#   scripts/gpu_check.sh [PYTHON]        (PYTHON: default python3; WHEELS=<dir>: install test
#                                         dependencies from local wheels, for machines without an index
#                                         (pytest-xdist and execnet too, where the folder has them);
#                                         GPU_CHECK_BENCH=1: also bench/bench_embedding.py on CUDA, at
#                                         the table size below, before the suite; GPU_CHECK_JOBS=N: the suite in
#                                         N pytest-xdist workers, a test file per worker, default
#                                         cores / 4 where xdist is installed)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-python3}}
LOG=${GPU_CHECK_LOG:-build/gpu-check.log}
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
failed=0
# Not TORCH_SHOW_CPP_STACKTRACES: it changes what every C++ throw does (torch's own unwinder walks the
# stack at the throw), so the check runs as users run; the throw step tries it on its own.
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}

step() {  # step NAME COMMAND...: run, log, one summary line
  local name=$1 start status detail first
  shift
  start=$(date +%s)
  echo "===== $name: $*" >>"$LOG"
  first=$(($(wc -l <"$LOG") + 1))
  "$@" >>"$LOG" 2>&1
  status=$?
  # The detail comes from this step's own output only.
  detail=$(tail -n "+$first" "$LOG" |
    grep -E "gpu_smoke: [0-9]+/[0-9]+ pass|sync-free: |[0-9]+ passed|[0-9]+ failed|throw: |Error|Fatal" | tail -1 | cut -c1-160)
  if [ "$status" -eq 0 ]; then
    echo "gpu-check: $name: PASS ($(($(date +%s) - start)) s) $detail"
  else
    echo "gpu-check: $name: FAIL ($(($(date +%s) - start)) s, exit $status) $detail"
    failed=1
  fi
  return "$status"
}

gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>>"$LOG" || echo 0)
echo "gpu-check: $("$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-')" 2>>"$LOG"), $gpus GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | xargs)"
# The compilers: the extension is built with this machine's g++, torch with its own; a mismatched C++
# runtime shows as SIGSEGVs where the extension throws (NOTE [ One C++ runtime ], docs/howto/gpus.md).
{ echo "c++: $(c++ --version 2>&1 | head -1)"; "$PY" -c "import torch; print('torch built with:', [l.strip() for l in torch.__config__.show().splitlines() if 'GCC' in l or 'CXX_COMPILER' in l or 'ABI' in l])"; } >>"$LOG" 2>&1
if [ "$gpus" -lt 1 ]; then
  echo "gpu-check: no GPU on this machine; nothing to check" >&2
  exit 2
fi

deps() {
  local missing
  missing=$("$PY" -c "
import importlib.util
print(' '.join(m for m in ('pytest', 'numpy', 'hypothesis', 'expecttest', 'tqdm', 'ninja') if importlib.util.find_spec(m) is None))")
  if [ -n "$missing" ]; then
    if [ -n "${WHEELS:-}" ]; then
      "$PY" -m pip install -q --no-index --find-links "$WHEELS" $missing || return 1
    else
      "$PY" -m pip install -q $missing || return 1
    fi
  fi
  # pytest-xdist runs the suite's files in parallel (below); optional: without it the suite runs in
  # one process. From WHEELS only when that folder has it (a machine without an index).
  if ! "$PY" -c "import xdist" 2>/dev/null; then
    if [ -z "${WHEELS:-}" ]; then
      "$PY" -m pip install -q pytest-xdist || echo "pytest-xdist not installed: the suite runs in one process"
    elif ls "$WHEELS"/pytest_xdist-*.whl >/dev/null 2>&1; then
      "$PY" -m pip install -q --no-index --find-links "$WHEELS" pytest-xdist ||
        echo "pytest-xdist not installed: the suite runs in one process"
    fi
  fi
  return 0
}
step "test dependencies" deps
step "build" env MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" setup.py -q build_ext --inplace || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# On the first three GPU machines every throw from torch_shard's C++ killed the process with SIGSEGV:
# their CXX (/opt/gcc/bin/g++) linked a private libstdc++ into the extension (NOTE [ One C++ runtime ],
# torch_shard/_support/_cxx_runtime.py). This step throws from the extension before and after CUDA
# init under the three settings that change what a throw does, one line each ("throw: ..."), and
# checks the message whole: the number in it is what the private runtime lost on CPU machines.
throws() {
  local settings rc bad=0
  for settings in "TORCH_SHOW_CPP_STACKTRACES=0" "TORCH_SHOW_CPP_STACKTRACES=1" \
    "TORCH_SHOW_CPP_STACKTRACES=1 TORCH_DISABLE_ADDR2LINE=1"; do
    env $settings "$PY" -c "
import torch, torch_shard
for when in ('before CUDA init', 'after CUDA init'):
    if when.startswith('after'):
        torch.zeros(1, device='cuda').sum().item()
    try:
        torch.ops.torch_shard.chunk_boxes([10, 4], 2, 3)
    except ValueError as e:
        first = str(e).splitlines()[0]
        print(when, 'raised ValueError:', first, flush=True)
        if first != 'Invalid sharding dim: 2':
            raise SystemExit('the message is not whole: ' + repr(first))
    else:
        raise SystemExit('no error raised')
"
    rc=$?
    echo "throw: $settings: $([ $rc -eq 0 ] && echo ok || echo "exit $rc")"
    [ $rc -eq 0 ] || bad=1
  done
  return $bad
}
step "C++ errors reach Python (3 settings, before and after CUDA init)" throws

checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT
step "smoke, NCCL, $gpus rank(s), one per GPU" "$PY" -m torch.distributed.run --standalone --nproc-per-node="$gpus" \
  examples/gpu_smoke.py --device cuda --timeout 120 --checkpoint-dir "$checkpoints/nccl"
step "smoke, gloo, 4 ranks on GPU 0" env CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" \
  "$PY" -m torch.distributed.run --standalone --nproc-per-node=4 \
  examples/gpu_smoke.py --device cuda --backend gloo --timeout 120 --checkpoint-dir "$checkpoints/gloo"
step "sync-free steady state, NCCL + gloo, $gpus rank(s)" "$PY" -m torch.distributed.run --standalone \
  --nproc-per-node="$gpus" scripts/sync_free_check.py
if [ "${GPU_CHECK_BENCH:-0}" = 1 ]; then
  step "bench, embedding on CUDA (NCCL, $gpus rank(s))" "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node="$gpus" bench/bench_embedding.py --device cuda --rows 1000000 --dim 128 --bags 8192 --ids-per-bag 20
fi
# Test files in parallel where pytest-xdist is installed: each worker is its own pytest process with its
# own fork server and 4 ranks, so a file's process groups stay with its worker (--dist loadfile).
jobs=${GPU_CHECK_JOBS:-$(($(nproc) / 4))}
parallel=()
if [ "$jobs" -gt 1 ] && "$PY" -c "import xdist" >>"$LOG" 2>&1; then
  parallel=(-n "$jobs" --dist loadfile)
fi
echo "suite: ${parallel[*]:-one pytest process} (GPU_CHECK_JOBS=$jobs)" >>"$LOG"
step "suite, one-gpu mode (4 ranks on cuda:0, gloo)" env TORCH_SHARD_TEST_DEVICE=one-gpu \
  "$PY" -m pytest -q -p no:cacheprovider -rfE "${parallel[@]}" tests
if [ "$gpus" -ge 4 ]; then
  step "suite, a GPU per rank (NCCL)" env TORCH_SHARD_TEST_DEVICE=cuda "$PY" -m pytest -q -p no:cacheprovider -rfE tests
fi
exit "$failed"
