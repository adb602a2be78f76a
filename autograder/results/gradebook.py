"""Write grading results into nbgrader's gradebook, so the formgrader shows them.

The gradebook is gradebook.db at the course root, the one `nbgrader
generate_assignment` (our release step) fills with the assignment and its
grade, solution and task cells. Every student with a result gets a submission
whose grade cells carry the auto scores the trusted checks gave, and a comment
row for every answer and task cell, as nbgrader's autograde leaves them (the
formgrader saves an instructor's comments there, and `nbgrader generate_feedback`
reads them); a flagged hand-in's notebook is flagged for review. Manual scores
and comments an instructor entered are kept while the answer they were given for
stays the same: a resubmission that changed a hand-graded answer (or, for a
score overridden on an autograded cell, the hand-in) puts that cell back to
pending. .grading/<assignment>/hand_graded.json remembers which version of each
answer the formgrader shows.
The executed notebooks are already where the formgrader looks for them,
autograded/<student>/<assignment>/.
"""

import json
import os
import warnings
from pathlib import Path

import nbformat

from autograder.course import path_with_tools
from autograder.grading.grade import grade_cells, manual_cells


def gradebook_url(course):
    return f"sqlite:///{course.root / 'gradebook.db'}"


def _ensure_assignment(gradebook, *, assignment, notebook, source_nb):
    """The assignment, its notebook and grade cells, as generate_assignment
    records them (for a course whose release never touched this gradebook)."""
    from nbgrader.api import MissingEntry

    gradebook.update_or_create_assignment(assignment)
    try:
        gradebook.find_notebook(notebook, assignment)
    except MissingEntry:
        gradebook.add_notebook(notebook, assignment)
    kinds = {c.metadata.get("nbgrader", {}).get("grade_id"): c.cell_type
             for c in source_nb.cells}
    tasks = {c.metadata["nbgrader"]["grade_id"] for c in source_nb.cells
             if c.metadata.get("nbgrader", {}).get("task")}
    graded = [(gid, points) for gid, points, _ in grade_cells(source_nb)]
    for gid, points in graded + manual_cells(source_nb):
        try:
            gradebook.find_graded_cell(gid, notebook, assignment)
        except MissingEntry:
            add = gradebook.add_task_cell if gid in tasks else gradebook.add_grade_cell
            add(gid, notebook, assignment, max_score=points, cell_type=kinds.get(gid, "code"))
    for cell in source_nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta.get("grade_id"):
            try:
                gradebook.find_solution_cell(meta["grade_id"], notebook, assignment)
            except MissingEntry:
                gradebook.add_solution_cell(meta["grade_id"], notebook, assignment)


def _comment_rows(gradebook, *, submitted, notebook, assignment):
    """A comment row for every answer and task cell of a submitted notebook, made for
    cells newer than the submission (nbgrader makes them with the submission)."""
    from nbgrader.api import Comment

    have = {comment.cell_id: comment for comment in submitted.comments}
    recorded = gradebook.find_notebook(notebook, assignment)
    for cell in list(recorded.solution_cells) + list(recorded.task_cells):
        if cell.id not in have:
            have[cell.id] = Comment(cell_id=cell.id, notebook=submitted)
            gradebook.db.add(have[cell.id])
    return {comment.cell.name: comment for comment in have.values()}


def _grade_row(gradebook, *, gid, notebook, assignment, student):
    """The Grade of one cell, made if the submission predates the cell."""
    from nbgrader.api import Grade, MissingEntry

    try:
        return gradebook.find_grade(gid, notebook, assignment, student)
    except MissingEntry:  # a task, or a cell newer than the submission
        submitted = gradebook.find_submission_notebook(notebook, assignment, student)
        cell = gradebook.find_graded_cell(gid, notebook, assignment)
        grade = gradebook.db.query(Grade).filter(
            Grade.cell_id == cell.id, Grade.notebook_id == submitted.id).one_or_none()
        if grade is None:
            grade = Grade(cell_id=cell.id, notebook=submitted)
            gradebook.db.add(grade)
        return grade


def _versions(result, notebook):
    """{grade_id: the version of what a person grades in that cell}: the answer's digest
    for manual cells, the hand-in's for autograded ones (an override judges it whole)."""
    versions = {m["grade_id"]: m.get("answer_sha256") for m in result.get("manual", [])
                if m.get("notebook", notebook) == notebook}
    for cell in result.get("cells", []):
        if cell.get("notebook", notebook) == notebook:
            versions[cell["grade_id"]] = result.get("handin_sha256")
    return versions


