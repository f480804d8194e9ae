# Two entry points, both idempotent on a fresh machine (see README "Quickstart"):
#   make reproduce   set up, then run the main job through snakemake (default profile)
#   make test        set up, then run the test suite (the 15 slowest phases and every test
#                    over its time budget reported, never failed; a hang fails:
#                    tests/time_budget.py)
#   make test-budget the suite with budgets enforced, scaled by the machine's measured speed
#   make test-quick  the inner loop: tests that start no rank processes and are not slow
#   make docs        the docs site, warnings as errors, into docs/_build/html (also run by
#                    make test: tests/test_docs.py)
#   make docs-check  make docs, then screenshots of the built site in headless Chromium
#                    (Debian's package; installed if missing, needs root): docs/docs-check.md
# and the paper-path rehearsal (root: it starts a local two-node Slurm cluster):
#   make rehearse    snakemake --profile slurm on the paper grid's settings, to the report
# and LLaMA-Factory's SFT stage with ODB batches, in its own venv (older pins):
#   make check-llamafactory   W=2 on CPU, every sample trained exactly once
# Set-up reinstalls only when pyproject.toml or the pins are newer than the install stamp.

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The artifact's exact pins; pyproject.toml declares only odb's own ranges.
PINS   := requirements/artifact.txt
TORCH  := $(shell grep -E '^torch==' $(PINS))
# Makes the checkout importable in the venv: the experiment packages (baselines,
# experiments, eval, paper, bench) run from the repository root and are not installed.
ROOT_PTH := odb-artifact-root.pth

.PHONY: test test-quick test-budget reproduce rehearse setup check-llamafactory docs docs-check

setup: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

# torch goes first and pinned: the CPU wheel is on local disk, while letting pip
# resolve an unpinned torch would pull a multi-GB CUDA build. Then every other pin, then
# odb itself (editable, no dependencies: the pins already satisfy its ranges). The
# uninstall removes the pre-split `odb-artifact` distribution from an older venv.
$(STAMP): pyproject.toml $(PINS) | $(PY)
	$(PY) -m pip install '$(TORCH)'
	$(PY) -m pip install -r $(PINS)
	$(PY) -m pip install --no-deps -e .
	$(PY) -c 'import pathlib, sys, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], sys.argv[1]).write_text(sys.argv[2] + "\n")' $(ROOT_PTH) "$(CURDIR)"
	$(PY) -m pip uninstall -y odb-artifact
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

# On purpose, not in CI: a test over its budget fails; the budgets are first scaled by a
# reference workload timed on this machine (tests/time_budget.py, docs/testing.md).
test-budget: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15 --budget-strict --budget-scale=auto

# Markers in pyproject.toml: dist (spawns processes), slow, slurm. docs/testing.md.
test-quick: $(STAMP)
	$(PY) -m pytest -q -m "not dist and not slow and not slurm" --durations=10

# The reference pages are generated from the sources at each build (docs/_ext/); a broken
# link, a missing anchor or a reference to an undocumented name fails it.
DOCS_OUT := docs/_build/html
SHOTS    := docs/_static/screenshots
CHROMIUM := chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
	--force-device-scale-factor=1 --window-size=1280,900 --virtual-time-budget=5000

docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs $(DOCS_OUT)
	@echo "Docs site: $(DOCS_OUT)/index.html"

# On demand: look at what the build made. The PNGs are committed and described in
# docs/docs-check.md; look at them after a change to the theme or the landing page.
docs-check: docs
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)
	mkdir -p $(SHOTS)
	$(CHROMIUM) --screenshot=$(SHOTS)/landing.png "file://$(CURDIR)/$(DOCS_OUT)/index.html"
	$(CHROMIUM) --screenshot=$(SHOTS)/odbloader.png \
		"file://$(CURDIR)/$(DOCS_OUT)/reference/generated/odb.ODBLoader.html"
	@echo "Screenshots: $(SHOTS)/landing.png, $(SHOTS)/odbloader.png"

# PATH puts the venv first so rules' `python -m ...` lines use this environment; the CPU
# path never touches a hub.
reproduce: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
		$(VENV)/bin/snakemake --cores 2
	@echo "Main job done (CPU-proxy scale: tiny model, proxy data; not the paper's GPU numbers)."
	@echo "  results/paper/REPORT.md                 the report: every table and figure, scale,"
	@echo "                                          hardware, commit, the paper's numbers beside"
	@echo "  results/paper/tables/<table>.md|.tex    throughput, quality, cache, budget, depth,"
	@echo "                                          leverage, policy, join, staleness"
	@echo "  results/paper/figures/<table>.png       throughput, budget, depth, leverage"
	@echo "  results/train/<cell>/result.json        one training run per grid cell (+ final/,"
	@echo "                                          tensorboard/: tensorboard --logdir results/train)"
	@echo "  results/eval/<cell>/<benchmark>.json    val_loss, mmlu, mmmu_mc, mmmu_gen"
	@echo "  results/cache/<data>.json               GMT/BMT/Sorted/Packing length caches"
	@echo "  results/data/                           proxies, leverage mixes, assets, length stats"
	@echo "Rerun one ablation: snakemake --cores 2 ablation_budget (targets: docs/workflow.md)"

# The paper path through the real Slurm profile on a local two-node cluster, brought up
# and torn down by experiments/cluster/; the overlay config/rehearsal.yaml
# says what differs from config/paper.yaml. Results in results/rehearsal/.
rehearse: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m experiments.rehearsal.run
	@echo "Rehearsal done: results/rehearsal/results/paper/REPORT.md, summary in results/rehearsal/summary.json"

# LLaMA-Factory pins transformers, datasets, peft and accelerate below the artifact's, so
# it gets its own venv. Torch first (the same CPU pin), then the full freeze of that venv
# with --no-deps: llamafactory also declares its web UI and multimodal stack (gradio,
# torchvision, av, ...), which text SFT does not import and which would pull another
# torch. torchaudio 2.11.1's native extension is built for torch 2.11 and cannot load, so
# it is removed (the package imports as pure Python; requirements/llamafactory.txt says
# why). odb editable, without dependencies. docs/integrations.md, "LLaMA-Factory".
LF_VENV  := .venv-llamafactory
LF_PY    := $(LF_VENV)/bin/python
LF_PINS  := requirements/llamafactory.txt
LF_STAMP := $(LF_VENV)/.installed

$(LF_PY):
	python3 -m venv $(LF_VENV)

$(LF_STAMP): pyproject.toml $(LF_PINS) | $(LF_PY)
	$(LF_PY) -m pip install '$(TORCH)'
	$(LF_PY) -m pip install --no-deps -r $(LF_PINS)
	$(LF_PY) -c 'import pathlib, sysconfig; [p.unlink() for p in pathlib.Path(sysconfig.get_paths()["purelib"], "torchaudio", "lib").glob("*.so")]'
	$(LF_PY) -m pip install --no-deps -e .
	touch $(LF_STAMP)

check-llamafactory: $(LF_STAMP)
	$(LF_PY) experiments/rehearsal/llamafactory_check.py
