"""Similar answers across a class (`python -m autograder similarity`), on a planted class:
the sample class of unit 01, whose answers were written independently (the perfect,
the unusual-correct and the typical-mistake hand-ins), and copies of some of them
disguised the ways students disguise copies. A copy must rank above every honest pair
of its exercise; blank and as-released answers are never paired; what only the
release wrote scores nothing; and the report changes nothing a student receives.
"""

import csv
import hashlib
import os
import shutil
import subprocess
import sys

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
HONEST = ["ada_perfect", "ben_unusual", "kim_unusual_correct", "fay_loops", "dee_blank"]

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


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    course = Course(root)
    shutil.copytree(REPO_ROOT / "release" / A, course.release / A)
    for student in HONEST:
        _put(course, student, _handin(student, {}))
    # handed back exactly as released: never paired
    _put(course, "uma_unchanged", nbformat.read(course.release / A / NB, as_version=4))
    for copier, _, gid, text in PLANTED:
        _put(course, copier, _handin("dee_blank", {gid: text}))
    results = sim.similarity(course=course, assignment=A)
    return course, {exercise.grade_id: pairs for exercise, (pairs, _) in results.items()}, \
        {exercise.grade_id: ex for exercise, (_, ex) in results.items()}


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
    assert tab.evaluate("document.title") == f"Similarity: {A}"
