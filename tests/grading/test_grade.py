"""The grading pipeline end to end: every sample class and the demo through the CLI,
grades.csv for every student, hand-ins kept byte for byte and regrading skipped when
nothing changed. How a run becomes points is in test_scoring.py.
"""

import csv
import json
import shutil
import subprocess
import sys

import pytest

from autograder.cli import example_assignments
from autograder.course import EXAMPLES_DIR, Course
from autograder.term.collect import collect
from conftest import GRADING_ENGINE, REPO

# The demo's test grades this sample class (the demo exits 1 on any point that differs
# from expected.json); the CLI test below grades the others.
DEMO_ASSIGNMENT = "01_the_recipe"


@pytest.mark.parametrize("assignment",
                         [a for a in example_assignments() if a != DEMO_ASSIGNMENT])
def test_sample_class_grades_to_expected_scores_through_the_cli(assignment, venv_env):
    """Every sample student gets exactly the expected points in every cell, and the
    source's own solutions, graded first as the reference, earn every point."""
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "grade-examples", assignment,
         "--cell-timeout", "60", "--engine", GRADING_ENGINE],
        cwd=REPO, capture_output=True, text=True, env=venv_env, timeout=2400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "MISMATCH" not in done.stdout
    assert "warning: the reference solution" not in done.stderr, done.stderr[-3000:]


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
    """`make demo`: release, collect and grade a sample class in a scratch course, every
    student to the expected points of every cell (else exit 1), the source's solutions
    to every point; the course itself is untouched, and a folder that is not a demo
    course is left alone."""
    before = _course_state()
    demo = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "autograder", "demo", DEMO_ASSIGNMENT,
                           "--demo-dir", str(demo), "--workers", "2"],
                          cwd=REPO, env=venv_env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "warning: the reference solution" not in done.stderr, done.stderr[-3000:]
    assert (demo / "reports" / DEMO_ASSIGNMENT / "grades.csv").exists()
    assert "yours is untouched" in done.stdout
    assert _course_state() == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = subprocess.run([sys.executable, "-m", "autograder", "demo", DEMO_ASSIGNMENT,
                              "--demo-dir", str(tmp_path / "mine")],
                             cwd=REPO, env=venv_env, capture_output=True, text=True)
    assert refused.returncode == 2 and "left alone" in refused.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.fixture
def course(tmp_path):
    for part in ("source", "release"):
        shutil.copytree(REPO / part / "01_the_recipe", tmp_path / part / "01_the_recipe")
    return Course(tmp_path)


def _handin(name):
    return EXAMPLES_DIR / "01_the_recipe" / f"{name}.ipynb"


def test_grades_csv_lists_every_student_even_unreadable_ones(course, venv_env):
    folder = course.root / "inbox"
    folder.mkdir()
    shutil.copy(_handin("ada_perfect"), folder / "ada.ipynb")
    (folder / "broken.ipynb").write_text('{"cells": [')
    (folder / "empty.ipynb").write_text("")
    done = subprocess.run([sys.executable, "-m", "autograder", "collect", "01_the_recipe",
                           str(folder), "--course", str(course.root)],
                          capture_output=True, text=True, env=venv_env)
    assert "collected 3" in done.stdout
    done = subprocess.run([sys.executable, "-m", "autograder", "grade", "01_the_recipe",
                           "--course", str(course.root), "--engine", GRADING_ENGINE],
                          capture_output=True, text=True, env=venv_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(course.reports / "01_the_recipe" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student_id", "score", "max_score", "pending", "late",
                             "late_penalty", "final_score", "status", "reason", "flags"]
    by_student = {row["student_id"]: row for row in rows}
    assert set(by_student) == {"ada", "broken", "empty"}
    assert (by_student["ada"]["score"], by_student["ada"]["status"]) == ("10", "graded")
    for student in ("broken", "empty"):
        row = by_student[student]
        assert (row["score"], row["max_score"], row["status"]) == ("0", "10", "invalid")
        assert row["reason"].startswith("not a readable notebook")
    feedback = (course.reports / "01_the_recipe" / "feedback" / "ada.html").read_text()
    assert "layer_norm_batches: all 6 cases passed" in feedback
    gradescope = json.loads(
        (course.reports / "01_the_recipe" / "gradescope" / "ada.json").read_text())
    assert gradescope["score"] == 10
    assert {t["name"] for t in gradescope["tests"]} >= {"ln_handles_batches"}


def test_handins_are_kept_byte_for_byte_and_regrading_skips_unchanged(course):
    from autograder.grading.grade import grade_assignment, sha256
    from autograder.grading.runner import RunSettings

    inbox = course.root / "inbox"
    inbox.mkdir()
    for name in ("ada_perfect", "dee_blank", "hal_cheats"):  # full, none, flagged
        shutil.copy(_handin(name), inbox / f"{name}.ipynb")
    collect(course=course, assignment="01_the_recipe", source_path=inbox)
    before = {p: sha256(p) for p in course.submitted.rglob("*.ipynb")}
    assert len(before) == 3
    settings = RunSettings(cell_timeout=10)
    first = grade_assignment(course=course, assignment="01_the_recipe", settings=settings,
                             engine=GRADING_ENGINE)
    assert {p: sha256(p) for p in course.submitted.rglob("*.ipynb")} == before
    result = course.autograded / "ada_perfect" / "01_the_recipe" / "result.json"
    stamp = result.stat().st_mtime_ns
    second = grade_assignment(course=course, assignment="01_the_recipe", settings=settings,
                              engine=GRADING_ENGINE)
    assert result.stat().st_mtime_ns == stamp
    assert [r["score"] for r in first] == [r["score"] for r in second]


def test_grading_one_student_after_a_source_change_regrades_everyone_it_affects(course):
    """`grade --student X` after the source notebook changed grades X against the new
    tests, and everyone graded against the old ones too, saying so: no report mixes
    two versions of the tests."""
    import io

    import nbformat

    from autograder.grading.grade import grade_assignment, graded_against
    from autograder.grading.runner import RunSettings

    inbox = course.root / "inbox"
    inbox.mkdir()
    for name in ("ada_perfect", "dee_blank"):
        shutil.copy(_handin(name), inbox / f"{name}.ipynb")
    collect(course=course, assignment="01_the_recipe", source_path=inbox)
    settings = RunSettings(cell_timeout=10)
    grade_assignment(course=course, assignment="01_the_recipe", settings=settings,
                     engine=GRADING_ENGINE, scale_timeouts=False)
    source = course.source / "01_the_recipe" / "01_the_recipe.ipynb"
    notebook = nbformat.read(source, as_version=4)
    notebook.cells.append(nbformat.v4.new_markdown_cell("A note added after grading."))
    nbformat.write(notebook, source)
    printed = io.StringIO()
    again = grade_assignment(course=course, assignment="01_the_recipe", settings=settings,
                             engine=GRADING_ENGINE, scale_timeouts=False,
                             students=["ada_perfect"], progress=printed)
    now = graded_against(course=course, assignment="01_the_recipe")
    assert [(r["student_id"], r["graded_against"]) for r in again] == [
        ("ada_perfect", now), ("dee_blank", now)]
    assert "also regrading 1 other student(s)" in printed.getvalue()
    assert "dee_blank" in printed.getvalue()
