"""Results reach nbgrader's gradebook, where the formgrader reads them."""

import shutil

import pytest
from nbgrader.api import Gradebook

from autograder.course import Course
from autograder.results.gradebook import gradebook_url, write_gradebook
from conftest import REPO

ASSIGNMENT = "01_the_recipe"
NOTEBOOK = "01_the_recipe"
MAX_POINTS = {"token_mean_correct": 1, "token_var_correct": 1, "ln_single_token": 2,
              "ln_handles_batches": 2, "predictions_correct": 2}


@pytest.fixture
def course(tmp_path):
    for part in ("source", "release"):
        shutil.copytree(REPO / part / ASSIGNMENT, tmp_path / part / ASSIGNMENT)
    return Course(tmp_path)


def _result(student, *, earned=None, flags=(), status="graded"):
    earned = earned or {}
    cells = [{"grade_id": gid, "points": float(earned.get(gid, 0)), "max_points": float(top)}
             for gid, top in MAX_POINTS.items()] if status == "graded" else []
    return {"student_id": student, "assignment": ASSIGNMENT, "status": status,
            "score": float(sum(earned.values())), "max_score": 8.0, "flags": list(flags),
            "cells": cells}


def _auto_scores(gradebook, student):
    return {gid: gradebook.find_grade(gid, NOTEBOOK, ASSIGNMENT, student).auto_score
            for gid in MAX_POINTS}


def test_every_student_and_cell_score_is_recorded(course):
    results = [_result("ada", earned=MAX_POINTS),
               _result("hal", earned={"predictions_correct": 2}, flags=["looks odd"]),
               _result("broken", status="invalid")]
    write_gradebook(course=course, assignment=ASSIGNMENT, results=results)
    with Gradebook(gradebook_url(course)) as gradebook:
        submissions = {s.student.id: s for s in
                       gradebook.find_assignment(ASSIGNMENT).submissions}
        assert {s: sub.score for s, sub in submissions.items()} == \
            {"ada": 8.0, "hal": 2.0, "broken": 0.0}
        assert gradebook.find_assignment(ASSIGNMENT).max_score == 8.0
        assert _auto_scores(gradebook, "ada") == {k: float(v) for k, v in MAX_POINTS.items()}
        flagged = {s: gradebook.find_submission_notebook(NOTEBOOK, ASSIGNMENT, s).flagged
                   for s in submissions}
        assert flagged == {"ada": False, "hal": True, "broken": False}


def test_regrading_updates_auto_scores_and_keeps_manual_ones(course):
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("cy", earned={"token_mean_correct": 1})])
    with Gradebook(gradebook_url(course)) as gradebook:
        grade = gradebook.find_grade("predictions_correct", NOTEBOOK, ASSIGNMENT, "cy")
        grade.manual_score = 1.5  # the instructor overrode one cell in the formgrader
        gradebook.db.commit()
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("cy", earned={"token_mean_correct": 1,
                                                   "token_var_correct": 1})])
    with Gradebook(gradebook_url(course)) as gradebook:
        assert _auto_scores(gradebook, "cy")["token_var_correct"] == 1.0
        grade = gradebook.find_grade("predictions_correct", NOTEBOOK, ASSIGNMENT, "cy")
        assert grade.manual_score == 1.5
        assert len(gradebook.find_assignment(ASSIGNMENT).submissions) == 1
