"""Similar answers across a class (`python -m autograder similarity`), on a planted class:
the sample class of unit 01, whose answers were written independently (the perfect,
the unusual-correct and the typical-mistake hand-ins), honest look-alikes as a class
writes them (short correct answers that call the same functions), copies of some
answers disguised the ways students disguise copies, a ring of students handing in one
answer, and stubs. A copy must rank above every honest pair of its exercise; blank,
stub and as-released answers are never paired; what only the release wrote scores
nothing; and the report changes nothing a student receives.
"""

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from itertools import combinations

import nbformat
import pytest

import labbrowser
from autograder import cli
from autograder.course import EXAMPLES_DIR, REPO_ROOT, Course
from autograder.results import similarity as sim

A = "01_the_recipe"
NB = f"{A}.ipynb"
# Written independently of one another (the class's other hand-ins reuse the perfect
# one's code with a slip in it, as its typical mistakes).
SAMPLES = ["ada_perfect", "ben_unusual", "kim_unusual_correct", "fay_loops", "dee_blank"]

# (student, the answer cell, an honest one-liner): correct answers that look alike, each
# written on its own, as a class writes them.
LOOKALIKES = [
    ("val_centred_squares", "token_var_answer",
     "def token_var(x):\n    return ((x - x.mean(-1, keepdims=True)) ** 2).mean(-1)\n"),
    ("wes_var_method", "token_var_answer", "def token_var(x):\n    return x.var(axis=-1)\n"),
    ("zoe_var_positional", "token_var_answer", "def token_var(x):\n    return np.var(x, -1)\n"),
    ("yul_mean_of_squares", "token_var_answer",
     "def token_var(x):\n    return np.mean((x - np.mean(x, -1, keepdims=True)) ** 2, -1)\n"),
    ("vic_mean_method", "token_mean_answer", "def token_mean(x):\n    return x.mean(axis=-1)\n"),
    ("wyn_np_mean", "token_mean_answer", "def token_mean(x):\n    return np.mean(x, axis=-1)\n"),
    ("zak_sum_over_count", "token_mean_answer",
     "def token_mean(x):\n    return x.sum(-1) / x.shape[-1]\n"),
]
HONEST = SAMPLES + [student for student, _, _ in LOOKALIKES]

# Answers with nothing in them: each stands for a blank answer, never for a pair.
STUBS = [
    ("sam_pass", "token_mean_answer", "def token_mean(x):\n    pass\n"),
    ("sid_todo", "token_mean_answer",
     'def token_mean(x):\n    raise NotImplementedError("todo")\n'),
    ("sky_todo", "token_mean_answer",
     'def token_mean(x):\n    raise NotImplementedError("not yet")  # later\n'),
    ("sol_none", "token_mean_answer", "def token_mean(x):\n    return None\n"),
    ("sun_dots", "token_mean_answer", "def token_mean(x):\n    ...\n"),
    ("sue_placeholder", "shortcut_prediction_answer", "PREDICT_SHORTCUT = None\n"),
    ("sia_placeholder", "shortcut_prediction_answer", "PREDICT_SHORTCUT = None  # pending\n"),
]

# More than 30% of the students who answer chunked_var hand in ben's answer, renamed
# and commented differently by each: a ring, not an idiom.
RING_SOURCE = "ben_unusual"
RING = ["rio_ring", "rox_ring", "rus_ring", "ryn_ring"]
RING_GID = "chunked_var_answer"

