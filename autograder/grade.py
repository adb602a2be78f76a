"""Grade every hand-in of an assignment: rebuild, run sandboxed, score, report.

Each hand-in is graded in its own process with its own check server and
writes one result file, atomically, to autograded/<student>/<assignment>/.
A run that is killed and started again skips the students whose result
matches their hand-in's hash, so nobody is graded twice or lost; a hand-in
that cannot be graded gets a result with a status and a reason.
"""

import ast
import ctypes
import functools
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import zlib
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat

from autograder import forbidden
from autograder.merge import merge_handin
from autograder.runner import RunSettings, run_notebook

RESULT_FILE = "result.json"
GRADER_VERSION = 1
_PR_SET_PDEATHSIG = 1


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _nbgrader(cell):
    return cell.get("metadata", {}).get("nbgrader", {})


@functools.cache
def check_names_of_probes():
    """{probe function: check name}, e.g. check_layer_norm_token -> layer_norm_token.

    Read from normref's probe modules: a probe `check_x` runs run_check("name", ...),
    and the grader's log records "name". Knowing which names a grade cell calls
    keeps a verdict for some other check (one the student passes) from counting.
    """
    import normref.checks

    names = {}
    for path in Path(normref.checks.__file__).parent.glob("*_probes.py"):
        for func in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(func, ast.FunctionDef) and func.name.startswith("check_")):
                continue
            for node in ast.walk(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "run_check" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    names[func.name] = node.args[0].value
    return names


def grade_cells(source_nb):
    """[(grade_id, points, checks)] for autograded cells.

    checks: the name of each check the cell's code calls, in order (None for a
    check_* function no probe module defines).
    """
    probes = check_names_of_probes()
    cells = []
    for cell in source_nb.cells:
        meta = _nbgrader(cell)
        if cell.cell_type == "code" and meta.get("grade") and meta.get("points"):
            checks = []
            try:
                for node in ast.walk(ast.parse(cell.source)):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                            and node.func.id.startswith("check_")):
                        checks.append(probes.get(node.func.id))
            except SyntaxError:
                pass
            cells.append((meta["grade_id"], float(meta["points"]), tuple(checks)))
    return cells


def find_handin(folder, notebook_name):
    """(path, note): the hand-in in `folder`, tolerating one wrongly named notebook."""
    exact = folder / notebook_name
    if exact.is_file():
        return exact, None
    others = sorted(p for p in folder.glob("*.ipynb") if p.is_file())
    if len(others) == 1:
        return others[0], f"the notebook was named {others[0].name}, not {notebook_name}"
    return None, None


def _cell_errors(cell):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _split_verdicts(logged, expected_checks):
    """(verdicts of the checks the cell calls, verdicts of any other check)."""
    if None in expected_checks:  # a check we cannot name: take every verdict
        return logged, []
    ours = [v for v in logged if v.check in expected_checks]
    return ours, [v for v in logged if v.check not in expected_checks]


def score_run(*, source_nb, run_nb, verdicts, violations):
    """Score each grade cell from the grader's verdict log (never from the kernel).

    A cell earns its points when every check it calls left a verdict, logged
    while it ran, and all of them passed; verdicts of checks it does not call
    count for nothing and flag the hand-in.
    """
    by_id = {_nbgrader(c).get("grade_id"): c for c in run_nb.cells if _nbgrader(c)}
    cells, flags = [], []
    for gid, points, expected_checks in grade_cells(source_nb):
        logged, foreign = _split_verdicts([v for v in verdicts if v.cell == gid],
                                          expected_checks)
        if foreign:
            flags.append(f"{gid}: the checks {sorted({v.check for v in foreign})} ran while "
                         "this cell ran, which it does not call")
        cell = by_id.get(gid, {})
        errors = _cell_errors(cell)
        # A cell the kernel never ran (it died first) reported nothing at all.
        kernel_ok = cell.get("execution_count") is not None and not errors
        checks_ok = (bool(logged) and len(logged) >= len(expected_checks)
                     and set(expected_checks) <= {v.check for v in logged} | {None}
                     and all(v.passed for v in logged))
        reason = None
        if gid in violations:
            reason = "uses " + ", ".join(violations[gid]) + ", which this exercise forbids"
        elif not logged and errors:
            # A visible test failed before the hidden check could run: say which.
            reason = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"[:500]
        elif not logged:
            reason = "the grader's check never ran for this cell"
        elif not checks_ok:
            reason = next(v.message for v in logged if not v.passed)
        elif not kernel_ok:
            reason = f"{errors[0].get('ename')}: {errors[0].get('evalue')}"[:500]
        earned = points if reason is None else 0.0
        if kernel_ok and not checks_ok:
            flags.append(f"{gid}: the notebook reported success but the grader's check "
                         "did not pass")
        cells.append({
            "grade_id": gid, "points": earned, "max_points": points, "kernel_ok": kernel_ok,
            "reason": reason,
            "checks": [{"check": v.check, "passed": v.passed, "message": v.message}
                       for v in logged],
        })
    return cells, flags


