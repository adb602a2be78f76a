"""Deadlines: due dates, extensions, the LMS's late marker, timestamps and the late policy.

Issue 14, item 6: Canvas's `_LATE_` marker was silently dropped; no due date, timestamp or
late penalty reached the export.
"""

import argparse
import json
import os
import zipfile
from datetime import UTC, datetime

import pytest

from autograder.cli_class import register
from autograder.collect import collect
from autograder.deadlines import (
    DeadlinesError,
    apply_late_policy,
    format_timestamp,
    lateness,
    parse_timestamp,
)
from conftest import tiny_course, tiny_notebook

ASSIGNMENT = "01_hw"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"



@pytest.fixture
def course(tmp_path):
    return tiny_course(tmp_path / "course", ASSIGNMENT)


def _deadlines(course, data):
    (course.root / "deadlines.json").write_text(json.dumps(data))


def _zip(path, members):
    """{name: (bytes, date_time)} -> a zip whose members carry those dates."""
    with zipfile.ZipFile(path, "w") as z:
        for name, (data, when) in members.items():
            z.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


def _canvas_zip(tmp_path):
    return _zip(tmp_path / "canvas.zip", {
        f"lovelaceada_LATE_12345_67890_{NOTEBOOK}": (tiny_notebook("ada"), (2026, 10, 1, 12, 0, 0)),
        f"hopperg_34567_89012_{NOTEBOOK}": (tiny_notebook("grace"), (2026, 9, 30, 9, 0, 0)),
        f"turingalan_23456_78901_{NOTEBOOK}": (tiny_notebook("alan"), (2026, 10, 3, 12, 0, 0)),
    })


def test_a_canvas_late_marker_is_kept_and_marks_the_handin_late(course, tmp_path):
    """The problem as reported: `_LATE_` was dropped. No deadlines.json at all here."""
    report = collect(course=course, assignment=ASSIGNMENT, source_path=_canvas_zip(tmp_path))
    assert report.late == ["lovelaceada_12345"]
    assert any("marked late" in line and "lovelaceada_12345" in line for line in report.lines())
    sidecar = json.loads((course.submitted / "lovelaceada_12345" / ASSIGNMENT /
                          ".handin.json").read_text())
    assert sidecar["lms"] == "canvas" and sidecar["lms_late"] is True
    assert sidecar["lms_id"] == "12345"
    ada = lateness(course=course, assignment=ASSIGNMENT, student="lovelaceada_12345")
    assert ada["late"] is True and ada["lms_late"] is True and "marked it late" in ada["note"]
    grace = lateness(course=course, assignment=ASSIGNMENT, student="hopperg_34567")
    assert grace["late"] is False and grace["due"] is None


def test_zip_dates_become_nbgrader_timestamps_in_the_course_zone(course, tmp_path):
    _deadlines(course, {"timezone": "Europe/Berlin"})
    collect(course=course, assignment=ASSIGNMENT, source_path=_canvas_zip(tmp_path))
    stamp = (course.submitted / "hopperg_34567" / ASSIGNMENT / "timestamp.txt").read_text()
    assert stamp == "2026-09-30 07:00:00.000000 UTC"  # 09:00 in Berlin (CEST)
    assert datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f %Z")
    info = lateness(course=course, assignment=ASSIGNMENT, student="hopperg_34567")
    assert info["source"] == "zip member date"
    assert info["submitted_at"] == "2026-09-30T07:00:00+00:00"


def test_due_date_extension_and_policy_give_the_right_penalty(course, tmp_path):
    _deadlines(course, {
        "timezone": "UTC",
        "policy": {"percent_per_day": 10, "max_percent": 50, "grace_minutes": 30},
        "assignments": {ASSIGNMENT: {"due": "2026-10-01 10:00"}},
        "extensions": {ASSIGNMENT: {"turingalan_23456": {"days": 1}}},
    })
    collect(course=course, assignment=ASSIGNMENT, source_path=_canvas_zip(tmp_path))
    # Ada: 2 h late (a started day counts): 10 %; Canvas says late too.
    ada = lateness(course=course, assignment=ASSIGNMENT, student="lovelaceada_12345")
    assert ada["late_seconds"] == 2 * 3600 and ada["penalty_fraction"] == pytest.approx(0.1)
    assert ada["due"] == "2026-10-01T10:00:00+00:00"
    assert apply_late_policy(8.0, ada) == pytest.approx(7.2)
    # Alan: due + 1 day extension = Oct 2 10:00; handed in Oct 3 12:00: 26 h -> 2 days, 20 %.
    alan = lateness(course=course, assignment=ASSIGNMENT, student="turingalan_23456")
    assert alan["due"] == "2026-10-02T10:00:00+00:00" and alan["extension"]
    assert alan["late_seconds"] == 26 * 3600
    assert alan["penalty_fraction"] == pytest.approx(0.2)
    assert "extension" in alan["note"] and "zip member date" in alan["note"]
    # Grace: on time.
    grace = lateness(course=course, assignment=ASSIGNMENT, student="hopperg_34567")
    assert grace["late_seconds"] == 0 and grace["penalty_fraction"] == 0
    assert apply_late_policy(8.0, grace) == 8.0


