# fasttrain: `make setup` once, then `make demo` (CPU, offline) or `make repro` (the real run).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

PARALLELS := single dp ddp
PRECISIONS := fp32 autocast amp bf16
TRAIN_TARGETS := $(foreach p,$(PARALLELS),$(foreach q,$(PRECISIONS),train-$(p)-$(q)))

.PHONY: help setup demo test repro fast bench compare metrics plots tensorboard clean $(TRAIN_TARGETS)

help:  ## list the targets
	@grep -E '^[a-z%-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'
	@echo "train-<parallel>-<precision>	re-make one variant through DVC, e.g. make train-ddp-amp"

setup: $(VENV)/.installed  ## a virtual environment with everything installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(VENV)/bin/pip install -q -e '.[test,docs]'
	touch $@

demo: setup  ## the whole 12-variant pipeline on synthetic data, CPU, offline, in a scratch copy (.demo/)
	rm -rf .demo && mkdir .demo
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t .demo
	$(VENV)/bin/python scripts/overlay.py params.yaml demo/params.yaml .demo/params.yaml
	cd .demo && dvc config --local core.no_scm true && dvc repro

test: setup  ## the test suite (unit + end-to-end), as CI runs it
	$(VENV)/bin/python -m pytest -q

repro: setup  ## the real pipeline with params.yaml
	dvc repro

$(TRAIN_TARGETS): train-%: setup  ## re-make one variant's training stage through DVC
	dvc repro download
	dvc repro --force --single-item train@$*

fast: setup  ## the fast recipe (recipes/fast.yaml) as a DVC experiment of single-bf16; params.yaml untouched
	dvc exp run --temp $$($(VENV)/bin/python scripts/overlay.py --dvc-flags recipes/fast.yaml) \
	  train@single-bf16 evaluate@single-bf16
	dvc exp show --only-changed

bench: setup  ## loaders vs compute ceiling vs bf16 peak, on the GPU (writes metrics/bench.json)
	dvc repro download
	fasttrain bench

compare: setup  ## re-make and print the comparison table
	dvc repro compare
	@cat metrics/compare.md

metrics: setup  ## dvc metrics show
	dvc metrics show

plots: setup  ## render every plot into dvc_plots/index.html (draws offline: .dvc/plots/page.html)
	dvc plots show

tensorboard: setup  ## TensorBoard over every variant's run
	tensorboard --logdir tensorboard --bind_all

clean:  ## remove outputs and scratch folders (not the DVC cache)
	rm -rf .demo dvc_plots data/dataset.pt models checkpoints tensorboard
