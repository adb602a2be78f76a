"""Messages a student can act on, and a demo that leaves the course alone."""

import subprocess
import sys

import numpy as np

from conftest import REPO
from normref.checks.tolerances import mismatch


def test_numbers_that_print_alike_are_told_apart():
    """When yours and the answer agree to the decimals shown, the message names the
    entry that differs, at full precision."""
    message = mismatch(np.array([1.0, 2.0, 3.00001]), np.array([1.0, 2.0, 3.0]),
                       dtype="float64")
    assert "look alike" in message and "index (2,)" in message
    assert "3.00001" in message and "the answer 3" in message
    plain = mismatch(np.array([1.0, 2.5]), np.array([1.0, 2.0]), dtype="float64")
    assert "look alike" not in plain
    assert mismatch(np.array([1.0, 2.0]), np.array([1.0, 2.0]), dtype="float64") is None


def _course_state():
    watched = ["submitted", "autograded", "reports", "feedback", "gradebook.db", "release"]
    state = {}
    for name in watched:
        path = REPO / name
        if path.is_file():
            state[name] = path.stat().st_mtime_ns
        elif path.is_dir():
            state[name] = sorted((str(p.relative_to(REPO)), p.stat().st_mtime_ns)
                                 for p in path.rglob("*"))
        else:
            state[name] = None
    return state


def test_demo_grades_in_a_scratch_course_and_leaves_the_course_alone(tmp_path, venv_env):
    before = _course_state()
    demo = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "autograder", "demo", "01_the_recipe",
                           "--demo-dir", str(demo), "--workers", "2"],
                          cwd=REPO, env=venv_env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (demo / "reports" / "01_the_recipe" / "grades.csv").exists()
    assert "yours is untouched" in done.stdout
    assert _course_state() == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = subprocess.run([sys.executable, "-m", "autograder", "demo", "01_the_recipe",
                              "--demo-dir", str(tmp_path / "mine")],
                             cwd=REPO, env=venv_env, capture_output=True, text=True)
    assert refused.returncode == 2 and "left alone" in refused.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
