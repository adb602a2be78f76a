"""Exports of one assignment's results, in reports/<assignment>/:

grades.csv (one row per student, failures included, hand grades and the late policy
applied), gradescope/<student>.json (Gradescope's results format),
feedback/<student>.html (the run with each check's message), summary.html/.txt (where
the class struggled), with a roster canvas_import.csv and moodle_import.csv, and a
plain-text grade table for the terminal; and the scores in nbgrader's gradebook.db,
for the formgrader.
"""

import base64
import copy
import csv
import functools
import hashlib
import html
import importlib.metadata
import json
import re
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from autograder.grading.grade import IN_KERNEL
from autograder.grading.inert import SHOWN_MIMETYPES, sanitize_html
from autograder.results import summary
from autograder.results.gradebook import (
    record_lateness,
    scores_by_hand,
    with_scores_by_hand,
    write_gradebook,
)
from autograder.term.deadlines import DeadlinesError, apply_late_policy, lateness

GRADE_COLUMNS = ["student_id", "score", "max_score", "pending", "late", "late_penalty",
                 "final_score", "status", "reason", "flags"]


def write_grades_csv(results, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=GRADE_COLUMNS)
        writer.writeheader()
        for r in results:
            writer.writerow({
                "student_id": r["student_id"], "score": f"{r['score']:g}",
                "max_score": f"{r['max_score']:g}",
                "pending": " ".join(r.get("pending", [])),
                "late": (r.get("lateness") or {}).get("note", ""),
                "late_penalty": f"{(r.get('lateness') or {}).get('penalty_fraction') or 0:g}",
                "final_score": f"{r.get('final_score', r['score']):g}", "status": r["status"],
                "reason": r.get("reason", ""), "flags": "; ".join(r.get("flags", [])),
            })


def gradescope_results(result):
    """Gradescope's results.json for one student: one test per grade cell, and the
    flags, if any, in a test only course staff see (visibility "hidden")."""
    tests = []
    for cell in result["cells"]:
        lines = [c["message"] for c in cell["checks"]]
        if cell["reason"] and cell["reason"] not in lines:
            lines.append(cell["reason"])
        tests.append({"name": cell["grade_id"], "score": cell["points"],
                      "max_score": cell["max_points"], "output": "\n".join(lines),
                      "visibility": "visible"})
    for cell in result.get("manual", []):
        tests.append({"name": cell["grade_id"], "score": cell["points"] or 0.0,
                      "max_score": cell["max_points"], "visibility": "visible",
                      "output": "graded by hand" if cell["points"] is not None
                      else "pending: graded by hand later"})
    if result.get("flags"):  # for a person to read: Gradescope shows hidden tests to staff only
        tests.append({"name": "flags for the instructor", "score": 0.0, "max_score": 0.0,
                      "output": "\n".join(result["flags"]), "visibility": "hidden"})
    late = result.get("lateness") or {}
    summary = [result.get("reason") or "", late.get("note", "") if late.get("late") else ""]
    summary += result.get("notes", [])
    return {"score": result.get("final_score", result["score"]), "tests": tests,
            "output": "\n".join(s for s in summary if s), "visibility": "visible"}


# The feedback page runs nothing and loads nothing: no scripts at all, no frames, objects,
# forms or <base>; styles only from the page itself, images and fonts only as data: URLs.
CONTENT_SECURITY_POLICY = summary.CONTENT_SECURITY_POLICY  # one policy for every page

# $$display$$ and $inline$ maths in markdown, as Jupyter reads it (\$ is a dollar sign).
_DISPLAY_MATH = re.compile(r"(?<!\\)\$\$(.+?)(?<!\\)\$\$", re.DOTALL)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$")
_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.DOTALL)
MAX_MATHS = 200  # formulas drawn per page; the rest stay as their source (MathML is ~20x)
MAX_MATHS_CELL_CHARS = 50_000  # a longer markdown cell keeps its maths as source
_HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*$",
                           re.DOTALL | re.MULTILINE)


def _mathml(latex, *, display):
    from latex2mathml.converter import convert

    try:
        return convert(latex, display="block" if display else "inline")
    except Exception:  # noqa: BLE001 - maths it cannot read stays as its source text
        return html.escape(f"$${latex}$$" if display else f"${latex}$")


