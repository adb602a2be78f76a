"""Hand-ins from an independent attack on the instructor features (plain-assert cells,
free-text cells, feedback pages, scaled timeouts), kept as tests: see
tests/attacks/instructor_features/README.md for what each one does. The `if_*` ones
are hand-ins of the small instructor course (tests/minicourse.py), the `u01_*` ones of
unit 01."""

import json
import shutil

import pytest
from bs4 import BeautifulSoup

from autograder.authoring.release import release
from autograder.course import Course
from autograder.grading.grade import grade_assignment
from autograder.grading.runner import RunSettings
from autograder.results.report import MAX_MATHS, write_reports
from autograder.term.collect import collect
from conftest import GRADING_ENGINE, REPO
from minicourse import ASSIGNMENT, make_course

ATTACKS = REPO / "tests" / "attacks" / "instructor_features"
# c6 (heavy imports in the answer cell) and a7 (30 cells sleeping just under their
# limit) are kept for people to run; they cost too much time for every test run.
LEFT_OUT = {"if_a7_thirty_cells_sleep_just_under_timeout", "if_c6_correct_heavy_imports"}
SETTINGS = RunSettings(cell_timeout=30, handin_timeout=60)


def _grade(course, assignment, prefix, tmp_path):
    folder = tmp_path / f"{prefix}handins"
    folder.mkdir()
    for path in sorted(ATTACKS.glob(f"{prefix}*.ipynb")):
        if path.stem not in LEFT_OUT:
            shutil.copy(path, folder / path.name)
    collect(course=course, assignment=assignment, source_path=folder)
    results = grade_assignment(course=course, assignment=assignment, settings=SETTINGS,
                               workers=2, engine=GRADING_ENGINE)
    folder, merged = write_reports(course=course, assignment=assignment, results=results)
    pages = {r["student_id"]: BeautifulSoup((folder / "feedback" / f"{r['student_id']}.html")
                                            .read_text(), "html.parser")
             for r in merged}
    return {r["student_id"]: r for r in merged}, pages, course


@pytest.fixture(scope="module")
def minicourse(tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    course = make_course(root / "course", REPO)
    release(course=course, log=open(root / "release.log", "w"))
    return _grade(course, ASSIGNMENT, "if_", root)


@pytest.fixture(scope="module")
def unit01(tmp_path_factory):
    root = tmp_path_factory.mktemp("features01")
    for part in ("source", "release"):
        shutil.copytree(REPO / part / "01_the_recipe", root / "course" / part / "01_the_recipe")
    return _grade(Course(root / "course"), "01_the_recipe", "u01_", root)


def _points(result):
    return {c["grade_id"]: c["points"] for c in result["cells"]}


@pytest.mark.parametrize("student", ["if_a1_partial_credit_over_max",
                                     "if_a2_partial_credit_inf"])
def test_a_returned_score_above_the_points_is_a_reason_not_a_grader_error(minicourse,
                                                                          student):
    result = minicourse[0][student]
    assert result["status"] == "graded" and result["max_score"] == 3
    assert _points(result) == {"double_works": 0.0}
    assert "above its 2 points" in result["cells"][0]["reason"]
    assert result["pending"] == ["why_answer"]


@pytest.mark.parametrize("student", ["if_a3_leak_hidden_tests_via_In",
                                     "if_a4_leak_hidden_tests_pre_run_cell"])
def test_hidden_tests_never_reach_the_feedback_page(minicourse, student):
    text = minicourse[1][student].get_text()
    assert "double(10)" not in text and "BEGIN HIDDEN" not in text


def test_maths_drawn_on_a_page_is_bounded(minicourse):
    page = minicourse[1]["if_a5_many_maths_report_dos"]
    assert 0 < len(page.find_all("math")) <= MAX_MATHS


def _timeouts(minicourse, student):
    """The limits named by the cells of `student`'s graded run that were stopped."""
    course = minicourse[2]
    run = json.loads((course.autograded / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
                     .read_text())
    return [o["evalue"] for c in run["cells"] for o in c.get("outputs", [])
            if o.get("ename") == "CellTimeout"]


def test_a_loop_before_the_first_cell_gets_no_imports_allowance(minicourse):
    result = minicourse[0]["if_a6_loop_in_first_cell"]
    assert _points(result) == {"double_works": 2.0}
    assert _timeouts(minicourse, "if_a6_loop_in_first_cell") == \
        ["the cell ran past its 10 s limit and was stopped"]


def test_added_looping_cells_get_the_scaled_limit(minicourse):
    """Each added loop is stopped at the reference's scaled limit (10 s), not the 30 s
    default; the last may get less, when that is all the hand-in's budget has left."""
    stopped = _timeouts(minicourse, "if_a8_fifteen_infinite_loops")
    assert len(stopped) > 1
    assert all("its 10 s limit" in limit for limit in stopped[:-1]), stopped
    last = int(stopped[-1].split("its ")[1].split(" s limit")[0])
    assert 1 <= last <= 10, stopped


@pytest.mark.parametrize("student", ["if_c1_correct_warns", "if_c2_correct_debug_to_stderr",
                                     "if_c3_correct_logging",
                                     "if_c4_correct_callable_object"])
def test_correct_plain_assert_work_earns_its_points(minicourse, student):
    result = minicourse[0][student]
    assert _points(result) == {"double_works": 2.0} and result["flags"] == []


def test_work_far_slower_than_the_reference_is_told_why_it_lost_the_cell(minicourse):
    reason = minicourse[0]["if_c5_correct_but_slow"]["cells"][0]["reason"]
    assert reason.startswith("CellTimeout") and "10 s limit" in reason


def test_unit01_hidden_checks_never_reach_the_feedback_page(unit01):
    text = unit01[1]["u01_a9_leak_hidden_checks_via_In"].get_text()
    assert "check_layer_norm" not in text and "check_token" not in text


@pytest.mark.parametrize("student", ["u01_c10_correct_stderr_debug",
                                     "u01_c7_correct_dot_einsum",
                                     "u01_c8_correct_welford_pure_python",
                                     "u01_c9_correct_callable_objects_warns",
                                     "u01_f1_partial_credit_on_trusted_cell"])
def test_unit01_unusual_correct_work_earns_every_point(unit01, student):
    result = unit01[0][student]
    assert result["score"] == result["max_score"] == 10, result["cells"]
