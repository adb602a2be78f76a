"""The grader's bookkeeping and scoring, without starting a kernel.

Each test fails on a small bug in autograder/grading/grade.py (`make mutation`). The
course is made here: one assignment `ps` whose answer `double` is checked by a
trusted check (token_mean, a real probe of normref) in one cell and by plain
asserts in another, plus a free-text answer graded by hand. Where the grader
would run a sandboxed kernel, `run_notebook` is replaced by a stand-in that
"runs" the rebuilt notebook by reading the student's answer: right when it
returns `2 * x`. The stand-in records what the grader asked of it.
"""

import dataclasses
import hashlib
import io
import json
import os
import stat
import threading
from pathlib import Path

import nbformat
import pytest
import tqdm
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

import normref
import normref.checks
from autograder.course import Course
from autograder.grading import engines, forbidden, grade
from autograder.grading.checkserver import Refusal, Verdict
from autograder.grading.runner import RunResult, RunSettings

ASSIGNMENT = "ps"
NOTEBOOK = "ps.ipynb"
RIGHT = "def double(x):\n    return 2 * x"
WRONG = "def double(x):\n    return x"
SETTINGS = RunSettings(cell_timeout=30.0)


def _meta(gid, **extra):
    return {"nbgrader": {"grade_id": gid, "locked": True, "solution": False, "grade": False,
                         "schema_version": 3, **extra}}


