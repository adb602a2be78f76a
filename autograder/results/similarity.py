"""Similar answers across a class, per exercise, for a person to look at (similarity).

    python -m autograder similarity ASSIGNMENT [--earlier TERM_DIR]... [--known PATH]...

For each answer cell of the release (autograded code and manually graded text), every
student's answer in submitted/ is compared with every other's, and with the answers of
earlier terms (a term folder as the README moves it away: TERM_DIR/submitted/...) and
of known public solutions (notebooks anywhere under PATH; a notebook that has lost the
release's cell ids is matched cell by cell, by content). It writes

    reports/ASSIGNMENT/similarity.csv   exercise, student_a, student_b, score, lines_a,
                                        lines_b; highest score first
    reports/ASSIGNMENT/similarity.html  per exercise, the pairs ranked; each opens a
                                        side-by-side view with the matching lines marked

Only what the student wrote counts. The lines of an answer that the release wrote (its
scaffold: signature, docstring, placeholders) and stub lines (`pass`, `...`,
`return None`, `raise NotImplementedError`) are set aside before comparing, as MOSS's
base file and JPlag's base code are; an answer with nothing else is blank and never
paired. So are idioms: short passages (at most IDIOM_CHARS of token text) whose
fingerprints a large share of the class holds. A longer passage that many students hand
in identically is not an idiom: it is kept, and such a group is reported as a ring.
Answers from earlier terms and known solutions are compared on all their fingerprints.

Code is compared as normalised tokens (pygments' Python tokens, as copydetect reads them:
the names an answer chooses become V, strings S, comments and spacing go, so renaming and
comments change nothing; attribute and keyword-argument names stay, since a student
cannot rename them), fingerprinted by copydetect's winnowing (Schleimer, Wilkerson and
Aiken 2003): every shared run of K + WINDOW - 1 characters of token text is seen, in any
order. Answers shorter than SHORT_ANSWER characters of token text (one-liners) give too
few fingerprints at that size; two of them are compared with SHORT_K-grams instead, by
the longest passage they share. Text answers are compared as word shingles. Candidate
pairs come from an index of fingerprints: only answers that share one are compared.

Nothing leaves the machine, and nothing here touches a grade: similarity is a reason to
look, not proof, and it appears in no file a student receives.
"""

import csv
import hashlib
import html
import json
import re
import sys
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache, cached_property
from itertools import combinations
from pathlib import Path

import numpy as np
from copydetect.utils import winnow
from pygments import token
from pygments.lexers import PythonLexer
from tqdm import tqdm

K = 20  # characters of token text per fingerprint
WINDOW = 4  # winnowing window: every shared run of K + WINDOW - 1 characters is seen
SHORT_ANSWER = 60  # an answer with less token text than this is short (a one-liner)...
SHORT_K = 8  # ...and two short answers are compared with fingerprints of this size,
SHORT_WINDOW = 3  # winnowed with this window,
MIN_SHARED_SHORT = 16  # and listed when they share one run of this many characters,
MIN_SCORE_SHORT = 0.5  # covering at least this share of each
SHINGLE_WORDS = 4  # words per shingle of a text answer
COMMON_SHARE = 0.3  # a fingerprint in more than this share of the class's answers...
COMMON_AT_LEAST = 4  # ...and in more than this many answers is common;
IDIOM_CHARS = 80  # common fingerprints are left out where their run is this short
RING_AT_LEAST = 3  # students handing in one identical answer longer than an idiom
MAX_ANSWER = 10_000  # characters of an answer compared; the rest is cut
MIN_SHARED = 40  # characters of token text (code) a pair must share to be listed
MIN_SHARED_SHINGLES = 4  # shingles (text) a pair must share to be listed
HTML_PAIRS = 40  # pairs shown per exercise in the page (the CSV has every pair)
TEXT_PLACEHOLDERS = ("YOUR ANSWER HERE",)
STUB = re.compile(r"pass|\.\.\.|return|returnNone|raiseNotImplementedError(\(.*\))?")
THIS_TERM, EARLIER_TERM, KNOWN = "this term", "earlier term", "known solution"
FIRST_LINE = ("Similarity is a reason to look, not proof: two students may reach the same "
              "answer on their own, and a copy may be rewritten until it looks different.")
