"""The graded notebook runs nothing when nbgrader's formgrader shows it.

The formgrader renders autograded/<student>/<assignment>/<notebook>.ipynb with
nbconvert's HTMLExporter and its own "formgrade" template
(nbgrader/server_extensions/formgrader/formgrader.py and handlers.py,
SubmissionHandler), in the instructor's logged-in page. The test renders a graded
notebook exactly so, loads the page in Chromium, and watches for any of the
hand-in's scripts running: first as the run left it (the test must see them run),
then as the grader writes it.
"""

import json

import nbformat
import pytest
from nbconvert.exporters import HTMLExporter
from nbgrader.server_extensions.formgrader import handlers
from traitlets.config import Config

from autograder.grading.inert import inert_graded_notebook
from labbrowser import chromium_session

# Each sets window.ran to its name when it runs.
SCRIPTS = {
    "html_script": {"text/html": "<p>plot</p><script>window.ran.push('html_script')</script>"},
    "html_handler": {"text/html": "<img src='data:,' onerror=\"window.ran.push('html_handler')\">"},
    "javascript": {"application/javascript": "window.ran.push('javascript')",
                   "text/plain": "<IPython.core.display.Javascript object>"},
    "svg_script": {"image/svg+xml": "<svg xmlns='http://www.w3.org/2000/svg'><script>"
                                    "window.ran.push('svg_script')</script></svg>"},
    "markdown_output": {"text/markdown": "**x** <img src='data:,' "
                                         "onerror=\"window.ran.push('markdown_output')\">"},
}


def _graded_notebook():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show()")
    cell.outputs = [nbformat.v4.new_output("display_data", data=data) for data in SCRIPTS.values()]
    # nbconvert writes an image's width into its tag unquoted
    cell.outputs.append(nbformat.v4.new_output(
        "display_data", data={"image/png": "iVBORw0KGgo="},
        metadata={"image/png": {"width": "1 src=x onerror=window.ran.push('png_width')",
                                "height": 20}}))
    nb.cells = [
        nbformat.v4.new_markdown_cell("My answer: x < y and\n> a quote\n\n"
                                      "<script>window.ran.push('markdown_cell')</script>"),
        nbformat.v4.new_raw_cell("<script>window.ran.push('raw_cell')</script>",
                                 metadata={"raw_mimetype": "text/html"}),
        cell,
    ]
    return nb


def _as_the_formgrader_renders_it(nb):
    config = Config()
    config.HTMLExporter.template_name = "formgrade"
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"assignment_id": "01_the_recipe", "notebook_id": "01_the_recipe",
                 "submission_id": "s1", "index": 0, "total": 1, "base_url": "",
                 "student": "ada", "last_name": "L", "first_name": "A",
                 "notebook_path": "/autograded/ada/01_the_recipe/01_the_recipe.ipynb"}
    html, _ = HTMLExporter(config=config).from_notebook_node(nb, resources=resources)
    return html


@pytest.fixture(scope="module")
def browser():
    yield from chromium_session()


def _scripts_that_ran(browser, html):
    page = browser.new_page()
    try:
        page.route("**/*", lambda route: route.abort())  # the formgrader's own files
        head = html.index("<head>") + len("<head>")
        # jQuery, which the formgrader page loads and its JavaScript outputs call
        stubs = "<script>window.ran = []; window.$ = window.jQuery = () => ({});</script>"
        page.set_content(html[:head] + stubs + html[head:],
                         wait_until="load")
        page.wait_for_timeout(300)
        return sorted(json.loads(page.evaluate("JSON.stringify(window.ran)")))
    finally:
        page.close()


def test_the_formgrader_runs_nothing_of_the_hand_ins(browser):
    nb = _graded_notebook()
    ran_before = _scripts_that_ran(browser, _as_the_formgrader_renders_it(nb))
    # the test sees them run when they can (raw cells nbconvert cleans itself)
    assert ran_before == ["html_handler", "html_script", "javascript", "markdown_cell",
                          "markdown_output", "png_width"]
    assert _scripts_that_ran(browser, _as_the_formgrader_renders_it(
        inert_graded_notebook(nb))) == []


def test_what_can_be_shown_is_kept():
    nb = inert_graded_notebook(_graded_notebook())
    markdown, raw, code = nb.cells
    assert markdown.source.startswith("My answer: x &lt; y and\n&gt; a quote")
    assert "<script" not in markdown.source + json.dumps(code.outputs)
    assert "onerror" not in markdown.source + json.dumps(code.outputs)
    assert raw.source == "<script>window.ran.push('raw_cell')</script>"  # shown as text
    assert "raw_mimetype" not in raw.metadata
    shown = [sorted(o.data) for o in code.outputs]
    assert shown == [["text/html"], ["text/html"], ["text/plain"], ["text/plain"],
                     ["text/markdown"], ["image/png"]]
    assert code.outputs[5].metadata == {"image/png": {"height": 20}}
    assert code.outputs[0].data["text/html"] == "<p>plot</p>"
    assert code.outputs[3].data["text/plain"].startswith("(an output the grader does not")

