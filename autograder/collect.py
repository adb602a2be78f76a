"""Bring hand-ins into submitted/<student>/<assignment>/, byte for byte.

Accepted layouts in the given folder (or zip, as an LMS exports it):
  <student>.ipynb, <student>/<any>.ipynb, and LMS-style file names:
  Canvas `lastfirst_12345_67890_<original name>.ipynb` (optionally `_late`/`_LATE_`
  after the name) -> student `lastfirst_12345` (12345 is Canvas's user id);
  Moodle `Full Name_4711_assignsubmission_file_<original name>.ipynb` -> student
  `Full_Name_4711` (4711 is Moodle's participant id). Plain names keep their stem.
Nothing is refused silently: what is not collected is listed with the reason.
Links (files or folders, at any depth, and zip members that are links) are never
followed; a hand-in or zip member over MAX_HANDIN_BYTES is refused; two different
names that map to one student id are both refused. A zip is read in memory, one
member at a time, never unpacked onto disk. Reasons name files, never their contents.
An existing, different hand-in is kept beside the new one, never overwritten.
"""

import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

MAX_HANDIN_BYTES = 64 * 1024 * 1024
MAX_STUDENT_ID = 64
_CHUNK = 1024 * 1024
_SHOWN = 120

_CANVAS = re.compile(r"^(?P<name>[a-z0-9]+)(?:_late)?_(?P<uid>\d+)_\d+(?:_.*)?$", re.IGNORECASE)
_MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_file_.*$")
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


@dataclass
class CollectReport:
    collected: list = field(default_factory=list)
    unchanged: list = field(default_factory=list)
    replaced: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)
    kept: dict = field(default_factory=dict)

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
        out += [f"  not collected: {item}" for item in self.unmatched]
        return out


class _Refused(Exception):
    """A hand-in that is not collected; the message is the reason (never contents)."""


def _shown(text):
    """`text` fit for one report line: unprintable characters escaped, long names cut."""
    safe = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return safe if len(safe) <= _SHOWN else f"{safe[:_SHOWN - 20]}...{safe[-17:]}"


def _sanitize(text):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.strip()).strip("._")


def _identify(name):
    """(raw key, student id, reason): the id is None, with a reason, when refused."""
    stem = name[:-6] if name.endswith(".ipynb") else name
    key = stem
    for pattern in (_CANVAS, _MOODLE):
        match = pattern.match(stem)
        if match:
            key = f"{match.group('name')}_{match.group('uid')}"
            break
    student = _sanitize(key)
    if not student:
        return key, None, "no student name in it"
    if len(student) > MAX_STUDENT_ID:
        return key, None, f"student id would be longer than {MAX_STUDENT_ID} characters"
    return key, student, None


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


def _classify(parts, candidate):
    """Fill in candidate.key/student, or candidate.reason, from its path parts."""
    name = parts[-1]
    if not name.endswith(".ipynb"):
        candidate.reason = "not a notebook"
    elif len(parts) > 2:
        candidate.reason = "nested too deep"
    elif len(parts) == 2 and parts[0].endswith(".ipynb"):
        candidate.reason = "inside a folder named like a notebook"
    else:
        key, student, reason = _identify(parts[0])
        candidate.key, candidate.student = key, student
        if reason:
            candidate.reason = reason
    return candidate


def _hidden(parts):
    return any(part.startswith(".") or part == "__MACOSX" for part in parts)


_HIDDEN_NOTEBOOK = "a hidden notebook (its name starts with a dot): rename it to collect it"


def _hidden_notebook(parts):
    """A notebook whose own name hides it, outside hidden folders: listed, not skipped."""
    return parts[-1].endswith(".ipynb") and _hidden(parts[-1:]) and not _hidden(parts[:-1])


# Folders: walked through directory descriptors, never following a link.

def _folder_candidates(root_fd):
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
                    mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                except OSError as e:
                    found.append(_Candidate(shown, path, reason=f"cannot be read: {e.strerror}"))
                    continue
                if stat.S_ISLNK(mode):
                    found.append(_Candidate(shown, path,
                                            reason="a symbolic link; links are never followed"))
                elif stat.S_ISDIR(mode):
                    if name.endswith(".ipynb"):
                        found.append(_Candidate(shown + "/", path,
                                                reason="a folder named like a notebook"))
                    else:
                        stack.append(path)
                elif not stat.S_ISREG(mode):
                    found.append(_Candidate(shown, path, reason="not a regular file"))
                else:
                    found.append(_classify(path, _Candidate(shown, path)))
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


