"""Rebuilding a hand-in for grading: what is kept from the student, what comes back
from the instructor's notebook, and the notes the student reads.

Each test fails on a small bug in autograder/grading/merge.py (`make mutation`). The
notebooks are made here: a source notebook with text, an answer cell, a visible
test and a hidden test, its release (hidden test stripped, answer stubbed) and
hand-ins edited the way students edit them.
"""

import copy

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from autograder.course import EXAMPLES_DIR
from autograder.grading import merge
from autograder.grading.merge import merge_handin
from conftest import REPO


def _meta(gid, **extra):
    return {"nbgrader": {"grade_id": gid, "locked": True, "solution": False, "grade": False,
                         **extra}}


def _source():
    nb = new_notebook(cells=[
        new_markdown_cell("Write `double(x)`.", metadata=_meta("intro")),
        new_code_cell("def double(x):\n    return 2 * x",
                      metadata=_meta("answer", locked=False, solution=True)),
        new_code_cell("assert double(3) == 6\n### BEGIN HIDDEN TESTS\nassert double(5) == 10\n"
                      "### END HIDDEN TESTS",
                      metadata=_meta("test", grade=True, points=2)),
        new_markdown_cell("Now halve it."),  # a cell the instructor left without an id
        new_code_cell("def half(x):\n    return x / 2",
                      metadata=_meta("answer2", locked=False, solution=True)),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def _release():
    nb = _source()
    nb.cells[1].source = "def double(x):\n    raise NotImplementedError()"
    nb.cells[2].source = "assert double(3) == 6"
    nb.cells[4].source = "def half(x):\n    raise NotImplementedError()"
    return nb


def _handin():
    """The release as a student hands it in: both answers written, outputs kept, the
    instructor's text without an id deleted (cells: intro, answer, test, answer2)."""
    nb = _release()
    nb.cells[1].source = "def double(x):\n    return x + x"
    nb.cells[1].outputs = [new_output("stream", name="stdout", text="hi\n")]
    nb.cells[1].execution_count = 3
    nb.cells[4].source = "def half(x):\n    return x * 0.5"
    del nb.cells[3]
    return nb


def _merge(handin, source=None, release=None):
    return merge_handin(source_nb=source or _source(), release_nb=release or _release(),
                        handin_nb=handin)


def _sources(nb):
    return [c.source for c in nb.cells]


def test_a_cell_without_an_id_the_student_kept_is_run_once_where_the_student_left_it():
    """The instructor's text without nbgrader metadata, still in the hand-in as released,
    is the student's copy: graded once, not once more from the source (nbgrader's
    user-guide course had every such cell twice); a cell the student merely moved is
    where the student put it."""
    handin = _release()
    handin.cells[1].source = "def double(x):\n    return x + x"
    handin.cells.insert(1, handin.cells.pop(3))  # "Now halve it." moved up
    merged, notes = _merge(handin)
    assert notes == []
    assert _sources(merged) == [
        "Write `double(x)`.", "Now halve it.", "def double(x):\n    return x + x",
        _source().cells[2].source, "def half(x):\n    raise NotImplementedError()"]
    assert [c.metadata.get("nbgrader", {}).get("grade_id") for c in merged.cells] == [
        "intro", None, "answer", "test", "answer2"]


def test_an_honest_hand_in_runs_the_hidden_tests_with_the_students_answers():
    """The student's answers and the instructor's hidden test make up the run; no note."""
    merged, notes = _merge(_handin())
    assert notes == []
    assert _sources(merged) == [
        "Write `double(x)`.", "def double(x):\n    return x + x",
        _source().cells[2].source, "Now halve it.", "def half(x):\n    return x * 0.5"]
    assert [c.metadata.get("nbgrader", {}).get("grade_id") for c in merged.cells] == [
        "intro", "answer", "test", None, "answer2"]


def test_cells_get_fresh_ids_and_the_notebook_the_sources_metadata():
    """Ids are graded-0, graded-1, ... in order; the kernelspec is the instructor's."""
    handin = _handin()
    handin.metadata["kernelspec"] = {"name": "evil", "display_name": "x", "language": "x"}
    merged, _ = _merge(handin)
    assert [c["id"] for c in merged.cells] == [f"graded-{i}" for i in range(5)]
    assert merged.metadata["kernelspec"]["name"] == "python3"
    nbformat.validate(merged)


def test_outputs_and_counts_of_the_hand_in_are_dropped_and_the_hand_in_is_untouched():
    """A hand-in's stored outputs must not reach the graded run (they could fake a pass),
    and the student's notebook object itself is not modified."""
    handin = _handin()
    before = copy.deepcopy(handin)
    merged, _ = _merge(handin)
    answer = merged.cells[1]
    assert answer.outputs == [] and answer.execution_count is None
    assert all(c.outputs == [] and c.execution_count is None
               for c in merged.cells if c.cell_type == "code")
    assert "outputs" not in merged.cells[0] and "execution_count" not in merged.cells[0]
    assert handin == before


def test_a_students_metadata_is_kept_but_not_the_nbgrader_part_they_wrote():
    """The answer's nbgrader metadata is the instructor's (a student can't turn an answer
    into a grade cell worth 100 points); other metadata (tags) stays."""
    handin = _handin()
    handin.cells[1].metadata["tags"] = ["mine"]
    handin.cells[1].metadata["nbgrader"].update(grade=True, points=100)
    merged, _ = _merge(handin)
    answer = merged.cells[1]
    assert answer.metadata["tags"] == ["mine"]
    assert answer.metadata["nbgrader"] == _source().cells[1].metadata["nbgrader"]
    assert answer.source == "def double(x):\n    return x + x"


def test_a_cell_the_student_added_keeps_its_place_and_cannot_claim_to_be_graded():
    """An added cell follows the instructor's cell it followed; nbgrader metadata it
    claims (a forged grade cell) is stripped, its other metadata kept."""
    handin = _handin()
    forged = new_code_cell("print('mine')", metadata={
        "tags": ["scratch"], "nbgrader": {"grade": True, "points": 50, "grade_id": "fake"}})
    forged.outputs = [new_output("stream", name="stdout", text="mine\n")]
    handin.cells.insert(2, forged)
    merged, notes = _merge(handin)
    assert notes == []
    assert _sources(merged)[:4] == ["Write `double(x)`.", "def double(x):\n    return x + x",
                                    "print('mine')", _source().cells[2].source]
    added = merged.cells[2]
    assert added.metadata == {"tags": ["scratch"]}
    assert added.outputs == [] and added.execution_count is None


def test_cells_added_before_every_known_cell_come_first_and_only_once():
    """Cells above the first known one go to the top, and are not repeated after the
    instructor's cells that have no grade id."""
    handin = _handin()
    handin.cells.insert(0, new_code_cell("import numpy as np"))
    merged, _ = _merge(handin)
    assert _sources(merged)[0] == "import numpy as np"
    assert _sources(merged).count("import numpy as np") == 1
    assert len(merged.cells) == 6


def test_a_helper_cell_without_an_id_is_kept_when_the_source_has_cells_without_ids():
    """A bug found here: when the instructor's notebook held a cell without a grade id
    (common in courses not written for this grader), the student's first cell without
    one was taken for it and dropped, so the helper the answers use never ran, and the
    student's later added cells moved to the top."""
    handin = _handin()
    handin.cells.insert(2, new_code_cell("helper = 1"))
    handin.cells.append(new_code_cell("late = 2"))
    merged, notes = _merge(handin)
    assert notes == []
    assert _sources(merged)[:4] == ["Write `double(x)`.", "def double(x):\n    return x + x",
                                    "helper = 1", _source().cells[2].source]
    assert _sources(merged)[-1] == "late = 2"


def test_a_cell_added_after_the_last_answer_stays_at_the_end():
    """A cell added at the end is not lost nor moved up."""
    handin = _handin()
    handin.cells.append(new_markdown_cell("my notes"))
    merged, _ = _merge(handin)
    assert _sources(merged)[-2:] == ["def half(x):\n    return x * 0.5", "my notes"]


def test_a_copy_of_an_answer_cell_is_kept_as_an_added_cell_not_as_the_answer():
    """The first cell with an answer's id is the answer; a second copy runs after it as
    a cell of the student's, without nbgrader metadata."""
    handin = _handin()
    twin = copy.deepcopy(handin.cells[1])
    twin.source = "def double(x):\n    return 0"
    handin.cells.insert(2, twin)
    merged, _ = _merge(handin)
    assert _sources(merged)[1:3] == ["def double(x):\n    return x + x",
                                     "def double(x):\n    return 0"]
    assert "nbgrader" not in merged.cells[2].metadata


def test_an_answer_cell_missing_from_the_hand_in_is_graded_as_the_release_stub():
    """The deleted answer runs as the release's stub (never the instructor's solution),
    and the student is told."""
    handin = _handin()
    del handin.cells[3]
    merged, notes = _merge(handin)
    assert notes == ["answer cell answer2 is missing from the hand-in: graded as unanswered"]
    assert merged.cells[4].source == "def half(x):\n    raise NotImplementedError()"
    assert merged.cells[4].metadata["nbgrader"]["grade_id"] == "answer2"


def test_an_answer_missing_from_the_hand_in_and_the_release_is_not_the_solution():
    """A bug found here: an answer cell added to source after the release (so neither
    the release nor the hand-in has it) ran as the instructor's own solution, giving
    its points away; it is graded as unanswered, as the note says."""
    release = _release()
    del release.cells[4]
    handin = _handin()
    del handin.cells[3]
    merged, notes = _merge(handin, release=release)
    assert notes == ["answer cell answer2 is missing from the hand-in: graded as unanswered"]
    assert merged.cells[4].source == ""
    assert merged.cells[4].metadata["nbgrader"]["grade_id"] == "answer2"
    assert merged.cells[4].cell_type == "code" and merged.cells[4].outputs == []


def test_a_deleted_test_cell_is_restored_with_a_note():
    """Deleting a test cell cannot skip it: it comes back, with its points, and the
    student is told."""
    handin = _handin()
    del handin.cells[2]
    merged, notes = _merge(handin)
    assert notes == ["cell test was deleted; the original was restored"]
    assert merged.cells[2].source == _source().cells[2].source
    assert merged.cells[2].metadata["nbgrader"]["points"] == 2


def test_an_edited_test_cell_is_restored_with_a_note():
    """A student who weakens the visible test gets the instructor's test back, and a
    note; an unedited one gets no note."""
    handin = _handin()
    handin.cells[2].source = "pass"
    handin.cells[2].metadata["nbgrader"]["points"] = 99
    merged, notes = _merge(handin)
    assert notes == ["cell test was edited; the original was restored"]
    assert merged.cells[2].source == _source().cells[2].source
    assert merged.cells[2].metadata["nbgrader"]["points"] == 2


def test_an_instructors_cell_missing_from_the_release_is_restored_without_a_note():
    """A cell the release lacks (added to source after release) but that a hand-in has
    is restored from source: nothing to compare, so no note, and no crash."""
    handin = _handin()
    release = _release()
    del release.cells[2]
    handin.cells[2].source = "pass"
    merged, notes = _merge(handin, release=release)
    assert notes == []
    assert merged.cells[2].source == _source().cells[2].source


def test_broken_metadata_in_a_hand_in_means_no_nbgrader_metadata():
    """Metadata that is not a dict, an nbgrader entry that is not a dict or a grade id
    that is not a string: the cell is the student's own, not the answer."""
    handin = _handin()
    # the answer cell, kept but with a number for grade id: it is not the answer
    handin.cells[1].metadata["nbgrader"]["grade_id"] = 7
    handin.cells[3].metadata["nbgrader"] = "answer2"
    handin.cells.append(new_code_cell("x = 1", metadata={"nbgrader": None}))
    merged, notes = merge_handin(source_nb=_source(), release_nb=_release(), handin_nb=handin)
    assert notes == ["answer cell answer is missing from the hand-in: graded as unanswered",
                     "answer cell answer2 is missing from the hand-in: graded as unanswered"]
    # the student's cell is kept as a cell of theirs, right after the intro it followed
    assert _sources(merged)[:3] == ["Write `double(x)`.", "def double(x):\n    return x + x",
                                    "def double(x):\n    raise NotImplementedError()"]
    assert merged.cells[1].metadata == {}
    assert merged.cells[2].metadata["nbgrader"]["grade_id"] == "answer"
    assert _sources(merged)[3:] == [_source().cells[2].source, "def half(x):\n    return x * 0.5",
                                    "x = 1", "Now halve it.",
                                    "def half(x):\n    raise NotImplementedError()"]
    assert merged.cells[4].metadata == {} and merged.cells[5].metadata == {}


def test_a_hand_in_cell_whose_metadata_is_a_list_does_not_crash_the_merge():
    """A bug found here: metadata that is a list (nbformat only warns about it) made the
    merge raise, so the whole hand-in ended as a grader error instead of being graded."""
    handin = _handin()
    handin.cells.append(new_code_cell("x = 1"))
    handin.cells[-1]["metadata"] = ["not", "a", "dict"]
    handin.cells[1]["metadata"] = "answer"  # the answer, unrecognisable: kept as added
    merged, notes = _merge(handin)
    assert notes == ["answer cell answer is missing from the hand-in: graded as unanswered"]
    assert _sources(merged)[1:3] == ["def double(x):\n    return x + x",
                                     "def double(x):\n    raise NotImplementedError()"]
    assert merged.cells[1].metadata == {} and merged.cells[-1].metadata == {}
    assert _sources(merged)[-1] == "x = 1"


def test_a_solution_flag_a_student_set_does_not_make_a_test_cell_an_answer():
    """Only the instructor's metadata says which cells are answers: a hand-in that marks
    the test cell as a solution still gets the instructor's test back."""
    handin = _handin()
    handin.cells[2].metadata["nbgrader"]["solution"] = True
    handin.cells[2].source = "pass"
    merged, notes = _merge(handin)
    assert merged.cells[2].source == _source().cells[2].source
    assert notes == ["cell test was edited; the original was restored"]


def test_added_cells_past_the_limits_are_neither_run_nor_shown_and_the_answers_stay():
    """A flood of added markdown cells (100 000 of them, 13 MB, once kept a grader busy
    for minutes): the first MAX_ADDED_CELLS are kept, in order, the rest dropped with
    a note."""
    handin = _handin()
    flood = [new_markdown_cell(f"note {i} " + "x" * 120) for i in range(5_000)]
    handin.cells[2:2] = flood
    merged, notes = _merge(handin)
    kept = [s for s in _sources(merged) if s.startswith("note ")]
    assert kept == [f"note {i} " + "x" * 120 for i in range(merge.MAX_ADDED_CELLS)]
    assert "def double(x):\n    return x + x" in _sources(merged)
    assert "def half(x):\n    return x * 0.5" in _sources(merged)
    assert notes == [f"the hand-in added 5000 cells of its own; the grader kept the first "
                     f"{merge.MAX_ADDED_CELLS} (at most {merge.MAX_ADDED_CELLS} cells and "
                     f"{merge.MAX_ADDED_CHARS} characters) and did not run or show the other "
                     f"{5_000 - merge.MAX_ADDED_CELLS}"]


def test_added_cells_are_also_bounded_by_their_characters():
    handin = _handin()
    handin.cells.append(new_code_cell("x = 1"))
    handin.cells.append(new_markdown_cell("y" * merge.MAX_ADDED_CHARS))
    merged, notes = _merge(handin)
    assert _sources(merged)[-1] == "x = 1"
    assert notes and notes[0].startswith("the hand-in added 2 cells of its own; the grader "
                                         "kept the first 1 ")


def test_merge_restores_instructor_cells_and_keeps_student_cells():
    source = nbformat.read(REPO / "source/01_the_recipe/01_the_recipe.ipynb", as_version=4)
    release = nbformat.read(REPO / "release/01_the_recipe/01_the_recipe.ipynb", as_version=4)
    handin = nbformat.read(EXAMPLES_DIR / "01_the_recipe" / "gus_edited_tests.ipynb", as_version=4)
    handin.cells = [c for c in handin.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") != "token_var_correct"]
    handin.cells.insert(3, nbformat.v4.new_code_cell("helper = 1"))
    merged, notes = merge_handin(source_nb=source, release_nb=release, handin_nb=handin)
    text = "\n".join(c.source for c in merged.cells)
    assert "check_layer_norm_batches(layer_norm)" in text
    assert "check_token_var(token_var)" in text
    assert "helper = 1" in text
    assert "x.var() + eps" in text  # the student's own answer is kept
    assert any("ln_handles_batches was edited" in n for n in notes)
    assert any("token_var_correct was deleted" in n for n in notes)