def test_grace_cap_zero_after_and_the_lms_marker_alone(course, tmp_path):
    members = {f"s{n}_{1000 + n}_1_{NOTEBOOK}": (tiny_notebook(str(n)), (2026, 10, day, hour, 0, 0))
               for n, (day, hour) in enumerate([(1, 10), (1, 13), (8, 11), (20, 11)])}
    members[f"early_LATE_1009_1_{NOTEBOOK}"] = (tiny_notebook("early"), (2026, 9, 1, 0, 0, 0))
    _deadlines(course, {"policy": {"percent_per_day": 25, "max_percent": 60, "grace_minutes": 5,
                                   "partial_days": "exact", "zero_after_days": 14},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01T12:00:00+02:00"}}})
    collect(course=course, assignment=ASSIGNMENT, source_path=_zip(tmp_path / "z.zip", members))

    def penalty(student):
        return lateness(course=course, assignment=ASSIGNMENT, student=student)[
            "penalty_fraction"]

    assert penalty("s0_1000") == 0                     # exactly due (10:00 UTC)
    assert penalty("s1_1001") == pytest.approx(0.25 * 3 / 24)  # 3 h, pro rata
    assert penalty("s2_1002") == pytest.approx(0.6)    # 7 days: capped at 60 %
    assert penalty("s3_1003") == 1.0                   # over 14 days: zero
    assert penalty("early_1009") == pytest.approx(0.25)  # Canvas says late: one day
    _deadlines(course, {"policy": {"percent_per_day": 25, "lms_late_marker": "note"},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01T12:00:00+02:00"}}})
    assert penalty("early_1009") == 0


def test_a_folder_handin_uses_the_file_time_and_says_so(course, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "ada.ipynb").write_bytes(tiny_notebook("ada"))
    when = datetime(2026, 10, 2, 12, 0, tzinfo=UTC).timestamp()
    os.utime(inbox / "ada.ipynb", (when, when))
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    info = lateness(course=course, assignment=ASSIGNMENT, student="ada")
    assert info["source"].startswith("file modification time")
    assert info["late_seconds"] == 86400 and info["penalty_fraction"] == pytest.approx(0.1)


def test_nbgrader_timestamps_round_trip():
    assert parse_timestamp("2015-02-02 14:58:23.948203 America/Los_Angeles") == \
        datetime(2015, 2, 2, 22, 58, 23, 948203, tzinfo=UTC)
    assert parse_timestamp("2015-02-02 14:58:23.948203 -0800").hour == 22
    assert parse_timestamp("garbage") is None
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert parse_timestamp(format_timestamp(when)) == when


def test_a_broken_deadlines_file_says_where(course):
    _deadlines(course, {"policy": {"percent_per_dya": 10}})
    with pytest.raises(DeadlinesError, match="percent_per_dya"):
        lateness(course=course, assignment=ASSIGNMENT, student="ada")
    _deadlines(course, {"assignments": {ASSIGNMENT: {"due": "next friday"}}})
    with pytest.raises(DeadlinesError, match="next friday"):
        lateness(course=course, assignment=ASSIGNMENT, student="ada")


def test_deadlines_show_lists_each_handin(course, tmp_path, capsys):
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 10:00"}},
                        "extensions": {ASSIGNMENT: {"turingalan_23456": "2026-10-05 10:00"}}})
    collect(course=course, assignment=ASSIGNMENT, source_path=_canvas_zip(tmp_path))
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):  # as autograder/cli.py defines it
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--course", default=None)
        p.set_defaults(func=func)
        return p

    register(sub, add)
    args = parser.parse_args(["deadlines", "show", ASSIGNMENT, "--course", str(course.root)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "due 2026-10-01 10:00+00:00" in out
    assert "LATE lovelaceada_12345" in out and "ok   turingalan_23456" in out
    assert "extension: turingalan_23456" in out
