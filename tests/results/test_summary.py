"""The class summary and the LMS import files (autograder/results/summary.py), pinned.

Each test fails on a small bug in autograder/results/summary.py (`make mutation`): failure
messages grouped without their numbers, pass rates and means per exercise, the
score histogram, the summary page, and Canvas's and Moodle's import CSVs.
"""

import _pyio
import base64
import csv
import os
import struct

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from bs4 import BeautifulSoup
from cycler import cycler
from matplotlib.colors import to_rgba

from autograder.results import summary
from autograder.results.report import CONTENT_SECURITY_POLICY
from autograder.term.roster import Roster


def _cell(gid, points, top, reason=None):
    return {"grade_id": gid, "points": points, "max_points": top, "reason": reason,
            "checks": []}


def _graded(student, cells, **extra):
    return {"student_id": student, "assignment": "hw", "status": "graded",
            "score": sum(c["points"] for c in cells), "max_score": 5.0, "cells": cells,
            **extra}


VAR_WRONG = "token_var: yours 1.25 at index (2,), the answer 2.5; off by 1.25. Hint: ddof"


def _results():
    return [
        _graded("ada", [_cell("mean", 1.0, 1.0), _cell("var", 2.0, 2.0),
                        _cell("norm", 1.5, 2.0, "partial credit 1.5 of 2")], final_score=4.0),
        _graded("bob", [_cell("mean", 0.0, 1.0, "NameError: name 'mu' is not defined"),
                        _cell("var", 0.0, 2.0, VAR_WRONG),
                        _cell("norm", 2.0, 2.0)], pending=["essay", "task"]),
        _graded("cy", [_cell("mean", 1.0, 1.0),
                       _cell("var", 0.0, 2.0, VAR_WRONG.replace("1.25", "-3.5e-05")),
                       _cell("norm", 0.0, 2.0)], pending=[]),
        {"student_id": "dee", "assignment": "hw", "status": "invalid", "score": 0.0,
         "max_score": 0.0, "cells": [], "pending": ["essay"]},
    ]


def test_failure_kind_drops_numbers_hints_and_details():
    """The same mistake on other inputs is one kind: numbers are #, the hint and
    anything after the first ';' are cut, and a kind is at most 160 characters."""
    assert summary._failure_kind(VAR_WRONG) == "token_var: yours # at index (#,), the answer #"
    assert summary._failure_kind("x is -1.5e-05, not 2. Hint: use eps") == "x is #, not #"
    assert summary._failure_kind("shape (2, 3); expected (3, 2)") == "shape (#, #)"
    assert summary._failure_kind("w" * 200) == "w" * 160


def test_class_summary_counts_per_exercise_and_groups_failures():
    """Graded hand-ins only make the table: attempts, full marks, means; failures are
    counted per exercise and kind (a cell with full points or no reason is none);
    final scores (late policy applied) make the histogram; pending hand-grading is
    counted."""
    found = summary.class_summary(_results())
    assert found == {
        "students": 4, "graded": 3, "unsandboxed": 0, "pending": 2, "pending_cells": 3,
        "scores": [4.0, 2.0, 1.0], "max_score": 5.0,
        "exercises": [
            {"grade_id": "mean", "max_points": 1.0, "attempted": 3, "passed": 2,
             "mean": pytest.approx(2 / 3)},
            {"grade_id": "var", "max_points": 2.0, "attempted": 3, "passed": 1,
             "mean": pytest.approx(2 / 3)},
            {"grade_id": "norm", "max_points": 2.0, "attempted": 3, "passed": 1,
             "mean": pytest.approx(3.5 / 3)},
        ],
        "failures": [
            (("var", "token_var: yours # at index (#,), the answer #"), 2),
            (("norm", "partial credit # of #"), 1),
            (("mean", "NameError: name 'mu' is not defined"), 1),
        ],
        "look_at": [("bob", "to grade by hand: essay, task"),
                    ("dee", "invalid: no reason given"), ("dee", "to grade by hand: essay")],
    }


def test_a_cell_given_full_points_by_hand_is_no_failure():
    """A cell the autograder failed but a person then gave every point (it keeps the
    grader's reason) is passed, and its message is not among the failures."""
    regraded = {**_cell("var", 2.0, 2.0, VAR_WRONG), "by_hand": True}
    found = summary.class_summary([_graded("ada", [regraded, _cell("mean", 0.0, 1.0, "no")])])
    assert found["exercises"][0]["passed"] == 1
    assert found["failures"] == [(("mean", "no"), 1)]


