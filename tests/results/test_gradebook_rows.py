"""nbgrader's gradebook.db, filled and read back (autograder/results/gradebook.py), pinned.

Each test fails on a small bug in autograder/results/gradebook.py (`make mutation`): a tiny
assignment of two notebooks (auto-graded cells, a markdown answer, a task, a code
answer graded by hand) is recorded for a few students, regraded after the
instructor gave scores in the formgrader, and its hand scores and late penalties
read back and written.
"""

import functools
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import nbformat
import nbgrader
import nbgrader.api
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from nbformat.validator import MissingIDFieldWarning
from nbgrader.api import Grade, Gradebook, TaskCell

from autograder.course import Course
from autograder.results import gradebook as gb

ASSIGNMENT = "hw"


def _meta(gid, **flags):
    return {"nbgrader": {"schema_version": 3, "grade_id": gid, "locked": False,
                         "grade": False, "solution": False, "task": False, **flags}}


def _part1(new_cell=False):
    cells = [
        new_markdown_cell("# Part one"),
        new_code_cell("def f(x):\n    return 2 * x", metadata=_meta("p1_answer", solution=True)),
        new_code_cell("assert f(1) == 2", metadata=_meta("p1_auto", grade=True, points=2,
                                                         locked=True)),
        new_markdown_cell("Explain.", metadata=_meta("p1_essay", grade=True, solution=True,
                                                     points=3)),
        new_markdown_cell("Plot it.", metadata=_meta("p1_task", task=True, points=1,
                                                     locked=True)),
    ]
    if new_cell:
        cells.append(new_code_cell("assert f(2) == 4", metadata=_meta(
            "p1_new", grade=True, points=1, locked=True)))
    return new_notebook(cells=cells)


def _part2():
    return new_notebook(cells=[
        new_code_cell("assert g(1) == 1", metadata=_meta("p2_auto", grade=True, points=1,
                                                         locked=True)),
        new_code_cell("def g(x):\n    return x", metadata=_meta(
            "p2_code", grade=True, solution=True, points=2)),
    ])


@functools.cache
def _alembic_head():
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()


@pytest.fixture
def alembic_found(monkeypatch):
    """nbgrader runs `alembic heads` (by name, from PATH: seconds) each time it makes a
    gradebook. Answer in-process, and keep where PATH would have found alembic."""
    found = []

    def version():
        found.append(shutil.which("alembic"))
        return _alembic_head()

    monkeypatch.setattr(nbgrader.api, "get_alembic_version", version)
    return found