# (copier, the honest student copied, the answer cell, the disguised copy)
PLANTED = [
    ("pat_renamed", "kim_unusual_correct", "layer_norm_answer", '''\
class WidthError(ValueError):
    """Scale or shift has the wrong length."""


def layer_norm(x, gamma, beta, eps=1e-5):
    """Normalise every row."""
    arr = np.asarray(x, dtype=np.float64)
    n = arr.shape[-1]
    g = np.asarray(gamma, dtype=arr.dtype)
    b = np.asarray(beta, dtype=arr.dtype)
    if g.shape != (n,) or b.shape != (n,):
        raise WidthError(f"need {n} entries")
    out = np.empty_like(arr)
    rows, res = arr.reshape(-1, n), out.reshape(-1, n)
    for i in range(rows.shape[0]):
        r = rows[i]
        inv = 1 / np.sqrt(token_var(r) + eps)
        res[i] = g * ((r - token_mean(r)) * inv) + b
    return out
'''),
    ("quinn_commented", "ben_unusual", "token_var_answer", '''\
def token_var(x):
    # my own streaming version
    x = np.asarray(x)

    # make ints into floats
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)  # promote
    mean = np.zeros(x.shape[:-1], dtype=x.dtype)   # running mean
    m2 = np.zeros(x.shape[:-1], dtype=x.dtype)     # running squares
    for k in range(x.shape[-1]):
        # one feature at a time
        delta = x[..., k] - mean
        mean = mean + delta / (k + 1)
        m2 = m2 + delta * (x[..., k] - mean)

    return m2 / x.shape[-1]  # biased
'''),
    ("ray_reordered", "kim_unusual_correct", "layer_norm_answer", '''\
class FeatureCountError(ValueError):
    """gamma or beta does not have one entry per feature."""


def layer_norm(x, gamma, beta, eps=1e-5):
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    beta = np.asarray(beta, dtype=x.dtype)
    gamma = np.asarray(gamma, dtype=x.dtype)
    if beta.shape != (d,) or gamma.shape != (d,):
        raise FeatureCountError(f"gamma and beta need {d} entries each")
    y = np.empty_like(x)
    outputs, tokens = y.reshape(-1, d), x.reshape(-1, d)
    for row in range(tokens.shape[0]):
        token = tokens[row]
        scale = 1 / np.sqrt(token_var(token) + eps)
        outputs[row] = beta + gamma * ((token - token_mean(token)) * scale)
    return y
'''),
    ("sol_comprehension", "kim_unusual_correct", "token_mean_answer", '''\
class NotATokenError(ValueError):
    """My own error for an input with no feature axis."""


def token_mean(x):
    """Mean of each token's features, one token at a time."""
    x = np.asarray(x)
    if x.ndim == 0:
        raise NotATokenError("a token needs a feature axis")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    means = np.empty(x.shape[:-1], dtype=x.dtype)
    for index in np.ndindex(*x.shape[:-1]):
        means[index] = sum([value for value in x[index]]) / x.shape[-1]
    return means
'''),
    ("xan_renamed_oneliner", "val_centred_squares", "token_var_answer",
     "def token_var(t):\n    return ((t - t.mean(-1, keepdims=True)) ** 2).mean(-1)  # var\n"),
    ("yan_renamed_oneliner", "wyn_np_mean", "token_mean_answer",
     "def token_mean(tokens):\n    return np.mean(tokens, axis=-1)\n"),
    ("tam_helper", "ben_unusual", "token_var_answer", '''\
def _step(x, k, mean, m2):
    delta = x[..., k] - mean
    mean = mean + delta / (k + 1)
    m2 = m2 + delta * (x[..., k] - mean)
    return mean, m2


def token_var(x):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    mean = np.zeros(x.shape[:-1], dtype=x.dtype)
    m2 = np.zeros(x.shape[:-1], dtype=x.dtype)
    for k in range(x.shape[-1]):
        mean, m2 = _step(x, k, mean, m2)
    return m2 / x.shape[-1]
'''),
]


def _handin(base, answers):
    notebook = nbformat.read(EXAMPLES_DIR / A / f"{base}.ipynb", as_version=4)
    for cell in notebook.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            cell.source = answers[gid]
    return notebook


def _put(course, student, notebook):
    folder = course.submitted / student / A
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, folder / NB)


def _answer(base, gid):
    notebook = _handin(base, {})
    return next(cell.source for cell in notebook.cells
                if cell.metadata.get("nbgrader", {}).get("grade_id") == gid)


def _ring_copy(number):
    """The ring's answer as its `number`th member hands it in: names of its own."""
    text = _answer(RING_SOURCE, RING_GID)
    for old, new in (("zeros", f"empty{number}"), ("column", f"col{number}"),
                     ("stats", f"acc{number}")):
        text = re.sub(rf"(?<![.\w]){old}\b", new, text)  # the name, not np.zeros
    return text.replace("    return", f"    # member {number}\n    return")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    course = Course(root)
    shutil.copytree(REPO_ROOT / "release" / A, course.release / A)
    for student in SAMPLES:
        _put(course, student, _handin(student, {}))
    for student, gid, text in LOOKALIKES + STUBS:
        _put(course, student, _handin("dee_blank", {gid: text}))
    for number, student in enumerate(RING):
        _put(course, student, _handin("dee_blank", {RING_GID: _ring_copy(number)}))
    # handed back exactly as released: never paired
    _put(course, "uma_unchanged", nbformat.read(course.release / A / NB, as_version=4))
    for copier, _, gid, text in PLANTED:
        _put(course, copier, _handin("dee_blank", {gid: text}))
    report = sim.similarity(course=course, assignment=A)
    return course, {exercise.grade_id: pairs for exercise, (pairs, _) in
                    report.exercises.items()}, \
        {exercise.grade_id: notes for exercise, (_, notes) in report.exercises.items()}


