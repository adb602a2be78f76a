"""Bring hand-ins into submitted/<student>/<assignment>/, byte for byte.

Accepted layouts in the given folder (or zip, as an LMS exports it):
  <student>.ipynb, <student>/<any>.ipynb, and LMS-style file names:
  Canvas `lastfirst_12345_67890_<original name>.ipynb` (optionally `_late`/`_LATE_`
  after the name) -> student `lastfirst_12345` (12345 is Canvas's user id);
  Moodle `Full Name_4711_assignsubmission_file_<original name>.ipynb` -> student
  `Full_Name_4711` (4711 is Moodle's participant id). Plain names keep their stem.
  nbgrader's own layout, `[submitted/]<student>/<assignment>/...` (as its exchange leaves
  it): every notebook and extra file (images, data) of the hand-in, and its timestamp.txt.
With a roster (roster.json, see autograder/term/roster.py) every hand-in is filed under the
roster's id: matched by LMS user id first, then by roster id, then by name; a hand-in
that matches no one, or several people, is listed and not collected.
Each collected hand-in gets submitted/<student>/<assignment>/timestamp.txt (nbgrader's
format; from nbgrader's timestamp.txt, else the zip member's date, else the file's
modification time) and a sidecar `.handin.json` saying where it came from, which time
source was used and any LMS late marker (see autograder/term/deadlines.py).
A single notebook named otherwise (`Untitled.ipynb`) is saved under the assignment's
notebook name, with a note in the report.
Nothing is refused silently: what is not collected is listed with the reason.
Links (files or folders, at any depth, and zip members that are links) are never
followed; a hand-in or zip member over MAX_HANDIN_BYTES is refused; two different
names that map to one student id are both refused. A zip is read in memory, one
member at a time, never unpacked onto disk. Reasons name files, never their contents.
An existing, different hand-in is kept beside the new one, never overwritten.
"""

import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from autograder.course import LESSON_SUFFIX
from autograder.term import deadlines as deadlines_module
from autograder.term.roster import load_roster

MAX_HANDIN_BYTES = 64 * 1024 * 1024
MAX_STUDENT_ID = 64
MAX_FILES_PER_HANDIN = 200
MAX_DEPTH_IN_HANDIN = 4
_CHUNK = 1024 * 1024
_SHOWN = 120

# Canvas names a download `<name>[_LATE]_<user id>_<attachment id>_<file name>`, where
# <name> is the student's sortable name ("Müller, Jürgen") lower-cased with every
# non-word character removed, Unicode letters and marks kept ("müllerjürgen"):
# get_filename and sanitize_file_name in canvas-lms's lib/content_zipper.rb.
_WORD = r"(?:[^\W_]|[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f])"
_CANVAS = re.compile(rf"^(?P<name>{_WORD}+)(?P<late>_late)?_(?P<uid>\d+)_\d+(?:_(?P<orig>.*))?$",
                     re.IGNORECASE)
_MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_file_(?P<orig>.*)$")
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass
class CollectReport:
    collected: list = field(default_factory=list)
    unchanged: list = field(default_factory=list)
    replaced: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)
    renamed: dict = field(default_factory=dict)
    late: list = field(default_factory=list)
    unknown: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def lines(self):
        out = [f"collected {len(self.collected)}, unchanged {len(self.unchanged)}, "
               f"replaced {len(self.replaced)} (old copies kept), "
               f"unmatched {len(self.unmatched)}"]
        if self.collected:
            out.append(f"  collected: {', '.join(self.collected)}")
        if self.unchanged:
            out.append(f"  unchanged: {', '.join(self.unchanged)}")
        out += [f"  replaced: {student} (old copy kept as {self.kept.get(student, '?')})"
                for student in self.replaced]
        out += [f"  renamed: {student} ({what})" for student, what in self.renamed.items()]
        if self.late:
            out.append(f"  marked late by the LMS: {', '.join(self.late)}")
        out += [f"  note: {note}" for note in self.notes]
        out += [f"  not collected: {item}" for item in self.unmatched]
        return out


