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
import dataclasses
import functools
import hashlib
import hmac
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.grading import forbidden, inert, merge, sandbox
from autograder.grading.merge import merge_handin
from autograder.grading.runner import RunSettings, run_notebook

RESULT_FILE = "result.json"
GRADER_VERSION = 2
KEY_ENV = "AUTOGRADER_KEY_FILE"
_UNVERIFIED_FLAG = ("the result file on disk did not carry the grader's signature: "
                    "it was regraded")
UNSANDBOXED_FLAG = ("graded without the sandbox (--no-sandbox): the hand-in's code could "
                    "reach the network and this machine's files")


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here, and the instructor did not say --no-sandbox."""


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
    check_* function no probe module defines). A check_* name the cell defines itself,
    or imports from anywhere but normref.checks, is a helper of the cell, not a check.
    """
    probes = check_names_of_probes()
    cells = []
    for cell in source_nb.cells:
        meta = _nbgrader(cell)
        if (cell.cell_type == "code" and meta.get("grade") and meta.get("points")
                and not meta.get("solution")):
            try:
                tree = ast.parse(cell.source)
            except SyntaxError:
                tree = ast.Module(body=[], type_ignores=[])
            helpers = _own_names(tree)
            checks = [probes.get(node.func.id) for node in ast.walk(tree)
                      if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                      and node.func.id.startswith("check_") and node.func.id not in helpers]
            cells.append((meta["grade_id"], float(meta["points"]), tuple(checks)))
    return cells


