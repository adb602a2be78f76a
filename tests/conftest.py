"""Shared paths and helpers for the course's test suites."""

import io
import json
import os
import re
import signal
import sys
import time
import unicodedata
import zipfile
from pathlib import Path

import pytest

# A test file per core runs at once (pytest-xdist): one maths thread per process, so
# that torch's thread pools in workers, lessons and kernels do not fight over the cores
# (a lesson that runs in 15 s alone took 130 s beside another with two pools each).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# nbgrader runs `alembic` by name: give every test this interpreter's bin/ first.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

REPO = Path(__file__).resolve().parent.parent

LESSONS = sorted((REPO / "notebooks").glob("*.ipynb"))
SOURCES = sorted((REPO / "source").glob("*/*.ipynb"))
RELEASES = sorted((REPO / "release").glob("*/*.ipynb"))
# Tests about anything but where hand-ins run grade on a local process pool: a Dask
# LocalCluster costs seconds of start-up per grading run, paid on every test that
# grades. tests/grading/test_engines.py, the demo's test and the killed-grader tests
# grade on Dask, the default.
GRADING_ENGINE = "pool"

# `make test` sends each test file to one worker (--dist loadfile), so that its module
# fixtures (a graded class, a built site) are built once. These tests are minutes each
# and share nothing: each goes to whichever worker is free.
SPREAD_OVER_WORKERS = (
    "tests/grading/test_grade.py::test_sample_class_grades_to_expected_scores_through_the_cli",
    "tests/grading/test_attacks_kept.py::test_kept_attacks_grade_to_their_expected_points",
)
# The slowest in `make test`'s --durations list, longest first, handed out first, so
# that no worker starts one of them while the others are finishing (seconds: one CI run
# on 2 cores, 3 workers). `make test` passes --no-loadscope-reorder: xdist's default
# reorder puts the files with most tests first, which sent these one-test scopes last.
_SAMPLE_CLASS = SPREAD_OVER_WORKERS[0]
_KEPT_ATTACKS = SPREAD_OVER_WORKERS[1]
LONGEST_FIRST = (
    f"{_SAMPLE_CLASS}[05_pre_post_ln]",  # 573
    f"{_SAMPLE_CLASS}[03_pytorch_layernorm]",  # 345
    "tests/grading/test_hostile_handins.py",  # 267 + the tests on its graded class
    f"{_SAMPLE_CLASS}[04_backward_pass]",  # 261
    f"{_SAMPLE_CLASS}[02_rows_versus_columns]",  # 243
    "tests/publishing/test_site.py",  # 192
    "tests/grading/test_grade.py",  # the demo, 189, and the CLI's tests
    f"{_SAMPLE_CLASS}[07_fused_kernel]",  # 189
    _KEPT_ATTACKS,  # 110-130 each
    "tests/publishing/test_edition_environment.py",  # 105
    "tests/grading/test_grader_dies.py",  # 95
    "tests/grading/test_bench.py",  # 90
    f"{_SAMPLE_CLASS}[06_low_precision]",  # 86
    "tests/publishing/test_colab_environment.py",
    "tests/test_instructor_features_attacks.py",
)


def pytest_collection_modifyitems(items):
    def rank(item):
        return next((i for i, start in enumerate(LONGEST_FIRST)
                     if item.nodeid.startswith(start)), len(LONGEST_FIRST))

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileSpreadingTheLongest(LoadFileScheduling):
        def _split_scope(self, nodeid):
            if nodeid.startswith(SPREAD_OVER_WORKERS):
                return nodeid
            return super()._split_scope(nodeid)

    return LoadFileSpreadingTheLongest(config, log)



def tiny_notebook(tag):
    """A small, valid notebook whose bytes name `tag`."""
    return json.dumps({"cells": [{"cell_type": "markdown", "metadata": {}, "source": tag}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}).encode()


def zip_of(path, members):
    """Write a zip of {name: bytes} at `path`; returns the path."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def tiny_course(root, assignment, *, extra=b""):
    """A course at `root` whose assignment is one tiny notebook (plus `extra` bytes)."""
    from autograder.course import Course

    (root / "source" / assignment).mkdir(parents=True)
    (root / "source" / assignment / f"{assignment}.ipynb").write_bytes(
        tiny_notebook("instructor") + extra)
    return Course(root)


def moodle_download_name(full_name, participant_id, file_name):
    """Moodle's name for a submitted file in "Download all submissions" (flat, as
    before folders were the default): mod/assign/locallib.php, download_submissions,
    the full name with "_" as " ", the participant id, the plugin and the file name."""
    return f"{full_name.replace('_', ' ')}_{participant_id}_assignsubmission_file_{file_name}"


def canvas_reads(member):
    """(user id, attachment id) as Canvas reads them from a re-uploaded file's name
    (app/models/assignment.rb, infer_comment_context_from_filename: split at "_", the
    first two all-digit fields)."""
    fields = [f for f in member.split("_") if f.isdigit() and f.isascii()]
    return int(fields[0]), int(fields[1])


def moodle_reads(member):
    """(participant id, plugin subtype, plugin type) as Moodle reads an uploaded name
    (mod/assign/feedback/file/importziplib.php, is_valid_filename_for_import:
    explode("_", name, 5))."""
    info = member.split("_", 4)
    assert len(info) == 5
    return int(info[1]), info[2], info[3]


@pytest.fixture
def venv_env():
    """The environment for subprocesses: this interpreter's bin/ first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(autouse=True)
def _no_resource_tracker():
    """A check run in this process counts any child process as the hand-in's, and
    grading on Dask earlier in the test process leaves multiprocessing's resource
    tracker running as one. Stop it (multiprocessing starts it again when needed)."""
    from multiprocessing import resource_tracker

    tracker = resource_tracker._resource_tracker
    if getattr(tracker, "_pid", None) is not None:
        # killed first: a Dask worker still exiting holds its pipe open, and the tracker
        # (which ignores SIGTERM) would wait for that end of file, and _stop with it
        os.kill(tracker._pid, signal.SIGKILL)
        tracker._stop()


class FlushCounter(io.StringIO):
    """A progress stream that notes what it held each time it was flushed."""

    def __init__(self):
        super().__init__()
        self.flushed = []

    def flush(self):
        self.flushed.append(self.getvalue())
        super().flush()


@pytest.fixture
def new_york(monkeypatch):
    """The grader's machine in New York: nothing may depend on its local zone."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def canvas_download_name(sortable_name, user_id, attachment_id, display_name, *, late=False):
    """The name Canvas gives a file in "Download Submissions", by its own rules
    (canvas-lms, lib/content_zipper.rb): sanitize_user_name joins digits between
    underscores and lower-cases the sortable name; get_filename joins it, "LATE" for a
    late submission and the user id with "_", then sanitize_file_name drops every
    non-word character (Ruby's [[:word:]]: letters, marks, digits, connectors);
    add_upload_submission appends the attachment id and the file's display name."""
    name = re.sub(r"^(\d+)$", r"\1", re.sub(r"_(\d+)_", r"\1", sortable_name)).lower()
    joined = "_".join(part for part in (name, "LATE" if late else None, str(user_id)) if part)
    word = "".join(c for c in joined if unicodedata.category(c)[0] in "LMN"
                   or unicodedata.category(c) == "Pc")
    shown = re.sub(r'[\x00/\\:*?"<>|]+', "_", display_name)
    return f"{word}_{attachment_id}_{shown}"