def _key(pair):
    return frozenset((pair.a.owner, pair.b.owner))


@pytest.mark.parametrize("copier, copied, gid", [p[:3] for p in PLANTED],
                         ids=[p[0] for p in PLANTED])
def test_a_disguised_copy_ranks_above_every_honest_pair_of_its_exercise(planted, copier,
                                                                         copied, gid):
    _, pairs, _ = planted
    scores = {_key(pair): pair.score for pair in pairs[gid]}
    copy_score = scores.get(frozenset((copier, copied)))
    assert copy_score is not None, f"{copier} and {copied} were not paired"
    honest = [score for key, score in scores.items() if key <= set(HONEST)]
    assert all(copy_score > score for score in honest), (copy_score, honest)
    assert copy_score >= 0.6


def test_independent_correct_answers_are_not_paired_as_copies(planted):
    """The perfect and the two unusual-correct hand-ins' answers to the exercises the
    copies were planted in were written independently: the perfect one shares nothing
    listed with either."""
    _, pairs, _ = planted
    for gid in {gid for _, _, gid, _ in PLANTED}:
        for pair in pairs[gid]:
            assert _key(pair) not in ({"ada_perfect", "ben_unusual"},
                                      {"ada_perfect", "kim_unusual_correct"}), (gid, pair.score)


def test_blank_and_unchanged_answers_are_never_paired(planted):
    _, pairs, exclusions = planted
    for gid, listed in pairs.items():
        for pair in listed:
            assert not {"dee_blank", "uma_unchanged"} & _key(pair), gid
    assert {"dee_blank", "uma_unchanged"} <= set(exclusions["token_var_answer"].unanswered)


def test_stub_answers_count_as_blank_and_are_never_paired(planted):
    """`pass`, `...`, `return None`, `raise NotImplementedError(...)` (with any message
    or comment) and the release's placeholder with its comment changed: blank."""
    _, pairs, exclusions = planted
    stubs = {student for student, _, _ in STUBS}
    for gid, listed in pairs.items():
        for pair in listed:
            assert not stubs & _key(pair), (gid, _key(pair))
    for student, gid, _ in STUBS:
        assert student in exclusions[gid].unanswered, (student, gid)


def test_distinct_correct_one_liners_are_not_paired(planted):
    """One-liners that call the same functions differently, each written on its own,
    share pieces but not the whole line: no pair of them is listed."""
    _, pairs, _ = planted
    for gid in {gid for _, gid, _ in LOOKALIKES}:
        one_liners = {student for student, at, _ in LOOKALIKES if at == gid} | {"fay_loops"}
        listed = [_key(pair) for pair in pairs[gid] if _key(pair) <= one_liners]
        assert listed == [], gid


def test_a_one_liner_much_of_the_class_writes_is_an_idiom():
    """Five of twelve write the textbook one-liner (some renamed): not evidence, never
    paired; a renamed copy of a rarer one-liner still is."""
    exercise = sim.Exercise("token_mean_answer", NB, "code", "def token_mean(x):\n"
                            "    raise NotImplementedError()")
    textbook = ["def token_mean(x):\n    return x.mean(axis=-1)\n",
                "def token_mean(t):\n    return t.mean(axis=-1)\n"]
    rarer = ["def token_mean(x):\n    return np.add.reduce(x, axis=-1) / np.shape(x)[-1]\n",
             "def token_mean(v):\n    return np.add.reduce(v, axis=-1) / np.shape(v)[-1]\n"]
    others = ["np.mean(x, axis=-1)", "np.average(x, axis=-1)", "x.sum(-1) / x.shape[-1]",
              'np.einsum("...d->...", x) / x.shape[-1]', "np.nanmean(x, -1)"]
    answers = [sim.Answer(f"t{k}", sim.THIS_TERM, textbook[k % 2]) for k in range(5)]
    answers += [sim.Answer(f"r{k}", sim.THIS_TERM, text) for k, text in enumerate(rarer)]
    answers += [sim.Answer(f"o{k}", sim.THIS_TERM, f"def token_mean(x):\n    return {text}\n")
                for k, text in enumerate(others)]
    pairs, notes = sim.compare_exercise(exercise, answers)
    assert [_key(pair) for pair in pairs] == [frozenset({"r0", "r1"})]
    assert pairs[0].score == 1.0 and notes.common_fingerprints > 0