def _own_names(tree):
    """Names a cell binds itself: functions and classes it defines, names it assigns,
    and names it imports from anywhere but normref.checks."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "normref.checks":
            names.update(a.asname or a.name for a in node.names)
    return names


_SHARED_CHECK_FILES = ("__init__.py", "_registry.py", "_runner.py", "_wire.py",
                       "tolerances.py")


def _check_files(check_names):
    """The source files that decide what the named checks accept: the shared check
    machinery, each check's judge and probe modules, and the normref modules the
    judges import (the references)."""
    import inspect
    import types

    import normref
    import normref.checks
    from normref.checks import _registry

    package_dir = Path(normref.__file__).parent
    checks_dir = Path(normref.checks.__file__).parent
    files = {checks_dir / name for name in _SHARED_CHECK_FILES}
    known = _registry._all_checks()
    for name in check_names:
        if name not in known:
            continue
        judges = inspect.getmodule(known[name].judge)
        files.add(Path(judges.__file__))
        probes = checks_dir / Path(judges.__file__).name.replace("_judges", "_probes")
        if probes.exists():
            files.add(probes)
        for value in vars(judges).values():
            module = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
            path = getattr(module, "__file__", None)
            if path and Path(path).is_relative_to(package_dir):
                files.add(Path(path))
    return sorted(files)


def graded_against(*, course, assignment):
    """What a result depends on besides the hand-in: the hashes of the source
    notebook (hidden tests, points), of the forbidden-call policy, and of the checks
    its cells call. A change to any of them makes old results stale."""
    sources = [course.source / assignment / name for name in course.notebook_names(assignment)]
    names = sorted({c for source in sources
                    for _, _, checks in grade_cells(nbformat.read(source, as_version=4))
                    for c in checks if c})
    digest = hashlib.sha256()
    for path in _check_files(names):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    policy = forbidden.policy_path(assignment)
    return {"source_sha256": handin_digest([(p.name, p) for p in sources]),
            "policy_sha256": sha256(policy) if policy.exists() else None,
            "checks_sha256": digest.hexdigest()}


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


def _error_reason(error, syntax_errors=()):
    """The error, and when it is a NameError that an earlier answer cell's syntax
    error explains (its code never ran), that error first."""
    reason = f"{error.get('ename')}: {error.get('evalue')}"
    if error.get("ename") == "NameError" and syntax_errors:
        gid, cause = _defining_cell(error, syntax_errors)
        reason = (f"your cell {gid} has a {cause.get('ename')} ({cause.get('evalue')}), so "
                  f"none of its code ran: fix it first. Here that gave {reason}")
    return reason[:500]


def _defining_cell(error, syntax_errors):
    """(grade id, error) of the broken answer cell whose code would have defined the
    missing name, else of the first broken one: with several broken cells the first
    is the one to fix first."""
    found = re.search(r"name '(\w+)' is not defined", str(error.get("evalue", "")))
    if found:
        pattern = re.compile(rf"^\s*(def|class)\s+{found[1]}\b|^\s*{found[1]}\s*=", re.M)
        for gid, cause, source in syntax_errors:
            if pattern.search(source):
                return gid, cause
    gid, cause, _ = syntax_errors[0]
    return gid, cause


def _syntax_errors_before(run_nb):
    """{grade_id: [(answer cell id, its error, its source)]}: the syntax errors of the answer
    cells that ran before each grade cell."""
    seen, before = [], {}
    for cell in run_nb.cells:
        meta = _nbgrader(cell)
        for error in _cell_errors(cell):
            if error.get("ename") in ("SyntaxError", "IndentationError", "TabError"):
                seen.append((meta.get("grade_id") or "(one of yours)", error,
                             "".join(cell.get("source", ""))))
        if meta.get("grade_id"):
            before[meta["grade_id"]] = list(seen)
    return before


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
    syntax = _syntax_errors_before(run_nb)
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
        if not expected_checks:
            cells.append(_score_in_kernel(gid, points, cell, syntax.get(gid, ())))
            continue
        errors = _cell_errors(cell)
        # A cell the kernel never ran (it died first) reported nothing at all.
        kernel_ok = cell.get("execution_count") is not None and not errors
        checks_ok = (bool(logged) and len(logged) >= len(expected_checks)
                     and set(expected_checks) <= {v.check for v in logged} | {None}
                     and all(v.passed for v in logged))
        executed = sorted({name for v in logged for name in v.executed})
        used = forbidden.executed_violations(policy.get(gid, []), executed)
        tampered = any(not v.recorder_intact for v in logged)
        unseen = forbidden.unrecordable_ops(executed) if policy.get(gid) else []
        reason = None
        if used:
            reason = ("while the grader called your code, it used " + ", ".join(used)
                      + ", which this exercise forbids")
        elif unseen:
            reason = ("while the grader called your code, it ran " + ", ".join(unseen)
                      + ": an operator registered outside torch, inside which the grader "
                      "cannot see whether this exercise's rule was kept")
            flags.append(f"{gid}: the hand-in ran operators registered outside torch "
                         f"({', '.join(unseen)})")
        elif tampered:
            reason = "your code disturbed the grader's record of what it executed"
            flags.append(f"{gid}: the hand-in tampered with the grader's call recorder")
        elif not logged and errors:
            # A visible test failed before the hidden check could run: say which.
            reason = _error_reason(errors[0], syntax.get(gid, ()))
        elif not logged:
            reason = "the grader's check never ran for this cell"
        elif not checks_ok:
            failed = [v.message for v in logged if not v.passed]
            reason = (failed[0] if failed
                      else _error_reason(errors[0], syntax.get(gid, ())) if errors
                      else "one of the checks this cell calls never ran")
        elif not kernel_ok:
            reason = (_error_reason(errors[0], syntax.get(gid, ())) if errors
                      else "the cell did not finish running")
        earned = points if reason is None else 0.0
        if kernel_ok and not checks_ok:
            flags.append(f"{gid}: the notebook reported success but the grader's check "
                         "did not pass")
        cells.append({
            "grade_id": gid, "points": earned, "max_points": points, "kernel_ok": kernel_ok,
            "reason": reason, "executed_forbidden": used, "checked": "by the grader",
            "checks": [{"check": v.check, "passed": v.passed, "message": v.message}
                       for v in logged],
        })
    return cells, flags


IN_KERNEL = "inside the student's kernel"


def _score_in_kernel(gid, points, cell, syntax_errors=()):
    """A grade cell of plain asserts (it calls no trusted check), scored the way
    `nbgrader autograde` scores it: no points if it raised, the number it returned as
    partial credit (nbgrader's reading of it), else every point. Two differences:
    output on stderr (a warning, a debug print) costs nothing, and a returned number
    above the cell's points scores 0 with a reason (nbgrader stops with an error).
    Its verdict comes from the student's own kernel, so a hand-in could forge it; it
    never flags anyone."""
    from nbgrader.utils import get_partial_grade

    ran = cell.get("execution_count") is not None
    earned, reason = points, None
    errors = _cell_errors(cell)
    results = [o for o in cell.get("outputs", []) if o.get("output_type") == "execute_result"]
    if not ran:
        earned, reason = 0.0, "the cell did not run"
    elif errors:
        earned, reason = 0.0, _error_reason(errors[0], syntax_errors)
    elif results and results[0].get("data", {}).get("text/plain"):
        try:
            earned = float(get_partial_grade(results[0], points))
        except ValueError:
            earned, reason = 0.0, (f"the cell returned a number above its {points:g} "
                                   "points, which cannot be a score")
        else:
            if earned < points:
                reason = f"the cell returned {earned:g} of {points:g} points"
    return {"grade_id": gid, "points": earned, "max_points": points, "kernel_ok": ran,
            "reason": reason, "executed_forbidden": [], "checked": IN_KERNEL, "checks": []}


def manual_cells(source_nb):
    """[(grade_id, points)] for the cells a person grades in the formgrader: graded
    answer cells (markdown, or code marked both solution and grade) and tasks."""
    cells = []
    for cell in source_nb.cells:
        meta = _nbgrader(cell)
        if meta.get("points") and (meta.get("task") or meta.get("grade") and (
                cell.cell_type == "markdown" or meta.get("solution"))):
            cells.append((meta["grade_id"], float(meta["points"])))
    return cells


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
    # Bytes, not str: compare_digest refuses a str holding anything but ASCII.
    if not isinstance(data, dict) or not hmac.compare_digest(
            str(data.get("signature", "")).encode(),
            _signature(data, key or grader_key()).encode()):
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


@dataclass(frozen=True)
class NotebookPart:
    """One notebook of an assignment: its name, the student's bytes (None when not
    handed in), and the source and release notebooks' JSON."""

    name: str
    handin: bytes | None
    source: str
    release: str


