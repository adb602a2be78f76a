"""release/ is exactly what nbgrader builds from source/, and leaks nothing.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.authoring import release as rel
from autograder.authoring.release import find_leaks, release
from autograder.course import Course
from conftest import RELEASES, REPO, SOURCES


def _comparable(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell.pop("id", None)
    return nb


@pytest.fixture(scope="module")
def fresh_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("course")
    shutil.copytree(REPO / "source", root / "source")
    shutil.copy(REPO / "nbgrader_config.py", root / "nbgrader_config.py")
    course = Course(root)
    release(course=course)
    return course


def test_committed_release_equals_a_fresh_build(fresh_build):
    built = sorted(p.relative_to(fresh_build.release) for p in fresh_build.release.rglob("*")
                   if p.is_file())
    committed = sorted(p.relative_to(REPO / "release") for p in (REPO / "release").rglob("*")
                       if p.is_file())
    assert built == committed
    for relative in built:
        if relative.suffix == ".ipynb":
            assert _comparable(fresh_build.release / relative) == \
                _comparable(REPO / "release" / relative), f"{relative} is out of date: make release"


def test_release_leaks_nothing():
    course = Course.at(REPO)
    for assignment in course.assignments():
        assert find_leaks(course=course, assignment=assignment) == []


def test_leak_check_catches_solution_text(fresh_build):
    notebook = fresh_build.release_notebook("01_the_recipe")
    text = notebook.read_text()
    notebook.write_text(text.replace("# YOUR CODE HERE",
                                     "return (centred**2).sum(axis=-1) / x.shape[-1]", 1))
    try:
        assert any("solution text" in leak
                   for leak in find_leaks(course=fresh_build, assignment="01_the_recipe"))
    finally:
        notebook.write_text(text)


def _validate(path, env):
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path)],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_an_untouched_release_fails_validate(path, venv_env):
    """A student who answers nothing is not told "Success!". (That the source's own
    solutions earn every point is checked by grading them: tests/grading/test_grade.py.)"""
    released = REPO / "release" / path.parent.name / path.name
    done = _validate(released, venv_env)
    assert "NotImplementedError" in done.stdout or "failed" in done.stdout.lower(), \
        done.stdout[-2000:]
    assert "Success!" not in done.stdout


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.parent.name)
def test_every_cell_a_student_may_edit_is_graded_as_the_student_wrote_it(path):
    """Grading puts back the instructor's version of every cell with an nbgrader id that
    is not an answer, so such a cell must be locked (a scratch cell for the student
    carries no nbgrader id): a helper a student writes where the notebook invites it
    is never thrown away."""
    released = nbformat.read(REPO / "release" / path.parent.name / path.name, as_version=4)
    editable_but_restored = [
        cell.metadata["nbgrader"].get("grade_id") for cell in released.cells
        if "nbgrader" in cell.metadata and not cell.metadata["nbgrader"].get("solution")
        and not cell.metadata["nbgrader"].get("locked")
        and not cell.metadata["nbgrader"].get("grade")]
    assert editable_but_restored == []


def test_failed_release_leaves_the_committed_release_untouched(tmp_path):
    """A source nbgrader refuses (two cells with one grade id) fails in one line and
    deletes or changes nothing in release/."""
    shutil.copytree(REPO / "source", tmp_path / "source", dirs_exist_ok=True)
    shutil.copytree(REPO / "release", tmp_path / "release")
    shutil.copy(REPO / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    course = Course(tmp_path)
    source = course.source_notebook("01_the_recipe")
    nb = json.loads(source.read_text())
    graded = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    graded[1]["metadata"]["nbgrader"]["grade_id"] = graded[0]["metadata"]["nbgrader"]["grade_id"]
    source.write_text(json.dumps(nb))
    before = {p: p.read_bytes() for p in course.release.rglob("*") if p.is_file()}
    done = subprocess.run([sys.executable, "-m", "autograder", "release", "01_the_recipe",
                           "--course", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and "release/01_the_recipe is unchanged" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert {p: p.read_bytes() for p in course.release.rglob("*") if p.is_file()} == before


# Building release/ (autograder/authoring/release.py), pinned on a tiny course.

SOLUTION_LINE = "centred = x - x.mean(axis=-1, keepdims=True)"
HIDDEN_LINE = "assert abs(token_var([1.0, 3.0]) - 1.0) < 1e-12"
CONFIG = ('c = get_config()\n'
          'c.ClearSolutions.code_stub = {"python": "# WRITE IT HERE\\n'
          'raise NotImplementedError()"}\n')


def _meta(gid, **flags):
    return {"nbgrader": {"schema_version": 3, "grade_id": gid, "locked": False,
                         "grade": False, "solution": False, "task": False, **flags}}


def _source(*, duplicate=False):
    return new_notebook(cells=[
        new_markdown_cell("# Token variance"),
        new_code_cell("def token_var(x):\n    ### BEGIN SOLUTION\n    import numpy as np\n"
                      f"    x = np.asarray(x)\n    {SOLUTION_LINE}\n"
                      "    return (centred ** 2).mean(axis=-1)\n    ### END SOLUTION",
                      metadata=_meta("answer", solution=True)),
        new_code_cell(f"assert token_var([1.0, 1.0]) == 0\n### BEGIN HIDDEN TESTS\n"
                      f"{HIDDEN_LINE}\n### END HIDDEN TESTS",
                      metadata=_meta("answer" if duplicate else "var_plain", grade=True,
                                     points=2, locked=True)),
        new_code_cell("check_token_var(token_var)",
                      metadata=_meta("var_checked", grade=True, points=1, locked=True)),
    ])


def _course(root, *, duplicate=False):
    course = Course(root)
    (course.source / "01_var").mkdir(parents=True)
    nbformat.write(_source(duplicate=duplicate), course.source / "01_var" / "01_var.ipynb")
    (root / "nbgrader_config.py").write_text(CONFIG)
    return course


@pytest.fixture
def bare_path(monkeypatch):
    """PATH without this interpreter's bin/: nbgrader must still find alembic."""
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", os.pathsep.join(
        p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir))