def test_a_ring_handing_in_one_answer_is_paired_and_reported(planted):
    """Five of the eight students who answer chunked_var hand in one answer (renamed,
    commented): more than 30% of the class, yet every pair of them is listed, and the
    group is named as a ring."""
    course, pairs, exclusions = planted
    members = set(RING) | {RING_SOURCE}
    scores = {_key(pair): pair.score for pair in pairs[RING_GID]}
    for a, b in combinations(sorted(members), 2):
        assert scores.get(frozenset((a, b)), 0) >= 0.9, (a, b)
    assert exclusions[RING_GID].rings == [sorted(members)]
    page = (course.reports / A / "similarity.html").read_text()
    assert "Ring: 5 students hand in one identical answer" in page


LEAK = ("def token_var(x):\n    x = np.asarray(x, dtype=np.float64)\n"
        "    return ((x - x.mean(-1, keepdims=True)) ** 2).mean(-1)\n")
OWN_ANSWERS = [
    "def token_var(x):\n    total = np.zeros(np.shape(x)[:-1])\n    for i in range(5):\n"
    f"        total = total + np.take(x, i, axis=-1) ** {k}\n    return total / {k + 1}\n"
    for k in range(5)]


def test_matches_with_earlier_terms_and_known_solutions_keep_the_class_idioms():
    """Half the class hands in a short leaked answer, which within the class is an
    idiom (left out); against the leak itself and an earlier term that handed it in,
    each copy still matches, on all its fingerprints."""
    exercise = sim.Exercise("token_var_answer", NB, "code", "def token_var(x):\n"
                            "    raise NotImplementedError()")
    copies = [sim.Answer(f"leak{k}", sim.THIS_TERM, LEAK.replace("x", "xs" if k else "x"))
              for k in range(5)]
    others = [sim.Answer(f"own{k}", sim.THIS_TERM, text) for k, text in enumerate(OWN_ANSWERS)]
    leak = sim.Answer("known: forum.ipynb", sim.KNOWN, LEAK)
    old = sim.Answer("term-2025: old", sim.EARLIER_TERM, LEAK.replace("x", "v"))
    pairs, notes = sim.compare_exercise(exercise, copies + others + [leak, old])
    assert notes.common_fingerprints > 0
    listed = {_key(pair): pair.score for pair in pairs}
    assert not [key for key in listed if key <= {a.owner for a in copies}]
    for copy in copies:
        for outside in (leak, old):
            assert listed.get(frozenset((copy.owner, outside.owner)), 0) >= 0.9, \
                (copy.owner, outside.owner)


def test_what_only_the_release_wrote_scores_nothing():
    """Two answers that share nothing but the release's own lines (signature,
    docstring) are not paired; the same two with a shared body are."""
    exercise = sim.Exercise("token_var_answer", NB, "code", '''\
def token_var(x):
    """Biased variance of each token's features. x: (..., d) -> (...)"""
    # YOUR CODE HERE
    raise NotImplementedError()''')
    head = ('def token_var(x):\n'
            '    """Biased variance of each token\'s features. x: (..., d) -> (...)"""\n')
    first = sim.Answer("a", "this term", head + "    return np.mean(np.square(x - np.mean("
                       "x, -1, keepdims=True)), -1)\n")
    second = sim.Answer("b", "this term", head + "    total = 0\n    for value in np.ravel("
                        "x):\n        total += value\n    return total\n")
    pairs, exclusions = sim.compare_exercise(exercise, [first, second])
    assert pairs == [] and exclusions.scaffold_lines == 4
    copy = sim.Answer("c", "this term", first.text.replace("x", "t"))
    pairs, _ = sim.compare_exercise(exercise, [first, second, copy])
    assert [(_key(p), round(p.score, 2)) for p in pairs] == [(frozenset("ac"), 1.0)]


def test_an_idiom_most_of_the_class_shares_is_not_evidence():
    """A line every one of ten answers holds is left out as common; two answers that
    also share a long body of their own are still paired."""
    exercise = sim.Exercise("e", NB, "code", "def f(x):\n    raise NotImplementedError()")
    idiom = "    x = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1]).copy()\n"
    bodies = [f"    return np.sum(x ** {k}, axis={k % 3}) * {k}.0 - np.max(x)\n"
              for k in range(10)]
    answers = [sim.Answer(f"s{k}", "this term", "def f(x):\n" + idiom + body)
               for k, body in enumerate(bodies)]
    pairs, exclusions = sim.compare_exercise(exercise, answers)
    assert pairs == [] and exclusions.common_fingerprints > 0
    shared = ("    acc = np.zeros_like(x)\n    for row in range(x.shape[0]):\n"
              "        acc[row] = np.cumsum(np.abs(x[row]) ** 1.5)[::-1]\n    return acc\n")
    answers[3].text = answers[4].text = "def f(x):\n" + idiom + shared
    pairs, _ = sim.compare_exercise(exercise, answers)
    assert [_key(p) for p in pairs] == [frozenset({"s3", "s4"})]