def source_nb(prefix=""):
    """The instructor's notebook; `prefix` renames every grade id (another assignment)."""
    nb = new_notebook(cells=[
        new_markdown_cell("Write `double`.", metadata=_meta(prefix + "intro")),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION",
                      metadata=_meta(prefix + "answer", locked=False, solution=True)),
        new_code_cell("check_token_mean(token_mean)",
                      metadata=_meta(prefix + "checked", grade=True, points=3)),
        new_code_cell("assert double(3) == 6", metadata=_meta(prefix + "plain", grade=True,
                                                               points=2)),
        new_markdown_cell("Why?", metadata=_meta(prefix + "why", locked=False,
                                                 solution=True, grade=True, points=1)),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def release_nb(prefix=""):
    nb = source_nb(prefix)
    nb.cells[1].source = "def double(x):\n    raise NotImplementedError()"
    return nb


def handin_nb(answer=RIGHT, prefix=""):
    nb = release_nb(prefix)
    nb.cells[1].source = answer
    return nb


def _write(path, nb):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def make_course(root, *, notebooks=(NOTEBOOK,), handins=None, other=False):
    """A course at `root`: `ps` with `notebooks`, hand-ins {student: {file: answer or bytes}}
    (default: ada right, bob wrong); `other`: a second assignment `qs` (ids q_...)."""
    course = Course(root)
    for name in notebooks:
        _write(course.source / ASSIGNMENT / name, source_nb())
        _write(course.release / ASSIGNMENT / name, release_nb())
    if other:
        _write(course.source / "qs" / "qs.ipynb", source_nb("q_"))
        _write(course.release / "qs" / "qs.ipynb", release_nb("q_"))
    handins = {"ada": {NOTEBOOK: RIGHT}, "bob": {NOTEBOOK: WRONG}} if handins is None \
        else handins
    for student, files in handins.items():
        folder = course.submitted / student / ASSIGNMENT
        folder.mkdir(parents=True, exist_ok=True)
        for name, answer in files.items():
            if isinstance(answer, bytes):
                (folder / name).write_bytes(answer)
            else:
                _write(folder / name, handin_nb(answer))
    return course


class FakeRun:
    """Stands in for runner.run_notebook: every code cell runs; the trusted checks pass
    and the plain asserts hold when the answer returns 2 * x."""

    def __init__(self):
        self.calls = []
        self.problem = None
        self.refusals = []
        self.cell_seconds = {"checked": 2.0, "plain": 0.5, "cell 0": 9.0}
        self.executed = ()
        self.message = "case: wrong"
        self.remove_workdir = False
        self.seconds = 1.25
        self.phases = {"kernel_start": 0.5, "imports": 0.25}

    def __call__(self, nb, *, workdir, settings, cell_checks, record_cells=(), seed=0,
                 hidden=()):
        assert Path(workdir).is_dir() and not any(Path(workdir).iterdir())
        if self.remove_workdir:
            Path(workdir).rmdir()
        self.calls.append({"nb": nb, "workdir": Path(workdir), "settings": settings,
                           "cell_checks": cell_checks, "record_cells": list(record_cells),
                           "seed": seed, "hidden": hidden})
        answer = next(c.source for c in nb.cells
                      if c.metadata.get("nbgrader", {}).get("grade_id", "").endswith("answer"))
        right = "2 * x" in answer
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                cell.execution_count = index + 1
                cell.outputs = []
                if cell.source.startswith("assert") and not right:
                    cell.outputs = [new_output("error", ename="AssertionError", evalue="",
                                               traceback=[])]
        verdicts = [Verdict(gid, check, right, "ok" if right else f"{check}, {self.message}",
                            executed=self.executed)
                    for gid, checks in cell_checks.items() for check in checks]
        return RunResult(nb, verdicts, list(self.refusals), self.problem, self.seconds,
                         dict(self.phases), dict(self.cell_seconds))


@pytest.fixture(autouse=True)
def progress_lock_of_this_process(monkeypatch):
    """tqdm's default write lock holds a multiprocessing semaphore that every process
    forked after it shares. `make mutation` forks each mutant's tests from one process:
    a mutant stopped at its timeout while drawing a bar would leave the semaphore held,
    and every later mutant's bar would wait on it for ever (counted as a timeout, a
    kill it did not earn). A lock of this process only."""
    monkeypatch.setattr(tqdm.tqdm, "_lock", threading.RLock(), raising=False)


@pytest.fixture(autouse=True)
def key(monkeypatch, tmp_path):
    path = tmp_path / "keys" / "grader.key"
    monkeypatch.setenv(grade.KEY_ENV, str(path))
    return path


@pytest.fixture
def fake(monkeypatch):
    run = FakeRun()
    monkeypatch.setattr(grade, "run_notebook", run)
    return run


@pytest.fixture
def course(tmp_path):
    return make_course(tmp_path / "course")


def _task(course, student="ada", **kwargs):
    return grade.make_task(course=course, assignment=ASSIGNMENT, student=student,
                           settings=SETTINGS, **kwargs)


# --- which cells are graded, and how ----------------------------------------------------------


def test_grade_cells_lists_autograded_cells_with_their_checks():
    """Only code cells marked grade, with points and not an answer, are autograded; each
    check a cell calls is named by its probe's check name (None when no probe has it);
    a cell that does not parse calls none; a check_* helper the cell defines or imports
    from elsewhere is a plain helper, not a check (it once cost every student the
    cell)."""
    nb = new_notebook(cells=[
        new_code_cell("check_sandwich_ln_block(Block)\nx = check_token_var(token_var)",
                      metadata=_meta("two", grade=True, points=2)),
        new_code_cell("check_nothing_known(f)", metadata=_meta("unknown", grade=True,
                                                                points="1.5")),
        new_code_cell("assert f(", metadata=_meta("broken", grade=True, points=1)),
        new_code_cell("assert check(1)\nnot_a_check_x(2)\nobj.check_token_mean(3)",
                      metadata=_meta("plain", grade=True, points=4)),
        new_code_cell("def check_shape(y, n):\n    assert y.shape == (n,)\n"
                      "check_shape(f(3), 3)\ncheck_close = lambda a, b: abs(a - b) < 1e-6\n"
                      "assert check_close(f(1)[0], 0.0)\nfrom helpers import check_sum\n"
                      "check_sum(f)\nfrom normref.checks import check_token_mean\n"
                      "check_token_mean(m)",
                      metadata=_meta("own_helpers", grade=True, points=2)),
        new_code_cell("check_token_mean(m)", metadata=_meta("no_points", grade=True,
                                                             points=0)),
        new_code_cell("check_token_mean(m)", metadata=_meta("not_graded", points=3)),
        new_code_cell("def f(): pass", metadata=_meta("answer", grade=True, solution=True,
                                                      points=5)),
        new_markdown_cell("text", metadata=_meta("essay", grade=True, solution=True,
                                                 points=2)),
        new_markdown_cell("check_token_mean(m)", metadata=_meta("md", grade=True, points=2)),
        new_code_cell("check_token_mean(m)"),
    ])
    assert grade.grade_cells(nb) == [
        ("two", 2.0, ("blocks_sandwich_ln", "token_var")),
        ("unknown", 1.5, (None,)),
        ("broken", 1.0, ()),
        ("plain", 4.0, ()),
        ("own_helpers", 2.0, ("token_mean",)),
    ]
    assert all(isinstance(points, float) for _, points, _ in grade.grade_cells(nb))


def test_manual_cells_are_the_ones_a_person_grades():
    """Markdown answers with points, code answers also marked grade, and tasks; never
    autograded cells, ungraded answers or cells without points."""
    nb = new_notebook(cells=[
        new_markdown_cell("text", metadata=_meta("essay", grade=True, solution=True,
                                                 points=2)),
        new_markdown_cell("text", metadata=_meta("md_grade", grade=True, points="1")),
        new_code_cell("def f(): pass", metadata=_meta("code_answer", grade=True,
                                                      solution=True, points=5)),
        new_markdown_cell("do it", metadata=_meta("task", task=True, points=3)),
        new_code_cell("assert 1", metadata=_meta("auto", grade=True, points=4)),
        new_code_cell("x = 1", metadata=_meta("answer", solution=True, points=4)),
        new_markdown_cell("text", metadata=_meta("free", grade=True, solution=True,
                                                 points=0)),
        new_markdown_cell("text", metadata=_meta("task0", task=True)),
    ])
    assert grade.manual_cells(nb) == [("essay", 2.0), ("md_grade", 1.0), ("code_answer", 5.0),
                                      ("task", 3.0)]


def test_student_code_is_the_answers_and_the_cells_they_added():
    """Static flags read the student's code: answer cells and cells without nbgrader
    metadata; the instructor's code cells are context only; text is neither."""
    nb = new_notebook(cells=[
        new_markdown_cell("import os", metadata={}),
        new_code_cell("import torch", metadata=_meta("setup")),
        new_code_cell("def f(): pass", metadata=_meta("answer", solution=True)),
        new_code_cell("helper = 1"),
        new_code_cell("assert f() is None", metadata=_meta("test", grade=True, points=1)),
    ])
    assert grade._student_code(nb) == (["def f(): pass", "helper = 1"],
                                       ["import torch", "assert f() is None"])


def test_grade_ids_of_a_hand_in_ignore_broken_metadata():
    """A hand-in's metadata is the student's: a number for an id, or nbgrader metadata
    that is not a dict, must not crash the wrong-notebook check or count as an id."""
    nb = new_notebook(cells=[new_code_cell("a", metadata=_meta("one")),
                             new_code_cell("b", metadata={"nbgrader": {"grade_id": 7}}),
                             new_code_cell("c", metadata={"nbgrader": "two"}),
                             new_code_cell("d", metadata=_meta("three"))])
    nb.cells.append(new_code_cell("e"))
    nb.cells[-1]["metadata"] = ["x"]
    assert grade._grade_ids(nb) == {"one", "three"}


# --- what a result depends on -----------------------------------------------------------------

SHARED = ["__init__.py", "_registry.py", "_runner.py", "_wire.py", "tolerances.py"]


def test_the_check_files_are_the_shared_machinery_and_each_checks_modules():
    """A change to a check's judge, probe or reference must make old results stale: the
    files are those, plus the shared machinery, and nothing outside normref."""
    checks_dir = Path(normref.checks.__file__).parent
    package = Path(normref.__file__).parent
    shared = [checks_dir / name for name in SHARED]
    assert grade._check_files([]) == sorted(shared)
    assert grade._check_files(["no_such_check"]) == sorted(shared)
    expected = sorted(shared + [checks_dir / "recipe_judges.py", checks_dir / "recipe_probes.py",
                                package / "recipe.py", checks_dir / "blocks_judges.py",
                                checks_dir / "blocks_probes.py", package / "blocks.py"])
    assert grade._check_files(["no_such_check", "token_mean", "blocks_sandwich_ln"]) == expected


def test_a_judges_module_without_probes_still_counts(monkeypatch, tmp_path):
    """A check whose judges module has no probes module beside it: the judges file and
    its references count; no probes file is made up."""
    import importlib.util
    import sys

    from normref.checks import _registry

    path = tmp_path / "lonely_judges.py"
    path.write_text("from normref import recipe\nimport numpy as np\n"
                    "from normref.rmsnorm import rms_norm\n"
                    "def judge(case, output):\n    return ''\n")
    spec = importlib.util.spec_from_file_location("lonely_judges", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lonely_judges", module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(_registry, "_all_checks",
                        lambda: {"lonely": _registry.Check(lambda rng: [], module.judge)})
    checks_dir = Path(normref.checks.__file__).parent
    files = grade._check_files(["lonely"])
    assert path in files and Path(normref.__file__).parent / "recipe.py" in files
    assert checks_dir / "lonely_probes.py" not in files
    assert Path(normref.__file__).parent / "rmsnorm.py" in files
    assert len(files) == len(SHARED) + 3


def _hash_files(paths):
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def test_graded_against_hashes_the_source_the_policy_and_the_checks(course, monkeypatch,
                                                                    tmp_path):
    """The source's own sha256, the policy file's sha256 (None without one) and a hash of
    the files of the checks the source calls (name, NUL, bytes, NUL, in turn)."""
    against = grade.graded_against(course=course, assignment=ASSIGNMENT)
    source = course.source / ASSIGNMENT / NOTEBOOK
    assert against == {
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "policy_sha256": None,
        "checks_sha256": _hash_files(grade._check_files(["token_mean"]))}
    assert against["checks_sha256"] != _hash_files(grade._check_files([]))
    policy = tmp_path / "ps.json"
    policy.write_text('{"cells": {"checked": {"forbidden": ["torch.mean"]}}}')
    monkeypatch.setattr(forbidden, "policy_path",
                        lambda assignment, *where: tmp_path / f"{assignment}.json")
    assert grade.graded_against(course=course, assignment=ASSIGNMENT)["policy_sha256"] == \
        hashlib.sha256(policy.read_bytes()).hexdigest()


def test_graded_against_changes_with_any_byte_of_a_check_file(course, monkeypatch, tmp_path):
    """An edited judge or reference (one byte) must make old results stale."""
    files = [tmp_path / "a_judges.py", tmp_path / "b.py"]
    files[0].write_bytes(b"judge")
    files[1].write_bytes(b"reference")
    monkeypatch.setattr(grade, "_check_files", lambda names: files)
    first = grade.graded_against(course=course, assignment=ASSIGNMENT)["checks_sha256"]
    files[1].write_bytes(b"reference!")
    second = grade.graded_against(course=course, assignment=ASSIGNMENT)["checks_sha256"]
    assert first != second and second == _hash_files(files)


def test_graded_against_a_two_notebook_assignment(tmp_path):
    """Both source notebooks count, named, and the checks both call."""
    course = make_course(tmp_path, notebooks=("a.ipynb", "b.ipynb"), handins={})
    nb = source_nb()
    nb.cells[2].source = "check_sandwich_ln_block(Block)"
    _write(course.source / ASSIGNMENT / "b.ipynb", nb)
    against = grade.graded_against(course=course, assignment=ASSIGNMENT)
    expected = hashlib.sha256()
    for name in ("a.ipynb", "b.ipynb"):
        expected.update(name.encode() + b"\0" + (course.source / ASSIGNMENT / name).read_bytes()
                        + b"\0")
    assert against["source_sha256"] == expected.hexdigest()
    assert against["checks_sha256"] == _hash_files(
        grade._check_files(["blocks_sandwich_ln", "token_mean"]))


# --- the hand-in's files and hash -------------------------------------------------------------


def test_find_handin_tolerates_one_wrongly_named_notebook(tmp_path):
    """The exact name wins; one other notebook is taken with a note; two others are
    ambiguous and nothing is taken."""
    assert grade.find_handin(tmp_path, "ps.ipynb") == (None, None)
    (tmp_path / "mine.ipynb").write_text("{}")
    assert grade.find_handin(tmp_path, "ps.ipynb") == (
        tmp_path / "mine.ipynb", "the notebook was named mine.ipynb, not ps.ipynb")
    (tmp_path / "ps.ipynb").write_text("{}")
    assert grade.find_handin(tmp_path, "ps.ipynb") == (tmp_path / "ps.ipynb", None)
    (tmp_path / "ps.ipynb").unlink()
    (tmp_path / "other.ipynb").write_text("{}")
    assert grade.find_handin(tmp_path, "ps.ipynb") == (None, None)


def test_find_handin_ignores_a_folder_named_like_a_notebook(tmp_path):
    """A folder called *.ipynb is not a hand-in, neither as the exact name nor as the
    one other notebook."""
    (tmp_path / "ps.ipynb").mkdir()
    (tmp_path / "x.ipynb").mkdir()
    (tmp_path / "mine.ipynb").write_text("{}")
    assert grade.find_handin(tmp_path, "ps.ipynb") == (
        tmp_path / "mine.ipynb", "the notebook was named mine.ipynb, not ps.ipynb")


def test_handin_files_of_one_and_of_several_notebooks(tmp_path):
    """One notebook tolerates a wrong name; with several each must carry its own (a
    missing one is None)."""
    course = make_course(tmp_path / "one", handins={"ada": {"mine.ipynb": RIGHT}})
    assert grade.handin_files(course, ASSIGNMENT, "ada") == (
        [(NOTEBOOK, course.submitted / "ada" / ASSIGNMENT / "mine.ipynb")],
        "the notebook was named mine.ipynb, not ps.ipynb")
    course = make_course(tmp_path / "two", notebooks=("a.ipynb", "b.ipynb"),
                         handins={"ada": {"b.ipynb": RIGHT, "wrong.ipynb": RIGHT}})
    folder = course.submitted / "ada" / ASSIGNMENT
    assert grade.handin_files(course, ASSIGNMENT, "ada") == (
        [("a.ipynb", None), ("b.ipynb", folder / "b.ipynb")], None)


def test_the_hand_in_hash_is_stable(tmp_path):
    """The hash stored in results: one notebook's own sha256, or for several the sha256
    of each present name and content (NUL after each); None when nothing was handed in.
    Results already on disk must stay current, so the format must not drift."""
    assert grade._digest([("a.ipynb", None)]) is None
    assert grade._digest([("a.ipynb", None), ("b.ipynb", None)]) is None
    assert grade._digest([("a.ipynb", b"xy")]) == hashlib.sha256(b"xy").hexdigest()
    assert grade._digest([("a.ipynb", None), ("b.ipynb", b"z")]) == \
        hashlib.sha256(b"b.ipynb\0z\0").hexdigest()
    assert grade._digest([("a.ipynb", b"xy"), ("b.ipynb", b"z")]) == \
        hashlib.sha256(b"a.ipynb\0xy\0b.ipynb\0z\0").hexdigest()
    (tmp_path / "b.ipynb").write_bytes(b"z")
    assert grade.handin_digest([("a.ipynb", None), ("b.ipynb", tmp_path / "b.ipynb")]) == \
        grade._digest([("a.ipynb", None), ("b.ipynb", b"z")])
    assert grade.handin_digest([("b.ipynb", tmp_path / "b.ipynb")]) == \
        grade.sha256(tmp_path / "b.ipynb") == hashlib.sha256(b"z").hexdigest()


# --- scoring: what test_score_run does not cover ----------------------------------------------


SCORED = new_notebook(cells=[
    new_code_cell("def f(x):\n    return x", metadata=_meta("answer", solution=True)),
    new_code_cell("check_token_mean(token_mean)", metadata=_meta("mean", grade=True, points=2)),
    new_code_cell("check_token_mean(m)\ncheck_token_var(v)",
                  metadata=_meta("both", grade=True, points=4)),
    new_code_cell("check_mystery(m)", metadata=_meta("mystery", grade=True, points=1)),
    new_code_cell("assert f(1) == 1", metadata=_meta("plain", grade=True, points=3)),
])


def _run(errors=None, unrun=(), results=None, extra=()):
    """SCORED as run: every cell executed except `unrun`; errors {gid: (ename, evalue)};
    results {gid: text/plain}; `extra` cells (of the student's) inserted after the answer."""
    run = nbformat.from_dict(json.loads(nbformat.writes(SCORED)))
    run.cells[1:1] = [nbformat.from_dict(dict(c)) for c in extra]
    for cell in run.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        cell.execution_count = None if gid in unrun else 1
        cell.outputs = []
        if errors and gid in errors:
            cell.outputs.append(new_output("error", ename=errors[gid][0],
                                           evalue=errors[gid][1], traceback=[]))
        if results and gid in results:
            cell.outputs.append(new_output("execute_result", data={"text/plain": results[gid]},
                                           execution_count=1))
    return run


GOOD = [Verdict("mean", "token_mean", True, "ok"), Verdict("both", "token_mean", True, "ok"),
        Verdict("both", "token_var", True, "ok"), Verdict("mystery", "whatever", True, "ok")]


def _score(verdicts=GOOD, run=None, **kwargs):
    cells, flags = grade.score_run(source_nb=SCORED, run_nb=run or _run(), verdicts=verdicts,
                                   **kwargs)
    return {c["grade_id"]: c for c in cells}, flags


def test_a_full_score_lists_each_cell_and_its_checks():
    """Every field of a scored cell, for a trusted-check cell and a plain-assert cell,
    as the report and the feedback read them."""
    cells, flags = _score()
    assert flags == []
    assert cells["mean"] == {
        "grade_id": "mean", "points": 2.0, "max_points": 2.0, "kernel_ok": True,
        "reason": None, "executed_forbidden": [], "checked": "by the grader",
        "checks": [{"check": "token_mean", "passed": True, "message": "ok"}]}
    assert [c["check"] for c in cells["both"]["checks"]] == ["token_mean", "token_var"]
    assert cells["plain"] == {
        "grade_id": "plain", "points": 3.0, "max_points": 3.0, "kernel_ok": True,
        "reason": None, "executed_forbidden": [], "checked": grade.IN_KERNEL, "checks": []}


def test_a_cell_whose_check_left_no_verdict_earns_nothing():
    """The bug the issue names: a cell that calls two checks must not earn its points
    when only one of them left a verdict, even if that one was logged twice."""
    twice = [GOOD[0], GOOD[1], GOOD[1]]
    cells, flags = _score(twice)
    assert cells["both"]["points"] == 0.0
    assert cells["both"]["reason"] == "one of the checks this cell calls never ran"
    assert cells["mean"]["points"] == 2.0
    assert "both: the notebook reported success but the grader's check did not pass" in flags


def test_a_check_the_grader_cannot_name_takes_every_verdict_of_the_cell():
    """A cell calling a check_* no probe defines: whatever verdicts it logged count,
    and it earns nothing without one."""
    cells, flags = _score(GOOD[:3] + [Verdict("mystery", "something", True, "ok"),
                                      Verdict("mystery", "other", True, "ok")])
    assert cells["mystery"]["points"] == 1.0 and flags == []
    assert len(cells["mystery"]["checks"]) == 2
    cells, _ = _score(GOOD[:3])
    assert cells["mystery"]["points"] == 0.0
    assert cells["mystery"]["reason"] == "the grader's check never ran for this cell"
    cells, _ = _score(GOOD[:3] + [Verdict("mystery", "x", False, "x, case: wrong")])
    assert cells["mystery"]["reason"] == "x, case: wrong"


def test_a_foreign_verdict_is_flagged_with_the_checks_it_names():
    """A verdict of a check the cell does not call earns nothing and is flagged once per
    cell, its checks named once each, sorted."""
    cells, flags = _score(GOOD + [Verdict("mean", "token_var", True, "ok"),
                                  Verdict("mean", "layer_norm_token", True, "ok"),
                                  Verdict("mean", "token_var", True, "ok")])
    assert cells["mean"]["points"] == 2.0
    assert flags == ["mean: the checks ['layer_norm_token', 'token_var'] ran while this cell "
                     "ran, which it does not call"]
    assert [c["check"] for c in cells["mean"]["checks"]] == ["token_mean"]


def test_refusals_are_counted_per_cell_check_and_reason():
    """Repeated refusals are one flag with a count; a single one has no count."""
    refused = [Refusal("cell 2", "token_mean", "cases", "no graded test cell is running")] * 3
    refused.append(Refusal("mean", "token_var", "judge", "not called by this cell"))
    refused += [Refusal("mean", "token_var", "judge", "called twice")] * 2
    _, flags = _score(refusals=refused)
    assert flags == [
        "cell 2: the check server refused a request for token_mean "
        "(no graded test cell is running, 3 times)",
        "mean: the check server refused a request for token_var (not called by this cell)",
        "mean: the check server refused a request for token_var (called twice, 2 times)"]


def test_a_cell_the_kernel_never_reached_earns_nothing_even_with_verdicts():
    """A kernel that died after logging verdicts: the cell did not finish."""
    cells, flags = _score(run=_run(unrun=("mean", "plain")))
    assert cells["mean"]["points"] == 0.0 and cells["mean"]["kernel_ok"] is False
    assert cells["mean"]["reason"] == "the cell did not finish running"
    assert cells["plain"] == {**cells["plain"], "points": 0.0, "kernel_ok": False,
                              "reason": "the cell did not run"}
    assert flags == []


def test_an_error_after_passing_checks_is_the_reason():
    """Checks that passed do not outweigh an error the cell raised afterwards."""
    cells, flags = _score(run=_run(errors={"mean": ("ValueError", "bad shape")}))
    assert cells["mean"]["points"] == 0.0 and cells["mean"]["kernel_ok"] is False
    assert cells["mean"]["reason"] == "ValueError: bad shape"
    assert flags == []


def test_a_failed_visible_test_before_the_check_is_the_reason():
    """No verdict and an error: the student reads the error the cell raised."""
    cells, _ = _score(GOOD[1:], run=_run(errors={"mean": ("AssertionError", "shape (2, 3)")}))
    assert cells["mean"]["reason"] == "AssertionError: shape (2, 3)"
    assert cells["mean"]["points"] == 0.0


def test_a_name_error_is_explained_by_an_earlier_syntax_error():
    """The answer's SyntaxError means none of it ran: the student is told to fix that,
    in the broken cell that defines the missing name (here the answer, which defines
    f, though two later cells are broken too), not the NameError it caused."""
    typos = [new_code_cell("def helper(:", metadata={}), new_code_cell("  x = 1")]
    run = _run(errors={"answer": ("SyntaxError", "invalid syntax (line 1)"),
                       "mean": ("NameError", "name 'f' is not defined"),
                       "plain": ("NameError", "name 'f' is not defined")}, extra=typos)
    run.cells[1].outputs = [new_output("error", ename="SyntaxError", evalue="'(' was never "
                                       "closed", traceback=[])]
    run.cells[2].outputs = [new_output("error", ename="IndentationError", evalue="unexpected",
                                       traceback=[])]
    cells, _ = _score(GOOD[1:], run=run)
    expected = ("your cell answer has a SyntaxError (invalid syntax (line 1)), so none of its "
                "code ran: fix it first. Here that gave NameError: name 'f' is not defined")
    assert cells["mean"]["reason"] == expected
    assert cells["plain"]["reason"] == expected


@pytest.mark.parametrize("missing, blamed", [
    ("g", "(one of yours) has a SyntaxError (g's)"),  # the broken cell that defines g
    ("h", "answer has a SyntaxError (the answer's)"),  # no broken cell defines h: the first
])
def test_a_name_error_names_the_broken_cell_that_defines_the_name_else_the_first(
        missing, blamed):
    run = _run(errors={"answer": ("SyntaxError", "the answer's"),
                       "mean": ("NameError", f"name '{missing}' is not defined")},
               extra=[new_code_cell("def g(:", metadata={}), new_code_cell("  k = 1")])
    run.cells[1].outputs = [new_output("error", ename="SyntaxError", evalue="g's",
                                       traceback=[])]
    run.cells[2].outputs = [new_output("error", ename="IndentationError", evalue="k's",
                                       traceback=[])]
    cells, _ = _score(GOOD[1:], run=run)
    assert cells["mean"]["reason"].startswith(f"your cell {blamed}, so none"), cells["mean"]


def test_a_syntax_error_after_the_cell_does_not_explain_its_name_error():
    """Only the syntax errors of cells that ran before the grade cell explain its
    NameError."""
    run = _run(errors={"mean": ("NameError", "name 'f' is not defined"),
                       "both": ("TabError", "inconsistent tabs")})
    run.cells[2].metadata["nbgrader"]["grade_id"] = "both"
    cells, _ = _score(GOOD[1:], run=run)
    assert cells["mean"]["reason"] == "NameError: name 'f' is not defined"


def test_only_syntax_errors_explain_and_only_name_errors_are_explained():
    """Another error kind in an answer explains nothing; a syntax error does not explain
    an AssertionError; a TabError does explain a NameError."""
    run = _run(errors={"answer": ("ValueError", "no"), "mean": ("NameError", "name 'f'"),
                       "plain": ("AssertionError", "")})
    cells, _ = _score(GOOD[1:], run=run)
    assert cells["mean"]["reason"] == "NameError: name 'f'"
    run = _run(errors={"answer": ("SyntaxError", "bad"), "plain": ("AssertionError", "")})
    cells, _ = _score(run=run)
    assert cells["plain"]["reason"] == "AssertionError: "
    run = _run(errors={"answer": ("TabError", "tabs"), "plain": ("NameError", "name 'f'")})
    cells, _ = _score(run=run)
    assert cells["plain"]["reason"].startswith("your cell answer has a TabError (tabs), so")


def test_an_error_reason_is_cut_at_500_characters():
    """A huge error message is cut, so a result file stays small."""
    cells, _ = _score(GOOD[1:], run=_run(errors={"mean": ("ValueError", "x" * 1000)}))
    assert cells["mean"]["reason"] == ("ValueError: " + "x" * 1000)[:500]


def test_a_forbidden_call_names_every_forbidden_name_it_executed():
    """Every forbidden name the cell's checks executed is named once, sorted; names
    allowed are not; other cells are not charged."""
    verdicts = [Verdict("both", "token_mean", True, "ok", executed=("torch.mean", "aten::add")),
                Verdict("both", "token_var", True, "ok", executed=("torch.var", "torch.mean")),
                *GOOD[:1], GOOD[3]]
    cells, flags = _score(verdicts, policy={"both": ["torch.mean", "torch.var"]})
    assert cells["both"]["points"] == 0.0
    assert cells["both"]["executed_forbidden"] == ["torch.mean", "torch.var"]
    assert cells["both"]["reason"] == ("while the grader called your code, it used torch.mean, "
                                       "torch.var, which this exercise forbids")
    assert cells["mean"]["points"] == 2.0 and flags == []


def test_a_tampered_recorder_is_named_in_the_reason_and_the_flags():
    """A verdict whose call recorder was disturbed costs the cell even if it passed."""
    verdicts = [GOOD[0], Verdict("both", "token_mean", True, "ok"),
                Verdict("both", "token_var", True, "ok", recorder_intact=False), GOOD[3]]
    cells, flags = _score(verdicts)
    assert cells["both"]["points"] == 0.0
    assert cells["both"]["reason"] == ("your code disturbed the grader's record of what it "
                                       "executed")
    assert flags == ["both: the hand-in tampered with the grader's call recorder"]


def test_a_failed_check_is_flagged_only_when_the_cell_ran_clean():
    """A failed check in a cell that raised is an ordinary failure; in a cell that ran
    clean it means the notebook claimed a pass: flagged."""
    verdicts = [Verdict("mean", "token_mean", False, "token_mean, case: wrong"), *GOOD[1:]]
    cells, flags = _score(verdicts, run=_run(errors={"mean": ("AssertionError", "x")}))
    assert cells["mean"]["reason"] == "token_mean, case: wrong"
    assert flags == []
    _, flags = _score(verdicts)
    assert flags == ["mean: the notebook reported success but the grader's check did not pass"]


def test_the_first_failed_check_is_the_reason():
    """The reason is the first failed check's message; every check is listed with its
    verdict."""
    verdicts = [GOOD[0], Verdict("both", "token_mean", False, "first"),
                Verdict("both", "token_var", False, "second"), GOOD[3]]
    cells, _ = _score(verdicts)
    assert cells["both"]["reason"] == "first"
    assert cells["both"]["checks"] == [
        {"check": "token_mean", "passed": False, "message": "first"},
        {"check": "token_var", "passed": False, "message": "second"}]


def test_a_cell_missing_from_the_run_earns_nothing():
    """A grade cell absent from the run (the notebook was cut short) earns nothing,
    without a crash."""
    run = _run()
    del run.cells[1]
    cells, _ = _score(run=run)
    assert cells["mean"]["points"] == 0.0 and cells["mean"]["kernel_ok"] is False


def test_a_plain_cell_returning_a_number_earns_that_many_points():
    """nbgrader's partial credit: a returned number is the score; above the cell's
    points it scores 0 with a reason; an empty text earns everything."""
    cells, _ = _score(run=_run(results={"plain": "1.5"}))
    assert cells["plain"]["points"] == 1.5
    assert cells["plain"]["reason"] == "the cell returned 1.5 of 3 points"
    cells, _ = _score(run=_run(results={"plain": "3"}))
    assert cells["plain"]["points"] == 3.0 and cells["plain"]["reason"] is None
    cells, _ = _score(run=_run(results={"plain": "7"}))
    assert cells["plain"]["points"] == 0.0
    assert cells["plain"]["reason"] == ("the cell returned a number above its 3 points, "
                                        "which cannot be a score")
    cells, _ = _score(run=_run(results={"plain": ""}))
    assert cells["plain"]["points"] == 3.0 and cells["plain"]["reason"] is None
    cells, _ = _score(run=_run(results={"plain": "1"}, errors={"plain": ("ValueError", "v")}))
    assert cells["plain"]["points"] == 0.0 and cells["plain"]["reason"] == "ValueError: v"


def test_a_plain_cell_returning_no_text_or_stderr_keeps_its_points():
    """Output on stderr and a result without text are not partial credit: every point."""
    run = _run()
    run.cells[4].outputs = [new_output("execute_result", data={"image/png": "iVBOR"},
                                       execution_count=1),
                            new_output("stream", name="stderr", text="warning\n")]
    cells, _ = _score(run=run)
    assert cells["plain"]["points"] == 3.0 and cells["plain"]["reason"] is None


# --- hand-in files that are not notebooks -----------------------------------------------------


@pytest.mark.parametrize("nb, why", [
    ({"nbformat": 4}, "it has no list of cells"),
    ({"cells": "x"}, "it has no list of cells"),
    ({"cells": [{"cell_type": "code", "source": "x"}, "x"]},
     "cell 1 is not a code, markdown or raw cell with text"),
    ({"cells": [{"cell_type": "heading", "source": "x"}]},
     "cell 0 is not a code, markdown or raw cell with text"),
    ({"cells": [{"cell_type": "code", "source": ["x"]}]},
     "cell 0 is not a code, markdown or raw cell with text"),
    ({"cells": [{"cell_type": "raw"}]}, "cell 0 is not a code, markdown or raw cell with text"),
])
def test_check_cells_says_what_is_wrong(nb, why):
    """A notebook whose cells the merge cannot read is refused with the first broken
    cell named."""
    with pytest.raises(grade._NotCells) as caught:
        grade._check_cells(nbformat.from_dict(nb))
    assert str(caught.value) == why


def test_check_cells_accepts_every_kind_of_cell():
    """Code, markdown and raw cells with text are all fine."""
    nb = nbformat.from_dict({"cells": [{"cell_type": kind, "source": ""}
                                       for kind in ("code", "markdown", "raw")]})
    assert grade._check_cells(nb) is None


def test_invalid_reasons_never_quote_the_file():
    """Each kind of unreadable file gets its own sentence, and none quotes the file's
    bytes."""
    assert grade._invalid_reason(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")) == \
        "not a readable notebook: the file is not UTF-8 text"
    assert grade._invalid_reason(grade._NotCells("it has no list of cells")) == \
        "not a readable notebook: it has no list of cells"
    assert grade._invalid_reason(json.JSONDecodeError("SECRET", "SECRET", 0)) == \
        "not a readable notebook: the file is not JSON"
    from nbformat.reader import NotJSONError

    assert grade._invalid_reason(NotJSONError("SECRET")) == \
        "not a readable notebook: the file is not JSON"
    assert grade._invalid_reason(ValueError("SECRET")) == \
        "not a readable notebook: it is not in Jupyter's notebook format (ValueError)"
    assert grade._invalid_reason(KeyError("SECRET")) == \
        "not a readable notebook: it is not in Jupyter's notebook format (KeyError)"


# --- signing results --------------------------------------------------------------------------


def test_the_key_is_made_once_private_and_random(key):
    """The signing key: 32 random bytes, readable by the grader alone, kept once made."""
    first = grade.grader_key()
    assert len(first) == 32 and key.read_bytes() == first
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert grade.grader_key() == first
    key.unlink()
    assert grade.grader_key() != first


def test_the_key_lives_in_the_config_folder_without_the_variable(monkeypatch, tmp_path):
    """Without the variable the key is in $XDG_CONFIG_HOME, else ~/.config, never in the
    course."""
    monkeypatch.delenv(grade.KEY_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    made = grade.grader_key()
    assert (tmp_path / "config" / "layernorm-course" / "grader.key").read_bytes() == made
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path / "home"))
    made = grade.grader_key()
    assert (tmp_path / "home" / ".config" / "layernorm-course" / "grader.key").read_bytes() \
        == made


def test_an_existing_key_file_is_used_as_it_is(key):
    """A key given by the instructor is never overwritten."""
    key.parent.mkdir(parents=True)
    key.write_bytes(b"k" * 32)
    assert grade.grader_key() == b"k" * 32


def test_a_signed_result_verifies_and_any_change_does_not(tmp_path):
    """Any edit of a signed result (score, cells, an added field, the signature, one
    that is not ASCII or not a string) fails verification, never raises anything
    else; key order does not matter."""
    data = {"score": 3.0, "student_id": "ada", "cells": [{"points": 3.0}]}
    signed = grade.sign(data)
    assert signed == {**data, "signature": signed["signature"]}
    assert signed["signature"] == grade.sign(dict(reversed(list(data.items()))))["signature"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(signed))
    assert grade.read_verified(path) == signed
    assert grade.sign(signed)["signature"] == signed["signature"]
    for change in ({"score": 4.0}, {"cells": [{"points": 4.0}]}, {"extra": 1},
                   {"signature": "0" * 64}, {"signature": "é" * 64},
                   {"signature": ["0" * 64]}, {"signature": None}):
        path.write_text(json.dumps({**signed, **change}))
        with pytest.raises(ValueError, match="does not carry the grader's signature"):
            grade.read_verified(path)
    del signed["signature"]
    path.write_text(json.dumps(signed))
    with pytest.raises(ValueError):
        grade.read_verified(path)


def test_a_signature_is_an_hmac_sha256_of_the_sorted_json(tmp_path):
    """The signature is HMAC-SHA256 with the given key; a result signed with another key
    does not verify."""
    import hmac

    data = {"b": 1, "a": [1, 2]}
    body = json.dumps(data, sort_keys=True).encode()
    assert grade.sign(data, key=b"k")["signature"] == \
        hmac.new(b"k", body, hashlib.sha256).hexdigest()
    path = tmp_path / "result.json"
    path.write_text(json.dumps(grade.sign(data, key=b"k")))
    assert grade.read_verified(path, key=b"k") == {**data, "signature": grade.sign(
        data, key=b"k")["signature"]}
    with pytest.raises(ValueError):
        grade.read_verified(path)


def test_a_missing_or_unreadable_result_is_none_and_a_non_object_is_forged(tmp_path):
    """No file or broken JSON: no result (graded again); JSON that is not an object:
    forged."""
    assert grade.read_verified(tmp_path / "absent.json") is None
    (tmp_path / "broken.json").write_text("{")
    assert grade.read_verified(tmp_path / "broken.json") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError):
        grade.read_verified(tmp_path / "list.json")


