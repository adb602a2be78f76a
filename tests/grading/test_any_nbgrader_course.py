"""A course no one here wrote: nbgrader's own user-guide course, which ships inside the
nbgrader package (an assignment of two notebooks and an image, plain-assert tests,
manually graded answers, hand-ins in nbgrader's submitted/<student>/<assignment>/ layout
with timestamp.txt). It grades here to the same per-cell autograded scores as stock
`nbgrader autograde` gives it, run side by side; its manual cells are pending."""

import shutil
import subprocess
import sys
from pathlib import Path

import nbgrader
import pytest
from nbgrader.api import Gradebook

from autograder.authoring.release import release
from autograder.course import Course
from autograder.grading.grade import IN_KERNEL, grade_assignment
from autograder.grading.runner import RunSettings
from autograder.results.report import write_reports
from autograder.term.collect import collect
from conftest import GRADING_ENGINE, REPO

USER_GUIDE = Path(nbgrader.__file__).parent / "docs" / "source" / "user_guide"
ASSIGNMENT = "ps1"


def _stock_autograde(root):
    """{student: {grade_id: (auto score, needs a person)}} from stock `nbgrader autograde`."""
    shutil.copytree(USER_GUIDE / "source" / ASSIGNMENT, root / "source" / ASSIGNMENT)
    shutil.copytree(USER_GUIDE / "submitted", root / "submitted")
    (root / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(root)!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(root / 'gradebook.db')!r}\n")
    for command in (["generate_assignment", ASSIGNMENT, "--force"],
                    ["autograde", ASSIGNMENT, "--force"]):
        done = subprocess.run([sys.executable, "-m", "nbgrader", *command], cwd=root,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    scores = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        for submission in gradebook.find_assignment(ASSIGNMENT).submissions:
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    scores.setdefault(submission.student.id, {})[grade.name] = (
                        grade.auto_score, grade.needs_manual_grade)
    return scores


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("user-guide")
    shutil.copytree(USER_GUIDE / "source" / ASSIGNMENT, root / "source" / ASSIGNMENT)
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    course = Course(root)
    release(course=course, log=open(root / "release.log", "w"))
    report = collect(course=course, assignment=ASSIGNMENT,
                     source_path=USER_GUIDE / "submitted")
    results = grade_assignment(course=course, assignment=ASSIGNMENT, workers=2,
                               settings=RunSettings(cell_timeout=60),
                               engine=GRADING_ENGINE)
    stock_root = tmp_path_factory.mktemp("stock")
    return {"course": course, "collect": report, "results": results,
            "stock": _stock_autograde(stock_root), "stock_root": stock_root}


def test_release_keeps_both_notebooks_and_the_image(graded):
    released = graded["course"].release / ASSIGNMENT
    assert sorted(p.name for p in released.iterdir()) == \
        ["jupyter.png", "problem1.ipynb", "problem2.ipynb"]


def test_collect_reads_nbgrader_s_submitted_layout_with_its_timestamps(graded):
    course = graded["course"]
    assert sorted(graded["collect"].collected) == ["bitdiddle", "hacker"]
    for student in ("bitdiddle", "hacker"):
        folder = course.submitted / student / ASSIGNMENT
        assert (folder / "problem1.ipynb").exists() and (folder / "problem2.ipynb").exists()
        assert (folder / "timestamp.txt").exists()


AUTOGRADED_TESTS = {"correct_squares", "squares_invalid_input", "correct_sum_of_squares",
                    "sum_of_squares_uses_squares"}


def test_autograded_cells_score_as_stock_nbgrader_scores_them(graded):
    ours = {r["student_id"]: {c["grade_id"]: c["points"] for c in r["cells"]}
            for r in graded["results"]}
    # stock also scores unanswered manual cells 0 ("no response"); compare the tests
    stock = {student: {gid: float(points) for gid, (points, _) in cells.items()
                       if gid in AUTOGRADED_TESTS}
             for student, cells in graded["stock"].items()}
    assert {student: set(cells) for student, cells in ours.items()} == \
        {"bitdiddle": AUTOGRADED_TESTS, "hacker": AUTOGRADED_TESTS}
    assert ours == stock
    totals = {student: sum(cells.values()) for student, cells in ours.items()}
    assert totals == {"bitdiddle": 1.5, "hacker": 3.0}
    for result in graded["results"]:
        assert result["status"] == "graded" and result["flags"] == []
        assert result["max_score"] == 13.0
        assert all(c["checked"] == IN_KERNEL for c in result["cells"])
        assert {c["notebook"] for c in result["cells"]} == {"problem1"}


def test_hand_graded_cells_wait_or_score_0_as_stock_nbgrader_has_them(graded):
    """An answer left as released scores 0 with nothing to grade (stock's "no
    response"); every other waits for a person, in every report."""
    course = graded["course"]
    folder, results = write_reports(course=course, assignment=ASSIGNMENT,
                                    results=graded["results"])
    manual = {"cell-938593c4a215c6cc", "part-a", "part-b", "sum_of_squares_application",
              "sum_of_squares_equation"}
    for result in results:
        stock = graded["stock"][result["student_id"]]
        waiting = {gid for gid in manual if stock[gid][1]}
        assert sorted(result["pending"]) == sorted(waiting), result["student_id"]
        blank = {m["grade_id"] for m in result["manual"] if m["status"] == "blank"}
        assert blank == manual - waiting
        assert all(stock[gid][0] == 0 for gid in blank)
    assert any(result["pending"] for result in results)
    assert any(m["status"] == "blank" for result in results for m in result["manual"])
    page = (folder / "feedback" / "hacker.html").read_text()
    assert "problem1.ipynb" in page and "problem2.ipynb" in page and "pending" in page


def test_graded_notebooks_hold_the_cells_stock_autograde_leaves_in_that_order(graded):
    """Cell for cell as stock nbgrader's autograded notebooks: the same cells, of the same
    types, with the same sources, in the same order (the hacker's problem1 once had every
    cell without nbgrader metadata twice)."""
    import nbformat

    course = graded["course"]
    for student in ("bitdiddle", "hacker"):
        for name in ("problem1.ipynb", "problem2.ipynb"):
            ours = nbformat.read(course.autograded / student / ASSIGNMENT / name, as_version=4)
            stock = nbformat.read(graded["stock_root"] / "autograded" / student / ASSIGNMENT
                                  / name, as_version=4)
            assert [(c.cell_type, c.source) for c in ours.cells] == \
                [(c.cell_type, c.source) for c in stock.cells], (student, name)


def test_the_feedback_page_shows_the_notebooks_image(graded):
    """problem1 shows jupyter.png: the page carries it inline (it loads nothing)."""
    course = graded["course"]
    folder, _ = write_reports(course=course, assignment=ASSIGNMENT, results=graded["results"])
    import base64

    page = (folder / "feedback" / "hacker.html").read_text()
    image = base64.b64encode((USER_GUIDE / "source" / ASSIGNMENT / "jupyter.png")
                             .read_bytes()).decode()
    assert f'src="data:image/png;base64,{image}"' in page
