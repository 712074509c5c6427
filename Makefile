# recompute-kit developer entry points. Everything runs inside .venv (created if missing).
# torch is installed only when it is not importable: on a CPU machine that is torch==2.13.0,
# the CPU build; a CUDA machine keeps the torch it already has.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0

.PHONY: setup demo test lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)

setup: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_CPU)
	@$(PY) -m pip install -q -e ".[dev,notebooks]"

# The main job on the embedded defaults: prove recompute exact on the tiny GPT, then run both
# notebooks (OOM diagnosis + plan, recompute ablation) with papermill into runs/demo/.
demo: setup
	$(VENV)/bin/recompute-kit verify --model tiny-gpt --device auto
	@mkdir -p runs/demo
	$(VENV)/bin/papermill notebooks/oom_diagnosis.ipynb runs/demo/oom_diagnosis.ipynb \
		-p out_dir runs/demo/oom --progress-bar
	$(VENV)/bin/papermill notebooks/recompute_ablation.ipynb runs/demo/recompute_ablation.ipynb \
		-p out_dir runs/demo/ablation --progress-bar
	@echo
	@echo "OOM diagnosis:  runs/demo/oom/report.md  (report.json, breakdown_*.png)"
	@echo "Ablation:       runs/demo/ablation/summary.md  (results.jsonl, report.json, *.png)"
	@echo "Executed notebooks: runs/demo/*.ipynb  (open with: .venv/bin/jupyter lab runs/demo)"

# On every core (pytest-xdist): the suite is CPU-bound, two cores halve it.
test: setup
	$(PY) -m pytest -q -n auto

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
