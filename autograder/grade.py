"""Grade every hand-in of an assignment: rebuild, run sandboxed, score, report.

Each hand-in is graded in its own process with its own check server and
writes one result file, atomically, to autograded/<student>/<assignment>/.
A run that is killed and started again skips the students whose result
matches their hand-in's hash, so nobody is graded twice or lost; a hand-in
that cannot be graded gets a result with a status and a reason.

Results belong to the grader: each is signed with an HMAC whose key lives
outside the course (`grader_key`), and a result whose signature does not
verify is never trusted: it is regraded and the new result is flagged.
"""

import ast
import ctypes
import functools
import hashlib
import hmac
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import nbformat

from autograder import forbidden
from autograder.merge import merge_handin
from autograder.runner import RunSettings, run_notebook

RESULT_FILE = "result.json"
GRADER_VERSION = 2
KEY_ENV = "AUTOGRADER_KEY_FILE"
_PR_SET_PDEATHSIG = 1
_UNVERIFIED_FLAG = ("the result file on disk did not carry the grader's signature: "
                    "it was regraded")


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


def _error_reason(error):
    return f"{error.get('ename')}: {error.get('evalue')}"[:500]


def score_run(*, source_nb, run_nb, verdicts, policy=None, refusals=()):
    """Score each grade cell from the grader's verdict log (never from the kernel).

    A cell earns its points when every check it calls left a verdict, logged
    while it ran, and all of them passed, the cell raised no error, and the
    student's code executed nothing the cell's policy forbids (policy:
    {grade_id: [forbidden patterns]}). Verdicts of checks a cell does not
    call, refused requests and a recorder the hand-in tampered with count for
    nothing and flag the hand-in.
    """
    policy = policy or {}
    by_id = {_nbgrader(c).get("grade_id"): c for c in run_nb.cells if _nbgrader(c)}
    cells, flags = [], []
    for (cell_id, check, why), count in Counter(
            (r.cell, r.check, r.why) for r in refusals).items():
        times = f", {count} times" if count > 1 else ""
        flags.append(f"{cell_id}: the check server refused a request for {check} "
                     f"({why}{times})")
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
        executed = sorted({name for v in logged for name in v.executed})
        used = forbidden.executed_violations(policy.get(gid, []), executed)
        tampered = any(not v.recorder_intact for v in logged)
        reason = None
        if used:
            reason = ("while the grader called your code, it used " + ", ".join(used)
                      + ", which this exercise forbids")
        elif tampered:
            reason = "your code disturbed the grader's record of what it executed"
            flags.append(f"{gid}: the hand-in tampered with the grader's call recorder")
        elif not logged and errors:
            # A visible test failed before the hidden check could run: say which.
            reason = _error_reason(errors[0])
        elif not logged:
            reason = "the grader's check never ran for this cell"
        elif not checks_ok:
            failed = [v.message for v in logged if not v.passed]
            reason = failed[0] if failed else "one of the checks this cell calls never ran"
        elif not kernel_ok:
            reason = (_error_reason(errors[0]) if errors
                      else "the cell did not finish running")
        earned = points if reason is None else 0.0
        if kernel_ok and not checks_ok:
            flags.append(f"{gid}: the notebook reported success but the grader's check "
                         "did not pass")
        cells.append({
            "grade_id": gid, "points": earned, "max_points": points, "kernel_ok": kernel_ok,
            "reason": reason, "executed_forbidden": used,
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


class _NotCells(ValueError):
    """A notebook whose cells the merge cannot read."""


def _check_cells(nb):
    """Raise _NotCells unless `nb` is a list of cells, each with a kind and text.

    nbformat only warns about a broken structure; the merge needs these.
    """
    if not isinstance(nb.get("cells"), list):
        raise _NotCells("it has no list of cells")
    for index, cell in enumerate(nb.cells):
        if not (isinstance(cell, dict) and cell.get("cell_type") in ("code", "markdown", "raw")
                and isinstance(cell.get("source"), str)):
            raise _NotCells(f"cell {index} is not a code, markdown or raw cell with text")


def grader_key():
    """The HMAC key that signs results: $AUTOGRADER_KEY_FILE, or a file in the
    grading user's config folder, made on first use. Never inside the course,
    so nothing a hand-in or a copied course folder holds can sign a result."""
    path = Path(os.environ.get(KEY_ENV) or
                Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
                / "layernorm-course" / "grader.key")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
    return path.read_bytes()


def _signature(data, key):
    body = json.dumps({k: v for k, v in data.items() if k != "signature"}, sort_keys=True)
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sign(data, key=None):
    """`data` with its HMAC signature added."""
    return {**data, "signature": _signature(data, key or grader_key())}


def read_verified(path, key=None):
    """The result at `path` if its signature verifies; None if absent or unreadable;
    raises ValueError if it is there but forged or altered."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not hmac.compare_digest(
            str(data.get("signature", "")), _signature(data, key or grader_key())):
        raise ValueError(f"{path} does not carry the grader's signature")
    return data


def _write_json_atomically(path, data):
    """Write through a fresh temporary file beside `path`, then rename it in place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _invalid_reason(exc):
    """Why a file is not a notebook, without quoting a byte of it."""
    if isinstance(exc, UnicodeDecodeError):
        return "not a readable notebook: the file is not UTF-8 text"
    if isinstance(exc, _NotCells):
        return f"not a readable notebook: {exc}"
    if isinstance(exc, ValueError) and type(exc).__name__ in ("NotJSONError", "JSONDecodeError"):
        return "not a readable notebook: the file is not JSON"
    return f"not a readable notebook: it is not in Jupyter's notebook format ({type(exc).__name__})"


def grade_one(*, course, assignment, student, settings, unverified=False):
    """Grade one student's hand-in; always returns (and writes) a signed result.

    unverified: the result this one replaces failed verification (flagged).
    """
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
            result.update(status="invalid", reason=_invalid_reason(exc))
        else:
            _grade_notebook(result, source_nb=source_nb, release_nb=release_nb,
                            handin_nb=handin_nb, out_dir=out_dir, settings=settings,
                            assignment=assignment, student=student,
                            notebook_name=course.notebook_name(assignment),
                            course_root=course.root)
    if unverified:
        result["flags"].append(_UNVERIFIED_FLAG)
    result["score"] = sum(c["points"] for c in result["cells"])
    result["seconds"] = round(time.monotonic() - started, 2)
    result = sign(result)
    _write_json_atomically(out_dir / RESULT_FILE, result)
    return result


def _grade_notebook(result, *, source_nb, release_nb, handin_nb, out_dir, settings,
                    assignment, student, notebook_name, course_root):
    merged, notes = merge_handin(source_nb=source_nb, release_nb=release_nb,
                                 handin_nb=handin_nb)
    result["notes"].extend(notes)
    student_code, context_code = _student_code(merged)
    policy = forbidden.load_policy(assignment)
    cells = grade_cells(source_nb)
    scratch = Path(tempfile.mkdtemp(prefix="grade-"))
    try:
        seed = zlib.crc32(f"{student}/{assignment}".encode())
        run = run_notebook(merged, workdir=scratch, settings=settings, seed=seed,
                           cell_checks={gid: checks for gid, _, checks in cells},
                           record_cells=[gid for gid in policy if policy[gid]],
                           hidden=[course_root])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    nbformat.write(run.notebook, out_dir / notebook_name)
    result["cells"], result["flags"] = score_run(
        source_nb=source_nb, run_nb=run.notebook, verdicts=run.verdicts, policy=policy,
        refusals=run.refusals)
    result["flags"].extend(forbidden.static_flags(student_code, context_code=context_code))
    if run.problem:
        result["reason"] = run.problem
        result["flags"].append(run.problem)
    result["run_seconds"] = round(run.seconds, 2)


def result_state(result_path, handin_sha):
    """"current" (a verified result of this very hand-in), "stale" (none, or of
    another hand-in or grader version) or "unverified" (forged or altered)."""
    try:
        data = read_verified(result_path)
    except ValueError:
        return "unverified"
    if (data is not None and data.get("handin_sha256") == handin_sha
            and data.get("grader_version") == GRADER_VERSION):
        return "current"
    return "stale"


def _result_state(course, assignment, student):
    handin, _ = find_handin(course.submitted / student / assignment,
                            course.notebook_name(assignment))
    digest = sha256(handin) if handin else None
    return result_state(course.autograded / student / assignment / RESULT_FILE, digest)


def grade_assignment(*, course, assignment, settings=None, workers=None, force=False,
                     progress=sys.stderr):
    """Grade everyone who handed in `assignment`; returns their results.

    workers: parallel hand-ins (default: the number of cores); force: regrade
    students whose result is already current.
    """
    settings = settings or RunSettings()
    workers = workers or os.cpu_count() or 1
    grader_key()  # made once here, not by racing workers
    students = course.students(assignment)
    states = {s: _result_state(course, assignment, s) for s in students}
    todo = [s for s in students if force or states[s] != "current"]
    started = time.monotonic()
    done = len(students) - len(todo)
    if done:
        print(f"{done} of {len(students)} already graded (unchanged hand-ins): skipped",
              file=progress)
    with ProcessPoolExecutor(max_workers=workers, initializer=_start_worker,
                             initargs=(os.getpid(),)) as pool:
        futures = {pool.submit(grade_one, course=course, assignment=assignment, student=s,
                               settings=settings, unverified=states[s] == "unverified"): s
                   for s in todo}
        for future in as_completed(futures):
            student = futures[future]
            done += 1
            try:
                r = future.result()
                line = f"{r['score']:g}/{r['max_score']:g} {r['status']} ({r['seconds']:.1f} s)"
            except Exception as exc:  # a worker crash is one student's problem
                line = f"grader error: {type(exc).__name__}: {exc}"[:300]
                try:
                    _record_crash(course, assignment, student, exc)
                except Exception as write_error:  # noqa: BLE001 - nor is a failed write
                    line += f" (and its result could not be written: {write_error})"[:300]
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
    _write_json_atomically(out_dir / RESULT_FILE, sign({
        "student_id": student, "assignment": assignment, "score": 0.0, "max_score": 0.0,
        "status": "error", "reason": f"grader error: {type(exc).__name__}: {exc}"[:500],
        "flags": ["grader error"], "notes": [], "cells": [], "handin_sha256": None,
        "grader_version": GRADER_VERSION}))


def load_results(course, assignment):
    """Every submitted student's result, in student order (missing ones marked)."""
    results = []
    for student in course.students(assignment):
        path = course.autograded / student / assignment / RESULT_FILE
        try:
            data = read_verified(path)
            reason = "no grading result yet"
        except ValueError:
            data, reason = None, "the result file failed verification: grade again"
        if data is None:
            data = {"student_id": student, "assignment": assignment, "score": 0.0,
                    "max_score": 0.0, "status": "ungraded", "reason": reason,
                    "flags": [reason] if "verification" in reason else [], "notes": [],
                    "cells": []}
        results.append(data)
    return results

