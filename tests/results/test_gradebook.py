"""Results reach nbgrader's gradebook, where the formgrader reads them."""

import shutil
import subprocess
import sys

import nbformat
import pytest
from nbgrader.api import Gradebook

from autograder.course import Course
from autograder.results.gradebook import gradebook_url, write_gradebook
from conftest import REPO

ASSIGNMENT = "01_the_recipe"
NOTEBOOK = "01_the_recipe"
MAX_POINTS = {"token_mean_correct": 1, "token_var_correct": 1, "ln_single_token": 2,
              "ln_handles_batches": 2, "eps_correct": 2}


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
               _result("hal", earned={"eps_correct": 2}, flags=["looks odd"]),
               _result("broken", status="invalid")]
    write_gradebook(course=course, assignment=ASSIGNMENT, results=results)
    with Gradebook(gradebook_url(course)) as gradebook:
        submissions = {s.student.id: s for s in
                       gradebook.find_assignment(ASSIGNMENT).submissions}
        assert {s: sub.score for s, sub in submissions.items()} == \
            {"ada": 8.0, "hal": 2.0, "broken": 0.0}
        assert gradebook.find_assignment(ASSIGNMENT).max_score == 10.0
        assert _auto_scores(gradebook, "ada") == {k: float(v) for k, v in MAX_POINTS.items()}
        flagged = {s: gradebook.find_submission_notebook(NOTEBOOK, ASSIGNMENT, s).flagged
                   for s in submissions}
        assert flagged == {"ada": False, "hal": True, "broken": False}


def test_regrading_updates_auto_scores_and_keeps_manual_ones(course):
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("cy", earned={"token_mean_correct": 1})])
    with Gradebook(gradebook_url(course)) as gradebook:
        grade = gradebook.find_grade("eps_correct", NOTEBOOK, ASSIGNMENT, "cy")
        grade.manual_score = 1.5  # the instructor overrode one cell in the formgrader
        gradebook.db.commit()
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("cy", earned={"token_mean_correct": 1,
                                                   "token_var_correct": 1})])
    with Gradebook(gradebook_url(course)) as gradebook:
        assert _auto_scores(gradebook, "cy")["token_var_correct"] == 1.0
        grade = gradebook.find_grade("eps_correct", NOTEBOOK, ASSIGNMENT, "cy")
        assert grade.manual_score == 1.5
        assert len(gradebook.find_assignment(ASSIGNMENT).submissions) == 1


def test_comments_typed_in_the_formgrader_survive_a_regrade_and_reach_nbgraders_feedback(
        course, venv_env):
    """Every answer cell of a graded hand-in has a comment row, as nbgrader's autograde
    leaves it: the formgrader's comment box saves into it, a regrade keeps it, and
    `nbgrader generate_feedback` (the formgrader's Generate Feedback) finds it."""
    from autograder.course import EXAMPLES_DIR

    graded = course.autograded / "ada" / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    graded.parent.mkdir(parents=True)
    shutil.copyfile(EXAMPLES_DIR / ASSIGNMENT / "ada_perfect.ipynb", graded)
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("ada", earned=MAX_POINTS)])
    answers = [c.metadata["nbgrader"]["grade_id"]
               for c in nbformat.read(graded, as_version=4).cells
               if c.metadata.get("nbgrader", {}).get("solution")]
    assert "token_var_answer" in answers
    with Gradebook(gradebook_url(course)) as gradebook:
        for gid in answers:
            assert gradebook.find_comment(gid, NOTEBOOK, ASSIGNMENT, "ada").comment is None
        # what the formgrader's comment box does (its api/comment handler)
        comment = gradebook.find_comment("token_var_answer", NOTEBOOK, ASSIGNMENT, "ada")
        comment.manual_comment = "Neat: the centred two-pass sum, as in the lesson."
        gradebook.db.commit()
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("ada", earned=MAX_POINTS)])
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_feedback", ASSIGNMENT, "--student", "ada",
         f"--CourseDirectory.root={course.root}"],
        cwd=course.root, env=venv_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    page = (course.root / "feedback" / "ada" / ASSIGNMENT / f"{NOTEBOOK}.html").read_text()
    assert "Neat: the centred two-pass sum, as in the lesson." in page


def _with_manual_cell(course):
    """Unit 01's source with an answer a person grades: a markdown cell worth 2."""
    path = course.source / ASSIGNMENT / f"{NOTEBOOK}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_markdown_cell("Explain the shortcut's failure.")
    cell.metadata["nbgrader"] = {"grade": True, "solution": True, "grade_id": "explain",
                                 "points": 2, "schema_version": 3, "locked": False}
    nb.cells.append(cell)
    nbformat.write(nb, path)


