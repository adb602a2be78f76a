"""The students' view, in a real browser: every lesson runs in JupyterLab without an
error and its sliders and menus redraw what they drive; a released assignment, filled in by
typing, passes its visible tests and nbgrader's Validate button.

Headless Chromium from Debian (/usr/bin/chromium, or $COURSE_CHROMIUM) drives a private
JupyterLab that serves a temporary copy of notebooks/ and release/. Screenshots go to
artifacts/browser/; `pytest -s` prints each notebook's time in the browser.
"""

import re
import shutil
import time

import nbformat
import pytest

import labbrowser
from conftest import LESSONS, REPO
from labbrowser import DRIVEN_OUTPUT, PANEL, REDRAWN, open_notebook, run_all_cells

playwright_api = pytest.importorskip("playwright.sync_api")

if not labbrowser.chromium_available():
    pytest.skip(f"no Chromium at {labbrowser.CHROMIUM} (apt-get install chromium)",
                allow_module_level=True)

ARTIFACTS = REPO / "artifacts" / "browser"
ASSIGNMENT = "01_the_recipe"

# Bounded waits, generous for 2 busy cores (opening a notebook and Run All Cells
# have theirs in labbrowser: 90 s and 180 s).
SAVE_TIMEOUT_MS = 60_000  # the notebook is saved
REDRAW_TIMEOUT_MS = 60_000  # one slider step redraws its output
VALIDATE_TIMEOUT_MS = 240_000  # nbgrader runs the notebook again in a fresh kernel

# JupyterLab renders stderr streams (warnings) and errors alike, as
# application/vnd.jupyter.stderr; an error is the one that carries IPython's
# traceback ("Cell In[3], line 1" heads every frame, SyntaxErrors included).
TRACEBACKS = """panel => [...document.querySelectorAll(
    panel + ' .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
  .map(o => o.innerText)
  .filter(t => /Traceback \\(most recent call last\\)|Cell In\\[\\d+\\], line \\d+/.test(t))"""

TIMES = {}