def test_written_answers_are_compared_as_text():
    exercise = sim.Exercise("why_answer", NB, "markdown", "YOUR ANSWER HERE")
    said = ("The shortcut subtracts two large nearly equal numbers, so float32 loses "
            "every digit of the variance once the offset is about a thousand times the "
            "spread of the features.")
    copy = sim.Answer("b", "this term", said.replace("The shortcut", "Because the shortcut"))
    other = sim.Answer("c", "this term", "Cancellation: E[x^2] and E[x]^2 agree in their "
                       "leading digits, and the difference keeps only rounding error.")
    pairs, _ = sim.compare_exercise(exercise, [sim.Answer("a", "this term", said), copy,
                                               other])
    assert [_key(p) for p in pairs] == [frozenset("ab")] and pairs[0].score > 0.8
    assert pairs[0].spans_a and pairs[0].spans_b


def test_a_phrase_most_of_the_class_writes_is_not_evidence_in_text_answers():
    """Ten written answers open with the phrase the lesson uses; it is left out, and
    only the two that share a paragraph of their own are paired."""
    exercise = sim.Exercise("why_answer", NB, "markdown", "YOUR ANSWER HERE")
    phrase = "Catastrophic cancellation in float32 arithmetic. "
    reasons = ["the offset", "a large mean", "the bias term", "big activations",
               "an outlier channel", "the residual stream", "a shifted input",
               "warm-up steps", "a bad seed", "loss spikes"]
    answers = [sim.Answer(f"s{k}", sim.THIS_TERM, phrase + f"It comes from {reason}.")
               for k, reason in enumerate(reasons)]
    pairs, notes = sim.compare_exercise(exercise, answers)
    assert pairs == [] and notes.common_fingerprints > 0
    own = ("Squaring the mean first keeps only the leading digits that the two terms "
           "share, so the difference is rounding error once the offset is large.")
    answers[2].text = answers[7].text = phrase + own
    pairs, _ = sim.compare_exercise(exercise, answers)
    assert [_key(pair) for pair in pairs] == [frozenset({"s2", "s7"})]
    marked = " ".join(answers[2].text[start:end] for start, end in pairs[0].spans_a)
    assert "Catastrophic" not in marked and "Squaring" in marked


def test_earlier_terms_and_known_solutions_are_matched_and_labelled(planted, tmp_path):
    shutil.copytree(planted[0].root, tmp_path / "course")
    course = Course(tmp_path / "course")
    earlier = tmp_path / "term-2025"
    folder = earlier / "submitted" / "old_ben" / A
    folder.mkdir(parents=True)
    shutil.copy(EXAMPLES_DIR / A / "ben_unusual.ipynb", folder / NB)
    known = tmp_path / "found-online"
    (known / "forum").mkdir(parents=True)
    shutil.copy(EXAMPLES_DIR / A / "kim_unusual_correct.ipynb", known / "forum" / "hw1.ipynb")
    assert cli.main(["similarity", A, "--course", str(course.root), "--earlier", str(earlier),
                     "--known", str(known)]) == 0
    rows = list(csv.DictReader(open(course.reports / A / "similarity.csv")))
    assert list(rows[0]) == ["exercise", "student_a", "student_b", "score", "lines_a",
                             "lines_b"]
    scores = [float(row["score"]) for row in rows]
    assert scores == sorted(scores, reverse=True)
    against = {(row["exercise"], row["student_a"], row["student_b"]) for row in rows}
    assert ("token_var_answer", "ben_unusual", "term-2025: old_ben") in against
    assert ("token_var_answer", "quinn_commented", "term-2025: old_ben") in against
    assert ("layer_norm_answer", "kim_unusual_correct", "known: forum/hw1.ipynb") in against
    assert all(not row["student_a"].startswith(("term-2025", "known")) for row in rows)


