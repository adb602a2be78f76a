"""Where the class stands on one assignment, and its grades in the LMS's import formats.

summary.html / summary.txt: the score histogram, each exercise's pass rate and mean, and
the failure messages most students met. canvas_import.csv and moodle_import.csv: the
final scores (hand grades and the late policy applied), one row per roster student.
"""

import base64
import csv
import html
import io
import re
from collections import Counter

import numpy as np

from autograder.grading.grade import UNSANDBOXED_FLAG

# Every page of the results (this summary, report's feedback pages): no script, no
# network, nothing but inline styles and data: images.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "font-src data:; object-src 'none'; frame-src 'none'; child-src 'none'; "
    "worker-src 'none'; connect-src 'none'; media-src 'none'; manifest-src 'none'; "
    "form-action 'none'; base-uri 'none'")

_NUMBERS = re.compile(r"-?\d+(\.\d+)?(e-?\d+)?")
_COMMON_FAILURES = 8


def _failure_kind(reason):
    """A failure message without its numbers, so that the same mistake on other
    inputs counts as one."""
    first = reason.split(". Hint")[0].split(";")[0]
    return _NUMBERS.sub("#", first)[:160]


def students_to_look_at(results, *, absent=()):
    """[(student, why)]: who an instructor should look at before grades go out: results
    not graded (and why), flagged, late, with hand grading pending, and the roster's
    students who handed in nothing (absent)."""
    rows = []
    for r in sorted(results, key=lambda r: r["student_id"]):
        student = r["student_id"]
        if r["status"] != "graded":
            rows.append((student, f"{r['status']}: {r.get('reason') or 'no reason given'}"))
        rows += [(student, f"flagged: {flag}") for flag in r.get("flags", ())]
        lateness = r.get("lateness") or {}
        if lateness.get("late"):
            rows.append((student, f"late: {lateness.get('note', '')}".rstrip(": ")))
        if r.get("pending"):
            rows.append((student, f"to grade by hand: {', '.join(r['pending'])}"))
    rows += [(student, "handed in nothing") for student in sorted(absent)]
    return rows


def class_summary(results, *, absent=()):
    """{"students", "graded", "unsandboxed" (graded with --no-sandbox), "scores",
    "max_score", "exercises": [{grade_id, max_points, passed, attempted, mean}],
    "failures": [(message, count)], "look_at": [(student, why)]} for one assignment;
    absent: the roster's students without a hand-in."""
    graded = [r for r in results if r["status"] == "graded"]
    exercises = {}
    failures = Counter()
    for result in graded:
        for cell in result["cells"]:
            row = exercises.setdefault(cell["grade_id"], {
                "grade_id": cell["grade_id"], "max_points": cell["max_points"], "points": []})
            row["points"].append(cell["points"])
            if cell["points"] < cell["max_points"] and cell.get("reason"):
                failures[(cell["grade_id"], _failure_kind(cell["reason"]))] += 1
    table = [{"grade_id": row["grade_id"], "max_points": row["max_points"],
              "attempted": len(row["points"]),
              "passed": sum(p >= row["max_points"] for p in row["points"]),
              "mean": float(np.mean(row["points"])) if row["points"] else 0.0}
             for row in exercises.values()]
    pending = [r for r in results if r.get("pending")]
    return {"students": len(results), "graded": len(graded),
            "unsandboxed": sum(UNSANDBOXED_FLAG in r.get("flags", ()) for r in results),
            "pending": len(pending), "pending_cells": sum(len(r["pending"]) for r in pending),
            "scores": [r.get("final_score", r["score"]) for r in graded],
            "max_score": max((r["max_score"] for r in results), default=0.0),
            "exercises": table, "failures": failures.most_common(_COMMON_FAILURES),
            "look_at": students_to_look_at(results, absent=absent)}


def summary_text(assignment, summary):
    scores = summary["scores"]
    lines = [f"{assignment}: {summary['graded']} of {summary['students']} graded"]
    if summary.get("unsandboxed"):
        lines.append(f"NOT SANDBOXED: {summary['unsandboxed']} hand-ins were graded with "
                     "--no-sandbox; their code could reach the network and this machine's "
                     "files")
    if summary.get("pending"):
        lines.append(f"NOT FINAL: {summary['pending']} hand-ins still have "
                     f"{summary['pending_cells']} answers to grade by hand (formgrader); "
                     "their scores and the LMS import files leave those points out")
    if scores:
        lines.append(f"final score (after hand grading and the late policy): mean "
                     f"{np.mean(scores):.2f}, median {np.median(scores):g} "
                     f"of {summary['max_score']:g}")
    lines.append(f"{'exercise':<28} {'passed':>9} {'mean':>11}")
    for row in summary["exercises"]:
        lines.append(f"{row['grade_id']:<28} {row['passed']:>4}/{row['attempted']:<4} "
                     f"{row['mean']:>5.2f}/{row['max_points']:<4g}")
    if summary["failures"]:
        lines.append("most frequent failures:")
        lines += [f"  {count:>4} x {gid}: {message}"
                  for (gid, message), count in summary["failures"]]
    if summary.get("look_at"):
        lines.append("students to look at:")
        lines += [f"  {student}: {why}" for student, why in summary["look_at"]]
    return "\n".join(lines)


