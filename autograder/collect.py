"""Bring hand-ins into submitted/<student>/<assignment>/, byte for byte.

Accepted layouts in the given folder (or zip, as an LMS exports it):
  <student>.ipynb, <student>/<any>.ipynb, and LMS-style file names:
  Canvas `lastfirst_12345_67890_<original name>.ipynb`, Moodle
  `Full Name_12345_assignsubmission_file_<original name>.ipynb`.
Nothing is refused silently: what cannot be matched to a student is listed.
An existing, different hand-in is kept beside the new one, never overwritten.
"""

import hashlib
import re
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

_CANVAS = re.compile(r"^(?P<student>[a-z0-9]+)(?:_late)?_\d+_\d+(?:_.*)?$", re.IGNORECASE)
_MOODLE = re.compile(r"^(?P<student>.+?)_\d+_assignsubmission_file_.*$")


@dataclass
class CollectReport:
    collected: list = field(default_factory=list)
    unchanged: list = field(default_factory=list)
    replaced: list = field(default_factory=list)
    unmatched: list = field(default_factory=list)

    def lines(self):
        out = [f"collected {len(self.collected)}, unchanged {len(self.unchanged)}, "
               f"replaced {len(self.replaced)} (old copies kept), "
               f"unmatched {len(self.unmatched)}"]
        out += [f"  not collected: {item}" for item in self.unmatched]
        return out


def student_id_from(name):
    """A safe student id from an LMS or plain file name, or None."""
    stem = name[:-6] if name.endswith(".ipynb") else name
    for pattern in (_CANVAS, _MOODLE):
        match = pattern.match(stem)
        if match:
            stem = match.group("student")
            break
    student = re.sub(r"[^A-Za-z0-9_.-]+", "_", stem.strip()).strip("._")
    return student or None


def _candidates(folder):
    """[(student id or None, path, shown name)] for every file in `folder`."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if any(part.startswith(".") or part == "__MACOSX" for part in relative.parts):
            continue
        if path.suffix != ".ipynb":
            found.append((None, path, f"{relative} (not a notebook)"))
        elif len(relative.parts) == 1:
            found.append((student_id_from(path.name), path, str(relative)))
        elif len(relative.parts) == 2:
            found.append((student_id_from(relative.parts[0]), path, str(relative)))
        else:
            found.append((None, path, f"{relative} (nested too deep)"))
    return found


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def collect(*, course, assignment, source_path):
    """Copy hand-ins from a folder or zip into submitted/; returns a CollectReport."""
    source_path = Path(source_path)
    report = CollectReport()
    with tempfile.TemporaryDirectory() as unpacked:
        if source_path.is_file() and zipfile.is_zipfile(source_path):
            with zipfile.ZipFile(source_path) as archive:
                for member in archive.infolist():
                    target = (Path(unpacked) / member.filename).resolve()
                    if not str(target).startswith(str(Path(unpacked).resolve())):
                        report.unmatched.append(f"{member.filename} (unsafe path in zip)")
                        continue
                    archive.extract(member, unpacked)
            folder = Path(unpacked)
        elif source_path.is_dir():
            folder = source_path
        else:
            raise FileNotFoundError(f"{source_path} is neither a folder nor a zip file")
        seen = {}
        notebook_name = course.notebook_name(assignment)
        for student, path, shown in _candidates(folder):
            if student is None:
                report.unmatched.append(shown)
                continue
            if student in seen:
                report.unmatched.append(f"{shown} (a second hand-in for {student}; "
                                        f"{seen[student]} was taken)")
                continue
            seen[student] = shown
            target = course.submitted / student / assignment / notebook_name
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                if _digest(target) == _digest(path):
                    report.unchanged.append(student)
                    continue
                kept = target.with_name(f"{target.stem}.replaced-{time.strftime('%Y%m%dT%H%M%S')}"
                                        f".ipynb.bak")
                shutil.copy2(target, kept)
                report.replaced.append(student)
            else:
                report.collected.append(student)
            shutil.copyfile(path, target)
            if _digest(target) != _digest(path):
                raise OSError(f"copy of {shown} does not match the original")
    return report
