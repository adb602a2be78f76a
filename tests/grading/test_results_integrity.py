"""Results belong to the grader: signed, verified on reuse, written safely.

A small class of unit 01 is graded once in a scratch course (module-scoped);
the tests then forge, alter and block result files and grade again.
"""

import json
import os
import shutil
import stat

import nbformat
import pytest

from autograder.course import EXAMPLES_DIR, Course
from autograder.grading import grade
from autograder.grading.grade import RESULT_FILE, grade_assignment, load_results
from autograder.grading.runner import RunSettings
from conftest import GRADING_ENGINE, REPO

ASSIGNMENT = "01_the_recipe"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
SETTINGS = RunSettings(cell_timeout=30, handin_timeout=120)


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("grader-config") / "grader.key"
    old = os.environ.get(grade.KEY_ENV)
    os.environ[grade.KEY_ENV] = str(path)
    yield path
    if old is None:
        os.environ.pop(grade.KEY_ENV)
    else:
        os.environ[grade.KEY_ENV] = old


@pytest.fixture(scope="module")
def course(tmp_path_factory, key_file):
    root = tmp_path_factory.mktemp("course")
    course = Course(root)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / ASSIGNMENT, root / part / ASSIGNMENT)
    for student, sample in (("ada", "ada_perfect"), ("blank", "dee_blank"),
                            ("other", "ada_perfect")):
        target = course.submitted / student / ASSIGNMENT / NOTEBOOK
        target.parent.mkdir(parents=True)
        shutil.copyfile(EXAMPLES_DIR / ASSIGNMENT / f"{sample}.ipynb", target)
    not_json = course.submitted / "garbage" / ASSIGNMENT / NOTEBOOK
    not_json.parent.mkdir(parents=True)
    not_json.write_text("SECRET-FROM-THE-FILE " * 20)
    grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS, workers=2,
                     engine=GRADING_ENGINE)
    return course


def _result_path(course, student):
    return course.autograded / student / ASSIGNMENT / RESULT_FILE


def test_the_key_lives_outside_the_course_and_is_private(course, key_file):
    assert key_file.exists() and course.root not in key_file.parents
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert len(key_file.read_bytes()) == 32


def test_every_result_is_signed_and_verifies(course):
    for student in ("ada", "blank", "garbage"):
        data = grade.read_verified(_result_path(course, student))
        assert data is not None and data["signature"], student
    assert grade.read_verified(_result_path(course, "ada"))["score"] == 10


def test_a_parse_error_never_quotes_the_file(course):
    data = grade.read_verified(_result_path(course, "garbage"))
    assert data["status"] == "invalid"
    assert "SECRET" not in json.dumps(data), data["reason"]
    assert data["reason"] == "not a readable notebook: the file is not JSON"


def test_a_forged_result_is_regraded_and_flagged(course):
    path = _result_path(course, "blank")
    forged = json.loads(path.read_text())
    forged.update(score=8.0, status="graded")
    for cell in forged["cells"]:
        cell["points"] = cell["max_points"]
    path.write_text(json.dumps(forged))  # same hand-in hash, old signature
    assert grade.result_state(path, forged["handin_sha256"]) == "unverified"
    [listed] = [r for r in load_results(course, ASSIGNMENT) if r["student_id"] == "blank"]
    assert listed["score"] == 0 and listed["status"] == "ungraded"
    grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS, workers=1,
                     engine=GRADING_ENGINE)
    data = grade.read_verified(path)
    assert data["score"] == 0, "the forged full marks survived"
    assert grade._UNVERIFIED_FLAG in data["flags"]


def test_a_result_signed_with_another_key_is_not_trusted(course, tmp_path):
    path = _result_path(course, "ada")
    data = json.loads(path.read_text())
    resigned = grade.sign({k: v for k, v in data.items() if k != "signature"},
                          key=b"not the grader's key".ljust(32))
    path.write_text(json.dumps(resigned))
    assert grade.result_state(path, data["handin_sha256"]) == "unverified"


def test_a_blocked_result_folder_costs_one_student_not_the_run(course):
    """A folder where the temporary file used to go, and a file where a
    student's result folder should be: the others are still graded."""
    (course.autograded / "ada" / ASSIGNMENT / "result.tmp").mkdir(exist_ok=True)
    other = course.autograded / "other"
    shutil.rmtree(other)
    other.write_text("in the way")
    results = grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS,
                               workers=2, engine=GRADING_ENGINE, force=True)
    by_student = {r["student_id"]: r for r in results}
    assert by_student["ada"]["score"] == 10 and by_student["ada"]["status"] == "graded"
    assert by_student["other"]["status"] == "ungraded"
    assert by_student["blank"]["status"] == "graded"
    other.unlink()


def test_the_kernel_cannot_reach_the_result_files(course):
    """A hand-in that tries to write every result file in the course."""
    nb = nbformat.read(EXAMPLES_DIR / ASSIGNMENT / "dee_blank.ipynb", as_version=4)
    targets = [str(_result_path(course, s)) for s in ("ada", "blank")]
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'w').write(json.dumps({'score': 8}))\n"
        "    except OSError as exc:\n"
        "        print('refused', type(exc).__name__)"))
    target = course.submitted / "mallory" / ASSIGNMENT / NOTEBOOK
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    before = {s: _result_path(course, s).read_bytes() for s in ("ada", "blank")}
    grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS, workers=1,
                     engine=GRADING_ENGINE)
    assert {s: _result_path(course, s).read_bytes() for s in ("ada", "blank")} == before
    assert grade.read_verified(_result_path(course, "mallory"))["score"] == 0