class _Log:
    """A log file that keeps what is written to it."""

    def __init__(self):
        self.lines = []

    def write(self, text):
        self.lines.append(text)

    @property
    def text(self):
        return "".join(self.lines)


def test_release_builds_the_student_notebook_and_warns_of_plain_asserts(tmp_path, bare_path,
                                                                       capsys):
    """A real build: release/<assignment> holds the student notebook (the course's
    own stub, no solution, no hidden test), the old release is replaced, and cells of
    plain asserts are named in a warning."""
    course = _course(tmp_path / "course")
    old = course.release / "01_var"
    old.mkdir(parents=True)
    (old / "stale.txt").write_text("from an older build")
    log = _Log()
    rel.release(course=course, log=log)
    assert sorted(p.name for p in old.iterdir()) == ["01_var.ipynb"]
    released = json.loads((old / "01_var.ipynb").read_text())
    sources = ["".join(c["source"]) for c in released["cells"]]
    assert sources[1] == "def token_var(x):\n    # WRITE IT HERE\n    raise NotImplementedError()"
    assert sources[2] == "assert token_var([1.0, 1.0]) == 0"
    assert rel.find_leaks(course=course, assignment="01_var") == []
    out = log.text
    assert capsys.readouterr() == ("", "")
    assert out.startswith("released 01_var\n")
    assert ("warning: 01_var: 1 graded cell(s) test with plain asserts only (var_plain). "
            "They are scored as nbgrader scores them, inside the student's kernel, which "
            "a hand-in can forge; for a trusted check see docs/adding_an_exercise.md\n") in out
    assert [p.name for p in course.release.iterdir()] == ["01_var"]


