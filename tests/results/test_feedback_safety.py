"""The feedback page (autograder.results.report.feedback_html) is safe to open.

A student controls everything in the graded notebook: markdown, HTML, SVG and
JavaScript outputs, widget views. The page must run none of it, load nothing,
and let none of it draw over (or hide, or fake) the real score table. Checked
twice: statically on the HTML, and in a headless Chromium that opens the page
from a file:// URL.
"""

import base64
import html
import re
import struct
import zlib
from html.parser import HTMLParser

import nbformat
import pytest
from nbformat.v4 import (
    new_code_cell,
    new_markdown_cell,
    new_notebook,
    new_output,
    new_raw_cell,
)

import labbrowser
from autograder.results.report import feedback_html

MARKER = "PWNED"
NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing answers there
REAL_SCORE = "Score: 1 / 3"
FAKE_SCORE = "Score: 3 / 3"


def _js(tag):
    """What every vector tries to run: mark the page, retitle it, log, phone home."""
    return (f"(window.__pwned=window.__pwned||[]).push('{tag}');document.title='pwned';"
            f"console.log('{MARKER}:{tag}');"
            f"fetch('{NOWHERE}/{MARKER}-{tag}').catch(function(){{}});")


def _js_bare(tag):
    """The same, without quotes or spaces (for unquoted attribute values)."""
    return (f"(window.__pwned=window.__pwned||[]).push(/{tag}/.source);"
            f"document.title=/pwned/.source;console.log(/{MARKER}:{tag}/.source)")


def _png(width=4, height=3, rgb=(200, 30, 30)):
    """A small valid PNG, built by hand."""
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG_B64 = base64.b64encode(_png()).decode()


def _html_vectors(prefix):
    """HTML that tries every trick; each on its own line (markdown keeps HTML blocks)."""
    p = prefix
    return "\n\n".join([
        f"<script>{_js(p + '-script')}</script>",
        f'<img src=x onerror="{_js(p + "-img-onerror")}">',
        f'<img src="{NOWHERE}/{MARKER}-{p}-remote.png">',
        f'<a class="jslink" href="javascript:{_js(p + "-js-link")}">click me</a>',
        f'<svg onload="{_js(p + "-inline-svg-onload")}"><script>{_js(p + "-inline-svg-script")}'
        f'</script><circle r="5"/></svg>',
        f'<iframe src="javascript:{_js(p + "-iframe-js")}"></iframe>',
        f'<iframe srcdoc="&lt;script&gt;{html.escape(_js(p + "-iframe-srcdoc"))}&lt;/script&gt;">'
        f'</iframe>',
        f'<object data="{NOWHERE}/{MARKER}-{p}-object"></object>',
        f'<embed src="{NOWHERE}/{MARKER}-{p}-embed">',
        f'<link rel="stylesheet" href="{NOWHERE}/{MARKER}-{p}-link.css">',
        f'<form action="{NOWHERE}/{MARKER}-{p}-form"><button>go</button></form>',
        f'<details open ontoggle="{_js(p + "-ontoggle")}"><summary>d</summary>x</details>',
        # A fake score drawn over the real one by inline styles...
        f'<div style="position:fixed;top:0;left:0;width:100%;height:100%;z-index:99999;'
        f'background:white">{FAKE_SCORE} ({p} fixed overlay)</div>',
        # ... by one of JupyterLab's own classes (position:absolute, 100% x 100%) ...
        f'<div class="jp-Dialog"><b>{FAKE_SCORE} ({p} class overlay)</b></div>',
        # ... or by hiding the real one with a style sheet.
        "<style>section, table, h1 { display: none !important }"
        f" @import url({NOWHERE}/{MARKER}-{p}-import.css);</style>",
    ])