def _student_code(merged_nb):
    student, context = [], []
    for cell in merged_nb.cells:
        if cell.cell_type != "code":
            continue
        meta = _nbgrader(cell)
        (student if (meta.get("solution") or not meta) else context).append(cell.source)
    return student, context


def _check_cells(nb):
    """Raise ValueError unless `nb` is a list of cells, each with a kind and text.

    nbformat only warns about a broken structure; the merge needs these.
    """
    if not isinstance(nb.get("cells"), list):
        raise ValueError("it has no list of cells")
    for index, cell in enumerate(nb.cells):
        if not (isinstance(cell, dict) and cell.get("cell_type") in ("code", "markdown", "raw")
                and isinstance(cell.get("source"), str)):
            raise ValueError(f"cell {index} is not a code, markdown or raw cell with text")


def _write_json_atomically(path, data):
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def grade_one(*, course, assignment, student, settings):
    """Grade one student's hand-in; always returns (and writes) a result dict."""
    started = time.monotonic()
    source_nb = nbformat.read(course.source_notebook(assignment), as_version=4)
    release_nb = nbformat.read(course.release_notebook(assignment), as_version=4)
    max_score = sum(points for _, points, _ in grade_cells(source_nb))
    out_dir = course.autograded / student / assignment
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"student_id": student, "assignment": assignment, "score": 0.0,
              "max_score": max_score, "status": "graded", "reason": "", "flags": [],
              "notes": [], "cells": [], "handin_sha256": None,
              "grader_version": GRADER_VERSION}
    handin, name_note = find_handin(course.submitted / student / assignment,
                                    course.notebook_name(assignment))
    if name_note:
        result["notes"].append(name_note)
    if handin is None:
        result.update(status="missing", reason="no notebook was handed in")
    else:
        result["handin_sha256"] = sha256(handin)
        try:
            handin_nb = nbformat.reads(handin.read_text(encoding="utf-8"), as_version=4)
            _check_cells(handin_nb)
        except Exception as exc:  # any unreadable file is a result, not a crash
            result.update(status="invalid",
                          reason=f"not a readable notebook: {type(exc).__name__}: {exc}"[:500])
        else:
            _grade_notebook(result, source_nb=source_nb, release_nb=release_nb,
                            handin_nb=handin_nb, out_dir=out_dir, settings=settings,
                            assignment=assignment, student=student,
                            notebook_name=course.notebook_name(assignment),
                            course_root=course.root)
    result["score"] = sum(c["points"] for c in result["cells"])
    result["seconds"] = round(time.monotonic() - started, 2)
    _write_json_atomically(out_dir / RESULT_FILE, result)
    return result


def _grade_notebook(result, *, source_nb, release_nb, handin_nb, out_dir, settings,
                    assignment, student, notebook_name, course_root):
    merged, notes = merge_handin(source_nb=source_nb, release_nb=release_nb,
                                 handin_nb=handin_nb)
    result["notes"].extend(notes)
    student_code, context_code = _student_code(merged)
    found = forbidden.violations(
        forbidden.load_policy(assignment), student_code, context_code=context_code,
        grade_ids=[gid for gid, _, _ in grade_cells(source_nb)])
    scratch = Path(tempfile.mkdtemp(prefix="grade-"))
    try:
        seed = zlib.crc32(f"{student}/{assignment}".encode())
        run = run_notebook(merged, workdir=scratch / "work", settings=settings, seed=seed,
                           hidden=[course_root])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    nbformat.write(run.notebook, out_dir / notebook_name)
    result["cells"], result["flags"] = score_run(
        source_nb=source_nb, run_nb=run.notebook, verdicts=run.verdicts, violations=found)
    if run.problem:
        result["reason"] = run.problem
        result["flags"].append(run.problem)
    result["run_seconds"] = round(run.seconds, 2)


