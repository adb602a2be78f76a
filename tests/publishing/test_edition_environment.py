"""The student edition works on its own: a fresh virtual environment built from
nothing but the edition's environment.yml pins (pip, PyTorch's CPU build from this
machine's wheel, about 2 minutes and 2.4 GB, built once per test run and shared by
every test and worker that needs it), with nothing of this repository importable,
imports every module the lessons import at their top level, under the pinned
ipywidgets, and runs every released assignment answered with source/'s solutions,
top to bottom; Binder's postBuild keeps Validate. COURSE_SKIP_EDITION_VENV=1 skips them.

Each lesson runs in full, its sliders and menus moved, on these same packages in
tests/publishing/test_colab_environment.py (under Colab's ipywidgets 7, the one
package in front of them there); under the pinned ipywidgets 8 the lessons run in
JupyterLab, their sliders moved, in tests/test_browser.py, and in the site's build.
Running them a third time here, for minutes, would find nothing those runs miss.
"""

import ast
import json
import re
import shlex
import shutil
import subprocess

import nbformat
import pytest
from test_publish import (  # noqa: F401 - the fixtures edition and edition_env
    SKIP_VENV,
    _bare_env,
    _pinned_ipywidgets,
    _run,
    edition,
    edition_env,
)

import labbrowser
from autograder.course import Course
from autograder.publishing.edition import ASSIGNMENTS_DIR, LESSONS_DIR, units
from autograder.publishing.publish import STUDENT_TOOLS_ONLY
from conftest import LESSONS, REPO


def _top_level_imports(lesson):
    """The import statements at the top level of the lesson's code cells: those every
    run makes (an import inside an if or a try, such as Colab's own set-up, is not)."""
    notebook = nbformat.read(lesson, as_version=4)
    imports = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            tree = ast.parse(cell.source)  # a lesson holds Python, no magics
            imports += [ast.unparse(node) for node in tree.body
                        if isinstance(node, (ast.Import, ast.ImportFrom))]
    return imports


def _imports_notebook(lessons, ipywidgets_version):
    """A notebook of one cell per lesson, holding its top-level imports, and a last
    cell that checks the ipywidgets version the kernel imported."""
    cells = [nbformat.v4.new_code_cell(f"# {lesson.name}\n" + "\n".join(
        _top_level_imports(lesson))) for lesson in lessons]
    cells.append(nbformat.v4.new_code_cell(
        "import ipywidgets\n"
        f"assert ipywidgets.__version__ == {ipywidgets_version!r}, ipywidgets.__version__"))
    return nbformat.v4.new_notebook(cells=cells)


@SKIP_VENV
def test_every_lessons_imports_resolve_in_the_editions_own_environment(
        edition, edition_env, tmp_path):
    lessons = [edition / LESSONS_DIR / lesson.name for lesson in LESSONS]
    pinned = _pinned_ipywidgets(edition)
    errors, _ = _run(edition_env, _imports_notebook(lessons, pinned), tmp_path / "lessons")
    # the run's cell 0 is the isolation check; cell i + 1 holds lessons[i]'s imports
    named = [re.sub(r"^cell (\d+)", lambda m: (
        lessons[int(m[1]) - 1].name if 0 < int(m[1]) <= len(lessons) else m[0]), error)
        for error in errors]
    assert not named, named


@SKIP_VENV
def test_the_import_check_fails_on_a_module_the_edition_lacks(edition, edition_env,
                                                               tmp_path):
    """The check above is not vacuous: a lesson importing the course's own reference
    code fails it, and so does an ipywidgets other than the pinned one."""
    lesson = tmp_path / "99_extra_lesson.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import numpy as np\nimport normref\nimport sklearn")]), lesson)
    # and ipywidgets other than the pin fails it too
    errors, _ = _run(edition_env, _imports_notebook([lesson], "7.7.1"), tmp_path / "run")
    assert [e.split(":")[:2] for e in errors] == [
        ["cell 1", " ModuleNotFoundError"], ["cell 2", " AssertionError"]], errors