def _hostile_notebook():
    js_output = new_output("display_data", data={
        "application/javascript": _js("js-output"),
        "text/plain": "<IPython.core.display.Javascript object>"})
    svg_output = new_output("display_data", data={
        "image/svg+xml": (
            '<svg xmlns="http://www.w3.org/2000/svg" width="20" height="20" '
            f'onload="{_js("svg-onload")}"><script>{_js("svg-script")}</script>'
            '<rect width="20" height="20" fill="red"/></svg>'),
        "text/plain": "<Figure>"})
    html_output = new_output("display_data", data={
        "text/html": _html_vectors("html")
        + f'\n<meta http-equiv="refresh" content="2;url={NOWHERE}/{MARKER}-html-refresh">',
        "text/plain": "<HTML>"})
    markdown_output = new_output("display_data", data={
        "text/markdown": _html_vectors("mdout"), "text/plain": "<Markdown>"})
    widget_output = new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {
            "model_id": "0123456789abcdef", "version_major": 2, "version_minor": 0},
        "text/plain": "IntSlider(value=0)"})
    mermaid_output = new_output("display_data", data={
        "text/vnd.mermaid": f'graph TD; A-->B\n</pre><img src=x onerror="{_js("mermaid")}">',
        "text/plain": "<Mermaid>"})
    png_output = new_output(
        "display_data", data={"image/png": PNG_B64, "text/plain": "<Figure>"},
        metadata={"image/png": {"width": f"4 onload={_js_bare('png-width')}"}})
    stream = new_output("stream", name="stdout",
                        text=f"<script>{_js('stream')}</script> printed, not run\n")
    code = new_code_cell(
        "display(evil)", execution_count=1,
        outputs=[js_output, svg_output, html_output, markdown_output, widget_output,
                 mermaid_output, png_output, stream])
    markdown = new_markdown_cell("# Hostile notes\n\n" + _html_vectors("md") + "\n\n"
                                 f'<meta http-equiv="refresh" content="2;url={NOWHERE}/'
                                 f'{MARKER}-md-refresh">\n\n'
                                 f'<base href="{NOWHERE}/{MARKER}-base/">\n')
    raw = new_raw_cell(_html_vectors("raw"), metadata={"raw_mimetype": "text/html"})
    nb = new_notebook(cells=[markdown, code, raw])
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "version_major": 2, "version_minor": 0, "state": {}}}
    return nb


def _benign_notebook():
    error = new_output("error", ename="ZeroDivisionError", evalue="division by zero",
                       traceback=["\x1b[0;31mZeroDivisionError\x1b[0m Traceback",
                                  "\x1b[0;32m----> 1\x1b[0m 1 / 0",
                                  "\x1b[0;31mZeroDivisionError\x1b[0m: division by zero"])
    return new_notebook(cells=[
        new_markdown_cell("# Layer normalisation\n\nThe mean is $\\mu = \\frac{1}{n}\\sum_i "
                          "x_i$, see [the paper](https://arxiv.org/abs/1607.06450).\n\n"
                          "| n | mean |\n|---|---|\n| 3 | 0.5 |\n"),
        new_code_cell("plot(); print('hello stdout'); 1 / 0", execution_count=1,
                      metadata={"nbgrader": {"grade": True, "grade_id": "ex_two",
                                             "points": 2}}, outputs=[
            new_output("display_data", data={"image/png": PNG_B64, "text/plain": "<Figure>"}),
            new_output("stream", name="stdout", text="hello stdout\n"),
            error]),
    ])


def _result(*, hostile):
    text = (f'<img src=x onerror="{_js("summary")}"><script>{_js("summary-script")}</script>'
            if hostile else "fine")
    return {
        "student_id": "mallory" if hostile else "alice", "assignment": "01_the_recipe",
        "score": 1.0, "max_score": 3.0, "status": "graded", "reason": text if hostile else "",
        "flags": [], "notes": [f"note {text}"] if hostile else [],
        "cells": [
            {"grade_id": f"ex_one{text if hostile else ''}", "points": 1.0, "max_points": 1.0,
             "kernel_ok": True, "reason": "",
             "checks": [{"check": "c1", "passed": True, "message": f"all passed {text}"}]},
            {"grade_id": "ex_two", "points": 0.0, "max_points": 2.0, "kernel_ok": True,
             "reason": f"AssertionError: {text}",
             "checks": [{"check": "c2", "passed": False, "message": "one case failed"}]},
        ],
    }


def _write_page(tmp_path, nb, result):
    notebook = tmp_path / "graded.ipynb"
    nbformat.write(nb, notebook)
    page = tmp_path / "feedback.html"
    page.write_text(feedback_html(result, notebook), encoding="utf-8")
    return page