def test_class_summary_of_nothing_and_of_many_kinds():
    """No hand-in: zeros, not a crash; many kinds of failure: the 8 most frequent."""
    assert summary.class_summary([]) == {
        "students": 0, "graded": 0, "unsandboxed": 0, "pending": 0, "pending_cells": 0,
        "scores": [], "max_score": 0.0, "exercises": [], "failures": [], "look_at": []}
    many = [_graded(f"s{i}", [_cell(f"ex{i}", 0.0, 1.0, "wrong")]) for i in range(10)]
    many.append(_graded("again", [_cell("ex9", 0.0, 1.0, "wrong")]))
    failures = summary.class_summary(many)["failures"]
    assert len(failures) == 8 and failures[0] == (("ex9", "wrong"), 2)


SUMMARY_TEXT = (  # the exercise lines end in the padding of their columns
    "hw: 3 of 4 graded\n"
    "NOT FINAL: 2 hand-ins still have 3 answers to grade by hand (formgrader); their "
    "scores and the LMS import files leave those points out\n"
    "final score (after hand grading and the late policy): mean 2.33, median 2 of 5\n"
    "exercise                        passed        mean\n"
    "mean                            2/3     0.67/1   \n"
    "var                             1/3     0.67/2   \n"
    "norm                            1/3     1.17/2   \n"
    "most frequent failures:\n"
    "     2 x var: token_var: yours # at index (#,), the answer #\n"
    "     1 x norm: partial credit # of #\n"
    "     1 x mean: NameError: name 'mu' is not defined\n"
    "students to look at:\n"
    "  bob: to grade by hand: essay, task\n"
    "  dee: invalid: no reason given\n"
    "  dee: to grade by hand: essay"
)


def test_summary_text_reads_as_documented():
    """The text summary: counts, the not-final warning, mean and median of the final
    scores, one line per exercise and the most frequent failures."""
    assert summary.summary_text("hw", summary.class_summary(_results())) == SUMMARY_TEXT


def test_summary_text_without_grades_pending_or_failures():
    """Nothing graded: no score line, no warning, no failure list."""
    text = summary.summary_text("hw", summary.class_summary([]))
    assert text == "hw: 0 of 0 graded\nexercise                        passed        mean"


@pytest.fixture
def drawn(monkeypatch):
    """The figures _histogram_png draws, kept open to be looked at."""
    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    yield figures
    for fig in figures:
        close(fig)


def _png_size(b64):
    data = base64.b64decode(b64)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_histogram_counts_scores_in_bins_from_zero_to_the_maximum(drawn):
    """The histogram: final scores counted in equal bins from 0 to the maximum (one
    bin per point, at most 25), labelled axes inside a 600x260 picture."""
    scores = [0.0, 1.0, 4.5, 5.0, 5.0]
    assert _png_size(summary._histogram_png(scores, 5.0)) == (600, 260)
    ax = drawn[-1].axes[0]
    edges = np.linspace(0, 5, 7)
    assert [p.get_x() for p in ax.patches] == pytest.approx(edges[:-1])
    assert [p.get_height() for p in ax.patches] == list(np.histogram(scores, edges)[0])
    assert ax.get_xlabel() == "final score" and ax.get_ylabel() == "students"
    fig = drawn[-1]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for label in (ax.xaxis.label, ax.yaxis.label):
        box = label.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= 600 and box.y1 <= 260
    summary._histogram_png([10, 80], 100.0)
    assert len(drawn[-1].axes[0].patches) == 25
    summary._histogram_png([0.0, 0.0], 0.0)
    patches = drawn[-1].axes[0].patches
    assert len(patches) == 1 and patches[0].get_width() == 1.0
    assert patches[0].get_height() == 2


def test_histogram_looks_the_same_whatever_the_matplotlib_settings(drawn):
    """An instructor's matplotlibrc (another colour cycle, a default savefig format
    or resolution) changes nothing: blue bars with white edges, a 600x260 PNG."""
    settings = {"axes.prop_cycle": cycler(color=["red"]), "patch.force_edgecolor": False,
                "savefig.format": "svg", "savefig.dpi": 200}
    with matplotlib.rc_context(settings):
        picture = summary._histogram_png([1.0, 2.0, 2.0], 3.0)
    assert _png_size(picture) == (600, 260)
    bars = [p for p in drawn[-1].axes[0].patches if p.get_height() > 0]
    assert len(bars) == 2
    for bar in bars:
        assert bar.get_facecolor() == to_rgba("tab:blue")
        assert bar.get_edgecolor() == to_rgba("white")


