"""Messages a student can act on, and a demo that leaves the course alone.
"""

import csv
import functools
import json
from collections import defaultdict
from pathlib import Path

import nbformat
import nbgrader
import nbgrader.api
import numpy as np
import pytest
from bs4 import BeautifulSoup
from bs4.builder import builder_registry
from bs4.builder._htmlparser import HTMLParserTreeBuilder
from latex2mathml.converter import convert
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.course import Course
from autograder.grading import inert
from autograder.grading.grade import IN_KERNEL
from autograder.results import report
from autograder.results.report import _inert_notebook
from normref.checks.tolerances import mismatch


def test_numbers_that_print_alike_are_told_apart():
    """When yours and the answer agree to the decimals shown, the message names the
    entry that differs, at full precision."""
    message = mismatch(np.array([1.0, 2.0, 3.00001]), np.array([1.0, 2.0, 3.0]),
                       dtype="float64")
    assert "look alike" in message and "index (2,)" in message
    assert "3.00001" in message and "the answer 3" in message
    plain = mismatch(np.array([1.0, 2.5]), np.array([1.0, 2.0]), dtype="float64")
    assert "look alike" not in plain
    assert mismatch(np.array([1.0, 2.0]), np.array([1.0, 2.0]), dtype="float64") is None


def test_the_page_quietens_ungraded_errors_and_shows_nothing_after_a_hidden_test():
    """An ungraded cell's error is one grey line; from the first hidden test on, no
    output is shown (a hand-in's code can print the hidden tests); graded cells keep
    their source, with the hidden part folded away."""
    error = new_output("error", ename="NotImplementedError", evalue="", traceback=["tb"])
    graded = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1}}
    nb = new_notebook(cells=[
        new_code_cell("raise NotImplementedError()", outputs=[error]),
        new_code_cell("assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(2) == 4\n"
                      "### END HIDDEN TESTS", metadata=graded,
                      outputs=[new_output("stream", name="stdout", text="ok\n")]),
        new_code_cell("print(In)", outputs=[new_output("stream", name="stdout",
                                                       text="assert f(2) == 4\n")]),
    ])
    shown = _inert_notebook(nbformat.from_dict(nb))
    first, test, after = shown.cells
    assert [o.output_type for o in first.outputs] == ["stream"]
    assert first.outputs[0].text.startswith("(not graded) this cell stopped with "
                                            "NotImplementedError")
    assert "f(2)" not in test.source and "assert f(1) == 2" in test.source
    for cell in (test, after):
        assert "f(2)" not in str(cell.outputs) and "not shown" in cell.outputs[0].text
    everything = _inert_notebook(nbformat.from_dict(nb), show_hidden_tests=True)
    assert "f(2) == 4" in everything.cells[1].source
    assert everything.cells[2].outputs[0].text == "assert f(2) == 4\n"


# The exports of autograder/results/report.py, pinned to what students and instructors see.

# -- realistic results, as grade.py writes them ---------------------------------------------


def _cell(gid, points, top, *, reason=None, checks=(), checked="by the grader", **extra):
    return {"grade_id": gid, "points": points, "max_points": top, "kernel_ok": True,
            "reason": reason, "executed_forbidden": [], "checked": checked,
            "checks": [{"check": c, "passed": ok, "message": m} for c, ok, m in checks],
            **extra}


def _result(student="ada", **extra):
    result = {
        "student_id": student, "assignment": "01_the_recipe", "score": 3.0, "max_score": 8.0,
        "status": "graded", "reason": "", "flags": [], "notes": [],
        "cells": [
            _cell("token_mean_correct", 1.0, 1.0,
                  checks=[("token_mean", True, "token_mean: all 6 cases passed")]),
            _cell("token_var_correct", 0.0, 3.0, reason="token_var: case 2 differs",
                  checks=[("token_var", False, "token_var: case 2 differs")]),
            _cell("ln_single_token", 0.0, 2.0, reason="NameError: name 'mu' is not defined",
                  checks=[("layer_norm_token", True, "layer_norm_token: all passed")]),
            _cell("plain_asserts", 2.0, 2.0, checked=IN_KERNEL),
        ],
        "manual": [],
    }
    result.update(extra)
    return result


# -- grades.csv -------------------------------------------------------------------------------

def test_grades_csv_rows_carry_lateness_pending_and_flags(tmp_path):
    """A grades.csv that drops the late note, the penalty, the pending cells or the
    flags, or shows the raw score as final, hands the LMS a wrong grade."""
    late = _result("ada", score=4.0, final_score=3.6, pending=["essay", "task_one"],
                   flags=["edited tests", "odd output"], reason="",
                   lateness={"note": "1 d late; late penalty 10%", "penalty_fraction": 0.1,
                             "late": True})
    plain = {"student_id": "bob", "score": 0.0, "max_score": 8.0, "status": "invalid",
             "reason": "not a notebook"}
    no_penalty = _result("cy", score=8.0, lateness={"note": "on time",
                                                    "penalty_fraction": None})
    del no_penalty["reason"], no_penalty["flags"]  # an older result.json
    path = tmp_path / "grades.csv"
    report.write_grades_csv([late, plain, no_penalty], path)
    text = path.read_text()
    assert text.splitlines()[0] == ("student_id,score,max_score,pending,late,late_penalty,"
                                    "final_score,status,reason,flags")
    rows = list(csv.DictReader(text.splitlines()))
    assert rows == [
        {"student_id": "ada", "score": "4", "max_score": "8", "pending": "essay task_one",
         "late": "1 d late; late penalty 10%", "late_penalty": "0.1", "final_score": "3.6",
         "status": "graded", "reason": "", "flags": "edited tests; odd output"},
        {"student_id": "bob", "score": "0", "max_score": "8", "pending": "", "late": "",
         "late_penalty": "0", "final_score": "0", "status": "invalid",
         "reason": "not a notebook", "flags": ""},
        {"student_id": "cy", "score": "8", "max_score": "8", "pending": "", "late": "on time",
         "late_penalty": "0", "final_score": "8", "status": "graded", "reason": "",
         "flags": ""},
    ]


# -- Gradescope -------------------------------------------------------------------------------

