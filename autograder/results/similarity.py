"""Similar answers across a class, per exercise, for a person to look at (similarity).

    python -m autograder similarity ASSIGNMENT [--earlier TERM_DIR]... [--known DIR]...

For each answer cell of the release (autograded code and manually graded text), every
student's answer in submitted/ is compared with every other's, and with the answers of
earlier terms (a term folder as the README moves it away: TERM_DIR/submitted/...) and
of known public solutions (notebooks anywhere under DIR). It writes

    reports/ASSIGNMENT/similarity.csv   exercise, student_a, student_b, score, lines_a,
                                        lines_b; highest score first
    reports/ASSIGNMENT/similarity.html  per exercise, the pairs ranked; each opens a
                                        side-by-side view with the matching regions marked

Only what the student wrote counts. The release's own text in each answer cell (its
scaffold: signature, docstring, placeholders) is removed first, as MOSS's base file and
JPlag's base code are, and so are fingerprints that a large share of the class has in
common: an idiom every correct answer needs is not evidence. Answers left blank or as
released are never paired.

Code is compared as copydetect compares it (its tokenizer replaces names, strings and
comments, so renaming and comments change nothing; winnowing, after Schleimer,
Wilkerson and Aiken 2003, picks fingerprints that see any match of K + WINDOW - 1
characters of that token text, in any order). Text answers are compared as sets of
word shingles. Candidate pairs come from an index of fingerprints: only answers that
share one are compared in full.

Nothing leaves the machine, and nothing here touches a grade: similarity is a reason to
look, not proof, and it appears in no file a student receives.
"""

import csv
import hashlib
import html
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

import nbformat
import numpy as np
from copydetect.detector import compare_files
from copydetect.utils import filter_code, get_token_coverage, winnow
from tqdm import tqdm

K = 20  # characters of copydetect's token text per fingerprint
WINDOW = 4  # winnowing window: every shared run of K + WINDOW - 1 characters is seen
SHINGLE_WORDS = 4  # words per shingle of a text answer
COMMON_SHARE = 0.3  # a fingerprint in more than this share of the class's answers...
COMMON_AT_LEAST = 4  # ...and in more than this many answers is common, not evidence
MIN_SHARED = 40  # characters of token text (code) a pair must share to be listed
MIN_SHARED_SHINGLES = 4  # shingles (text) a pair must share to be listed
HTML_PAIRS = 40  # pairs shown per exercise in the page (the CSV has every pair)
PLACEHOLDERS = ("# YOUR CODE HERE", "raise NotImplementedError()", "YOUR ANSWER HERE")
FIRST_LINE = ("Similarity is a reason to look, not proof: two students may reach the same "
              "answer on their own, and a copy may be rewritten until it looks different.")
CSV_COLUMNS = ("exercise", "student_a", "student_b", "score", "lines_a", "lines_b")


@dataclass(frozen=True)
class Exercise:
    """An answer cell of the release: where it is and the text students got in it."""

    grade_id: str
    notebook: str
    kind: str  # "code" or "markdown"
    scaffold: str


@dataclass
class Answer:
    """One person's answer to one exercise."""

    owner: str  # "ada"; "term-2026: ada"; "known: leaks/hw1.ipynb"
    origin: str  # "this term", "earlier term" or "known solution"
    text: str
    hashes: set = field(default_factory=set)
    compared: object = None  # copydetect's fingerprint (code) or word positions (text)


@dataclass
class Pair:
    exercise: str
    a: Answer
    b: Answer
    score: float
    spans_a: list  # [(start, end)] character ranges of a.text that match
    spans_b: list


@dataclass
class Exclusions:
    """What an exercise's comparison left out, for the report."""

    scaffold_lines: int = 0
    common_fingerprints: int = 0
    unanswered: list = field(default_factory=list)  # owners of blank or as-released answers


class SimilarityError(ValueError):
    """The comparison cannot run (no release, nothing handed in)."""


