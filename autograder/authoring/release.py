"""Build release/ from source/ with nbgrader, then refuse any leak."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.authoring import rules_cell
from autograder.course import path_with_tools

LEAK_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
                "normref")


class LeakError(RuntimeError):
    """The release holds grading material."""


class ReleaseError(RuntimeError):
    """nbgrader could not build an assignment; the message is one line for a person."""


def _nbgrader_failure(output):
    """The last line of nbgrader's output that says what went wrong."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "[error]" in line.lower() or "Error" in line or "error" in line:
            return line[-400:]
    return lines[-1][-400:] if lines else "no output"


def generate(*, course, assignment, into, log=sys.stderr):
    """Run `nbgrader generate_assignment` for one assignment, writing its release
    into the course folder `into` (a scratch copy: source/ and a gradebook of its own,
    so the course's gradebook and submissions never block or see a rebuild)."""
    shutil.copytree(course.source / assignment, into / "source" / assignment)
    command = [sys.executable, "-m", "nbgrader", "generate_assignment", assignment,
               "--force", f"--CourseDirectory.root={into}",
               f"--CourseDirectory.db_url=sqlite:///{into / 'gradebook.db'}"]
    # nbgrader runs alembic from the same environment when it creates the gradebook.
    env = {**os.environ, "PATH": path_with_tools()}
    done = subprocess.run(command, cwd=course.root, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise ReleaseError(
            f"release/{assignment} is unchanged: nbgrader could not build "
            f"source/{assignment}: {_nbgrader_failure(done.stdout + done.stderr)}")
    print(f"released {assignment}", file=log)
    return into / "release" / assignment


def _solution_lines(source_nb):
    """Distinctive lines of the solution and hidden-test regions of a source notebook."""
    lines = set()
    for cell in source_nb["cells"]:
        inside = False
        for line in "".join(cell.get("source", "")).splitlines():
            if re.search(r"### BEGIN (SOLUTION|HIDDEN TESTS)", line):
                inside = True
            elif re.search(r"### END (SOLUTION|HIDDEN TESTS)", line):
                inside = False
            elif inside and len(line.strip()) >= 25:
                lines.add(line.strip())
    return lines


def _shown(path, release_dir, assignment):
    return f"release/{assignment}/{path.relative_to(release_dir)}"


def find_leaks(*, course, assignment, release_dir=None):
    """Every place in release/<assignment> (or `release_dir`) that shows grading material."""
    leaks = []
    release_dir = release_dir or course.release / assignment
    secret_lines = set()
    for source in (course.source / assignment).glob("*.ipynb"):
        secret_lines |= _solution_lines(json.loads(source.read_text()))
    for path in sorted(p for p in release_dir.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        for marker in LEAK_MARKERS:
            if marker in text:
                leaks.append(f"{_shown(path, release_dir, assignment)}: contains '{marker}'")
        if path.suffix == ".ipynb":
            released = set()
            for cell in json.loads(text)["cells"]:
                released |= {ln.strip() for ln in "".join(cell.get("source", "")).splitlines()}
            for line in sorted(secret_lines & released):
                leaks.append(f"{_shown(path, release_dir, assignment)}: shows solution "
                             f"text {line!r}")
    return leaks


def _replace_dir(built, target):
    """Put `built` at `target` with renames only, so a reader sees the old folder
    or the new one, and an interrupted swap leaves the old one in place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    shutil.rmtree(staged)
    shutil.copytree(built, staged)
    retired = None
    if target.exists():
        retired = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, retired)
    os.replace(staged, target)
    if retired is not None:
        shutil.rmtree(retired)


def _cells_checked_in_kernel(source):
    """grade_ids of the autograded cells of `source` that call no trusted check."""
    from autograder.grading.grade import grade_cells

    return [gid for gid, _, checks in grade_cells(nbformat.read(source, as_version=4))
            if not checks]


def release(*, course, assignments=None, log=sys.stderr):
    """Build and leak-check every assignment (or those named). Each is built aside
    and replaces release/<assignment> only when it built and leaks nothing; a
    failure raises ReleaseError or LeakError and leaves release/ as it was."""
    for assignment in assignments or course.assignments():
        if not (course.source / assignment).is_dir():
            raise ReleaseError(f"no assignment {assignment!r}: source/ has "
                               f"{', '.join(course.assignments()) or 'none'}")
        for name in course.notebook_names(assignment):
            try:
                refreshed = rules_cell.refresh(course.source / assignment / name, assignment)
            except ValueError as error:
                raise ReleaseError(str(error)) from None
            if refreshed:
                print(f"{assignment}: wrote the rules cell of {name} from the policy", file=log)
        with tempfile.TemporaryDirectory(prefix="release-") as scratch:
            built = generate(course=course, assignment=assignment, into=Path(scratch), log=log)
            leaks = find_leaks(course=course, assignment=assignment, release_dir=built)
            if leaks:
                raise LeakError(f"release/{assignment} is unchanged: the build leaks "
                                "grading material:\n  " + "\n  ".join(leaks))
            _replace_dir(built, course.release / assignment)
        plain = [gid for name in course.notebook_names(assignment)
                 for gid in _cells_checked_in_kernel(course.source / assignment / name)]
        if plain:
            print(f"warning: {assignment}: {len(plain)} graded cell(s) test with plain "
                  f"asserts only ({', '.join(plain)}). They are scored as nbgrader scores "
                  "them, inside the student's kernel, which a hand-in can forge; for a "
                  "trusted check see docs/adding_an_exercise.md", file=log)