@dataclass(frozen=True)
class HandinTask:
    """Everything one hand-in's grading needs, so that any worker can grade it with
    no shared file system: the hand-in's bytes, the source and release notebooks,
    the policy and the settings. A worker reads no course file and writes none."""

    student: str
    assignment: str
    notebooks: tuple  # NotebookPart, one per notebook of the assignment
    name_note: str | None
    policy: dict
    other_assignments: dict  # {assignment: [grade ids]}, to name a wrong notebook
    settings: RunSettings
    against: dict
    unverified: bool = False
    hidden: tuple = ()  # folders of the client's machine the kernel must not see


def handin_files(course, assignment, student):
    """([(notebook name, path or None)], note): the hand-in's file for each of the
    assignment's notebooks. A one-notebook assignment tolerates one wrongly named
    notebook (with a note); with several, each must carry its own name."""
    folder = course.submitted / student / assignment
    names = course.notebook_names(assignment)
    if len(names) == 1:
        path, note = find_handin(folder, names[0])
        return [(names[0], path)], note
    return [(name, folder / name if (folder / name).is_file() else None)
            for name in names], None


def handin_digest(files):
    """The hand-in's hash from [(notebook name, path or None)] (see _digest)."""
    return _digest([(name, Path(path).read_bytes() if path is not None else None)
                    for name, path in files])


def _left_blank(source_nb, gid, answers, released):
    """True when the student left an answer a person grades as the release gave it (or
    deleted it): it scores 0 with nothing to grade, as stock nbgrader scores an answer
    whose checksum is unchanged. Tasks are never blank: a person reads the notebook."""
    is_task = any(_nbgrader(c).get("grade_id") == gid and _nbgrader(c).get("task")
                  for c in source_nb.cells)
    return not is_task and answers.get(gid) in (None, released.get(gid))