# -- reading answers ---------------------------------------------------------------------

def _grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def exercises(course, assignment):
    """The answer cells of the assignment's release, in notebook order."""
    found = []
    folder = course.release / assignment
    if not folder.is_dir():
        raise SimilarityError(f"no release/{assignment}: run `python -m autograder release`")
    for path in sorted(folder.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and meta.get("grade_id"):
                found.append(Exercise(meta["grade_id"], path.name, cell.cell_type,
                                      cell.source))
    return found


def _answers_in(path):
    """{grade_id: source} of a notebook's cells (the first cell of each id); {} if the
    file is not a readable notebook."""
    try:
        notebook = json.loads(Path(path).read_text(encoding="utf-8", errors="replace"))
        cells = notebook["cells"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    found = {}
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict):
            continue
        gid, source = _grade_id(cell), cell.get("source", "")
        if isinstance(source, list):
            source = "".join(str(part) for part in source)
        if isinstance(gid, str) and isinstance(source, str) and gid not in found:
            found[gid] = source
    return found


def _handins(submitted, assignment, notebook):
    """[(student, path)] of a submitted/ folder's hand-ins of `notebook`."""
    if not submitted.is_dir():
        return []
    return [(folder.name, folder / assignment / notebook)
            for folder in sorted(submitted.iterdir())
            if (folder / assignment / notebook).is_file()]


def gather(course, assignment, exercise, *, earlier=(), known=()):
    """Every answer to `exercise`: this term's, earlier terms', known solutions'."""
    answers = []
    for student, path in _handins(course.submitted, assignment, exercise.notebook):
        answers.append(Answer(student, "this term", _answers_in(path).get(exercise.grade_id)))
    for term in earlier:
        term = Path(term)
        for student, path in _handins(term / "submitted", assignment, exercise.notebook):
            answers.append(Answer(f"{term.name}: {student}", "earlier term",
                                  _answers_in(path).get(exercise.grade_id)))
    for folder in known:
        folder = Path(folder)
        for path in sorted(folder.rglob("*.ipynb")):
            text = _answers_in(path).get(exercise.grade_id)
            if text is not None:
                answers.append(Answer(f"known: {path.relative_to(folder)}", "known solution",
                                      text))
    return [answer for answer in answers if answer.text is not None or
            answer.origin == "this term"]


def _without_scaffold(text, scaffold):
    """The answer's lines less the release's own lines and placeholders."""
    given = {line.strip() for line in scaffold.splitlines()} | set(PLACEHOLDERS)
    return "\n".join(line for line in (text or "").splitlines()
                     if line.strip() and line.strip() not in given)


# -- fingerprints --------------------------------------------------------------------------

@dataclass
class _Fingerprint:
    """What copydetect's compare_files reads of an answer (its CodeFingerprint's fields)."""

    filtered_code: str
    offsets: np.ndarray
    hashes: set
    hash_idx: dict
    token_coverage: float
    k: int = K


def _kgram_hashes(text):
    """A stable hash of every K-character run: the same answer gives the same
    fingerprints in every run (Python's own str hash changes from process to process)."""
    return np.array([int.from_bytes(hashlib.blake2b(text[i:i + K].encode(), digest_size=8)
                                    .digest(), "little", signed=True)
                     for i in range(len(text) - K + 1)], dtype=np.int64)


def _code_fingerprint(text):
    filtered, offsets = filter_code(text, "answer.py", "python")
    hashes, positions = (winnow(_kgram_hashes(filtered), WINDOW, remove_duplicates=False)
                         if len(filtered) >= K else (np.array([], np.int64), np.array([])))
    by_hash = defaultdict(list)
    for value, position in zip(hashes.tolist(), positions.tolist()):
        by_hash[value].append(position)
    return _Fingerprint(filtered, offsets, set(by_hash), dict(by_hash),
                        get_token_coverage(by_hash, K, len(filtered)))


def _without(fingerprint, left_out):
    """The fingerprint less the hashes in `left_out`."""
    fingerprint.hashes = fingerprint.hashes - left_out
    fingerprint.hash_idx = {value: positions for value, positions
                            in fingerprint.hash_idx.items() if value not in left_out}
    fingerprint.token_coverage = get_token_coverage(fingerprint.hash_idx, K,
                                                    len(fingerprint.filtered_code))
    return fingerprint


def _scaffold_hashes(scaffold):
    filtered, _ = filter_code(scaffold, "scaffold.py", "python")
    return set(_kgram_hashes(filtered).tolist())


_WORD = re.compile(r"\w+")


def _shingles(text):
    """({shingle: [(start, end)] character ranges}) of a text answer's word shingles."""
    words = [(m.group().lower(), m.start(), m.end()) for m in _WORD.finditer(text)]
    found = defaultdict(list)
    for i in range(len(words) - SHINGLE_WORDS + 1):
        run = words[i:i + SHINGLE_WORDS]
        found[" ".join(w for w, _, _ in run)].append((run[0][1], run[-1][2]))
    return found


def _common(answers):
    """Fingerprints more of this term's answers hold than COMMON_SHARE and
    COMMON_AT_LEAST allow."""
    counts = defaultdict(int)
    students = [a for a in answers if a.origin == "this term"]
    for answer in students:
        for value in answer.hashes:
            counts[value] += 1
    limit = max(COMMON_AT_LEAST, COMMON_SHARE * len(students))
    return {value for value, count in counts.items() if count > limit}


def _fingerprint_all(exercise, answers, exclusions, progress):
    """Fingerprint the answers worth comparing (blank and as-released ones are noted in
    `exclusions` and dropped); returns them."""
    kept = []
    for answer in answers:
        own = _without_scaffold(answer.text, exercise.scaffold)
        if not own.strip():
            if answer.origin == "this term":
                exclusions.unanswered.append(answer.owner)
            continue
        kept.append(answer)
    progress.update(len(answers) - len(kept))
    exclusions.scaffold_lines = sum(1 for line in exercise.scaffold.splitlines() if line.strip())
    if exercise.kind == "code":
        scaffold = _scaffold_hashes(exercise.scaffold)
        for answer in kept:
            answer.compared = _without(_code_fingerprint(answer.text), scaffold)
            answer.hashes = set(answer.compared.hashes)
            progress.update(1)
        common = _common(kept)
        exclusions.common_fingerprints = len(common)
        for answer in kept:
            if answer.hashes & common:
                answer.compared = _without(answer.compared, common)
                answer.hashes = set(answer.compared.hashes)
    else:
        given = set(_shingles(exercise.scaffold))
        for answer in kept:
            answer.compared = {s: spans for s, spans in _shingles(answer.text).items()
                               if s not in given}
            answer.hashes = set(answer.compared)
            progress.update(1)
        common = _common(kept)
        exclusions.common_fingerprints = len(common)
        for answer in kept:
            answer.compared = {s: spans for s, spans in answer.compared.items()
                               if s not in common}
            answer.hashes -= common
    return kept


# -- pairs ---------------------------------------------------------------------------------

def _candidates(answers):
    """Index pairs of answers that share a fingerprint, one of them this term's."""
    holders = defaultdict(list)
    for index, answer in enumerate(answers):
        for value in answer.hashes:
            holders[value].append(index)
    pairs = set()
    for indices in holders.values():
        for i, j in combinations(indices, 2):
            if "this term" in (answers[i].origin, answers[j].origin):
                pairs.add((i, j))
    return sorted(pairs)


def _merged(spans):
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(span) for span in merged]