def _read_from_folder(root_fd, candidate):
    try:
        parent = _open_dir(root_fd, candidate.parts[:-1])
        try:
            fd = os.open(candidate.parts[-1], os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW,
                         dir_fd=parent)
        finally:
            os.close(parent)
    except OSError as e:
        if e.errno == getattr(os, "ELOOP", None) or e.errno == getattr(os, "ENOTDIR", None):
            raise _Refused("a symbolic link; links are never followed") from None
        raise _Refused(f"cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise _Refused("not a regular file")
        if info.st_size > MAX_HANDIN_BYTES:
            raise _Refused(f"larger than the {_mib(MAX_HANDIN_BYTES)} cap")
        try:
            return _read_capped(f.read)
        except OSError as e:
            raise _Refused(f"cannot be read: {e.strerror}") from None


# Zips: read in memory, one member at a time, never unpacked onto disk.

def _zip_candidates(archive):
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
            found.append(_classify(parts, _Candidate(shown, parts, member=member)))
    return found


def _read_from_zip(archive, candidate):
    member = candidate.member
    if member.file_size > MAX_HANDIN_BYTES:
        raise _Refused(f"declared size {_mib(member.file_size)} is over the "
                       f"{_mib(MAX_HANDIN_BYTES)} cap")
    try:
        with archive.open(member) as f:
            return _read_capped(f.read)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        reason = "damaged in the zip" if not isinstance(e, OSError) else e.strerror
        raise _Refused(f"cannot be read: {reason or 'damaged in the zip'}") from None
    except (NotImplementedError, RuntimeError):
        raise _Refused("cannot be read: encrypted or an unsupported compression") from None


# Writing into submitted/.

def _kept_name(target):
    stamp = time.strftime("%Y%m%dT%H%M%S")
    kept = target.with_name(f"{target.stem}.replaced-{stamp}.ipynb.bak")
    n = 1
    while os.path.lexists(kept):
        kept = target.with_name(f"{target.stem}.replaced-{stamp}-{n}.ipynb.bak")
        n += 1
    return kept


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _store(course, student, assignment, notebook_name, data, report):
    folder = course.submitted / student / assignment
    for path in (folder.parent, folder, folder / notebook_name):
        if path.is_symlink():
            raise _Refused(f"submitted/{path.relative_to(course.submitted)} is a symbolic link "
                           "(left alone)")
    target = folder / notebook_name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        if target.exists():
            if not target.is_file():
                raise _Refused(f"submitted/{student}/{assignment}/{notebook_name} "
                               "is not a regular file (left alone)")
            if hashlib.sha256(target.read_bytes()).hexdigest() == digest:
                report.unchanged.append(student)
                return
        fd, scratch = tempfile.mkstemp(dir=folder, prefix=".collect-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(scratch, 0o666 & ~_umask())
            if hashlib.sha256(Path(scratch).read_bytes()).hexdigest() != digest:
                raise _Refused("the copy does not match the original")
            if target.exists():
                kept = _kept_name(target)
                shutil.copy2(target, kept, follow_symlinks=False)
                os.replace(scratch, target)
                report.replaced.append(student)
                report.kept[student] = kept.name
            else:
                os.replace(scratch, target)
                report.collected.append(student)
        finally:
            if os.path.lexists(scratch):
                os.unlink(scratch)
    except OSError as e:
        raise _Refused(f"cannot be written to submitted/: {e.strerror}") from None


def _choose(candidates, report):
    """The candidates to collect; every other one is listed in the report."""
    by_id = {}
    for candidate in candidates:
        if candidate.reason:
            report.unmatched.append(f"{candidate.shown} ({candidate.reason})")
        else:
            by_id.setdefault(candidate.student.casefold(), []).append(candidate)
    chosen = []
    for group in by_id.values():
        keys = sorted({candidate.key for candidate in group})
        if len(keys) > 1:
            names = " and ".join(_shown(key) for key in keys)
            for candidate in group:
                report.unmatched.append(
                    f"{candidate.shown} (different names {names} map to one student id "
                    f"{candidate.student}; none of them collected)")
            continue
        chosen.append(group[0])
        for candidate in group[1:]:
            report.unmatched.append(f"{candidate.shown} (a second hand-in for "
                                    f"{candidate.student}; {group[0].shown} was taken)")
    return sorted(chosen, key=lambda candidate: candidate.parts)


def collect(*, course, assignment, source_path):
    """Copy hand-ins from a folder or zip into submitted/; returns a CollectReport."""
    source_path = Path(source_path)
    report = CollectReport()
    notebook_name = course.notebook_name(assignment)
    if source_path.is_file() and zipfile.is_zipfile(source_path):
        with zipfile.ZipFile(source_path) as archive:
            _collect_from(_zip_candidates(archive), lambda c: _read_from_zip(archive, c),
                          course, assignment, notebook_name, report)
    elif source_path.is_dir():
        root_fd = os.open(source_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _collect_from(_folder_candidates(root_fd), lambda c: _read_from_folder(root_fd, c),
                          course, assignment, notebook_name, report)
        finally:
            os.close(root_fd)
    else:
        raise FileNotFoundError(f"{source_path} is neither a folder nor a zip file")
    return report


def _collect_from(candidates, read, course, assignment, notebook_name, report):
    candidates.sort(key=lambda candidate: candidate.parts)
    for candidate in _choose(candidates, report):
        try:
            data = read(candidate)
            _store(course, candidate.student, assignment, notebook_name, data, report)
        except _Refused as refused:
            report.unmatched.append(f"{candidate.shown} ({refused})")