def is_current(result_path, handin_sha):
    """True when a result on disk was made from this very hand-in."""
    try:
        data = json.loads(result_path.read_text())
    except (OSError, ValueError):
        return False
    return (data.get("handin_sha256") == handin_sha
            and data.get("grader_version") == GRADER_VERSION)


def _already_graded(course, assignment, student):
    handin, _ = find_handin(course.submitted / student / assignment,
                            course.notebook_name(assignment))
    digest = sha256(handin) if handin else None
    return is_current(course.autograded / student / assignment / RESULT_FILE, digest)


def grade_assignment(*, course, assignment, settings=None, workers=None, force=False,
                     progress=sys.stderr):
    """Grade everyone who handed in `assignment`; returns their results.

    workers: parallel hand-ins (default: the number of cores); force: regrade
    students whose result is already current.
    """
    settings = settings or RunSettings()
    workers = workers or os.cpu_count() or 1
    students = course.students(assignment)
    todo = [s for s in students if force or not _already_graded(course, assignment, s)]
    started = time.monotonic()
    done = len(students) - len(todo)
    if done:
        print(f"{done} of {len(students)} already graded (unchanged hand-ins): skipped",
              file=progress)
    with ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(grade_one, course=course, assignment=assignment, student=s,
                               settings=settings): s for s in todo}
        for future in as_completed(futures):
            student = futures[future]
            done += 1
            try:
                r = future.result()
                line = f"{r['score']:g}/{r['max_score']:g} {r['status']} ({r['seconds']:.1f} s)"
            except Exception as exc:  # a worker crash is one student's problem
                _record_crash(course, assignment, student, exc)
                line = f"grader error: {exc}"
            print(f"[{done}/{len(students)}] {student}: {line}", file=progress, flush=True)
    results = load_results(course, assignment)
    flagged = sum(1 for r in results if r["flags"])
    failed = sum(1 for r in results if r["status"] != "graded")
    print(f"graded {len(results) - failed}, failed {failed}, flagged {flagged}, "
          f"in {time.monotonic() - started:.1f} s with {workers} workers", file=progress)
    return results


def _start_worker(grader_pid):
    """Pool worker initializer: die with the grader, and load the judges now."""
    _die_with_the_grader(grader_pid)
    # normref's judges import torch: seconds, many more on a busy machine. Loaded
    # here, that is not charged to the first student's cell timeout.
    from normref.checks import _registry

    _registry.check_names()


def _die_with_the_grader(grader_pid):
    """Die when the grading process dies.

    A worker outlives a killed grader by default and would go on grading its
    student, and write the result, while a restarted run grades them too.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl (not Linux): nothing to arm
        return
    if os.getppid() != grader_pid:  # the grader died before prctl took effect
        os._exit(1)


def _record_crash(course, assignment, student, exc):
    out_dir = course.autograded / student / assignment
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json_atomically(out_dir / RESULT_FILE, {
        "student_id": student, "assignment": assignment, "score": 0.0, "max_score": 0.0,
        "status": "error", "reason": f"grader error: {type(exc).__name__}: {exc}"[:500],
        "flags": ["grader error"], "notes": [], "cells": [], "handin_sha256": None,
        "grader_version": GRADER_VERSION})


def load_results(course, assignment):
    """Every submitted student's result, in student order (missing ones marked)."""
    results = []
    for student in course.students(assignment):
        path = course.autograded / student / assignment / RESULT_FILE
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            results.append({"student_id": student, "assignment": assignment, "score": 0.0,
                            "max_score": 0.0, "status": "ungraded",
                            "reason": "no grading result yet", "flags": [], "notes": [],
                            "cells": []})
    return results

