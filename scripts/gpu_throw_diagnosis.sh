#!/usr/bin/env bash
# Why does a C++ throw from the extension kill the process on the GPU machines (issue 41)?
#
# One run, every case in its own process, each with its exit code and last lines, into one log:
#   1. the toolchain: what c++ / g++ resolve to, the wrapper's text, the compilers' defaults, Python's
#      sysconfig build flags, glibc, kernel, CPU flags (user shadow stacks), the tunables;
#   2. builds of torch_shard and of a minimal extension (one op that fails a TORCH_CHECK_VALUE) under
#      several compilers / flags, in parallel;
#   3. a throw from each build, with TORCH_SHOW_CPP_STACKTRACES unset and 1, and torch's own throw;
#      a crash gets a native backtrace (an LD_PRELOADed SIGSEGV reporter, then cuda-gdb where it exists);
#   4. (GPU only) `make gpu-check` in the tree of the first build whose throws all raise.
#
#   scripts/gpu_throw_diagnosis.sh        (PYTHON=..., DIAG_LOGS=<dir> default $OUT or build/diag,
#                                          DIAG_WORK=<dir> default /tmp/diag, DIAG_CHECK=0: no gpu-check)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${DIAG_LOGS:-${OUT:-$ROOT/build/diag}}
WORK=${DIAG_WORK:-/tmp/diag}
mkdir -p "$LOGS" "$WORK/bin"
LOG=$LOGS/diagnosis.log
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
log() { echo "$*" >>"$LOG"; }
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }

# ---------------------------------------------------------------------------------------------- 1.
{
  echo "===== toolchain and machine"
  uname -a
  grep -m1 "model name" /proc/cpuinfo
  echo "cpu flags (cet/shstk/ibt): $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E 'shstk|ibt|cet' | xargs)"
  ldd --version 2>&1 | head -1
  echo "PATH=$PATH"
  env | grep -E '^(LD_|GLIBC_TUNABLES|CC=|CXX=|CFLAGS|CXXFLAGS|LDFLAGS|CPPFLAGS|TORCH_|GCC|COMPILER_PATH|LIBRARY_PATH)' || true
  for c in c++ g++ gcc cc x86_64-linux-gnu-g++ x86_64-linux-gnu-gcc; do
    p=$(command -v "$c" || true)
    echo "$c -> ${p:-none} -> $( [ -n "$p" ] && readlink -f "$p")"
  done
  for p in $(command -v c++ g++ | sort -u); do
    if file "$(readlink -f "$p")" 2>/dev/null | grep -q text || head -c2 "$(readlink -f "$p")" | grep -q '#!'; then
      echo "--- $p is a script:"
      head -c 4000 "$(readlink -f "$p")"
      echo
    fi
  done
  ls -la /opt/gcc /opt/gcc/bin 2>&1 | head -30
  echo "--- c++ -v"
  c++ -v 2>&1 | tail -4
  echo "--- /usr/bin/g++ -v"
  /usr/bin/g++ -v 2>&1 | tail -2
  ls /usr/bin/g++* /usr/bin/x86_64-linux-gnu-g++* 2>/dev/null | xargs
  echo "--- c++ effective defaults (empty C++ file, -O2 -fPIC -shared)"
  echo 'int f(){return 0;}' >"$WORK/empty.cpp"
  c++ -O2 -fPIC -shared -### "$WORK/empty.cpp" -o "$WORK/empty.so" 2>&1 | grep -E 'cc1plus|collect2|ld ' | tr ' ' '\n' |
    grep -E '^"?-(f|m|D_|z|W[l,]|-as-needed|-no-as-needed|static|shared|pie|fcf|plugin-opt)' | sort -u | xargs
  echo "--- predefined macros"
  echo | c++ -dM -E -x c++ - | grep -E 'FORTIFY|GLIBCXX_ASSERT|__CET__|__SHSTK__|__IBT__|__pie__|__PIC__' | xargs -0
  echo "--- Python"
  "$PY" - <<'EOF'
import sys, sysconfig, os
print(sys.executable, os.path.realpath(sys.executable), sys.version.split()[0])
for k in ("CC", "CXX", "LDSHARED", "CFLAGS", "LDFLAGS", "CONFIG_ARGS"):
    print(f"sysconfig {k}: {sysconfig.get_config_var(k)}")
import torch
print("torch", torch.__version__, "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)
print([l.strip() for l in torch.__config__.show().splitlines() if "GCC" in l or "CXX_FLAGS" in l][:3])
for line in open("/proc/self/status"):
    if line.startswith("x86_"):
        print("after import torch:", line.strip())
EOF
  echo "--- readelf -n python ($(readlink -f "$(command -v "$PY")"))"
  readelf -n "$(readlink -f "$(command -v "$PY")")" 2>&1 | grep -iE 'x86 feature|properties' | head -3
  echo "--- readelf -n libc"
  readelf -n "$(ldd "$(readlink -f "$(command -v "$PY")")" | awk '/libc.so/{print $3}')" 2>&1 | grep -iE 'x86 feature' | head -2
} >>"$LOG" 2>&1
say "diagnosis: facts gathered ($(elapsed))"

# ---------------------------------------------------------------------------------------------- 2.
# The variants: NAME and the CXX it builds with (empty: what a user's `pip install .` gets). A wrapper
# appends its flags last, so they win over everything before them (sysconfig's, torch's, ours).
cat >"$WORK/bin/cxx-cf-none" <<'EOF'
#!/bin/sh
exec c++ "$@" -fcf-protection=none
EOF
cat >"$WORK/bin/cxx-plain" <<'EOF'
#!/bin/sh
exec c++ "$@" -fcf-protection=none -fno-stack-clash-protection -fno-stack-protector
EOF
cat >"$WORK/bin/cxx-shared-libgcc" <<'EOF'
#!/bin/sh
exec c++ "$@" -shared-libgcc
EOF
chmod +x "$WORK"/bin/*
variants=("default|" "cf-none|$WORK/bin/cxx-cf-none" "plain|$WORK/bin/cxx-plain"
  "shared-libgcc|$WORK/bin/cxx-shared-libgcc")
[ -x /usr/bin/g++ ] && variants+=("usr-bin-gxx|/usr/bin/g++")
command -v clang++ >/dev/null && variants+=("clang|$(command -v clang++)")

cat >"$WORK/mini.cpp" <<'EOF'
// The smallest extension that throws the way torch_shard's ops do: a catch-all kernel whose
// TORCH_CHECK_VALUE fails, reached through the dispatcher.
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace {
at::Tensor throw_if(const at::Tensor& t, int64_t dim) {
  TORCH_CHECK_VALUE(dim < t.dim(), "mini: bad dim ", dim);
  return t;
}
} // namespace

TORCH_LIBRARY(mini, m) {
  m.def("throw_if(Tensor t, int dim) -> Tensor", &throw_if);
}
EOF
cat >"$WORK/setup_mini.py" <<'EOF'
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="mini", ext_modules=[CppExtension("mini", ["mini.cpp"], extra_compile_args={"cxx": ["-O2"]})],
      cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
EOF

jobs_each=$(($(nproc) / ${#variants[@]}))
[ "$jobs_each" -lt 1 ] && jobs_each=1
build_variant() {  # NAME CXX: a copy of the tree and of mini, each built with that CXX
  local name=$1 cxx=$2 dir=$WORK/$1
  rm -rf "$dir"
  mkdir -p "$dir/mini" "$dir/tree"
  tar -C "$ROOT" --exclude=./build --exclude=./.whl --exclude=./.git --exclude='*.so' -cf - . | tar -C "$dir/tree" -xf -
  cp "$WORK/mini.cpp" "$WORK/setup_mini.py" "$dir/mini/"
  (
    [ -n "$cxx" ] && export CXX=$cxx
    export MAX_JOBS=$jobs_each
    cd "$dir/mini" && "$PY" setup_mini.py build_ext --inplace >"$dir/mini-build.log" 2>&1
    echo "mini build exit $?" >>"$dir/mini-build.log"
    cd "$dir/tree" && "$PY" setup.py build_ext --inplace >"$dir/build.log" 2>&1
    echo "torch_shard build exit $?" >>"$dir/build.log"
  )
}
pids=()
for v in "${variants[@]}"; do
  build_variant "${v%%|*}" "${v#*|}" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
say "diagnosis: ${#variants[@]} variants built ($(elapsed)): $(for v in "${variants[@]}"; do n=${v%%|*}; echo -n "$n[$(tail -1 "$WORK/$n/mini-build.log" | awk '{print $NF}'),$(tail -1 "$WORK/$n/build.log" | awk '{print $NF}')] "; done)"
{
  echo "===== the default build's commands and library"
  grep -m1 '^cflags' "$WORK"/default/tree/build/temp-*/build.ninja
  grep -m1 '^post_cflags' "$WORK"/default/tree/build/temp-*/build.ninja
  grep -E -- ' -shared ' "$WORK/default/build.log" | head -1
  so=$(ls "$WORK"/default/tree/torch_shard/_C*.so 2>/dev/null | head -1)
  if [ -n "$so" ]; then
    readelf -n "$so" | grep -iE 'x86 feature|properties'
    readelf -p .comment "$so" | grep -v '^$' | head -6
    readelf -d "$so" | grep -E 'NEEDED|RPATH|RUNPATH|FLAGS'
    readelf -lW "$so" | grep -E 'GNU_EH_FRAME|GNU_PROPERTY|GNU_STACK'
    readelf -SW "$so" | grep -E 'eh_frame|gcc_except|debug_info' | awk '{print $2, $6}'
    nm -D --defined-only "$so" | grep -cE ' (_Unwind|__cxa|__gxx)' | sed 's/^/unwinder or C++ runtime symbols defined in _C: /'
    ldd "$so" | grep -E 'stdc\+\+|gcc_s|libc\.so|not found'
  fi
  for n in "${variants[@]}"; do
    n=${n%%|*}
    echo "--- $n: $(tail -1 "$WORK/$n/mini-build.log"); $(tail -1 "$WORK/$n/build.log")"
    grep -E 'error|Error' "$WORK/$n/build.log" | head -5
  done
} >>"$LOG" 2>&1