def answer_digests(handin):
    """{grade_id: sha256 of that cell's source} for a hand-in's bytes; {} when they
    are not a notebook. A person's score belongs to the answer it was given for."""
    try:
        cells = json.loads(handin)["cells"]
        found = {}
        for cell in cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            source = cell.get("source", "")
            text = "".join(source) if isinstance(source, list) else str(source)
            if isinstance(gid, str):
                found.setdefault(gid, hashlib.sha256(text.encode("utf-8", "replace")).hexdigest())
        return found
    except (TypeError, ValueError, AttributeError, KeyError):
        return {}


def _digest(contents):
    """The hand-in's hash from [(notebook name, bytes or None)]: its one notebook's
    sha256, or, for several notebooks, the sha256 of each name and content in turn;
    None when nothing was handed in."""
    present = [(name, data) for name, data in contents if data is not None]
    if not present:
        return None
    if len(contents) == 1:
        return hashlib.sha256(present[0][1]).hexdigest()
    digest = hashlib.sha256()
    for name, data in present:
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def make_task(*, course, assignment, student, settings, against=None, unverified=False):
    """The HandinTask of `student`'s hand-in of `assignment`."""
    files, name_note = handin_files(course, assignment, student)
    others = {}
    for other in course.assignments():
        if other != assignment:
            try:
                others[other] = sorted(set().union(*(
                    _grade_ids(nbformat.read(course.source / other / name, as_version=4))
                    for name in course.notebook_names(other))))
            except (OSError, ValueError):
                continue
    parts = tuple(NotebookPart(
        name=name, handin=path.read_bytes() if path is not None else None,
        source=(course.source / assignment / name).read_text(encoding="utf-8"),
        release=(course.release / assignment / name).read_text(encoding="utf-8"))
        for name, path in files)
    return HandinTask(
        student=student, assignment=assignment, notebooks=parts, name_note=name_note,
        policy=forbidden.load_policy(assignment), other_assignments=others,
        settings=settings,
        against=against or graded_against(course=course, assignment=assignment),
        unverified=unverified, hidden=(str(course.root),))


def _zero_cells(source_nb, notebook, reason):
    return [{"grade_id": gid, "notebook": notebook, "points": 0.0, "max_points": points,
             "kernel_ok": False, "reason": reason, "executed_forbidden": [],
             "checked": "by the grader" if checks else IN_KERNEL, "checks": []}
            for gid, points, checks in grade_cells(source_nb)]