def _reopen_changed(grade, *, shown, now):
    """Clear a score given by hand for a version of the answer this one replaces."""
    if grade.manual_score is None or not shown or not now or shown == now:
        return False
    grade.manual_score = None
    return True


def student_fields(entry):
    """nbgrader's student fields from a roster entry: "Lovelace, Ada" and "Ada Lovelace"
    both give first name Ada, last name Lovelace."""
    if not entry:
        return {}
    name = " ".join(str(entry.get("name") or "").split())
    if "," in name:
        last, _, first = (part.strip() for part in name.partition(","))
    else:
        first, _, last = name.rpartition(" ")
    fields = {"first_name": first or None, "last_name": last or None,
              "email": entry.get("email") or None, "lms_user_id": entry.get("lms_id") or None}
    return {key: value for key, value in fields.items() if value}


def _record(gradebook, *, result, assignment, notebook, grade_ids, manual_ids, shown,
            person=None):
    """Record one result; returns the grade_ids whose hand score was cleared. `shown`:
    {grade_id: version} of this student's notebook as the formgrader showed it until
    now; updated to this result's versions. person: the student's roster entry."""
    student = result["student_id"]
    versions = _versions(result, notebook)
    reopened = []
    gradebook.update_or_create_student(student, **student_fields(person))
    gradebook.update_or_create_submission(assignment, student)
    earned = {c["grade_id"]: c["points"] for c in result.get("cells", [])
              if c.get("notebook", notebook) == notebook}
    for gid in grade_ids:  # a hand-in that could not be run scores 0 in each cell
        grade = _grade_row(gradebook, gid=gid, notebook=notebook, assignment=assignment,
                           student=student)
        grade.auto_score = float(earned.get(gid, 0.0))
        if _reopen_changed(grade, shown=shown.get(gid), now=versions.get(gid)):
            reopened.append(gid)
        grade.needs_manual_grade = False
    blank = {m["grade_id"] for m in result.get("manual", [])
             if m.get("blank") and m.get("notebook", notebook) == notebook}
    for gid in manual_ids:  # a person grades these; only say they are waiting
        grade = _grade_row(gradebook, gid=gid, notebook=notebook, assignment=assignment,
                           student=student)
        if _reopen_changed(grade, shown=shown.get(gid), now=versions.get(gid)):
            reopened.append(gid)
        # an answer left as released scores 0 with nothing to grade, as in nbgrader
        grade.auto_score = 0.0 if gid in blank else None
        grade.needs_manual_grade = grade.manual_score is None and gid not in blank
    shown.update({gid: v for gid, v in versions.items() if v})
    submitted = gradebook.find_submission_notebook(notebook, assignment, student)
    comments = _comment_rows(gradebook, submitted=submitted, notebook=notebook,
                             assignment=assignment)
    for gid in blank:  # nbgrader's own words for an unchanged answer
        if gid in comments:
            comments[gid].auto_comment = "No response."
    submitted.flagged = bool(result.get("flags"))
    gradebook.db.commit()
    return reopened


def _roster_or_none(course):
    """The course's roster, for the names the formgrader shows; None without a usable one
    (grading never fails for want of names)."""
    from autograder.term.roster import RosterError, load_roster

    try:
        return load_roster(course)
    except RosterError:
        return None


def _shown_path(course, assignment):
    return course.root / ".grading" / assignment / "hand_graded.json"