def test_gradescope_results_one_test_per_cell_with_its_messages():
    """Gradescope shows each exercise with the grader's messages (the reason once, not
    twice), hand-graded cells as graded or pending, and the late note and notes."""
    result = _result(final_score=2.7, reason="a reason for the whole hand-in",
                     notes=["cell title was edited; the original was restored"],
                     lateness={"late": True, "note": "1 d late; late penalty 10%"},
                     manual=[{"grade_id": "essay", "max_points": 3.0, "points": 2.5},
                             {"grade_id": "task_one", "max_points": 1.0, "points": None}])
    got = report.gradescope_results(result)
    assert got["score"] == 2.7
    assert got["visibility"] == "visible"
    assert got["output"] == ("a reason for the whole hand-in\n1 d late; late penalty 10%\n"
                             "cell title was edited; the original was restored")
    assert got["tests"] == [
        {"name": "token_mean_correct", "score": 1.0, "max_score": 1.0,
         "output": "token_mean: all 6 cases passed", "visibility": "visible"},
        {"name": "token_var_correct", "score": 0.0, "max_score": 3.0,
         "output": "token_var: case 2 differs", "visibility": "visible"},
        {"name": "ln_single_token", "score": 0.0, "max_score": 2.0,
         "output": "layer_norm_token: all passed\nNameError: name 'mu' is not defined",
         "visibility": "visible"},
        {"name": "plain_asserts", "score": 2.0, "max_score": 2.0, "output": "",
         "visibility": "visible"},
        {"name": "essay", "score": 2.5, "max_score": 3.0, "visibility": "visible",
         "output": "graded by hand"},
        {"name": "task_one", "score": 0.0, "max_score": 1.0, "visibility": "visible",
         "output": "pending: graded by hand later"},
    ]


def test_gradescope_on_time_hand_in_shows_no_late_note_and_its_raw_score():
    """An on-time hand-in's note ("on time") is not a late warning; without a final
    score, the score is the raw one."""
    on_time = _result(lateness={"late": False, "note": "on time"})
    del on_time["notes"]  # an older result.json
    got = report.gradescope_results(on_time)
    assert got["output"] == "" and got["score"] == 3.0
    assert report.gradescope_results(_result(reason=None))["output"] == ""
    assert report.gradescope_results(_result(lateness={"late": True}))["output"] == ""


def test_gradescope_result_without_hand_graded_cells_lists_the_grader_cells_only():
    """An older result.json has no "manual" list: Gradescope still gets one test per
    grade cell, and no crash."""
    result = _result()
    del result["manual"]
    got = report.gradescope_results(result)
    assert [t["name"] for t in got["tests"]] == ["token_mean_correct", "token_var_correct",
                                                 "ln_single_token", "plain_asserts"]


# -- the sanitizer's attribute filter ----------------------------------------------------------

KEPT = [
    ("mi", "mathvariant", "bold"), ("mstyle", "displaystyle", " true "),
    ("mspace", "width", "0.167em"), ("div", "class", "jp-Cell"), ("div", "id", "cell-1"),
    ("abbr", "title", "layer norm"), ("span", "style", "color: red"),
    ("a", "href", "https://arxiv.org/abs/1607.06450"), ("a", "href", "http://example.org"),
    ("a", "href", "mailto:ta@example.edu"), ("a", "href", "#section-2"),
    ("a", "href", "HTTPS://Example.org"), ("a", "href", "\x01https://example.org"),
    ("img", "src", "  data:image/png;base64,iVBORw0KGgo=  "), ("img", "alt", "a plot"),
    ("img", "width", " 640 "), ("td", "colspan", " 2 "), ("img", "height", "50%"),
    ("col", "width", "12.5px"),
    ("td", "colspan", "2"), ("th", "rowspan", "3"), ("ol", "start", "4"),
    ("td", "align", "Center"), ("th", "align", "left"), ("tr", "align", "right"),
    ("col", "align", "center"), ("details", "open", ""),
]
DROPPED = [
    ("mi", "mathvariant", 'x" onload="alert(1)'), ("mi", "onclick", "x"),
    ("div", "display", "block"), ("div", "onclick", "alert(1)"),
    ("a", "href", "javascript:alert(1)"), ("a", "href", "java\tscript:alert(1)"),
    ("a", "href", "data:text/html,<script>"), ("div", "href", "https://example.org"),
    ("a", "alt", "https://example.org"), ("img", "src", "http://example.org/a.png"),
    ("div", "src", "data:image/png;base64,iVBORw0KGgo="), ("div", "alt", "x"),
    ("img", "width", "4 onload=alert(1)"), ("img", "height", "abc"), ("div", "width", "10"),
    ("td", "colspan", "2x"), ("div", "colspan", "2"), ("ol", "start", "x"),
    ("ul", "start", "3"), ("td", "align", "justify"), ("div", "align", "left"),
    ("div", "open", ""), ("img", "onerror", "alert(1)"),
]


def test_safe_attribute_keeps_what_pages_need_and_drops_the_rest():
    """The page keeps links to the web, data: images, table spans and MathML's
    attributes, and drops event handlers, javascript: links and remote images (a
    filter that lets one through runs a student's script in the TA's browser)."""
    assert [c for c in KEPT if not inert.safe_attribute(*c)] == []
    assert [c for c in DROPPED if inert.safe_attribute(*c)] == []


# -- the sanitizer -----------------------------------------------------------------------------

@pytest.mark.parametrize("tag", ["script", "style", "template", "noscript", "noembed",
                                 "noframes", "iframe", "object", "textarea", "title", "xmp"])
def test_sanitizer_drops_dangerous_tags_with_their_contents(tag):
    """A script or style sheet is dropped whole: stripping only the tag would print
    its code as text on the page."""
    cleaned = inert.sanitize_html(f"<p>before</p><{tag}>SECRET code</{tag}><p>after</p>")
    assert "SECRET" not in cleaned
    assert "before" in cleaned and "after" in cleaned


def test_sanitizer_drops_the_scripts_and_styles_of_a_head_inside_an_output():
    """A <head> in an output is no head (a browser ignores the tag in a page's body, as
    the sanitizer does): its scripts and style sheets still go whole."""
    cleaned = inert.sanitize_html("<p>before</p><head><script>SECRET()</script>"
                                  "<style>p{SECRET:1}</style><title>SECRET</title></head>"
                                  "<p>after</p>")
    assert "SECRET" not in cleaned
    assert "before" in cleaned and "after" in cleaned