def _compare(exercise, a, b):
    """A Pair, or None when the two share too little to list."""
    if exercise.kind == "code":
        shared, (score_a, score_b), (slices_a, slices_b) = compare_files(a.compared, b.compared)
        if shared < MIN_SHARED:
            return None
        spans_a = _merged((int(s), int(e)) for s, e in zip(*slices_a))
        spans_b = _merged((int(s), int(e)) for s, e in zip(*slices_b))
        return Pair(exercise.grade_id, a, b, float(max(score_a, score_b)), spans_a, spans_b)
    shared = a.hashes & b.hashes
    if len(shared) < MIN_SHARED_SHINGLES:
        return None
    score = len(shared) / max(1, min(len(a.hashes), len(b.hashes)))
    return Pair(exercise.grade_id, a, b, float(min(1.0, score)),
                _merged(s for value in shared for s in a.compared[value]),
                _merged(s for value in shared for s in b.compared[value]))


def _ordered(pair):
    """This term's student first; two of this term's in name order."""
    if pair.a.origin != "this term" or (pair.b.origin == "this term"
                                        and pair.b.owner < pair.a.owner):
        pair.a, pair.b, pair.spans_a, pair.spans_b = pair.b, pair.a, pair.spans_b, pair.spans_a
    return pair


def compare_exercise(exercise, answers, *, progress=None):
    """(pairs highest score first, Exclusions) for one exercise's answers."""
    progress = progress or tqdm(disable=True)
    exclusions = Exclusions()
    kept = _fingerprint_all(exercise, answers, exclusions, progress)
    pairs = [_compare(exercise, kept[i], kept[j]) for i, j in _candidates(kept)]
    pairs = [_ordered(pair) for pair in pairs if pair is not None]
    pairs.sort(key=lambda p: (-p.score, p.a.owner, p.b.owner))
    return pairs, exclusions