def test_known_notebooks_without_cell_ids_are_matched_by_content(planted, tmp_path):
    """A solution pasted into a fresh notebook has none of the release's cell ids: each
    of its code cells is compared with every exercise's answers, and a match names the
    cell."""
    known = tmp_path / "found-online" / "blog"
    known.mkdir(parents=True)
    fresh = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("My homework, all solutions"),
        nbformat.v4.new_code_cell("import numpy as np"),
        nbformat.v4.new_code_cell(_answer("kim_unusual_correct", "layer_norm_answer")),
        nbformat.v4.new_code_cell(_answer("ben_unusual", "token_var_answer"))])
    nbformat.write(fresh, known / "solutions.ipynb")
    shutil.copytree(planted[0].root, tmp_path / "course")
    assert cli.main(["similarity", A, "--course", str(tmp_path / "course"), "--known",
                     str(tmp_path / "found-online")]) == 0
    rows = csv.DictReader(open(tmp_path / "course" / "reports" / A / "similarity.csv"))
    against = {(row["exercise"], row["student_a"], row["student_b"]) for row in rows
               if float(row["score"]) >= 0.9}
    label = "known: blog/solutions.ipynb, cell"
    assert {("layer_norm_answer", "kim_unusual_correct", f"{label} 3"),
            ("layer_norm_answer", "pat_renamed", f"{label} 3"),
            ("token_var_answer", "ben_unusual", f"{label} 4"),
            ("token_var_answer", "quinn_commented", f"{label} 4")} <= against