def test_results_are_written_whole_and_leave_no_temporary_file(tmp_path, monkeypatch):
    """A failed write leaves the old result intact and no temporary file behind."""
    path = tmp_path / "result.json"
    grade._write_json_atomically(path, {"score": 1})
    assert json.loads(path.read_text()) == {"score": 1}
    assert path.read_text() == json.dumps({"score": 1}, indent=1)
    assert os.listdir(tmp_path) == ["result.json"]

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="disk full"):
        grade._write_json_atomically(path, {"score": 2})
    assert os.listdir(tmp_path) == ["result.json"]
    assert json.loads(path.read_text()) == {"score": 1}


def test_result_state_current_stale_or_unverified(tmp_path):
    """Current only for a verified result of the same hand-in, grader version and
    graded_against; forged means unverified."""
    path = tmp_path / "result.json"
    assert grade.result_state(path, "abc") == "stale"
    against = {"source_sha256": "s"}
    data = {"handin_sha256": "abc", "grader_version": grade.GRADER_VERSION,
            "graded_against": against}
    path.write_text(json.dumps(grade.sign(data)))
    assert grade.result_state(path, "abc") == "current"
    assert grade.result_state(path, "abc", against) == "current"
    assert grade.result_state(path, "abd", against) == "stale"
    assert grade.result_state(path, "abc", {"source_sha256": "t"}) == "stale"
    path.write_text(json.dumps(grade.sign({**data, "grader_version": grade.GRADER_VERSION - 1})))
    assert grade.result_state(path, "abc", against) == "stale"
    path.write_text(json.dumps({**grade.sign(data), "handin_sha256": "abd"}))
    assert grade.result_state(path, "abd", against) == "unverified"


