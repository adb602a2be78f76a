"""The student edition works on its own: a fresh virtual environment built from
nothing but the edition's environment.yml pins (pip, PyTorch's CPU build from this
machine's wheel, about 2 minutes and 2.4 GB, built once per test run and shared by
every test and worker that needs it), with nothing of this repository importable,
runs every lesson, moving every slider and menu, and every released assignment
answered with source/'s solutions, top to bottom; Binder's postBuild keeps Validate.
COURSE_SKIP_EDITION_VENV=1 skips them.
"""

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
    _check_widgets,
    _lesson_run,
    _pinned_ipywidgets,
    _run,
    edition,
    edition_env,
)

import labbrowser
from autograder.course import Course
from autograder.publishing.edition import ASSIGNMENTS_DIR, units
from autograder.publishing.publish import STUDENT_TOOLS_ONLY
from conftest import LESSONS, REPO


@SKIP_VENV
@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_each_lesson_runs_in_the_editions_own_environment_and_its_widgets_move(
        lesson, edition, edition_env, tmp_path):
    errors, report = _lesson_run(edition_env, edition, lesson, tmp_path)
    assert not errors, f"{lesson.name}: {errors}"
    _check_widgets(report, lesson.name, _pinned_ipywidgets(edition))


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
