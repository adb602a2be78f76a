"""The class list: who is who, in one id style for the whole class.

`python -m autograder roster import FILE` reads the class list an LMS exports and
writes `roster.json` at the course root (atomically). Accepted CSV files:

  Canvas gradebook export   columns Student ("Last, First"), ID (Canvas user id),
                            SIS User ID, SIS Login ID, Section, ...; the "Points Possible"
                            row is skipped. id = Canvas user id.
  Moodle grading worksheet  columns Identifier ("Participant 4711"), Full name,
                            Email address, ... id = the participant id, the number in
                            Moodle's download file names.
  Moodle participants       columns First name, Last name (or Surname), Email address,
                            ID number / Username. id = ID number, else Username, else
                            the e-mail address; hand-ins are then matched by name.
  plain                     columns name, id, email (a header row, or none). An id
                            that is a number is taken for an LMS user id too: put
                            Canvas's user ids there to match Canvas file names by id.

roster.json:
  {"format": "autograder-roster", "version": 1, "source": "canvas|moodle|plain",
   "imported_from": "FILE", "imported_at": "ISO time",
   "students": [{"id": "12345", "name": "Smith, John", "lms_id": "12345",
                 "email": "js@example.edu"}, ...]}

`id` is the student's folder name in submitted/ and everywhere after. With a roster,
collect matches each hand-in to a roster id: by LMS user id first (Canvas's
`lastfirst_12345_...`, Moodle's `Name_4711_assignsubmission_file_...`), then by the
roster id itself (`<id>.ipynb`, `<id>/`), then by name. A hand-in whose LMS id is not in
a roster of the same LMS, or whose name matches no one or several people (or only
someone with another LMS id), is listed and not collected: two different John Smiths
are never merged. Re-importing replaces roster.json; hand-ins already in submitted/ stay.
"""

import csv
import io
import json
import os
import re
import tempfile
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROSTER_FILE = "roster.json"
MAX_ROSTER_BYTES = 32 * 1024 * 1024
MAX_ID = 64


class RosterError(ValueError):
    """A class list that cannot be imported; the message says why and what to fix."""


def roster_path(course):
    return Path(course.root) / ROSTER_FILE


