"""Exports of one assignment's results, in reports/<assignment>/:

grades.csv (one row per student, failures included), gradescope/<student>.json
(Gradescope's results format), feedback/<student>.html (the run with each
check's message) and a plain-text grade table for the terminal; and the
scores in nbgrader's gradebook.db, for the formgrader.
"""

import copy
import csv
import html
import json
import re

import bleach  # nbconvert's own HTML sanitizer; it and bs4 are installed with nbconvert
import nbformat
from bleach.css_sanitizer import CSSSanitizer
from bs4 import BeautifulSoup
from nbconvert import HTMLExporter

from autograder.gradebook import write_gradebook

GRADE_COLUMNS = ["student_id", "score", "max_score", "status", "reason", "flags"]


def write_grades_csv(results, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=GRADE_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({
                "student_id": r["student_id"], "score": f"{r['score']:g}",
                "max_score": f"{r['max_score']:g}", "status": r["status"],
                "reason": r.get("reason", ""), "flags": "; ".join(r.get("flags", [])),
            })


def gradescope_results(result):
    """Gradescope's results.json for one student: one test per grade cell."""
    tests = []
    for cell in result["cells"]:
        lines = [c["message"] for c in cell["checks"]]
        if cell["reason"] and cell["reason"] not in lines:
            lines.append(cell["reason"])
        tests.append({"name": cell["grade_id"], "score": cell["points"],
                      "max_score": cell["max_points"], "output": "\n".join(lines),
                      "visibility": "visible"})
    summary = [result.get("reason") or ""] + result.get("notes", [])
    return {"score": result["score"], "tests": tests,
            "output": "\n".join(s for s in summary if s), "visibility": "visible"}


# The feedback page runs nothing and loads nothing: no scripts at all, no frames, objects,
# forms or <base>; styles only from the page itself, images and fonts only as data: URLs.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "font-src data:; object-src 'none'; frame-src 'none'; child-src 'none'; "
    "worker-src 'none'; connect-src 'none'; media-src 'none'; manifest-src 'none'; "
    "form-action 'none'; base-uri 'none'")

# Output mimetypes the page shows (HTML, markdown and SVG sanitized or inert); every other
# one (application/javascript, widget views, mermaid, ...) is dropped before rendering.
SHOWN_MIMETYPES = {"text/plain", "text/html", "text/markdown", "text/latex", "image/png",
                   "image/jpeg", "image/svg+xml"}

# What survives of the rendered notebook (student markdown and outputs, and nbconvert's
# own markup around them). No script, style, frame, object, form, meta, link or svg.
SAFE_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "col", "colgroup", "dd",
    "del", "details", "dfn", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "main", "mark", "ol", "p", "pre",
    "q", "s", "samp", "small", "span", "strike", "strong", "sub", "summary", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var", "wbr",
}
# Contents dropped along with the tag (stripping the tag alone would print them as text).
DROPPED_WITH_CONTENT = ["script", "style", "template", "noscript", "noembed", "noframes",
                        "iframe", "object", "textarea", "title", "xmp", "head"]
# Colours and emphasis only (ANSI colours in tracebacks come as inline styles): nothing
# that places, sizes or layers an element.
SAFE_CSS_PROPERTIES = ["color", "background-color", "font-weight", "font-style",
                       "text-decoration", "text-align"]
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*",
                         re.IGNORECASE)
_NUMBER = re.compile(r"\d{1,5}(\.\d{1,3})?(px|%)?")


def _safe_attribute(tag, name, value):
    """bleach's attribute filter: a short allow-list, links and images checked by value."""
    value = value.strip()
    if name in ("class", "id", "title", "style"):  # style: bleach's CSS sanitizer filters it
        return True
    if tag == "a" and name == "href":
        squashed = re.sub(r"[`\x00-\x20\x7f-\xa0\s]+", "", value).lower()
        return squashed.startswith(("http://", "https://", "mailto:", "#"))
    if tag == "img" and name == "src":
        return _DATA_IMAGE.fullmatch(value) is not None
    if tag == "img" and name == "alt":
        return True
    if tag in ("img", "col") and name in ("width", "height"):
        return _NUMBER.fullmatch(value) is not None
    if tag in ("td", "th") and name in ("colspan", "rowspan"):
        return value.isdigit()
    if tag == "ol" and name == "start":
        return value.isdigit()
    if tag in ("td", "th", "tr", "col") and name == "align":
        return value.lower() in ("left", "right", "center")
    if tag == "details" and name == "open":
        return True
    return False


def _sanitize_html(fragment):
    """Student-controlled HTML made inert with bleach (what nbconvert sanitizes with too)."""
    soup = BeautifulSoup(fragment, "html.parser")
    for element in soup.find_all(DROPPED_WITH_CONTENT):
        element.decompose()
    cleaner = bleach.Cleaner(
        tags=SAFE_TAGS, attributes=_safe_attribute,
        protocols={"http", "https", "mailto", "data"}, strip=True, strip_comments=True,
        css_sanitizer=CSSSanitizer(allowed_css_properties=SAFE_CSS_PROPERTIES))
    return cleaner.clean(str(soup))


