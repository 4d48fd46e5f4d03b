# fasttrain: `make setup` once, then `make demo` (CPU, offline) or `make repro` (the real run).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
export PATH := $(abspath $(VENV))/bin:$(PATH)
# Every command make runs imports this checkout's fasttrain, whichever checkout the environment was
# installed from: in `.demo/` (make demo), .demo's own src/.
export PYTHONPATH := $(CURDIR)/src$(if $(PYTHONPATH),:$(PYTHONPATH))
# torch.compile's cache (train.compile, the fast recipe): in the user's cache, beside fasttrain's bytecode,
# so it outlives reboots, /tmp cleaners and a DVC experiment's temporary workspace, and a new clone or
# repository finds the graphs an earlier one compiled. A cold cache costs the fast recipe about 35 s more
# compile on an H200 (docs/fast-recipe.md). Set the variable to move it. The folder's rule has one home,
# layout.user_cache (standard library only, read as VARIANTS is below).
ifndef TORCHINDUCTOR_CACHE_DIR
export TORCHINDUCTOR_CACHE_DIR := $(shell $(PYTHON) -c 'import runpy; print(runpy.run_path("src/fasttrain/layout.py")["user_cache"]("torchinductor"))')
endif

# The variant names, read from their one home, src/fasttrain/layout.py (standard library only, so any
# python3 reads it before `make setup`).
VARIANTS := $(shell $(PYTHON) -c 'import runpy; print(*runpy.run_path("src/fasttrain/layout.py")["VARIANTS"])')
TRAIN_TARGETS := $(addprefix train-,$(VARIANTS))

.PHONY: help setup demo test test-harness repro fast bench experiments compare metrics plots tensorboard clean $(TRAIN_TARGETS)

help:  ## list the targets
	@grep -E '^[a-z%-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
	@echo "train-<parallel>-<precision>	one variant's training stages (one per seed of compare.seeds) through DVC, if anything it reads changed (FORCE=1: always), e.g. make train-ddp-amp"

setup: $(VENV)/.installed  ## a virtual environment with everything installed
ifeq ($(shell test -L $(VENV) && echo link),link)
$(VENV)/.installed: ;  # a link to the environment of the repository this copy came from (make demo): set up there
else
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[test,docs]'
	touch $@
endif

# .demo/ is a git repository of its own: the files as they are here, demo/params.yaml laid over
# params.yaml (its comments kept), committed, then the run committed (dvc.lock, the comparison), what `dvc
# metrics diff` there compares with. It uses this environment (.demo/.venv is a link to it) and its
# own code. Commits take your git identity, or "fasttrain demo" where git has none.
DEMO_GIT = git -c user.name="$$(git config user.name || echo fasttrain demo)" \
	-c user.email="$$(git config user.email || echo demo@fasttrain.invalid)"
demo: setup  ## the whole 12-variant pipeline on synthetic data, CPU, offline, in a scratch git repository (.demo/)
	rm -rf .demo && mkdir .demo
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp -p --parents -t .demo
	$(VENV)/bin/python scripts/overlay.py params.yaml demo/params.yaml .demo/params.yaml
	cd .demo && git init -q && git add -A && $(DEMO_GIT) commit -q -m "make demo: demo/params.yaml laid over params.yaml"
	ln -s $(abspath $(VENV)) .demo/.venv
	cd .demo && fasttrain serve -- dvc repro
	cd .demo && git add -A && $(DEMO_GIT) commit -q -m "make demo: the run (what dvc metrics diff compares with)"

# The end-to-end tests wait on processes (DVC, torchrun, interpreters starting) as much as they
# compute: two workers (pytest-xdist, one test file each at a time) keep both of CI's cores busy,
# the longest files first (tests/conftest.py).
test: setup  ## the test suite (unit + end-to-end), as CI runs it
	$(VENV)/bin/python -m pytest -q -n auto --maxprocesses=4 --dist loadfile --no-loadscope-reorder

test-harness: setup  ## CPU checks of the GPU-harness scripts in scripts/gpu/ (left out of `make test`)
	$(VENV)/bin/python -m pytest -q -m harness

# `fasttrain serve -- CMD`: the fasttrain processes that CMD starts (every stage, torchrun's workers) fork
# from one process that imported torch once, instead of each importing it (about 2 s a process).
repro: setup  ## the real pipeline with params.yaml
	fasttrain serve -- dvc repro

# Like any make target: nothing changed, nothing runs (DVC compares the stage's deps and params with
# dvc.lock). A variant trains once per seed of compare.seeds (stages train@<variant>-<seed>): the target
# runs every seed's. FORCE=1 trains them again whatever changed; the data set is still made only if stale.
$(TRAIN_TARGETS): train-%: setup
ifdef FORCE
	dvc repro download
	fasttrain serve -- dvc repro --force --single-item --glob 'train@$*-*'
else
	fasttrain serve -- dvc repro --glob 'train@$*-*'
endif

train-%:  # any other name: say which ones there are
	$(error unknown variant '$*': choose one of $(VARIANTS))

# Run again with nothing changed, DVC restores the experiment's outputs from its run cache (same inputs,
# same outputs) and measures nothing. SEED=N (default 0) is the run's seed, compare.seeds=[N]: a seed not
# run before trains and measures.
fast: setup  ## the fast recipe (recipes/fast.yaml) as a DVC experiment of single-bf16; params.yaml untouched
	$(if $(SEED),$(if $(shell [[ '$(SEED)' =~ ^[0-9]+$$ ]] && echo ok),,$(error SEED=$(SEED) is not a seed: use a whole number >= 0, e.g. make fast SEED=3)))
	flags=$$(python3 scripts/overlay.py --dvc-flags recipes/fast.yaml) && \
	  fasttrain serve -- dvc exp run --temp $$flags -S 'compare.seeds=[$(or $(SEED),0)]' \
	    train@single-bf16-$(or $(SEED),0) evaluate@single-bf16-$(or $(SEED),0)
	fasttrain experiments --variant single-bf16 --param train.epochs --param compare.seeds

bench: setup  ## loaders vs compute ceiling vs bf16 peak, on the GPU (writes metrics/bench.json)
	dvc repro download
	fasttrain bench

# `dvc exp show` has a column for every param and every metric of every file, hundreds here.
experiments: setup  ## HEAD's DVC experiments in 120 columns: what each changed, its figures (VARIANT=v: that variant's)
	fasttrain experiments $(if $(VARIANT),--variant $(VARIANT))

compare: setup  ## re-make and print the comparison table
	dvc repro compare
	@cat metrics/compare.md

# Every variant's headline figures, train and evaluate, one row per file and seed: a table 200 columns
# wide (the comparison is `make compare`; each run's diagnostics are diagnostics/<stage>/seed<N>/<variant>.json).
metrics: setup  ## every variant's headline metrics as one Markdown table (dvc metrics show)
	dvc metrics show --md metrics/train/*/*.json metrics/eval/*/*.json

plots: setup  ## render every plot into dvc_plots/index.html (draws offline: .dvc/plots/page.html)
	dvc plots show

tensorboard: setup  ## TensorBoard over every variant's run
	tensorboard --logdir tensorboard --bind_all

clean:  ## remove outputs and scratch folders (not the DVC cache)
	rm -rf .demo dvc_plots data/dataset.pt models checkpoints tensorboard