# ---------------------------------------------------------------------------------------------- 3.
cat >"$WORK/segv_report.c" <<'EOF'
// LD_PRELOAD: on SIGSEGV/SIGBUS/SIGILL/SIGABRT print the faulting pc as library+offset, the words of the
// stack that point into loaded code (no unwinder needed), then glibc's backtrace(), then die as before.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static char alt[1 << 16];

static void where(const char* what, void* p) {
  char buf[600];
  Dl_info info;
  int n;
  if (dladdr(p, &info) && info.dli_fname) {
    n = snprintf(buf, sizeof buf, "segv_report: %s %p = %s+0x%lx (%s)\n", what, p, info.dli_fname,
                 (unsigned long)((char*)p - (char*)info.dli_fbase), info.dli_sname ? info.dli_sname : "?");
  } else {
    n = snprintf(buf, sizeof buf, "segv_report: %s %p (no object)\n", what, p);
  }
  if (n > 0) write(2, buf, n < (int)sizeof buf ? n : (int)sizeof buf - 1);
}

static void report(int sig, siginfo_t* si, void* ctx) {
  ucontext_t* uc = (ucontext_t*)ctx;
  char buf[300];
  int n = snprintf(buf, sizeof buf, "segv_report: signal %d code %d addr %p rsp %p rbp %p\n", sig, si->si_code,
                   si->si_addr, (void*)uc->uc_mcontext.gregs[REG_RSP], (void*)uc->uc_mcontext.gregs[REG_RBP]);
  write(2, buf, n);
  unsigned char* pc = (unsigned char*)uc->uc_mcontext.gregs[REG_RIP];
  where("pc", pc);
  n = snprintf(buf, sizeof buf, "segv_report: bytes at pc:");
  for (int i = 0; i < 16; i++) n += snprintf(buf + n, sizeof buf - n, " %02x", pc[i]);
  buf[n++] = '\n';
  write(2, buf, n);
  uintptr_t* sp = (uintptr_t*)uc->uc_mcontext.gregs[REG_RSP];
  for (int i = 0, shown = 0; i < 4096 && shown < 80; i++) {
    Dl_info info;
    if (dladdr((void*)sp[i], &info) && info.dli_fname) {
      char what[32];
      snprintf(what, sizeof what, "stack[%d]", i);
      where(what, (void*)sp[i]);
      shown++;
    }
  }
  write(2, "segv_report: backtrace():\n", 26);
  void* frames[64];
  int k = backtrace(frames, 64);
  for (int i = 0; i < k; i++) where("frame", frames[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  stack_t ss;
  memset(&ss, 0, sizeof ss);
  ss.ss_sp = alt;
  ss.ss_size = sizeof alt;
  sigaltstack(&ss, 0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = report;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGILL, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
EOF
cc -O1 -g -fPIC -shared -o "$WORK/segv_report.so" "$WORK/segv_report.c" -ldl >>"$LOG" 2>&1 || log "segv_report did not build"

cat >"$WORK/throw.py" <<'EOF'
# throw.py KIND [PATH]: one throw through the dispatcher; prints "raised <Type>" and exits 0 when it reaches Python.
import sys

import torch

kind = sys.argv[1]
if sys.argv[-1] == "cuda" and torch.cuda.is_available():
    torch.zeros(1, device="cuda").sum().item()
try:
    if kind == "torch":
        torch.ops.aten.select.int(torch.zeros(2), 0, 5)
    elif kind == "mini":
        torch.ops.load_library(sys.argv[2])
        torch.ops.mini.throw_if(torch.zeros(2), 3)
    else:
        import torch_shard  # noqa: F401

        torch.ops.torch_shard.chunk_boxes([10, 4], 2, 3)
except (ValueError, IndexError) as e:
    print(f"raised {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
else:
    sys.exit("no error raised")
for line in open("/proc/self/status"):
    if line.startswith("x86_"):
        print(line.strip())
EOF

cases=()  # "LABEL|ENV|ARGS"
for s in "TORCH_SHOW_CPP_STACKTRACES=0" "TORCH_SHOW_CPP_STACKTRACES=1"; do
  cases+=("torch's own throw, $s|$s|torch")
  for v in "${variants[@]}"; do
    n=${v%%|*}
    mini=$(ls "$WORK/$n"/mini/mini*.so 2>/dev/null | head -1)
    [ -n "$mini" ] && cases+=("mini/$n, $s|$s|mini $mini")
    [ -n "$(ls "$WORK/$n"/tree/torch_shard/_C*.so 2>/dev/null)" ] &&
      cases+=("torch_shard/$n, $s|$s PYTHONPATH=$WORK/$n/tree|torch_shard")
  done
done
if "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  cases+=("torch_shard/default, after CUDA init|PYTHONPATH=$WORK/default/tree|torch_shard cuda")
fi
# What the default build's crash depends on, where it crashes: glibc's CET tunables, lazy binding.
for extra in "GLIBC_TUNABLES=glibc.cpu.hwcaps=-SHSTK,-IBT" "GLIBC_TUNABLES=glibc.cpu.x86_shstk=off:glibc.cpu.x86_ibt=off" \
  "LD_BIND_NOW=1" "LD_PRELOAD=$WORK/segv_report.so"; do
  cases+=("torch_shard/default, $extra|PYTHONPATH=$WORK/default/tree $extra|torch_shard")
done
i=0
pids=()
for c in "${cases[@]}"; do
  IFS='|' read -r label envs args <<<"$c"
  (cd "$WORK" && env $envs timeout 120 "$PY" "$WORK/throw.py" $args >"$WORK/case-$i.out" 2>&1; echo "$?" >"$WORK/case-$i.rc") &
  pids+=($!)
  i=$((i + 1))
done
for p in "${pids[@]}"; do wait "$p"; done
i=0
say "===== throws (exit 0 = raised in Python; 139 = SIGSEGV, 134 = SIGABRT)"
for c in "${cases[@]}"; do
  IFS='|' read -r label envs args <<<"$c"
  rc=$(cat "$WORK/case-$i.rc")
  say "throw: $label: exit $rc: $(grep -E 'raised|Fatal|Segmentation|segv_report: pc|Error' "$WORK/case-$i.out" | head -1 | cut -c1-150)"
  { echo "--- case $i ($label; env: $envs; args: $args)"; tail -n 60 "$WORK/case-$i.out"; } >>"$LOG"
  i=$((i + 1))
done

# Symbolize the preloaded reporter's frames (library+offset) with addr2line.
report=$(grep -l 'segv_report: pc' "$WORK"/case-*.out 2>/dev/null | head -1)
if [ -n "$report" ]; then
  log "===== addr2line of $report"
  grep -oE '= [^ ]+\+0x[0-9a-f]+' "$report" | sed 's/^= //' | head -60 | while read -r fo; do
    f=${fo%+*}
    o=${fo##*+}
    echo "$fo: $(timeout 20 addr2line -Cfpe "$f" "$o" 2>&1 | head -1)"
  done >>"$LOG" 2>&1
fi

# A debugger's backtrace of the default build's crash, where one crashes and a debugger exists (the
# GPU image has cuda-gdb, no gdb). In the background: the gpu-check below does not wait for it.
gdb_pid=
dbg=$(command -v gdb || command -v cuda-gdb || true)
if [ -n "$dbg" ] && grep -qE 'torch_shard/default, TORCH_SHOW_CPP_STACKTRACES=0: exit (1[3-9][0-9]|-)' "$LOG"; then
  (
    cd "$WORK" && PYTHONPATH=$WORK/default/tree timeout 240 "$dbg" -q -batch -ex 'set pagination off' \
      -ex 'set debuginfod enabled off' -ex run -ex bt -ex 'info registers rip rsp rbp' -ex 'x/8i $pc' \
      -ex 'frame 1' -ex 'x/8i $pc' --args "$PY" "$WORK/throw.py" torch_shard >"$LOGS/gdb.log" 2>&1
  ) &
  gdb_pid=$!
fi

# ---------------------------------------------------------------------------------------------- 4.
chosen=
for v in "${variants[@]}"; do
  n=${v%%|*}
  if grep -qE "^throw: torch_shard/$n, TORCH_SHOW_CPP_STACKTRACES=0: exit 0" "$LOG" &&
    grep -qE "^throw: torch_shard/$n, TORCH_SHOW_CPP_STACKTRACES=1: exit 0" "$LOG"; then
    chosen=$v
    break
  fi
done
say "diagnosis: first build whose throws raise: ${chosen%%|*} ($(elapsed))"
if [ "${DIAG_CHECK:-1}" = 1 ] && [ -n "$chosen" ]; then
  n=${chosen%%|*}
  cxx=${chosen#*|}
  say "===== make gpu-check in the tree built as '$n'"
  (
    [ -n "$cxx" ] && export CXX=$cxx
    cd "$WORK/$n/tree" && GPU_CHECK_LOG=$LOGS/gpu-check.log timeout "${DIAG_CHECK_TIMEOUT:-420}" \
      bash scripts/gpu_check.sh "$PY"
  ) 2>&1 | tee -a "$LOG"
fi
if [ -n "$gdb_pid" ]; then
  wait "$gdb_pid"
fi
for v in "${variants[@]}"; do
  n=${v%%|*}
  { echo "===== $n"; cat "$WORK/$n/mini-build.log" "$WORK/$n/build.log"; } >>"$LOGS/builds.log" 2>&1
done
say "diagnosis: done ($(elapsed))"