@pytest.fixture
def course(tmp_path, alembic_found):
    course = Course(tmp_path)
    (course.source / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(_part1(), course.source / ASSIGNMENT / "part1.ipynb")
    nbformat.write(_part2(), course.source / ASSIGNMENT / "part2.ipynb")
    return course


def _cell(gid, notebook, points):
    return {"grade_id": gid, "notebook": notebook, "points": points, "max_points": 2.0}


def _results(new_cell=False):
    ada = [_cell("p1_auto", "part1", 2.0), _cell("p2_auto", "part2", 0.0)]
    bob = [_cell("p1_auto", "part1", 0.0), _cell("p2_auto", "part2", 1.0)]
    if new_cell:
        ada.append(_cell("p1_new", "part1", 1.0))
        bob.append(_cell("p1_new", "part1", 0.0))
    return [{"student_id": "ada", "status": "graded", "flags": [], "cells": ada},
            {"student_id": "bob", "status": "graded", "flags": ["edited tests"], "cells": bob},
            {"student_id": "cy", "status": "invalid", "flags": [], "cells": []}]


def test_gradebook_url_is_the_course_root_database(tmp_path):
    """The formgrader and nbgrader export read gradebook.db at the course root."""
    assert gb.gradebook_url(Course(tmp_path)) == f"sqlite:///{tmp_path}/gradebook.db"


def test_write_gradebook_records_cells_scores_and_flags(course, monkeypatch, alembic_found):
    """Every notebook, grade cell (type and points), task and manual cell is recorded;
    each student's auto scores per notebook, 0 for a hand-in that could not run;
    manual cells wait for a person; a flagged hand-in is flagged in each notebook.
    It works with this interpreter's bin/ off PATH (alembic is found beside it)."""
    bin_dir = str(Path(sys.executable).parent)
    without = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir)
    monkeypatch.setenv("PATH", without)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    assert [str(w.message) for w in caught if "not in session" in str(w.message)] == []
    assert os.environ["PATH"] == f"{bin_dir}{os.pathsep}{without}"
    assert alembic_found == [str(Path(bin_dir) / "alembic")]
    with Gradebook(gb.gradebook_url(course)) as book:
        assignment = book.find_assignment(ASSIGNMENT)
        assert sorted(n.name for n in assignment.notebooks) == ["part1", "part2"]
        assert assignment.max_score == 9.0
        cells = {gid: book.find_graded_cell(gid, nb, ASSIGNMENT) for gid, nb in [
            ("p1_auto", "part1"), ("p1_essay", "part1"), ("p1_task", "part1"),
            ("p2_auto", "part2"), ("p2_code", "part2")]}
        assert {gid: (c.max_score, c.cell_type, isinstance(c, TaskCell))
                for gid, c in cells.items()} == {
            "p1_auto": (2.0, "code", False), "p1_essay": (3.0, "markdown", False),
            "p1_task": (1.0, "markdown", True), "p2_auto": (1.0, "code", False),
            "p2_code": (2.0, "code", False)}
        auto = {(s, gid): book.find_grade(gid, nb, ASSIGNMENT, s).auto_score
                for s in ("ada", "bob", "cy") for gid, nb in [("p1_auto", "part1"),
                                                              ("p2_auto", "part2")]}
        assert auto == {("ada", "p1_auto"): 2.0, ("ada", "p2_auto"): 0.0,
                        ("bob", "p1_auto"): 0.0, ("bob", "p2_auto"): 1.0,
                        ("cy", "p1_auto"): 0.0, ("cy", "p2_auto"): 0.0}
        waiting = {gid: book.find_grade(gid, nb, ASSIGNMENT, "ada").needs_manual_grade
                   for gid, nb in [("p1_auto", "part1"), ("p1_essay", "part1"),
                                   ("p1_task", "part1"), ("p2_auto", "part2"),
                                   ("p2_code", "part2")]}
        assert waiting == {"p1_auto": False, "p1_essay": True, "p1_task": True,
                           "p2_auto": False, "p2_code": True}
        flagged = {(s, nb): book.find_submission_notebook(nb, ASSIGNMENT, s).flagged
                   for s in ("ada", "bob", "cy") for nb in ("part1", "part2")}
        assert flagged == {("ada", "part1"): False, ("ada", "part2"): False,
                           ("bob", "part1"): True, ("bob", "part2"): True,
                           ("cy", "part1"): False, ("cy", "part2"): False}


def test_write_gradebook_leaves_a_path_with_its_bin_dir_and_keeps_the_default_one(
        course, monkeypatch, alembic_found):
    """This interpreter's bin/ already on PATH (even last): it comes first, once, and
    PATH does not grow at each call. No PATH at all: bin/, then the directories a
    program is looked for in without PATH (os.defpath), not the current directory."""
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(["/nowhere", bin_dir]))
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    assert os.environ["PATH"] == os.pathsep.join([bin_dir, "/nowhere"])
    monkeypatch.delenv("PATH")
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    assert os.environ["PATH"] == f"{bin_dir}{os.pathsep}{os.defpath}"
    assert alembic_found == [str(Path(bin_dir) / "alembic")]


def test_write_gradebook_hides_only_the_not_in_session_warnings(tmp_path, alembic_found):
    """Other warnings still reach the instructor, e.g. nbformat's about a source
    notebook whose cells have no id."""
    course = Course(tmp_path)
    (course.source / ASSIGNMENT).mkdir(parents=True)
    source = _part1()
    for cell in source.cells:
        del cell["id"]
    (course.source / ASSIGNMENT / "part1.ipynb").write_text(json.dumps(source))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    assert {w.category for w in caught} == {MissingIDFieldWarning}