# -- fixtures -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab serving a copy of notebooks/ and release/ (and the course's
    nbgrader_config.py, as at the repository root, where Binder and `make lab` start)."""
    root = tmp_path_factory.mktemp("lab-root")
    for folder in ("notebooks", "release"):
        shutil.copytree(REPO / folder, root / folder)
    shutil.copy2(REPO / "nbgrader_config.py", root)
    server = labbrowser.JupyterLab(root, tmp_path_factory.mktemp("lab-scratch")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    playwright = playwright_api.sync_playwright().start()
    chromium = labbrowser.launch_chromium(playwright)
    yield chromium
    chromium.close()
    playwright.stop()


@pytest.fixture
def page(browser, lab):
    """A fresh browser context per notebook; its kernels are shut down afterwards."""
    context = browser.new_context(viewport=labbrowser.VIEWPORT)
    context.set_default_timeout(60_000)
    yield context.new_page()
    context.close()
    lab.shut_down_kernels()


@pytest.fixture(scope="module", autouse=True)
def report_times():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield
    if TIMES:
        lines = [f"{name:34s} {seconds:6.1f} s" for name, seconds in TIMES.items()]
        (ARTIFACTS / "times.txt").write_text("\n".join(lines) + "\n")
        print("\nTime in the browser, per notebook:\n  " + "\n  ".join(lines))


# -- helpers --------------------------------------------------------------------------

def save_notebook(page):
    page.locator(f'{PANEL} [data-jp-item-name="save"] jp-button').click()
    page.wait_for_function(
        "() => !document.querySelector('#jp-main-dock-panel .lm-TabBar-tab.jp-mod-dirty')",
        timeout=SAVE_TIMEOUT_MS)


def tracebacks_on_page(page):
    return page.evaluate(TRACEBACKS, PANEL)


def error_outputs(page, saved_path):
    """Save the notebook and list its outputs of type error: (cell, ename, evalue)."""
    save_notebook(page)
    notebook = nbformat.read(saved_path, as_version=4)
    return [(i, o.ename, o.evalue) for i, cell in enumerate(notebook.cells)
            for o in cell.get("outputs", []) if o.output_type == "error"]


def assert_ran_without_errors(page, saved_path):
    """Every code cell ran (from the saved file: folded cells show no prompt), no
    traceback on the page (widget outputs included) and, precisely, from the saved
    file, no output of type error; warnings are allowed."""
    tracebacks = tracebacks_on_page(page)
    assert not tracebacks, "traceback on the page:\n" + "\n\n".join(tracebacks)
    errors = error_outputs(page, saved_path)
    code = [c for c in nbformat.read(saved_path, as_version=4).cells if c.cell_type == "code"]
    not_run = [i for i, cell in enumerate(code) if cell.execution_count is None]
    assert not not_run, f"code cells {not_run} did not run"
    assert not errors, f"error outputs (cell, name, value): {errors}"


def move_sliders(page):
    """Step every slider once with the keyboard; each must redraw what it drives.
    Returns the labels of the sliders moved."""
    handles = page.locator(f"{PANEL} .widget-slider .noUi-handle")
    labels = []
    for index in range(handles.count()):
        handle = handles.nth(index)
        label = handle.evaluate(
            "h => h.closest('.widget-slider').querySelector('.widget-label').innerText")
        labels.append(label)
        element = handle.element_handle()
        handle.scroll_into_view_if_needed()
        # The view renders after the kernel has drawn: wait for the first drawing.
        page.wait_for_function(f"h => ({DRIVEN_OUTPUT})(h).length > 0", arg=element,
                               timeout=REDRAW_TIMEOUT_MS)
        before = handle.evaluate(DRIVEN_OUTPUT)
        value, top = (float(handle.get_attribute(a)) for a in ("aria-valuenow",
                                                                "aria-valuemax"))
        handle.press("ArrowLeft" if value >= top else "ArrowRight")
        try:
            page.wait_for_function(REDRAWN, arg=[element, before, PANEL],
                                   timeout=REDRAW_TIMEOUT_MS, polling=250)
        except playwright_api.TimeoutError:
            pytest.fail(f"slider {label!r} (#{index}) moved from {value}, but its figure "
                        f"and read-out did not change within {REDRAW_TIMEOUT_MS // 1000} s")
    return labels


def move_menus(page):
    """Pick another option of every drop-down and toggle-button menu once; each must
    redraw what it drives. Returns the labels of the menus moved."""
    menus = page.locator(f"{PANEL} :is(.widget-dropdown, .widget-toggle-buttons)")
    labels = []
    for index in range(menus.count()):
        menu = menus.nth(index)
        label = menu.evaluate(
            "m => (m.querySelector('.widget-label') || {innerText: ''}).innerText")
        labels.append(label)
        element = menu.element_handle()
        menu.scroll_into_view_if_needed()
        page.wait_for_function(f"h => ({DRIVEN_OUTPUT})(h).length > 0", arg=element,
                               timeout=REDRAW_TIMEOUT_MS)
        before = menu.evaluate(DRIVEN_OUTPUT)
        select = menu.locator("select")
        if select.count():
            values = select.evaluate("s => [...s.options].map(o => o.value)")
            select.select_option(next(v for v in values if v != select.input_value()))
        else:
            menu.locator(".widget-toggle-button:not(.mod-active)").first.click()
        try:
            page.wait_for_function(REDRAWN, arg=[element, before, PANEL],
                                   timeout=REDRAW_TIMEOUT_MS, polling=250)
        except playwright_api.TimeoutError:
            pytest.fail(f"menu {label!r} (#{index}) moved, but its figure and read-out "
                        f"did not change within {REDRAW_TIMEOUT_MS // 1000} s")
    return labels


def filled_in(released, source):
    """{cell index: the cell as a student who solved it would leave it}: the released
    stub replaced by the source's solution lines."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source for c in source.cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    answers = {}
    for index, cell in enumerate(released.cells):
        if not re.search(r"# YOUR CODE HERE\n\s*raise NotImplementedError\(\)", cell.source):
            continue
        solution = solutions[cell.metadata["nbgrader"]["grade_id"]]
        answers[index] = "\n".join(
            line for line in solution.splitlines()
            if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))
    return answers


def type_into_cell(page, cell, text):
    """Select the cell's text and type `text` over it, a line at a time: each line
    goes into the editor as one input event (as an input method or a paste sends it;
    key by key, the 6,500 characters of unit 01's answers took minutes and tested
    nothing more), and Enter between lines is a key press. After each Enter the editor
    indents the new line itself; Shift+Home selects that indent, so the line's own
    indentation replaces it."""
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+a")
    for number, line in enumerate(text.split("\n")):
        if number:
            page.keyboard.press("Enter")
            page.keyboard.press("Shift+Home")
        if line:
            page.keyboard.insert_text(line)
        else:  # clear a selected indent without joining lines
            page.keyboard.insert_text(" ")
            page.keyboard.press("Backspace")