# -- static checks ------------------------------------------------------------------------

class _Tags(HTMLParser):
    """Every start tag with its attributes, in document order, and where <body> begins."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags = []
        self.body_at = None

    def handle_starttag(self, tag, attrs):
        if tag == "body" and self.body_at is None:
            self.body_at = len(self.tags)
        self.tags.append((tag, dict(attrs)))

    handle_startendtag = handle_starttag


def _csp_directives(policy):
    directives = {}
    for part in policy.split(";"):
        words = part.split()
        if words:
            directives[words[0].lower()] = words[1:]
    return directives


def _static_problems(page_html):
    problems = []
    if "<script" in page_html.lower():
        problems.append("a <script> tag is in the page")
    parser = _Tags()
    parser.feed(page_html)
    tags = parser.tags
    head_at = next((i for i, (tag, _) in enumerate(tags) if tag == "head"), None)
    first = tags[head_at + 1] if head_at is not None and head_at + 1 < len(tags) else (None, {})
    if not (first[0] == "meta"
            and first[1].get("http-equiv", "").lower() == "content-security-policy"):
        problems.append(f"the first thing in <head> is {first}, not the CSP <meta>")
    else:
        csp = _csp_directives(first[1].get("content", ""))
        script_src = csp.get("script-src", csp.get("default-src"))
        if script_src != ["'none'"]:
            problems.append(f"CSP script-src is {script_src}")
        if csp.get("default-src") != ["'none'"]:
            problems.append(f"CSP default-src is {csp.get('default-src')}")
        for directive in ("object-src", "frame-src", "child-src", "form-action", "base-uri"):
            if csp.get(directive) != ["'none'"]:
                problems.append(f"CSP {directive} is {csp.get(directive)}")
        if csp.get("style-src") != ["'unsafe-inline'"]:
            problems.append(f"CSP style-src is {csp.get('style-src')}")
        for directive in ("img-src", "font-src"):
            if csp.get(directive) != ["data:"]:
                problems.append(f"CSP {directive} is {csp.get(directive)}")
    body = tags[parser.body_at:] if parser.body_at is not None else tags
    student = False  # the rendered notebook (student content) is inside <main>
    for tag, attrs in body:
        student = student or tag == "main"
        if tag in ("script", "iframe", "frame", "object", "embed", "meta", "base", "link",
                   "form", "style", "svg", "applet", "template"):
            problems.append(f"<{tag}> in the body")
        for name, value in attrs.items():
            value = value or ""
            if name.startswith("on"):
                problems.append(f"<{tag} {name}=...> in the body")
            if name in ("src", "href", "action", "formaction", "data", "xlink:href"):
                squashed = re.sub(r"[\s\x00-\x20]+", "", value).lower()
                if name == "src" and not squashed.startswith("data:image/"):
                    problems.append(f"<{tag} src={value[:60]!r}>")
                if squashed.startswith(("javascript:", "vbscript:")) or (
                        name != "src" and squashed.startswith("data:")):
                    problems.append(f"<{tag} {name}={value[:60]!r}>")
            if student and name == "style" and re.search(
                    r"position|z-index|top|left|transform|margin|display|visibility", value, re.I):
                problems.append(f"<{tag} style={value[:60]!r}> from student content")
    return problems


def test_hostile_notebook_page_is_inert_on_paper(tmp_path):
    page_html = _write_page(tmp_path, _hostile_notebook(), _result(hostile=True)).read_text()
    assert _static_problems(page_html) == []
    assert page_html.count(REAL_SCORE) == 1
    # The score table's student text is escaped, not markup.
    assert html.escape('<img src=x onerror="') in page_html
    # The notebook is still there (its heading and the escaped stream output).
    assert "Hostile notes" in page_html
    assert "printed, not run" in page_html


# -- in Chromium ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    yield from labbrowser.chromium_session()


def _open(browser, path):
    """Open `path` from a file:// URL; returns (page, context, console texts, request URLs)."""
    context = browser.new_context(viewport=labbrowser.VIEWPORT)
    context.set_default_timeout(30_000)
    page = context.new_page()
    console, requests = [], []
    page.on("console", lambda message: console.append(message.text))
    page.on("pageerror", lambda error: console.append(str(error)))
    context.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_timeout(1000)
    return page, context, console, requests