def test_sanitizer_keeps_tables_links_images_and_colours_and_strips_the_rest():
    """What a notebook shows (tables, links, data: images, coloured tracebacks, maths)
    survives; unknown tags are stripped (not shown as escaped markup), comments go,
    and styles keep colours only (no overlay can be positioned)."""
    fragment = (
        "<table><thead><tr><th colspan='2'>h</th></tr></thead><tbody><tr><td>0.5</td>"
        "<td>1</td></tr></tbody></table>"
        "<p class='jp-RenderedText'><a href='https://arxiv.org/abs/1607.06450'>paper</a> "
        "<a href='http://example.org'>web</a> <a href='mailto:ta@example.edu'>mail</a></p>"
        "<img src='data:image/png;base64,iVBORw0KGgo=' alt='plot'>"
        "<span style='color: red; display: none; position: fixed; font-weight: bold'>"
        "Error</span><blink>blinking</blink><!-- a secret comment -->"
        "<math><mi mathvariant='bold'>x</mi></math>")
    cleaned = inert.sanitize_html(fragment)
    soup = BeautifulSoup(cleaned, "html.parser")
    assert soup.find("th")["colspan"] == "2" and soup.find("td").text == "0.5"
    assert [a["href"] for a in soup.find_all("a")] == [
        "https://arxiv.org/abs/1607.06450", "http://example.org", "mailto:ta@example.edu"]
    assert soup.find("p")["class"] == ["jp-RenderedText"]
    assert soup.find("img")["src"] == "data:image/png;base64,iVBORw0KGgo="
    style = soup.find("span")["style"].replace(" ", "")
    assert "color:red" in style and "font-weight:bold" in style
    assert "display" not in style and "position" not in style
    assert "blinking" in cleaned and "blink>" not in cleaned and "&lt;" not in cleaned
    assert "secret comment" not in cleaned
    assert soup.find("mi")["mathvariant"] == "bold"

class _PreferredParser(HTMLParserTreeBuilder):
    """Stands for lxml or html5lib: when installed, BeautifulSoup's default parser."""

    NAME = "preferred-parser"
    features = [NAME, "html", "fast"]

    def feed(self, markup):
        raise AssertionError("the sanitizer parsed with whichever parser is installed")


def test_sanitizer_parses_with_html_parser_whatever_else_is_installed(monkeypatch):
    """The pre-pass that drops scripts with their contents parses with Python's own
    html.parser, so installing lxml or html5lib does not change what a page shows."""
    monkeypatch.setattr(builder_registry, "builders", list(builder_registry.builders))
    monkeypatch.setattr(builder_registry, "builders_for_feature", defaultdict(
        list, {k: list(v) for k, v in builder_registry.builders_for_feature.items()}))
    builder_registry.register(_PreferredParser)
    assert inert.sanitize_html("<p>kept</p><script>SECRET</script>") == "<p>kept</p>"


# -- maths -------------------------------------------------------------------------------------

def test_unreadable_maths_stays_as_its_source_text():
    """Maths latex2mathml cannot read is shown as its source (escaped), with the
    dollars it had; readable maths becomes MathML, block or inline."""
    assert report._mathml(r"\begin{x}<b>", display=True) == r"$$\begin{x}&lt;b&gt;$$"
    assert report._mathml(r"\begin{x}<b>", display=False) == r"$\begin{x}&lt;b&gt;$"
    assert 'display="block"' in report._mathml("x^2", display=True)
    assert 'display="inline"' in report._mathml("x^2", display=False)


def test_markdown_maths_drawn_outside_code_within_the_budget():
    """$$..$$ is display maths, $..$ inline; code spans and blocks keep their dollars;
    at most `budget` formulas are drawn and the rest stay as source."""
    text = "Mean $a$ `$c$` and $$b$$ then\n```\n$d$\n```\n$e$ end"
    drawn, left = report._markdown_with_mathml(text, 10)
    assert drawn == ("Mean " + convert("a", display="inline") + " `$c$` and "
                     + convert("b", display="block") + " then\n```\n$d$\n```\n"
                     + convert("e", display="inline") + " end")
    assert left == 7
    drawn, left = report._markdown_with_mathml("$a$ and $b$ and $e$", 2)
    assert drawn.count("<math") == 2 and drawn.endswith("and $e$") and left == 0
    drawn, left = report._markdown_with_mathml("$a$", 0)
    assert drawn == "$a$" and left == 0
    assert report._markdown_with_mathml("$x$")[1] == report.MAX_MATHS - 1


# -- the notebook shown on the page ------------------------------------------------------------

GRADED = {"nbgrader": {"grade": True, "grade_id": "t", "points": 1}}


def test_is_graded_reads_nbgrader_metadata_and_tolerates_its_absence():
    """Only a cell nbgrader grades counts as graded; a cell without metadata (a
    hand-edited notebook) is ungraded, not a crash."""
    assert report._is_graded({"metadata": GRADED})
    assert not report._is_graded({"metadata": {"nbgrader": {"grade": False}}})
    assert not report._is_graded({"metadata": {}})
    assert not report._is_graded({"cell_type": "code"})


def test_quiet_ungraded_error_is_one_line_with_a_short_message():
    """An ungraded cell's error becomes one stdout line naming the error, its message
    cut at 300 characters."""
    out = report._quiet_ungraded_error({"ename": "ValueError", "evalue": "v" * 299 + "XY"})
    assert out["output_type"] == "stream" and out["name"] == "stdout"
    assert out["text"] == "(not graded) this cell stopped with ValueError: " + "v" * 299 + "X\n"


HIDDEN_CELL = ("assert f(1) == 2\n### BEGIN HIDDEN TESTS\n    assert f(2) == 4.0\n"
               "assert g(3)==9\nshort\nassert f(3) == 6.0\n### END HIDDEN TESTS")


def test_hidden_test_lines_are_the_long_lines_between_the_markers():
    """Every hidden-test line of 12 characters or more, indentation stripped, is
    found (the first and last included); markers, short lines, visible tests and
    markdown are not."""
    nb = new_notebook(cells=[
        new_code_cell(HIDDEN_CELL),
        new_markdown_cell("### BEGIN HIDDEN TESTS\nassert markdown_is_not_code()\n"
                          "### END HIDDEN TESTS"),
    ])
    assert report.hidden_test_lines(nb) == {"assert f(2) == 4.0", "assert g(3)==9",
                                            "assert f(3) == 6.0"}


def test_hidden_test_lines_of_every_block_from_twelve_characters_on():
    """A line of exactly 12 characters is distinctive enough to scrub, 11 is not; the
    lines of every hidden block, in every cell, are collected."""
    nb = new_notebook(cells=[
        new_code_cell("### BEGIN HIDDEN TESTS\nassert a==12\nassert a==1\n"
                      "### END HIDDEN TESTS\n### BEGIN HIDDEN TESTS\nassert second()\n"
                      "### END HIDDEN TESTS"),
        new_code_cell("### BEGIN HIDDEN TESTS\nassert third_cell()\n### END HIDDEN TESTS"),
    ])
    assert len("assert a==12") == 12
    assert report.hidden_test_lines(nb) == {"assert a==12", "assert second()",
                                            "assert third_cell()"}