def _inert_notebook(nb):
    """A copy of `nb` with the outputs that would only run code removed."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if "data" in output:
                for mimetype in [m for m in output.data if m not in SHOWN_MIMETYPES]:
                    del output.data[mimetype]
    return nb


def _render_notebook(nb):
    """(the template's own <style> sheets, the sanitized notebook body) for `nb`."""
    page, _ = HTMLExporter(template_name="lab").from_notebook_node(_inert_notebook(nb))
    body_at = re.search(r"<body[^>]*>", page)
    head = page[:body_at.start()] if body_at else ""
    # The head is nbconvert's own (the title in it is escaped): keep its style sheets only.
    styles = "\n".join(re.findall(r"<style[^>]*>.*?</style>", head, re.DOTALL))
    body = page[body_at.end():] if body_at else page
    start, end = body.find("<main>"), body.rfind("</main>")
    if start >= 0 and end > start:
        body = body[start + len("<main>"):end]
    return styles, _sanitize_html(body)


def _summary_html(result):
    td = "<td style='vertical-align:top;overflow-wrap:anywhere;padding:4px'>"
    rows = []
    for cell in result["cells"]:
        messages = [c["message"] for c in cell["checks"]]
        if cell["reason"] and cell["reason"] not in messages:
            messages.append(cell["reason"])
        rows.append(
            f"<tr>{td}{html.escape(cell['grade_id'])}</td>"
            f"{td}{cell['points']:g} / {cell['max_points']:g}</td>"
            f"{td}{'<br>'.join(html.escape(m) for m in messages)}</td></tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.get("notes", []))
    reason = html.escape(result.get("reason") or "")
    return (
        # First in the body, in the normal flow, above everything else and fully opaque.
        "<section style='position:relative;z-index:2147483647;isolation:isolate;"
        "display:block;visibility:visible;opacity:1;background:#fff;color:#000;"
        "font-family:sans-serif;margin:0;padding:1em;border-bottom:2px solid #888'>"
        f"<h1 style='margin:0 0 .5em 0;font-size:1.5em'>{html.escape(result['assignment'])}: "
        f"{html.escape(result['student_id'])}</h1>"
        f"<p><b>Score: {result['score']:g} / {result['max_score']:g}</b> "
        f"({html.escape(result['status'])}) {reason}</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + "<table border='1' style='border-collapse:collapse;table-layout:fixed;width:100%'>"
        "<colgroup><col style='width:25%'><col style='width:12%'><col></colgroup>"
        "<tr><th>exercise</th><th>points</th><th>what the grader found</th></tr>"
        + "".join(rows) + "</table></section>")


# The graded notebook is drawn inside this box and nowhere else: paint containment clips
# it and makes it the containing block of anything positioned (fixed included) within it.
NOTEBOOK_BOX_STYLE = ("contain:paint;overflow:auto;position:relative;isolation:isolate;"
                      "z-index:0;display:block")


def feedback_html(result, executed_notebook_path):
    """A feedback page: the score table, then the graded run of the notebook.

    The page is safe to open: the student's markdown and outputs are sanitized, the
    Content-Security-Policy forbids scripts, frames and any loading, and the notebook
    is boxed in below the score table, which it cannot cover."""
    styles, notebook = "", ""
    if executed_notebook_path is not None and executed_notebook_path.exists():
        styles, notebook = _render_notebook(
            nbformat.read(executed_notebook_path, as_version=4))
    title = f"{result['assignment']}: {result['student_id']} (feedback)"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CONTENT_SECURITY_POLICY}\">\n"
        "<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1.0\">\n"
        f"<title>{html.escape(title)}</title>\n{styles}\n</head>\n"
        "<body class=\"jp-Notebook\" data-jp-theme-light=\"true\" "
        "data-jp-theme-name=\"JupyterLab Light\">\n"
        f"{_summary_html(result)}\n"
        f"<div style=\"{NOTEBOOK_BOX_STYLE}\"><main>{notebook}</main></div>\n"
        "</body>\n</html>\n")


def write_reports(*, course, assignment, results):
    """Write every export for `results`; returns the report folder."""
    folder = course.reports / assignment
    (folder / "gradescope").mkdir(parents=True, exist_ok=True)
    (folder / "feedback").mkdir(parents=True, exist_ok=True)
    write_grades_csv(results, folder / "grades.csv")
    notebook_name = course.notebook_name(assignment)
    for r in results:
        student = r["student_id"]
        (folder / "gradescope" / f"{student}.json").write_text(
            json.dumps(gradescope_results(r), indent=1))
        executed = course.autograded / student / assignment / notebook_name
        (folder / "feedback" / f"{student}.html").write_text(
            feedback_html(r, executed if r["status"] == "graded" else None))
    write_gradebook(course=course, assignment=assignment, results=results)
    return folder


def grade_table(results, *, expected=None):
    """A plain-text table; with `expected` ({student: total}) a column says if each matches."""
    header = f"{'student':<24} {'score':>9}  {'status':<8} {'flags':<5}"
    if expected is not None:
        header += "  expected"
    lines = [header, "-" * len(header)]
    for r in results:
        line = (f"{r['student_id']:<24} {r['score']:>4g}/{r['max_score']:<4g}  "
                f"{r['status']:<8} {'yes' if r.get('flags') else '':<5}")
        if expected is not None:
            want = expected.get(r["student_id"])
            line += f"  {want:g} {'ok' if want == r['score'] else 'MISMATCH'}" if want is not None \
                else "  (none)"
        lines.append(line)
    return "\n".join(lines)