def grade_task(task):
    """Grade one HandinTask; returns {"result": the result (unsigned), "notebooks":
    {name: the graded run's JSON}}. Pure: reads and writes no course file, so it runs
    the same in a local process pool or on a cluster's worker. Each notebook runs in
    a kernel of its own, as `nbgrader autograde` runs them."""
    started = time.monotonic()
    sources = {p.name: nbformat.reads(p.source, as_version=4) for p in task.notebooks}
    answers = {p.name: answer_digests(p.handin) for p in task.notebooks}
    released = {p.name: answer_digests(p.release.encode("utf-8")) for p in task.notebooks}
    manual = [{"grade_id": gid, "notebook": Path(name).stem, "max_points": points,
               "points": None, "status": "pending",
               "answer_sha256": answers[name].get(gid),
               "blank": _left_blank(nb, gid, answers[name], released[name])}
              for name, nb in sources.items() for gid, points in manual_cells(nb)]
    max_score = (sum(points for nb in sources.values() for _, points, _ in grade_cells(nb))
                 + sum(m["max_points"] for m in manual))
    result = {"student_id": task.student, "assignment": task.assignment, "score": 0.0,
              "max_score": max_score, "status": "graded", "reason": "", "flags": [],
              "notes": [task.name_note] if task.name_note else [], "cells": [],
              "manual": manual,
              "handin_sha256": _digest([(p.name, p.handin) for p in task.notebooks]),
              "grader_version": GRADER_VERSION, "graded_against": task.against,
              "phases": {}, "cell_seconds": {}, "run_seconds": 0.0}
    runs = {}
    single = len(task.notebooks) == 1
    if result["handin_sha256"] is None:
        result.update(status="missing", reason="no notebook was handed in")
    for part in task.notebooks:
        if result["status"] != "graded":
            break
        source_nb = sources[part.name]
        stem = Path(part.name).stem
        if part.handin is None:
            result["notes"].append(f"{part.name} was not handed in: its exercises score 0")
            result["cells"] += _zero_cells(source_nb, stem, f"{part.name} was not handed in")
            continue
        try:
            handin_nb = nbformat.reads(part.handin.decode("utf-8"), as_version=4)
            _check_cells(handin_nb)
        except Exception as exc:  # any unreadable file is a result, not a crash
            if single:
                result.update(status="invalid", reason=_invalid_reason(exc))
                break
            reason = f"{part.name}: {_invalid_reason(exc)}"
            result["notes"].append(reason)
            result["cells"] += _zero_cells(source_nb, stem, reason)
            continue
        wrong = _wrong_notebook_reason(task, part=part, source_nb=source_nb,
                                       handin_nb=handin_nb)
        if wrong and single:
            result.update(status="wrong-notebook", reason=wrong)
            break
        result["phases"]["prepare"] = round(time.monotonic() - started, 3)
        runs[part.name] = _grade_notebook(
            result, task=task, notebook=stem, source_nb=source_nb,
            release_nb=nbformat.reads(part.release, as_version=4), handin_nb=handin_nb)
    if result["status"] != "graded":  # nothing of this assignment to grade by hand
        result["manual"] = [{**m, "blank": True} for m in result["manual"]]
    if task.unverified:
        result["flags"].append(_UNVERIFIED_FLAG)
    if task.settings.use_bwrap is False:
        result["flags"].append(UNSANDBOXED_FLAG)
    if result["status"] != "graded":
        result["cells"] = []
    result["score"] = sum(c["points"] for c in result["cells"])
    result["seconds"] = round(time.monotonic() - started, 2)
    return {"result": result, "notebooks": runs}