CSV_COLUMNS = ("exercise", "student_a", "student_b", "score", "lines_a", "lines_b")
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, "CSV
# Injection"): such a cell gets a leading single quote.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Exercise:
    """An answer cell of the release: where it is and the text students got in it."""

    grade_id: str
    notebook: str
    kind: str  # "code" or "markdown"
    scaffold: str


@dataclass
class _Print:
    """An answer's fingerprints at one size: where each one's k units start, less the
    units of the idioms left out (whose fingerprints are gone too)."""

    k: int
    length: int  # units in the answer
    starts: dict  # hash -> [unit index]
    idiom: np.ndarray | None = None  # True for each unit of an idiom left out
    kgrams: tuple = ()  # the hash of every k-gram, winnowed or not, in order

    def units(self, hashes):
        """The units that the fingerprints `hashes` cover, idioms aside (a mask)."""
        covered = np.zeros(self.length, dtype=bool)
        at = np.fromiter((start for value in hashes for start in self.starts[value]),
                         dtype=np.int64)
        for offset in range(self.k):
            covered[at + offset] = True
        return covered if self.idiom is None else covered & ~self.idiom

    @cached_property
    def coverage(self):
        return int(self.units(self.starts).sum())


@dataclass
class Answer:
    """One person's answer to one exercise."""

    owner: str  # "ada"; "term-2026: ada"; "known: leaks/hw1.ipynb"
    origin: str  # THIS_TERM, EARLIER_TERM or KNOWN
    text: str | None
    cut: bool = False  # longer than MAX_ANSWER: the rest was not compared
    compared: str = ""  # what took part: the token text (code) or the words (text)
    unit_spans: np.ndarray | None = None  # (start, end) in text of each unit
    unit_places: list = field(default_factory=list)  # (start, end) in compared of each
    prints: dict = field(default_factory=dict)  # "long"/"short" -> _Print, all fingerprints
    kept: dict = field(default_factory=dict)  # the same less this term's idioms

    @property
    def short(self):
        return "short" in self.prints


@dataclass
class Pair:
    exercise: str
    a: Answer
    b: Answer
    score: float
    spans_a: list  # [(start, end)] character ranges of a.text that match
    spans_b: list


@dataclass
class ExerciseNotes:
    """What a person needs beside an exercise's pairs: what the comparison left out, and
    the rings it found."""

    scaffold_lines: int = 0
    common_fingerprints: int = 0  # fingerprints of idioms left out
    unanswered: list = field(default_factory=list)  # owners of blank or stub answers
    cut: list = field(default_factory=list)  # owners of answers cut at MAX_ANSWER
    rings: list = field(default_factory=list)  # [owners] handing in one identical answer


@dataclass
class Report:
    exercises: dict  # Exercise -> (pairs highest score first, ExerciseNotes)
    not_compared: list  # [(owner, reason)] hand-ins that could not be read


class SimilarityError(ValueError):
    """The comparison cannot run (no release, nothing handed in, a path that is not)."""


# -- reading answers ---------------------------------------------------------------------

def _nbgrader(cell):
    """A cell's nbgrader metadata, {} where it is missing, null or not a mapping."""
    metadata = cell.get("metadata") if isinstance(cell, dict) else None
    found = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def _source(cell):
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(str(part) for part in source)
    return source if isinstance(source, str) else None


def exercises(course, assignment):
    """The answer cells of the assignment's release, in notebook order."""
    found = []
    folder = course.release / assignment
    if not folder.is_dir():
        raise SimilarityError(f"no release/{assignment}: run `python -m autograder release`")
    for path in sorted(folder.glob("*.ipynb")):
        cells, reason = _read_cells(path)
        if cells is None:
            raise SimilarityError(f"release/{assignment}/{path.name}: {reason}")
        for cell in cells:
            meta = _nbgrader(cell)
            if meta.get("solution") and isinstance(meta.get("grade_id"), str):
                found.append(Exercise(meta["grade_id"], path.name,
                                      cell.get("cell_type", "code"), _source(cell) or ""))
    return found