def test_scrub_hidden_replaces_every_hidden_line():
    """A traceback that quotes a hidden test shows "[hidden test]" instead."""
    text = "line 3: assert f(2) == 4.0\nAssertionError\nassert f(3) == 6.0"
    assert report.scrub_hidden(text, {"assert f(2) == 4.0", "assert f(3) == 6.0",
                                      "not in there at all"}) == \
        "line 3: [hidden test]\nAssertionError\n[hidden test]"


def _outputs(cell):
    return [(o["output_type"], o.get("text") or dict(o.get("data", {})) or o.get("ename"))
            for o in cell.outputs]


def test_inert_notebook_cleans_outputs_before_the_hidden_tests_and_hides_after():
    """Widget state goes; scripts' mimetypes go, shown ones stay; an ungraded cell's
    error is one line, a graded one's stays; from the first hidden test on, sources
    are folded and outputs replaced; the original notebook is left as it was."""
    error = new_output("error", ename="NameError", evalue="name 'x' is not defined",
                       traceback=["tb"])
    nb = new_notebook(cells=[
        new_code_cell("display(w)", outputs=[new_output("display_data", data={
            "text/plain": "slider", "application/javascript": "alert(1)",
            "image/png": "iVBORw0KGgo="})]),
        new_code_cell("x", outputs=[error]),
        new_code_cell("x", metadata=GRADED, outputs=[error]),
        new_code_cell(HIDDEN_CELL, metadata=GRADED,
                      outputs=[new_output("stream", name="stdout", text="ok\n")]),
        new_markdown_cell("after $a$"),
        new_code_cell("print(In)", outputs=[new_output("stream", name="stdout",
                                                       text="assert f(2) == 4.0\n")]),
    ])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    original = json.dumps(nb, sort_keys=True)
    shown = report._inert_notebook(nbformat.from_dict(nb))
    assert json.dumps(nb, sort_keys=True) == original
    assert "widgets" not in shown.metadata
    cells = shown.cells
    assert _outputs(cells[0]) == [("display_data", {"text/plain": "slider",
                                                    "image/png": "iVBORw0KGgo="})]
    assert _outputs(cells[1]) == [("stream", "(not graded) this cell stopped with NameError: "
                                             "name 'x' is not defined\n")]
    assert _outputs(cells[2]) == [("error", "NameError")]
    assert cells[3].source == "assert f(1) == 2\n# (hidden tests: the grader ran them)"
    hidden_note = [("stream", report._OUTPUTS_AFTER_HIDDEN)]
    assert "could show the hidden tests" in report._OUTPUTS_AFTER_HIDDEN
    assert _outputs(cells[3]) == hidden_note and _outputs(cells[5]) == hidden_note
    assert cells[4].source == "after " + convert("a", display="inline")
    everything = report._inert_notebook(nbformat.from_dict(nb), show_hidden_tests=True)
    assert everything.cells[3].source == HIDDEN_CELL
    assert _outputs(everything.cells[5]) == [("stream", "assert f(2) == 4.0\n")]


def test_inert_notebook_leaves_the_notebook_it_is_given_as_it_was():
    """The page is drawn from a copy: the caller's notebook keeps its widget state,
    its hidden tests, its maths source and its outputs."""
    nb = new_notebook(cells=[
        new_markdown_cell("mean $a$"),
        new_code_cell(HIDDEN_CELL, metadata=GRADED,
                      outputs=[new_output("stream", name="stdout", text="ok\n")]),
    ])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    original = json.dumps(nb, sort_keys=True)
    report._inert_notebook(nb)
    assert json.dumps(nb, sort_keys=True) == original


def test_maths_budget_is_shared_by_the_page_and_long_cells_keep_their_source(monkeypatch):
    """The formula budget runs across cells (a page of thousands of formulas stays
    small); a markdown cell longer than the limit keeps its maths as source; a code
    cell's dollars are code."""
    monkeypatch.setattr(report, "MAX_MATHS", 3)
    long_cell = "$z$ " + "w" * 20
    monkeypatch.setattr(report, "MAX_MATHS_CELL_CHARS", len(long_cell) - 1)
    nb = new_notebook(cells=[new_markdown_cell("$a$ $b$"), new_code_cell("s = '$c$ $d$'"),
                             new_markdown_cell(long_cell), new_markdown_cell("$e$ $f$ $g$"),
                             new_markdown_cell("$h$")])
    shown = report._inert_notebook(nb)
    assert [c.source.count("<math") for c in shown.cells] == [2, 0, 0, 1, 0]
    assert shown.cells[1].source == "s = '$c$ $d$'"
    assert shown.cells[2].source == long_cell
    assert shown.cells[3].source.endswith(" $f$ $g$")
    monkeypatch.setattr(report, "MAX_MATHS_CELL_CHARS", len(long_cell))
    assert report._inert_notebook(nb).cells[2].source.count("<math") == 1


def test_inert_notebook_keeps_a_code_cell_without_outputs():
    """A code cell saved without an outputs list (a hand-edited notebook) renders."""
    nb = new_notebook(cells=[new_code_cell("x = 1")])
    del nb.cells[0]["outputs"]
    assert report._inert_notebook(nb).cells[0].outputs == []


def test_render_notebook_gives_the_style_sheets_and_the_sanitized_body():
    """The page gets the template's style sheets (nothing else of its head) and the
    notebook's cells, without nbconvert's <main> wrapper or any script."""
    nb = new_notebook(cells=[new_markdown_cell("# Layer norm notes"),
                             new_code_cell("1 + 1", outputs=[new_output(
                                 "execute_result", data={"text/plain": "2"},
                                 execution_count=1)])])
    styles, body = report._render_notebook(nb)
    assert styles.startswith("<style") and styles.endswith("</style>")
    assert "<title" not in styles and "<meta" not in styles and "<script" not in styles
    assert ".jp-Notebook" in styles or ".jp-Cell" in styles
    soup = BeautifulSoup(body, "html.parser")
    assert soup.find("main") is None and soup.find("body") is None
    assert soup.find("h1").get_text().startswith("Layer norm notes")
    assert body.lstrip().startswith('<div class="jp-Cell')
    assert "<script" not in body


def test_render_notebook_folds_hidden_tests_by_default_and_says_why_outputs_are_gone():
    """Unless asked, the rendered page folds the hidden tests away, and the cell from
    the first hidden test on shows the note that its outputs are not shown."""
    nb = new_notebook(cells=[new_code_cell(HIDDEN_CELL, outputs=[
        new_output("stream", name="stdout", text="assert f(2) == 4.0\n")])])
    text = BeautifulSoup(report._render_notebook(nb)[1], "html.parser").get_text()
    assert "f(2)" not in text and "hidden tests: the grader ran them" in text
    assert report._OUTPUTS_AFTER_HIDDEN.strip() in text


