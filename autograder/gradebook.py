"""Write grading results into nbgrader's gradebook, so the formgrader shows them.

The gradebook is gradebook.db at the course root, the one `nbgrader
generate_assignment` (our release step) fills with the assignment and its
grade cells. Every student with a result gets a submission whose grade cells
carry the auto scores the trusted checks gave; a flagged hand-in's notebook is
flagged for review. Manual scores and comments an instructor entered are kept.
The executed notebooks are already where the formgrader looks for them,
autograded/<student>/<assignment>/.
"""

import os
import sys
import warnings
from pathlib import Path

import nbformat

from autograder.grade import grade_cells


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
    for gid, points, _ in grade_cells(source_nb):
        try:
            gradebook.find_grade_cell(gid, notebook, assignment)
        except MissingEntry:
            gradebook.add_grade_cell(gid, notebook, assignment, max_score=points,
                                     cell_type="code")


def _grade_row(gradebook, *, gid, notebook, assignment, student):
    """The Grade of one cell, made if the submission predates the cell."""
    from nbgrader.api import Grade, MissingEntry

    try:
        return gradebook.find_grade(gid, notebook, assignment, student)
    except MissingEntry:
        submitted = gradebook.find_submission_notebook(notebook, assignment, student)
        cell = gradebook.find_grade_cell(gid, notebook, assignment)
        grade = Grade(cell_id=cell.id, notebook=submitted)
        gradebook.db.add(grade)
        return grade


def _record(gradebook, *, result, assignment, notebook, grade_ids):
    student = result["student_id"]
    gradebook.update_or_create_student(student)
    gradebook.update_or_create_submission(assignment, student)
    earned = {c["grade_id"]: c["points"] for c in result.get("cells", [])}
    for gid in grade_ids:  # a hand-in that could not be run scores 0 in each cell
        grade = _grade_row(gradebook, gid=gid, notebook=notebook, assignment=assignment,
                           student=student)
        grade.auto_score = float(earned.get(gid, 0.0))
        grade.needs_manual_grade = False
    submitted = gradebook.find_submission_notebook(notebook, assignment, student)
    submitted.flagged = bool(result.get("flags"))
    gradebook.db.commit()


def write_gradebook(*, course, assignment, results):
    """Record `results` (from grade_assignment) in the course's gradebook.db."""
    from nbgrader.api import Gradebook

    source_nb = nbformat.read(course.source_notebook(assignment), as_version=4)
    notebook = course.source_notebook(assignment).stem
    grade_ids = [gid for gid, _, _ in grade_cells(source_nb)]
    # A new gradebook is stamped by running `alembic`, which lives beside this
    # interpreter: find it even when the virtual environment is not activated.
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    with Gradebook(gradebook_url(course)) as gradebook, warnings.catch_warnings():
        # nbgrader's own add_submission sets off SQLAlchemy's "not in session" warnings.
        warnings.filterwarnings("ignore", message="Object of type .* not in session")
        _ensure_assignment(gradebook, assignment=assignment, notebook=notebook,
                           source_nb=source_nb)
        for result in results:
            _record(gradebook, result=result, assignment=assignment, notebook=notebook,
                    grade_ids=grade_ids)
