"""A small course of the instructor's own, for the grading tests: one assignment,
`ps_double`, with an answer cell, a graded cell of plain nbgrader asserts, a scratch
cell and a free-text answer graded by hand. Fast to grade: no torch in the answers."""

import shutil

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from autograder.course import Course

ASSIGNMENT = "ps_double"
COLAB_CELL = ("import sys\n\nif \"google.colab\" in sys.modules:\n"
              "    from google.colab import output\n\n"
              "    output.enable_custom_widget_manager()")


def _meta(gid, **extra):
    return {"nbgrader": {"grade_id": gid, "locked": True, "solution": False, "grade": False,
                         "schema_version": 3, "task": False, **extra}}


def source_notebook(hidden_test="assert double(10) == 20"):
    cells = [
        new_code_cell(COLAB_CELL, metadata=_meta("colab_setup")),
        new_markdown_cell("Write `double(x)`: $y = 2x$.", metadata=_meta("intro")),
        new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", metadata=_meta("double_answer", locked=False,
                                                          solution=True)),
        new_code_cell('"""double doubles."""\nassert double(3) == 6\n'
                      f"### BEGIN HIDDEN TESTS\n{hidden_test}\n### END HIDDEN TESTS",
                      metadata=_meta("double_works", grade=True, points=2)),
        new_code_cell("### BEGIN SOLUTION\nprint('try things here')\n### END SOLUTION",
                      metadata=_meta("scratch", locked=False, solution=True)),
        new_markdown_cell("Why does doubling commute with adding?",
                          metadata=_meta("why_intro")),
        new_markdown_cell("### BEGIN SOLUTION\nBecause 2(a + b) = 2a + 2b.\n### END SOLUTION",
                          metadata=_meta("why_answer", locked=False, solution=True,
                                         grade=True, points=1)),
    ]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def write_source(course, **kwargs):
    folder = course.source / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(source_notebook(**kwargs), folder / f"{ASSIGNMENT}.ipynb")


def make_course(root, repo):
    """A course at `root` with ps_double in source/ (not yet released)."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copy(repo / "nbgrader_config.py", root / "nbgrader_config.py")
    course = Course(root)
    write_source(course)
    return course


def handin(course, body, answer="Distributivity."):
    """The released notebook with `double`'s body and the free-text answer filled in."""
    nb = nbformat.read(course.release_notebook(ASSIGNMENT), as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid == "double_answer":
            cell.source = f"def double(x):\n    {body}"
        elif gid == "why_answer":
            cell.source = answer
    return nb