def _read_cells(path):
    """(the notebook's cells, None), or (None, why they cannot be read)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as problem:
        return None, f"cannot be read ({problem.strerror})"
    if not raw.strip():
        return None, "empty file"
    try:
        notebook = json.loads(raw.decode("utf-8", errors="replace"))
    except json.JSONDecodeError as problem:
        return None, f"not a notebook: not valid JSON ({problem.msg}, line {problem.lineno})"
    except (ValueError, RecursionError):
        return None, "not a notebook: not valid JSON"
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        return None, "not a notebook: it has no list of cells"
    return [cell for cell in cells if isinstance(cell, dict)], None


@dataclass
class _HandIn:
    owner: str
    origin: str
    notebook: str  # the release notebook it answers; "" for a known solution
    cells: list

    def answer(self, grade_id):
        """The source of the first cell carrying `grade_id`, or None."""
        for cell in self.cells:
            if _nbgrader(cell).get("grade_id") == grade_id:
                return _source(cell)
        return None

    def has(self, grade_id):
        return any(_nbgrader(cell).get("grade_id") == grade_id for cell in self.cells)


def _term_hand_ins(submitted, assignment, notebooks, origin, label):
    """(hand-ins, [(owner, reason)] not readable) of one submitted/ folder."""
    found, unreadable = [], []
    for folder in sorted(submitted.iterdir()) if submitted.is_dir() else []:
        if folder.name.startswith(".") or not (folder / assignment).is_dir():
            continue
        owner = label(folder.name)
        for notebook in notebooks:
            path = folder / assignment / notebook
            if not path.is_file():
                unreadable.append((owner, f"no {notebook} in its hand-in"))
                continue
            cells, reason = _read_cells(path)
            if cells is None:
                unreadable.append((owner, reason))
            else:
                found.append(_HandIn(owner, origin, notebook, cells))
    return found, unreadable


def _known_notebooks(path):
    if path.is_file():
        return [(path.name, path)]
    return [(str(found.relative_to(path)), found) for found in sorted(path.rglob("*.ipynb"))
            if not any(part.startswith(".") for part in found.relative_to(path).parts)]


def check_sources(earlier=(), known=()):
    """Refuse, in one line, an --earlier or --known path that is not there."""
    for term in map(Path, earlier):
        if not term.is_dir():
            raise SimilarityError(f"--earlier {term}: no such folder")
        if not (term / "submitted").is_dir():
            raise SimilarityError(f"--earlier {term}: it has no submitted/ folder (give the "
                                  "folder a term was moved to, as the README's "
                                  "'Resetting a course' does)")
    for path in map(Path, known):
        if not path.exists():
            raise SimilarityError(f"--known {path}: no such file or folder")


def hand_ins(course, assignment, notebooks, *, earlier=(), known=()):
    """(this term's, earlier terms' and known hand-ins, [(owner, reason)] of those that
    cannot be read, the number of this term's students with a hand-in)."""
    found, unreadable = _term_hand_ins(course.submitted, assignment, notebooks, THIS_TERM,
                                       lambda student: student)
    students = len({h.owner for h in found} | {owner for owner, _ in unreadable})
    for term in map(Path, earlier):
        more, unread = _term_hand_ins(term / "submitted", assignment, notebooks, EARLIER_TERM,
                                      lambda student, term=term: f"{term.name}: {student}")
        found += more
        unreadable += unread
    for folder in map(Path, known):
        for name, path in _known_notebooks(folder):
            cells, reason = _read_cells(path)
            if cells is None:
                unreadable.append((f"known: {name}", reason))
            else:
                found.append(_HandIn(f"known: {name}", KNOWN, "", cells))
    return found, unreadable, students


def gather(exercise, found):
    """Every answer to `exercise` among the hand-ins: this term's (None where the cell is
    missing: unanswered), earlier terms' and known solutions'. A known notebook without
    the exercise's cell id offers each of its cells of the exercise's kind."""
    answers = []
    for hand_in in found:
        if hand_in.origin == KNOWN and not hand_in.has(exercise.grade_id):
            answers += [Answer(f"{hand_in.owner}, cell {number}", KNOWN, _source(cell))
                        for number, cell in enumerate(hand_in.cells, 1)
                        if cell.get("cell_type") == exercise.kind and _source(cell)]
        elif hand_in.origin == KNOWN or hand_in.notebook == exercise.notebook:
            text = hand_in.answer(exercise.grade_id)
            if text is not None or hand_in.origin == THIS_TERM:
                answers.append(Answer(hand_in.owner, hand_in.origin, text))
    return answers


# -- what took part: the answer's own lines, as units ------------------------------------

_LEXER = PythonLexer()
_CHOSEN_NAMES = {token.Name, token.Name.Variable, token.Name.Attribute}


def _views(text):
    """[(start, end, view, literal, header view)] of the answer's tokens that count
    (comments and spacing do not): `view` is what fingerprints read (the names an answer
    chooses become V, a function's F, a class's O, strings S; attribute and keyword-argument
    names stay), `literal` the token itself, `header view` the view with the names of
    functions and classes kept, for matching a release's def line whose arguments were
    renamed."""
    tokens = [(start, kind, value) for start, kind, value
              in _LEXER.get_tokens_unprocessed(text)
              if value.strip() and kind not in token.Comment and kind not in token.Text]
    views, calls = [], []  # calls: for each open bracket, whether it holds call arguments
    for i, (start, kind, value) in enumerate(tokens):
        before = tokens[i - 1] if i else (0, None, "")
        after = tokens[i + 1][2] if i + 1 < len(tokens) else ""
        if kind in _CHOSEN_NAMES:
            keyword_argument = after == "=" and calls and calls[-1]
            view = value if before[2] == "." or keyword_argument else "V"
        elif kind in token.Name.Function:
            view = "F"
        elif kind in token.Name.Class:
            view = "O"
        elif kind in token.String:
            view = '"' if value in ("'", '"') else "S"
        else:
            view = value
        if value in ("(", "[", "{"):
            calls.append(value == "(" and (before[1] in _CHOSEN_NAMES or before[2] in ")]"))
        elif value in (")", "]", "}") and calls:
            calls.pop()
        header = value if kind in token.Name.Function or kind in token.Name.Class else view
        views.append((start, start + len(value), view, value, header))
    return views


def _lines(text, views):
    """{line number: the views of the tokens that start on it}."""
    starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    lines = defaultdict(list)
    for view in views:
        lines[bisect_right(starts, view[0]) - 1].append(view)
    return lines


def _line_keys(line):
    literal = "".join(view[3] for view in line)
    header = "".join(view[4] for view in line) if line[0][3] in ("def", "class", "async") \
        else None
    return literal, header


@cache
def _scaffold_keys(scaffold):
    """(the release's lines as tokens, its def and class lines with arguments as V)."""
    given = [_line_keys(line) for line in _lines(scaffold, _views(scaffold)).values()]
    return {literal for literal, _ in given}, {header for _, header in given if header}


def _code_units(text, scaffold):
    """(token text of the answer's own lines: not the release's, not stubs, not
    docstrings; the (start, end) in `text` each of its characters comes from)."""
    literals, headers = _scaffold_keys(scaffold)
    compared, spans = [], []
    for line in _lines(text, _views(text)).values():
        literal, header = _line_keys(line)
        if literal in literals or header in headers or STUB.fullmatch(literal) or \
                all(view[2] in ("S", '"') for view in line):  # a docstring: a comment
            continue
        for start, end, view, _, _ in line:
            compared.append(view)
            spans += [(start, end)] * len(view)
    return "".join(compared), spans


_WORD = re.compile(r"\w+")


def _text_units(text, scaffold):
    """(the words of the text answer's own lines, the (start, end) in `text` of each)."""
    given = {line.strip() for line in scaffold.splitlines()} | set(TEXT_PLACEHOLDERS)
    words, spans, at = [], [], 0
    for line in text.splitlines(keepends=True):
        if line.strip() and line.strip() not in given:
            for match in _WORD.finditer(line):
                words.append(match.group().lower())
                spans.append((at + match.start(), at + match.end()))
        at += len(line)
    return words, spans


# -- fingerprints --------------------------------------------------------------------------

def _kgram_hashes(text, k):
    """A stable hash of every k-character run: the same answer gives the same
    fingerprints in every run (Python's own str hash changes from process to process)."""
    return np.array([int.from_bytes(hashlib.blake2b(text[i:i + k].encode(), digest_size=8)
                                    .digest(), "little", signed=True)
                     for i in range(len(text) - k + 1)], dtype=np.int64)


def _winnowed(text, k, window):
    starts = defaultdict(list)
    kgrams = _kgram_hashes(text, k) if len(text) >= k else np.array([], np.int64)
    if len(kgrams):
        hashes, positions = winnow(kgrams, window, remove_duplicates=False)
        for value, position in zip(hashes.tolist(), positions.tolist()):
            starts[value].append(position)
    return _Print(k, len(text), dict(starts), kgrams=tuple(kgrams.tolist()))


def _shingles(words):
    kgrams = tuple(" ".join(words[i:i + SHINGLE_WORDS])
                   for i in range(len(words) - SHINGLE_WORDS + 1))
    starts = defaultdict(list)
    for i, shingle in enumerate(kgrams):
        starts[shingle].append(i)
    return _Print(SHINGLE_WORDS, len(words), dict(starts), kgrams=kgrams)


def _prepare(exercise, answer):
    """Cut the answer at MAX_ANSWER, keep its own lines as units and fingerprint them."""
    text = answer.text or ""
    answer.text, answer.cut = text[:MAX_ANSWER], answer.cut or len(text) > MAX_ANSWER
    if exercise.kind == "code":
        answer.compared, spans = _code_units(answer.text, exercise.scaffold)
        answer.unit_places = [(i, i + 1) for i in range(len(answer.compared))]
        answer.prints = {"long": _winnowed(answer.compared, K, WINDOW)}
        if len(answer.compared) < SHORT_ANSWER:
            answer.prints["short"] = _winnowed(answer.compared, SHORT_K, SHORT_WINDOW)
    else:
        words, spans = _text_units(answer.text, exercise.scaffold)
        answer.compared = " ".join(words)
        starts = np.cumsum([0] + [len(word) + 1 for word in words]).tolist()
        answer.unit_places = [(start, start + len(word)) for start, word in zip(starts, words)]
        answer.prints = {"long": _shingles(words)}
    answer.unit_spans = np.array(spans, dtype=np.int64).reshape(-1, 2)
    answer.kept = dict(answer.prints)


def _common(answers, limit):
    """Fingerprints that more than `limit` of these answers hold."""
    counts = defaultdict(int)
    for answer in answers:
        for value in set(answer.prints["long"].kgrams):
            counts[value] += 1
    return {value for value, count in counts.items() if count > limit}


def _without_idioms(answer, common):
    """The answer's fingerprints less the common ones that form a run of at most
    IDIOM_CHARS characters (an idiom); common ones in a longer run stay (a passage that
    long, shared by many, is what a ring hands in). Returns (print, what was left out)."""
    full = answer.prints["long"]
    runs = []  # [first unit, last unit] of the k-grams, winnowed or not, that are common
    for start, value in enumerate(full.kgrams):
        if value not in common:
            continue
        if runs and start <= runs[-1][1] + 1:
            runs[-1][1] = start + full.k - 1
        else:
            runs.append([start, start + full.k - 1])
    idiom = np.zeros(full.length, dtype=bool)
    for first, last in runs:
        if answer.unit_places[last][1] - answer.unit_places[first][0] <= IDIOM_CHARS:
            idiom[first:last + 1] = True
    dropped = {(start, value) for value, at in full.starts.items() if value in common
               for start in at if idiom[start]}
    starts_left = defaultdict(list)
    for value, at in full.starts.items():
        for start in at:
            if (start, value) not in dropped:
                starts_left[value].append(start)
    return (_Print(full.k, full.length, dict(starts_left), idiom, full.kgrams),
            {("long", value) for _, value in dropped})


def _rings(answers):
    """[owners] of each group of RING_AT_LEAST or more answers whose compared text is
    the same and longer than an idiom."""
    groups = defaultdict(list)
    for answer in answers:
        if len(answer.compared) > IDIOM_CHARS:
            groups[answer.compared].append(answer.owner)
    return sorted(sorted(owners) for owners in groups.values() if len(owners) >= RING_AT_LEAST)


def _fingerprint_all(exercise, answers, notes, progress):
    """Fingerprint the answers worth comparing (blank and stub ones are noted in `notes`
    and dropped); leave this term's idioms out of `kept`; returns them."""
    kept = []
    for answer in answers:
        _prepare(exercise, answer)
        progress.update(1)
        if answer.origin == THIS_TERM and answer.cut:
            notes.cut.append(answer.owner)
        if answer.compared:
            kept.append(answer)
        elif answer.origin == THIS_TERM:
            notes.unanswered.append(answer.owner)
    notes.scaffold_lines = sum(1 for line in exercise.scaffold.splitlines() if line.strip())
    students = [answer for answer in kept if answer.origin == THIS_TERM]
    limit = max(COMMON_AT_LEAST, COMMON_SHARE * len(students))
    common = _common(students, limit)
    left_out = set()
    for answer in students:
        answer.kept["long"], dropped = _without_idioms(answer, common)
        left_out |= dropped
    # Two one-liners are compared as wholes (by the longest run they share), so pieces
    # that many hold need no filter; a one-liner that many hand in whole is an idiom.
    one_liners = defaultdict(list)
    for answer in students:
        if answer.short:
            one_liners[answer.compared].append(answer)
    for holders in one_liners.values():
        if len(holders) > limit:
            for answer in holders:
                left_out |= {(scale, value) for scale in ("long", "short")
                             for value in answer.kept[scale].starts}
                answer.kept = {scale: _Print(kept.k, kept.length, {})
                               for scale, kept in answer.kept.items()}
    notes.common_fingerprints = len(left_out)
    notes.rings = _rings(students)
    return kept


# -- pairs ---------------------------------------------------------------------------------

def _scale(a, b):
    return "short" if a.short and b.short else "long"


def _prints(a, b, scale):
    """This term's students are compared without idioms; anything from outside the term
    is compared on all fingerprints, this term's idioms included."""
    if a.origin == b.origin == THIS_TERM:
        return a.kept[scale], b.kept[scale]
    return a.prints[scale], b.prints[scale]


def _candidates(answers):
    """Index pairs of answers that share a fingerprint, one of them this term's."""
    pairs = set()
    for scale in ("long", "short"):
        students, everyone = defaultdict(list), defaultdict(list)
        for index, answer in enumerate(answers):
            if scale not in answer.prints:
                continue
            this_term = answer.origin == THIS_TERM
            if this_term:
                for value in answer.kept[scale].starts:
                    students[value].append(index)
            for value in answer.prints[scale].starts:
                everyone[value].append((index, this_term))
        for indices in students.values():
            pairs.update(combinations(indices, 2))
        for holders in everyone.values():
            inside = [i for i, this_term in holders if this_term]
            pairs.update((i, j) for j, this_term in holders if not this_term for i in inside)
    return sorted((min(pair), max(pair)) for pair in pairs)


def _longest_run(units):
    """The first longest run of True in the mask `units`, as a mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], units.astype(np.int8), [0]))))
    longest = np.zeros_like(units)
    if len(edges):
        first = int(np.argmax(edges[1::2] - edges[::2]))
        longest[edges[2 * first]:edges[2 * first + 1]] = True
    return longest


def _compare(exercise, a, b):
    """A Pair, or None when the two share too little to list."""
    scale = _scale(a, b)
    print_a, print_b = _prints(a, b, scale)
    shared = print_a.starts.keys() & print_b.starts.keys()
    if not shared:
        return None
    units_a, units_b = print_a.units(shared), print_b.units(shared)
    if scale == "short":
        # A one-liner is a copy only as a whole: pieces of it recur in any answer that
        # calls the same functions, so the longest run both share is what counts.
        units_a, units_b = _longest_run(units_a), _longest_run(units_b)
        run_a, run_b = int(units_a.sum()), int(units_b.sum())
        score = min(run_a / print_a.coverage, run_b / print_b.coverage)
        if min(run_a, run_b) < MIN_SHARED_SHORT or score < MIN_SCORE_SHORT:
            return None
    else:
        enough = units_a.sum() >= MIN_SHARED if exercise.kind == "code" else \
            len(shared) >= MIN_SHARED_SHINGLES
        if not enough:
            return None
        score = max(units_a.sum() / max(1, print_a.coverage),
                    units_b.sum() / max(1, print_b.coverage))
    return Pair(exercise.grade_id, a, b, float(min(1.0, score)),
                _spans(a, units_a), _spans(b, units_b))


def _spans(answer, units):
    """The character ranges of answer.text that the units (a mask) come from, one or more
    per line (the spacing between two marked tokens of a line is marked with them)."""
    tokens = answer.unit_spans[units]  # a row per unit: a token's once per character
    tokens = tokens[np.concatenate(([True], (tokens[1:] != tokens[:-1]).any(axis=1)))] \
        if len(tokens) else tokens
    spans = []
    for start, end in tokens.tolist():
        if spans and answer.text[spans[-1][1]:start].strip(" \t") == "":
            spans[-1][1] = end
        else:
            spans.append([start, end])
    return [tuple(span) for span in spans]


def _ordered(pair):
    """This term's student first; two of this term's in name order."""
    if pair.a.origin != THIS_TERM or (pair.b.origin == THIS_TERM
                                      and pair.b.owner < pair.a.owner):
        pair.a, pair.b, pair.spans_a, pair.spans_b = pair.b, pair.a, pair.spans_b, pair.spans_a
    return pair


def compare_exercise(exercise, answers, *, progress=None):
    """(pairs highest score first, ExerciseNotes) for one exercise's answers."""
    progress = progress or tqdm(disable=True)
    notes = ExerciseNotes()
    kept = _fingerprint_all(exercise, answers, notes, progress)
    pairs = [_compare(exercise, kept[i], kept[j]) for i, j in _candidates(kept)]
    pairs = [_ordered(pair) for pair in pairs if pair is not None]
    pairs.sort(key=lambda p: (-p.score, p.a.owner, p.b.owner))
    return pairs, notes


def _line_ranges(text, spans):
    """'3-5;9' for the lines the character spans cover (1-based)."""
    lines = sorted({n for start, end in spans
                    for n in range(text.count("\n", 0, start) + 1,
                                   text.count("\n", 0, max(start, end - 1)) + 2)})
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

def _csv_cell(value):
    """The value, with a leading single quote where a spreadsheet would run it."""
    return f"'{value}" if value.startswith(FORMULA_STARTS) else value


def _marked(text, spans):
    out, at = [], 0
    for start, end in spans:
        out.append(html.escape(text[at:start]))
        out.append(f"<mark>{html.escape(text[start:end])}</mark>")
        at = end
    out.append(html.escape(text[at:]))
    return "".join(out)


def _shown(answer, spans):
    cut = (f"\n[cut here: only the first {MAX_ANSWER:,} characters were compared]"
           if answer.cut else "")
    return _marked(answer.text, spans) + html.escape(cut)


_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem;max-width:80rem}
.lead{font-weight:600;border-left:4px solid #b45309;padding:.5rem 1rem;background:#fffbeb}
table{border-collapse:collapse}td,th{padding:.2rem .6rem;text-align:left}
details{margin:.3rem 0;border:1px solid #ddd;border-radius:4px;padding:.3rem .6rem}
summary{cursor:pointer}.side{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
pre{background:#f6f6f6;padding:.5rem;overflow-x:auto;white-space:pre-wrap}
mark{background:#fde68a}.origin{color:#555;font-size:.9em}
.ring{border-left:4px solid #b91c1c;padding:.3rem .8rem;background:#fef2f2}"""


def _left_out(notes):
    names = {"unanswered": ", ".join(notes.unanswered) or "none",
             "cut": ", ".join(notes.cut) or "none"}
    return ("<p class='excluded'>Left out before comparing: the release's own "
            f"{notes.scaffold_lines} line(s) in this cell and stub lines (<code>pass</code>, "
            "<code>...</code>, <code>return None</code>, <code>raise NotImplementedError"
            f"</code>); {notes.common_fingerprints} fingerprint(s) of idioms (passages of at "
            f"most {IDIOM_CHARS} characters of token text that more than {COMMON_SHARE:.0%} "
            "of the class's answers share; earlier terms and known solutions are compared "
            f"with them); answers blank or as released: {html.escape(names['unanswered'])}; "
            f"answers cut at {MAX_ANSWER:,} characters: {html.escape(names['cut'])}.</p>")


def _page(assignment, report):
    parts = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
             f"<title>Similarity: {html.escape(assignment)}</title><style>{_STYLE}</style>"
             f"</head><body><p class='lead'>{html.escape(FIRST_LINE)} A high score changes "
             "no grade and is shown to no student.</p>",
             f"<h1>Similar answers in {html.escape(assignment)}</h1>"]
    if report.not_compared:
        parts.append("<div class='not-compared'><h2>Not compared</h2><ul>")
        parts += [f"<li>{html.escape(owner)}, {html.escape(reason)}</li>"
                  for owner, reason in report.not_compared]
        parts.append("</ul></div>")
    for exercise, (pairs, notes) in report.exercises.items():
        parts.append(f"<section id='{html.escape(exercise.grade_id)}'>"
                     f"<h2>{html.escape(exercise.grade_id)}</h2>{_left_out(notes)}")
        parts += [f"<p class='ring'>Ring: {len(owners)} students hand in one identical "
                  f"answer (the same code once names, comments and spacing are set aside): "
                  f"{html.escape(', '.join(owners))}.</p>" for owners in notes.rings]
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
                f"<pre>{_shown(pair.a, pair.spans_a)}</pre></div>"
                f"<div><h3>{html.escape(pair.b.owner)}</h3>"
                f"<pre>{_shown(pair.b, pair.spans_b)}</pre></div></div></details>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def similarity(*, course, assignment, earlier=(), known=(), log=sys.stderr):
    """Compare every exercise's answers; write the CSV and the page; return the Report."""
    check_sources(earlier, known)
    found = exercises(course, assignment)
    if not found:
        raise SimilarityError(f"release/{assignment} has no answer cells")
    notebooks = sorted({exercise.notebook for exercise in found})
    collected, not_compared, students = hand_ins(course, assignment, notebooks,
                                                 earlier=earlier, known=known)
    if not students:
        raise SimilarityError(f"no hand-ins of {assignment} in submitted/: collect them first")
    gathered = {exercise: gather(exercise, collected) for exercise in found}
    total = sum(len(answers) for answers in gathered.values())
    report = Report({}, not_compared)
    with tqdm(total=total, desc="answers", unit="answer", file=log, disable=None) as progress:
        for exercise, answers in gathered.items():
            report.exercises[exercise] = compare_exercise(exercise, answers, progress=progress)
    folder = course.reports / assignment
    folder.mkdir(parents=True, exist_ok=True)
    rows = sorted((pair for pairs, _ in report.exercises.values() for pair in pairs),
                  key=lambda p: (-p.score, p.exercise, p.a.owner, p.b.owner))
    with open(folder / "similarity.csv", "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for pair in rows:
            writer.writerow([_csv_cell(pair.exercise), _csv_cell(pair.a.owner),
                             _csv_cell(pair.b.owner), f"{pair.score:.3f}",
                             _line_ranges(pair.a.text, pair.spans_a),
                             _line_ranges(pair.b.text, pair.spans_b)])
    (folder / "similarity.html").write_text(_page(assignment, report), encoding="utf-8")
    return report


def cmd_similarity(args):
    from autograder.course import Course

    course = Course.at(args.course)
    try:
        report = similarity(course=course, assignment=args.assignment,
                            earlier=args.earlier or (), known=args.known or ())
    except SimilarityError as problem:
        print(f"similarity: {problem}", file=sys.stderr)
        return 2
    pairs = sum(len(p) for p, _ in report.exercises.values())
    folder = course.reports / args.assignment
    print(f"{FIRST_LINE}\n{pairs} pair(s) over {len(report.exercises)} exercise(s): "
          f"{folder / 'similarity.html'} and {folder / 'similarity.csv'}")
    for exercise, (_, notes) in report.exercises.items():
        for owners in notes.rings:
            print(f"ring in {exercise.grade_id}: {len(owners)} students hand in one "
                  f"identical answer: {', '.join(owners)}")
    for owner, reason in report.not_compared:
        print(f"not compared: {owner}, {reason}")
    return 0


def register(add):
    p = add("similarity", cmd_similarity,
            "rank similar answers per exercise, for a person to look at (changes no grade)")
    p.add_argument("assignment")
    p.add_argument("--earlier", action="append", metavar="TERM_DIR",
                   help="an earlier term's folder (TERM_DIR/submitted/...); repeatable")
    p.add_argument("--known", action="append", metavar="PATH",
                   help="known solutions (a notebook, or a folder of them, e.g. found "
                        "online; matched by content where the cell ids are gone); "
                        "repeatable")