@pytest.mark.parametrize("option", ["--known", "--earlier"])
def test_a_missing_known_or_earlier_path_is_a_one_line_refusal(planted, tmp_path, capsys,
                                                              option):
    missing = tmp_path / "no-such-folder"
    assert cli.main(["similarity", A, "--course", str(planted[0].root), option,
                     str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"similarity: {option} {missing}: no such") and err.count("\n") == 1


def test_unreadable_hand_ins_are_listed_as_not_compared(planted, tmp_path, capsys):
    """A hand-in that is not JSON, is empty, has no list of cells, nests too deep to
    read or lacks the notebook is named with its reason on the terminal and in the page;
    the others are compared (the ring among them named too), and the CSV holds pairs
    only."""
    course = Course(tmp_path / "course")
    shutil.copytree(planted[0].root, course.root)
    broken = {"una_not_json": "{\"cells\": [", "vik_empty": "", "xia_no_cells": "[1, 2]",
              "yan_deep": "[" * 100_000}
    for student, text in broken.items():
        (course.submitted / student / A).mkdir(parents=True)
        (course.submitted / student / A / NB).write_text(text)
    (course.submitted / "wil_missing" / A).mkdir(parents=True)
    assert cli.main(["similarity", A, "--course", str(course.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = [line for line in out if line.startswith("not compared: ")]
    assert listed == [
        "not compared: una_not_json, not a notebook: not valid JSON (Expecting value, "
        "line 1)",
        "not compared: vik_empty, empty file",
        f"not compared: wil_missing, no {NB} in its hand-in",
        "not compared: xia_no_cells, not a notebook: it has no list of cells",
        "not compared: yan_deep, not a notebook: not valid JSON"]
    ring = ", ".join(sorted([*RING, RING_SOURCE]))
    assert f"ring in {RING_GID}: 5 students hand in one identical answer: {ring}" in out
    page = (course.reports / A / "similarity.html").read_text()
    for student in [*broken, "wil_missing"]:
        assert f"<li>{student}, " in page
    rows = list(csv.DictReader(open(course.reports / A / "similarity.csv")))
    assert rows and not {row["student_a"] for row in rows} & {*broken, "wil_missing"}


def test_null_metadata_in_a_hand_in_does_not_stop_the_run(planted, tmp_path):
    """Cells whose metadata, or nbgrader metadata, is null hold no answer; the hand-in's
    other answers are still compared."""
    course = Course(tmp_path / "course")
    shutil.copytree(planted[0].root, course.root)
    notebook = json.loads((EXAMPLES_DIR / A / "kim_unusual_correct.ipynb").read_text())
    answers = [cell for cell in notebook["cells"]
               if (cell.get("metadata", {}).get("nbgrader") or {}).get("solution")]
    answers[0]["metadata"]["nbgrader"] = None
    answers[1]["metadata"] = None
    (course.submitted / "kit_null" / A).mkdir(parents=True)
    (course.submitted / "kit_null" / A / NB).write_text(json.dumps(notebook))
    report = sim.similarity(course=course, assignment=A)
    pairs = {ex.grade_id: pairs for ex, (pairs, _) in report.exercises.items()}
    assert frozenset(("kim_unusual_correct", "kit_null")) in map(_key,
                                                                 pairs["layer_norm_answer"])
    notes = {ex.grade_id: notes for ex, (_, notes) in report.exercises.items()}
    assert "kit_null" in notes["token_mean_answer"].unanswered


def test_names_a_spreadsheet_would_run_are_quoted_in_the_csv(planted, tmp_path):
    """Student ids that begin with = + - @, a tab or a carriage return get a leading
    single quote in similarity.csv (OWASP's advice on CSV injection)."""
    course = Course(tmp_path / "course")
    shutil.copytree(planted[0].root, course.root)
    copy = _handin("dee_blank", {"layer_norm_answer": PLANTED[0][3]})
    names = ["=1+2", "+SUM(1)", "-2+3", "@SUM(1)", "\tHIDDEN", "\rCR"]
    for name in names:
        _put(course, name, copy)
    assert cli.main(["similarity", A, "--course", str(course.root)]) == 0
    with open(course.reports / A / "similarity.csv", newline="") as table:
        rows = list(csv.DictReader(table))
    cells = {row[column] for row in rows for column in ("student_a", "student_b")}
    assert {f"'{name}" for name in names} <= cells
    assert not [cell for cell in cells if cell.startswith(sim.FORMULA_STARTS)]
    page = (course.reports / A / "similarity.html").read_text()
    assert "=1+2 &middot;" in page or "&middot; =1+2" in page


def test_only_the_first_10000_characters_of_an_answer_are_compared():
    """A copy after 10,000 characters of other code is not seen; one before it is; each
    answer longer than that is named as cut (a megabyte one too, in a blink)."""
    exercise = sim.Exercise("token_var_answer", NB, "code", "def token_var(x):\n"
                            "    raise NotImplementedError()")
    copied = _answer("ben_unusual", "token_var_answer")

    def filler(seed, lines=600):  # code of its own: no two answers share a line of it
        return "".join(f"    v = x * {seed}{i} + {seed * 7919 + i * 104729}\n"
                       for i in range(lines))

    assert len(filler(1)) > sim.MAX_ANSWER
    answers = [sim.Answer("ben", sim.THIS_TERM, copied),
               sim.Answer("after", sim.THIS_TERM, filler(1) + copied),
               sim.Answer("before", sim.THIS_TERM, copied + filler(2)),
               sim.Answer("huge", sim.THIS_TERM, filler(3, 40_000))]
    pairs, notes = sim.compare_exercise(exercise, answers)
    listed = [_key(pair) for pair in pairs]
    assert frozenset(("ben", "before")) in listed
    assert not [key for key in listed if "after" in key]
    assert notes.cut == ["after", "before", "huge"]
    assert all(len(answer.text) <= sim.MAX_ANSWER for answer in answers)


def test_highlights_mark_only_the_lines_that_were_compared():
    """The release's lines (signature, docstring) and an idiom the whole class writes
    are not marked; the body the pair shares is, every line of it."""
    exercise = sim.Exercise("e", NB, "code", 'def f(x):\n    """Rows, summed."""\n'
                            "    raise NotImplementedError()")
    head = 'def f(x):\n    """Rows, summed."""\n    x = np.asarray(x, dtype=np.float64)\n'
    answers = [sim.Answer(f"s{k}", sim.THIS_TERM, head + body)
               for k, body in enumerate(OWN_ANSWERS + OWN_ANSWERS[:1])]
    shared = ("    acc = np.zeros_like(x)\n    for row in range(x.shape[0]):\n"
              "        acc[row] = np.cumsum(np.abs(x[row]) ** 1.5)[::-1]\n    return acc\n")
    answers += [sim.Answer(name, sim.THIS_TERM, head + shared) for name in ("p", "q")]
    pairs, notes = sim.compare_exercise(exercise, answers)
    assert notes.common_fingerprints > 0
    pair = next(pair for pair in pairs if _key(pair) == frozenset("pq"))
    for answer, spans in ((pair.a, pair.spans_a), (pair.b, pair.spans_b)):
        assert sim._line_ranges(answer.text, spans) == "4-7"


def _copy_groups():
    """{(exercise, a student copied): everyone who hands in that answer}."""
    groups = defaultdict(set)
    for copier, copied, gid, _ in PLANTED:
        groups[gid, copied] |= {copier, copied}
    groups[RING_GID, RING_SOURCE] |= set(RING) | {RING_SOURCE}
    return groups


def test_precision_and_recall_on_the_planted_class(planted):
    """Over the exercises copies were planted in, a listed pair is right when both hand
    in one answer. Prints the table docs/similarity.md quotes (pytest -s); from a score
    of 0.6 up, every copy is found and nothing else is."""
    _, pairs, _ = planted
    groups = _copy_groups()
    copies = {(gid, frozenset(pair)) for (gid, _), members in groups.items()
              for pair in combinations(sorted(members), 2)}
    listed = [(gid, _key(pair), pair.score) for gid in {gid for gid, _ in groups}
              for pair in pairs[gid]]
    print(f"\n{len(copies)} pairs of copies; {len(listed)} pairs listed")
    print("| score at least | pairs | precision | recall |")
    print("| --- | --- | --- | --- |")
    figures = {}
    for threshold in (0.5, 0.6, 0.7, 0.8, 0.9):
        above = [(gid, key) for gid, key, score in listed if score >= threshold]
        found = len(set(above) & copies)
        figures[threshold] = (found / len(above), found / len(copies))
        print(f"| {threshold} | {len(above)} | {figures[threshold][0]:.2f} | "
              f"{figures[threshold][1]:.2f} ({found}/{len(copies)}) |")
    honest = sorted(score for gid, key, score in listed if (gid, key) not in copies)
    print(f"honest pairs listed: {[round(score, 2) for score in honest]}; lowest copy: "
          f"{min(score for gid, key, score in listed if (gid, key) in copies):.2f}")
    assert figures[0.6] == (1.0, 1.0)


def _digests(folder):
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file() and not p.name.startswith("similarity")}


def test_the_report_changes_nothing_a_student_receives(tmp_path):
    """Graded, then compared: grades.csv, the feedback pages and every other file the
    grading wrote are the same bytes, and no file outside the two reports names the
    similarity."""
    course = Course(tmp_path)
    shutil.copytree(REPO_ROOT / "source" / A, course.source / A)
    shutil.copytree(REPO_ROOT / "release" / A, course.release / A)
    shutil.copy(REPO_ROOT / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    for student in ("ada_perfect", "ben_unusual"):
        _put(course, student, _handin(student, {}))
    _put(course, "quinn_commented", _handin("dee_blank", {"token_var_answer": PLANTED[1][3]}))
    assert cli.main(["grade", A, "--course", str(tmp_path), "--engine", "pool",
                     "--workers", "2"]) == 0
    before = _digests(tmp_path)
    assert cli.main(["similarity", A, "--course", str(tmp_path)]) == 0
    assert _digests(tmp_path) == before
    written = sorted(p.name for p in (course.reports / A).iterdir()
                     if p.name.startswith("similarity"))
    assert written == ["similarity.csv", "similarity.html"]
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.name.startswith("similarity") and \
                path.suffix in (".html", ".csv", ".json", ".txt"):
            assert "similarity" not in path.read_text(errors="replace").lower(), path


def test_a_class_gives_the_same_report_in_every_run(planted, tmp_path):
    """Fingerprints do not depend on the process (Python's string hash does)."""
    reports = []
    for seed in ("1", "2"):
        shutil.copytree(planted[0].root, tmp_path / seed)
        subprocess.run([sys.executable, "-m", "autograder", "similarity", A, "--course",
                        str(tmp_path / seed)], check=True, capture_output=True, cwd=REPO_ROOT,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        reports.append((tmp_path / seed / "reports" / A / "similarity.csv").read_bytes())
    assert reports[0] == reports[1] and reports[0].count(b"\n") > 5


def test_nothing_to_compare_is_a_one_line_refusal(tmp_path, capsys):
    course = Course(tmp_path)
    assert cli.main(["similarity", A, "--course", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"similarity: no release/{A}: run `python -m autograder release`\n")
    shutil.copytree(REPO_ROOT / "release" / A, course.release / A)
    assert cli.main(["similarity", A, "--course", str(tmp_path)]) == 2
    assert "no hand-ins" in capsys.readouterr().err


@pytest.fixture(scope="module")
def browser():
    yield from labbrowser.chromium_session()


def test_the_page_opens_each_pair_side_by_side_with_the_matches_marked(planted, browser):
    course, pairs, _ = planted
    page = course.reports / A / "similarity.html"
    tab = browser.new_page()
    tab.goto(page.as_uri())
    assert tab.locator("p").first.inner_text().startswith("Similarity is a reason to look")
    assert tab.locator("section").count() == len(pairs)
    summary = tab.locator("#layer_norm_answer details.pair summary").first
    assert "pat_renamed" in summary.inner_text() or "ray_reordered" in summary.inner_text()
    side = tab.locator("#layer_norm_answer details.pair .side").first
    assert not side.is_visible()
    summary.click()
    assert side.is_visible()
    marks = side.locator("pre").nth(0).locator("mark")
    assert marks.count() > 0 and side.locator("pre").nth(1).locator("mark").count() > 0
    assert tab.locator("#token_var_answer .excluded").inner_text().count("dee_blank") == 1
    assert tab.locator(f"#{RING_GID} .ring").inner_text().startswith("Ring: 5 students")
    assert tab.evaluate("document.title") == f"Similarity: {A}"