# --- timeouts from the reference run ----------------------------------------------------------


def test_scaled_timeouts_are_ten_times_the_reference_between_floor_and_ceiling():
    """Cell timeouts: factor times the reference's time, at least the floor, at most the
    ceiling, to 0.1 s; unnamed cells are not scaled."""
    assert grade.scaled_timeouts({"fast": 0.2, "mid": 2.344, "slow": 9.0, "cell 3": 5.0},
                                 ceiling=60.0) == {"fast": 10.0, "mid": 23.4, "slow": 60.0}
    assert grade.scaled_timeouts({"a": 1.0, "b": 0.01}, ceiling=100.0, factor=3.0,
                                 floor=2.0) == {"a": 3.0, "b": 2.0}
    assert grade.TIMEOUT_FACTOR == 10.0 and grade.TIMEOUT_FLOOR == 10.0


# --- one hand-in, end to end, with the stand-in kernel ----------------------------------------


def test_make_task_holds_everything_a_worker_needs(course):
    """The task carries the hand-in's bytes, the source and release text, the settings,
    the graded_against hashes and the course to hide."""
    against = {"source_sha256": "given"}
    task = _task(course, against=against, unverified=True)
    assert task.student == "ada" and task.assignment == ASSIGNMENT
    assert task.name_note is None and task.policy == {} and task.other_assignments == {}
    assert task.settings is SETTINGS and task.against == against and task.unverified is True
    assert task.hidden == (str(course.root),)
    [part] = task.notebooks
    assert part.name == NOTEBOOK
    assert part.handin == (course.submitted / "ada" / ASSIGNMENT / NOTEBOOK).read_bytes()
    assert part.source == (course.source / ASSIGNMENT / NOTEBOOK).read_text()
    assert part.release == (course.release / ASSIGNMENT / NOTEBOOK).read_text()
    assert _task(course).against == grade.graded_against(course=course, assignment=ASSIGNMENT)
    assert _task(course).unverified is False


def test_make_task_knows_the_other_assignments_ids(tmp_path):
    """Other assignments' grade ids, sorted, name a hand-in of the wrong assignment; an
    unreadable one is skipped, not fatal."""
    course = make_course(tmp_path, other=True)
    (course.source / "broken").mkdir()
    (course.source / "broken" / "broken.ipynb").write_text("{")
    task = _task(course)
    assert task.other_assignments == {
        "qs": ["q_answer", "q_checked", "q_intro", "q_plain", "q_why"]}


def test_make_task_reads_the_policy(course, monkeypatch):
    """The assignment's forbidden-call policy reaches the worker."""
    monkeypatch.setattr(forbidden, "load_policy",
                        lambda assignment: {"checked": ["torch.mean"]} if assignment ==
                        ASSIGNMENT else {})
    assert _task(course).policy == {"checked": ["torch.mean"]}


def test_a_right_hand_in_earns_every_autograded_point(course, fake):
    """A right hand-in: every autograded point, the manual cell (left as released, so
    blank: 0 with nothing to grade, as stock nbgrader has it), and the result's
    bookkeeping filled in."""
    graded = grade.grade_task(_task(course))
    result = graded["result"]
    assert result["status"] == "graded" and result["reason"] == ""
    assert result["score"] == 5.0 and result["max_score"] == 6.0
    assert result["flags"] == [] and result["notes"] == []
    assert [(c["grade_id"], c["points"], c["notebook"], c["checked"]) for c in result["cells"]] \
        == [("checked", 3.0, "ps", "by the grader"), ("plain", 2.0, "ps", grade.IN_KERNEL)]
    handed_in = (course.submitted / "ada" / ASSIGNMENT / NOTEBOOK).read_bytes()
    assert result["manual"] == [{"grade_id": "why", "notebook": "ps", "max_points": 1.0,
                                 "points": None, "status": "pending",
                                 "answer_sha256": grade.answer_digests(handed_in)["why"],
                                 "blank": True}]
    assert result["student_id"] == "ada" and result["assignment"] == ASSIGNMENT
    assert result["handin_sha256"] == grade.sha256(course.submitted / "ada" / ASSIGNMENT
                                                   / NOTEBOOK)
    assert result["grader_version"] == grade.GRADER_VERSION
    assert result["graded_against"] == grade.graded_against(course=course, assignment=ASSIGNMENT)
    assert result["cell_seconds"] == fake.cell_seconds
    assert result["run_seconds"] == 1.25
    assert set(result["phases"]) == {"prepare", "kernel_start", "imports", "score"}
    assert result["phases"]["kernel_start"] == 0.5 and result["phases"]["imports"] == 0.25
    assert 0 <= result["phases"]["prepare"] < 60 and 0 <= result["phases"]["score"] < 60
    assert 0 <= result["seconds"] < 60
    assert list(graded["notebooks"]) == [NOTEBOOK]
    run = nbformat.reads(graded["notebooks"][NOTEBOOK], as_version=4)
    assert [c.source for c in run.cells][1] == RIGHT
    assert run.cells[2].execution_count == 3


def test_the_kernel_is_asked_for_what_the_cells_call(course, fake, monkeypatch):
    """The run gets the checks each grade cell calls, records executed calls for the
    cells with a policy, a seed of its own per hand-in and notebook, the course hidden,
    and a fresh scratch folder that is removed afterwards."""
    monkeypatch.setattr(forbidden, "load_policy",
                        lambda assignment: {"checked": ["torch.mean"], "plain": []})
    grade.grade_task(_task(course))
    grade.grade_task(_task(course, student="bob"))
    ada, bob = fake.calls
    assert ada["cell_checks"] == {"checked": ("token_mean",), "plain": ()}
    assert ada["record_cells"] == ["checked"]
    assert ada["settings"] is SETTINGS
    assert ada["hidden"] == (str(course.root),)
    import zlib

    assert ada["seed"] == zlib.crc32(b"ada/ps/ps")
    assert bob["seed"] == zlib.crc32(b"bob/ps/ps") != ada["seed"]
    assert not ada["workdir"].exists() and ada["workdir"].name.startswith("grade-")
    assert ada["workdir"] != bob["workdir"]


def test_a_wrong_hand_in_scores_nothing_and_says_why(course, fake):
    """A wrong answer: each cell's reason, and the failed trusted check flagged (the
    kernel said nothing failed)."""
    result = grade.grade_task(_task(course, student="bob"))["result"]
    assert result["status"] == "graded" and result["score"] == 0.0 and result["max_score"] == 6
    reasons = {c["grade_id"]: c["reason"] for c in result["cells"]}
    assert reasons == {"checked": "token_mean, case: wrong", "plain": "AssertionError: "}
    assert result["flags"] == [
        "checked: the notebook reported success but the grader's check did not pass"]


def test_forbidden_calls_and_flagged_code_reach_the_result(course, fake, monkeypatch):
    """An executed forbidden call costs the cell; a construct that can hide what runs in
    the student's code (never the instructor's) is flagged."""
    monkeypatch.setattr(forbidden, "load_policy", lambda assignment: {"checked": ["torch.mean"]})
    fake.executed = ("torch.mean",)
    folder = course.submitted / "ada" / ASSIGNMENT
    _write(folder / NOTEBOOK, handin_nb(RIGHT + "\nimport subprocess"))
    result = grade.grade_task(_task(course))["result"]
    assert result["score"] == 2.0
    [checked] = [c for c in result["cells"] if c["grade_id"] == "checked"]
    assert checked["executed_forbidden"] == ["torch.mean"]
    assert len(result["flags"]) == 1 and "subprocess" in result["flags"][0]
    assert result["flags"][0].startswith("Student cell 1")


def test_a_run_that_stopped_early_says_why(course, fake):
    """The run's problem is the result's reason and a flag; refusals are flagged."""
    fake.problem = "stopped by force after 300 s"
    fake.refusals = [Refusal("cell 1", "token_mean", "cases", "no graded test cell is running")]
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "graded"
    assert result["reason"] == "stopped by force after 300 s"
    assert result["flags"] == [
        "cell 1: the check server refused a request for token_mean "
        "(no graded test cell is running)", "stopped by force after 300 s"]


def test_notes_of_the_merge_and_of_the_name_reach_the_student(tmp_path, fake):
    """The wrong-name note first, then the merge's notes."""
    course = make_course(tmp_path, handins={"ada": {"mine.ipynb": RIGHT}})
    nb = handin_nb()
    del nb.cells[3]
    _write(course.submitted / "ada" / ASSIGNMENT / "mine.ipynb", nb)
    result = grade.grade_task(_task(course))["result"]
    assert result["notes"] == ["the notebook was named mine.ipynb, not ps.ipynb",
                               "cell plain was deleted; the original was restored"]
    assert result["score"] == 5.0


def test_an_unverified_earlier_result_is_flagged(course, fake):
    """A hand-in whose earlier result was forged is flagged when regraded."""
    result = grade.grade_task(_task(course, unverified=True))["result"]
    assert result["flags"] == [grade._UNVERIFIED_FLAG]
    assert result["score"] == 5.0


def test_nothing_handed_in_is_missing(tmp_path, fake):
    """No notebook at all: status missing, no run, no cells."""
    course = make_course(tmp_path, handins={"ada": {}})
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "missing" and result["reason"] == "no notebook was handed in"
    assert result["cells"] == [] and result["score"] == 0.0 and result["max_score"] == 6.0
    assert result["handin_sha256"] is None and fake.calls == []