def test_render_notebook_keeps_every_cell_around_a_student_main_tag():
    """A student's own <main> and </main> (raw HTML in markdown) do not cut the
    notebook: the cells before and after them are on the page."""
    nb = new_notebook(cells=[new_markdown_cell("Before the tag"),
                             new_markdown_cell("<main>student main</main>"),
                             new_markdown_cell("After the tag")])
    text = BeautifulSoup(report._render_notebook(nb)[1], "html.parser").get_text()
    assert text.index("Before the tag") < text.index("student main") < \
        text.index("After the tag")


# -- the score table and the page --------------------------------------------------------------

def _style(tag):
    return dict(part.split(":", 1) for part in tag["style"].split(";") if part)


def test_summary_html_shows_every_cell_its_messages_and_the_late_score():
    """The score table: each exercise's points and messages (the reason once), the
    in-kernel and by-hand notes, hand-graded cells, the late note first with the
    final score, all escaped, in a box drawn above everything."""
    result = _result(student="<b>eve</b>", score=5.0, final_score=4.5,
                     reason="<i>partly</i> graded", notes=["a <note>"],
                     lateness={"late": True, "note": "1 d late; late penalty 10%"},
                     manual=[{"grade_id": "essay", "max_points": 3.0, "points": 2.5},
                             {"grade_id": "task_one", "max_points": 1.0, "points": None}])
    result["cells"][0]["by_hand"] = True
    result["cells"][0]["grade_id"] = "<mean>"
    soup = BeautifulSoup(report._summary_html(result), "html.parser")
    section = soup.find("section")
    style = _style(section)
    assert style["z-index"] == "2147483647" and style["position"] == "relative"
    assert style["opacity"] == "1" and style["visibility"] == "visible"
    assert style["display"] == "block" and style["background"] == "#fff"
    assert section.find("h1").get_text() == "01_the_recipe: <b>eve</b>"
    assert section.find("p").get_text() == (
        "Score: 4.5 (earned 5, less the late penalty) / 8 (graded) <i>partly</i> graded")
    assert [li.get_text() for li in section.find_all("li")] == [
        "1 d late; late penalty 10%; score after the late policy: 4.5", "a <note>"]
    table = section.find("table")
    rows = [[td.get_text("|") for td in tr.find_all(["td", "th"])]
            for tr in table.find_all("tr")]
    assert rows == [
        ["exercise", "points", "what the grader found"],
        ["<mean>", "1 / 1", "token_mean: all 6 cases passed|score given by hand"],
        ["token_var_correct", "0 / 3", "token_var: case 2 differs"],
        ["ln_single_token", "0 / 2",
         "layer_norm_token: all passed|NameError: name 'mu' is not defined"],
        ["plain_asserts", "2 / 2", "(this exercise's tests run inside your own kernel: "
                                   "plain asserts, as nbgrader runs them)"],
        ["essay", "2.5 / 3", "graded by hand"],
        ["task_one", "pending / 1", "graded by hand (not yet)"],
    ]
    assert [s.strip() for s in section.find_all(string=True, recursive=False)
            if s.strip()] == []
    assert [s.strip() for s in table.find_all(string=True, recursive=False) if s.strip()] == []


def test_summary_html_without_lateness_or_notes_has_no_list():
    """An on-time hand-in with no notes shows no note list, and no reason text."""
    result = _result(reason=None, lateness={"late": False, "note": "on time"})
    del result["manual"], result["notes"]  # an older result.json
    soup = BeautifulSoup(report._summary_html(result), "html.parser")
    assert soup.find("ul") is None
    assert [s.strip() for s in soup.find("section").find_all(string=True, recursive=False)
            if s.strip()] == []
    assert soup.find("p").get_text() == "Score: 3 / 8 (graded) "
    late = BeautifulSoup(report._summary_html(_result(lateness={"late": True})),
                         "html.parser")
    assert late.find("li").get_text() == "late; score after the late policy: 3"


def test_summary_html_lists_each_note_as_its_own_item():
    """Several notes are several list items, with nothing between them."""
    result = _result(notes=["first note", "second note"])
    ul = BeautifulSoup(report._summary_html(result), "html.parser").find("ul")
    assert [li.get_text() for li in ul.find_all("li")] == ["first note", "second note"]
    assert [s for s in ul.find_all(string=True, recursive=False) if s.strip()] == []


def _page_skeleton(page):
    soup = BeautifulSoup(page, "html.parser")
    stray = [s.strip() for parent in (soup, soup.html, soup.head, soup.body)
             for s in parent.find_all(string=True, recursive=False)
             if s.strip() and not s.strip().startswith("html")]
    return soup, stray


def test_feedback_page_skeleton_csp_first_table_first_notebook_boxed(tmp_path):
    """The page: CSP as the first thing in <head>, the escaped title, the score table
    as the body's first element and the notebook boxed below it; nothing else."""
    result = _result(student="<eve>")
    page = report.feedback_html(result, None)
    assert page.startswith("<!DOCTYPE html>\n")
    soup, stray = _page_skeleton(page)
    assert stray == []
    assert soup.html["lang"] == "en"
    metas = soup.head.find_all("meta")
    assert metas[0]["http-equiv"] == "Content-Security-Policy"
    assert metas[0]["content"] == report.CONTENT_SECURITY_POLICY
    assert metas[1]["charset"] == "utf-8"
    assert metas[2]["name"] == "viewport" and "width=device-width" in metas[2]["content"]
    assert soup.head.find("title").get_text() == "01_the_recipe: <eve> (feedback)"
    assert soup.head.find("style") is None
    assert soup.body["class"] == ["jp-Notebook"]
    assert soup.body["data-jp-theme-light"] == "true"
    assert soup.body["data-jp-theme-name"] == "JupyterLab Light"
    first, box = soup.body.find_all(recursive=False)
    assert first.name == "section" and "Score: 3 / 8" in first.get_text()
    assert box.name == "div" and box["style"] == report.NOTEBOOK_BOX_STYLE
    assert box.find("main").get_text() == ""
    assert report.feedback_html(result, tmp_path / "missing.ipynb") == page