def test_one_notebook_results_without_notebook_names_score_their_notebook(tmp_path,
                                                                          alembic_found):
    """Results of a one-notebook grader name no notebook: their cells still score."""
    course = Course(tmp_path)
    (course.source / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(_part1(), course.source / ASSIGNMENT / "part1.ipynb")
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=[{
        "student_id": "ada", "status": "graded", "flags": [],
        "cells": [{"grade_id": "p1_auto", "points": 2.0, "max_points": 2.0}]}])
    with Gradebook(gb.gradebook_url(course)) as book:
        assert book.find_grade("p1_auto", "part1", ASSIGNMENT, "ada").auto_score == 2.0


def test_regrading_keeps_hand_scores_adds_new_cells_and_reads_hand_scores(course):
    """After the instructor graded in the formgrader, a regrade keeps every hand
    score, scores a cell added to the source since, makes no second grade of a task,
    and stops asking for a hand grade that was given. scores_by_hand returns the hand
    scores of the assignment's current notebooks only."""
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results())
    with Gradebook(gb.gradebook_url(course)) as book:
        book.find_grade("p1_essay", "part1", ASSIGNMENT, "ada").manual_score = 2.5
        book.find_grade("p1_task", "part1", ASSIGNMENT, "ada").manual_score = 1.0
        book.find_grade("p1_auto", "part1", ASSIGNMENT, "bob").manual_score = 1.0
        book.find_grade("p2_code", "part2", ASSIGNMENT, "bob").manual_score = 1.5
        book.db.commit()
    nbformat.write(_part1(new_cell=True), course.source / ASSIGNMENT / "part1.ipynb")
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results(new_cell=True))
    with Gradebook(gb.gradebook_url(course)) as book:
        new = {s: book.find_grade("p1_new", "part1", ASSIGNMENT, s).auto_score
               for s in ("ada", "bob", "cy")}
        assert new == {"ada": 1.0, "bob": 0.0, "cy": 0.0}
        task = book.find_graded_cell("p1_task", "part1", ASSIGNMENT)
        assert book.db.query(Grade).filter(Grade.cell_id == task.id).count() == 3
        essay = {s: book.find_grade("p1_essay", "part1", ASSIGNMENT, s) for s in ("ada", "bob")}
        assert essay["ada"].manual_score == 2.5 and not essay["ada"].needs_manual_grade
        assert essay["bob"].manual_score is None and essay["bob"].needs_manual_grade
        assert book.find_grade("p1_auto", "part1", ASSIGNMENT, "bob").manual_score == 1.0
    assert gb.scores_by_hand(course=course, assignment=ASSIGNMENT) == {
        "ada": {("part1", "p1_essay"): 2.5, ("part1", "p1_task"): 1.0},
        "bob": {("part1", "p1_auto"): 1.0, ("part2", "p2_code"): 1.5}}
    (course.source / ASSIGNMENT / "part1.ipynb").unlink()
    assert gb.scores_by_hand(course=course, assignment=ASSIGNMENT) == {
        "bob": {("part2", "p2_code"): 1.5}}
    (course.source / "other").mkdir()
    nbformat.write(_part2(), course.source / "other" / "other.ipynb")
    assert gb.scores_by_hand(course=course, assignment="other") == {}


def test_record_lateness_writes_time_and_penalty_on_the_first_notebook(course):
    """The submission time and the penalty in points (score - final score) go on the
    first notebook, so nbgrader export shows grades.csv's final score; a student not
    in the gradebook is skipped."""
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=_results()[:2])
    gb.record_lateness(course=course, assignment=ASSIGNMENT, results=[
        {"student_id": "zed", "score": 1.0, "final_score": 0.5,
         "lateness": {"submitted_at": "2026-10-05T10:00:00+00:00"}},
        {"student_id": "ada", "score": 1.0, "final_score": 0.12345678,
         "lateness": {"submitted_at": "2026-10-02T23:59:30+00:00"}},
        {"student_id": "bob", "score": 1.0, "lateness": None}])
    with Gradebook(gb.gradebook_url(course)) as book:
        ada = book.find_submission(ASSIGNMENT, "ada")
        assert str(ada.timestamp) == "2026-10-02 23:59:30"
        penalties = {(s, nb): book.find_submission_notebook(nb, ASSIGNMENT, s)
                     .late_submission_penalty for s in ("ada", "bob")
                     for nb in ("part1", "part2")}
        assert penalties == {("ada", "part1"): 0.876543,
                             ("ada", "part2"): None, ("bob", "part1"): 0.0,
                             ("bob", "part2"): None}
        assert book.find_submission(ASSIGNMENT, "bob").timestamp is None