def _versioned(student, *, answer, handin):
    result = _result(student, earned=MAX_POINTS)
    result["handin_sha256"] = handin
    result["manual"] = [{"grade_id": "explain", "notebook": NOTEBOOK, "max_points": 2.0,
                         "points": None, "status": "pending", "answer_sha256": answer}]
    return result


def test_a_changed_answer_reopens_its_hand_grading_and_an_unchanged_one_keeps_it(course):
    """A resubmission that rewrote a hand-graded answer is graded by hand again (its
    score was for the old answer), and so is a score overridden on an autograded cell
    when the hand-in changed; a regrade of the same answers keeps every hand score."""
    _with_manual_cell(course)
    first = [_versioned("ada", answer="a1", handin="h1"),
             _versioned("bo", answer="b1", handin="g1")]
    assert write_gradebook(course=course, assignment=ASSIGNMENT, results=first) == {}
    with Gradebook(gradebook_url(course)) as gradebook:
        for student in ("ada", "bo"):
            gradebook.find_grade("explain", NOTEBOOK, ASSIGNMENT, student).manual_score = 2.0
            gradebook.find_grade("token_var_correct", NOTEBOOK, ASSIGNMENT,
                                 student).manual_score = 0.5
        gradebook.db.commit()
    assert write_gradebook(course=course, assignment=ASSIGNMENT, results=first) == {}
    again = [_versioned("ada", answer="a2", handin="h2"),
             _versioned("bo", answer="b1", handin="g1")]
    assert write_gradebook(course=course, assignment=ASSIGNMENT, results=again) == {
        "ada": [(NOTEBOOK, "token_var_correct"), (NOTEBOOK, "explain")]}
    with Gradebook(gradebook_url(course)) as gradebook:
        explain = gradebook.find_grade("explain", NOTEBOOK, ASSIGNMENT, "ada")
        assert explain.manual_score is None and explain.needs_manual_grade
        assert gradebook.find_grade("token_var_correct", NOTEBOOK, ASSIGNMENT,
                                    "ada").manual_score is None
        assert gradebook.find_grade("explain", NOTEBOOK, ASSIGNMENT, "bo").manual_score == 2.0
        assert gradebook.find_grade("token_var_correct", NOTEBOOK, ASSIGNMENT,
                                    "bo").manual_score == 0.5


def test_the_formgrader_shows_the_rosters_names_not_none(course):
    """With a roster, each student in the gradebook has the roster's first and last
    name, e-mail and LMS id (the formgrader listed "None, None")."""
    import json

    (course.root / "roster.json").write_text(json.dumps({"source": "canvas", "students": [
        {"id": "4713", "name": "Müller, Jürgen", "lms_id": "4713", "email": "jm@uni.example"},
        {"id": "ada", "name": "Ada King Lovelace", "lms_id": None, "email": ""}]}))
    write_gradebook(course=course, assignment=ASSIGNMENT,
                    results=[_result("4713"), _result("ada"), _result("nobody")])
    with Gradebook(gradebook_url(course)) as gradebook:
        jm = gradebook.find_student("4713")
        assert (jm.first_name, jm.last_name, jm.email, jm.lms_user_id) == (
            "Jürgen", "Müller", "jm@uni.example", "4713")
        ada = gradebook.find_student("ada")
        assert (ada.first_name, ada.last_name, ada.email) == ("Ada King", "Lovelace", None)
        assert gradebook.find_student("nobody").first_name is None


def test_an_answer_left_blank_scores_0_with_nothing_to_grade_as_in_nbgrader(course):
    """A hand-graded answer left as released: 0 points, not waiting for anyone, and
    nbgrader's "No response." comment; a person may still give it a score."""
    from autograder.results.gradebook import scores_by_hand, with_scores_by_hand

    _with_manual_cell(course)
    blank = _versioned("ada", answer="a1", handin="h1")
    blank["manual"][0]["blank"] = True
    written = _versioned("bo", answer="b1", handin="g1")
    write_gradebook(course=course, assignment=ASSIGNMENT, results=[blank, written])
    with Gradebook(gradebook_url(course)) as gradebook:
        ada = gradebook.find_grade("explain", NOTEBOOK, ASSIGNMENT, "ada")
        assert (ada.auto_score, ada.needs_manual_grade) == (0.0, False)
        assert gradebook.find_comment("explain", NOTEBOOK, ASSIGNMENT,
                                      "ada").auto_comment == "No response."
        bo = gradebook.find_grade("explain", NOTEBOOK, ASSIGNMENT, "bo")
        assert (bo.auto_score, bo.needs_manual_grade) == (None, True)
    merged = {r["student_id"]: r for r in with_scores_by_hand(
        [blank, written], scores_by_hand(course=course, assignment=ASSIGNMENT))}
    assert merged["ada"]["pending"] == [] and merged["ada"]["manual"][0]["points"] == 0.0
    assert merged["ada"]["manual"][0]["status"] == "blank"
    assert merged["bo"]["pending"] == ["explain"]


