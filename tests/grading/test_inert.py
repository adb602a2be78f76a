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
        # markdown's own links and images: nbconvert's renderer keeps javascript: targets
        # (they run when the instructor clicks) and remote images (they load on sight)
        nbformat.v4.new_markdown_cell(
            "[see](javascript:void(window.ran.push('markdown_link'))) and "
            "<javascript:void(window.ran.push('markdown_autolink'))> and [ref][r] "
            "![pixel](http://tracker.invalid/markdown_image.png)\n\n"
            "[r]: javascript:void(window.ran.push('markdown_reference'))"),
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
    """What of the hand-in ran or was fetched when the page loaded and its script links
    were clicked."""
    page = browser.new_page()
    fetched = []

    def refuse(route):  # the formgrader's own files, and anything the hand-in fetches
        if "tracker.invalid" in route.request.url:
            fetched.append(route.request.url.rsplit("/", 1)[-1].split(".")[0])
        route.abort()

    try:
        page.route("**/*", refuse)
        head = html.index("<head>") + len("<head>")
        # jQuery, which the formgrader page loads and its JavaScript outputs call
        stubs = "<script>window.ran = []; window.$ = window.jQuery = () => ({});</script>"
        page.set_content(html[:head] + stubs + html[head:],
                         wait_until="load")
        page.wait_for_timeout(300)
        # the links that run something (the page's own links would navigate away)
        page.evaluate("document.querySelectorAll('a[href]').forEach(a => "
                      "/^\\s*javascript:/i.test(a.getAttribute('href')) && a.click())")
        page.wait_for_timeout(300)
        return sorted(json.loads(page.evaluate("JSON.stringify(window.ran)")) + fetched)
    finally:
        page.close()


def test_the_formgrader_runs_nothing_of_the_hand_ins(browser):
    nb = _graded_notebook()
    ran_before = _scripts_that_ran(browser, _as_the_formgrader_renders_it(nb))
    # the test sees them run when they can (raw cells nbconvert cleans itself)
    assert ran_before == ["html_handler", "html_script", "javascript", "markdown_autolink",
                          "markdown_cell", "markdown_image", "markdown_link",
                          "markdown_output", "markdown_reference", "png_width"]
    assert _scripts_that_ran(browser, _as_the_formgrader_renders_it(
        inert_graded_notebook(nb))) == []


def test_what_can_be_shown_is_kept():
    nb = inert_graded_notebook(_graded_notebook())
    markdown, links, raw, code = nb.cells
    assert markdown.source.startswith("<p>My answer: x &lt; y and</p>\n<blockquote>")
    assert "a quote" in markdown.source
    assert ">see</a>" in links.source and 'alt="pixel"' in links.source  # text stays
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



PNG_1x1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5"
           "ErkJggg==")


def test_answers_with_maths_local_images_and_pasted_pictures_are_kept_and_render():
    """What honest answers hold stays as written: maths with comparisons, links to the
    web, a figure of the hand-in, a pasted picture (its PNG attachment kept, an SVG one
    dropped); an image of an attachment that is missing would stop nbconvert rendering
    the whole page, so it is shown as text."""
    honest = "Since $x<y$, see [the paper](https://arxiv.org/abs/1607.06450) and ![](fig.png)"
    pasted = nbformat.v4.new_markdown_cell("![shot](attachment:shot.png)")
    pasted.attachments = {"shot.png": {"image/png": PNG_1x1},
                          "evil.svg": {"image/svg+xml": "<svg><script>x</script></svg>"}}
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell(honest), pasted,
        nbformat.v4.new_markdown_cell("![lost](attachment:gone.png)")])
    inert = inert_graded_notebook(nb)
    assert inert.cells[0].source == honest
    assert inert.cells[1].source == "![shot](attachment:shot.png)"
    assert inert.cells[1].attachments == {"shot.png": {"image/png": PNG_1x1}}
    assert inert.cells[2].source == "<pre>![lost](attachment:gone.png)</pre>"
    html = _as_the_formgrader_renders_it(inert)
    assert f"data:image/png;base64,{PNG_1x1}" in html
    with pytest.raises(Exception, match="missing attachment"):
        _as_the_formgrader_renders_it(nb.__class__({**nb, "cells": nb.cells[2:]}))


def test_cell_ids_that_would_stop_nbconvert_are_replaced():
    """An invalid or repeated cell id (a hand-in edited as text) stops nbconvert, and
    with it the formgrader's page and Generate Feedback: each gets a valid, unique one;
    valid ids are kept."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)
                                         for text in ("a", "b", "c", "d")])
    nb.cells[0]["id"] = "kept"
    nb.cells[1]["id"] = "bad id <script>"
    nb.cells[2]["id"] = "kept"
    nb.cells[3]["id"] = "graded-1"
    inert = inert_graded_notebook(nb)
    ids = [cell["id"] for cell in inert.cells]
    assert ids[0] == "kept" and len(set(ids)) == 4
    nbformat.validate(inert)
    assert "<p>b</p>" in _as_the_formgrader_renders_it(inert)