def test_feedback_page_of_several_notebooks_names_each(tmp_path):
    """One notebook: its cells, hidden tests folded unless asked; several: each under
    a heading with its file name, a missing one skipped."""
    nb = new_notebook(cells=[new_markdown_cell("# Part one text"), new_code_cell(HIDDEN_CELL)])
    first, second = tmp_path / "part_a.ipynb", tmp_path / "part_b.ipynb"
    nbformat.write(nb, first)
    nb.cells[0].source = "# Part two text"
    nbformat.write(nb, second)
    page = report.feedback_html(_result(), first)
    single, stray = _page_skeleton(page)
    assert stray == []
    assert single.find("h2") is None and single.head.find("style") is not None
    main = single.find("main")
    assert [s for s in main.find_all(string=True, recursive=False) if s.strip()] == []
    assert "Part one text" in main.get_text() and "f(2)" not in main.get_text()
    shown = BeautifulSoup(report.feedback_html(_result(), first, show_hidden_tests=True),
                          "html.parser")
    assert "assert f(2) == 4.0" in shown.find("main").get_text()
    several = BeautifulSoup(report.feedback_html(
        _result(), [first, tmp_path / "gone.ipynb", None, second]), "html.parser")
    main = several.find("main")
    assert [s for s in main.find_all(string=True, recursive=False) if s.strip()] == []
    assert [h.get_text() for h in main.find_all("h2")] == ["part_a.ipynb", "part_b.ipynb"]
    text = main.get_text()
    assert text.index("part_a.ipynb") < text.index("Part one text") < \
        text.index("part_b.ipynb") < text.index("Part two text")


# -- lateness ----------------------------------------------------------------------------------

def test_a_broken_deadlines_file_is_a_note_not_a_lost_report(tmp_path):
    """deadlines.json that cannot be used: the report says so and the score stands."""
    (tmp_path / "deadlines.json").write_text('{"policy": {"percent_per_day": -5}}')
    got = report._with_lateness(Course(tmp_path), "hw", _result(score=6.0))
    assert got["final_score"] == 6.0
    assert got["lateness"]["penalty_fraction"] == 0.0
    assert got["lateness"]["note"].startswith("lateness unknown: deadlines.json: policy."
                                              "percent_per_day must be a number >= 0")


# -- write_reports on a tiny course ------------------------------------------------------------

def _meta(gid, **flags):
    return {"nbgrader": {"schema_version": 3, "grade_id": gid, "locked": False,
                         "grade": False, "solution": False, **flags}}


def _source_notebook():
    return new_notebook(cells=[
        new_markdown_cell("# Homework one"),
        new_code_cell("def f(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                      "    ### END SOLUTION", metadata=_meta("answer", solution=True)),
        new_code_cell(HIDDEN_CELL, metadata=_meta("test_f", grade=True, points=2, locked=True)),
        new_markdown_cell("Explain.", metadata=_meta("essay", grade=True, solution=True,
                                                     points=3)),
    ])


@functools.cache
def _alembic_head():
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(Path(nbgrader.__file__).parent / "alembic")).get_current_head()


@pytest.fixture
def tiny_course(tmp_path, monkeypatch):
    # nbgrader runs `alembic heads` (a subprocess: seconds) for each new gradebook.
    monkeypatch.setattr(nbgrader.api, "get_alembic_version", _alembic_head)
    course = Course(tmp_path)
    (course.source / "hw").mkdir(parents=True)
    nbformat.write(_source_notebook(), course.source / "hw" / "hw.ipynb")
    run = _source_notebook()
    run.cells[2].outputs = [new_output("stream", name="stdout", text="checked\n")]
    run.cells[2].execution_count = 1
    (course.autograded / "ada" / "hw").mkdir(parents=True)
    nbformat.write(run, course.autograded / "ada" / "hw" / "hw.ipynb")
    (tmp_path / "deadlines.json").write_text(json.dumps(
        {"policy": {"percent_per_day": 10}, "assignments": {"hw": {"due": "2026-10-01 23:59"}}}))
    (course.submitted / "ada" / "hw").mkdir(parents=True)
    (course.submitted / "ada" / "hw" / "timestamp.txt").write_text(
        "2026-10-02 23:59:00.000000 UTC")
    (tmp_path / "roster.json").write_text(json.dumps({"students": [
        {"id": "ada", "name": "Lovelace, Ada", "lms_id": "4711", "email": "ada@uni.edu"},
        {"id": "bob", "name": "Bob"}]}))
    return course


def _hw_results():
    # a one-notebook grader's manual cells name no notebook
    manual = [{"grade_id": "essay", "max_points": 3.0, "points": None, "status": "pending"}]
    ada = {"student_id": "ada", "assignment": "hw", "score": 2.0, "max_score": 5.0,
           "status": "graded", "reason": "", "flags": [], "notes": [], "manual": manual,
           "cells": [_cell("test_f", 2.0, 2.0, checked=IN_KERNEL, notebook="hw")]}
    bob = {"student_id": "bob", "assignment": "hw", "score": 0.0, "max_score": 5.0,
           "status": "invalid", "reason": "hw.ipynb is not a notebook", "flags": [],
           "notes": [], "manual": manual, "cells": []}
    return [ada, bob]


def _csv(path):
    return list(csv.reader(path.read_text().splitlines()))


def test_write_reports_exports_every_file_with_hand_grades_and_lateness(tiny_course):
    """One run writes results.json, grades.csv, Gradescope JSON, feedback pages (the
    notebook only for a graded hand-in, hidden tests folded unless asked), the class
    summary and the LMS imports; a score given by hand in the formgrader reaches
    every export on the next run, the late penalty applied."""
    from nbgrader.api import Gradebook

    from autograder.results.gradebook import gradebook_url

    folder, results = report.write_reports(course=tiny_course, assignment="hw",
                                           results=_hw_results())
    assert folder == tiny_course.reports / "hw"
    assert json.loads((folder / "results.json").read_text()) == results
    assert [(r["student_id"], r["pending"], r["final_score"]) for r in results] == [
        ("ada", ["essay"], 1.8), ("bob", ["essay"], 0.0)]
    assert "1 d late" in results[0]["lateness"]["note"]
    rows = _csv(folder / "grades.csv")
    assert [r[:8] for r in rows[1:]] == [["ada", "2", "5", "essay", rows[1][4], "0.1", "1.8",
                                         "graded"],
                                        ["bob", "0", "5", "essay", rows[2][4], "0", "0",
                                         "invalid"]]
    gradescope = json.loads((folder / "gradescope" / "ada.json").read_text())
    assert gradescope["score"] == 1.8
    assert [t["name"] for t in gradescope["tests"]] == ["test_f", "essay"]
    page = (folder / "feedback" / "ada.html").read_text()
    main = BeautifulSoup(page, "html.parser").find("main").get_text()
    assert "Homework one" in main and "assert f(1) == 2" in main and "f(2)" not in main
    bob_page = BeautifulSoup((folder / "feedback" / "bob.html").read_text(), "html.parser")
    assert bob_page.find("main").get_text() == ""
    assert "hw.ipynb is not a notebook" in bob_page.find("section").get_text()
    assert (folder / "summary.txt").read_text().startswith("hw: 1 of 2 graded\n")
    assert (folder / "summary.html").read_text().startswith("<!DOCTYPE html>")
    assert _csv(folder / "canvas_import.csv")[1:] == [
        ["Points Possible", "", "", "", "", "5"],
        ["Lovelace, Ada", "4711", "", "ada@uni.edu", "", "1.8"]]
    assert _csv(folder / "moodle_import.csv")[1:] == [
        ["Lovelace, Ada", "ada@uni.edu", "", "1.8"]]
    assert (folder / "lms_import_left_out.txt").read_text() == (
        "Not in canvas_import.csv (no Canvas user id in the roster):\nbob\n"
        "Not in moodle_import.csv (no e-mail or Moodle ID number in the roster):\nbob\n")

    with Gradebook(gradebook_url(tiny_course)) as gradebook:
        gradebook.find_grade("essay", "hw", "hw", "ada").manual_score = 2.5
        gradebook.db.commit()
    folder, results = report.write_reports(course=tiny_course, assignment="hw",
                                           results=_hw_results(), show_hidden_tests=True)
    assert [(r["score"], r["pending"], r["final_score"]) for r in results] == [
        (4.5, [], 4.05), (0.0, ["essay"], 0.0)]
    assert _csv(folder / "grades.csv")[1][1] == "4.5"
    assert _csv(folder / "canvas_import.csv")[2][-1] == "4.05"
    main = BeautifulSoup((folder / "feedback" / "ada.html").read_text(),
                         "html.parser").find("main").get_text()
    assert "assert f(2) == 4.0" in main
    with Gradebook(gradebook_url(tiny_course)) as gradebook:
        assert gradebook.find_submission_notebook("hw", "hw", "ada") \
            .late_submission_penalty == pytest.approx(0.45)