@pytest.mark.parametrize("data, reason", [
    (b"\xff\xfe", "not a readable notebook: the file is not UTF-8 text"),
    (b'{"cells": [', "not a readable notebook: the file is not JSON"),
    (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}',
     "not a readable notebook: it is not in Jupyter's notebook format (ValidationError)"),
    (b'{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "x", '
     b'"source": "", "metadata": {}}]}',
     "not a readable notebook: cell 0 is not a code, markdown or raw cell with text"),
])
def test_an_unreadable_hand_in_is_invalid_and_not_run(tmp_path, fake, data, reason):
    """An unreadable file is a result (invalid, with why), never a crash, and never run."""
    course = make_course(tmp_path, handins={"ada": {NOTEBOOK: data}})
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "invalid" and result["reason"] == reason
    assert result["cells"] == [] and result["score"] == 0.0
    assert result["handin_sha256"] == hashlib.sha256(data).hexdigest()
    assert fake.calls == []


def test_another_assignments_notebook_is_named(tmp_path, fake):
    """A hand-in of another assignment's notebook names that assignment and is not run."""
    course = make_course(tmp_path, other=True)
    _write(course.submitted / "ada" / ASSIGNMENT / NOTEBOOK, handin_nb(prefix="q_"))
    result = grade.grade_task(_task(course, unverified=True))["result"]
    assert result["status"] == "wrong-notebook"
    assert result["reason"] == "this is the notebook of qs, not of ps: hand in ps.ipynb"
    assert result["cells"] == [] and result["score"] == 0.0 and fake.calls == []
    assert result["flags"] == [grade._UNVERIFIED_FLAG]


def test_a_notebook_without_the_assignments_cells_is_the_wrong_one(tmp_path, fake):
    """Code pasted into a new notebook loses the cells' ids: the student is told, not
    given 0 silently."""
    course = make_course(tmp_path, other=True)
    nb = new_notebook(cells=[new_code_cell(RIGHT), new_code_cell("check_token_mean(1)")])
    _write(course.submitted / "ada" / ASSIGNMENT / NOTEBOOK, nb)
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "wrong-notebook"
    assert result["reason"] == (
        "none of ps's graded cells is in this notebook: is it the right one? Hand in "
        "ps.ipynb, with its cells (copying code into a new notebook loses them)")


def _wrong(handed_ids, others=None, answers=("a1", "a2", "a3", "a4"), graded=("g1",)):
    source = new_notebook(cells=[new_code_cell("", metadata=_meta(a, solution=True))
                                 for a in answers]
                          + [new_code_cell("", metadata=_meta(g, grade=True, points=1))
                             for g in graded]
                          + [new_code_cell("", metadata=_meta("plain_locked"))])
    handin = new_notebook(cells=[new_code_cell("", metadata=_meta(i)) for i in handed_ids])
    task = dataclasses.replace(
        grade.HandinTask("ada", "ps", (), None, {}, others or {}, SETTINGS, {}))
    part = grade.NotebookPart("ps.ipynb", b"", "", "")
    return grade._wrong_notebook_reason(task, part=part, source_nb=source, handin_nb=handin)


def test_wrong_notebook_needs_no_graded_cell_and_under_half_of_the_answers():
    """Half of the answers, or one graded cell, make it this assignment's notebook; an
    assignment without answer cells never has a wrong notebook."""
    assert _wrong(["a1", "a2"]) is None
    assert _wrong(["g1"]) is None
    assert _wrong(["a1", "plain_locked"]) is not None
    assert _wrong([]) is not None
    assert _wrong(["a1", "a2", "a3"], answers=("a1", "a2", "a3", "a4", "a5", "a6")) is None
    assert _wrong(["a1", "a2"], answers=("a1", "a2", "a3", "a4", "a5")) is not None
    assert _wrong(["x"], answers=()) is None
    assert _wrong(["x"], answers=(), graded=()) is None


def test_wrong_notebook_names_the_assignment_holding_half_its_ids():
    """The other assignment named is the one holding at least half of the hand-in's ids."""
    others = {"qs": ["q1", "q2"], "rs": ["r1", "r2", "r3"]}
    assert _wrong(["r1", "x"], others) == \
        "this is the notebook of rs, not of ps: hand in ps.ipynb"
    assert _wrong(["r1", "x", "y"], others).startswith("none of ps's graded cells")
    assert _wrong(["q1", "r1", "r2"], others).startswith("this is the notebook of rs")
    assert _wrong([], others).startswith("none of ps's graded cells")


def _two_notebook_course(tmp_path, files):
    return make_course(tmp_path, notebooks=("a.ipynb", "b.ipynb"), handins={"ada": files})


def test_each_notebook_of_an_assignment_runs_and_scores_on_its_own(tmp_path, fake):
    """Several notebooks: each runs with its own seed; cells, manual cells, times and
    max score add up."""
    course = _two_notebook_course(tmp_path, {"a.ipynb": RIGHT, "b.ipynb": WRONG})
    graded = grade.grade_task(_task(course))
    result = graded["result"]
    assert result["status"] == "graded" and result["score"] == 5.0
    assert result["max_score"] == 12.0
    assert [(c["notebook"], c["grade_id"], c["points"]) for c in result["cells"]] == [
        ("a", "checked", 3.0), ("a", "plain", 2.0), ("b", "checked", 0.0), ("b", "plain", 0.0)]
    assert [m["notebook"] for m in result["manual"]] == ["a", "b"]
    assert sorted(graded["notebooks"]) == ["a.ipynb", "b.ipynb"]
    assert [c["seed"] for c in fake.calls] == [
        __import__("zlib").crc32(f"ada/ps/{stem}".encode()) for stem in ("a", "b")]
    assert result["run_seconds"] == 2.5
    assert result["phases"]["kernel_start"] == 1.0 and result["phases"]["imports"] == 0.5
    assert result["handin_sha256"] == grade.handin_digest(
        grade.handin_files(course, ASSIGNMENT, "ada")[0])


def test_a_notebook_not_handed_in_scores_zero_and_the_others_are_graded(tmp_path, fake):
    """A missing notebook of several scores 0 with a note; the others are graded."""
    course = _two_notebook_course(tmp_path, {"b.ipynb": RIGHT})
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "graded" and result["score"] == 5.0
    assert result["notes"] == ["a.ipynb was not handed in: its exercises score 0"]
    assert result["cells"][:2] == [
        {"grade_id": gid, "notebook": "a", "points": 0.0, "max_points": points,
         "kernel_ok": False, "reason": "a.ipynb was not handed in", "executed_forbidden": [],
         "checked": checked, "checks": []}
        for gid, points, checked in (("checked", 3.0, "by the grader"),
                                     ("plain", 2.0, grade.IN_KERNEL))]
    assert len(fake.calls) == 1


def test_an_unreadable_notebook_among_several_scores_zero(tmp_path, fake):
    """An unreadable notebook of several scores 0 with its reason; the others are
    graded."""
    course = _two_notebook_course(tmp_path, {"a.ipynb": b"{", "b.ipynb": RIGHT})
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "graded" and result["score"] == 5.0
    reason = "a.ipynb: not a readable notebook: the file is not JSON"
    assert result["notes"] == [reason]
    assert [c["reason"] for c in result["cells"][:2]] == [reason, reason]


def test_a_wrong_notebook_among_several_is_graded_as_it_is(tmp_path, fake):
    """With several notebooks a wrong one is graded (to 0), not the whole hand-in
    refused."""
    course = _two_notebook_course(tmp_path, {"a.ipynb": RIGHT, "b.ipynb": RIGHT})
    _write(course.submitted / "ada" / ASSIGNMENT / "b.ipynb",
           new_notebook(cells=[new_code_cell(RIGHT)]))
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "graded" and len(fake.calls) == 2
    assert result["score"] == 5.0


# --- writing and reading results --------------------------------------------------------------


def test_write_graded_writes_the_runs_then_the_signed_result(course, fake):
    """The graded run and the signed result land in the student's folder; a run's name
    cannot leave it."""
    graded = grade.grade_task(_task(course))
    signed = grade.write_graded(course, graded)
    folder = course.autograded / "ada" / ASSIGNMENT
    assert sorted(os.listdir(folder)) == [NOTEBOOK, grade.RESULT_FILE]
    assert (folder / NOTEBOOK).read_text(encoding="utf-8") == graded["notebooks"][NOTEBOOK]
    assert grade.read_verified(folder / grade.RESULT_FILE) == signed
    assert signed == {**graded["result"], "signature": signed["signature"]}
    graded["notebooks"] = {"../../escape.ipynb": "x"}
    grade.write_graded(course, graded)
    assert (folder / "escape.ipynb").read_text() == "x"
    assert not (course.autograded / "escape.ipynb").exists()


def test_grade_one_grades_and_writes(course, fake):
    """grade_one passes unverified and against on, and writes the signed result."""
    signed = grade.grade_one(course=course, assignment=ASSIGNMENT, student="ada",
                             settings=SETTINGS, unverified=True, against={"x": 1})
    assert signed["score"] == 5.0 and signed["graded_against"] == {"x": 1}
    assert grade._UNVERIFIED_FLAG in signed["flags"]
    assert fake.calls[0]["settings"] is SETTINGS
    assert grade.read_verified(course.autograded / "ada" / ASSIGNMENT / grade.RESULT_FILE) \
        == signed
    plain = grade.grade_one(course=course, assignment=ASSIGNMENT, student="ada",
                            settings=SETTINGS)
    assert plain["flags"] == [] and plain["graded_against"] == grade.graded_against(
        course=course, assignment=ASSIGNMENT)


def test_a_written_result_is_current_until_the_hand_in_changes(course, fake):
    """A written result is current for its hand-in and hashes; a changed hand-in or
    policy makes it stale."""
    against = grade.graded_against(course=course, assignment=ASSIGNMENT)
    grade.grade_one(course=course, assignment=ASSIGNMENT, student="ada", settings=SETTINGS,
                    against=against)
    assert grade._result_state(course, ASSIGNMENT, "ada", against) == "current"
    assert grade._result_state(course, ASSIGNMENT, "ada", {**against, "policy_sha256": "p"}) \
        == "stale"
    assert grade._result_state(course, ASSIGNMENT, "bob", against) == "stale"
    _write(course.submitted / "ada" / ASSIGNMENT / NOTEBOOK, handin_nb(WRONG))
    assert grade._result_state(course, ASSIGNMENT, "ada", against) == "stale"


def test_a_crash_is_recorded_as_an_error_or_a_failure(course):
    """A grader crash is a signed result (error, reason cut); a worker killed every time
    is failed."""
    grade._record_crash(course, ASSIGNMENT, "ada", RuntimeError("first"))
    grade._record_crash(course, ASSIGNMENT, "ada", RuntimeError("x" * 600))
    data = grade.read_verified(course.autograded / "ada" / ASSIGNMENT / grade.RESULT_FILE)
    reason = ("grader error: RuntimeError: " + "x" * 600)[:500]
    assert data == {**data, "student_id": "ada", "assignment": ASSIGNMENT, "score": 0.0,
                    "max_score": 0.0, "status": "error", "reason": reason, "flags": [reason],
                    "notes": [], "cells": [], "handin_sha256": None,
                    "grader_version": grade.GRADER_VERSION}
    KilledWorker = type("KilledWorker", (Exception,), {})
    assert grade._failure_status(KilledWorker("w")) == "failed"
    assert grade._failure_status(RuntimeError("w")) == "error"
    grade._record_crash(course, ASSIGNMENT, "newcomer", KilledWorker("w"))
    data = grade.read_verified(course.autograded / "newcomer" / ASSIGNMENT / grade.RESULT_FILE)
    assert data["status"] == "failed" and data["flags"] == [data["reason"]]
    assert data["reason"] == (
        "not graded: the grading worker died every time it ran this hand-in (killed, out of "
        "memory, or its machine lost); it was tried on several workers")


def test_load_results_lists_every_student_marking_missing_and_forged(course, fake):
    """Every student with a hand-in is listed: graded, not yet graded, or failing
    verification (flagged)."""
    grade.grade_one(course=course, assignment=ASSIGNMENT, student="ada", settings=SETTINGS)
    (course.submitted / "cy" / ASSIGNMENT).mkdir(parents=True)
    (course.autograded / "cy" / ASSIGNMENT).mkdir(parents=True)
    (course.autograded / "cy" / ASSIGNMENT / grade.RESULT_FILE).write_text('{"score": 9}')
    ada, bob, cy = grade.load_results(course, ASSIGNMENT)
    assert ada["student_id"] == "ada" and ada["score"] == 5.0 and "signature" in ada
    assert bob == {"student_id": "bob", "assignment": ASSIGNMENT, "score": 0.0,
                   "max_score": 0.0, "status": "ungraded", "reason": "no grading result yet",
                   "flags": [], "notes": [], "cells": []}
    reason = "the result file failed verification: grade again"
    assert cy == {**bob, "student_id": "cy", "reason": reason, "flags": [reason]}


