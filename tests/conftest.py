"""Shared paths and helpers for the course's test suites."""

import os
import sys
from pathlib import Path

import pytest

# nbgrader runs `alembic` by name: give every test this interpreter's bin/ first.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

REPO = Path(__file__).resolve().parent.parent
LESSONS = sorted((REPO / "notebooks").glob("*.ipynb"))
SOURCES = sorted((REPO / "source").glob("*/*.ipynb"))
RELEASES = sorted((REPO / "release").glob("*/*.ipynb"))


@pytest.fixture
def venv_env():
    """The environment for subprocesses: this interpreter's bin/ first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