def test_write_reports_json_layout_and_no_notebook_for_an_ungraded_hand_in(tiny_course):
    """results.json and the Gradescope files are written with a one-space indent (one
    key a line, as instructors read them); a hand-in that was not graded gets a page
    without a notebook, even when an old run of it is on disk."""
    run = tiny_course.autograded / "bob" / "hw"
    run.mkdir(parents=True)
    nbformat.write(_source_notebook(), run / "hw.ipynb")
    folder, results = report.write_reports(course=tiny_course, assignment="hw",
                                           results=_hw_results())
    assert (folder / "results.json").read_text() == json.dumps(results, indent=1)
    for r in results:
        assert (folder / "gradescope" / f"{r['student_id']}.json").read_text() == \
            json.dumps(report.gradescope_results(r), indent=1)
    bob_page = BeautifulSoup((folder / "feedback" / "bob.html").read_text(), "html.parser")
    assert bob_page.find("main").get_text() == ""


def test_a_feedback_page_is_made_again_only_when_what_it_shows_changed(tiny_course):
    """Regrading one student of a large class rewrites that student's page, not
    everyone's: a page whose result, graded notebook and options are unchanged is kept
    as it is; a new score, a changed graded run or showing the hidden tests remakes it."""
    folder, _ = report.write_reports(course=tiny_course, assignment="hw", results=_hw_results())
    pages = {s: folder / "feedback" / f"{s}.html" for s in ("ada", "bob")}
    stamps = {s: page.stat().st_mtime_ns for s, page in pages.items()}
    report.write_reports(course=tiny_course, assignment="hw", results=_hw_results())
    assert {s: page.stat().st_mtime_ns for s, page in pages.items()} == stamps

    rescored = _hw_results()
    rescored[1]["reason"] = "hw.ipynb is empty"
    report.write_reports(course=tiny_course, assignment="hw", results=rescored)
    assert pages["ada"].stat().st_mtime_ns == stamps["ada"]
    assert "hw.ipynb is empty" in pages["bob"].read_text()

    run = tiny_course.autograded / "ada" / "hw" / "hw.ipynb"
    notebook = nbformat.read(run, as_version=4)
    notebook.cells[0].source = "# Homework one, graded again"
    nbformat.write(notebook, run)
    report.write_reports(course=tiny_course, assignment="hw", results=rescored)
    assert "graded again" in pages["ada"].read_text()

    report.write_reports(course=tiny_course, assignment="hw", results=rescored,
                         show_hidden_tests=True)
    shown = BeautifulSoup(pages["ada"].read_text(), "html.parser").find("main").get_text()
    assert "assert f(2) == 4.0" in shown


def test_only_images_that_came_with_the_hand_in_are_drawn_inline(tmp_path):
    """A markdown image of a file in the hand-in's folder is drawn from its bytes (the
    page loads nothing); a path out of the folder, a link, a file too large or of
    another type stays as written, and the sanitizer then drops its address."""
    import base64
    import os

    handin = tmp_path / "handin"
    handin.mkdir()
    (handin / "plot.png").write_bytes(b"\x89PNG picture")
    (tmp_path / "secret.png").write_bytes(b"another student's")
    os.symlink(tmp_path / "secret.png", handin / "link.png")
    (handin / "big.gif").write_bytes(b"0" * (report.MAX_INLINE_IMAGE_BYTES + 1))
    (handin / "notes.txt").write_text("text")
    text = ("![a](plot.png) ![b](../secret.png) ![c](link.png) ![d](big.gif) "
            "![e](notes.txt) ![f](missing.png)")
    inlined = report._with_inline_images(text, handin)
    picture = base64.b64encode(b"\x89PNG picture").decode()
    assert inlined == text.replace("(plot.png)", f"(data:image/png;base64,{picture})")
    assert report._with_inline_images(text, None) == text


def test_class_exports_without_a_usable_roster_are_the_summary_only(tiny_course, tmp_path):
    """No roster, or one that cannot be read: the class summary, no LMS files; a
    student only Moodle can match is listed as left out (of Canvas's file)."""
    results = [{**r, "final_score": r["score"], "pending": []} for r in _hw_results()]
    for roster in (None, "{not json"):
        path = Path(tiny_course.root) / "roster.json"
        path.unlink(missing_ok=True)
        if roster:
            path.write_text(roster)
        folder = tmp_path / f"out-{roster is None}"
        folder.mkdir()
        report._write_class_exports(course=tiny_course, assignment="hw", results=results,
                                    folder=folder)
        assert sorted(p.name for p in folder.iterdir()) == ["summary.html", "summary.txt"]
    (Path(tiny_course.root) / "roster.json").write_text(json.dumps({"students": [
        {"id": "ada", "name": "Ada", "lms_id": "1"},
        {"id": "bob", "name": "Bob", "email": "bob@uni.edu"}]}))
    folder = tmp_path / "out-full"
    folder.mkdir()
    report._write_class_exports(course=tiny_course, assignment="hw", results=results,
                                folder=folder)
    assert sorted(p.name for p in folder.iterdir()) == [
        "canvas_import.csv", "lms_import_left_out.txt", "moodle_import.csv", "summary.html",
        "summary.txt"]
    assert (folder / "lms_import_left_out.txt").read_text() == (
        "Not in canvas_import.csv (no Canvas user id in the roster):\nbob\n"
        "Not in moodle_import.csv (no e-mail or Moodle ID number in the roster):\nada\n")
    assert (folder / "summary.txt").read_text().endswith("\n")
    assert _csv(folder / "canvas_import.csv")[1] == ["Points Possible", "", "", "", "", "5"]


