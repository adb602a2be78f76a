"""Exports of one assignment's results, in reports/<assignment>/:

grades.csv (one row per student, failures included), gradescope/<student>.json
(Gradescope's results format), feedback/<student>.html (the run with each
check's message) and a plain-text grade table for the terminal; and the
scores in nbgrader's gradebook.db, for the formgrader.
"""

import csv
import html
import json
import re

import nbformat
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


def _summary_html(result):
    rows = []
    for cell in result["cells"]:
        messages = [c["message"] for c in cell["checks"]]
        if cell["reason"] and cell["reason"] not in messages:
            messages.append(cell["reason"])
        rows.append(
            f"<tr><td>{html.escape(cell['grade_id'])}</td>"
            f"<td>{cell['points']:g} / {cell['max_points']:g}</td>"
            f"<td>{'<br>'.join(html.escape(m) for m in messages)}</td></tr>")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in result.get("notes", []))
    reason = html.escape(result.get("reason") or "")
    return (
        f"<section style='font-family:sans-serif;margin:1em'>"
        f"<h1>{html.escape(result['assignment'])}: {html.escape(result['student_id'])}</h1>"
        f"<p><b>Score: {result['score']:g} / {result['max_score']:g}</b> "
        f"({html.escape(result['status'])}) {reason}</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + "<table border='1' cellpadding='4' style='border-collapse:collapse'>"
        "<tr><th>exercise</th><th>points</th><th>what the grader found</th></tr>"
        + "".join(rows) + "</table></section>")


def feedback_html(result, executed_notebook_path):
    """A feedback page: the score table, then the graded run of the notebook."""
    body = ""
    if executed_notebook_path is not None and executed_notebook_path.exists():
        nb = nbformat.read(executed_notebook_path, as_version=4)
        page, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
        return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + _summary_html(result), page,
                      count=1)
    return f"<!DOCTYPE html><html><body>{_summary_html(result)}{body}</body></html>"


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