def safe_id(text):
    """A student id fit for a folder name: letters, digits, `_`, `.` and `-`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(text).strip()).strip("._")


def name_tokens(name):
    """Lower-case letter/digit runs of a name, in any script, accents dropped:
    "Zoë O'Brien" -> zoe o brien, "王 小明" -> 王 小明."""
    plain = unicodedata.normalize("NFKD", str(name))
    plain = "".join(c for c in plain if not unicodedata.combining(c)).casefold()
    return re.findall(r"[^\W_]+", plain)


def name_keys(name):
    """The forms a name can take in LMS file names: its words joined in order, in
    every rotation (a family name of several words first: "Seán O'Brien" -> obriensean,
    as Canvas writes "O'Brien, Seán"), reversed, and sorted."""
    tokens = name_tokens(name)
    if not tokens:
        return set()
    rotations = {"".join(tokens[i:] + tokens[:i]) for i in range(len(tokens))}
    return rotations | {"".join(reversed(tokens)), " ".join(sorted(tokens))}


# Reading the CSV.

def _norm(header):
    return re.sub(r"\s+", " ", (header or "").strip().casefold())


def _read_text(csv_path):
    path = Path(csv_path)
    if not path.is_file():
        raise RosterError(f"{path} is not a file")
    if path.stat().st_size > MAX_ROSTER_BYTES:
        raise RosterError(f"{path.name} is larger than {MAX_ROSTER_BYTES // (1024 * 1024)} MiB")
    data = path.read_bytes()
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return data.decode(encoding)
        except UnicodeDecodeError:
            continue
    return data.decode("latin-1")


def _rows(text):
    first = text.splitlines()[0] if text.strip() else ""
    delimiter = max(",;\t", key=first.count) if first else ","
    return [row for row in csv.reader(io.StringIO(text), delimiter=delimiter)
            if any(cell.strip() for cell in row)]


def _column(header, *names):
    for name in names:
        if name in header:
            return header.index(name)
    return None


def _cell(row, index):
    if index is None or index >= len(row):
        return ""
    return row[index].strip()


def _canvas(header, rows, skipped):
    name_i, id_i = _column(header, "student"), _column(header, "id")
    login_i, email_i = _column(header, "sis login id"), _column(header, "email")
    sis_i, section_i = _column(header, "sis user id"), _column(header, "section")
    people = []
    for number, row in rows:
        name, uid = _cell(row, name_i), _cell(row, id_i)
        if name.casefold().endswith("points possible") or not (name or uid):
            continue
        if name.casefold() in ("student, test", "test student"):
            skipped.append(f"row {number}: Canvas's test student")
            continue
        if not uid.isdigit():
            skipped.append(f"row {number}: no Canvas user id")
            continue
        email = _cell(row, email_i) or _cell(row, login_i)
        people.append({"id": uid, "name": name, "lms_id": uid,
                       "email": email if "@" in email else "",
                       "sis_user_id": _cell(row, sis_i), "sis_login_id": _cell(row, login_i),
                       "section": _cell(row, section_i)})
    return people


_CANVAS_ASSIGNMENT = re.compile(r"^(?P<name>.*\S)\s*\((?P<id>\d+)\)$")


def canvas_assignments(header):
    """[{"name", "id"}] of a Canvas gradebook export's assignment columns, which Canvas
    heads `Assignment Name (assignment id)` and matches on import by that id."""
    found = []
    for column in header:
        match = _CANVAS_ASSIGNMENT.match(column.strip())
        if match:
            found.append({"name": match.group("name"), "id": match.group("id")})
    return found


def _moodle(header, rows, skipped):
    ident_i = _column(header, "identifier")
    full_i = _column(header, "full name")
    first_i = _column(header, "first name")
    last_i = _column(header, "last name", "surname")
    email_i = _column(header, "email address", "email")
    idnum_i = _column(header, "id number")
    user_i = _column(header, "username")
    people = []
    for number, row in rows:
        name = _cell(row, full_i) or " ".join(
            part for part in (_cell(row, first_i), _cell(row, last_i)) if part)
        email = _cell(row, email_i)
        participant = re.sub(r"\D", "", _cell(row, ident_i))
        if ident_i is not None:
            uid, lms_id = participant, participant or None
        else:
            uid, lms_id = _cell(row, idnum_i) or _cell(row, user_i) or email, None
        if not uid:
            skipped.append(f"row {number}: no participant id, ID number, username or e-mail")
            continue
        people.append({"id": uid, "name": name, "lms_id": lms_id, "email": email,
                       "id_number": _cell(row, idnum_i)})
    return people


def _plain(header, rows, skipped):
    name_i = _column(header, "name", "full name", "student", "student name")
    id_i = _column(header, "id", "user id", "student id", "lms id", "lms user id")
    email_i = _column(header, "email", "e-mail", "email address")
    people = []
    for number, row in rows:
        uid = _cell(row, id_i)
        if not uid:
            skipped.append(f"row {number}: no id")
            continue
        # A number is taken for an LMS user id (matched against file names' ids).
        people.append({"id": uid, "name": _cell(row, name_i),
                       "lms_id": uid if uid.isdigit() else None, "email": _cell(row, email_i)})
    return people


def _parse(text):
    """(source, people, skipped, Canvas assignment columns) from the CSV text."""
    rows = _rows(text)
    if not rows:
        raise RosterError("the file holds no rows")
    header = [_norm(h) for h in rows[0]]
    numbered = [(number, row) for number, row in enumerate(rows[1:], start=2)]
    skipped = []
    if {"student", "id"} <= set(header) and (
            {"sis user id", "sis login id", "section"} & set(header)):
        return ("canvas", _canvas(header, numbered, skipped), skipped,
                canvas_assignments(rows[0]))
    if "identifier" in header and "full name" in header:
        return "moodle", _moodle(header, numbered, skipped), skipped, []
    if "first name" in header and ({"last name", "surname"} & set(header)):
        return "moodle", _moodle(header, numbered, skipped), skipped, []
    if _column(header, "id", "user id", "student id", "lms id", "lms user id") is not None:
        return "plain", _plain(header, numbered, skipped), skipped, []
    if all(2 <= len(row) <= 3 for row in rows):
        plain_header = ["name", "id", "email"]
        return ("plain", _plain(plain_header, list(enumerate(rows, start=1)), skipped),
                skipped, [])
    raise RosterError(
        "unrecognised columns: expected Canvas's gradebook export (Student, ID, SIS User ID, "
        "...), Moodle's participants (First name, Last name, Email address, ...) or grading "
        "worksheet (Identifier, Full name, Email address, ...), or name,id,email")


# kept for the LMS's import files: Canvas's SIS columns, Moodle's user ID number
_LMS_FIELDS = ("sis_user_id", "sis_login_id", "section", "id_number")


def _checked(people):
    """People with safe, unique ids; RosterError lists every clash."""
    seen, problems, out = {}, [], []
    for person in people:
        sid = safe_id(person["id"])
        if not sid or len(sid) > MAX_ID:
            problems.append(f"{person['name'] or '?'}: id {person['id']!r} is not usable")
            continue
        fold = sid.casefold()
        if fold in seen:
            other = seen[fold]
            if name_tokens(other["name"]) == name_tokens(person["name"]):
                continue  # the same person listed twice
            problems.append(f"id {sid} is given to both {other['name']!r} and "
                            f"{person['name']!r}")
            continue
        entry = {"id": sid, "name": person["name"], "lms_id": person["lms_id"] or None,
                 "email": person["email"]}
        entry.update({key: person[key] for key in _LMS_FIELDS if person.get(key)})
        seen[fold] = entry
        out.append(entry)
    if problems:
        raise RosterError("; ".join(problems[:10]) + (
            f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""))
    if not out:
        raise RosterError("the file lists no students")
    return out


def write_json_atomically(path, data):
    path = Path(path)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
            f.write("\n")
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(scratch, 0o666 & ~mask)
        os.replace(scratch, path)
    finally:
        if os.path.lexists(scratch):
            os.unlink(scratch)


def import_roster(*, course, csv_path):
    """Read an LMS class list and write roster.json; returns a summary dict."""
    source, people, skipped, assignments = _parse(_read_text(csv_path))
    students = _checked(people)
    previous = load_roster(course)
    before = {s["id"] for s in previous.students} if previous else set()
    after = {s["id"] for s in students}
    path = roster_path(course)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, {
        "format": "autograder-roster", "version": 1, "source": source,
        "imported_from": Path(csv_path).name,
        "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "students": students, "lms_assignments": assignments})
    return {"path": str(path), "source": source, "students": len(students),
            "added": sorted(after - before), "removed": sorted(before - after),
            "skipped": skipped}


def summary_lines(summary):
    lines = [f"roster: {summary['students']} students from a {summary['source']} list "
             f"-> {summary['path']}"]
    if summary["added"] and len(summary["added"]) != summary["students"]:
        lines.append(f"  added: {', '.join(summary['added'])}")
    if summary["removed"]:
        lines.append(f"  no longer listed: {', '.join(summary['removed'])} "
                     "(their hand-ins in submitted/ are kept)")
    lines += [f"  skipped {item}" for item in summary["skipped"]]
    return lines


# Using it.

@dataclass
class Roster:
    source: str
    students: list
    by_id: dict = field(default_factory=dict)
    lms_assignments: list = field(default_factory=list)  # [{"name", "id"}] from Canvas

    def lms_column(self, assignment):
        """Canvas's `Name (id)` header for `assignment` (its slug or title, words alike:
        "01_the_recipe" is "01 The Recipe"), or None when the export had no such column."""
        wanted = "".join(name_tokens(assignment))
        for column in self.lms_assignments:
            if "".join(name_tokens(column["name"])) == wanted:
                return f"{column['name']} ({column['id']})"
        return None

    def __post_init__(self):
        self.by_id = {s["id"].casefold(): s for s in self.students}
        self._by_lms = {}
        for s in self.students:
            if s.get("lms_id"):
                self._by_lms.setdefault(str(s["lms_id"]), []).append(s)
        self._by_name = {}
        for s in self.students:
            for key in name_keys(s.get("name", "")):
                self._by_name.setdefault(key, []).append(s)

    def get(self, student_id):
        return self.by_id.get(str(student_id).casefold())

    def match(self, *, name, lms=None, uid=None):
        """(entry, how) for a hand-in, or (None, reason) when unknown or ambiguous.

        `name` is the name part of the file name (or the whole stem), `lms` "canvas",
        "moodle" or None, `uid` the LMS id in the file name.
        """
        if uid:
            found = self._by_lms.get(str(uid), [])
            if len(found) == 1:
                return found[0], f"{lms or 'LMS'} id {uid}"
            if len(found) > 1:
                return None, f"LMS id {uid} belongs to several roster entries"
            if lms == self.source and self._by_lms:
                return None, (f"{lms} id {uid} is not in the roster (a {self.source} list); "
                              "add the student and collect again")
        entry = self.get(name) if name and not uid else None
        if entry:
            return entry, "roster id"
        found = {s["id"]: s for key in name_keys(name) for s in self._by_name.get(key, [])}
        if uid and (lms == self.source or self.source == "plain"):
            other_ids = sorted(k for k, s in found.items() if s.get("lms_id"))
            found = {k: s for k, s in found.items() if not s.get("lms_id")}
            if other_ids and not found:
                return None, (f"the name matches {', '.join(other_ids)} in the roster, but the "
                              f"LMS id {uid} differs; not merged")
        if len(found) == 1:
            return next(iter(found.values())), "name"
        if len(found) > 1:
            return None, (f"the name matches {len(found)} students in the roster "
                          f"({', '.join(sorted(found))}); not merged")
        return None, "not in the roster; add the student and collect again"


def load_roster(course):
    """The course's Roster, or None when it has no roster.json."""
    path = roster_path(course)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        students = [{"id": str(s["id"]), "name": str(s.get("name") or ""),
                     "lms_id": str(s["lms_id"]) if s.get("lms_id") else None,
                     "email": str(s.get("email") or ""),
                     **{key: str(s[key]) for key in _LMS_FIELDS if s.get(key)}}
                    for s in data["students"]]
        assignments = [{"name": str(a["name"]), "id": str(a["id"])}
                       for a in data.get("lms_assignments") or []]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RosterError(f"{path} cannot be read: {e}") from None
    return Roster(source=str(data.get("source") or "plain"), students=students,
                  lms_assignments=assignments)
