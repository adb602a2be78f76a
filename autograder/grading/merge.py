"""Rebuild a hand-in for grading, as nbgrader's autograde does.

The student's answer cells are kept; every nbgrader cell the instructor wrote (text,
visible tests, hidden tests, each with a grade_id) comes from source/, whatever the
hand-in did to it. A cell without nbgrader metadata is the student's to edit, as in
stock nbgrader (which overwrites only the cells it knows): where the hand-in still has
it as released, that copy is the one graded, never a second one from source/; where it
was deleted, it is restored. Cells the student added stay where they were, up to
MAX_ADDED_CELLS cells
and MAX_ADDED_CHARS characters of source in all (what grading and the feedback
page cost grows with them; the answer cells are always kept). The hand-in file
itself is never modified.
"""

import nbformat

MAX_ADDED_CELLS = 300
MAX_ADDED_CHARS = 1_000_000
# How the note on added cells past the limits begins (grade flags it too).
ADDED_CELLS_DROPPED = "the hand-in added"


def _nbgrader(cell):
    # A hand-in's metadata is the student's: anything but a dict means none.
    metadata = cell.get("metadata")
    meta = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return meta if isinstance(meta, dict) else {}


def _grade_id(cell):
    gid = _nbgrader(cell).get("grade_id")
    return gid if isinstance(gid, str) else None


def _is_solution(cell):
    return bool(_nbgrader(cell).get("solution"))


def _clean(cell, *, nbgrader=None):
    """A copy without outputs, whose nbgrader metadata is `nbgrader` (the
    instructor's) or none: a student's cell cannot claim to be a grade cell."""
    cell = nbformat.from_dict(dict(cell))
    metadata = cell.get("metadata")
    cell.metadata = {k: v for k, v in (metadata.items() if isinstance(metadata, dict) else ())
                     if k != "nbgrader"}
    if nbgrader is not None:
        cell.metadata["nbgrader"] = nbformat.from_dict(dict(nbgrader))
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    return cell


def _as_is(cell):
    """What makes two cells the same cell as written: type and source (a hand-in's
    source may be anything JSON holds)."""
    source = cell.get("source")
    return str(cell.get("cell_type")), source if isinstance(source, str) else repr(source)


def _source_chars(cell):
    source = cell.get("source", "")
    return len(source) if isinstance(source, str) else sum(len(str(s)) for s in source)


def _within_limits(extras_after):
    """({place: added cells kept}, [added cells dropped]): in notebook order, the
    added cells that fit MAX_ADDED_CELLS and MAX_ADDED_CHARS."""
    kept, dropped, count, chars = {}, [], 0, 0
    for place, cells in extras_after.items():
        kept[place] = []
        for cell in cells:
            count, chars = count + 1, chars + _source_chars(cell)
            if count > MAX_ADDED_CELLS or chars > MAX_ADDED_CHARS:
                dropped.append(cell)
            else:
                kept[place].append(cell)
    return kept, dropped


def merge_handin(*, source_nb, release_nb, handin_nb):
    """Return (notebook to run, notes for the student's feedback).

    source_nb: the instructor's notebook (hidden tests included);
    release_nb: what students got (stubs for unanswered solution cells);
    handin_nb: the student's notebook, parsed.
    """
    notes = []
    release_cells = {_grade_id(c): c for c in release_nb.cells if _grade_id(c)}
    source_ids = [_grade_id(c) for c in source_nb.cells]
    handed_in = {}
    extras_after = {None: []}
    previous_known = None
    for cell in handin_nb.cells:
        gid = _grade_id(cell)
        if gid is not None and gid in source_ids and gid not in handed_in:
            handed_in[gid] = cell
            previous_known = gid
            extras_after.setdefault(gid, [])
        else:
            extras_after.setdefault(previous_known, []).append(cell)

    extras_after, dropped = _within_limits(extras_after)
    if dropped:
        added = sum(len(cells) for cells in extras_after.values()) + len(dropped)
        notes.append(f"{ADDED_CELLS_DROPPED} {added} cells of its own; the grader kept the "
                     f"first {added - len(dropped)} (at most {MAX_ADDED_CELLS} cells and "
                     f"{MAX_ADDED_CHARS} characters) and did not run or show the other "
                     f"{len(dropped)}")
    merged = [_clean(c) for c in extras_after[None]]
    untouched = {}  # {(type, source): copies} of the hand-in's own cells, as they are
    for cells in extras_after.values():
        for c in cells:
            untouched[_as_is(c)] = untouched.get(_as_is(c), 0) + 1
    for cell in source_nb.cells:
        gid = _grade_id(cell)
        if gid is None:
            kept = untouched.get(_as_is(cell), 0)
            if kept:  # the hand-in's own copy is among its cells, where the student left it
                untouched[_as_is(cell)] = kept - 1
            else:
                merged.append(_clean(cell))
            continue
        if _is_solution(cell):
            answer = handed_in.get(gid)
            if answer is None:
                notes.append(f"answer cell {gid} is missing from the hand-in: graded as unanswered")
                # never the instructor's solution: an empty cell if the release lacks it
                answer = release_cells.get(gid) or {**cell, "source": ""}
            merged.append(_clean(answer, nbgrader=_nbgrader(cell)))
        else:
            if gid is not None:
                mine = handed_in.get(gid)
                released = release_cells.get(gid)
                if mine is None:
                    notes.append(f"cell {gid} was deleted; the original was restored")
                elif released is not None and mine.get("source") != released.get("source"):
                    notes.append(f"cell {gid} was edited; the original was restored")
            merged.append(_clean(cell, nbgrader=_nbgrader(cell)))
        merged.extend(_clean(c) for c in extras_after.get(gid, []))

    notebook = nbformat.v4.new_notebook(metadata=dict(source_nb.metadata))
    for index, cell in enumerate(merged):
        cell["id"] = f"graded-{index}"
    notebook.cells = merged
    return notebook, notes