class _Refused(Exception):
    """A hand-in that is not collected; the message is the reason (never contents)."""


def _shown(text):
    """`text` fit for one report line: unprintable characters escaped, long names cut."""
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return safe if len(safe) <= _SHOWN else f"{safe[:_SHOWN - 20]}...{safe[-17:]}"


def _sanitize(text):
    """A folder-safe id: accents dropped ("müller" -> "muller"), then anything but
    ASCII letters, digits, `_`, `.` and `-` replaced."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text)
                    if not unicodedata.combining(c))
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", plain.strip()).strip("._")


@dataclass
class _Ident:
    key: str
    student: str = None
    reason: str = None
    lms: str = None
    uid: str = None
    name: str = None
    late: bool = False
    original: str = None
    prefix: str = None  # the LMS's part of the name, up to the original name


def _identify_full(name):
    """An _Ident for a file or folder name; student is None, with a reason, when refused."""
    # one name whether the zip or the disk spelled its accents composed (NFC) or not
    name = unicodedata.normalize("NFC", name)
    stem = name[:-6] if name.endswith(".ipynb") else name
    ident = _Ident(key=stem, name=stem)
    for lms, pattern in (("canvas", _CANVAS), ("moodle", _MOODLE)):
        match = pattern.match(stem)
        if match:
            ident = _Ident(key=f"{match.group('name')}_{match.group('uid')}", lms=lms,
                           uid=match.group("uid"), name=match.group("name"),
                           late=bool(match.groupdict().get("late")),
                           original=(match.group("orig") + name[len(stem):]
                                     if match.group("orig") else None),
                           prefix=(stem[:match.start("orig") - 1]
                                   if match.group("orig") is not None else stem))
            break
    student = _sanitize(ident.key)
    if not student:
        ident.reason = "no student name in it"
    elif len(student) > MAX_STUDENT_ID:
        ident.reason = f"student id would be longer than {MAX_STUDENT_ID} characters"
    else:
        ident.student = student
    return ident


def _identify(name):
    """(raw key, student id, reason): the id is None, with a reason, when refused."""
    ident = _identify_full(name)
    return ident.key, ident.student, ident.reason


def student_id_from(name):
    """A safe student id from an LMS or plain file name, or None."""
    return _identify(name)[1]


@dataclass
class _Candidate:
    shown: str
    parts: tuple
    key: str = None
    student: str = None
    reason: str = None
    member: zipfile.ZipInfo = None
    ident: _Ident = None
    rel: tuple = None            # nbgrader layout: the path inside the hand-in's folder
    folder: tuple = None         # nbgrader layout: the parts of <student>/<assignment>
    other_assignment: str = None
    when: datetime = None        # set when read: the file's time
    when_source: str = None


_RESERVED = {deadlines_module.TIMESTAMP_FILE, deadlines_module.SIDECAR_FILE}


def _nbgrader_split(parts, assignment):
    """(prefix+student parts, student folder name, path inside) for nbgrader's layout
    `[submitted/]<student>/<assignment>/<path>`, else None; `assignment` None matches any."""
    start = 1 if len(parts) >= 4 and parts[0] == "submitted" else 0
    rest = parts[start:]
    if len(rest) >= 3 and (rest[1] == assignment if assignment else True):
        return parts[:start + 2], rest[0], rest[2:]
    return None


def _classify(parts, candidate, assignment=None, others=()):
    """Fill in candidate.key/student, or candidate.reason, from its path parts."""
    name = parts[-1]
    split = _nbgrader_split(parts, assignment) if assignment else None
    if split:
        folder, student_folder, rel = split
        candidate.folder, candidate.rel = folder, rel
        ident = _Ident(key=student_folder, name=student_folder)
        student = _sanitize(student_folder)
        if len(rel) > MAX_DEPTH_IN_HANDIN:
            candidate.reason = "nested too deep"
        elif any(len(part) > 255 or not part.isprintable() for part in rel):
            candidate.reason = "an unusable file name"
        elif not student:
            candidate.reason = "no student name in it"
        elif len(student) > MAX_STUDENT_ID:
            candidate.reason = f"student id would be longer than {MAX_STUDENT_ID} characters"
        else:
            ident.student = student
            candidate.key, candidate.student, candidate.ident = ident.key, student, ident
        return candidate
    other = _nbgrader_split(parts, None)
    if other and other[0][-1] in others:
        candidate.folder, candidate.other_assignment = other[0], other[0][-1]
        return candidate
    if not name.endswith(".ipynb"):
        candidate.reason = "not a notebook"
    elif len(parts) > 2:
        candidate.reason = "nested too deep"
    elif len(parts) == 2 and parts[0].endswith(".ipynb"):
        candidate.reason = "inside a folder named like a notebook"
    else:
        ident = _identify_full(parts[0])
        if len(parts) == 2:
            ident.original = name
        candidate.key, candidate.student, candidate.ident = ident.key, ident.student, ident
        if ident.reason:
            candidate.reason = ident.reason
    return candidate


def _hidden(parts):
    return any(part.startswith(".") or part == "__MACOSX" for part in parts)


_HIDDEN_NOTEBOOK = "a hidden notebook (its name starts with a dot): rename it to collect it"


def _hidden_notebook(parts):
    """A notebook whose own name hides it, outside hidden folders: listed, not skipped."""
    return parts[-1].endswith(".ipynb") and _hidden(parts[-1:]) and not _hidden(parts[:-1])


# Folders: walked through directory descriptors, never following a link.

def _folder_candidates(root_fd, assignment=None, others=()):
    found = []
    stack = [()]
    while stack:
        parts = stack.pop()
        try:
            fd = _open_dir(root_fd, parts)
        except OSError as e:
            found.append(_Candidate(_shown("/".join(parts)) + "/",
                                    parts, reason=f"folder cannot be opened: {e.strerror}"))
            continue
        try:
            names = sorted(os.listdir(fd))
            for name in names:
                path = (*parts, name)
                shown = _shown("/".join(path))
                if _hidden((name,)):
                    if _hidden_notebook(path):
                        found.append(_Candidate(shown, path, reason=_HIDDEN_NOTEBOOK))
                    continue
                try:
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except OSError as e:
                    found.append(_Candidate(shown, path, reason=f"cannot be read: {e.strerror}"))
                    continue
                mode = info.st_mode
                if stat.S_ISLNK(mode):
                    found.append(_Candidate(shown, path,
                                            reason="a symbolic link; links are never followed"))
                elif stat.S_ISREG(mode) and info.st_nlink > 1:
                    found.append(_Candidate(shown, path, reason=_HARD_LINK))
                elif stat.S_ISDIR(mode):
                    if name.endswith(".ipynb"):
                        found.append(_Candidate(shown + "/", path,
                                                reason="a folder named like a notebook"))
                    else:
                        stack.append(path)
                elif not stat.S_ISREG(mode):
                    found.append(_Candidate(shown, path, reason="not a regular file"))
                else:
                    found.append(_classify(path, _Candidate(shown, path), assignment, others))
        finally:
            os.close(fd)
    return found


def _open_dir(root_fd, parts):
    """A descriptor of root/parts..., refusing a link at every step."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_capped(read):
    data = bytearray()
    while True:
        chunk = read(_CHUNK)
        if not chunk:
            return data
        data += chunk
        if len(data) > MAX_HANDIN_BYTES:
            raise _Refused(f"larger than the {_mib(MAX_HANDIN_BYTES)} cap")