def write_graded(course, graded):
    """Write what grade_task returned into autograded/<student>/<assignment>/: the
    graded runs, then the signed result (atomically, last). Only the process that
    owns the course writes, never a worker. Returns the signed result."""
    result = graded["result"]
    out_dir = course.autograded / result["student_id"] / result["assignment"]
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in graded["notebooks"].items():
        fd, scratch = tempfile.mkstemp(dir=out_dir, prefix=".run-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(scratch, out_dir / Path(name).name)
    signed = sign(result)
    _write_json_atomically(out_dir / RESULT_FILE, signed)
    return signed


def grade_one(*, course, assignment, student, settings, unverified=False, against=None):
    """Grade one student's hand-in here; always returns (and writes) a signed result.

    unverified: the result this one replaces failed verification (flagged);
    against: graded_against() of this run, recorded in the result.
    """
    task = make_task(course=course, assignment=assignment, student=student,
                     settings=settings, against=against, unverified=unverified)
    return write_graded(course, grade_task(task))


def _grade_ids(nb):
    ids = set()
    for cell in nb.cells:
        meta = cell.get("metadata")
        meta = meta.get("nbgrader") if isinstance(meta, dict) else None
        if isinstance(meta, dict) and isinstance(meta.get("grade_id"), str):
            ids.add(meta["grade_id"])
    return ids


def _wrong_notebook_reason(task, *, part, source_nb, handin_nb):
    """Why the hand-in is not this assignment's notebook (None if it is): it holds
    none of the assignment's graded cells and fewer than half of its answer cells
    (ids like a scratch cell's can be shared between assignments). Names the
    assignment it belongs to when its cells are another assignment's."""
    def ids(**wanted):
        return {_nbgrader(c)["grade_id"] for c in source_nb.cells
                if _nbgrader(c).get("grade_id")
                and all(bool(_nbgrader(c).get(k)) == v for k, v in wanted.items())}

    answers, graded = ids(solution=True), ids(grade=True)
    handed = _grade_ids(handin_nb)
    if not answers or graded & handed or len(answers & handed) * 2 >= len(answers):
        return None
    for other, other_ids in task.other_assignments.items():
        if handed and len(handed & set(other_ids)) >= len(handed) / 2:
            return (f"this is the notebook of {other}, not of {task.assignment}: hand in "
                    f"{part.name}")
    return (f"none of {task.assignment}'s graded cells is in this notebook: is it the "
            f"right one? Hand in {part.name}, with its cells (copying code into a new "
            "notebook loses them)")


def _grade_notebook(result, *, task, notebook, source_nb, release_nb, handin_nb):
    """Run and score one rebuilt notebook of the hand-in; adds to `result`, returns
    the run's JSON."""
    merged, notes = merge_handin(source_nb=source_nb, release_nb=release_nb,
                                 handin_nb=handin_nb)
    result["notes"].extend(notes)
    result["flags"].extend(n for n in notes if n.startswith(merge.ADDED_CELLS_DROPPED))
    student_code, context_code = _student_code(merged)
    policy = task.policy
    cells = grade_cells(source_nb)
    scratch = Path(tempfile.mkdtemp(prefix="grade-"))
    try:
        seed = zlib.crc32(f"{task.student}/{task.assignment}/{notebook}".encode())
        run = run_notebook(merged, workdir=scratch, settings=task.settings, seed=seed,
                           cell_checks={gid: checks for gid, _, checks in cells},
                           record_cells=[gid for gid in policy if policy[gid]],
                           hidden=task.hidden)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    scoring = time.monotonic()
    cells, flags = score_run(source_nb=source_nb, run_nb=run.notebook,
                             verdicts=run.verdicts, policy=policy, refusals=run.refusals)
    result["cells"] += [{**cell, "notebook": notebook} for cell in cells]
    result["flags"] += flags
    result["flags"].extend(forbidden.static_flags(student_code, context_code=context_code))
    if run.problem:
        result["reason"] = "; ".join(r for r in (result["reason"], run.problem) if r)
        result["flags"].append(run.problem)
    result["run_seconds"] = round(result["run_seconds"] + run.seconds, 2)
    result["cell_seconds"].update(run.cell_seconds)
    for phase, seconds in run.phases.items():
        result["phases"][phase] = round(result["phases"].get(phase, 0.0) + seconds, 3)
    result["phases"]["score"] = round(result["phases"].get("score", 0.0)
                                      + time.monotonic() - scoring, 3)
    return nbformat.writes(inert.inert_graded_notebook(run.notebook))


def result_state(result_path, handin_sha, against=None):
    """"current" (a verified result of this very hand-in, graded by this grader
    version against these `against` hashes), "stale" (none, or of another hand-in,
    grader version, source notebook, policy or checks) or "unverified" (forged or
    altered)."""
    try:
        data = read_verified(result_path)
    except ValueError:
        return "unverified"
    if (data is not None and data.get("handin_sha256") == handin_sha
            and data.get("grader_version") == GRADER_VERSION
            and (against is None or data.get("graded_against") == against)):
        return "current"
    return "stale"


def _graded_against_another_version(course, assignment, student, against):
    """Whether `student`'s verified result was graded against other tests than
    `against` (the source notebook, policy and checks now) or by another grader."""
    try:
        data = read_verified(course.autograded / student / assignment / RESULT_FILE)
    except ValueError:
        return False  # an altered result is regraded, flagged, when its student is
    return data is not None and (data.get("graded_against") != against
                                 or data.get("grader_version") != GRADER_VERSION)


def _result_state(course, assignment, student, against):
    digest = handin_digest(handin_files(course, assignment, student)[0])
    return result_state(course.autograded / student / assignment / RESULT_FILE, digest,
                        against)


TIMEOUT_FACTOR = 10.0  # a cell may take this many times the reference solution's time
TIMEOUT_FLOOR = 10.0  # but never less than this many seconds
REFERENCE_STUDENT = "(reference solution)"


def scaled_timeouts(reference_seconds, *, ceiling, factor=TIMEOUT_FACTOR,
                    floor=TIMEOUT_FLOOR):
    """{grade_id: seconds} for each cell of the reference run: factor times its time,
    at least `floor`, at most `ceiling` (the instructor's --cell-timeout)."""
    return {gid: round(min(ceiling, max(floor, factor * seconds)), 1)
            for gid, seconds in reference_seconds.items() if not gid.startswith("cell ")}


def reference_timing(*, course, assignment, settings, against, runner,
                     progress=sys.stderr):
    """{grade_id: seconds} of the reference solution's own run, graded like a hand-in
    (the source notebook, solutions in place) by `runner` (an engine: where the
    hand-ins run); cached per source notebook, policy and checks in
    .grading/<assignment>/. None, with a warning, when the reference does not earn
    every point: then nothing is scaled."""
    cache = course.root / ".grading" / assignment / "reference_timing.json"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("against") == against and cached.get("grader") == GRADER_VERSION:
            return cached["cell_seconds"]
    except (OSError, ValueError, AttributeError):
        pass
    task = make_task(course=course, assignment=assignment, student=REFERENCE_STUDENT,
                     settings=settings, against=against)
    task = dataclasses.replace(task, name_note=None, notebooks=tuple(
        dataclasses.replace(part, handin=part.source.encode("utf-8")) for part in task.notebooks))
    outcome = {}
    runner.run([task], work=grade_task, on_done=lambda _, graded, error: outcome.update(
        graded=graded, error=error))
    if outcome.get("error") is not None:
        print(f"warning: the reference solution of {assignment} could not be run "
              f"({type(outcome['error']).__name__}): cell timeouts are not scaled",
              file=progress)
        return None
    result = outcome["graded"]["result"]
    if result["status"] != "graded" or result["score"] < sum(
            c["max_points"] for c in result["cells"]):
        lost = [f"{c['grade_id']}: {c['reason']}" for c in result["cells"] if c["reason"]]
        print(f"warning: the reference solution of {assignment} scores {result['score']:g}"
              f" here ({result['status']}; {'; '.join(lost)[:300] or result['reason']}): "
              "cell timeouts are not scaled", file=progress)
        return None
    cache.parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomically(cache, {"against": against, "grader": GRADER_VERSION,
                                   "cell_seconds": result["cell_seconds"]})
    return result["cell_seconds"]


def grade_assignment(*, course, assignment, settings=None, workers=None, force=False,
                     students=None, engine="dask", scheduler=None, scale_timeouts=True,
                     progress=sys.stderr):
    """Grade everyone who handed in `assignment`; returns their results.

    workers: parallel hand-ins (default: the number of cores); force: regrade
    students whose result is already current; students: grade only these ids
    (each regraded even if current), the others' results are left as they are,
    but for those graded against another version of the tests, which are regraded too;
    engine: "dask" (a LocalCluster of `workers` processes, or the cluster at
    `scheduler`) or "pool" (a local process pool, the benchmark's baseline);
    scale_timeouts: each cell's timeout from the reference solution's time (see
    scaled_timeouts), with settings.cell_timeout as the ceiling.
    A result is current when it was graded from the same hand-in, by the same
    grader version, against the same source notebook, policy and checks. Results
    are written here, by this process alone, as each hand-in comes back.
    """
    from tqdm import tqdm

    from autograder.grading import engines

    settings = settings or RunSettings()
    if settings.use_bwrap is None:  # fail closed: no student code runs unsandboxed unasked
        problem = sandbox.sandbox_problem(settings.limits)
        if problem:
            raise SandboxUnavailable(
                f"{problem}: no student code was run. Install Debian's 'bubblewrap', or "
                "grade without the sandbox, knowingly, with --no-sandbox (every result "
                "is then flagged)")
        settings = dataclasses.replace(settings, use_bwrap=True)
    workers = workers or os.cpu_count() or 1
    orphans = sandbox.end_orphaned_sandboxes()
    if orphans:
        print(f"ended {orphans} sandbox(es) left running by an earlier grader that died",
              file=progress)
    grader_key()  # made once here, not by racing workers
    against = graded_against(course=course, assignment=assignment)
    everyone = course.students(assignment)
    if students:
        unknown = sorted(set(students) - set(everyone))
        if unknown:
            raise ValueError(f"no hand-in of {assignment} from {', '.join(unknown)} "
                             "in submitted/")
        force = True
        older = [s for s in everyone if s not in students
                 and _graded_against_another_version(course, assignment, s, against)]
        if older:
            print(f"also regrading {len(older)} other student(s) graded against an earlier "
                  "source notebook, policy, checks or grader, so that no report mixes two "
                  f"versions of the tests: {', '.join(older)}", file=progress)
            students = [*students, *older]
    students = [s for s in everyone if not students or s in students]
    states = {s: _result_state(course, assignment, s, against) for s in students}
    todo = [s for s in students if force or states[s] != "current"]
    stale = sum(1 for s in todo if states[s] == "stale"
                and (course.autograded / s / assignment / RESULT_FILE).exists())
    if stale and not force:
        print(f"{stale} earlier result(s) are out of date (the hand-in, the source "
              "notebook, the policy or the checks changed): regraded", file=progress)
    started = time.monotonic()
    done = len(students) - len(todo)
    if done:
        print(f"{done} of {len(students)} already graded (unchanged hand-ins): skipped",
              file=progress)
    in_terminal = getattr(progress, "isatty", lambda: False)()
    bar = tqdm(total=len(students), initial=done, file=progress, unit="hand-in",
               dynamic_ncols=True, mininterval=1.0, disable=not (todo and in_terminal))

    def on_done(task, graded, error):
        nonlocal done
        done += 1
        try:
            if error is not None:
                raise error
            r = write_graded(course, graded)
            line = f"{r['score']:g}/{r['max_score']:g} {r['status']} ({r['seconds']:.1f} s)"
        except Exception as exc:  # noqa: BLE001 - a crash is one student's problem
            line = f"{_failure_status(exc)}: {type(exc).__name__}: {exc}"[:300]
            try:
                _record_crash(course, assignment, task.student, exc)
            except Exception as write_error:  # noqa: BLE001 - nor is a failed write
                line += f" (and its result could not be written: {write_error})"[:300]
        bar.write(f"[{done}/{len(students)}] {task.student}: {line}", file=progress)
        bar.update(1)

    def tasks(run_settings):
        return (make_task(course=course, assignment=assignment, student=s,
                          settings=run_settings, against=against,
                          unverified=states[s] == "unverified") for s in todo)

    try:
        if todo:
            with engines.engine_for(engine, workers=workers, scheduler=scheduler,
                                    log=progress) as runner:
                workers = runner.workers
                if scale_timeouts:
                    reference = reference_timing(course=course, assignment=assignment,
                                                 settings=settings, against=against,
                                                 runner=runner, progress=progress)
                    if reference:
                        settings = dataclasses.replace(settings, cell_timeouts=scaled_timeouts(
                            reference, ceiling=settings.cell_timeout))
                runner.run(tasks(settings), work=grade_task, on_done=on_done)
    finally:
        bar.close()
    results = load_results(course, assignment)
    this_run = [r for r in results if r["student_id"] in set(todo)]  # not the skipped ones
    flagged = sum(1 for r in this_run if r["flags"])
    failed = sum(1 for r in this_run if r["status"] != "graded")
    print(f"graded {len(this_run) - failed}, failed {failed}, flagged {flagged}, "
          f"in {time.monotonic() - started:.1f} s with {workers} workers", file=progress)
    return results


def _failure_status(exc):
    """"failed" when the hand-in kept killing its workers, else "error"."""
    return "failed" if type(exc).__name__ == "KilledWorker" else "error"


def _record_crash(course, assignment, student, exc):
    out_dir = course.autograded / student / assignment
    out_dir.mkdir(parents=True, exist_ok=True)
    if _failure_status(exc) == "failed":
        status, reason = "failed", (
            "not graded: the grading worker died every time it ran this hand-in (killed, "
            "out of memory, or its machine lost); it was tried on several workers")
    else:
        status, reason = "error", f"grader error: {type(exc).__name__}: {exc}"[:500]
    _write_json_atomically(out_dir / RESULT_FILE, sign({
        "student_id": student, "assignment": assignment, "score": 0.0, "max_score": 0.0,
        "status": status, "reason": reason, "flags": [reason], "notes": [], "cells": [],
        "handin_sha256": None, "grader_version": GRADER_VERSION}))


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