def _answered(released, source):
    """The released notebook with each answer cell holding source/'s solution, and
    nothing else changed (the tests stay the released, visible ones)."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in released.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = "\n".join(
                line for line in solutions[meta["grade_id"]].splitlines()
                if not re.search(r"### (BEGIN|END) SOLUTION", line))
    return released


@SKIP_VENV
@pytest.mark.parametrize("unit", [u.slug for u in units(Course.at(REPO))])
def test_each_assignment_runs_answered_in_the_editions_own_environment(
        unit, edition, edition_env, tmp_path):
    course = Course.at(REPO)
    (released_path,) = (edition / ASSIGNMENTS_DIR / unit).glob("*.ipynb")
    released = nbformat.read(released_path, as_version=4)
    source = nbformat.read(course.source_notebook(unit), as_version=4)
    errors, _ = _run(edition_env, _answered(released, source), tmp_path / unit)
    assert not errors, f"{unit}: {errors}"


@SKIP_VENV
def test_binders_post_build_keeps_validate_and_switches_off_the_course_menus(
        edition, edition_env):
    env = _bare_env(edition_env["prefix"], edition_env["scratch"])
    done = subprocess.run(["bash", str(edition / "postBuild")], capture_output=True,
                          text=True, env=env, timeout=600, cwd=edition)
    assert done.returncode == 0, done.stdout + done.stderr
    labconfig = json.loads((edition_env["prefix"] / "etc" / "jupyter" / "labconfig" /
                            "page_config.json").read_text())
    disabled = {name for name, off in labconfig["disabledExtensions"].items() if off}
    assert {"@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
            "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:assignment-list"} <= disabled
    assert "@jupyter/nbgrader:validate-assignment" not in disabled
    listing = subprocess.run([str(edition_env["prefix"] / "bin" / "jupyter"), "server",
                              "extension", "list"], capture_output=True, text=True, env=env,
                             timeout=300)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)  # no colours
    assert re.search(r"nbgrader\.server_extensions\.validate_assignment\s+enabled", text)
    assert re.search(r"nbgrader\.server_extensions\.formgrader\s+disabled", text)


@pytest.fixture(scope="module")
def browser():
    yield from labbrowser.chromium_session()


@SKIP_VENV
def test_the_laptop_steps_leave_validate_and_no_course_menu_in_jupyterlab(
        edition, edition_env, browser, tmp_path):
    """A student on a laptop runs the README's two commands once; JupyterLab, in
    Chromium, then shows an assignment with its Validate button and no nbgrader menu
    for running a course (no Formgrader, Course List or Assignment List)."""
    readme = (edition / "README.md").read_text()
    env = _bare_env(edition_env["prefix"], edition_env["scratch"])
    for command in STUDENT_TOOLS_ONLY:
        assert command in readme
        done = subprocess.run([str(edition_env["prefix"] / "bin" / "jupyter"),
                               *shlex.split(command)[1:]], capture_output=True, text=True,
                              env=env, timeout=600, cwd=edition)
        assert done.returncode == 0, done.stdout + done.stderr
    # a copy: JupyterLab writes a checkpoint beside the notebook it opens, and the
    # edition is shared with the tests of what it holds
    opened = shutil.copytree(edition, tmp_path / "edition")
    (assignment,) = sorted((opened / ASSIGNMENTS_DIR).glob("01_*/*.ipynb"))
    lab = labbrowser.JupyterLab(opened, tmp_path / "lab",
                                python=edition_env["python"]).start()
    try:
        page = browser.new_page()
        page.goto(lab.url(f"lab/tree/{assignment.relative_to(opened).as_posix()}"))
        page.get_by_role("button", name="Validate").first.wait_for(timeout=120_000)
        menus = page.locator(".lm-MenuBar-itemLabel").all_inner_texts()
        assert "File" in menus and not any("nbgrader" in m.lower() for m in menus), menus
        page.keyboard.press("Control+Shift+C")  # the command palette lists every command
        palette = page.locator(".lm-CommandPalette-content").inner_text(timeout=30_000)
        for tool in ("Formgrader", "Course List", "Assignment List"):
            assert tool not in palette, tool
        page.close()
    finally:
        lab.stop()
