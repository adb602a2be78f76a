"""An instructor's own exercises, graded in a small course of their own: plain nbgrader
asserts score the way nbgrader scores them and never flag anyone; a free-text answer is
pending until graded by hand, and then one total holds in every export; a change to the
source notebook regrades; one student can be graded alone; a wrong notebook says so."""

import csv
import json
import shutil
import subprocess
import sys

import nbformat
import pytest
from bs4 import BeautifulSoup
from nbgrader.api import Gradebook

from autograder.authoring.release import release
from autograder.grading.grade import IN_KERNEL, RESULT_FILE, grade_assignment
from autograder.grading.runner import RunSettings
from autograder.results.gradebook import gradebook_url
from autograder.results.report import write_reports
from autograder.term.collect import collect
from conftest import GRADING_ENGINE, REPO
from minicourse import ASSIGNMENT, handin, make_course, write_source


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = make_course(tmp_path_factory.mktemp("instructor"), REPO)
    # another assignment of the course, whose notebook a student hands in by mistake
    shutil.copytree(REPO / "source" / "02_rows_versus_columns",
                    course.source / "02_rows_versus_columns")
    return course


def _grade(course, **kwargs):
    return {r["student_id"]: r for r in grade_assignment(
        course=course, assignment=ASSIGNMENT, settings=RunSettings(cell_timeout=60),
        workers=2, engine=GRADING_ENGINE, **kwargs)}