def _page(found):
    page = summary.summary_html("hw <1>", found)
    soup = BeautifulSoup(page, "html.parser")
    stray = [s.strip() for parent in (soup, soup.html, soup.head, soup.body)
             for s in parent.find_all(string=True, recursive=False)
             if s.strip() and not s.strip().startswith("html")]
    return page, soup, stray


def test_summary_page_shows_the_table_failures_and_histogram():
    """summary.html: the CSP first, the escaped title, the first lines of the text
    summary, the histogram as a data: image, each exercise's pass rate, the failures
    escaped; nothing else."""
    found = summary.class_summary(_results())
    found["failures"].append((("x<y>", "a <b> message"), 1))
    page, soup, stray = _page(found)
    assert page.startswith("<!DOCTYPE html>\n") and page.endswith("</html>\n")
    assert stray == []
    assert soup.html["lang"] == "en"
    metas = soup.head.find_all("meta")
    assert metas[0]["charset"] == "utf-8"
    assert metas[1]["http-equiv"] == "Content-Security-Policy"
    assert metas[1]["content"] == CONTENT_SECURITY_POLICY
    assert soup.title.get_text() == "hw <1>: class summary"
    assert soup.h1.get_text() == "hw <1>: class summary"
    assert soup.pre.get_text() == "\n".join(SUMMARY_TEXT.replace("hw:", "hw <1>:",
                                                                 1).splitlines()[:3])
    img = soup.find("img")
    assert img["alt"] == "score histogram"
    assert img["src"].startswith("data:image/png;base64,")
    assert _png_size(img["src"].split(",", 1)[1]) == (600, 260)
    assert [h.get_text() for h in soup.find_all("h2")] == [
        "Exercises", "Most frequent failures", "Students to look at"]
    exercises, failures, look_at = soup.find_all("table")
    assert [[c.get_text() for c in tr.find_all(["td", "th"])]
            for tr in look_at.find_all("tr")][:2] == [
        ["student", "why"], ["bob", "to grade by hand: essay, task"]]
    assert [[c.get_text() for c in tr.find_all(["td", "th"])]
            for tr in exercises.find_all("tr")] == [
        ["exercise", "full points", "mean"], ["mean", "2 / 3 (67%)", "0.67 / 1"],
        ["var", "1 / 3 (33%)", "0.67 / 2"], ["norm", "1 / 3 (33%)", "1.17 / 2"]]
    assert [[c.get_text() for c in tr.find_all(["td", "th"])]
            for tr in failures.find_all("tr")] == [
        ["students", "exercise", "message (numbers as #)"],
        ["2", "var", "token_var: yours # at index (#,), the answer #"],
        ["1", "norm", "partial credit # of #"],
        ["1", "mean", "NameError: name 'mu' is not defined"],
        ["1", "x<y>", "a <b> message"]]
    for table in (exercises, failures):
        assert [s for s in table.find_all(string=True, recursive=False) if s.strip()] == []


def test_the_students_to_look_at_are_the_failed_flagged_late_pending_and_absent():
    """Before grades go out, the summary names each student who needs a person: not
    graded (with the reason), flagged (each flag), late (the note), hand grading
    pending, and the roster's students who handed in nothing."""
    results = [
        _graded("ada", [], flags=["the hand-in's kernel wrote to the grader's record"]),
        _graded("bob", [], lateness={"late": True, "note": "1 d 2 h late; penalty 10%"}),
        _graded("cy", [], lateness={"late": False, "note": "on time"}),
        {"student_id": "dee", "status": "failed", "reason": "the kernel died", "score": 0,
         "max_score": 5.0, "cells": []},
    ]
    assert summary.students_to_look_at(results, absent=["zoe"]) == [
        ("ada", "flagged: the hand-in's kernel wrote to the grader's record"),
        ("bob", "late: 1 d 2 h late; penalty 10%"),
        ("dee", "failed: the kernel died"),
        ("zoe", "handed in nothing")]


