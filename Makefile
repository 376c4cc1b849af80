# make demo   set up .venv and run a local 2-worker training
# make test   set up .venv and run the whole test suite
# make test-fast  only the pure parts' tests (planner, hostlists, schedules, watchers...): seconds
# make test-fast-pythons  the same without TensorFlow, JAX or torch, on each of FAST_PYTHONS
#             (python3.10 python3.13 unless given: the oldest Python mgpu supports, and the newest)
# make bench  run the benchmarks; results go to benchmarks/results/
#             make bench WORKERS=1,2,4,8,16: only the scaling sweep at those worker counts
# make bench-accuracy  train on real Fashion-MNIST (DATA_DIR) with 1 and 2 workers
# make bench-links  2 hosts in network namespaces over shaped links (root; LINKS=unshaped,10gbit,1gbit)
# make bench-startup  check and launch against hosts in network namespaces with sshd (root; HOSTS=2,4,8,16,32)
# make bench-soak  one run over hosts in network namespaces under a seeded schedule of faults (root; SEED=55)
# make docs   render docs/performance.md from benchmarks/results/ and build the site into site/

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MGPU := $(VENV)/bin/mgpu
INSTALLED := $(VENV)/.installed
BASE_INSTALLED := $(VENV)/.installed-base
EXTRAS := train,dev,legacy-keras
BENCH_INSTALLED := $(VENV)/.installed-bench
DATA_DIR ?= ../shared/data/fashion-mnist
comma := ,
PYENV_ROOT ?= $(HOME)/.pyenv
# pyenv's builds where there are some, else whatever python3.10 and python3.13 are on PATH.
FAST_PYTHONS ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.10.*/bin/python3.10) python3.10) \
	$(firstword $(wildcard $(PYENV_ROOT)/versions/3.13.*/bin/python3.13) python3.13)
# mgpu's own requirements and the test tools, no framework: what `pytest -m fast` must pass with.
FAST_TOOLS := pytest pytest-timeout mkdocs kubernetes-validate

.PHONY: test-durations venv bench-venv demo test test-fast test-fast-pythons bench bench-links bench-startup bench-soak bench-accuracy docs clean

# mgpu itself and the tools of its fast tests, no framework: seconds. The fast tests can run from here.
$(BASE_INSTALLED): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --quiet --upgrade pip setuptools
	$(PY) -m pip install --quiet --quiet --no-compile -e . $(FAST_TOOLS)
	touch $@

# Re-installs whenever the package metadata changes. Not the bench extra (matplotlib): the tests
# plot nothing, and where matplotlib is installed, `import tensorflow` and `import keras` load it
# (Keras's image-gallery plots), 0.3-0.8 CPU-s in each of the many tasks the tests start.
# --no-compile: compiling every module of TensorFlow, JAX and torch to bytecode is two thirds of the
# install's time on two cores; Python compiles (and caches) only the modules a process imports.
$(INSTALLED): $(BASE_INSTALLED)
	$(PY) -m pip install --quiet --quiet --no-compile -e '.[$(EXTRAS)]'
	touch $@

# The benchmarks draw their plots with matplotlib.
$(BENCH_INSTALLED): $(INSTALLED)
	$(PY) -m pip install --quiet --quiet --no-compile -e '.[train,dev,bench,legacy-keras]'
	touch $@

venv: $(INSTALLED)

bench-venv: $(BENCH_INSTALLED)

demo: venv
	rm -rf mgpu-runs/demo-model mgpu-runs/demo-export  # a fresh run, not a resume of the last one
	$(MGPU) launch --local 2 --threads-per-task 1 -- \
		--dataset synthetic --train-steps 200 --log-every 25 --eval-every 100 \
		--model-dir mgpu-runs/demo-model --export-dir mgpu-runs/demo-export

