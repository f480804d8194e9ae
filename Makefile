# Two entry points, both idempotent on a fresh machine (see README "Quickstart"):
#   make reproduce   set up, then run the main job through snakemake (default profile)
#   make test        set up, then run the test suite
# Set-up reinstalls only when pyproject.toml is newer than the install stamp.

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Read the torch pin from pyproject.toml so there is one source of truth.
TORCH  := $(shell grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')

.PHONY: test reproduce setup

setup: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch goes first and pinned: the CPU wheel is on local disk, while letting pip
# resolve an unpinned torch would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install '$(TORCH)'
	$(PY) -m pip install -e '.[all]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# PATH puts the venv first so rules' `python -m ...` lines use this environment.
reproduce: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/snakemake --cores 2
	@echo "Main job done (CPU-proxy scale so far: data stage). Outputs under results/:"
	@echo "  results/data/length_stats/<dataset>.json|.png  post-pipeline length statistics"
	@echo "  results/data/proxies, results/data/assets       proxy datasets, tokenizer, tiny Qwen3-VL"