def test_summary_page_before_any_grade_says_so():
    """No graded hand-in: a sentence instead of the histogram; an exercise nobody
    attempted shows 0%, not a crash."""
    found = summary.class_summary([])
    found["exercises"] = [{"grade_id": "mean", "max_points": 1.0, "attempted": 0,
                           "passed": 0, "mean": 0.0}]
    page, soup, stray = _page(found)
    assert stray == [] and soup.find("img") is None
    assert soup.find("p").get_text() == "No graded hand-ins yet."
    assert soup.find("table").find_all("tr")[1].find_all("td")[1].get_text() == "0 / 0 (0%)"
    one = summary.class_summary([_graded("ada", [_cell("mean", 1.0, 1.0)])])
    _, soup, _ = _page(one)
    assert soup.find("table").find_all("tr")[1].find_all("td")[1].get_text() == \
        "1 / 1 (100%)"


def _roster():
    return Roster(source="canvas", students=[
        {"id": "ada", "name": "Lovelace, Ada", "lms_id": "4711", "email": "ada@uni.edu"},
        {"id": "bob", "name": "Babbage, Bob", "lms_id": None, "email": "bob@uni.edu"},
        {"id": "cy", "name": "Cy", "lms_id": "4713", "email": "", "id_number": "S-13"},
        {"id": "dee", "name": "Dee", "lms_id": None, "email": ""},
    ])


def _lms_results():
    return [{"student_id": "dee", "score": 1.0}, {"student_id": "cy", "score": 3.0},
            {"student_id": "bob", "score": 2.0},
            {"student_id": "ada", "score": 5.0, "final_score": 4.5},
            {"student_id": "zed", "score": 1.0}]


def _read(path):
    return list(csv.reader(path.read_text().splitlines()))


def test_canvas_import_lists_students_with_a_canvas_id(tmp_path):
    """Canvas's import: its columns, the Points Possible row, one row per student with
    a Canvas id (final score, sorted by id); the others are returned."""
    path = tmp_path / "canvas.csv"
    missing = summary.write_canvas_import(_lms_results(), roster=_roster(), assignment="hw",
                                          max_score=5.0, path=path)
    assert _read(path) == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "hw"],
        ["Points Possible", "", "", "", "", "5"],
        ["Lovelace, Ada", "4711", "", "ada@uni.edu", "", "4.5"],
        ["Cy", "4713", "", "", "", "3"],
    ]
    assert missing == ["bob", "dee", "zed"]


def test_canvas_import_without_a_roster_or_an_email(tmp_path):
    """No roster: nobody can be matched; a roster entry without an e-mail key gets an
    empty login column."""
    path = tmp_path / "canvas.csv"
    assert summary.write_canvas_import(_lms_results()[:2], roster=None, assignment="hw",
                                       max_score=8.0, path=path) == ["cy", "dee"]
    assert _read(path)[1:] == [["Points Possible", "", "", "", "", "8"]]
    summary.write_canvas_import([{"student_id": "ada", "score": 2.0}],
                                roster={"ada": {"name": "Ada", "lms_id": "1"}},
                                assignment="hw", max_score=8.0, path=path)
    assert _read(path)[2] == ["Ada", "1", "", "", "", "2"]


def test_moodle_import_maps_on_email_or_id_number(tmp_path):
    """Moodle's import: an e-mail or the user's ID number to map on, the final score; a
    student with neither is returned. An LMS id (Canvas's, or Moodle's participant id in
    download names) is no ID number: Moodle maps users by id, username, ID number or
    e-mail (grade/import/csv), and a participant id is none of them."""
    path = tmp_path / "moodle.csv"
    missing = summary.write_moodle_import(_lms_results(), roster=_roster(), assignment="hw",
                                          path=path)
    assert _read(path) == [
        ["Full name", "Email address", "ID number", "hw"],
        ["Lovelace, Ada", "ada@uni.edu", "", "4.5"],
        ["Babbage, Bob", "bob@uni.edu", "", "2"],
        ["Cy", "", "S-13", "3"],
    ]
    assert missing == ["dee", "zed"]
    assert summary.write_moodle_import(_lms_results()[:1], roster=None, assignment="hw",
                                       path=path) == ["dee"]
    assert _read(path) == [["Full name", "Email address", "ID number", "hw"]]
    assert summary.write_moodle_import([{"student_id": "ada", "score": 2.0}],
                                       roster={"ada": {"name": "Ada", "lms_id": "1"}},
                                       assignment="hw", path=path) == ["ada"]
    assert len(_read(path)) == 1


