"""Make the README's screenshots in docs/images/, from a temporary copy of the course.

    .venv/bin/python docs/make_screenshots.py

In the copy: `nbgrader generate_assignment --force` for every assignment (the
gradebook the formgrader lists), the sample class of 01_the_recipe collected and
graded (its feedback pages), then JupyterLab started there, as `make lab` starts it
at the repository root. Nothing in the repository changes except docs/images/.
Needs Debian's Chromium (/usr/bin/chromium, or $COURSE_CHROMIUM).
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from playwright.sync_api import sync_playwright  # noqa: E402

import labbrowser  # noqa: E402 (lives in tests/)
from labbrowser import DRIVEN_OUTPUT, PANEL, REDRAWN, open_notebook, run_all_cells  # noqa: E402, I001

IMAGES = REPO / "docs" / "images"
ASSIGNMENT = "01_the_recipe"
FEEDBACK_STUDENT = "hal_cheats"  # fakes np.allclose: the checks say what it returned
COURSE_FILES = ("notebooks", "source", "release", "nbgrader_config.py")


def run(command, cwd):
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    print("$", " ".join(str(c) for c in command), flush=True)
    subprocess.run(command, cwd=cwd, env=env, check=True, timeout=1800)


def make_course(course):
    for name in COURSE_FILES:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, course / name)
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    bin_dir = Path(sys.executable).parent
    for assignment in assignments:
        run([bin_dir / "nbgrader", "generate_assignment", "--force", assignment], course)
    autograder = [sys.executable, "-m", "autograder"]
    run([*autograder, "collect", ASSIGNMENT, REPO / "autograder" / "examples" / ASSIGNMENT,
         "--course", course], REPO)
    run([*autograder, "grade", ASSIGNMENT, "--course", course], REPO)


def set_slider(page, label, presses):
    """Press ArrowRight on the slider called `label`, waiting for each redraw."""
    slider = page.locator(f"{PANEL} .widget-slider").filter(
        has=page.locator(".widget-label", has_text=label)).first
    handle = slider.locator(".noUi-handle")
    element = handle.element_handle()
    for _ in range(presses):
        before = handle.evaluate(DRIVEN_OUTPUT)
        handle.press("ArrowRight")
        page.wait_for_function(REDRAWN, arg=[element, before, PANEL], timeout=60_000)
    return slider


def lesson(page, lab):
    open_notebook(page, lab, f"notebooks/{ASSIGNMENT}.ipynb", workspace="lesson")
    run_all_cells(page)
    set_slider(page, "gamma", 5)
    slider = set_slider(page, "beta", 10)
    outputs = slider.evaluate_handle(
        "s => s.closest('.jp-Cell').querySelector('.jp-Cell-outputWrapper')")
    outputs.evaluate("o => o.scrollIntoView({block: 'center'})")
    page.wait_for_function(  # the figure is decoded before the picture is taken
        "o => [...o.querySelectorAll('img')].every(i => i.complete && i.naturalWidth)",
        arg=outputs, timeout=30_000)
    page.screenshot(path=IMAGES / "lesson_sliders.png")


def formgrader(page, lab):
    page.goto(lab.url("formgrader"))
    page.get_by_text(ASSIGNMENT, exact=True).first.wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=IMAGES / "formgrader.png")


def feedback(page, course):
    html = course / "reports" / ASSIGNMENT / "feedback" / f"{FEEDBACK_STUDENT}.html"
    page.goto(html.as_uri())
    page.wait_for_load_state("load")
    page.screenshot(path=IMAGES / "feedback.png")


def main():
    IMAGES.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="course-screens-") as scratch:
        course = Path(scratch) / "course"
        course.mkdir()
        make_course(course)
        lab = labbrowser.JupyterLab(course, Path(scratch) / "lab").start()
        try:
            with sync_playwright() as playwright:
                browser = labbrowser.launch_chromium(playwright)
                page = browser.new_page(viewport=labbrowser.VIEWPORT)
                lesson(page, lab)
                formgrader(page, lab)
                feedback(page, course)
                browser.close()
        finally:
            lab.stop()
    for image in sorted(IMAGES.glob("*.png")):
        print(f"{image.relative_to(REPO)}: {image.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