@pytest.fixture(scope="module")
def graded(course, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "release.log"
    with open(log, "w") as stream:
        release(course=course, assignments=[ASSIGNMENT], log=stream)
    handins = tmp_path_factory.mktemp("handins")
    nbformat.write(handin(course, "return x + x"), handins / "ada.ipynb")
    nbformat.write(handin(course, "return x + 2"), handins / "cy.ipynb")
    nbformat.write(handin(course, "return 2 *"), handins / "eve.ipynb")
    other = nbformat.read(REPO / "release" / "02_rows_versus_columns" /
                          "02_rows_versus_columns.ipynb", as_version=4)
    nbformat.write(other, handins / "wrong.ipynb")
    collect(course=course, assignment=ASSIGNMENT, source_path=handins)
    return {"release_log": log.read_text(), "results": _grade(course)}


def test_release_warns_once_that_plain_asserts_can_be_forged(graded):
    warnings = [ln for ln in graded["release_log"].splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "double_works" in warnings[0]
    assert "docs/adding_an_exercise.md" in warnings[0]
    assert (REPO / "docs" / "adding_an_exercise.md").exists()


def test_plain_asserts_score_as_nbgrader_scores_them_and_flag_no_one(graded):
    ada, cy = graded["results"]["ada"], graded["results"]["cy"]
    assert [(c["grade_id"], c["points"], c["checked"]) for c in ada["cells"]] == \
        [("double_works", 2.0, IN_KERNEL)]
    assert ada["flags"] == [] and ada["status"] == "graded"
    assert cy["cells"][0]["points"] == 0.0 and "AssertionError" in cy["cells"][0]["reason"]
    assert cy["flags"] == []


def test_a_syntax_error_is_reported_as_one(graded):
    reason = graded["results"]["eve"]["cells"][0]["reason"]
    assert "double_answer has a SyntaxError" in reason and "NameError" in reason


def test_feedback_page_hides_hidden_tests_and_renders_maths(
        course, graded):
    folder, _ = write_reports(course=course, assignment=ASSIGNMENT,
                              results=list(graded["results"].values()))
    page = (folder / "feedback" / "ada.html").read_text()
    text = BeautifulSoup(page, "html.parser").get_text()
    assert "assert double(3) == 6" in text and "double(10)" not in text
    assert "hidden tests: the grader ran them" in text
    assert "<math" in page and "$y = 2x$" not in text
    assert "are not shown: they could show the hidden tests" in text  # the scratch cell's
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in page, "no error drawn"
    folder, _ = write_reports(course=course, assignment=ASSIGNMENT,
                              results=list(graded["results"].values()), show_hidden_tests=True)
    text = BeautifulSoup((folder / "feedback" / "ada.html").read_text(), "html.parser").get_text()
    assert "double(10)" in text


def test_free_text_answer_is_pending_until_graded_by_hand(graded):
    ada = graded["results"]["ada"]
    assert ada["max_score"] == 3.0 and ada["score"] == 2.0
    assert [{k: v for k, v in m.items() if k != "answer_sha256"} for m in ada["manual"]] == [
        {"grade_id": "why_answer", "notebook": ASSIGNMENT, "max_points": 1.0, "points": None,
         "status": "pending", "blank": False}]
    assert len(ada["manual"][0]["answer_sha256"]) == 64


def test_a_wrong_notebook_gets_a_status_and_a_reason(graded):
    wrong = graded["results"]["wrong"]
    assert wrong["status"] == "wrong-notebook"
    assert "02_rows_versus_columns" in wrong["reason"]


def _csv_rows(path):
    with open(path, newline="") as f:
        return {row["student_id"]: row for row in csv.DictReader(f)}


def test_one_total_everywhere_once_graded_by_hand(course, graded):
    results = list(graded["results"].values())
    folder, _ = write_reports(course=course, assignment=ASSIGNMENT, results=results)
    row = _csv_rows(folder / "grades.csv")["ada"]
    assert (row["score"], row["max_score"], row["pending"]) == ("2", "3", "why_answer")
    with Gradebook(gradebook_url(course)) as gradebook:
        grade = gradebook.find_grade("why_answer", ASSIGNMENT, ASSIGNMENT, "ada")
        grade.manual_score = 1.0
        gradebook.db.commit()
    folder, merged = write_reports(course=course, assignment=ASSIGNMENT, results=results)
    row = _csv_rows(folder / "grades.csv")["ada"]
    assert (row["score"], row["max_score"], row["pending"]) == ("3", "3", "")
    assert json.loads((folder / "gradescope" / "ada.json").read_text())["score"] == 3.0
    exported = course.root / "nbgrader-export.csv"
    subprocess.run([sys.executable, "-m", "nbgrader", "export",
                    f"--CourseDirectory.root={course.root}",
                    f"--CourseDirectory.db_url={gradebook_url(course)}",
                    f"--CsvExportPlugin.to={exported}"],
                   cwd=course.root, check=True, capture_output=True)
    with open(exported, newline="") as f:
        theirs = {r["student_id"]: r for r in csv.DictReader(f)}
    assert float(theirs["ada"]["score"]) == 3.0 == float(row["score"])
    assert float(theirs["ada"]["max_score"]) == float(row["max_score"])


def test_a_changed_source_regrades_and_one_student_can_be_graded_alone(course, graded):
    def written(student):
        return (course.autograded / student / ASSIGNMENT / RESULT_FILE).stat().st_mtime_ns

    before = {s: written(s) for s in ("ada", "cy")}
    _grade(course)  # nothing changed: nobody is graded again
    assert {s: written(s) for s in ("ada", "cy")} == before
    write_source(course, hidden_test="assert double(-1) == -2")
    with open(course.root / "release.log", "w") as log:
        release(course=course, assignments=[ASSIGNMENT], log=log)
    regraded = _grade(course)
    assert {s: written(s) for s in ("ada", "cy")} != before
    assert regraded["ada"]["graded_against"] != graded["results"]["ada"]["graded_against"]
    assert regraded["ada"]["score"] == 2.0
    before = {s: written(s) for s in ("ada", "cy")}
    alone = _grade(course, students=["cy"])
    assert written("ada") == before["ada"] and written("cy") != before["cy"]
    assert alone["cy"]["cells"][0]["points"] == 0.0
    with pytest.raises(ValueError, match="nobody"):
        _grade(course, students=["nobody"])


def test_class_summary_lateness_and_lms_exports(course, graded, tmp_path):
    """With a roster and a due date long past: the late policy is applied in every
    export, the class summary counts the exercise's passes and its common failure,
    and Moodle's import file carries each student's e-mail and final score."""
    from autograder.term.roster import import_roster

    roster_csv = tmp_path / "class.csv"
    roster_csv.write_text("name,id,email\nAda Lovelace,ada,ada@uni.example\n"
                          "Cy Young,cy,cy@uni.example\nEve Moss,eve,eve@uni.example\n"
                          "Wren Ong,wrong,wren@uni.example\n")
    import_roster(course=course, csv_path=roster_csv)
    (course.root / "deadlines.json").write_text(json.dumps({
        # the hand-ins came from a folder: their files' times are the only evidence
        "policy": {"percent_per_day": 10, "max_percent": 50, "trust_zip_and_file_dates": True},
        "assignments": {ASSIGNMENT: {"due": "2001-01-01 00:00"}}}))
    try:
        folder, results = write_reports(course=course, assignment=ASSIGNMENT,
                                        results=list(graded["results"].values()))
    finally:
        (course.root / "deadlines.json").unlink()
        (course.root / "roster.json").unlink()
    ada = next(r for r in results if r["student_id"] == "ada")
    assert ada["lateness"]["penalty_fraction"] == 0.5
    assert ada["final_score"] == ada["score"] * 0.5 > 0
    row = _csv_rows(folder / "grades.csv")["ada"]
    assert float(row["final_score"]) == ada["final_score"] and "late" in row["late"]
    assert json.loads((folder / "gradescope" / "ada.json").read_text())["score"] == \
        ada["final_score"]
    text = (folder / "summary.txt").read_text()
    assert "3 of 4 graded" in text
    assert any(line.split()[:2] == ["double_works", "1/3"] for line in text.splitlines())
    assert "AssertionError" in text
    assert "<img" in (folder / "summary.html").read_text()
    with open(folder / "moodle_import.csv", newline="") as f:
        moodle = {r["Email address"]: r for r in csv.DictReader(f)}
    assert float(moodle["ada@uni.example"][ASSIGNMENT]) == ada["final_score"]
    assert "ada" in (folder / "lms_import_left_out.txt").read_text()  # no Canvas id


def test_nbgrader_finds_a_writable_exchange_in_the_course():
    """The formgrader and `nbgrader list` no longer log 'Unwritable directory'."""
    done = subprocess.run([sys.executable, "-m", "nbgrader", "list"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "Unwritable directory" not in done.stdout + done.stderr
    assert done.returncode == 0, done.stderr[-2000:]
