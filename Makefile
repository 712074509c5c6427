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
	@$(PY) -m pip install -q -e ".[dev]"

demo: setup
	$(VENV)/bin/recompute-kit verify --model tiny-gpt --device auto

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache *.egg-info
