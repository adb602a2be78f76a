"""Build release/ from source/ with nbgrader, then refuse any leak."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

LEAK_MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
                "normref")


class LeakError(RuntimeError):
    """The release holds grading material."""


def generate(*, course, assignment, log=sys.stderr):
    """Run `nbgrader generate_assignment` for one assignment into release/."""
    command = [sys.executable, "-m", "nbgrader", "generate_assignment", assignment,
               "--force", f"--CourseDirectory.root={course.root}",
               f"--CourseDirectory.db_url=sqlite:///{course.root / 'gradebook.db'}"]
    # nbgrader runs alembic from the same environment when it creates the gradebook.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(command, cwd=course.root, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {assignment} failed:\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    print(f"released {assignment}", file=log)


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


def find_leaks(*, course, assignment):
    """Every place in release/<assignment> that shows grading material."""
    leaks = []
    release_dir = course.release / assignment
    secret_lines = set()
    for source in (course.source / assignment).glob("*.ipynb"):
        secret_lines |= _solution_lines(json.loads(source.read_text()))
    for path in sorted(p for p in release_dir.rglob("*") if p.is_file()):
        text = path.read_text(errors="replace")
        for marker in LEAK_MARKERS:
            if marker in text:
                leaks.append(f"{path.relative_to(course.root)}: contains '{marker}'")
        if path.suffix == ".ipynb":
            released = set()
            for cell in json.loads(text)["cells"]:
                released |= {ln.strip() for ln in "".join(cell.get("source", "")).splitlines()}
            for line in sorted(secret_lines & released):
                leaks.append(f"{path.relative_to(course.root)}: shows solution text {line!r}")
    return leaks


def release(*, course, assignments=None, log=sys.stderr):
    """Build and leak-check every assignment (or those named)."""
    for assignment in assignments or course.assignments():
        generate(course=course, assignment=assignment, log=log)
        leaks = find_leaks(course=course, assignment=assignment)
        if leaks:
            raise LeakError("the release leaks grading material:\n  " + "\n  ".join(leaks))