class _Done:
    def __init__(self, returncode, stdout="", stderr=""):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def test_generate_runs_nbgrader_on_a_scratch_course_with_alembic_on_path(tmp_path,
                                                                       monkeypatch):
    """generate copies the assignment's source into the scratch course and runs
    nbgrader there, from the course root (its nbgrader_config.py), with a gradebook of
    the scratch course's own and this interpreter's bin/ first on PATH."""
    course = _course(tmp_path / "course")
    into = tmp_path / "scratch"
    into.mkdir()
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        return _Done(0)

    monkeypatch.setattr(rel.subprocess, "run", run)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin")
    log = _Log()
    assert rel.generate(course=course, assignment="01_var", into=into, log=log) == \
        into / "release" / "01_var"
    assert (into / "source" / "01_var" / "01_var.ipynb").read_bytes() == \
        (course.source / "01_var" / "01_var.ipynb").read_bytes()
    [(command, kwargs)] = calls
    assert command == [sys.executable, "-m", "nbgrader", "generate_assignment", "01_var",
                       "--force", f"--CourseDirectory.root={into}",
                       f"--CourseDirectory.db_url=sqlite:///{into}/gradebook.db"]
    assert kwargs["cwd"] == course.root
    assert kwargs["capture_output"] is True and kwargs["text"] is True
    assert kwargs["env"]["PATH"] == f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin"
    assert kwargs["env"]["HOME"] == os.environ["HOME"]
    assert log.text == "released 01_var\n"
    # Without PATH, nbgrader still runs, looking where programs are looked for then.
    monkeypatch.delenv("PATH")
    (tmp_path / "bare").mkdir()
    rel.generate(course=course, assignment="01_var", into=tmp_path / "bare", log=log)
    assert calls[-1][1]["env"]["PATH"] == f"{Path(sys.executable).parent}:{os.defpath}"


def test_a_source_nbgrader_refuses_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    """nbgrader refusing a source: ReleaseError names the assignment and nbgrader's
    last error line (stderr comes after stdout); release/ is left as it was."""
    course = _course(tmp_path / "course")
    (course.release / "01_var").mkdir(parents=True)
    (course.release / "01_var" / "01_var.ipynb").write_text("the committed release")
    monkeypatch.setattr(rel.subprocess, "run", lambda *a, **k: _Done(
        1, "[INFO] Updating\nValueError: in stdout\n",
        "    jsonschema.exceptions.ValidationError: Duplicate grade id: answer\n"
        "[GenerateAssignmentApp | INFO] bye\n"))
    with pytest.raises(rel.ReleaseError) as refused:
        rel.release(course=course, assignments=["01_var"])
    assert str(refused.value) == (
        "release/01_var is unchanged: nbgrader could not build source/01_var: "
        "jsonschema.exceptions.ValidationError: Duplicate grade id: answer")
    assert (course.release / "01_var" / "01_var.ipynb").read_text() == "the committed release"


def test_nbgrader_failure_is_its_last_error_line():
    """The line shown is nbgrader's last error line (an [ERROR] log line, an
    exception, a line saying error), cut to its last 400 characters; else the last
    line; else "no output"."""
    failure = rel._nbgrader_failure
    assert failure("[INFO] start\n[ERROR] first\n[ERROR] bad cell\n[INFO] done\n") == \
        "[ERROR] bad cell"
    assert failure("start\n  ValueError: two cells named answer  \nexit\n") == \
        "ValueError: two cells named answer"
    assert failure("start\nan error in cell 3\nexit") == "an error in cell 3"
    assert failure("start\nlast words\n\n   \n") == "last words"
    assert failure("x" * 300 + "Error" + "y" * 300) == ("x" * 300 + "Error" + "y" * 300)[-400:]
    assert failure("z" * 500) == "z" * 400
    assert failure("") == "no output" and failure(" \n\n") == "no output"


def test_solution_lines_are_the_long_lines_of_solutions_and_hidden_tests():
    """Lines of 25 characters or more inside solution or hidden-test regions, in
    cells whose source is a string or a list of lines; nothing outside them."""
    nb = {"cells": [
        {"source": ["visible_line_that_is_long_enough = 1\n", "### BEGIN SOLUTION\n",
                    "    short = 1\n", f"    {SOLUTION_LINE}\n", "### END SOLUTION\n",
                    "after_the_end_a_long_line_of_code = 2\n"]},
        {"source": f"x = 1\n### BEGIN HIDDEN TESTS\n{HIDDEN_LINE}\n"
                   "exactly_twenty_five_chars\n### END HIDDEN TESTS\nnot_hidden_but_long_enough()"},
        {"cell_type": "markdown"},
    ]}
    assert rel._solution_lines(nb) == {SOLUTION_LINE, HIDDEN_LINE, "exactly_twenty_five_chars"}