def _line_ranges(text, spans):
    """'3-5;9' for the lines the character spans cover (1-based)."""
    starts = np.cumsum([0] + [len(line) + 1 for line in text.split("\n")])
    lines = sorted({n for start, end in spans
                    for n in range(int(np.searchsorted(starts, start, "right")),
                                   int(np.searchsorted(starts, max(start, end - 1), "right"))
                                   + 1)})
    ranges, run = [], []
    for n in lines:
        if run and n == run[-1] + 1:
            run.append(n)
        else:
            if run:
                ranges.append(run)
            run = [n]
    if run:
        ranges.append(run)
    return ";".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in ranges)


# -- the report ----------------------------------------------------------------------------

def _marked(text, spans):
    out, at = [], 0
    for start, end in spans:
        out.append(html.escape(text[at:start]))
        out.append(f"<mark>{html.escape(text[start:end])}</mark>")
        at = end
    out.append(html.escape(text[at:]))
    return "".join(out)


_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:80rem}
.lead{font-weight:600;border-left:4px solid #b45309;padding:.5rem 1rem;background:#fffbeb}
table{border-collapse:collapse}td,th{padding:.2rem .6rem;text-align:left}
details{margin:.3rem 0;border:1px solid #ddd;border-radius:4px;padding:.3rem .6rem}
summary{cursor:pointer}.side{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
pre{background:#f6f6f6;padding:.5rem;overflow-x:auto;white-space:pre-wrap}
mark{background:#fde68a}.origin{color:#555;font-size:.9em}"""


def _page(assignment, results):
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>Similarity: {html.escape(assignment)}</title><style>{_STYLE}</style>"
             f"</head><body><p class='lead'>{html.escape(FIRST_LINE)} A high score changes "
             "no grade and is shown to no student.</p>",
             f"<h1>Similar answers in {html.escape(assignment)}</h1>"]
    for exercise, (pairs, exclusions) in results.items():
        parts.append(f"<section id='{html.escape(exercise.grade_id)}'>"
                     f"<h2>{html.escape(exercise.grade_id)}</h2>")
        unanswered = ", ".join(exclusions.unanswered) or "none"
        parts.append(
            "<p class='excluded'>Left out before comparing: the release's own "
            f"{exclusions.scaffold_lines} line(s) in this cell; "
            f"{exclusions.common_fingerprints} fingerprint(s) common to more than "
            f"{COMMON_SHARE:.0%} of the class's answers; answers blank or as released: "
            f"{html.escape(unanswered)}.</p>")
        if not pairs:
            parts.append("<p>No pair shares enough to list.</p></section>")
            continue
        if len(pairs) > HTML_PAIRS:
            parts.append(f"<p>The {HTML_PAIRS} highest of {len(pairs)} pairs; "
                         "similarity.csv lists them all.</p>")
        for rank, pair in enumerate(pairs[:HTML_PAIRS], 1):
            parts.append(
                f"<details class='pair'><summary>{rank}. <b>{pair.score:.2f}</b> "
                f"{html.escape(pair.a.owner)} &middot; {html.escape(pair.b.owner)} "
                f"<span class='origin'>({html.escape(pair.b.origin)})</span></summary>"
                "<div class='side'>"
                f"<div><h3>{html.escape(pair.a.owner)}</h3>"
                f"<pre>{_marked(pair.a.text, pair.spans_a)}</pre></div>"
                f"<div><h3>{html.escape(pair.b.owner)}</h3>"
                f"<pre>{_marked(pair.b.text, pair.spans_b)}</pre></div></div></details>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def similarity(*, course, assignment, earlier=(), known=(), log=sys.stderr):
    """Compare every exercise's answers; write the CSV and the page; return
    {Exercise: (pairs, Exclusions)}."""
    found = exercises(course, assignment)
    if not found:
        raise SimilarityError(f"release/{assignment} has no answer cells")
    gathered = {exercise: gather(course, assignment, exercise, earlier=earlier, known=known)
                for exercise in found}
    if not any(a.origin == "this term" for answers in gathered.values() for a in answers):
        raise SimilarityError(f"no hand-ins of {assignment} in submitted/: collect them first")
    total = sum(len(answers) for answers in gathered.values())
    results = {}
    with tqdm(total=total, desc="answers", unit="answer", file=log, disable=None) as progress:
        for exercise, answers in gathered.items():
            results[exercise] = compare_exercise(exercise, answers, progress=progress)
    folder = course.reports / assignment
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted((pair for pairs, _ in results.values() for pair in pairs),
                  key=lambda p: (-p.score, p.exercise, p.a.owner, p.b.owner))
    with open(folder / "similarity.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for pair in rows:
            writer.writerow([pair.exercise, pair.a.owner, pair.b.owner, f"{pair.score:.3f}",
                             _line_ranges(pair.a.text, pair.spans_a),
                             _line_ranges(pair.b.text, pair.spans_b)])
    (folder / "similarity.html").write_text(_page(assignment, results), encoding="utf-8")
    return results


def cmd_similarity(args):
    from autograder.course import Course

    course = Course.at(args.course)
    try:
        results = similarity(course=course, assignment=args.assignment,
                             earlier=args.earlier or (), known=args.known or ())
    except SimilarityError as problem:
        print(f"similarity: {problem}", file=sys.stderr)
        return 2
    pairs = sum(len(p) for p, _ in results.values())
    folder = course.reports / args.assignment
    print(f"{FIRST_LINE}\n{pairs} pair(s) over {len(results)} exercise(s): "
          f"{folder / 'similarity.html'} and {folder / 'similarity.csv'}")
    return 0


def register(add):
    p = add("similarity", cmd_similarity,
            "rank similar answers per exercise, for a person to look at (changes no grade)")
    p.add_argument("assignment")
    p.add_argument("--earlier", action="append", metavar="TERM_DIR",
                   help="an earlier term's folder (TERM_DIR/submitted/...); repeatable")
    p.add_argument("--known", action="append", metavar="DIR",
                   help="a folder of known solutions (notebooks, e.g. found online); "
                        "repeatable")
