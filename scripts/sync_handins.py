"""Bring the sample and attack hand-ins of one assignment up to date with its release.

A hand-in's locked cells (instructions, tests, the rules cell) are what the student
downloaded: after a change to source/ and `autograder release`, they must be the new
release's, checksum included, or nbgrader validate stops at "a test cell has changed".
This copies the source and metadata of every released locked cell into each hand-in
cell with the same grade_id, leaves answer cells as the student wrote them, and lists
the released cells a sample hand-in lacks (a new exercise: add its answer by hand).

Usage: .venv/bin/python scripts/sync_handins.py NN_slug
"""

import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
# Hand-ins whose point is an edited test cell: syncing would undo what they test.
EDITS_A_TEST_CELL = {"gus_edited_tests.ipynb"}


def handins_of(assignment):
    unit = assignment[:2]
    yield from (REPO / "autograder" / "examples" / assignment).glob("*.ipynb")
    yield from (REPO / "tests" / "attacks" / assignment).glob("*.ipynb")
    yield from (REPO / "tests" / "attacks" / "instructor_features").glob(f"u{unit}_*.ipynb")


def sync(assignment):
    released = {}
    for path in sorted((REPO / "release" / assignment).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            grading = cell.metadata.get("nbgrader", {})
            if "grade_id" in grading:
                released[grading["grade_id"]] = cell
    for path in sorted(handins_of(assignment)):
        if path.name in EDITS_A_TEST_CELL:
            continue
        handin = nbformat.read(path, as_version=4)
        present, changed = set(), False
        for cell in handin.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            present.add(grade_id)
            new = released.get(grade_id)
            if new is None or new.metadata["nbgrader"].get("solution"):
                continue
            if cell.source != new.source or cell.metadata != new.metadata:
                cell.source, cell.metadata = new.source, nbformat.from_dict(
                    dict(new.metadata))
                changed = True
        if changed:
            nbformat.write(handin, path)
            print(f"updated {path.relative_to(REPO)}")
        missing = [grade_id for grade_id in released if grade_id not in present]
        # attack hand-ins hold only the cells their attack needs
        if missing and path.parent.parent.name == "examples":
            print(f"{path.relative_to(REPO)} lacks {', '.join(missing)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sync(sys.argv[1])
