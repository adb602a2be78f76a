"""Due dates, extensions and the late policy: one course file, `deadlines.json`.

deadlines.json, at the course root (every key optional):

  {
    "timezone": "Europe/Berlin",          # for times written without an offset, and
                                          # for zip members' dates (zips carry no zone);
                                          # default UTC
    "policy": {                           # the late policy for every assignment
      "percent_per_day": 10,              # of the earned score, per day late (default 0:
                                          # lateness is reported, never penalised)
      "max_percent": 50,                  # the cap (default 100)
      "grace_minutes": 15,                # this late counts as on time (default 0)
      "partial_days": "round_up",         # "round_up": a started day counts as a day;
                                          # "exact": pro rata (default round_up)
      "zero_after_days": 7,               # later than this scores 0 (default: never)
      "lms_late_marker": "minimum",       # an LMS "late" marker (Canvas's _late/_LATE_)
                                          # on a hand-in whose time is unknown costs one
                                          # day ("minimum", default) or is only noted ("note")
      "trust_zip_and_file_dates": false   # take a zip member's date or a file's
                                          # modification time as the submission time
                                          # (default false: they are not, see below)
    },
    "assignments": {
      "01_the_recipe": {"due": "2026-10-01 23:59",
                        "policy": {"percent_per_day": 20}}   # overrides, key by key
    },
    "extensions": {                       # per assignment, per student id (the roster's)
      "01_the_recipe": {"12345": "2026-10-03 23:59",        # a new due date, or
                        "23456": {"days": 2, "hours": 0}}    # time added to the due date
    }
  }

Times are ISO 8601 ("2026-10-01 23:59", "2026-10-01T23:59:00+02:00").

When a hand-in was submitted: collect records it in submitted/<student>/<assignment>/
timestamp.txt (nbgrader's format, `%Y-%m-%d %H:%M:%S.%f %Z`), taken from nbgrader's own
timestamp.txt, else the zip member's date, else the file's modification time (the last
resort), and says which in the sidecar `.handin.json` beside it, with any LMS late marker.

An LMS's own record of submission times can be imported per assignment (`deadlines
times ASSIGNMENT FILE`, into submission_times/<assignment>.json): Canvas's "List
assignment submissions" API answer (a JSON array of Submission objects, each with
user_id and submitted_at), or any CSV with the columns id and submitted_at (id: the
roster's student id or LMS user id). nbgrader's timestamp comes first, then the LMS's
time, then the LMS late marker.

Only nbgrader's timestamp and the LMS's own record are submission times. A zip
member's date is when the zip was built (Canvas writes the download's time:
instructure/canvas-lms#2219), and a file's modification time is whatever the student's
or the instructor's machine left; neither is used unless the policy says
trust_zip_and_file_dates. A hand-in without a submission time is "on time, time
unknown", or, with an LMS late marker, late by the lms_late_marker rule. With a time,
the time decides, grace period included, and an LMS marker is only noted.
"""

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DEADLINES_FILE = "deadlines.json"
TIMESTAMP_FILE = "timestamp.txt"
SIDECAR_FILE = ".handin.json"
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"

DEFAULT_POLICY = {"percent_per_day": 0.0, "max_percent": 100.0, "grace_minutes": 0.0,
                  "partial_days": "round_up", "zero_after_days": None,
                  "lms_late_marker": "minimum", "trust_zip_and_file_dates": False}
# Where a recorded time came from, when it is not a submission time (see above).
UNTRUSTED_SOURCES = ("zip member date", "file modification time")
_DAY = 86400.0


class DeadlinesError(ValueError):
    """deadlines.json cannot be used; the message says where and why."""


def deadlines_path(course):
    return Path(course.root) / DEADLINES_FILE


def _zone(name):
    if not name or name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise DeadlinesError(f"{DEADLINES_FILE}: unknown timezone {name!r}") from None


def parse_time(text, zone=UTC):
    """An aware datetime from ISO text; a time without an offset is read in `zone`."""
    try:
        when = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise DeadlinesError(f"{DEADLINES_FILE}: {text!r} is not an ISO date and time "
                             "(e.g. 2026-10-01 23:59)") from None
    return when.replace(tzinfo=zone) if when.tzinfo is None else when