def _leaky_release(course):
    folder = course.release / "01_var"
    (folder / "data").mkdir(parents=True)
    nb = _source()
    nb.cells[1].source = f"def token_var(x):\n    {SOLUTION_LINE}\n"
    nbformat.write(nb, folder / "01_var.ipynb")
    (folder / "data" / "notes.txt").write_text("uses normref.checks")
    (folder / "data" / "fine.txt").write_text("nothing to see")
    (folder / "data" / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00pixels")
    return folder


def test_find_leaks_names_every_file_and_marker(tmp_path):
    """Every marker in every file (nested ones too) and every solution line a
    released notebook shows is named, with the file's place in release/."""
    course = Course(tmp_path)
    (course.source / "01_var").mkdir(parents=True)
    nbformat.write(_source(), course.source / "01_var" / "01_var.ipynb")
    folder = _leaky_release(course)
    expected = [
        "release/01_var/01_var.ipynb: contains 'BEGIN HIDDEN TESTS'",
        "release/01_var/01_var.ipynb: contains 'END HIDDEN TESTS'",
        f"release/01_var/01_var.ipynb: shows solution text {HIDDEN_LINE!r}",
        f"release/01_var/01_var.ipynb: shows solution text {SOLUTION_LINE!r}",
        "release/01_var/data/notes.txt: contains 'normref'",
    ]
    assert rel.find_leaks(course=course, assignment="01_var") == expected
    moved = tmp_path / "elsewhere"
    folder.rename(moved)
    assert rel.find_leaks(course=course, assignment="01_var", release_dir=moved) == expected
    (moved / "01_var.ipynb").write_text(json.dumps({"cells": [
        {"source": "# BEGIN SOLUTION END SOLUTION"}]}))
    assert rel.find_leaks(course=course, assignment="01_var", release_dir=moved)[:2] == [
        "release/01_var/01_var.ipynb: contains 'BEGIN SOLUTION'",
        "release/01_var/01_var.ipynb: contains 'END SOLUTION'"]


def test_replace_dir_swaps_in_the_new_folder_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """The new build replaces the old folder whole (no stale file), the parent is made
    if needed, and no staged or retired copy is left beside it. Every move is a
    rename inside the target's folder (atomic: a reader sees the old or the new)."""
    renames = []
    replace = os.replace

    def spy(src, dst):
        renames.append((Path(src).parent, Path(dst).parent))
        replace(src, dst)

    monkeypatch.setattr(rel.os, "replace", spy)
    built = tmp_path / "built"
    built.mkdir()
    (built / "a.ipynb").write_text("new")
    target = tmp_path / "course" / "release" / "01_var"
    rel._replace_dir(built, target)
    assert (target / "a.ipynb").read_text() == "new"
    (target / "stale.txt").write_text("old")
    (built / "a.ipynb").write_text("newer")
    rel._replace_dir(built, target)
    assert sorted(p.name for p in target.iterdir()) == ["a.ipynb"]
    assert (target / "a.ipynb").read_text() == "newer"
    assert [p.name for p in target.parent.iterdir()] == ["01_var"]
    assert (built / "a.ipynb").read_text() == "newer"
    assert len(renames) == 3 and set(renames) == {(target.parent, target.parent)}


def test_cells_checked_in_kernel_are_the_graded_cells_without_a_check(tmp_path):
    """A graded cell that calls no trusted check is checked in the student's kernel."""
    path = tmp_path / "a.ipynb"
    nbformat.write(_source(), path)
    assert rel._cells_checked_in_kernel(path) == ["var_plain"]


def test_release_of_an_unknown_assignment_names_the_ones_there(tmp_path):
    """An assignment source/ does not have: the error lists the ones it has, or none."""
    course = Course(tmp_path)
    with pytest.raises(rel.ReleaseError, match=r"^no assignment '02_x': source/ has none$"):
        rel.release(course=course, assignments=["02_x"])
    (course.source / "01_var").mkdir(parents=True)
    (course.source / "01_var" / "01_var.ipynb").write_text("{}")
    (course.source / "00_intro").mkdir()
    (course.source / "00_intro" / "00_intro.ipynb").write_text("{}")
    with pytest.raises(rel.ReleaseError,
                       match=r"^no assignment '02_x': source/ has 00_intro, 01_var$"):
        rel.release(course=course, assignments=["02_x"])


def test_a_leaky_build_is_refused_and_release_stays(tmp_path, monkeypatch):
    """A build that leaks raises LeakError listing each leak, and release/ keeps the
    old build; with no assignment named, every assignment of source/ is built."""
    course = Course(tmp_path)
    (course.source / "01_var").mkdir(parents=True)
    nbformat.write(_source(), course.source / "01_var" / "01_var.ipynb")
    built_for = []

    def fake_generate(*, course, assignment, into, log):
        built_for.append(assignment)
        leaky = _leaky_release(Course(into))
        return leaky

    monkeypatch.setattr(rel, "generate", fake_generate)
    (course.release / "01_var").mkdir(parents=True)
    (course.release / "01_var" / "01_var.ipynb").write_text("the committed release")
    with pytest.raises(rel.LeakError) as refused:
        rel.release(course=course)
    assert built_for == ["01_var"]
    assert str(refused.value) == (
        "release/01_var is unchanged: the build leaks grading material:\n"
        "  release/01_var/01_var.ipynb: contains 'BEGIN HIDDEN TESTS'\n"
        "  release/01_var/01_var.ipynb: contains 'END HIDDEN TESTS'\n"
        f"  release/01_var/01_var.ipynb: shows solution text {HIDDEN_LINE!r}\n"
        f"  release/01_var/01_var.ipynb: shows solution text {SOLUTION_LINE!r}\n"
        "  release/01_var/data/notes.txt: contains 'normref'")
    assert (course.release / "01_var" / "01_var.ipynb").read_text() == "the committed release"


def test_an_interrupted_swap_leaves_the_old_release_and_nothing_visible_beside_it(
        tmp_path, monkeypatch):
    """A copy that stops half-way (a full disk) leaves release/<assignment> as it was;
    what the staging left beside it is hidden and named after it (.01_var.new-...), so
    `ls release/` and `git status` show no stray folder."""
    built = tmp_path / "built"
    built.mkdir()
    (built / "a.ipynb").write_text("new")
    target = tmp_path / "release" / "01_var"
    target.mkdir(parents=True)
    (target / "a.ipynb").write_text("old")

    def copy_then_fail(src, dst, **kwargs):
        Path(dst).mkdir()
        (Path(dst) / "a.ipynb").write_text("ne")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rel.shutil, "copytree", copy_then_fail)
    with pytest.raises(OSError, match="No space left"):
        rel._replace_dir(built, target)
    assert (target / "a.ipynb").read_text() == "old"
    assert [p.name for p in target.parent.iterdir()
            if not p.name.startswith(".01_var.new-")] == ["01_var"]