# Five pytest processes on two cores, each given whole files, so that a file's fixtures are made
# once (TEST_WORKERS=0: one, in order); the 25 slowest tests listed at the end. Nearly half of a
# file's time is spent waiting (on sshd, Slurm, the timeouts tests provoke): more processes than
# cores keep both busy through those waits (a fresh clone here: 7 min 24 s with five, 7 min 34 s
# with four, about 9 with three), and the tests hold under that load. The files go out in the order
# of collection, costliest first (tests/conftest.py), not re-sorted by how many tests they hold.
TEST_WORKERS ?= 5
XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# Bytecode is cached even where PYTHONDONTWRITEBYTECODE is set: the venv is installed with
# --no-compile, so each of the hundreds of processes the tests start would otherwise compile every
# module it imports again (importing TensorFlow: 7.0 CPU-s so, 2.7 from the cache; torch 2.6 and
# 1.1; JAX 1.6 and 0.5). The first process to import a module caches it for the others, in a folder
# of the venv's (PYTHONPYCACHEPREFIX), so that no __pycache__ appears in the project's folders,
# which --sync copies. The launcher and the frameworks compiled first (tests/cache_bytecode.py):
# processes that start together would each compile the same modules.
WRITE_BYTECODE := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache
# Where the frameworks are not installed yet (a fresh clone), the fast tests start first, on the core
# their install leaves idle (tests/install_beside_tests.py), and go on beside the rest of the suite,
# their output in a file; their closing line comes last.
test: $(BASE_INSTALLED)
	set -e; fast=; failed=0; \
	if ! $(MAKE) --no-print-directory -q $(INSTALLED); then \
		echo "== the fast tests run while the frameworks install: $(VENV)/fast-tests.log"; \
		MGPU_TESTS_WHILE_INSTALLING=1 $(WRITE_BYTECODE) $(PY) -m pytest -m fast -q > $(VENV)/fast-tests.log 2>&1 & fast=$$!; \
		$(WRITE_BYTECODE) $(PY) tests/install_beside_tests.py $(INSTALLED) $$fast $(subst $(comma), ,$(EXTRAS)) \
			|| { kill $$fast; exit 2; }; \
		set -- -m "not fast"; \
	fi; \
	$(WRITE_BYTECODE) $(PY) -m compileall -q launcher; \
	$(WRITE_BYTECODE) $(PY) tests/cache_bytecode.py; \
	$(WRITE_BYTECODE) $(PY) -m pytest "$$@" $(XDIST) --durations=25 || failed=$$?; \
	if [ -n "$$fast" ]; then \
		wait $$fast || { cat $(VENV)/fast-tests.log; failed=1; }; \
		echo "== the fast tests: $$(tail -n 1 $(VENV)/fast-tests.log)"; \
	fi; \
	exit $$failed

# Each test file's seconds, for the order in which `make test` hands files to its processes.
test-durations: venv
	$(WRITE_BYTECODE) MGPU_TEST_DURATIONS=tests/durations.json $(PY) -m pytest $(XDIST) -q

test-fast: $(BASE_INSTALLED)
	$(PY) -m pytest -m fast -q

# One venv per Python (.venv-fast-python3.10...), made once.
test-fast-pythons:
	set -e; for python in $(FAST_PYTHONS); do \
		venv=.venv-fast-$$(basename $$python); \
		if [ ! -x $$venv/bin/python ]; then \
			$$python -m venv $$venv; \
			$$venv/bin/python -m pip install --quiet --quiet -e . $(FAST_TOOLS); \
		fi; \
		echo "== $$($$venv/bin/python --version)"; \
		$$venv/bin/python -m pytest -m fast -q; \
	done

bench: bench-venv
	$(PY) benchmarks/run_all.py $(if $(WORKERS),--workers $(WORKERS))

bench-links: bench-venv
	$(PY) benchmarks/links.py $(if $(LINKS),--links $(LINKS))

bench-startup: bench-venv
	$(PY) benchmarks/startup.py $(if $(HOSTS),--hosts $(HOSTS))

bench-soak: bench-venv
	$(PY) benchmarks/soak.py $(if $(SEED),--seed $(SEED))

bench-accuracy: bench-venv
	$(PY) benchmarks/accuracy.py --data-dir $(DATA_DIR)

docs: venv
	$(PY) benchmarks/render_docs.py
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) .venv-fast-* mgpu-runs .pytest_cache site