def _markdown_with_mathml(text, budget=MAX_MATHS):
    """(markdown whose $...$ and $$...$$ maths is MathML, which browsers draw with no
    script and no network, the budget left): at most `budget` formulas are drawn,
    the rest stay as their source."""
    left = budget

    def draw(match, display):
        nonlocal left
        if left <= 0:
            return match.group(0)
        left -= 1
        return _mathml(match.group(1), display=display)

    parts = _CODE.split(text)  # code (odd parts) keeps its dollar signs
    for i in range(0, len(parts), 2):
        part = _DISPLAY_MATH.sub(lambda m: draw(m, True), parts[i])
        parts[i] = _INLINE_MATH.sub(lambda m: draw(m, False), part)
    return "".join(parts), left


def _is_graded(cell):
    return bool(cell.get("metadata", {}).get("nbgrader", {}).get("grade"))


def _quiet_ungraded_error(output):
    """An ungraded cell's error (an optional part left as it was handed out, a
    scratch cell) as one grey line: it costs nothing, and the page says so."""
    return nbformat.v4.new_output(
        "stream", name="stdout",
        text=f"(not graded) this cell stopped with {output.get('ename')}: "
             f"{str(output.get('evalue'))[:300]}\n")


_OUTPUTS_AFTER_HIDDEN = ("(the outputs of this cell and of every later one are not shown: "
                         "they could show the hidden tests)\n")


def hidden_test_lines(nb):
    """The distinctive lines of `nb`'s hidden tests (12 characters or more)."""
    lines = set()
    for cell in nb.cells:
        for block in _HIDDEN_TESTS.findall(cell.source if cell.cell_type == "code" else ""):
            lines |= {ln.strip() for ln in block.splitlines()[1:-1] if len(ln.strip()) >= 12}
    return lines


def scrub_hidden(text, lines):
    """`text` with every hidden-test line in it replaced."""
    for line in lines:
        if line in text:
            text = text.replace(line, "[hidden test]")
    return text


# A markdown image whose file came with the hand-in (jupyter.png beside the notebook) is
# drawn inline: the page loads nothing. Only a plain file directly in the hand-in's folder,
# of an image type, is read: never a path outside it, a link, or a large file.
_MARKDOWN_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(\s*([\w.-]+\.(?:png|jpe?g|gif))\s*\)",
                             re.IGNORECASE)
_IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg",
                "gif": "image/gif"}
MAX_INLINE_IMAGE_BYTES = 2 * 1024**2


def _with_inline_images(text, folder):
    """`text` with each markdown image of a file in `folder` as a data: URL."""
    if folder is None:
        return text

    def inline(match):
        path = Path(folder) / match.group(2)
        if (path.is_symlink() or not path.is_file()
                or path.stat().st_size > MAX_INLINE_IMAGE_BYTES):
            return match.group(0)
        kind = _IMAGE_TYPES[path.suffix.lower().lstrip(".")]
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{match.group(1)}](data:{kind};base64,{data})"

    return _MARKDOWN_IMAGE.sub(inline, text)