@pytest.fixture(scope="module")
def browser():
    import labbrowser

    yield from labbrowser.chromium_session()


def test_a_comment_and_score_typed_in_the_formgrader_survive_a_regrade_into_every_export(
        course, browser, tmp_path_factory, venv_env):
    """An instructor opens a graded hand-in in nbgrader's formgrader (served by
    JupyterLab, in Chromium), types a comment on an answer and overrides a test cell's
    score; a regrade keeps both, nbgrader's Generate Feedback shows both, and our
    grades.csv and feedback page count the overridden score (one total everywhere)."""
    import csv

    import labbrowser
    from autograder import cli
    from autograder.course import EXAMPLES_DIR
    from conftest import GRADING_ENGINE

    shutil.copyfile(REPO / "nbgrader_config.py", course.root / "nbgrader_config.py")
    inbox = course.root / "inbox"
    inbox.mkdir()
    shutil.copyfile(EXAMPLES_DIR / ASSIGNMENT / "ada_perfect.ipynb", inbox / "ada.ipynb")
    assert cli.main(["collect", ASSIGNMENT, str(inbox), "--course", str(course.root)]) == 0
    grade = ["grade", ASSIGNMENT, "--course", str(course.root), "--engine", GRADING_ENGINE]
    assert cli.main(grade) == 0
    with Gradebook(gradebook_url(course)) as gradebook:
        submission = gradebook.find_submission_notebook(NOTEBOOK, ASSIGNMENT, "ada").id

    comment = "Neat: the centred two-pass sum, as in the lesson."
    lab = labbrowser.JupyterLab(course.root, tmp_path_factory.mktemp("lab")).start()
    try:
        # the token on every request, the page's own API calls included
        page = browser.new_page(extra_http_headers={"Authorization": f"token {lab.token}"})
        page.goto(lab.url(f"formgrader/submissions/{submission}/?index=0"))
        # the page fetches grades and comments separately and binds a view to each box
        # when its fetch returns; a comment typed before its view is bound is overwritten
        # by the stored (empty) one, so wait for both, as the page's own flags say
        page.wait_for_function("() => window.formgrader?.grades?.loaded"
                               " && window.formgrader?.comments?.loaded", timeout=60_000)
        page.fill("#token_var_answer-comment", comment)
        page.press("#token_var_answer-comment", "Tab")  # the change event saves it
        page.fill("#chunked_var_merges", "1")  # of 1.5
        page.press("#chunked_var_merges", "Tab")
        saved = None
        for _ in range(120):  # the page saves through the formgrader's API, in the background
            with Gradebook(gradebook_url(course)) as gradebook:
                saved = (gradebook.find_comment("token_var_answer", NOTEBOOK, ASSIGNMENT,
                                                "ada").manual_comment,
                         gradebook.find_grade("chunked_var_merges", NOTEBOOK, ASSIGNMENT,
                                              "ada").manual_score)
            if saved == (comment, 1.0):
                break
            page.wait_for_timeout(500)
        page.close()
    finally:
        lab.stop()
    assert saved == (comment, 1.0), lab.log_tail()

    assert cli.main([*grade, "--force"]) == 0  # the regrade
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_feedback", ASSIGNMENT, "--force"],
        cwd=course.root, env=venv_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    nbgrader_page = (course.root / "feedback" / "ada" / ASSIGNMENT /
                     f"{NOTEBOOK}.html").read_text()
    assert comment in nbgrader_page and f"{ASSIGNMENT} (Score: 9.5 / 10.0)" in nbgrader_page
    with open(course.reports / ASSIGNMENT / "grades.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    assert (row["score"], row["final_score"]) == ("9.5", "9.5")
    assert "9.5 / 10" in (course.reports / ASSIGNMENT / "feedback" / "ada.html").read_text()