def _histogram_png(scores, max_score):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.6))
    bins = np.linspace(0, max(max_score, 1), min(int(max_score) + 2, 26))
    ax.hist(scores, bins=bins, color="tab:blue", edgecolor="white")
    ax.set_xlabel("final score")
    ax.set_ylabel("students")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def summary_html(assignment, summary):
    """A self-contained page (no script, no network), like the feedback pages."""

    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(r['grade_id'])}</td><td>{r['passed']} / {r['attempted']} "
        f"({100 * r['passed'] / max(r['attempted'], 1):.0f}%)</td>"
        f"<td>{r['mean']:.2f} / {r['max_points']:g}</td></tr>" for r in summary["exercises"])
    failures = "".join(f"<tr><td>{count}</td><td>{esc(gid)}</td><td>{esc(message)}</td></tr>"
                       for (gid, message), count in summary["failures"])
    look_at = "".join(f"<tr><td>{esc(student)}</td><td>{esc(why)}</td></tr>"
                      for student, why in summary.get("look_at", ()))
    picture = (f"<img alt='score histogram' src='data:image/png;base64,"
               f"{_histogram_png(summary['scores'], summary['max_score'])}'>"
               if summary["scores"] else "<p>No graded hand-ins yet.</p>")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CONTENT_SECURITY_POLICY}\">"
        f"<title>{esc(assignment)}: class summary</title></head>"
        "<body style='font-family:sans-serif;max-width:60em;margin:1em auto'>"
        f"<h1>{esc(assignment)}: class summary</h1>"
        f"<pre>{esc(chr(10).join(summary_text(assignment, summary).splitlines()[:3]))}</pre>"
        f"{picture}"
        "<h2>Exercises</h2><table border='1' style='border-collapse:collapse'>"
        "<tr><th>exercise</th><th>full points</th><th>mean</th></tr>"
        f"{rows}</table><h2>Most frequent failures</h2>"
        "<table border='1' style='border-collapse:collapse'>"
        "<tr><th>students</th><th>exercise</th><th>message (numbers as #)</th></tr>"
        f"{failures}</table><h2>Students to look at</h2>"
        "<table border='1' style='border-collapse:collapse'>"
        "<tr><th>student</th><th>why</th></tr>"
        f"{look_at}</table></body></html>\n")


def _score_by_student(results):
    return {r["student_id"]: r.get("final_score", r["score"]) for r in results}


def write_canvas_import(results, *, roster, assignment, max_score, path):
    """Canvas's gradebook import CSV: Student, ID (Canvas user id), SIS User ID, SIS
    Login ID, Section, then the assignment's column, headed as Canvas heads it in its
    export, `Name (assignment id)`, when the roster came from that export (Canvas
    matches the column by that id; a header it does not know becomes a new
    assignment), with the 'Points Possible' row. Every roster student with a Canvas id
    has a row: those without a result have an empty cell, which Canvas leaves as it
    is. Students with a result but no Canvas id are left out; returns their ids."""
    scores, missing = _score_by_student(results), []
    column = roster.lms_column(assignment) if hasattr(roster, "lms_column") else None
    everyone = list(getattr(roster, "students", []))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                         column or assignment])
        writer.writerow(["Points Possible", "", "", "", "", f"{max_score:g}"])

        def row(entry, score):
            writer.writerow([entry["name"], entry["lms_id"], entry.get("sis_user_id", ""),
                             entry.get("sis_login_id") or entry.get("email", ""),
                             entry.get("section", ""), score])

        for student, score in sorted(scores.items()):
            entry = roster.get(student) if roster else None
            if not entry or not entry.get("lms_id"):
                missing.append(student)
                continue
            row(entry, f"{score:g}")
        for entry in sorted(everyone, key=lambda e: e["id"]):
            if entry.get("lms_id") and entry["id"] not in scores:
                row(entry, "")
    return missing


def write_moodle_import(results, *, roster, assignment, path):
    """Moodle's 'Import grades from CSV': the columns to map users on (Email address,
    and ID number: the user's ID number field, from a participants export; never a
    participant or Canvas id, which Moodle cannot map a user by) and the assignment's
    grade column. Students with neither are left out; returns their ids."""
    scores, missing = _score_by_student(results), []
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Full name", "Email address", "ID number", assignment])
        for student, score in sorted(scores.items()):
            entry = roster.get(student) if roster else None
            if not entry or not (entry.get("email") or entry.get("id_number")):
                missing.append(student)
                continue
            writer.writerow([entry["name"], entry.get("email", ""),
                             entry.get("id_number") or "", f"{score:g}"])
    return missing
