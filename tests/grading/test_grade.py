"""The grading pipeline, end to end and piece by piece.
"""

import csv
import io
import json
import shutil
import subprocess
import sys
import zipfile

import nbformat
import numpy as np
import pytest

from autograder.cli import example_assignments
from autograder.course import EXAMPLES_DIR, Course
from autograder.grading.checkserver import Refusal, Verdict
from autograder.grading.grade import score_run
from autograder.grading.merge import merge_handin
from autograder.term.collect import collect, student_id_from
from conftest import REPO
from normref.checks import _wire

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
         "--cell-timeout", "30"],
        cwd=REPO, capture_output=True, text=True, env=venv_env, timeout=1200)
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
                           "--course", str(course.root)],
                          capture_output=True, text=True, env=venv_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(course.reports / "01_the_recipe" / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["student_id", "score", "max_score", "pending", "late",
                             "late_penalty", "final_score", "status", "reason", "flags"]
    by_student = {row["student_id"]: row for row in rows}
    assert set(by_student) == {"ada", "broken", "empty"}
    assert (by_student["ada"]["score"], by_student["ada"]["status"]) == ("8", "graded")
    for student in ("broken", "empty"):
        row = by_student[student]
        assert (row["score"], row["max_score"], row["status"]) == ("0", "8", "invalid")
        assert row["reason"].startswith("not a readable notebook")
    feedback = (course.reports / "01_the_recipe" / "feedback" / "ada.html").read_text()
    assert "layer_norm_batches: all 6 cases passed" in feedback
    gradescope = json.loads(
        (course.reports / "01_the_recipe" / "gradescope" / "ada.json").read_text())
    assert gradescope["score"] == 8
    assert {t["name"] for t in gradescope["tests"]} >= {"ln_handles_batches"}


def test_handins_are_kept_byte_for_byte_and_regrading_skips_unchanged(course):
    from autograder.grading.grade import grade_assignment, sha256
    from autograder.grading.runner import RunSettings

    collect(course=course, assignment="01_the_recipe",
            source_path=EXAMPLES_DIR / "01_the_recipe")
    before = {p: sha256(p) for p in course.submitted.rglob("*.ipynb")}
    settings = RunSettings(cell_timeout=10)
    first = grade_assignment(course=course, assignment="01_the_recipe", settings=settings)
    assert {p: sha256(p) for p in course.submitted.rglob("*.ipynb")} == before
    result = course.autograded / "ada_perfect" / "01_the_recipe" / "result.json"
    stamp = result.stat().st_mtime_ns
    second = grade_assignment(course=course, assignment="01_the_recipe", settings=settings)
    assert result.stat().st_mtime_ns == stamp
    assert [r["score"] for r in first] == [r["score"] for r in second]


def test_merge_restores_instructor_cells_and_keeps_student_cells():
    source = nbformat.read(REPO / "source/01_the_recipe/01_the_recipe.ipynb", as_version=4)
    release = nbformat.read(REPO / "release/01_the_recipe/01_the_recipe.ipynb", as_version=4)
    handin = nbformat.read(_handin("gus_edited_tests"), as_version=4)
    handin.cells = [c for c in handin.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") != "token_var_correct"]
    handin.cells.insert(3, nbformat.v4.new_code_cell("helper = 1"))
    merged, notes = merge_handin(source_nb=source, release_nb=release, handin_nb=handin)
    text = "\n".join(c.source for c in merged.cells)
    assert "check_layer_norm_batches(layer_norm)" in text
    assert "check_token_var(token_var)" in text
    assert "helper = 1" in text
    assert "x.var() + eps" in text  # the student's own answer is kept
    assert any("ln_handles_batches was edited" in n for n in notes)
    assert any("token_var_correct was deleted" in n for n in notes)


@pytest.mark.parametrize("name, student", [
    ("ada.ipynb", "ada"),
    ("lovelaceada_12345_67890_01_the_recipe.ipynb", "lovelaceada_12345"),
    ("lovelaceada_late_12345_67890_01_the_recipe-1.ipynb", "lovelaceada_12345"),
    ("Ada Lovelace_4242_assignsubmission_file_01_the_recipe.ipynb", "Ada_Lovelace_4242"),
])
def test_student_ids_from_lms_file_names(name, student):
    assert student_id_from(name) == student


def test_collect_takes_an_lms_zip_and_lists_what_it_cannot_match(course, tmp_path):
    archive = tmp_path / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(_handin("ada_perfect"), "lovelaceada_12345_67890_01_the_recipe.ipynb")
        z.write(_handin("dee_blank"), "Dee Blank_4242_assignsubmission_file_01_the_recipe.ipynb")
        z.writestr("notes.txt", "not a notebook")
    report = collect(course=course, assignment="01_the_recipe", source_path=archive)
    assert sorted(report.collected) == ["Dee_Blank_4242", "lovelaceada_12345"]
    assert any("notes.txt" in item for item in report.unmatched)
    again = collect(course=course, assignment="01_the_recipe", source_path=archive)
    assert sorted(again.unchanged) == ["Dee_Blank_4242", "lovelaceada_12345"]


# score_run on hand-made verdict logs: every way a cell can fail to earn its points.

SOURCE = nbformat.v4.new_notebook(cells=[
    nbformat.v4.new_code_cell(
        "check_token_mean(token_mean)\ncheck_token_var(token_var)",
        metadata={"nbgrader": {"grade": True, "grade_id": "both", "points": 2,
                               "solution": False, "locked": True}}),
    nbformat.v4.new_code_cell(
        "check_layer_norm_token(layer_norm)",
        metadata={"nbgrader": {"grade": True, "grade_id": "ln", "points": 3,
                               "solution": False, "locked": True}}),
])


def _ran(errors=None):
    """The source notebook as run: every cell executed, `errors` {gid: ename}."""
    run = nbformat.from_dict(nbformat.v4.new_notebook(cells=[dict(c) for c in SOURCE.cells]))
    for cell in run.cells:
        cell.execution_count = 1
        gid = cell.metadata["nbgrader"]["grade_id"]
        cell.outputs = ([nbformat.v4.new_output("error", ename=errors[gid], evalue="x",
                                                traceback=[])]
                        if errors and gid in errors else [])
    return run


def _points(verdicts, *, run=None, policy=None, refusals=()):
    cells, flags = score_run(source_nb=SOURCE, run_nb=run or _ran(), verdicts=verdicts,
                             policy=policy, refusals=refusals)
    return {c["grade_id"]: c["points"] for c in cells}, {c["grade_id"]: c for c in cells}, flags


PASS_ALL = [Verdict("both", "token_mean", True, "ok"), Verdict("both", "token_var", True, "ok"),
            Verdict("ln", "layer_norm_token", True, "ok")]


def test_every_check_passed_earns_every_point():
    points, _, flags = _points(PASS_ALL)
    assert points == {"both": 2, "ln": 3} and flags == []


def test_a_check_that_left_no_verdict_costs_the_cell_without_a_crash():
    """Both checks called, one passed, the other never reported."""
    points, cells, _ = _points(PASS_ALL[:1] + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert cells["both"]["reason"] == "one of the checks this cell calls never ran"


def test_a_failed_check_costs_the_cell_and_its_message_is_the_reason():
    verdicts = [PASS_ALL[0], Verdict("both", "token_var", False, "token_var, case: wrong")]
    points, cells, flags = _points(verdicts + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert cells["both"]["reason"] == "token_var, case: wrong"
    assert any("reported success but the grader's check did not pass" in f for f in flags)


def test_verdicts_of_another_cell_or_check_count_for_nothing():
    verdicts = [Verdict("ln", "token_mean", True, "ok"), Verdict("ln", "token_var", True, "ok")]
    points, _, flags = _points(verdicts + PASS_ALL[2:])
    assert points == {"both": 0, "ln": 3}
    assert any("which it does not call" in f for f in flags)


def test_an_error_in_the_cell_costs_it_even_when_the_checks_passed():
    points, cells, _ = _points(PASS_ALL, run=_ran({"ln": "AssertionError"}))
    assert points == {"both": 2, "ln": 0}
    assert cells["ln"]["reason"].startswith("AssertionError")


def test_an_executed_forbidden_call_costs_only_the_cell_that_forbids_it():
    verdicts = [Verdict("both", "token_mean", True, "ok", executed=("aten::mean",)),
                Verdict("both", "token_var", True, "ok"),
                Verdict("ln", "layer_norm_token", True, "ok",
                        executed=("aten::native_layer_norm", "torch.nn.functional.layer_norm"))]
    policy = {"ln": ["aten::*layer_norm*"], "both": ["aten::*layer_norm*"]}
    points, cells, _ = _points(verdicts, policy=policy)
    assert points == {"both": 2, "ln": 0}
    assert "aten::native_layer_norm" in cells["ln"]["reason"]
    assert cells["ln"]["executed_forbidden"] == ["aten::native_layer_norm"]


def test_a_tampered_recorder_costs_the_cell_and_flags_the_hand_in():
    verdicts = PASS_ALL[:2] + [Verdict("ln", "layer_norm_token", True, "ok",
                                       recorder_intact=False)]
    points, _, flags = _points(verdicts, policy={"ln": ["aten::*layer_norm*"]})
    assert points == {"both": 2, "ln": 0}
    assert any("tampered" in f for f in flags)


def test_an_operator_registered_outside_torch_costs_a_cell_with_a_rule_and_flags_it():
    """torch.library can register an op whose kernel runs aten's layer norm: the
    recorder sees the op, never what runs inside it, so the rule cannot be checked."""
    verdicts = [Verdict("both", "token_mean", True, "ok", executed=("studc1::c",)),
                Verdict("both", "token_var", True, "ok"),
                Verdict("ln", "layer_norm_token", True, "ok",
                        executed=("aten::lift_fresh", "studc1::c", "prims::add"))]
    points, cells, flags = _points(verdicts, policy={"ln": ["aten::*layer_norm*"]})
    assert points == {"both": 2, "ln": 0}  # "both" has no rule to keep
    assert "studc1::c" in cells["ln"]["reason"] and "prims" not in cells["ln"]["reason"]
    assert flags == ["ln: the hand-in ran operators registered outside torch (studc1::c)"]


def test_refused_requests_flag_the_hand_in_but_cost_no_honest_points():
    refusal = Refusal("cell 3", "layer_norm_token", "cases", "no graded test cell is running")
    points, _, flags = _points(PASS_ALL, refusals=[refusal])
    assert points == {"both": 2, "ln": 3}
    assert flags == ["cell 3: the check server refused a request for layer_norm_token "
                     "(no graded test cell is running)"]


@pytest.mark.parametrize("array", [np.array([{"a": 1}], dtype=object),
                                   np.array([b"x", None], dtype=object)])
def test_the_wire_refuses_object_and_pickled_arrays(array):
    buffer = io.BytesIO()
    np.savez(buffer, a=array)  # savez pickles object arrays
    with pytest.raises(_wire.FrameRefused, match="object arrays are refused"):
        _wire.load_arrays(buffer.getvalue())
