# The few commands a person types. Every target sets up .venv first (once).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The student edition: its public GitHub repository, its branch, and a local clone of it.
REPO_URL ?=
BRANCH ?= main
EDITION ?=
SITE := build/site

.PHONY: setup demo test lab release grade lint site publish mutation

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

## demo: build release/, grade every sample class, print the grade tables
demo: $(STAMP)
	$(PY) -m autograder demo

## test: the whole suite (normref, notebooks, release, grading, browser), on every core,
## a test file per worker (its module fixtures, a graded class or a site, built once),
## the slowest first and each sample class on its own (tests/conftest.py)
# One worker more than cores: workers spend much of their time waiting on kernels and
# subprocesses they start (on 2 cores: 2 workers, 29.6 min; 3 workers, 21.0 min with the
# CPU 99% busy by vmstat).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print((os.cpu_count() or 1) + 1)")
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

## lab: JupyterLab at the course root (lessons, assignments, formgrader)
lab: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyter lab --notebook-dir=. \
		$(if $(filter 0,$(shell id -u)),--allow-root)

## release [ASSIGNMENT=01_the_recipe]: rebuild release/ (or one assignment) from source/,
## built aside and leak-checked; a failed build leaves release/ as it was
release: $(STAMP)
	$(PY) -m autograder release $(ASSIGNMENT)

## grade ASSIGNMENT=01_the_recipe: grade everyone in submitted/
grade: $(STAMP)
	$(PY) -m autograder grade $(ASSIGNMENT)

lint: $(STAMP)
	$(VENV)/bin/ruff check normref autograder tests

## mutation [MODULE=autograder/grading/forbidden.py]: mutation testing (mutmut) of the checks and
## the grader, each module against its fast tests; prints the score and the survivors
mutation: $(STAMP)
	$(PY) scripts/mutation.py $(MODULE)

## site REPO_URL=https://github.com/OWNER/NAME: run every lesson, build the static
## site (build/site/) whose pages link to the edition's notebooks on Binder and Colab
site: $(STAMP)
	$(if $(REPO_URL),,$(error make site REPO_URL=https://github.com/OWNER/NAME (the edition's public repository)))
	$(PY) -m autograder.publishing.site --repo-url "$(REPO_URL)" --branch "$(BRANCH)" --out $(SITE)

## publish EDITION=DIR REPO_URL=...: write the student edition, site included, into
## DIR (a clone of the public repository); nothing is written if it would leak
publish: site
	$(if $(EDITION),,$(error make publish EDITION=DIR REPO_URL=... (DIR: a clone of the edition's repository)))
	$(PY) -m autograder publish "$(EDITION)" --repo-url "$(REPO_URL)" --branch "$(BRANCH)" --site $(SITE)