def _inert_notebook(nb, *, show_hidden_tests=False, images_from=None):
    """A copy of `nb` fit for the student's page: outputs that would only run code
    removed, maths as MathML, errors of ungraded cells quietened and, unless
    `show_hidden_tests`, the hidden tests folded away. A hand-in's own code runs
    after the hidden tests and can print them (IPython keeps every cell's source),
    so the outputs of the cells from the first hidden test on are not shown either:
    their verdicts are in the score table."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    maths_left = MAX_MATHS
    after_hidden = False
    for cell in nb.cells:
        if cell.cell_type == "markdown" and len(cell.source) <= MAX_MATHS_CELL_CHARS:
            cell.source, maths_left = _markdown_with_mathml(cell.source, maths_left)
            cell.source = _with_inline_images(cell.source, images_from)
        if cell.cell_type != "code":
            continue
        if not show_hidden_tests:
            after_hidden = after_hidden or bool(_HIDDEN_TESTS.search(cell.source))
            cell.source = _HIDDEN_TESTS.sub("# (hidden tests: the grader ran them)",
                                            cell.source)
            if after_hidden:
                cell.outputs = [nbformat.v4.new_output(
                    "stream", name="stdout", text=_OUTPUTS_AFTER_HIDDEN)]
                continue
        outputs = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error" and not _is_graded(cell):
                output = _quiet_ungraded_error(output)
            if "data" in output:
                for mimetype in [m for m in output.data if m not in SHOWN_MIMETYPES]:
                    del output.data[mimetype]
            outputs.append(output)
        cell.outputs = outputs
    return nb


@functools.cache
def _exporter():
    """nbconvert's lab template, built once per process. Its own sanitizing filter is
    left out: the whole body is sanitized afterwards, more strictly (sanitize_html)."""
    return HTMLExporter(template_name="lab", filters={"clean_html": lambda text: text})


def _render_notebook(nb, *, show_hidden_tests=False, images_from=None):
    """(the template's own <style> sheets, the sanitized notebook body) for `nb`."""
    page, _ = _exporter().from_notebook_node(
        _inert_notebook(nb, show_hidden_tests=show_hidden_tests, images_from=images_from))
    body_at = re.search(r"<body[^>]*>", page)
    head = page[:body_at.start()] if body_at else ""
    # The head is nbconvert's own (the title in it is escaped): keep its style sheets only.
    styles = "\n".join(re.findall(r"<style[^>]*>.*?</style>", head, re.DOTALL))
    body = page[body_at.end():] if body_at else page
    start, end = body.find("<main>"), body.rfind("</main>")
    if start >= 0 and end > start:
        body = body[start + len("<main>"):end]
    return styles, sanitize_html(body)


def _headline_score(result):
    """The score the student is given: after the late policy, saying so when it differs."""
    final = result.get("final_score", result["score"])
    if final is None or final == result["score"]:
        return f"{result['score']:g}"
    return f"{final:g} (earned {result['score']:g}, less the late penalty)"


def _summary_html(result):
    td = "<td style='vertical-align:top;overflow-wrap:anywhere;padding:4px'>"
    rows = []
    for cell in result["cells"]:
        messages = [c["message"] for c in cell["checks"]]
        if cell["reason"] and cell["reason"] not in messages:
            messages.append(cell["reason"])
        if cell.get("checked") == IN_KERNEL:
            messages.append("(this exercise's tests run inside your own kernel: plain "
                            "asserts, as nbgrader runs them)")
        if cell.get("by_hand"):
            messages.append("score given by hand")
        rows.append(
            f"<tr>{td}{html.escape(cell['grade_id'])}</td>"
            f"{td}{cell['points']:g} / {cell['max_points']:g}</td>"
            f"{td}{'<br>'.join(html.escape(m) for m in messages)}</td></tr>")
    for cell in result.get("manual", []):
        shown = "pending" if cell["points"] is None else f"{cell['points']:g}"
        rows.append(f"<tr>{td}{html.escape(cell['grade_id'])}</td>"
                    f"{td}{shown} / {cell['max_points']:g}</td>"
                    f"{td}graded by hand{'' if cell['points'] is not None else ' (not yet)'}"
                    "</td></tr>")
    late = result.get("lateness") or {}
    shown_notes = list(result.get("notes", []))
    if late.get("late"):
        shown_notes.insert(0, f"{late.get('note', 'late')}; score after the late policy: "
                              f"{result.get('final_score', result['score']):g}")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in shown_notes)
    reason = html.escape(result.get("reason") or "")
    return (
        # First in the body, in the normal flow, above everything else and fully opaque.
        "<section style='position:relative;z-index:2147483647;isolation:isolate;"
        "display:block;visibility:visible;opacity:1;background:#fff;color:#000;"
        "font-family:sans-serif;margin:0;padding:1em;border-bottom:2px solid #888'>"
        f"<h1 style='margin:0 0 .5em 0;font-size:1.5em'>{html.escape(result['assignment'])}: "
        f"{html.escape(result['student_id'])}</h1>"
        f"<p><b>Score: {_headline_score(result)} / {result['max_score']:g}</b> "
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


def feedback_html(result, executed_notebook_path, *, show_hidden_tests=False, images_from=None):
    """A feedback page: the score table, then the graded run of the notebook (a
    path, or a list of paths for an assignment of several notebooks), its hidden
    tests folded away unless `show_hidden_tests`; markdown images of files in the
    folder `images_from` (the hand-in's) drawn inline.

    The page is safe to open: the student's markdown and outputs are sanitized, the
    Content-Security-Policy forbids scripts, frames and any loading, and the notebook
    is boxed in below the score table, which it cannot cover."""
    paths = (executed_notebook_path if isinstance(executed_notebook_path, list)
             else [executed_notebook_path])
    paths = [p for p in paths if p is not None and p.exists()]
    styles, parts = "", []
    for path in paths:
        styles, body = _render_notebook(nbformat.read(path, as_version=4),
                                        show_hidden_tests=show_hidden_tests,
                                        images_from=images_from)
        heading = (f"<h2 style='font-family:sans-serif'>{html.escape(path.name)}</h2>"
                   if len(paths) > 1 else "")
        parts.append(heading + body)
    notebook = "\n".join(parts)
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


# A feedback page records what it was made from; one whose inputs are unchanged is not
# made again (a class of hundreds regraded for one student rewrites one page).
_INPUTS_META = '<meta name="feedback-inputs" content="{}">'
_INPUTS_AT = re.compile(r'<meta name="feedback-inputs" content="([0-9a-f]{64})">')


@functools.cache
def _renderer_digest():
    """What draws a page besides its inputs: this code and the libraries it calls."""
    digest = hashlib.sha256()
    for module in (__file__, sanitize_html.__code__.co_filename):
        digest.update(Path(module).read_bytes())
    for package in ("nbconvert", "nh3", "latex2mathml", "pygments", "mistune"):
        digest.update(f"{package}={importlib.metadata.version(package)};".encode())
    return digest.digest()


def _page_inputs(result, executed, *, show_hidden_tests):
    """A digest of everything `result`'s feedback page is drawn from."""
    digest = hashlib.sha256(_renderer_digest())
    digest.update(json.dumps(result, sort_keys=True, default=str).encode())
    digest.update(b"show hidden tests" if show_hidden_tests else b"hidden tests folded")
    for path in executed:
        digest.update(path.read_bytes() if path.exists() else b"(missing)")
        digest.update(b"\0")
    return digest.hexdigest()


def _inputs_of(page):
    """The inputs digest an earlier page records, or None."""
    try:
        with open(page, encoding="utf-8", errors="replace") as f:
            found = _INPUTS_AT.search(f.read(4096))
    except OSError:
        return None
    return found.group(1) if found else None


def _with_inputs(page, inputs):
    return page.replace("<meta charset=\"utf-8\">\n",
                        "<meta charset=\"utf-8\">\n" + _INPUTS_META.format(inputs) + "\n", 1)


def _with_lateness(course, assignment, result):
    """`result` with its lateness (deadlines.json, collect's timestamps) and the score
    after the late policy; a broken deadlines file is a note, never a lost report."""
    try:
        late = lateness(course=course, assignment=assignment, student=result["student_id"])
    except DeadlinesError as problem:
        late = {"note": f"lateness unknown: {problem}", "penalty_fraction": 0.0}
    return {**result, "lateness": late,
            "final_score": apply_late_policy(result["score"], late)}


def write_reports(*, course, assignment, results, show_hidden_tests=False):
    """Write every export for `results`, with the scores given by hand in the
    formgrader, so every export shows one total; returns (the report folder, the
    results with those scores)."""
    reopened = write_gradebook(course=course, assignment=assignment, results=results)
    results = [{**r, "notes": list(r.get("notes", [])) + [
        f"{gid}: the answer changed since it was graded by hand; it waits for a person again"
        for _, gid in reopened[r["student_id"]]]} if r["student_id"] in reopened else r
        for r in results]
    names = course.notebook_names(assignment)
    results = with_scores_by_hand(results, scores_by_hand(course=course, assignment=assignment),
                                  default_notebook=Path(names[0]).stem)
    results = [_with_lateness(course, assignment, r) for r in results]
    record_lateness(course=course, assignment=assignment, results=results)
    folder = course.reports / assignment
    (folder / "feedback").mkdir(parents=True, exist_ok=True)
    (folder / "gradescope").mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    write_grades_csv(results, folder / "grades.csv")
    for r in results:
        student = r["student_id"]
        (folder / "gradescope" / f"{student}.json").write_text(
            json.dumps(gradescope_results(r), indent=1))
        executed = ([course.autograded / student / assignment / name for name in names]
                    if r["status"] == "graded" else [])
        page = folder / "feedback" / f"{student}.html"
        inputs = _page_inputs(r, executed, show_hidden_tests=show_hidden_tests)
        if _inputs_of(page) != inputs:
            page.write_text(_with_inputs(feedback_html(
                r, executed or None, show_hidden_tests=show_hidden_tests,
                images_from=course.submitted / student / assignment), inputs))
    _write_class_exports(course=course, assignment=assignment, results=results, folder=folder)
    return folder, results


def _write_class_exports(*, course, assignment, results, folder):
    """summary.html/.txt for the class, and with a roster, the LMS import files."""
    from autograder.term.roster import RosterError, load_roster

    try:
        roster = load_roster(course)
    except RosterError:
        roster = None
    graded = {r["student_id"] for r in results}
    nothing = sorted(s["id"] for s in roster.students if s["id"] not in graded) if roster else []
    found = summary.class_summary(results, absent=nothing)
    (folder / "summary.txt").write_text(summary.summary_text(assignment, found) + "\n")
    (folder / "summary.html").write_text(summary.summary_html(assignment, found))
    if roster is None:
        return
    # The import of the LMS the roster came from (both from a plain list): a Canvas
    # class list has no e-mail or ID number for Moodle to map, and its 30 lines of
    # "not in moodle_import.csv" would bury who handed in nothing.
    lms = ("canvas", "moodle") if roster.source not in ("canvas", "moodle") else (roster.source,)
    not_in = {}
    if "canvas" in lms:
        not_in["canvas"] = summary.write_canvas_import(
            results, roster=roster, assignment=assignment, max_score=found["max_score"],
            path=folder / "canvas_import.csv")
    if "moodle" in lms:
        not_in["moodle"] = summary.write_moodle_import(
            results, roster=roster, assignment=assignment, path=folder / "moodle_import.csv")
    for other in {"canvas", "moodle"} - set(lms):  # one written for an earlier roster
        (folder / f"{other}_import.csv").unlink(missing_ok=True)
    lines = []
    if nothing:
        where = " and ".join(
            {"canvas": "an empty cell in canvas_import.csv, which Canvas leaves as it is",
             "moodle": "not in moodle_import.csv"}[name] for name in lms)
        lines += [f"Handed in nothing ({where}):", *nothing]
    if not_in.get("canvas"):
        lines += ["Not in canvas_import.csv (no Canvas user id in the roster):",
                  *sorted(not_in["canvas"])]
    if not_in.get("moodle"):
        lines += ["Not in moodle_import.csv (no e-mail or Moodle ID number in the roster):",
                  *sorted(not_in["moodle"])]
    if roster.source == "canvas" and roster.lms_column(assignment) is None:
        lines += [f"canvas_import.csv heads its column {assignment}: the roster's Canvas "
                  "export has no column of that name, so Canvas would make a new "
                  "assignment. Import the roster again from a gradebook export that has "
                  "the assignment, or rename the column to Canvas's `Name (id)`."]
    if lines:
        (folder / "lms_import_left_out.txt").write_text("\n".join(lines) + "\n")


def grade_table(results, *, expected=None):
    """A plain-text table; with `expected` ({student: total}) a column says if each
    matches. A final column appears when a late penalty changed any score."""
    late = any(r.get("final_score", r["score"]) != r["score"] for r in results)
    header = f"{'student':<24} {'score':>9}  {'status':<8} {'flags':<5}"
    if late:
        header += f" {'final':>6}"
    if expected is not None:
        header += "  expected"
    lines = [header, "-" * len(header)]
    for r in results:
        line = (f"{r['student_id']:<24} {r['score']:>4g}/{r['max_score']:<4g}  "
                f"{r['status']:<8} {'yes' if r.get('flags') else '':<5}")
        if late:
            line += f" {r.get('final_score', r['score']):>6g}"
        if expected is not None:
            want = expected.get(r["student_id"])
            line += f"  {want:g} {'ok' if want == r['score'] else 'MISMATCH'}" if want is not None \
                else "  (none)"
        lines.append(line)
    return "\n".join(lines)