@pytest.fixture
def windows_line_ends(monkeypatch):
    """Text files opened as on Windows: the pure-Python io, whose text mode turns each
    "\\n" written into os.linesep, with os.linesep "\\r\\n"."""
    monkeypatch.setattr(os, "linesep", "\r\n")
    monkeypatch.setattr(summary, "open", _pyio.open, raising=False)


def test_import_files_end_rows_in_crlf_on_windows_too(tmp_path, windows_line_ends):
    """Canvas's and Moodle's CSVs end each row in one CRLF (the csv module's), not
    CR CR LF, which would make a blank row after each student on Windows."""
    roster = {"ada": {"name": "Ada", "lms_id": "1", "email": "a@u"}}
    canvas, moodle = tmp_path / "canvas.csv", tmp_path / "moodle.csv"
    summary.write_canvas_import([{"student_id": "ada", "score": 2.0}], roster=roster,
                                assignment="hw", max_score=8.0, path=canvas)
    assert canvas.read_bytes() == (b"Student,ID,SIS User ID,SIS Login ID,Section,hw\r\n"
                                   b"Points Possible,,,,,8\r\nAda,1,,a@u,,2\r\n")
    summary.write_moodle_import([{"student_id": "ada", "score": 2.0}], roster=roster,
                                assignment="hw", path=moodle)
    assert moodle.read_bytes() == b"Full name,Email address,ID number,hw\r\nAda,a@u,,2\r\n"


def test_hand_ins_graded_without_the_sandbox_are_counted_at_the_top_of_the_summary():
    """grade --no-sandbox flags each result; the summary, text and page, says how many
    hand-ins ran unsandboxed, right under the count of graded ones."""
    from autograder.grading.grade import UNSANDBOXED_FLAG

    results = _results()
    for result in results[:2]:
        result["flags"] = [UNSANDBOXED_FLAG]
    counted = summary.class_summary(results)
    assert counted["unsandboxed"] == 2
    text = summary.summary_text("hw", counted).splitlines()
    assert text[1] == ("NOT SANDBOXED: 2 hand-ins were graded with --no-sandbox; their code "
                       "could reach the network and this machine's files")
    page = BeautifulSoup(summary.summary_html("hw", counted), "html.parser")
    assert "NOT SANDBOXED: 2 hand-ins" in page.find("pre").get_text()
    assert summary.class_summary(_results())["unsandboxed"] == 0


CANVAS_EXPORT = (  # Canvas's gradebook export, as its "Import grades" guide lays it out
    "Student,ID,SIS User ID,SIS Login ID,Section,01 The Recipe (70211),Quiz 1 (70212)\n"
    "    Points Possible,,,,,8,5\n"
    '"Lovelace, Ada",4711,S-4711,ada.l,Sec A,,5\n'
    '"Müller, Jürgen",4713,S-4713,jm,Sec B,,4\n'
    '"Nguyễn, Thị Hoa",4714,S-4714,hoa,Sec B,,\n')


def test_canvas_import_lands_in_the_exported_column_with_every_student(tmp_path):
    """Canvas matches an import's column by the id in `Name (id)`: the column is headed
    as Canvas's own export heads the assignment; SIS ids and sections come from that
    export; a student who handed in nothing has a row with an empty cell (Canvas leaves
    it as it is), not no row."""
    from autograder.course import Course
    from autograder.term.roster import import_roster, load_roster

    course = Course(tmp_path / "course")
    (tmp_path / "course").mkdir()
    (tmp_path / "export.csv").write_text(CANVAS_EXPORT, encoding="utf-8")
    import_roster(course=course, csv_path=tmp_path / "export.csv")
    roster = load_roster(course)
    path = tmp_path / "canvas.csv"
    results = [{"student_id": "4711", "score": 8.0, "final_score": 7.2},
               {"student_id": "4713", "score": 6.0}]
    assert summary.write_canvas_import(results, roster=roster, assignment="01_the_recipe",
                                       max_score=8.0, path=path) == []
    assert _read(path) == [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01 The Recipe (70211)"],
        ["Points Possible", "", "", "", "", "8"],
        ["Lovelace, Ada", "4711", "S-4711", "ada.l", "Sec A", "7.2"],
        ["Müller, Jürgen", "4713", "S-4713", "jm", "Sec B", "6"],
        ["Nguyễn, Thị Hoa", "4714", "S-4714", "hoa", "Sec B", ""],
    ]
    summary.write_canvas_import(results, roster=roster, assignment="02_rows", max_score=8.0,
                                path=path)
    assert _read(path)[0][-1] == "02_rows"