# --- the reference run and the whole assignment -----------------------------------------------


class FakeEngine:
    """Stands in for engines.engine_for: grades the tasks here, in order."""

    made = []

    def __init__(self, name, *, workers, scheduler=None, log=None):
        self.name, self.workers, self.scheduler, self.log = name, workers, scheduler, log
        self.batches = []
        self.closed = False
        FakeEngine.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.closed = True

    def run(self, tasks, *, work, on_done):
        tasks = list(tasks)
        self.batches.append(tasks)
        for task in tasks:
            try:
                graded = work(task)
            except Exception as exc:  # noqa: BLE001
                on_done(task, None, exc)
            else:
                on_done(task, graded, None)


@pytest.fixture
def engine(monkeypatch):
    FakeEngine.made = []
    monkeypatch.setattr(engines, "engine_for", FakeEngine)
    # The stand-in kernel runs no student code: take the sandbox as working, so that
    # the settings reach it resolved (use_bwrap=True) on any machine.
    monkeypatch.setattr(grade.sandbox, "sandbox_problem", lambda limits=None: None)
    return FakeEngine


SANDBOXED = dataclasses.replace(SETTINGS, use_bwrap=True)


def _reference(course, runner, progress=None, settings=SETTINGS):
    against = grade.graded_against(course=course, assignment=ASSIGNMENT)
    return grade.reference_timing(course=course, assignment=ASSIGNMENT, settings=settings,
                                  against=against, runner=runner,
                                  progress=progress or io.StringIO())


def test_the_reference_solution_is_timed_once_and_cached(course, fake):
    """The reference runs the source notebook as a hand-in, once; its cell times are
    cached with the hashes and grader version."""
    runner = FakeEngine("pool", workers=1)
    assert _reference(course, runner) == fake.cell_seconds
    [[task]] = runner.batches
    assert task.student == grade.REFERENCE_STUDENT and task.name_note is None
    assert task.notebooks[0].handin == (course.source / ASSIGNMENT / NOTEBOOK).read_bytes()
    assert "2 * x" in fake.calls[0]["nb"].cells[1].source
    cache = course.root / ".grading" / ASSIGNMENT / "reference_timing.json"
    assert json.loads(cache.read_text()) == {
        "against": grade.graded_against(course=course, assignment=ASSIGNMENT),
        "grader": grade.GRADER_VERSION, "cell_seconds": fake.cell_seconds}
    fake.cell_seconds = {"checked": 7.0}
    assert _reference(course, runner) == {"checked": 2.0, "plain": 0.5, "cell 0": 9.0}
    assert len(runner.batches) == 1


def test_a_stale_or_broken_cache_is_timed_again(course, fake):
    """A cache for other hashes, another grader version, or one that is broken, is
    ignored."""
    runner = FakeEngine("pool", workers=1)
    cache = course.root / ".grading" / ASSIGNMENT / "reference_timing.json"
    cache.parent.mkdir(parents=True)
    against = grade.graded_against(course=course, assignment=ASSIGNMENT)
    for stale in ({"against": {"other": 1}, "grader": grade.GRADER_VERSION, "cell_seconds": {}},
                  {"against": against, "grader": grade.GRADER_VERSION - 1, "cell_seconds": {}},
                  [1, 2], "{"):
        cache.write_text(stale if isinstance(stale, str) else json.dumps(stale))
        assert _reference(course, runner) == fake.cell_seconds
    assert len(runner.batches) == 4


def test_a_reference_that_loses_points_scales_nothing_and_says_why(course, fake):
    """A reference that does not earn every point scales nothing and says which cells
    lost them."""
    (course.source / ASSIGNMENT / NOTEBOOK).write_text(nbformat.writes(handin_nb(WRONG)))
    progress = io.StringIO()
    assert _reference(course, FakeEngine("pool", workers=1), progress) is None
    assert progress.getvalue() == (
        "warning: the reference solution of ps scores 0 here (graded; checked: token_mean, "
        "case: wrong; plain: AssertionError: ): cell timeouts are not scaled\n")
    assert not (course.root / ".grading" / ASSIGNMENT / "reference_timing.json").exists()


def test_a_reference_that_is_not_graded_gives_its_reason(course, fake):
    """A reference that cannot be graded scales nothing and says why."""
    nb = source_nb()
    nb.cells[0].cell_type = "heading"  # nbformat only warns; the grader refuses it
    (course.source / ASSIGNMENT / NOTEBOOK).write_text(json.dumps(nb))
    progress = io.StringIO()
    assert _reference(course, FakeEngine("pool", workers=1), progress) is None
    assert progress.getvalue() == (
        "warning: the reference solution of ps scores 0 here (invalid; not a readable "
        "notebook: cell 0 is not a code, markdown or raw cell with text): cell timeouts are "
        "not scaled\n")


def test_a_reference_that_crashes_scales_nothing(course, fake):
    """A reference whose run crashed scales nothing and names the error's kind."""
    class Crashing(FakeEngine):
        def run(self, tasks, *, work, on_done):
            for task in tasks:
                on_done(task, None, MemoryError())

    progress = io.StringIO()
    assert _reference(course, Crashing("pool", workers=1), progress) is None
    assert progress.getvalue() == ("warning: the reference solution of ps could not be run "
                                   "(MemoryError): cell timeouts are not scaled\n")


def _grade_all(course, **kwargs):
    progress = kwargs.pop("progress", io.StringIO())
    results = grade.grade_assignment(course=course, assignment=ASSIGNMENT,
                                     settings=kwargs.pop("settings", SETTINGS),
                                     progress=progress, **kwargs)
    return results, progress.getvalue()


def test_grade_assignment_grades_everyone_with_scaled_timeouts(course, fake, engine):
    """Everyone is graded on the engine asked for, with timeouts scaled from the
    reference; one line per hand-in and a summary."""
    results, log = _grade_all(course, workers=3, engine="pool", scheduler="tcp://x")
    assert [(r["student_id"], r["score"]) for r in results] == [("ada", 5.0), ("bob", 0.0)]
    [runner] = engine.made
    assert (runner.name, runner.workers, runner.scheduler) == ("pool", 3, "tcp://x")
    assert isinstance(runner.log, io.StringIO)  # the engine logs where the grader does
    assert runner.closed
    reference, ada, bob = fake.calls
    assert reference["settings"] == SANDBOXED
    assert ada["settings"] == dataclasses.replace(
        SANDBOXED, cell_timeouts={"checked": 20.0, "plain": 10.0})
    lines = log.splitlines()
    assert lines[0].startswith("[1/2] ada: 5/6 graded (") and lines[0].endswith(" s)")
    assert lines[1].startswith("[2/2] bob: 0/6 graded (")
    assert lines[2].startswith("graded 2, failed 0, flagged 1, in ")
    assert lines[2].endswith(" s with 3 workers")
    for r in results:
        assert grade.read_verified(course.autograded / r["student_id"] / ASSIGNMENT
                                   / grade.RESULT_FILE) == r


def test_the_ceiling_of_scaled_timeouts_is_the_cell_timeout(course, fake, engine):
    """No scaled timeout exceeds the instructor's --cell-timeout."""
    _grade_all(course, settings=RunSettings(cell_timeout=15.0))
    assert fake.calls[1]["settings"].cell_timeouts == {"checked": 15.0, "plain": 10.0}


def test_without_scaling_no_reference_runs(course, fake, engine):
    """scale_timeouts=False: no reference run and the settings as given."""
    results, _ = _grade_all(course, scale_timeouts=False)
    assert len(fake.calls) == 2 and fake.calls[0]["settings"] == SANDBOXED
    assert [r["score"] for r in results] == [5.0, 0.0]


def test_a_second_run_skips_current_results_and_regrades_changed_ones(course, fake, engine):
    """A rerun grades nobody twice: current results are skipped, changed hand-ins
    regraded and counted as out of date."""
    _grade_all(course)
    fake.calls.clear()
    results, log = _grade_all(course, workers=2)
    assert fake.calls == [] and len(engine.made) == 1  # no engine for nobody
    assert log.splitlines()[0] == "2 of 2 already graded (unchanged hand-ins): skipped"
    assert log.splitlines()[-1].startswith("graded 0, failed 0, flagged 0, in ")
    assert [r["score"] for r in results] == [5.0, 0.0]
    _write(course.submitted / "bob" / ASSIGNMENT / NOTEBOOK, handin_nb(RIGHT))
    results, log = _grade_all(course)
    assert log.splitlines()[:2] == [
        "1 earlier result(s) are out of date (the hand-in, the source notebook, the policy "
        "or the checks changed): regraded",
        "1 of 2 already graded (unchanged hand-ins): skipped"]
    assert [c["nb"].cells[1].source for c in fake.calls] == [RIGHT]
    assert [r["score"] for r in results] == [5.0, 5.0]


def test_force_regrades_everyone_without_calling_them_out_of_date(course, fake, engine):
    """force regrades every hand-in, and does not call results out of date."""
    _grade_all(course, scale_timeouts=False)
    fake.calls.clear()
    _write(course.submitted / "bob" / ASSIGNMENT / NOTEBOOK, handin_nb(RIGHT))
    results, log = _grade_all(course, force=True, scale_timeouts=False)
    assert len(fake.calls) == 2
    assert "out of date" not in log and "already graded" not in log
    assert [r["score"] for r in results] == [5.0, 5.0]


def test_chosen_students_are_regraded_and_the_others_kept(course, fake, engine):
    """students= regrades those (even if current), keeps the others, and refuses unknown
    ids, naming them sorted."""
    _grade_all(course, scale_timeouts=False)
    fake.calls.clear()
    results, log = _grade_all(course, students=["bob"], scale_timeouts=False)
    assert [c["nb"].cells[1].source for c in fake.calls] == [WRONG]
    assert "already graded" not in log
    assert log.splitlines()[0].startswith("[1/1] bob: 0/6 graded")
    # the summary counts this run's hand-ins, not the class's kept results
    assert log.splitlines()[-1].startswith("graded 1, failed 0, flagged 1, in ")
    assert [r["student_id"] for r in results] == ["ada", "bob"]
    with pytest.raises(ValueError, match="no hand-in of ps from eve, zed in submitted/"):
        _grade_all(course, students=["bob", "zed", "eve"])


def test_a_forged_result_is_regraded_and_flagged(course, fake, engine):
    """A forged result is regraded (not called out of date) and flagged; other students
    are not."""
    _grade_all(course, scale_timeouts=False)
    path = course.autograded / "bob" / ASSIGNMENT / grade.RESULT_FILE
    forged = json.loads(path.read_text())
    path.write_text(json.dumps({**forged, "score": 6.0}))
    fake.calls.clear()
    results, log = _grade_all(course, scale_timeouts=False)
    assert len(fake.calls) == 1 and "out of date" not in log
    assert results[1]["score"] == 0.0 and grade._UNVERIFIED_FLAG in results[1]["flags"]
    assert grade._UNVERIFIED_FLAG not in results[0]["flags"]


def test_a_crashing_hand_in_costs_only_that_student(course, fake, engine, monkeypatch):
    """A crash grading one hand-in is that student's error result; the run goes on."""
    real = grade.grade_task

    def crash_for_bob(task):
        if task.student == "bob":
            raise RuntimeError("boom")
        return real(task)

    monkeypatch.setattr(grade, "grade_task", crash_for_bob)
    results, log = _grade_all(course, scale_timeouts=False, workers=1)
    assert results[0]["status"] == "graded"
    assert results[1]["status"] == "error"
    assert results[1]["reason"] == "grader error: RuntimeError: boom"
    assert "[2/2] bob: error: RuntimeError: boom" in log.splitlines()
    assert log.splitlines()[-1].startswith("graded 1, failed 1, flagged 1, in ")


def test_a_result_that_cannot_be_written_is_reported(course, fake, engine, monkeypatch):
    """When even the crash result cannot be written, the line says so and the run goes
    on."""
    def refuse(*args):
        raise PermissionError("read-only")

    monkeypatch.setattr(grade, "write_graded", refuse)
    monkeypatch.setattr(grade, "_write_json_atomically", refuse)
    results, log = _grade_all(course, scale_timeouts=False)
    assert "[1/2] ada: error: PermissionError: read-only (and its result could not be " \
        "written: read-only)" in log.splitlines()
    assert [r["status"] for r in results] == ["ungraded", "ungraded"]


def test_nobody_to_grade_starts_no_engine(tmp_path, fake, engine):
    """No hand-in: no engine, no reference run, just the summary."""
    course = make_course(tmp_path, handins={})
    results, log = _grade_all(course)
    assert results == [] and engine.made == [] and fake.calls == []
    assert log.startswith("graded 0, failed 0, flagged 0, in ")