def test_with_scores_by_hand_gives_one_total():
    """Hand scores replace auto ones (marked by_hand), fill manual cells (graded),
    leave the others pending (None, listed), and the score adds them up; cells that
    name no notebook are the default notebook's."""
    results = [
        {"student_id": "ada", "score": 3.0, "status": "graded",
         "cells": [{"grade_id": "auto", "points": 1.0},
                   {"grade_id": "auto2", "notebook": "part2", "points": 2.0}],
         "manual": [{"grade_id": "essay", "points": None, "status": "pending"},
                    {"grade_id": "task", "notebook": "part2", "points": None,
                     "status": "pending"}]},
        {"student_id": "bob", "score": 0.0, "status": "invalid"},
    ]
    by_hand = {"ada": {("part1", "auto"): 0.5, ("part1", "essay"): 2.5,
                       ("part1", "auto2"): 9.0}}
    merged = gb.with_scores_by_hand(results, by_hand, default_notebook="part1")
    assert merged[0]["cells"] == [
        {"grade_id": "auto", "points": 0.5, "by_hand": True},
        {"grade_id": "auto2", "notebook": "part2", "points": 2.0}]
    assert merged[0]["manual"] == [
        {"grade_id": "essay", "points": 2.5, "status": "graded"},
        {"grade_id": "task", "notebook": "part2", "points": None, "status": "pending"}]
    assert merged[0]["score"] == 5.0 and merged[0]["pending"] == ["task"]
    assert merged[0]["status"] == "graded"
    assert merged[1] == {"student_id": "bob", "score": 0, "status": "invalid", "cells": [],
                         "manual": [], "pending": []}
    assert results[0]["cells"][0]["points"] == 1.0
    assert gb.with_scores_by_hand(results, by_hand)[0]["score"] == 2.0 + 1.0


def test_with_scores_by_hand_keeps_a_student_nobody_graded_by_hand():
    """A student the formgrader has no hand score for keeps the auto scores; the manual
    cells stay pending."""
    result = {"student_id": "cy", "score": 2.0,
              "cells": [{"grade_id": "auto", "points": 2.0}],
              "manual": [{"grade_id": "essay", "points": None, "status": "pending"}]}
    merged = gb.with_scores_by_hand([result], {"ada": {("part1", "essay"): 3.0}},
                                    default_notebook="part1")
    assert merged == [{**result, "cells": [{"grade_id": "auto", "points": 2.0}],
                       "manual": [{"grade_id": "essay", "points": None, "status": "pending"}],
                       "score": 2.0, "pending": ["essay"]}]


def test_a_grade_id_in_two_notebooks_scores_each_notebook_its_own_cell(tmp_path, alembic_found):
    """nbgrader asks grade ids to be unique within a notebook only: two notebooks may both
    have "check"; each notebook's cell gets the points of the cell that names it. A result
    without cells (a hand-in that could not be run) scores 0 in each."""
    course = Course(tmp_path)
    (course.source / ASSIGNMENT).mkdir(parents=True)
    for name in ("part1", "part2"):
        nbformat.write(new_notebook(cells=[new_code_cell("assert True", metadata=_meta(
            "check", grade=True, points=2, locked=True))]),
            course.source / ASSIGNMENT / f"{name}.ipynb")
    gb.write_gradebook(course=course, assignment=ASSIGNMENT, results=[
        {"student_id": "ada", "flags": [], "cells": [_cell("check", "part1", 2.0),
                                                    _cell("check", "part2", 0.5)]},
        {"student_id": "bob", "flags": []}])
    with Gradebook(gb.gradebook_url(course)) as book:
        assert {(s, nb): book.find_grade("check", nb, ASSIGNMENT, s).auto_score
                for s in ("ada", "bob") for nb in ("part1", "part2")} == {
            ("ada", "part1"): 2.0, ("ada", "part2"): 0.5,
            ("bob", "part1"): 0.0, ("bob", "part2"): 0.0}
