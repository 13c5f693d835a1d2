# The two commands: `make demo` and `make test`. Each sets up .venv itself on a fresh clone;
# so do `make docs` and `make package-check`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

OLDEST := .venv-oldest
OLDEST_PY := $(OLDEST)/bin/python

DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: demo test test-oldest lint bench docs serve package-check clean

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

# The non-slow suite on the oldest releases pyproject.toml declares (.ci/oldest.txt), in a
# second environment, so the floors are tested, not only written down (the examples in the docs
# show the newest torch's features, so they run in `make test` only).
$(OLDEST)/.installed: pyproject.toml .ci/oldest.txt
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST)
	@echo "Installing format-auditor on the oldest releases into $(OLDEST) (log: $(OLDEST)/pip.log)"
	$(OLDEST_PY) -m pip install -c .ci/oldest.txt -e ".[dev,zoo]" > $(OLDEST)/pip.log 2>&1 || \
	  (grep -v "is ignored: it is neither" $(OLDEST)/pip.log | tail -40; exit 1)
	$(OLDEST_PY) -c "import auditor, torch, torchvision; print('oldest: torch', torch.__version__)"
	touch $(OLDEST)/.installed

test-oldest: $(OLDEST)/.installed
	$(OLDEST_PY) -m pytest -q -m "not slow and not docs" -p no:cacheprovider

# The site in docs/ (mkdocs-material, mkdocstrings), built strictly: a broken link or reference, a
# public name without a docstring, a page left out of the nav fails it. Its tools are the `docs`
# extra, added to .venv on the first run.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	@echo "Installing the docs extra into $(VENV) (log: $(VENV)/pip-docs.log)"
	$(PY) -m pip install -e ".[dev,zoo,docs]" > $(VENV)/pip-docs.log 2>&1 || \
	  (grep -v "is ignored: it is neither" $(VENV)/pip-docs.log | tail -40; exit 1)
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# The built site/ browses and searches from disk (open site/index.html); this serves the pages
# at http://127.0.0.1:8000 instead, rebuilt as docs/ changes, for writing them.
serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The wheel and the sdist, each installed in a clean virtual environment that runs the quick start.
package-check: $(STAMP)
	PYTHON=$(PYTHON) BUILD_PY=$(PY) bash .ci/package

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
	rm -rf $(VENV) $(OLDEST) audit_out .pytest_cache site dist .cache