def _mib(size):
    return f"{size / (1024 * 1024):g} MiB"


# A file with a second name may be the course's own notebook (solutions, hidden tests)
# or anyone else's, linked into the hand-in folder: like a symbolic link, never read.
_HARD_LINK = "a hard link; its bytes may be another person's file"


def _read_from_folder(root_fd, candidate):
    try:
        parent = _open_dir(root_fd, candidate.parts[:-1])
        try:
            fd = os.open(candidate.parts[-1], os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW,
                         dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Refused("a symbolic link; links are never followed") from None
        raise _Refused(f"cannot be read: {e.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder swapped in: os.fdopen would raise
        os.close(fd)
        raise _Refused("not a regular file")
    if info.st_nlink > 1:  # checked again on the open file: a link made after listing
        os.close(fd)
        raise _Refused(_HARD_LINK)
    with os.fdopen(fd, "rb", buffering=0) as f:
        if info.st_size > MAX_HANDIN_BYTES:
            raise _Refused(f"larger than the {_mib(MAX_HANDIN_BYTES)} cap")
        candidate.when = datetime.fromtimestamp(info.st_mtime, UTC)
        candidate.when_source = "file modification time (last resort)"
        try:
            return _read_capped(f.read)
        except OSError as e:
            raise _Refused(f"cannot be read: {e.strerror}") from None


# Zips: read in memory, one member at a time, never unpacked onto disk.

def _zip_candidates(archive, assignment=None, others=()):
    found = []
    for member in archive.infolist():
        name = member.filename.replace("\\", "/")
        parts = tuple(name.strip("/").split("/"))
        shown = _shown(name)
        if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            found.append(_Candidate(shown, parts, reason="unsafe path in zip"))
            continue
        if _hidden(parts):
            if _hidden_notebook(parts) and not member.is_dir():
                found.append(_Candidate(shown, parts, reason=_HIDDEN_NOTEBOOK))
            continue
        mode = member.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if stat.S_ISLNK(mode):
            found.append(_Candidate(shown, parts,
                                    reason="a symbolic link; links are never followed"))
        elif member.is_dir() or stat.S_ISDIR(mode):
            if parts[-1].endswith(".ipynb"):
                found.append(_Candidate(shown, parts, reason="a folder named like a notebook"))
        elif kind and not stat.S_ISREG(mode):
            found.append(_Candidate(shown, parts, reason="not a regular file"))
        else:
            found.append(_classify(parts, _Candidate(shown, parts, member=member),
                                   assignment, others))
    return found


def _read_from_zip(archive, candidate):
    member = candidate.member
    if member.file_size > MAX_HANDIN_BYTES:
        raise _Refused(f"declared size {_mib(member.file_size)} is over the "
                       f"{_mib(MAX_HANDIN_BYTES)} cap")
    if member.date_time[0] > 1980:
        try:
            candidate.when = datetime(*member.date_time)  # no zone: read in the course's
            candidate.when_source = "zip member date"
        except ValueError:
            pass
    try:
        with archive.open(member) as f:
            return _read_capped(f.read)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        reason = "damaged in the zip" if not isinstance(e, OSError) else e.strerror
        raise _Refused(f"cannot be read: {reason or 'damaged in the zip'}") from None
    except (NotImplementedError, RuntimeError):
        raise _Refused("cannot be read: encrypted or an unsupported compression") from None


# Hand-ins: one notebook, or a folder of notebooks and extra files (nbgrader's layout).

@dataclass
class _Handin:
    key: str
    student: str
    shown: str
    ident: _Ident
    parts: tuple
    notebooks: list = field(default_factory=list)
    extras: list = field(default_factory=list)
    stamp: _Candidate = None
    folder_layout: bool = False
    how: str = None


def _handins(candidates, report, expected):
    """Candidates grouped into hand-ins; refused candidates are listed in the report."""
    handins, folders, others = [], {}, {}
    for candidate in candidates:
        if candidate.other_assignment:
            others.setdefault(candidate.other_assignment, set()).add(candidate.folder)
            continue
        if candidate.reason:
            report.unmatched.append(f"{candidate.shown} ({candidate.reason})")
            continue
        grouped = candidate.rel is not None or (len(expected) > 1 and len(candidate.parts) == 2)
        if not grouped:
            handins.append(_Handin(key=candidate.key, student=candidate.student,
                                   shown=candidate.shown, ident=candidate.ident,
                                   parts=candidate.parts, notebooks=[candidate]))
            continue
        if candidate.rel is None:
            candidate.folder, candidate.rel = candidate.parts[:1], candidate.parts[1:]
        handin = folders.get(candidate.folder)
        if handin is None:
            handin = folders[candidate.folder] = _Handin(
                key=candidate.key, student=candidate.student,
                shown=_shown("/".join(candidate.folder)) + "/", ident=candidate.ident,
                parts=candidate.folder, folder_layout=True)
            handins.append(handin)
        if candidate.rel == (deadlines_module.TIMESTAMP_FILE,):
            handin.stamp = candidate
        elif len(candidate.rel) == 1 and candidate.rel[0].endswith(".ipynb"):
            handin.notebooks.append(candidate)
        else:
            handin.extras.append(candidate)
    if others:
        report.notes.append("left out, hand-ins for other assignments: " + ", ".join(
            f"{name} ({len(folders_)} folders)" for name, folders_ in sorted(others.items())))
    kept = []
    for handin in handins:
        if not handin.notebooks:
            report.unmatched.append(f"{handin.shown} (no notebook in it)")
        else:
            kept.append(handin)
    return kept


def _resolve(handins, roster, report):
    """With a roster, each hand-in's roster id; unknown and ambiguous ones are listed."""
    if roster is None:
        return handins
    matched = []
    for handin in handins:
        ident = handin.ident
        entry, how = roster.match(name=ident.name, lms=ident.lms, uid=ident.uid)
        if entry is None:
            report.unmatched.append(f"{handin.shown} ({how})")
            report.unknown.append(handin.shown)
            continue
        handin.student, handin.how = entry["id"], how
        if how == "name":
            report.notes.append(f"{handin.shown} filed as {entry['id']} "
                                f"({_shown(entry['name'])}), matched by name")
        matched.append(handin)
    return matched


def _choose(handins, report):
    """The hand-ins to collect; every other one is listed in the report."""
    by_id = {}
    for handin in handins:
        by_id.setdefault(handin.student.casefold(), []).append(handin)
    chosen = []
    for group in by_id.values():
        keys = sorted({handin.key for handin in group})
        if len(keys) > 1:
            names = " and ".join(_shown(key) for key in keys)
            for handin in group:
                report.unmatched.append(
                    f"{handin.shown} (different names {names} map to one student id "
                    f"{handin.student}; none of them collected)")
            continue
        group.sort(key=_recency, reverse=True)
        chosen.append(group[0])
        for handin in group[1:]:
            report.unmatched.append(f"{handin.shown} (an earlier hand-in of "
                                    f"{handin.student}; the latest, {group[0].shown}, "
                                    "was taken)")
    return sorted(chosen, key=lambda handin: handin.parts)


def _recency(handin):
    """How recent a hand-in is, to keep the latest of a student's several: the zip
    member's date, then the LMS's resubmission number (Canvas's `name-2.ipynb`),
    then the LMS's submission id in the file name."""
    first = handin.notebooks[0] if handin.notebooks else None
    member = first.member if first is not None else None
    stamp = member.date_time if member is not None else (0,)
    original = first.ident.original if first is not None and first.ident else ""
    attempt = re.search(r"-(\d+)\.ipynb$", original or "")
    numbers = [int(n) for n in re.findall(r"_(\d+)", first.shown)] if first else []
    return (stamp, int(attempt.group(1)) if attempt else 0, numbers)


def _plain_name(name):
    """A notebook name without Canvas's resubmission suffix: `hw-2.ipynb` -> `hw.ipynb`."""
    return re.sub(r"-\d+(\.ipynb)$", r"\1", name)


class _Renamed(str):
    """A note that a notebook was saved under the assignment's name (shown as "renamed")."""


def _lesson_notes(names, notes):
    """A note for each notebook named as a lesson is (NN_slug_lesson.ipynb): a student
    who hands in the unit's lesson instead of its assignment gets no points for it."""
    for name in names:
        if name and Path(_plain_name(name)).stem.endswith(LESSON_SUFFIX):
            notes.append(f"{_shown(name)} is named as a lesson, not as the assignment: "
                         "was the lesson handed in by mistake?")


def _notebook_targets(handin, expected, notes):
    """[(candidate, path parts inside the hand-in's folder)] for its notebooks."""
    if not handin.folder_layout:
        candidate = handin.notebooks[0]
        original = candidate.ident.original if candidate.ident else None
        _lesson_notes([original], notes)
        if len(expected) == 1:
            target = expected[0]
        elif original and _plain_name(original) in expected:
            target = _plain_name(original)
        else:
            raise _Refused(f"the assignment has {len(expected)} notebooks "
                           f"({', '.join(expected)}); hand them in as a folder")
        if original and _plain_name(original) != target:
            notes.append(_Renamed(f"{_shown(original)} saved as {target}"))
        return [(candidate, (target,))]
    names = [candidate.rel[0] for candidate in handin.notebooks]
    _lesson_notes(names, notes)
    if len(expected) == 1 and len(names) == 1 and names[0] != expected[0]:
        notes.append(_Renamed(f"{_shown(names[0])} saved as {expected[0]}"))
        return [(handin.notebooks[0], (expected[0],))]
    unexpected = [name for name in names if name not in expected]
    missing = [name for name in expected if name not in names]
    if unexpected:
        notes.append(f"not the assignment's notebooks: {_shown(', '.join(unexpected))}")
    if missing:
        notes.append(f"missing: {', '.join(missing)}")
    return [(candidate, candidate.rel) for candidate in handin.notebooks]


def _read_handin(handin, read, report, expected, zone):
    """(files [(path parts, bytes)], when, time source, notes) of a hand-in."""
    notes = []
    wanted = _notebook_targets(handin, expected, notes)
    wanted += [(candidate, candidate.rel) for candidate in handin.extras]
    extras = {id(candidate) for candidate in handin.extras}
    files, total, times = [], 0, []
    for candidate, rel in wanted:
        if len(files) >= MAX_FILES_PER_HANDIN:
            report.unmatched.append(f"{candidate.shown} (more than {MAX_FILES_PER_HANDIN} "
                                    "files in one hand-in)")
            continue
        try:
            data = read(candidate)
        except _Refused as refused:
            if id(candidate) in extras:
                report.unmatched.append(f"{candidate.shown} ({refused})")
                continue
            raise
        total += len(data)
        if total > 4 * MAX_HANDIN_BYTES:
            raise _Refused(f"larger than the {_mib(4 * MAX_HANDIN_BYTES)} cap in all")
        files.append((rel, bytes(data)))
        if id(candidate) not in extras and candidate.when:
            when = candidate.when
            times.append((when.replace(tzinfo=zone) if when.tzinfo is None else when,
                          candidate.when_source))
    when, source = max(times, key=lambda t: t[0]) if times else (None, None)
    if handin.stamp is not None:
        try:
            stamp = deadlines_module.parse_timestamp(
                bytes(read(handin.stamp)[:1024]).decode("utf-8", "replace"))
        except _Refused:
            stamp = None
        if stamp:
            when, source = stamp, "nbgrader's timestamp.txt"
        else:
            notes.append(f"its timestamp.txt cannot be read; {source or 'no time'} used")
    return files, when, source, notes


# Writing into submitted/.

def _kept_name(target):
    stamp = time.strftime("%Y%m%dT%H%M%S")
    kept = target.with_name(f"{target.stem}.replaced-{stamp}{target.suffix}.bak")
    n = 1
    while os.path.lexists(kept):
        kept = target.with_name(f"{target.stem}.replaced-{stamp}-{n}{target.suffix}.bak")
        n += 1
    return kept


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_atomically(target, data, digest=None):
    """Write bytes beside `target`, check them, and move them into place."""
    fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=".collect-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(scratch, 0o666 & ~_umask())
        if digest and hashlib.sha256(Path(scratch).read_bytes()).hexdigest() != digest:
            raise _Refused("the copy does not match the original")
        os.replace(scratch, target)
    finally:
        if os.path.lexists(scratch):
            os.unlink(scratch)


def _store(course, student, assignment, files, report):
    """Write a hand-in's files; returns "collected", "unchanged" or "replaced"."""
    folder = course.submitted / student / assignment
    planned = []
    for rel, data in files:
        for path in (folder.parent, folder, *(folder.joinpath(*rel[:i + 1])
                                              for i in range(len(rel)))):
            if path.is_symlink():
                raise _Refused(f"submitted/{path.relative_to(course.submitted)} is a symbolic "
                               "link (left alone)")
        planned.append((folder.joinpath(*rel), data, hashlib.sha256(data).hexdigest()))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        changed, replacing = [], False
        for target, data, digest in planned:
            if target.exists():
                if not target.is_file():
                    raise _Refused(f"submitted/{target.relative_to(course.submitted)} "
                                   "is not a regular file (left alone)")
                if hashlib.sha256(target.read_bytes()).hexdigest() == digest:
                    continue
                replacing = True
            changed.append((target, data, digest))
        if not changed:
            report.unchanged.append(student)
            return "unchanged"
        kept = []
        for target, data, digest in changed:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                copy = _kept_name(target)
                shutil.copy2(target, copy, follow_symlinks=False)
                kept.append(copy.name)
            _write_atomically(target, data, digest)
        if replacing:
            report.replaced.append(student)
            report.kept[student] = ", ".join(kept)
            return "replaced"
        report.collected.append(student)
        return "collected"
    except OSError as e:
        raise _Refused(f"cannot be written to submitted/: {e.strerror}") from None


def _record(course, student, assignment, handin, status, when, source, notes, files):
    """Write timestamp.txt and the sidecar for a hand-in just stored (or not yet recorded)."""
    folder = course.submitted / student / assignment
    stamp = folder / deadlines_module.TIMESTAMP_FILE
    sidecar = folder / deadlines_module.SIDECAR_FILE
    if status == "unchanged" and os.path.lexists(sidecar):
        return
    for path in (stamp, sidecar):
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise _Refused(f"submitted/{path.relative_to(course.submitted)} is not a regular "
                           "file (left alone)")
    try:
        if when is not None:
            _write_atomically(stamp, deadlines_module.format_timestamp(when).encode())
        elif os.path.lexists(stamp) and status != "unchanged":
            os.unlink(stamp)
        ident = handin.ident or _Ident(key=handin.key)
        record = {"version": 1, "student": student, "assignment": assignment,
                  "from": handin.shown, "collected_at": datetime.now(UTC).isoformat(),
                  "lms": ident.lms, "lms_id": ident.uid, "lms_late": ident.late,
                  "lms_prefix": ident.prefix,
                  "submitted_at": when.astimezone(UTC).isoformat() if when else None,
                  "timestamp_source": source, "roster_match": handin.how,
                  "files": ["/".join(rel) for rel, _ in files], "notes": notes}
        _write_atomically(sidecar, (json.dumps(record, indent=1) + "\n").encode())
    except OSError as e:
        raise _Refused(f"cannot be written to submitted/: {e.strerror}") from None


def _notebooks_of(course, assignment):
    notebooks = sorted(p.name for p in (course.source / assignment).glob("*.ipynb"))
    if not notebooks:
        raise FileNotFoundError(f"source/{assignment} holds no notebook")
    return notebooks


def collect(*, course, assignment, source_path):
    """Copy hand-ins from a folder or zip into submitted/; returns a CollectReport."""
    source_path = Path(source_path)
    report = CollectReport()
    expected = _notebooks_of(course, assignment)
    others = set(course.assignments()) - {assignment}
    if source_path.is_file() and zipfile.is_zipfile(source_path):
        with zipfile.ZipFile(source_path) as archive:
            _collect_from(_zip_candidates(archive, assignment, others),
                          lambda c: _read_from_zip(archive, c),
                          course, assignment, expected, report)
    elif source_path.is_dir():
        root_fd = os.open(source_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _collect_from(_folder_candidates(root_fd, assignment, others),
                          lambda c: _read_from_folder(root_fd, c),
                          course, assignment, expected, report)
        finally:
            os.close(root_fd)
    else:
        raise FileNotFoundError(f"{source_path} is neither a folder nor a zip file")
    return report


def _course_tree(candidates, report):
    """Only submitted/ of a whole nbgrader course (source/, release/, ... left alone)."""
    if not any(len(c.parts) >= 4 and c.parts[0] == "submitted" for c in candidates):
        return candidates
    inside = [c for c in candidates if c.parts[0] == "submitted"]
    if len(inside) < len(candidates):
        report.notes.append(f"an nbgrader course: only its submitted/ was read "
                            f"({len(candidates) - len(inside)} other entries left alone)")
    return inside


# Names editors give a notebook, never a student's: JupyterLab's Untitled3 and
# 01_hw-Copy1, Colab's "Copy of 01_hw".
_EDITOR_NAME = re.compile(r"untitled\d*|copy of .*|.*-copy\d*", re.IGNORECASE)


def _default_name(candidate, expected):
    """A reason when a loose notebook's name is no student's (Untitled.ipynb, 01_hw.ipynb,
    Colab's "Copy of 01_hw.ipynb")."""
    if len(candidate.parts) != 1 or candidate.rel is not None or candidate.reason \
            or not candidate.ident or candidate.ident.lms:
        return None
    stem = candidate.ident.key
    if _EDITOR_NAME.fullmatch(stem) or f"{stem}.ipynb" in expected:
        return (f"{candidate.parts[0]} names no student; rename it after the student, or put "
                "it in a folder named after them")
    return None


def _collect_from(candidates, read, course, assignment, expected, report):
    candidates = _course_tree(candidates, report)
    for candidate in candidates:
        candidate.reason = candidate.reason or _default_name(candidate, expected)
    candidates.sort(key=lambda candidate: candidate.parts)
    roster = load_roster(course)
    try:
        zone = deadlines_module.course_zone(course)
    except deadlines_module.DeadlinesError as problem:
        zone = UTC
        report.notes.append(f"{problem}; zip dates read as UTC")
    handins = _resolve(_handins(candidates, report, expected), roster, report)
    for handin in _choose(handins, report):
        student = handin.student
        try:
            files, when, source, notes = _read_handin(handin, read, report, expected, zone)
            status = _store(course, student, assignment, files, report)
        except _Refused as refused:
            report.unmatched.append(f"{handin.shown} ({refused})")
            continue
        try:
            _record(course, student, assignment, handin, status, when, source, notes, files)
        except _Refused as refused:
            notes.append(f"its time and LMS marker were not recorded: {refused}")
        renamed = [note for note in notes if isinstance(note, _Renamed)]
        if renamed:
            report.renamed[student] = "; ".join(renamed)
        report.notes += [f"{student}: {note}" for note in notes if note not in renamed]
        if handin.ident and handin.ident.late:
            report.late.append(student)
    if roster is not None:
        stale = sorted(s for s in course.students(assignment) if roster.get(s) is None)
        if stale:
            report.notes.append(
                f"submitted/ holds {len(stale)} hand-ins of {assignment} under ids that are not "
                f"in the roster (collected before it?): {', '.join(stale[:10])}"
                + (" ..." if len(stale) > 10 else ""))