def test_the_default_workers_are_the_cores(course, fake, engine, monkeypatch):
    """workers default to the number of cores, or 1 when unknown."""
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    _grade_all(course, workers=None)
    assert engine.made[0].workers == 5
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    _grade_all(course, workers=None, force=True)
    assert engine.made[1].workers == 1


def test_grading_one_student_regrades_those_graded_against_other_tests(course, fake, engine):
    """`--student ada` grades ada; after the source notebook changed it grades bob too,
    saying so, so that no report mixes two versions of the tests; a result that fails
    verification is not taken for an old one (it is regraded, flagged, when its
    student is), and with nothing changed only ada is graded."""
    def graded(**kwargs):
        before = len(fake.calls)
        _, log = _grade_all(course, scale_timeouts=False, engine="pool", **kwargs)
        return len(fake.calls) - before, log

    assert graded()[0] == 2
    count, log = graded(students=["ada"])
    assert count == 1 and "also regrading" not in log
    source = course.source / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(source, as_version=4)
    nb.cells.append(new_markdown_cell("A note added after grading."))
    nbformat.write(nb, source)
    count, log = graded(students=["ada"])
    assert count == 2
    assert ("also regrading 1 other student(s) graded against an earlier source notebook, "
            "policy, checks or grader, so that no report mixes two versions of the tests: "
            "bob\n") in log
    nb.cells.append(new_markdown_cell("Another note."))
    nbformat.write(nb, source)
    result = course.autograded / "bob" / ASSIGNMENT / grade.RESULT_FILE
    forged = json.loads(result.read_text())
    result.write_text(json.dumps({**forged, "score": forged["score"] + 1}))
    count, log = graded(students=["ada"])
    assert count == 1 and "also regrading" not in log


def test_the_default_settings_engine_and_key_are_made(course, fake, engine, key):
    """Without settings the defaults are used; without an engine named, Dask grades (the
    name engines.engine_for knows it by); the signing key is made before any worker
    runs."""
    grade.grade_assignment(course=course, assignment=ASSIGNMENT, progress=io.StringIO(),
                           scale_timeouts=False)
    assert fake.calls[0]["settings"] == RunSettings(use_bwrap=True)
    assert [made.name for made in engine.made] == ["dask"]
    assert key.exists()


# --- times, long messages and the progress bar ------------------------------------------------


class Clock:
    """A monotonic clock that reads the given times in turn, then goes on by 1 s."""

    def __init__(self, *times):
        self.times = list(times)
        self.now = 0.0

    def monotonic(self):
        self.now = self.times.pop(0) if self.times else self.now + 1.0
        return self.now


def test_the_phases_and_seconds_of_a_hand_in_are_timed(course, fake, monkeypatch):
    """prepare: start to run; score: run to scored; seconds: start to end; the run's own
    phases and seconds added; each rounded (ms, and 10 ms for seconds)."""
    clock = Clock(100.0, 101.2344, 102.0, 103.5, 110.126)
    monkeypatch.setattr(grade, "time", clock)
    fake.seconds, fake.phases = 1.23456, {"kernel_start": 0.12345, "imports": 0.25}
    result = grade.grade_task(_task(course))["result"]
    assert clock.times == []
    assert result["phases"] == {"prepare": 1.234, "kernel_start": 0.123, "imports": 0.25,
                                "score": 1.5}
    assert result["run_seconds"] == 1.23 and result["seconds"] == 10.13


def test_the_phases_of_two_notebooks_add_up(tmp_path, fake, monkeypatch):
    """With two notebooks the run phases and score times add up; prepare is the time to
    the last run."""
    course = _two_notebook_course(tmp_path, {"a.ipynb": RIGHT, "b.ipynb": WRONG})
    clock = Clock(100.0, 100.5, 101.0, 101.25, 102.0, 102.5, 103.0, 104.1256)
    monkeypatch.setattr(grade, "time", clock)
    fake.seconds, fake.phases = 1.23456, {"kernel_start": 0.12345}
    result = grade.grade_task(_task(course))["result"]
    assert clock.times == []
    assert result["phases"] == {"prepare": 2.0, "kernel_start": 0.246, "score": 0.75}
    assert result["run_seconds"] == 2.46 and result["seconds"] == 4.13


def test_results_are_written_through_a_hidden_temporary_file_beside_them(tmp_path,
                                                                         monkeypatch):
    """A write killed midway leaves a dot-file beside the result, which no listing of
    results or notebooks picks up; the result itself is never half-written."""
    moved = []
    real = os.replace

    def spy(src, dst):
        moved.append((Path(src), Path(dst)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    path = tmp_path / "result.json"
    grade._write_json_atomically(path, {"score": 1})
    [(src, dst)] = moved
    assert dst == path and src.parent == tmp_path
    assert src.name.startswith(".result.json.") and src.name.endswith(".tmp")


def test_graded_runs_are_written_through_hidden_temporary_files(course, fake, monkeypatch):
    """The graded run is renamed into place from a hidden temporary file beside it, then
    the result."""
    moved = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (moved.append((Path(src), Path(dst))),
                                                         real(src, dst)))
    grade.write_graded(course, grade.grade_task(_task(course)))
    folder = course.autograded / "ada" / ASSIGNMENT
    (run_src, run_dst), (result_src, result_dst) = moved
    assert run_dst == folder / NOTEBOOK and result_dst == folder / grade.RESULT_FILE
    assert run_src.parent == folder and run_src.name.startswith(".run-")
    assert run_src.name.endswith(".tmp")


def test_a_long_reason_of_the_reference_is_cut(course, fake):
    """The warning about a failing reference is cut at 300 characters of reasons."""
    (course.source / ASSIGNMENT / NOTEBOOK).write_text(nbformat.writes(handin_nb(WRONG)))
    fake.message = "y" * 400
    progress = io.StringIO()
    assert _reference(course, FakeEngine("pool", workers=1), progress) is None
    lost = ("checked: token_mean, " + "y" * 400 + "; plain: AssertionError: ")[:300]
    assert progress.getvalue() == (f"warning: the reference solution of ps scores 0 here "
                                   f"(graded; {lost}): cell timeouts are not scaled\n")


def test_a_long_crash_line_is_cut(course, fake, engine, monkeypatch):
    """A crash's progress line, and its could-not-write tail, are each cut at 300
    characters."""
    def crash(task):
        raise RuntimeError("z" * 400)

    def refuse(*args):
        raise PermissionError("w" * 400)

    monkeypatch.setattr(grade, "grade_task", crash)
    results, log = _grade_all(course, scale_timeouts=False)
    line = ("error: RuntimeError: " + "z" * 400)[:300]
    assert log.splitlines()[0] == f"[1/2] ada: {line}"
    monkeypatch.setattr(grade, "_write_json_atomically", refuse)
    results, log = _grade_all(course, scale_timeouts=False, force=True)
    tail = (" (and its result could not be written: " + "w" * 400)[:300]
    assert log.splitlines()[0] == f"[1/2] ada: {line}{tail}"


def test_a_worker_that_kept_dying_is_a_failure(course, fake, engine, monkeypatch):
    """A hand-in that killed its workers every time is failed (not error), in the line
    and the result."""
    KilledWorker = type("KilledWorker", (Exception,), {})

    def die(task):
        raise KilledWorker("worker-1")

    monkeypatch.setattr(grade, "grade_task", die)
    results, log = _grade_all(course, scale_timeouts=False)
    assert log.splitlines()[0] == "[1/2] ada: failed: KilledWorker: worker-1"
    assert [r["status"] for r in results] == ["failed", "failed"]


def test_the_summary_line_counts_and_times_the_run(course, fake, engine, monkeypatch):
    """The summary counts graded, failed and flagged hand-ins, the seconds since the
    start, and the workers."""
    import re

    results, log = _grade_all(course, workers=4)
    seconds = float(re.fullmatch(r"graded 2, failed 0, flagged 1, in ([\d.]+) s with 4 "
                                 r"workers", log.splitlines()[-1]).group(1))
    assert 0 <= seconds < 60


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_progress_bar_that_starts_at_the_skipped(course, fake, engine):
    """On a terminal a bar counts hand-ins from the skipped ones to all; with nothing to
    do, no bar."""
    _grade_all(course, scale_timeouts=False)
    _write(course.submitted / "bob" / ASSIGNMENT / NOTEBOOK, handin_nb(RIGHT))
    terminal = Terminal()
    _grade_all(course, scale_timeouts=False, progress=terminal)
    shown = terminal.getvalue()
    assert "1/2 [" in shown and "2/2 [" in shown and "0/2 [" not in shown
    assert "hand-in/s" in shown
    again = Terminal()
    _grade_all(course, scale_timeouts=False, progress=again)
    assert "[" not in again.getvalue().replace("[1/2]", "").replace("[2/2]", "")


def test_a_log_without_isatty_gets_no_bar(course, fake, engine):
    """A log object without isatty is not a terminal: lines only, no bar."""
    class Log:
        def __init__(self):
            self.parts = []

        def write(self, text):
            self.parts.append(text)

        def flush(self):
            pass

    log = Log()
    grade.grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS,
                           progress=log, scale_timeouts=False)
    text = "".join(log.parts)
    assert "hand-in/s" not in text and "%" not in text
    assert text.splitlines()[0].startswith("[1/2] ada: 5/6 graded")


def test_a_cell_calling_one_check_twice_needs_both_verdicts():
    """A cell that calls the same check twice (two inputs) earns nothing when only one of
    the calls left a verdict."""
    source = new_notebook(cells=[new_code_cell(
        "check_token_mean(a)\ncheck_token_mean(b)", metadata=_meta("twice", grade=True,
                                                                   points=2))])
    run = nbformat.from_dict(json.loads(nbformat.writes(source)))
    run.cells[0].execution_count = 1
    one = [Verdict("twice", "token_mean", True, "ok")]
    cells, _ = grade.score_run(source_nb=source, run_nb=run, verdicts=one)
    assert cells[0]["points"] == 0.0
    assert cells[0]["reason"] == "one of the checks this cell calls never ran"
    cells, _ = grade.score_run(source_nb=source, run_nb=run, verdicts=one * 2)
    assert cells[0]["points"] == 2.0


def test_two_notebooks_keep_each_ones_flags_and_problems(tmp_path, fake):
    """The flags and the stop reasons of both notebooks reach the result, the first
    notebook's included."""
    course = _two_notebook_course(tmp_path, {"a.ipynb": WRONG, "b.ipynb": RIGHT})
    fake.problem = "the kernel died"
    result = grade.grade_task(_task(course))["result"]
    assert result["flags"] == [
        "checked: the notebook reported success but the grader's check did not pass",
        "the kernel died", "the kernel died"]
    assert result["reason"] == "the kernel died; the kernel died"
    assert result["score"] == 5.0


def test_a_course_in_utf8_is_read_and_written_as_utf8_whatever_the_locale(course, fake,
                                                                          monkeypatch):
    """On a machine whose locale is not UTF-8 (simulated: files opened without an
    encoding read and write Latin-1), the notebooks' non-ASCII text is still read and
    the graded run still written as UTF-8."""
    import io as io_module

    text = "Écrivez `double` : y = 2·x."
    _write(course.source / ASSIGNMENT / NOTEBOOK, _with_text(source_nb(), text))
    _write(course.release / ASSIGNMENT / NOTEBOOK, _with_text(release_nb(), text))
    real = io_module.text_encoding
    monkeypatch.setattr(io_module, "text_encoding",
                        lambda encoding, stacklevel=2: "latin-1" if encoding is None
                        else real(encoding))
    task = _task(course)
    assert text in task.notebooks[0].source and text in task.notebooks[0].release
    grade.write_graded(course, grade.grade_task(task))
    run = (course.autograded / "ada" / ASSIGNMENT / NOTEBOOK).read_bytes().decode("utf-8")
    assert nbformat.reads(run, as_version=4).cells[0].source == text


def _with_text(nb, text):
    nb.cells[0].source = text
    return nb


def test_a_scratch_folder_already_gone_does_not_crash_the_grading(course, fake):
    """Cleaning up the run's scratch folder is best effort: one that is gone (or cannot
    be removed) costs the student nothing."""
    fake.remove_workdir = True
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "graded" and result["score"] == 5.0