def test_find_leaks_checks_the_solutions_of_every_notebook_of_the_assignment(tmp_path):
    """An assignment of two notebooks: a solution line of either, shown in the release,
    is a leak."""
    course = Course(tmp_path)
    folder = course.source / "01_var"
    folder.mkdir(parents=True)
    other = "spread = float(np.sqrt(token_var(x) + 1e-5))"
    second = new_notebook(cells=[new_code_cell(
        f"### BEGIN SOLUTION\n{other}\n### END SOLUTION", metadata=_meta("std", solution=True))])
    nbformat.write(_source(), folder / "01_var.ipynb")
    nbformat.write(second, folder / "02_std.ipynb")
    release_dir = course.release / "01_var"
    release_dir.mkdir(parents=True)
    for name, line in (("01_var.ipynb", SOLUTION_LINE), ("02_std.ipynb", other)):
        nbformat.write(new_notebook(cells=[new_code_cell(line)]), release_dir / name)
    assert rel.find_leaks(course=course, assignment="01_var") == [
        f"release/01_var/01_var.ipynb: shows solution text {SOLUTION_LINE!r}",
        f"release/01_var/02_std.ipynb: shows solution text {other!r}"]


def test_find_leaks_reads_a_released_cell_without_source(tmp_path):
    """A released notebook with a cell that has no "source" (hand-made JSON) is read
    as an empty cell: its other cells are still checked, nothing crashes."""
    course = Course(tmp_path)
    (course.source / "01_var").mkdir(parents=True)
    nbformat.write(_source(), course.source / "01_var" / "01_var.ipynb")
    release_dir = course.release / "01_var"
    release_dir.mkdir(parents=True)
    (release_dir / "01_var.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "metadata": {}}, {"source": [f"    {SOLUTION_LINE}\n"]}]}))
    assert rel.find_leaks(course=course, assignment="01_var") == [
        f"release/01_var/01_var.ipynb: shows solution text {SOLUTION_LINE!r}"]


def test_the_warning_lists_every_plain_assert_cell_separated_by_commas(tmp_path,
                                                                        monkeypatch):
    """Two graded cells of plain asserts: the warning counts both and names them in
    notebook order, "a, b"."""
    course = Course(tmp_path)
    (course.source / "01_var").mkdir(parents=True)
    nb = _source()
    nb.cells.append(new_code_cell("assert token_var([2.0]) == 0",
                                  metadata=_meta("var_more", grade=True, points=1,
                                                 locked=True)))
    nbformat.write(nb, course.source / "01_var" / "01_var.ipynb")

    def clean_generate(*, course, assignment, into, log):
        built = into / "release" / assignment
        built.mkdir(parents=True)
        nbformat.write(new_notebook(cells=[new_markdown_cell("# Token variance")]),
                       built / "01_var.ipynb")
        return built

    monkeypatch.setattr(rel, "generate", clean_generate)
    log = _Log()
    rel.release(course=course, log=log)
    assert log.text == (
        "warning: 01_var: 2 graded cell(s) test with plain asserts only (var_plain, "
        "var_more). They are scored as nbgrader scores them, inside the student's kernel, "
        "which a hand-in can forge; for a trusted check see docs/adding_an_exercise.md\n")
    assert (course.release / "01_var" / "01_var.ipynb").is_file()


# The sample hand-ins that deliberately edit a test cell, to show it is restored and caught.
EDITS_A_TEST_CELL = {"gus_edited_tests.ipynb"}


@pytest.mark.parametrize("assignment", [path.parent.name for path in RELEASES])
def test_sample_hand_ins_carry_the_released_instructor_cells(assignment):
    """A sample hand-in is what a student downloads and fills in: its locked cells are
    the release's, checksum included, or nbgrader validate tells the student that a test
    cell has changed and stops before it runs the tests."""
    released = {cell.metadata["nbgrader"]["grade_id"]: cell
                for path in (REPO / "release" / assignment).glob("*.ipynb")
                for cell in nbformat.read(path, as_version=4).cells
                if cell.metadata.get("nbgrader", {}).get("locked")}
    handins = [path for path in (REPO / "autograder" / "examples" / assignment).glob("*.ipynb")
               if path.name not in EDITS_A_TEST_CELL]
    stale = sorted(
        (path.name, grade_id)
        for path in handins for cell in nbformat.read(path, as_version=4).cells
        if (grade_id := cell.metadata.get("nbgrader", {}).get("grade_id")) in released
        and not cell.metadata["nbgrader"].get("solution")
        and (cell.source != released[grade_id].source
             or cell.metadata["nbgrader"].get("checksum")
             != released[grade_id].metadata["nbgrader"].get("checksum")))
    assert stale == []