SCORE_TABLE_COVERED = """real => {
  const summary = document.body.firstElementChild;
  if (!summary || !summary.textContent.includes(real)) return ['the score table is not first'];
  const targets = [summary, ...summary.querySelectorAll('b, tr, h1')];
  const covered = [];
  for (const target of targets) {
    const r = target.getBoundingClientRect();
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    const hit = document.elementFromPoint(x, y);
    if (!hit || !summary.contains(hit))
      covered.push(`${target.tagName} at (${x}, ${y}) is under ` +
                   (hit ? `${hit.tagName}.${hit.className}: ${hit.textContent.slice(0, 40)}`
                        : 'nothing'));
  }
  return covered;
}"""


def test_hostile_notebook_page_runs_nothing_in_chromium(tmp_path, browser):
    path = _write_page(tmp_path, _hostile_notebook(), _result(hostile=True))
    expected_title = html.unescape(re.search(r"<title>(.*?)</title>", path.read_text(), re.S)
                                   .group(1))
    page, context, console, requests = _open(browser, path)
    try:
        problems = []
        pwned = page.evaluate("() => window.__pwned")
        if pwned is not None:
            problems.append(f"scripts ran: {pwned}")
        if page.title() != expected_title:
            problems.append(f"title changed to {page.title()!r}")
        problems += page.evaluate(SCORE_TABLE_COVERED, REAL_SCORE)
        if not page.get_by_text(REAL_SCORE, exact=False).first.is_visible():
            problems.append("the real score is not visible")
        # Follow every link the student wrote, then give refreshes and loads their time.
        for link in page.locator("a.jslink, a:has-text('click me')").all():
            link.dispatch_event("click")
        page.wait_for_timeout(2500)
        if page.url != path.as_uri():
            problems.append(f"the page navigated to {page.url}")
        else:
            pwned = page.evaluate("() => window.__pwned")
            if pwned is not None:
                problems.append(f"links ran: {pwned}")
        marked = [text for text in console if MARKER in text]
        if marked:
            problems.append(f"console: {marked}")
        foreign = [url for url in requests
                   if url != path.as_uri() and not url.startswith("data:")]
        if foreign:
            problems.append(f"requests: {sorted(set(foreign))}")
        assert problems == []
    finally:
        context.close()


def test_benign_notebook_still_reads_well(tmp_path, browser):
    path = _write_page(tmp_path, _benign_notebook(), _result(hostile=False))
    page_html = path.read_text()
    assert _static_problems(page_html) == []
    assert page_html.count(REAL_SCORE) == 1
    page, context, console, requests = _open(browser, path)
    try:
        assert page.locator("h1", has_text="Layer normalisation").first.is_visible()
        text = page.inner_text("body")
        for expected in (REAL_SCORE, "all passed fine", "AssertionError: fine",
                         "the paper", "hello stdout",
                         "ZeroDivisionError: division by zero", "----> 1"):
            assert expected in text, expected
        assert "\\frac" not in text, "maths is drawn (MathML), not shown as LaTeX"
        assert page.locator("math").first.is_visible()
        link = page.locator("a", has_text="the paper").first
        assert link.get_attribute("href") == "https://arxiv.org/abs/1607.06450"
        assert page.locator("td", has_text="0.5").first.is_visible()
        images = page.evaluate("""() => [...document.images].map(
            i => [i.src.slice(0, 22), i.complete, i.naturalWidth])""")
        assert ["data:image/png;base64,", True, 4] in images, images
        assert page.evaluate(SCORE_TABLE_COVERED, REAL_SCORE) == []
        assert [url for url in requests
                if url != path.as_uri() and not url.startswith("data:")] == []
    finally:
        context.close()


def test_missing_notebook_page_is_just_the_safe_score_table(tmp_path):
    page_html = feedback_html(_result(hostile=True), None)
    assert _static_problems(page_html) == []
    assert page_html.count(REAL_SCORE) == 1
    assert "AssertionError: &lt;img src=x onerror=" in page_html