def _policy(raw, where):
    policy = dict(DEFAULT_POLICY)
    for key, value in (raw or {}).items():
        if key not in DEFAULT_POLICY:
            raise DeadlinesError(f"{DEADLINES_FILE}: {where} has an unknown key {key!r} "
                                 f"(known: {', '.join(DEFAULT_POLICY)})")
        policy[key] = value
    for key in ("percent_per_day", "max_percent", "grace_minutes"):
        value = policy[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise DeadlinesError(f"{DEADLINES_FILE}: {where}.{key} must be a number >= 0")
    if policy["partial_days"] not in ("round_up", "exact"):
        raise DeadlinesError(f"{DEADLINES_FILE}: {where}.partial_days is round_up or exact")
    if policy["lms_late_marker"] not in ("minimum", "note"):
        raise DeadlinesError(f"{DEADLINES_FILE}: {where}.lms_late_marker is minimum or note")
    if not isinstance(policy["trust_zip_and_file_dates"], bool):
        raise DeadlinesError(f"{DEADLINES_FILE}: {where}.trust_zip_and_file_dates is true "
                             "or false")
    zero = policy["zero_after_days"]
    if zero is not None and (isinstance(zero, bool) or not isinstance(zero, int | float)
                             or zero < 0):
        raise DeadlinesError(f"{DEADLINES_FILE}: {where}.zero_after_days must be a number")
    return policy


def load_deadlines(course):
    """deadlines.json as a dict (empty when the course has none), checked."""
    path = deadlines_path(course)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise DeadlinesError(f"{path} cannot be read: {e}") from None
    if not isinstance(data, dict):
        raise DeadlinesError(f"{path} must hold a JSON object")
    for key in ("assignments", "extensions", "policy"):
        if not isinstance(data.get(key, {}), dict):
            raise DeadlinesError(f"{DEADLINES_FILE}: {key} must be an object")
    return data


def course_zone(course, data=None):
    data = load_deadlines(course) if data is None else data
    return _zone(data.get("timezone"))


def assignment_policy(data, assignment):
    settings = data.get("assignments", {}).get(assignment) or {}
    merged = {**(data.get("policy") or {}), **(settings.get("policy") or {})}
    return _policy(merged, f"assignments.{assignment}.policy" if settings.get("policy")
                   else "policy")


def due_date(data, assignment, student=None):
    """(due, extension): aware datetimes or None, the extension already applied to due."""
    zone = _zone(data.get("timezone"))
    settings = data.get("assignments", {}).get(assignment) or {}
    due = parse_time(settings["due"], zone) if settings.get("due") else None
    extension = None
    granted = (data.get("extensions", {}).get(assignment) or {}).get(student) \
        if student is not None else None
    if granted is not None:
        if isinstance(granted, str):
            extension = parse_time(granted, zone)
        elif isinstance(granted, int | float) and not isinstance(granted, bool) and due:
            extension = due + timedelta(days=granted)
        elif isinstance(granted, dict) and due:
            try:
                extension = due + timedelta(days=float(granted.get("days", 0)),
                                            hours=float(granted.get("hours", 0)))
            except (TypeError, ValueError):
                raise DeadlinesError(f"{DEADLINES_FILE}: extensions.{assignment}.{student} "
                                     "days/hours must be numbers") from None
        else:
            raise DeadlinesError(f"{DEADLINES_FILE}: extensions.{assignment}.{student} must "
                                 "be a date, a number of days, or {\"days\": N} (and the "
                                 "assignment needs a due date for the last two)")
    return (extension or due), extension


# What collect recorded.

def format_timestamp(when):
    """nbgrader's timestamp.txt text for an aware datetime, written in UTC."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") + " UTC"


def parse_timestamp(text):
    """An aware UTC datetime from nbgrader's timestamp.txt text, or None.

    Reads it as nbgrader's parse_utc does: "DATE TIME ZONE", ZONE a name or an offset;
    a time with no zone is UTC.
    """
    from dateutil import parser, tz

    text = (text or "").strip()
    if not text or len(text) > 200:
        return None
    try:
        parts = text.split(" ")
        if len(parts) == 3:
            zone_text = parts[2]
            try:
                zone = tz.tzoffset(None, _offset_seconds(zone_text))
            except ValueError:
                zone = tz.UTC if zone_text.upper() in ("UTC", "Z", "GMT") else tz.gettz(zone_text)
            if zone is None:
                return None
            when = parser.parse(" ".join(parts[:2])).replace(tzinfo=zone)
        else:
            when = parser.parse(text)
    except (ValueError, OverflowError, TypeError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC)


def _offset_seconds(text):
    """Seconds east of UTC from "+0200", "-07:00" or an integer; ValueError otherwise."""
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-").replace(":", "")
    if not digits.isdigit() or len(digits) not in (1, 2, 4):
        raise ValueError(text)
    hours, minutes = (int(digits[:-2] or 0), int(digits[-2:])) if len(digits) == 4 \
        else (int(digits), 0)
    return sign * (hours * 3600 + minutes * 60)


def read_record(course, assignment, student):
    """(submitted_at or None, sidecar dict) for a hand-in in submitted/."""
    folder = Path(course.submitted) / student / assignment
    when, sidecar = None, {}
    stamp = folder / TIMESTAMP_FILE
    if stamp.is_file() and not stamp.is_symlink() and stamp.stat().st_size < 1024:
        when = parse_timestamp(stamp.read_text(encoding="utf-8", errors="replace"))
    side = folder / SIDECAR_FILE
    if side.is_file() and not side.is_symlink():
        try:
            sidecar = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            sidecar = {}
        if not isinstance(sidecar, dict):
            sidecar = {}
    return when, sidecar


# Submission times from the LMS.

SUBMISSION_TIMES_DIR = "submission_times"


def submission_times_path(course, assignment):
    return Path(course.root) / SUBMISSION_TIMES_DIR / f"{assignment}.json"


def _lms_rows(text):
    """[(line, id, submitted_at text or None)] from Canvas's API JSON or an id,submitted_at
    CSV, and the name of that source."""
    import csv

    stripped = text.lstrip("\ufeff").strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError as e:
            raise DeadlinesError(f"not a JSON array of Canvas submissions: {e}") from None
        if not all(isinstance(item, dict) and "user_id" in item for item in items):
            raise DeadlinesError("a JSON file must be Canvas's list of submissions: "
                                 "objects with user_id and submitted_at")
        return [(n, str(item["user_id"]), item.get("submitted_at"))
                for n, item in enumerate(items, 1)], "Canvas submission time"
    rows = list(csv.reader(stripped.splitlines()))
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "id" not in header or "submitted_at" not in header:
        raise DeadlinesError("a CSV of submission times needs the columns id and "
                             f"submitted_at (found: {', '.join(header) or 'nothing'})")
    at, when = header.index("id"), header.index("submitted_at")
    return [(n, row[at].strip(), row[when].strip() or None)
            for n, row in enumerate(rows[1:], 2) if len(row) > max(at, when)
            and row[at].strip()], "LMS submission time"


def import_submission_times(*, course, assignment, path):
    """Read an LMS's submission times for `assignment` (see the module's docstring) into
    submission_times/<assignment>.json, each id matched to a roster student (by id, then
    by LMS user id); returns (how many were imported, [lines about the rest])."""
    from autograder.term.roster import load_roster, write_json_atomically

    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DeadlinesError(f"{path} cannot be read: {e}") from None
    rows, source = _lms_rows(text)
    roster = load_roster(course)
    zone = course_zone(course)
    times, left = {}, []
    for line, ident, when_text in rows:
        entry = roster and (roster.get(ident) or roster.match(name="", uid=ident)[0])
        student = entry["id"] if entry else (ident if roster is None else None)
        if student is None:  # said even without a time: a roster of another section?
            left.append(f"entry {line}: {ident} is not in the roster (by id or LMS user id)"
                        + ("; it has no submission time either" if when_text is None else ""))
            continue
        if when_text is None:
            continue  # not submitted: Canvas lists every student
        try:
            when = parse_time(str(when_text).replace("Z", "+00:00"), zone)
        except DeadlinesError:
            left.append(f"entry {line}: {when_text!r} is not an ISO date and time")
            continue
        times[student] = when.astimezone(UTC).isoformat()
    untimed = [s for s in course.students(assignment) if s not in times]
    if untimed:
        left.append(f"handed in, but without a time in {Path(path).name} (lateness falls back "
                    f"to the LMS's late marker): {', '.join(untimed)}")
    target = submission_times_path(course, assignment)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(target, {"source": source, "file": Path(path).name, "times": times})
    return len(times), left


def lms_submission_time(course, assignment, student):
    """(the LMS's submission time of `student`'s hand-in, its source), or (None, None)."""
    path = submission_times_path(course, assignment)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        when = data["times"].get(student)
        return (datetime.fromisoformat(when), data["source"]) if when else (None, None)
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DeadlinesError(f"{path} cannot be read: {e}; import it again") from None


# Lateness and the penalty.

def _iso(when):
    return when.isoformat() if when else None


def _days(seconds, policy):
    days = seconds / _DAY
    return math.ceil(days - 1e-9) if policy["partial_days"] == "round_up" else days


def _penalty(days, policy):
    percent = min(days * float(policy["percent_per_day"]), float(policy["max_percent"]))
    if policy["zero_after_days"] is not None and days > float(policy["zero_after_days"]):
        percent = 100.0
    return max(0.0, min(1.0, percent / 100.0))


def _duration(seconds):
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    parts = [f"{days} d"] if days else []
    if hours:
        parts.append(f"{hours} h")
    if minutes or not parts:
        parts.append(f"{minutes} min")
    return " ".join(parts)


def lateness(*, course, assignment, student):
    """How late `student`'s hand-in of `assignment` was, and what it costs.

    Keys: submitted_at (ISO or None), source (where the time came from, or None), due
    (ISO, the extension applied, or None), late_seconds (>= 0), penalty_fraction (0..1),
    note (one line for people); also late (bool), lms_late (the LMS's marker), extension
    (ISO or None) and days_late (as the policy counts them).
    """
    data = load_deadlines(course)
    policy = assignment_policy(data, assignment)
    due, extension = due_date(data, assignment, student)
    submitted_at, sidecar = read_record(course, assignment, student)
    source = sidecar.get("timestamp_source") or (TIMESTAMP_FILE if submitted_at else None)
    if submitted_at is None:
        source = None
    distrusted = None
    if (submitted_at is not None and str(source).startswith(UNTRUSTED_SOURCES)
            and not policy["trust_zip_and_file_dates"]):
        distrusted = f"{source} {submitted_at.strftime('%Y-%m-%d %H:%M UTC')}"
        submitted_at = source = None
    if submitted_at is None or str(source).startswith(UNTRUSTED_SOURCES):
        from_lms, lms_source = lms_submission_time(course, assignment, student)
        if from_lms is not None:
            submitted_at, source, distrusted = from_lms, lms_source, None
    lms = {"canvas": "Canvas", "moodle": "Moodle"}.get(sidecar.get("lms"), "the LMS")
    lms_late = bool(sidecar.get("lms_late"))
    late_seconds = max(0.0, (submitted_at - due).total_seconds()) \
        if (submitted_at and due) else 0.0
    grace = float(policy["grace_minutes"]) * 60
    days, penalty, notes = 0, 0.0, []
    if due is None:
        notes.append(f"no due date for {assignment} in {DEADLINES_FILE}")
    if distrusted:
        notes.append(f"submission time unknown (the {distrusted} is not a submission time; "
                     "trust_zip_and_file_dates would use it)")
    elif submitted_at is None:
        notes.append("no submission time recorded")
    else:
        notes.append(f"submitted {submitted_at.strftime('%Y-%m-%d %H:%M UTC')} ({source})")
    if extension:
        notes.append(f"extension to {extension.isoformat(' ', 'minutes')}")
    if late_seconds > 0:
        if late_seconds <= grace:
            notes.append(f"{_duration(late_seconds)} late, within the grace period")
        else:
            days = _days(late_seconds, policy)
            penalty = _penalty(days, policy)
            notes.append(f"{_duration(late_seconds)} late")
    elif due and submitted_at:
        notes.append("on time")
    elif due and not lms_late:
        notes.append("on time, time unknown")
    if lms_late:
        if late_seconds > grace:
            notes.append(f"{lms} marked it late too")
        elif extension and submitted_at:
            notes.append(f"{lms} marked it late; on time with the extension")
        elif submitted_at and due:
            notes.append(f"{lms} marked it late; the submission time decides")
        elif policy["lms_late_marker"] == "minimum":
            days = 1
            penalty = max(penalty, _penalty(1, policy))
            notes.append(f"{lms} marked it late; no submission time, so one day counts")
        else:
            notes.append(f"{lms} marked it late (not penalised: lms_late_marker is note)")
    late = penalty > 0 or late_seconds > grace or (lms_late and not (submitted_at and due))
    if penalty > 0:
        notes.append(f"late penalty {penalty * 100:g}%")
    elif late and float(policy["percent_per_day"]) == 0:
        notes.append("no late policy set: not penalised")
    return {"submitted_at": _iso(submitted_at), "source": source, "due": _iso(due),
            "late_seconds": late_seconds, "penalty_fraction": penalty,
            "note": "; ".join(notes), "late": late, "lms_late": lms_late,
            "extension": _iso(extension), "days_late": days}


def apply_late_policy(score, lateness):
    """`score` less its late penalty (a fraction of the earned score)."""
    if score is None or not lateness:
        return score
    fraction = min(1.0, max(0.0, float(lateness.get("penalty_fraction") or 0.0)))
    return round(float(score) * (1.0 - fraction), 6)


def show_lines(course, assignment):
    """Lines for `deadlines show ASSIGNMENT`: due date, policy, each hand-in's lateness."""
    data = load_deadlines(course)
    policy = assignment_policy(data, assignment)
    due, _ = due_date(data, assignment)
    lines = [f"{assignment}: due {due.isoformat(' ', 'minutes') if due else '(not set)'}",
             "policy: " + ", ".join(f"{k} {v}" for k, v in policy.items() if v is not None)]
    extensions = data.get("extensions", {}).get(assignment) or {}
    for student, granted in sorted(extensions.items()):
        lines.append(f"extension: {student} -> {granted}")
    students = course.students(assignment)
    if not students:
        lines.append("no hand-ins in submitted/ yet")
    for student in students:
        info = lateness(course=course, assignment=assignment, student=student)
        mark = "LATE" if info["late"] else "ok  "
        lines.append(f"  {mark} {student}: {info['note']}")
    return lines