def test_class_exports_name_the_assignment_and_list_each_left_out_student(tiny_course,
                                                                          tmp_path):
    """The LMS files' grade column is headed with the assignment's name (what the LMS
    matches it on); every student left out is on a line of their own."""
    results = [{**r, "final_score": r["score"], "pending": []} for r in _hw_results()]
    results.append({**results[1], "student_id": "cy"})
    (Path(tiny_course.root) / "roster.json").write_text(json.dumps({"students": [
        {"id": "ada", "name": "Ada", "lms_id": "1", "email": "ada@uni.edu"},
        {"id": "bob", "name": "Bob"}, {"id": "cy", "name": "Cy"}]}))
    report._write_class_exports(course=tiny_course, assignment="hw", results=results,
                                folder=tmp_path)
    assert _csv(tmp_path / "canvas_import.csv")[0] == [
        "Student", "ID", "SIS User ID", "SIS Login ID", "Section", "hw"]
    assert _csv(tmp_path / "moodle_import.csv")[0] == [
        "Full name", "Email address", "ID number", "hw"]
    assert (tmp_path / "lms_import_left_out.txt").read_text() == (
        "Not in canvas_import.csv (no Canvas user id in the roster):\nbob\ncy\n"
        "Not in moodle_import.csv (no e-mail or Moodle ID number in the roster):\nbob\ncy\n")


# -- the terminal's table ----------------------------------------------------------------------

def test_grade_table_plain():
    """The terminal table: student, score/max, status, flags; no final column when no
    late penalty changed a score, no expected column unless asked."""
    table = report.grade_table([_result("ada", flags=["x"]),
                                _result("bob", score=8.0, final_score=8.0)])
    assert table.splitlines() == [
        "student                      score  status   flags",
        "-" * 50,
        "ada                         3/8     graded   yes  ",
        "bob                         8/8     graded        ",
    ]


def test_grade_table_with_late_scores_and_expected_totals():
    """With a late penalty the final column shows each final score; with expected
    totals each row says ok, MISMATCH, or (none)."""
    table = report.grade_table(
        [_result("ada", final_score=2.7), _result("bob", score=8.0), _result("cy")],
        expected={"ada": 3.0, "bob": 7.5})
    assert table.splitlines() == [
        "student                      score  status   flags  final  expected",
        "-" * 67,
        "ada                         3/8     graded            2.7  3 ok",
        "bob                         8/8     graded              8  7.5 MISMATCH",
        "cy                          3/8     graded              3  (none)",
    ]


def test_the_feedback_headline_is_the_score_after_the_late_penalty():
    """A student reads the headline first: it is the score that counts, and says what
    was earned before the penalty; on time, it is the plain score."""
    late = _result(lateness={"late": True, "note": "1 d late; late penalty 10%"})
    late.update(score=5.0, final_score=4.5)
    soup = BeautifulSoup(report._summary_html(late), "html.parser")
    assert soup.find("p").get_text().startswith(
        "Score: 4.5 (earned 5, less the late penalty) / 8")
    on_time = _result(lateness={"late": False, "note": "on time"})
    on_time.update(score=5.0, final_score=5.0)
    assert BeautifulSoup(report._summary_html(on_time), "html.parser").find(
        "p").get_text().startswith("Score: 5 / 8")


def test_lms_notes_name_who_handed_in_nothing_and_a_column_canvas_would_not_know(
        tiny_course, tmp_path):
    """With a Canvas roster: students without a result are named (their cell is empty),
    and a column the roster's Canvas export did not have is called out, since Canvas
    would make a new assignment of it."""
    results = [{**r, "final_score": r["score"], "pending": []} for r in _hw_results()]
    graded = {r["student_id"] for r in results}
    students = [{"id": sid, "name": sid, "lms_id": str(n)} for n, sid in enumerate(
        sorted(graded | {"zoe"}), start=1)]
    (Path(tiny_course.root) / "roster.json").write_text(json.dumps({
        "source": "canvas", "students": students,
        "lms_assignments": [{"name": "Quiz 1", "id": "9"}]}))
    folder = tmp_path / "out"
    folder.mkdir()
    report._write_class_exports(course=tiny_course, assignment="hw", results=results,
                                folder=folder)
    text = (folder / "lms_import_left_out.txt").read_text()
    assert text.startswith("Handed in nothing (an empty cell in canvas_import.csv")
    assert text.count("\nzoe\n") == 1
    # a Canvas roster has no field Moodle maps users by: no Moodle file, no line per student
    assert not (folder / "moodle_import.csv").exists() and "moodle" not in text
    assert "heads its column hw" in text and "new assignment" in text
    assert _csv(folder / "canvas_import.csv")[-1][0] == "zoe"


def test_a_moodle_roster_gets_the_moodle_import_alone(tiny_course, tmp_path):
    """A Moodle participants list has no Canvas ids: canvas_import.csv would be a header
    and a line per student in the notes; only Moodle's file is written, and one left
    over from an earlier roster is removed."""
    results = [{**r, "final_score": r["score"], "pending": []} for r in _hw_results()]
    students = [{"id": r["student_id"], "name": r["student_id"],
                 "email": f"{r['student_id']}@uni.edu"} for r in results]
    students.append({"id": "zoe", "name": "Zoe", "email": "zoe@uni.edu"})
    (Path(tiny_course.root) / "roster.json").write_text(json.dumps(
        {"source": "moodle", "students": students}))
    (tmp_path / "canvas_import.csv").write_text("from an earlier roster\n")
    report._write_class_exports(course=tiny_course, assignment="hw", results=results,
                                folder=tmp_path)
    assert not (tmp_path / "canvas_import.csv").exists()
    assert [row[1] for row in _csv(tmp_path / "moodle_import.csv")[1:]] == [
        "ada@uni.edu", "bob@uni.edu"]
    assert (tmp_path / "lms_import_left_out.txt").read_text() == (
        "Handed in nothing (not in moodle_import.csv):\nzoe\n")
