# The two commands: `make demo` and `make test`. Each sets up .venv itself on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing format-auditor and its dev tools into $(VENV) (log: $(VENV)/pip.log)"
	$(PY) -m pip install -e ".[dev,zoo]" > $(VENV)/pip.log 2>&1 || \
	  (grep -v "is ignored: it is neither" $(VENV)/pip.log | tail -40; exit 1)
	$(PY) -c "import auditor, torch, torchvision"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m auditor.demo --out audit_out --force

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/zoo.py
	$(PY) benchmarks/scale.py
	$(PY) benchmarks/fake_scale.py
	$(PY) benchmarks/fix_speedup.py
	$(PY) benchmarks/zoo_causes.py
	$(PY) benchmarks/savings.py

clean:
	rm -rf $(VENV) audit_out .pytest_cache