def validate(page):
    """Press nbgrader's Validate in the notebook toolbar (it saves, then validates on
    the server); return the verdict dialog's classes and text."""
    page.locator(f"{PANEL} .validate-button").get_by_role("button", name="Validate").click()
    verdict = page.locator(".jp-Dialog #validation-message")
    verdict.wait_for(timeout=VALIDATE_TIMEOUT_MS)
    return verdict.get_attribute("class") or "", verdict.inner_text()


def close_dialog(page):
    page.locator(".jp-Dialog").get_by_role("button", name="Ok").click()
    page.locator(".jp-Dialog").wait_for(state="detached")


def stopwatch(name, started):
    TIMES[name] = time.monotonic() - started
    print(f"\n{name}: {TIMES[name]:.1f} s in the browser", end="")


# -- tests ----------------------------------------------------------------------------

@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_and_its_sliders_and_menus_redraw(lab, page, lesson):
    """Run All, then every slider, drop-down and toggle-button menu moved once, each
    redrawing what it drives (under the pinned ipywidgets: the lessons' menus are
    moved here, and under Colab's ipywidgets 7 in
    tests/publishing/test_colab_environment.py)."""
    started = time.monotonic()
    open_notebook(page, lab, f"notebooks/{lesson.name}", workspace=lesson.stem)
    run_seconds = run_all_cells(page)
    assert_ran_without_errors(page, lab.root / "notebooks" / lesson.name)

    labels = move_sliders(page)
    assert labels, "the lesson has sliders, and the page shows none"
    labels += move_menus(page)
    page.locator(f"{PANEL} .widget-slider").first.scroll_into_view_if_needed()
    page.screenshot(path=ARTIFACTS / f"{lesson.stem}.png")
    stopwatch(lesson.stem, started)
    print(f" (Run All {run_seconds:.1f} s; sliders and menus: {', '.join(labels)})", end="")


def test_assignment_typed_in_passes_validate(lab, page):
    path = f"release/{ASSIGNMENT}/{ASSIGNMENT}.ipynb"
    released = nbformat.read(REPO / path, as_version=4)
    source = nbformat.read(REPO / f"source/{ASSIGNMENT}/{ASSIGNMENT}.ipynb", as_version=4)
    answers = filled_in(released, source)
    assert answers, f"{path} has no cell to fill in"

    started = time.monotonic()
    open_notebook(page, lab, path, workspace=f"assignment-{ASSIGNMENT}")
    cells = page.locator(f"{PANEL} .jp-Notebook-cell")
    assert cells.count() == len(released.cells)
    classes, message = validate(page)  # as released, it must not pass
    assert "validation-failed" in classes and "NotImplementedError" in message, message
    close_dialog(page)

    for index, text in answers.items():
        type_into_cell(page, cells.nth(index), text)

    run_all_cells(page)  # the visible tests run under each exercise
    assert_ran_without_errors(page, lab.root / path)
    saved = nbformat.read(lab.root / path, as_version=4)
    for index, text in answers.items():
        assert saved.cells[index].source == text, f"cell {index} was not typed as written"

    classes, message = validate(page)
    page.screenshot(path=ARTIFACTS / f"validate_{ASSIGNMENT}.png")
    assert "validation-success" in classes, message
    assert "Success! Your notebook passes all the tests." in message
    stopwatch(f"validate_{ASSIGNMENT}", started)


def test_the_checks_flag_an_error_but_not_a_warning(lab, page):
    """The error checks above are not vacuous: a warning passes, an error is caught
    both on the page and in the saved file, and the cell after it never runs."""
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import warnings\nwarnings.warn('only a warning')"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('never reached')")])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    nbformat.write(notebook, lab.root / "selfcheck.ipynb")
    open_notebook(page, lab, "selfcheck.ipynb", workspace="selfcheck")
    run_all_cells(page)
    stderr = page.locator(f"{PANEL} [data-mime-type='application/vnd.jupyter.stderr']")
    assert "only a warning" in stderr.first.inner_text()
    tracebacks = tracebacks_on_page(page)
    assert len(tracebacks) == 1 and "ZeroDivisionError" in tracebacks[0]
    assert [(i, name) for i, name, _ in error_outputs(page, lab.root / "selfcheck.ipynb")] \
        == [(1, "ZeroDivisionError")]
    prompts = page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_inner_texts()
    assert prompts[2].strip() == "[ ]:"
