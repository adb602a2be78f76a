"""Deadlines: due dates, extensions, the LMS's late marker, timestamps and the late policy.

Issue 14, item 6: Canvas's `_LATE_` marker was silently dropped; no due date, timestamp or
late penalty reached the export.
"""

import json
import locale
import os
import zipfile
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from autograder.term import deadlines
from autograder.term.collect import collect
from autograder.term.deadlines import (
    DeadlinesError,
    apply_late_policy,
    assignment_policy,
    course_zone,
    due_date,
    format_timestamp,
    lateness,
    load_deadlines,
    parse_time,
    parse_timestamp,
    read_record,
    show_lines,
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
    _deadlines(course, {"timezone": "Europe/Berlin", "policy": {"trust_zip_and_file_dates": True}})
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
        "policy": {"percent_per_day": 10, "max_percent": 50, "grace_minutes": 30,
                   "trust_zip_and_file_dates": True},
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
                                   "partial_days": "exact", "zero_after_days": 14,
                                   "trust_zip_and_file_dates": True},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01T12:00:00+02:00"}}})
    collect(course=course, assignment=ASSIGNMENT, source_path=_zip(tmp_path / "z.zip", members))

    def penalty(student):
        return lateness(course=course, assignment=ASSIGNMENT, student=student)[
            "penalty_fraction"]

    assert penalty("s0_1000") == 0                     # exactly due (10:00 UTC)
    assert penalty("s1_1001") == pytest.approx(0.25 * 3 / 24)  # 3 h, pro rata
    assert penalty("s2_1002") == pytest.approx(0.6)    # 7 days: capped at 60 %
    assert penalty("s3_1003") == 1.0                   # over 14 days: zero
    assert penalty("early_1009") == 0  # its time says on time: Canvas's marker is noted
    _deadlines(course, {"policy": {"percent_per_day": 25},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01T12:00:00+02:00"}}})
    assert penalty("early_1009") == pytest.approx(0.25)  # no trusted time: one day
    assert penalty("s3_1003") == 0  # its zip date is not a submission time
    _deadlines(course, {"policy": {"percent_per_day": 25, "lms_late_marker": "note"},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01T12:00:00+02:00"}}})
    assert penalty("early_1009") == 0


def test_a_canvas_zip_built_after_the_deadline_makes_nobody_late(course, tmp_path):
    """Canvas dates every member of "Download Submissions" with the time the zip was
    built, not the submission time (instructure/canvas-lms#2219): a zip downloaded three
    days after the deadline is evidence of nothing. Only the _LATE_ marker counts."""
    _deadlines(course, {"policy": {"percent_per_day": 10, "grace_minutes": 15},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    built = (2026, 10, 4, 21, 0, 0)
    collect(course=course, assignment=ASSIGNMENT, source_path=_zip(tmp_path / "canvas.zip", {
        f"lovelaceada_12345_67890_{NOTEBOOK}": (tiny_notebook("ada"), built),
        f"turingalan_LATE_23456_78901_{NOTEBOOK}": (tiny_notebook("alan"), built)}))
    ada = lateness(course=course, assignment=ASSIGNMENT, student="lovelaceada_12345")
    assert ada["late"] is False and ada["penalty_fraction"] == 0.0
    assert ada["submitted_at"] is None and ada["source"] is None
    assert ada["note"] == ("submission time unknown (the zip member date 2026-10-04 21:00 UTC "
                           "is not a submission time; trust_zip_and_file_dates would use it); "
                           "on time, time unknown")
    alan = lateness(course=course, assignment=ASSIGNMENT, student="turingalan_23456")
    assert alan["late"] is True and alan["penalty_fraction"] == pytest.approx(0.1)
    assert alan["note"].endswith("Canvas marked it late; no submission time, so one day "
                                 "counts; late penalty 10%")


def _canvas_submissions(*entries):
    """Canvas's answer to "List assignment submissions" (GET /api/v1/courses/:course_id/
    assignments/:assignment_id/submissions), as canvas-lms documents the Submission model
    in app/controllers/submissions_api_controller.rb: one object per student, user_id an
    integer, submitted_at an ISO 8601 time ("2012-01-01T01:00:00Z") or null for a student
    who submitted nothing (workflow_state "unsubmitted")."""
    return json.dumps([
        {"assignment_id": 23, "attempt": 1 if when else None, "user_id": uid,
         "submitted_at": when, "late": late, "seconds_late": 0, "missing": when is None,
         "workflow_state": "submitted" if when else "unsubmitted", "grade": None,
         "score": None, "submission_type": "online_upload" if when else None}
        for uid, when, late in entries])


def _deadlines_cli(course, *words):
    from autograder import cli

    return cli.main(["deadlines", *words, "--course", str(course.root)])


def test_the_lms_submission_times_decide_lateness_over_zip_dates_and_the_late_marker(
        course, tmp_path, capsys):
    """A Canvas zip tells nothing of when (its dates are the download's); Canvas's own
    submission times, imported from its API answer, do: 11 minutes late within a 15-minute
    grace is on time although Canvas marked it late, a day and a bit late is two days,
    and a student who submitted nothing or is not in the roster is left out, said so."""
    (course.root / "roster.json").write_text(json.dumps({"source": "canvas", "students": [
        {"id": "lovelaceada_12345", "name": "Lovelace, Ada", "lms_id": "12345"},
        {"id": "turingalan_23456", "name": "Turing, Alan", "lms_id": "23456"},
        {"id": "hopperg_34567", "name": "Hopper, Grace", "lms_id": "34567"}]}))
    _deadlines(course, {"policy": {"percent_per_day": 10, "grace_minutes": 15},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    built = (2026, 10, 4, 21, 0, 0)
    collect(course=course, assignment=ASSIGNMENT, source_path=_zip(tmp_path / "canvas.zip", {
        f"lovelaceada_LATE_12345_67890_{NOTEBOOK}": (tiny_notebook("ada"), built),
        f"turingalan_LATE_23456_78901_{NOTEBOOK}": (tiny_notebook("alan"), built),
        f"hopperg_34567_89012_{NOTEBOOK}": (tiny_notebook("grace"), built)}))
    export = tmp_path / "submissions.json"
    export.write_text(_canvas_submissions((12345, "2026-10-01T12:11:00Z", True),
                                          (23456, "2026-10-02T14:00:00Z", True),
                                          (34567, None, False), (99999, "2026-10-01T09:00:00Z",
                                                                 False), (88888, None, False)))
    assert _deadlines_cli(course, "times", ASSIGNMENT, str(export)) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{ASSIGNMENT}: 2 submission time(s) imported\n")
    assert "left out: entry 4: 99999 is not in the roster" in out
    # an id of another section says so even without a time; a hand-in without a time too
    assert "entry 5: 88888 is not in the roster (by id or LMS user id); it has no " \
        "submission time either" in out
    assert "handed in, but without a time in submissions.json (lateness falls back to " \
        "the LMS's late marker): hopperg_34567" in out
    ada = lateness(course=course, assignment=ASSIGNMENT, student="lovelaceada_12345")
    assert (ada["late"], ada["penalty_fraction"]) == (False, 0.0)
    assert ada["submitted_at"] == "2026-10-01T12:11:00+00:00"
    assert ada["note"] == ("submitted 2026-10-01 12:11 UTC (Canvas submission time); 11 min "
                           "late, within the grace period; Canvas marked it late; the "
                           "submission time decides")
    alan = lateness(course=course, assignment=ASSIGNMENT, student="turingalan_23456")
    assert (alan["late"], alan["days_late"]) == (True, 2)
    assert alan["penalty_fraction"] == pytest.approx(0.2)
    grace = lateness(course=course, assignment=ASSIGNMENT, student="hopperg_34567")
    assert grace["submitted_at"] is None and "on time, time unknown" in grace["note"]


def test_submission_times_from_a_csv_match_roster_or_lms_ids_and_bad_rows_are_named(
        course, tmp_path, capsys):
    """Any LMS: a CSV of id,submitted_at (a roster id or an LMS user id; a time without an
    offset is in the course's zone). A row whose time cannot be read is named; a file
    without those columns is refused, saying which it has."""
    (course.root / "roster.json").write_text(json.dumps({"students": [
        {"id": "ada", "name": "Ada", "lms_id": "4711"}, {"id": "alan", "name": "Alan"}]}))
    _deadlines(course, {"timezone": "Europe/Berlin",
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    times = tmp_path / "times.csv"
    times.write_text("ID,Submitted_At\n4711,2026-10-01 13:30\nalan,next tuesday\n")
    assert _deadlines_cli(course, "times", ASSIGNMENT, str(times)) == 0
    out = capsys.readouterr().out
    assert "1 submission time(s) imported" in out
    assert "entry 3: 'next tuesday' is not an ISO date and time" in out
    stored = json.loads(deadlines.submission_times_path(course, ASSIGNMENT).read_text())
    assert stored["times"] == {"ada": "2026-10-01T11:30:00+00:00"}
    times.write_text("student,when\nada,2026-10-01 13:30\n")
    assert _deadlines_cli(course, "times", ASSIGNMENT, str(times)) == 1
    assert "needs the columns id and submitted_at (found: student, when)" in \
        capsys.readouterr().err
    assert _deadlines_cli(course, "times", ASSIGNMENT) == 2


def test_a_folder_handin_uses_the_file_time_and_says_so(course, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "ada.ipynb").write_bytes(tiny_notebook("ada"))
    when = datetime(2026, 10, 2, 12, 0, tzinfo=UTC).timestamp()
    os.utime(inbox / "ada.ipynb", (when, when))
    _deadlines(course, {"policy": {"percent_per_day": 10, "trust_zip_and_file_dates": True},
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
    assert _deadlines_cli(course, "show", ASSIGNMENT) == 0
    out = capsys.readouterr().out
    assert "due 2026-10-01 10:00+00:00" in out
    assert "LATE lovelaceada_12345" in out and "ok   turingalan_23456" in out
    assert "extension: turingalan_23456" in out


# Due dates, extensions, timestamps and the late policy, pinned to hand-computed values.
BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture
def ascii_locale():
    """A machine whose locale is plain C/ASCII: files must still be read as UTF-8."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    yield
    locale.setlocale(locale.LC_CTYPE, old)


def _handin(course, student, stamp=None, sidecar=None, assignment=ASSIGNMENT):
    """A hand-in in submitted/ as collect leaves it: timestamp.txt and .handin.json."""
    folder = course.submitted / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    if stamp is not None:
        (folder / "timestamp.txt").write_bytes(stamp.encode() if isinstance(stamp, str) else stamp)
    if sidecar is not None:
        (folder / ".handin.json").write_text(json.dumps(sidecar))
    return folder


# --- zones and times ------------------------------------------------------------------

def test_utc_is_the_default_zone_whatever_its_spelling():
    """A zone lookup that no longer treats None/""/"utc" as UTC crashes or misreads."""
    for name in (None, "", "UTC", "utc", "Utc"):
        assert deadlines._zone(name) is UTC, name
    assert deadlines._zone("Europe/Berlin") == BERLIN


@pytest.mark.parametrize("name", ["Mars/Olympus_Mons", "/etc/passwd"])
def test_an_unknown_timezone_is_a_deadlines_error_naming_it(name):
    """An unknown zone (or a path) must be refused with its name, not crash or pass."""
    with pytest.raises(DeadlinesError) as raised:
        deadlines._zone(name)
    assert f"unknown timezone {name!r}" in str(raised.value)
    assert "deadlines.json" in str(raised.value)


def test_parse_time_reads_a_naive_time_in_the_zone_and_keeps_an_offset():
    """A naive due date must be read in the course zone; an explicit offset must win."""
    assert parse_time(" 2026-10-01 23:59 ") == datetime(2026, 10, 1, 23, 59, tzinfo=UTC)
    assert parse_time("2026-10-01 23:59", BERLIN) == datetime(2026, 10, 1, 21, 59, tzinfo=UTC)
    assert parse_time("2026-10-01 23:59", BERLIN).tzinfo is BERLIN
    fixed = parse_time("2026-10-01T23:59:00+05:00", BERLIN)
    assert fixed.utcoffset() == timedelta(hours=5)
    with pytest.raises(DeadlinesError) as raised:
        parse_time("next friday")
    assert str(raised.value) == ("deadlines.json: 'next friday' is not an ISO date and time "
                                 "(e.g. 2026-10-01 23:59)")


# --- the policy -----------------------------------------------------------------------

def test_the_default_policy_and_overrides():
    """Defaults must be the documented ones; an override must replace only its key."""
    assert deadlines._policy(None, "policy") == deadlines.DEFAULT_POLICY
    assert deadlines._policy({}, "policy") == deadlines.DEFAULT_POLICY
    got = deadlines._policy({"percent_per_day": 0, "max_percent": 0, "grace_minutes": 0,
                             "partial_days": "exact", "lms_late_marker": "note",
                             "zero_after_days": 0}, "policy")
    assert got == {"percent_per_day": 0, "max_percent": 0, "grace_minutes": 0,
                   "partial_days": "exact", "zero_after_days": 0, "lms_late_marker": "note",
                   "trust_zip_and_file_dates": False}
    assert deadlines._policy({"percent_per_day": 12.5}, "policy")["percent_per_day"] == 12.5
    assert deadlines.DEFAULT_POLICY["percent_per_day"] == 0.0  # the default is not mutated


def test_an_unknown_policy_key_is_refused_listing_the_known_ones():
    """A typo in a key must be refused, and the message must list the real keys."""
    with pytest.raises(DeadlinesError) as raised:
        deadlines._policy({"percent_per_dya": 10}, "assignments.x.policy")
    message = str(raised.value)
    assert "assignments.x.policy has an unknown key 'percent_per_dya'" in message
    assert ("known: percent_per_day, max_percent, grace_minutes, partial_days, "
            "zero_after_days, lms_late_marker") in message


@pytest.mark.parametrize("key", ["percent_per_day", "max_percent", "grace_minutes"])
@pytest.mark.parametrize("value", [-1, -0.5, True, "10", None])
def test_numbers_of_the_policy_must_be_non_negative_numbers(key, value):
    """A negative, boolean or text percentage must be refused, naming the key."""
    with pytest.raises(DeadlinesError, match=rf"policy\.{key} must be a number >= 0"):
        deadlines._policy({key: value}, "policy")


@pytest.mark.parametrize("key,value,message", [
    ("partial_days", "round_down", "partial_days is round_up or exact"),
    ("partial_days", "ROUND_UP", "partial_days is round_up or exact"),
    ("lms_late_marker", "ignore", "lms_late_marker is minimum or note"),
    ("zero_after_days", -1, "zero_after_days must be a number"),
    ("zero_after_days", True, "zero_after_days must be a number"),
    ("zero_after_days", "7", "zero_after_days must be a number"),
])
def test_bad_policy_choices_are_refused(key, value, message):
    """A choice outside the documented ones must be refused, naming where."""
    with pytest.raises(DeadlinesError, match=f"somewhere.{message}"):
        deadlines._policy({key: value}, "somewhere")


def test_documented_policy_choices_are_accepted():
    """Every documented choice must be accepted (none refused by a wrong comparison)."""
    for partial in ("round_up", "exact"):
        assert deadlines._policy({"partial_days": partial}, "p")["partial_days"] == partial
    for marker in ("minimum", "note"):
        assert deadlines._policy({"lms_late_marker": marker}, "p")["lms_late_marker"] == marker
    for zero in (None, 0, 7, 2.5):
        assert deadlines._policy({"zero_after_days": zero}, "p")["zero_after_days"] == zero


# --- deadlines.json -------------------------------------------------------------------

def test_a_course_without_deadlines_json_has_none(course):
    """No file: no deadlines, UTC, the default policy, no due date."""
    assert load_deadlines(course) == {}
    assert course_zone(course) is UTC
    assert assignment_policy({}, ASSIGNMENT) == deadlines.DEFAULT_POLICY
    assert due_date({}, ASSIGNMENT, "ada") == (None, None)


def test_deadlines_json_is_read(course, ascii_locale):
    """The file's content must be returned as written (keys, nested objects, Unicode)."""
    data = {"timezone": "Europe/Berlin", "note": "Übung",
            "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}}
    (course.root / "deadlines.json").write_text(json.dumps(data, ensure_ascii=False),
                                                encoding="utf-8")
    assert load_deadlines(course) == data
    assert course_zone(course) == BERLIN
    assert course_zone(course, {"timezone": "Asia/Tokyo"}) == ZoneInfo("Asia/Tokyo")
    assert course_zone(course, {}) is UTC


@pytest.mark.parametrize("text,message", [
    ("{not json", "cannot be read"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"assignments": []}', "assignments must be an object"),
    ('{"extensions": "none"}', "extensions must be an object"),
    ('{"policy": 10}', "policy must be an object"),
])
def test_a_broken_deadlines_json_is_refused_saying_why(course, text, message):
    """A broken file must be refused with the reason, not half-used."""
    (course.root / "deadlines.json").write_text(text)
    with pytest.raises(DeadlinesError, match=message):
        load_deadlines(course)


def test_an_assignment_policy_overrides_the_course_policy_key_by_key():
    """The assignment's own policy wins over the course's, key by key."""
    data = {"policy": {"percent_per_day": 10, "max_percent": 50},
            "assignments": {ASSIGNMENT: {"policy": {"percent_per_day": 20}},
                            "other": None}}
    got = assignment_policy(data, ASSIGNMENT)
    assert got["percent_per_day"] == 20 and got["max_percent"] == 50
    assert assignment_policy(data, "other")["percent_per_day"] == 10
    assert assignment_policy(data, "missing")["percent_per_day"] == 10


def test_a_policy_error_names_the_assignment_or_the_course_policy():
    """The error must point at the object to fix."""
    with pytest.raises(DeadlinesError, match=r"assignments\.01_hw\.policy\.max_percent"):
        assignment_policy({"assignments": {ASSIGNMENT: {"policy": {"max_percent": -1}}}},
                          ASSIGNMENT)
    with pytest.raises(DeadlinesError, match=r": policy\.max_percent"):
        assignment_policy({"policy": {"max_percent": -1},
                           "assignments": {ASSIGNMENT: {"due": "2026-10-01"}}}, ASSIGNMENT)


# --- due dates and extensions ---------------------------------------------------------

def _data(extension=None, due="2026-10-01 12:00"):
    data = {"timezone": "Europe/Berlin", "assignments": {ASSIGNMENT: {"due": due}}}
    if extension is not None:
        data["extensions"] = {ASSIGNMENT: {"ada": extension}}
    return data


DUE = datetime(2026, 10, 1, 10, 0, tzinfo=UTC)  # 12:00 in Berlin (CEST)


def test_the_due_date_is_read_in_the_course_zone():
    """A due date without offset is in the course's zone, and no extension is reported."""
    assert due_date(_data(), ASSIGNMENT, "ada") == (DUE, None)
    assert due_date(_data(), ASSIGNMENT) == (DUE, None)
    assert due_date(_data(), "other", "ada") == (None, None)
    assert due_date({"assignments": {ASSIGNMENT: {"due": ""}}}, ASSIGNMENT) == (None, None)


@pytest.mark.parametrize("granted,expected", [
    ("2026-10-03 12:00", DUE + timedelta(days=2)),
    (2, DUE + timedelta(days=2)),
    (1.5, DUE + timedelta(days=1, hours=12)),
    ({"days": 2}, DUE + timedelta(days=2)),
    ({"hours": 5}, DUE + timedelta(hours=5)),
    ({"days": 1, "hours": 3}, DUE + timedelta(days=1, hours=3)),
    ({"days": "1"}, DUE + timedelta(days=1)),
])
def test_each_form_of_extension_moves_the_due_date(granted, expected):
    """An extension (a date, days, or days/hours) must replace the due date exactly."""
    due, extension = due_date(_data(granted), ASSIGNMENT, "ada")
    assert due == expected and extension == expected
    # Only ada has it.
    assert due_date(_data(granted), ASSIGNMENT, "ben") == (DUE, None)
    assert due_date(_data(granted), ASSIGNMENT) == (DUE, None)


def test_a_date_extension_needs_no_due_date():
    """An extension to a date stands alone; its time is read in the course zone."""
    data = _data("2026-10-03 12:00", due=None)
    assert due_date(data, ASSIGNMENT, "ada") == (DUE + timedelta(days=2),) * 2


@pytest.mark.parametrize("granted", [True, [2], None])
def test_an_unusable_extension_is_refused(granted):
    """A boolean or a list is not an extension (None: no extension at all); the message
    says what an extension can be."""
    data = _data(granted)
    if granted is None:
        assert due_date(data, ASSIGNMENT, "ada") == (DUE, None)
        return
    with pytest.raises(DeadlinesError) as raised:
        due_date(data, ASSIGNMENT, "ada")
    assert str(raised.value) == (
        'deadlines.json: extensions.01_hw.ada must be a date, a number of days, or {"days": N} '
        "(and the assignment needs a due date for the last two)")


@pytest.mark.parametrize("granted", [2, {"days": 2}])
def test_a_relative_extension_without_a_due_date_is_refused(granted):
    """Days added to no due date cannot be computed: refused, not silently ignored."""
    with pytest.raises(DeadlinesError, match="needs a due date"):
        due_date(_data(granted, due=None), ASSIGNMENT, "ada")


@pytest.mark.parametrize("granted", [{"days": "two"}, {"hours": None}, {"days": [1]}])
def test_extension_days_must_be_numbers(granted):
    with pytest.raises(DeadlinesError, match=r"extensions\.01_hw\.ada days/hours must be numbers"):
        due_date(_data(granted), ASSIGNMENT, "ada")


# --- timestamp.txt --------------------------------------------------------------------

def test_format_timestamp_is_nbgraders_format_in_utc(new_york):
    """timestamp.txt is in UTC whatever the zone of the time and of the machine."""
    when = datetime(2026, 10, 1, 12, 0, 5, 123456, tzinfo=BERLIN)
    assert format_timestamp(when) == "2026-10-01 10:00:05.123456 UTC"
    assert datetime.strptime(format_timestamp(when), deadlines.TIMESTAMP_FORMAT)


@pytest.mark.parametrize("text,expected", [
    ("2015-02-02 14:58:23.948203 America/Los_Angeles", datetime(2015, 2, 2, 22, 58, 23, 948203)),
    ("2015-02-02 14:58:23.948203 -0800", datetime(2015, 2, 2, 22, 58, 23, 948203)),
    ("2015-02-02 14:58:23 +05:30", datetime(2015, 2, 2, 9, 28, 23)),
    ("2015-02-02 14:58:23 +2", datetime(2015, 2, 2, 12, 58, 23)),
    ("2015-02-02 14:58:23 UTC", datetime(2015, 2, 2, 14, 58, 23)),
    ("2015-02-02 14:58:23 utc", datetime(2015, 2, 2, 14, 58, 23)),
    ("2015-02-02 14:58:23 Z", datetime(2015, 2, 2, 14, 58, 23)),
    ("2015-02-02 14:58:23 gmt", datetime(2015, 2, 2, 14, 58, 23)),
    ("2015-02-02 14:58:23", datetime(2015, 2, 2, 14, 58, 23)),
    ("  2015-02-02T14:58:23+01:00\n", datetime(2015, 2, 2, 13, 58, 23)),
])
def test_parse_timestamp_reads_nbgraders_forms_as_utc(new_york, text, expected):
    """Every form nbgrader writes must come back as the right UTC instant, zone UTC."""
    got = parse_timestamp(text)
    assert got == expected.replace(tzinfo=UTC)
    assert got.tzinfo is UTC and got.isoformat().endswith("+00:00")


@pytest.mark.parametrize("text", [None, "", "   ", "garbage", "2015-02-02 14:58:23 Mars/Base",
                                  "2015-02-31 10:00:00 UTC", "2015-02-02 99:00:00",
                                  "2015-02-02 14:58:23 " + "x" * 190])
def test_an_unreadable_timestamp_is_none(text):
    """No time is better than a wrong time: unreadable text gives None, never a crash."""
    assert parse_timestamp(text) is None


def test_a_timestamp_longer_than_200_characters_is_not_parsed():
    """The length cap is 200 characters, counted after stripping."""
    base = "2015-02-02  14:58:23"
    exact = base[:10] + " " * (200 - len(base) + 2) + base[12:]
    assert len(exact) == 200
    assert parse_timestamp(exact) == datetime(2015, 2, 2, 14, 58, 23, tzinfo=UTC)
    assert parse_timestamp(exact[:10] + " " + exact[10:]) is None


@pytest.mark.parametrize("text,seconds", [
    ("+0200", 7200), ("-0800", -28800), ("+05:30", 19800), ("-07:00", -25200),
    ("0930", 34200), ("+5", 18000), ("-11", -39600), ("+0045", 2700),
])
def test_utc_offsets_in_seconds(text, seconds):
    """Offsets as nbgrader and ISO write them, hand-computed."""
    assert deadlines._offset_seconds(text) == seconds


@pytest.mark.parametrize("text", ["+053", "+123456", "PST", "+", "+0a00", "X0200", "0200X"])
def test_a_malformed_offset_is_a_value_error_naming_it(text):
    with pytest.raises(ValueError) as raised:
        deadlines._offset_seconds(text)
    assert str(raised.value) == text


def test_only_single_spaces_separate_date_time_and_zone():
    """As nbgrader's parse_utc: DATE TIME ZONE split on spaces; other whitespace is
    no separator, and such a time is not guessed at."""
    assert parse_timestamp("2015-02-02\t14:58:23\tAmerica/Los_Angeles") is None
    assert parse_timestamp("2015-02-02  14:58:23 America/Los_Angeles") is None


def test_read_record_reads_the_timestamp_and_the_sidecar(course, new_york, ascii_locale):
    """The recorded time and sidecar must be read back as collect wrote them (UTF-8)."""
    folder = _handin(course, "ada", None, None)
    (folder / "timestamp.txt").write_bytes("2026-10-01 10:00:00.000000 UTC\u00a0".encode())
    (folder / ".handin.json").write_bytes('{"lms": "canvas", "lms_late": true, "from": "Zoë"}'
                                          .encode())
    when, sidecar = read_record(course, ASSIGNMENT, "ada")
    assert when == datetime(2026, 10, 1, 10, tzinfo=UTC)
    assert sidecar == {"lms": "canvas", "lms_late": True, "from": "Zoë"}
    assert read_record(course, ASSIGNMENT, "nobody") == (None, {})


def test_read_record_caps_the_timestamp_file_at_1024_bytes(course):
    """A timestamp.txt of 1024 bytes or more is not read (1023 still is)."""
    stamp = "2026-10-01 10:00:00 UTC"
    _handin(course, "ada", stamp + " " * (1023 - len(stamp)))
    assert read_record(course, ASSIGNMENT, "ada")[0] == datetime(2026, 10, 1, 10, tzinfo=UTC)
    _handin(course, "ben", stamp + " " * (1024 - len(stamp)))
    assert read_record(course, ASSIGNMENT, "ben")[0] is None


def test_read_record_survives_broken_files(course, tmp_path):
    """Undecodable bytes, bad JSON, a non-object sidecar, links: no time, no crash."""
    _handin(course, "ada", b"\xff\xfe2026-10-01 \xff", "[1, 2]")
    assert read_record(course, ASSIGNMENT, "ada") == (None, {})
    folder = _handin(course, "ben", None, None)
    (folder / ".handin.json").write_text("{broken")
    assert read_record(course, ASSIGNMENT, "ben") == (None, {})
    real = tmp_path / "real"
    real.mkdir()
    (real / "timestamp.txt").write_text("2026-10-01 10:00:00 UTC")
    (real / ".handin.json").write_text('{"lms_late": true}')
    folder = _handin(course, "cy")
    (folder / "timestamp.txt").symlink_to(real / "timestamp.txt")
    (folder / ".handin.json").symlink_to(real / ".handin.json")
    assert read_record(course, ASSIGNMENT, "cy") == (None, {})


# --- lateness and the penalty ---------------------------------------------------------

@pytest.mark.parametrize("seconds,partial,days", [
    (1, "round_up", 1), (86400, "round_up", 1), (86401, "round_up", 2),
    (86400 + 1e-6, "round_up", 1), (43200, "exact", 0.5), (129600, "exact", 1.5),
])
def test_days_late_as_the_policy_counts_them(seconds, partial, days):
    """A started day counts as a day (round_up); exact is pro rata."""
    policy = dict(deadlines.DEFAULT_POLICY, partial_days=partial)
    assert deadlines._days(seconds, policy) == pytest.approx(days)


@pytest.mark.parametrize("days,policy,expected", [
    (2, {"percent_per_day": 10}, 0.2),
    (0.5, {"percent_per_day": 10}, 0.05),
    (7, {"percent_per_day": 10, "max_percent": 50}, 0.5),
    (3, {"percent_per_day": 60, "max_percent": 200}, 1.0),
    (7, {"percent_per_day": 10, "zero_after_days": 7}, 0.7),
    (7.5, {"percent_per_day": 10, "zero_after_days": 7}, 1.0),
    (1, {"percent_per_day": 0, "zero_after_days": 0}, 1.0),
    (1, {"percent_per_day": 0}, 0.0),
])
def test_the_penalty_fraction(days, policy, expected):
    """Per day, capped, zero after N days, never beyond 0..1."""
    assert deadlines._penalty(days, dict(deadlines.DEFAULT_POLICY, **policy)) == \
        pytest.approx(expected)


@pytest.mark.parametrize("seconds,text", [
    (0, "0 min"), (59, "0 min"), (59.6, "1 min"), (61, "1 min"), (3600, "1 h"),
    (3660, "1 h 1 min"), (86400, "1 d"), (86460, "1 d 1 min"), (90061, "1 d 1 h 1 min"),
    (2 * 86400 + 7200, "2 d 2 h"),
])
def test_durations_in_notes(seconds, text):
    """How late, as the instructor reads it."""
    assert deadlines._duration(seconds) == text


def _lateness(course, student="ada"):
    return lateness(course=course, assignment=ASSIGNMENT, student=student)


def test_no_due_date_and_no_time(course):
    """Without deadlines.json or a recorded time nothing is late and the note says why."""
    _handin(course, "ada")
    info = _lateness(course)
    assert info == {"submitted_at": None, "source": None, "due": None, "late_seconds": 0.0,
                    "penalty_fraction": 0.0,
                    "note": "no due date for 01_hw in deadlines.json; no submission time recorded",
                    "late": False, "lms_late": False, "extension": None, "days_late": 0}


def test_a_time_without_a_due_date_is_neither_late_nor_on_time(course):
    _handin(course, "ada", "2026-10-01 11:59:00 UTC")
    info = _lateness(course)
    assert info["late"] is False and info["late_seconds"] == 0.0
    assert info["note"] == ("no due date for 01_hw in deadlines.json; "
                            "submitted 2026-10-01 11:59 UTC (timestamp.txt)")


def test_one_second_late_is_late(course):
    """No grace: a second late is late, and a started day counts."""
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", "2026-10-01 12:00:01 UTC")
    info = _lateness(course)
    assert info["late"] is True and info["late_seconds"] == 1.0 and info["days_late"] == 1
    assert info["penalty_fraction"] == pytest.approx(0.1)
    assert info["note"].endswith("; 0 min late; late penalty 10%")


def test_on_time_is_said_and_the_source_defaults_to_timestamp_txt(course):
    """A hand-in before the due date is on time; without a sidecar the source is the file."""
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", "2026-10-01 11:59:00 UTC")
    info = _lateness(course)
    assert info["note"] == "submitted 2026-10-01 11:59 UTC (timestamp.txt); on time"
    assert info["source"] == "timestamp.txt" and info["late"] is False
    assert info["late_seconds"] == 0.0 and info["days_late"] == 0
    assert info["submitted_at"] == "2026-10-01T11:59:00+00:00"
    assert info["due"] == "2026-10-01T12:00:00+00:00"


def test_a_sidecar_without_a_time_gives_no_source(course):
    """A source is only reported for a recorded time."""
    _handin(course, "ada", None, {"timestamp_source": "zip member date"})
    info = _lateness(course)
    assert info["source"] is None and info["submitted_at"] is None


def test_late_within_grace_costs_nothing_and_says_so(course):
    """A hand-in within the grace minutes is on time for the penalty."""
    _deadlines(course, {"policy": {"percent_per_day": 10, "grace_minutes": 15,
                                   "trust_zip_and_file_dates": True},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", "2026-10-01 12:15:00 UTC", {"timestamp_source": "zip member date"})
    info = _lateness(course)
    assert info["penalty_fraction"] == 0.0 and info["late"] is False
    assert info["late_seconds"] == 900.0 and info["days_late"] == 0
    assert info["note"] == ("submitted 2026-10-01 12:15 UTC (zip member date); "
                            "15 min late, within the grace period")
    _handin(course, "ben", "2026-10-01 12:15:01 UTC")
    ben = _lateness(course, "ben")
    assert ben["late"] is True and ben["penalty_fraction"] == pytest.approx(0.1)
    assert ben["days_late"] == 1
    assert ben["note"].endswith("; 15 min late; late penalty 10%")


def test_late_with_an_extension_and_no_penalty_policy(course):
    """Late but no policy: reported late, said to be not penalised; extension named."""
    _deadlines(course, {"assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}},
                        "extensions": {ASSIGNMENT: {"ada": {"days": 1}}}})
    _handin(course, "ada", "2026-10-02 14:30:00 UTC")
    info = _lateness(course)
    assert info["late"] is True and info["penalty_fraction"] == 0.0
    assert info["late_seconds"] == 2.5 * 3600 and info["days_late"] == 1
    assert info["extension"] == "2026-10-02T12:00:00+00:00"
    assert info["note"] == ("submitted 2026-10-02 14:30 UTC (timestamp.txt); extension to "
                            "2026-10-02 12:00+00:00; 2 h 30 min late; "
                            "no late policy set: not penalised")


@pytest.mark.parametrize("lms,name", [("canvas", "Canvas"), ("moodle", "Moodle"),
                                      (None, "the LMS")])
def test_the_lms_marker_alone_costs_one_day(course, lms, name):
    """An LMS late marker on a hand-in without a submission time counts one day
    (lms_late_marker minimum)."""
    _deadlines(course, {"policy": {"percent_per_day": 25},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", None, {"lms": lms, "lms_late": True})
    info = _lateness(course)
    assert info["late"] is True and info["lms_late"] is True
    assert info["penalty_fraction"] == pytest.approx(0.25) and info["days_late"] == 1
    assert info["note"] == (f"no submission time recorded; {name} marked it late; no "
                            "submission time, so one day counts; late penalty 25%")


def test_the_lms_marker_without_any_time_or_due_date_still_counts(course):
    """No time, no due date, but the LMS says late: one day counts."""
    _deadlines(course, {"policy": {"percent_per_day": 10}})
    _handin(course, "ada", None, {"lms": "canvas", "lms_late": True})
    info = _lateness(course)
    assert info["penalty_fraction"] == pytest.approx(0.1) and info["late"] is True
    assert info["days_late"] == 1


def test_the_lms_marker_keeps_a_larger_penalty(course):
    """The LMS marker must never lower a penalty from the recorded time."""
    _deadlines(course, {"policy": {"percent_per_day": 10, "grace_minutes": 60},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", "2026-10-04 11:00:00 UTC", {"lms": "canvas", "lms_late": True})
    info = _lateness(course)
    assert info["penalty_fraction"] == pytest.approx(0.3) and info["days_late"] == 3
    assert info["note"].endswith("; 2 d 23 h late; Canvas marked it late too; late penalty 30%")


def test_the_grace_period_wins_over_the_lms_marker(course):
    """11 minutes late with 15 minutes' grace: on time, though Canvas marked it late
    (Canvas knows no grace period); the submission time decides."""
    _deadlines(course, {"policy": {"percent_per_day": 10, "grace_minutes": 15},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", "2026-10-01 12:11:00 UTC", {"lms": "canvas", "lms_late": True})
    info = _lateness(course)
    assert info["penalty_fraction"] == 0.0 and info["days_late"] == 0
    assert info["late"] is False
    assert info["note"] == ("submitted 2026-10-01 12:11 UTC (timestamp.txt); 11 min late, "
                            "within the grace period; Canvas marked it late; the submission "
                            "time decides")


def test_the_lms_marker_is_forgiven_by_an_extension(course):
    """Late for the LMS, on time with the extension: not penalised."""
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}},
                        "extensions": {ASSIGNMENT: {"ada": "2026-10-03 12:00"}}})
    _handin(course, "ada", "2026-10-02 12:00:00 UTC", {"lms": "moodle", "lms_late": True})
    info = _lateness(course)
    assert info["penalty_fraction"] == 0.0 and info["days_late"] == 0
    assert info["late"] is False  # the time and the extension decide
    assert info["note"] == ("submitted 2026-10-02 12:00 UTC (timestamp.txt); extension to "
                            "2026-10-03 12:00+00:00; on time; Moodle marked it late; on time "
                            "with the extension")
    # An extension but no recorded time: the marker counts.
    _handin(course, "ben", None, {"lms": "moodle", "lms_late": True})
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}},
                        "extensions": {ASSIGNMENT: {"ben": "2026-10-03 12:00"}}})
    assert _lateness(course, "ben")["penalty_fraction"] == pytest.approx(0.1)


def test_the_lms_marker_as_a_note_only(course):
    """lms_late_marker note: reported, not penalised, and the note says why."""
    _deadlines(course, {"policy": {"percent_per_day": 10, "lms_late_marker": "note"},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}}})
    _handin(course, "ada", None, {"lms": "canvas", "lms_late": True})
    info = _lateness(course)
    assert info["penalty_fraction"] == 0.0 and info["days_late"] == 0 and info["late"] is True
    assert info["note"].endswith(
        "; Canvas marked it late (not penalised: lms_late_marker is note)")


def test_the_assignments_own_policy_is_applied(course):
    """An assignment's policy overrides the course's in lateness and in `deadlines show`."""
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00",
                                                     "policy": {"percent_per_day": 30}}}})
    _handin(course, "ada", "2026-10-02 12:00:00 UTC")
    assert _lateness(course)["penalty_fraction"] == pytest.approx(0.3)
    assert show_lines(course, ASSIGNMENT)[1].startswith("policy: percent_per_day 30,")


def test_apply_late_policy():
    """The penalty takes a fraction of the earned score, clamped to 0..1."""
    assert apply_late_policy(8.0, {"penalty_fraction": 0.25}) == 6.0
    assert apply_late_policy(8, {"penalty_fraction": 1.5}) == 0.0
    assert apply_late_policy(8, {"penalty_fraction": -0.5}) == 8.0
    assert apply_late_policy(8, {"penalty_fraction": None}) == 8.0
    assert apply_late_policy(1.0, {"penalty_fraction": 1 / 3}) == 0.666667
    assert apply_late_policy(None, {"penalty_fraction": 0.5}) is None
    assert apply_late_policy(8.0, None) == 8.0 and apply_late_policy(8.0, {}) == 8.0


def test_show_lines(course):
    """`deadlines show`: the due date, the policy, extensions and each hand-in."""
    _deadlines(course, {"policy": {"percent_per_day": 10},
                        "assignments": {ASSIGNMENT: {"due": "2026-10-01 12:00"}},
                        "extensions": {ASSIGNMENT: {"ben": "2026-10-05 12:00",
                                                    "ada": {"days": 1}}}})
    _handin(course, "ada", "2026-10-03 12:00:00 UTC")
    _handin(course, "ben", "2026-10-03 12:00:00 UTC")
    assert show_lines(course, ASSIGNMENT) == [
        "01_hw: due 2026-10-01 12:00+00:00",
        "policy: percent_per_day 10, max_percent 100.0, grace_minutes 0.0, "
        "partial_days round_up, lms_late_marker minimum, trust_zip_and_file_dates False",
        "extension: ada -> {'days': 1}",
        "extension: ben -> 2026-10-05 12:00",
        "  LATE ada: submitted 2026-10-03 12:00 UTC (timestamp.txt); extension to "
        "2026-10-02 12:00+00:00; 1 d late; late penalty 10%",
        "  ok   ben: submitted 2026-10-03 12:00 UTC (timestamp.txt); extension to "
        "2026-10-05 12:00+00:00; on time",
    ]


def test_show_lines_without_anything(course):
    assert show_lines(course, ASSIGNMENT) == [
        "01_hw: due (not set)",
        "policy: percent_per_day 0.0, max_percent 100.0, grace_minutes 0.0, "
        "partial_days round_up, lms_late_marker minimum, trust_zip_and_file_dates False",
        "no hand-ins in submitted/ yet"]