def test_a_changed_source_or_policy_makes_every_result_out_of_date(course, fake, engine,
                                                                   monkeypatch, tmp_path):
    """Results graded against an older source notebook (new hidden tests, other points)
    or an older policy are regraded, not skipped as current."""
    _grade_all(course, scale_timeouts=False)
    source = course.source / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(source, as_version=4)
    nb.cells[3].source += "\nassert double(0) == 0"
    nbformat.write(nb, source)
    fake.calls.clear()
    results, log = _grade_all(course, scale_timeouts=False)
    assert len(fake.calls) == 2
    assert log.splitlines()[0] == (
        "2 earlier result(s) are out of date (the hand-in, the source notebook, the policy "
        "or the checks changed): regraded")
    assert [r["graded_against"]["source_sha256"] for r in results] == [grade.sha256(source)] * 2
    policy = tmp_path / "ps.json"
    policy.write_text('{"cells": {"checked": {"forbidden": ["torch.mean"]}}}')
    monkeypatch.setattr(forbidden, "policy_path",
                        lambda assignment, *where: tmp_path / f"{assignment}.json")
    fake.calls.clear()
    results, log = _grade_all(course, scale_timeouts=False)
    assert len(fake.calls) == 2 and log.startswith("2 earlier result(s) are out of date")


# --- what the full grading run made of mutants that lived -------------------------------------

_RESULT_KEYS = {"student_id", "assignment", "score", "max_score", "status", "reason", "flags",
                "notes", "cells", "manual", "handin_sha256", "grader_version",
                "graded_against", "phases", "cell_seconds", "run_seconds", "seconds"}


def test_a_result_has_exactly_its_fields_whatever_its_status(tmp_path, fake):
    """The result is a record the gradebook, the reports and the LMS export read: no field
    more or less, graded or not."""
    course = make_course(tmp_path, handins={"ada": {NOTEBOOK: RIGHT}, "bob": {NOTEBOOK: b"{"}})
    graded = grade.grade_task(_task(course))["result"]
    invalid = grade.grade_task(_task(course, student="bob"))["result"]
    assert set(graded) == _RESULT_KEYS and graded["status"] == "graded"
    assert set(invalid) == _RESULT_KEYS and invalid["status"] == "invalid"
    assert invalid["cells"] == [] and invalid["score"] == 0.0


def test_a_later_notebook_missing_or_unreadable_keeps_the_earlier_ones_cells(tmp_path, fake):
    """Each notebook's cells are added to the result: a later notebook that was not handed
    in, or cannot be read, scores its own cells 0 (named by its notebook) and leaves the
    earlier notebook's points."""
    for b_file, reason in ((None, "b.ipynb was not handed in"),
                           (b"{", "b.ipynb: not a readable notebook: the file is not JSON")):
        files = {"a.ipynb": RIGHT} if b_file is None else {"a.ipynb": RIGHT, "b.ipynb": b_file}
        course = _two_notebook_course(tmp_path / str(b_file is None), files)
        result = grade.grade_task(_task(course))["result"]
        assert result["status"] == "graded" and result["score"] == 5.0
        assert [(c["notebook"], c["grade_id"], c["points"], c["reason"])
                for c in result["cells"]] == [
            ("a", "checked", 3.0, None), ("a", "plain", 2.0, None),
            ("b", "checked", 0.0, reason), ("b", "plain", 0.0, reason)]


def test_the_scan_knows_the_modules_the_instructor_s_cells_import(course, fake):
    """A module the instructor's cells import under another name is known by that name in
    the student's cells: replacing one of its functions is flagged."""
    for nb, folder in ((source_nb(), course.source), (release_nb(), course.release)):
        nb.cells[3].source = "import builtins as b\n" + nb.cells[3].source
        _write(folder / ASSIGNMENT / NOTEBOOK, nb)
    handin = handin_nb(RIGHT + "\nb.print = print")
    handin.cells[3].source = "import builtins as b\n" + handin.cells[3].source
    _write(course.submitted / "ada" / ASSIGNMENT / NOTEBOOK, handin)
    result = grade.grade_task(_task(course))["result"]
    assert [flag for flag in result["flags"] if "builtins.print" in flag] == [
        "Student cell 1 ('def double(x):') replaces builtins.print, an attribute of an "
        "imported module."]


def test_the_scoring_phase_is_rounded_to_the_millisecond(course, fake, monkeypatch):
    clock = Clock(100.0, 101.0, 102.0, 103.50049, 110.0)
    monkeypatch.setattr(grade, "time", clock)
    result = grade.grade_task(_task(course))["result"]
    assert result["phases"]["score"] == 1.5


def test_the_progress_bar_follows_the_terminal_and_redraws_once_a_second(course, fake, engine,
                                                                          monkeypatch):
    """On a terminal the bar takes the terminal's width as it changes (an instructor's
    window resized mid-class), and is redrawn at most once a second: a class of
    thousands over SSH must not spend its time drawing bars."""
    made = []

    class Bar(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    _grade_all(course, progress=Terminal())
    [kwargs] = made
    assert kwargs["dynamic_ncols"] is True and kwargs["mininterval"] == 1.0
    assert kwargs["disable"] is False


def test_the_hashes_graded_against_are_computed_once_per_run(course, fake, engine,
                                                            monkeypatch):
    """graded_against reads and hashes the source notebooks, the policy and the checks:
    once for the run, not again for the reference or for each hand-in."""
    calls = []
    real = grade.graded_against
    monkeypatch.setattr(grade, "graded_against",
                        lambda **kw: calls.append(kw) or real(**kw))
    results, _ = _grade_all(course)
    assert len(results) == 2 and len(calls) == 1
    against = real(course=course, assignment=ASSIGNMENT)
    assert all(r["graded_against"] == against for r in results)


def test_a_reference_that_loses_points_is_reported_in_the_run_s_log(course, fake, engine):
    """The reference's warning goes where the run's log goes, not to the terminal."""
    (course.source / ASSIGNMENT / NOTEBOOK).write_text(nbformat.writes(handin_nb(WRONG)))
    _, log = _grade_all(course)
    assert log.startswith("warning: the reference solution of ps scores 0 here (graded; ")


def test_a_source_cell_without_metadata_is_neither_graded_nor_a_crash():
    """A hand-edited instructor notebook may hold a cell with no metadata at all (nbformat
    only warns): it is no grade cell and no manual cell."""
    nb = source_nb()
    nb.cells.insert(2, nbformat.from_dict({"cell_type": "code", "source": "x = 1",
                                           "outputs": [], "execution_count": None}))
    assert grade.grade_cells(nb) == grade.grade_cells(source_nb())
    assert grade.manual_cells(nb) == grade.manual_cells(source_nb()) == [("why", 1.0)]


def test_a_plain_cell_before_a_checked_one_leaves_the_later_cells_scored():
    source = new_notebook(cells=[SCORED.cells[0], SCORED.cells[4], SCORED.cells[1]])
    cells, flags = grade.score_run(source_nb=source, run_nb=_run(), verdicts=GOOD)
    assert [(c["grade_id"], c["points"]) for c in cells] == [("plain", 3.0), ("mean", 2.0)]


def test_a_grade_cell_missing_from_the_run_scores_zero_without_a_crash():
    """A run notebook that lost a grade cell (a kernel that died mid-write, say) scores
    that cell 0: it did not run."""
    run = _run()
    run.cells = [c for c in run.cells if c.metadata["nbgrader"]["grade_id"] != "plain"]
    cells, _ = _score(run=run)
    assert cells["plain"]["points"] == 0.0 and cells["plain"]["kernel_ok"] is False
    assert cells["plain"]["reason"] == "the cell did not run"


def test_a_syntax_error_in_an_answer_explains_the_name_errors_after_it():
    """A SyntaxError in an answer cell means none of its code ran: the NameErrors of the
    grade cells after it say so first, in plain-assert cells and in checked cells whose
    checks passed before the cell raised."""
    run = _run(errors={"answer": ("SyntaxError", "invalid syntax (1)"),
                       "mean": ("NameError", "name 'f' is not defined"),
                       "plain": ("NameError", "name 'f' is not defined")})
    cells, _ = _score(run=run)
    expected = ("your cell answer has a SyntaxError (invalid syntax (1)), so none of its code "
                "ran: fix it first. Here that gave NameError: name 'f' is not defined")
    assert cells["plain"]["reason"] == expected and cells["plain"]["points"] == 0.0
    assert cells["mean"]["reason"] == expected and cells["mean"]["points"] == 0.0


def test_a_cell_calling_a_known_and_an_unknown_check_takes_its_verdicts():
    """With a check_* no probe defines among a cell's calls, the cell's verdicts stand for
    it: as many passing verdicts as calls, the known ones among them, earn the points."""
    source = new_notebook(cells=[
        SCORED.cells[0],
        new_code_cell("check_token_mean(m)\ncheck_mystery(x)",
                      metadata=_meta("mixed", grade=True, points=2))])
    run = nbformat.from_dict(json.loads(nbformat.writes(source)))
    for cell in run.cells:
        cell.execution_count, cell.outputs = 1, []
    verdicts = [Verdict("mixed", "token_mean", True, "ok")] * 2
    cells, flags = grade.score_run(source_nb=source, run_nb=run, verdicts=verdicts)
    assert [(c["grade_id"], c["points"], c["reason"]) for c in cells] == [("mixed", 2.0, None)]
    assert flags == []


def test_each_answer_is_known_by_the_digest_of_its_source():
    """What a person graded is pinned to the answer's text: the same text gives the
    same digest however the notebook stores it, a changed one another; a hand-in that
    is not a notebook gives none (never a crash)."""
    def handin(*sources):
        nb = new_notebook(cells=[new_markdown_cell(text) for text in sources])
        for cell, gid in zip(nb.cells, ("explain", "other"), strict=False):
            cell.metadata["nbgrader"] = {"grade_id": gid}
        return nbformat.writes(nb).encode()

    first = grade.answer_digests(handin("It cancels.", "x"))
    assert first["explain"] == hashlib.sha256(b"It cancels.").hexdigest()
    as_lines = json.loads(handin("It cancels.", "x"))
    as_lines["cells"][0]["source"] = ["It ", "cancels."]
    assert grade.answer_digests(json.dumps(as_lines).encode()) == first
    assert grade.answer_digests(handin("It cancels badly.", "x"))["explain"] != first["explain"]
    for broken in (b"not json", b"[1, 2]", b'{"cells": [3]}', None):
        assert grade.answer_digests(broken) == {}


def test_answer_digests_read_whatever_a_hand_in_cell_holds():
    """A cell without metadata, or metadata without nbgrader, is no answer and leaves the
    others known; an answer without a source is the empty answer; a source JSON could
    hold but UTF-8 cannot (a lone surrogate) still has a digest."""
    cells = [{"cell_type": "markdown", "source": "intro"},
             {"cell_type": "markdown", "metadata": {}, "source": "more"},
             {"cell_type": "markdown", "metadata": {"nbgrader": {"grade_id": "empty"}}},
             {"cell_type": "markdown", "metadata": {"nbgrader": {"grade_id": "odd"}},
              "source": "half \ud800 a pair"},
             {"cell_type": "markdown", "metadata": {"nbgrader": {"grade_id": "plain"}},
              "source": "It cancels."}]
    found = grade.answer_digests(json.dumps({"cells": cells}).encode())
    assert found == {
        "empty": hashlib.sha256(b"").hexdigest(),
        "odd": hashlib.sha256("half \ud800 a pair".encode("utf-8", "replace")).hexdigest(),
        "plain": hashlib.sha256(b"It cancels.").hexdigest()}


def test_a_task_is_never_left_blank_and_only_its_own_id_makes_it_one():
    """A hand-graded answer left as released scores 0 with nothing to grade; a task
    (nbgrader's "task" cell, which a person reads in the notebook) never does, and one
    task does not make another cell a task."""
    source = new_notebook(cells=[new_markdown_cell("Describe."), new_markdown_cell("Why?")])
    source.cells[0].metadata["nbgrader"] = {"grade_id": "describe", "task": True}
    source.cells[1].metadata["nbgrader"] = {"grade_id": "why", "solution": True}
    released = {"describe": "r1", "why": "r2"}
    assert grade._left_blank(source, "describe", {"describe": "r1"}, released) is False
    assert grade._left_blank(source, "describe", {}, released) is False
    assert grade._left_blank(source, "why", {"why": "r2"}, released) is True
    assert grade._left_blank(source, "why", {}, released) is True
    assert grade._left_blank(source, "why", {"why": "written"}, released) is False


def test_an_answer_a_person_grades_is_blank_only_when_left_as_released(course, fake):
    """Stock nbgrader scores a hand-graded answer 0, with nothing to grade, when its
    checksum is unchanged; an answer the student wrote waits for a person, and a
    hand-in of the wrong notebook has nothing to grade by hand at all."""
    path = course.submitted / "ada" / ASSIGNMENT / NOTEBOOK
    nb = nbformat.read(path, as_version=4)
    (why,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "why"]
    why.source = "Because the mean is large next to the spread."
    nbformat.write(nb, path)
    (entry,) = grade.grade_task(_task(course))["result"]["manual"]
    assert entry["blank"] is False and entry["points"] is None
    path.write_bytes(b"not a notebook")
    result = grade.grade_task(_task(course))["result"]
    assert result["status"] == "invalid" and result["manual"][0]["blank"] is True