def _load_shown(path):
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_gradebook(*, course, assignment, results):
    """Record `results` (from grade_assignment) in the course's gradebook.db, each
    notebook of the assignment as nbgrader records it. Returns {student: [(notebook,
    grade_id)]}: the cells whose score given by hand was cleared because the answer
    changed since (they wait for a person again)."""
    from nbgrader.api import Gradebook

    # A new gradebook is stamped by running `alembic`, which lives beside this
    # interpreter: find it even when the virtual environment is not activated.
    os.environ["PATH"] = path_with_tools()
    with Gradebook(gradebook_url(course)) as gradebook, warnings.catch_warnings():
        # nbgrader's own add_submission sets off SQLAlchemy's "not in session" warnings.
        warnings.filterwarnings("ignore", message="Object of type .* not in session")
        notebooks = []
        for name in course.notebook_names(assignment):
            source_nb = nbformat.read(course.source / assignment / name, as_version=4)
            notebook = Path(name).stem
            # Every notebook first: a submission records the notebooks it finds.
            _ensure_assignment(gradebook, assignment=assignment, notebook=notebook,
                               source_nb=source_nb)
            notebooks.append((notebook, [gid for gid, _, _ in grade_cells(source_nb)],
                              [gid for gid, _ in manual_cells(source_nb)]))
        shown_path = _shown_path(course, assignment)
        shown = _load_shown(shown_path)
        roster = _roster_or_none(course)
        reopened = {}
        for notebook, grade_ids, manual_ids in notebooks:
            for result in results:
                student = result["student_id"]
                mine = shown.setdefault(student, {}).setdefault(notebook, {})
                cleared = _record(gradebook, result=result, assignment=assignment,
                                  notebook=notebook, grade_ids=grade_ids,
                                  manual_ids=manual_ids, shown=mine,
                                  person=roster.get(student) if roster else None)
                reopened.setdefault(student, []).extend((notebook, gid) for gid in cleared)
        shown_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = shown_path.with_name(shown_path.name + ".new")
        temporary.write_text(json.dumps(shown, indent=1, sort_keys=True))
        os.replace(temporary, shown_path)
    return {student: cells for student, cells in reopened.items() if cells}


def scores_by_hand(*, course, assignment):
    """{student: {(notebook, grade_id): score a person gave in the formgrader}}:
    manual cells graded, and autograded cells whose score was overridden."""
    from nbgrader.api import Gradebook, MissingEntry

    notebooks = {Path(name).stem for name in course.notebook_names(assignment)}
    found = {}
    with Gradebook(gradebook_url(course)) as gradebook:
        try:
            submissions = gradebook.find_assignment(assignment).submissions
        except MissingEntry:
            return found
        for submission in submissions:
            for submitted in submission.notebooks:
                if submitted.name not in notebooks:
                    continue
                for grade in submitted.grades:
                    if grade.manual_score is not None:
                        found.setdefault(submission.student.id, {})[
                            (submitted.name, grade.name)] = float(grade.manual_score)
    return found


def with_scores_by_hand(results, by_hand, *, default_notebook=None):
    """`results` with the scores a person gave: one total, the formgrader's and
    `nbgrader export`'s. Cells graded by hand say so; manual cells not graded yet
    stay pending (None) and are listed in result["pending"]. default_notebook: the
    notebook of cells that do not name theirs (results of a one-notebook grader)."""
    merged = []
    for result in results:
        given = by_hand.get(result["student_id"], {})

        def key(cell):
            return (cell.get("notebook", default_notebook), cell["grade_id"])

        cells = [{**c, "points": given[key(c)], "by_hand": True}
                 if key(c) in given else c for c in result.get("cells", [])]
        manual = [{**m, "points": given[key(m)], "status": "graded"} if key(m) in given
                  else {**m, "points": 0.0, "status": "blank"} if m.get("blank")
                  else {**m, "points": None, "status": "pending"}
                  for m in result.get("manual", [])]
        score = (sum(c["points"] for c in cells)
                 + sum(m["points"] for m in manual if m["points"] is not None))
        merged.append({**result, "cells": cells, "manual": manual, "score": score,
                       "pending": [m["grade_id"] for m in manual if m["points"] is None]})
    return merged


def record_lateness(*, course, assignment, results):
    """Write each result's submission time and late penalty (in points, on its first
    notebook) into the gradebook, so that `nbgrader export` and the formgrader show
    the same final score as grades.csv: score minus late_submission_penalty."""
    from datetime import datetime

    from nbgrader.api import Gradebook, MissingEntry

    first = Path(course.notebook_names(assignment)[0]).stem
    with Gradebook(gradebook_url(course)) as gradebook:
        for result in results:
            late = result.get("lateness") or {}
            try:
                submission = gradebook.find_submission(assignment, result["student_id"])
                notebook = gradebook.find_submission_notebook(first, assignment,
                                                              result["student_id"])
            except MissingEntry:
                continue
            if late.get("submitted_at"):
                submission.timestamp = datetime.fromisoformat(
                    late["submitted_at"]).replace(tzinfo=None)
            notebook.late_submission_penalty = round(
                result["score"] - result.get("final_score", result["score"]), 6)
        gradebook.db.commit()
