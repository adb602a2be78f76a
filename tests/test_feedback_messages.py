"""Messages a student can act on, and a demo that leaves the course alone."""

import subprocess
import sys

import nbformat
import numpy as np
from nbformat.v4 import new_code_cell, new_notebook, new_output

from autograder.report import _inert_notebook
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


def test_the_page_quietens_ungraded_errors_and_shows_nothing_after_a_hidden_test():
    """An ungraded cell's error is one grey line; from the first hidden test on, no
    output is shown (a hand-in's code can print the hidden tests); graded cells keep
    their source, with the hidden part folded away."""
    error = new_output("error", ename="NotImplementedError", evalue="", traceback=["tb"])
    graded = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1}}
    nb = new_notebook(cells=[
        new_code_cell("raise NotImplementedError()", outputs=[error]),
        new_code_cell("assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(2) == 4\n"
                      "### END HIDDEN TESTS", metadata=graded,
                      outputs=[new_output("stream", name="stdout", text="ok\n")]),
        new_code_cell("print(In)", outputs=[new_output("stream", name="stdout",
                                                       text="assert f(2) == 4\n")]),
    ])
    shown = _inert_notebook(nbformat.from_dict(nb))
    first, test, after = shown.cells
    assert [o.output_type for o in first.outputs] == ["stream"]
    assert first.outputs[0].text.startswith("(not graded) this cell stopped with "
                                            "NotImplementedError")
    assert "f(2)" not in test.source and "assert f(1) == 2" in test.source
    for cell in (test, after):
        assert "f(2)" not in str(cell.outputs) and "not shown" in cell.outputs[0].text
    everything = _inert_notebook(nbformat.from_dict(nb), show_hidden_tests=True)
    assert "f(2) == 4" in everything.cells[1].source
    assert everything.cells[2].outputs[0].text == "assert f(2) == 4\n"
