"""How long `python -m autograder similarity` takes on a large class.

    .venv/bin/python scripts/bench_similarity.py [--students 300] [--assignment 05_pre_post_ln]

A class of STUDENTS hand-ins is made from the assignment's sample hand-ins: each
student takes a sample hand-in at random and rewrites its answers the way a class
varies (its own names for the variables it binds, comments of its own), so that
fingerprints differ from student to student as they do in a real class. Prints the
class size, the exercises, the pairs listed and the seconds the comparison took.
"""

import argparse
import io
import keyword
import random
import shutil
import sys
import tempfile
import time
import tokenize
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from autograder.course import EXAMPLES_DIR, Course  # noqa: E402
from autograder.results import similarity as sim  # noqa: E402

WORDS = ["value", "acc", "tmp", "out", "res", "item", "data", "arr", "t", "z", "q", "w2"]


def _bound_names(source):
    """Names the answer binds itself (assigned, defined, looped over)."""
    names = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return names
    for before, token, after in zip(tokens, tokens[1:], tokens[2:]):
        if token.type == tokenize.NAME and not keyword.iskeyword(token.string):
            if after.string == "=" or before.string in ("def", "for", "class"):
                names.add(token.string)
    return names


def _vary(source, rng):
    """The answer with its own names changed and a comment or two added."""
    renames = {name: f"{rng.choice(WORDS)}_{rng.randrange(1000)}"
               for name in sorted(_bound_names(source)) if rng.random() < 0.5}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        source = tokenize.untokenize(
            (t.type, renames.get(t.string, t.string) if t.type == tokenize.NAME else t.string)
            for t in tokens)
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    lines = source.splitlines()
    for _ in range(rng.randrange(3)):
        at = rng.randrange(len(lines) + 1)
        indent = lines[at - 1][:len(lines[at - 1]) - len(lines[at - 1].lstrip())] if at else ""
        lines.insert(at, f"{indent}# note {rng.randrange(10**6)}")
    return "\n".join(lines)


def make_class(course, assignment, students, seed=0):
    rng = random.Random(seed)
    samples = sorted((EXAMPLES_DIR / assignment).glob("*.ipynb"))
    for number in range(students):
        notebook = nbformat.read(rng.choice(samples), as_version=4)
        for cell in notebook.cells:
            if cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
                cell.source = _vary(cell.source, rng)
        folder = course.submitted / f"student{number:04d}" / assignment
        folder.mkdir(parents=True)
        nbformat.write(notebook, folder / f"{assignment}.ipynb")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--assignment", default="05_pre_post_ln")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="similarity-bench-") as scratch:
        course = Course(Path(scratch))
        shutil.copytree(REPO / "release" / args.assignment, course.release / args.assignment)
        make_class(course, args.assignment, args.students)
        started = time.perf_counter()
        report = sim.similarity(course=course, assignment=args.assignment)
        seconds = time.perf_counter() - started
    pairs = sum(len(p) for p, _ in report.exercises.values())
    print(f"{args.students} students x {len(report.exercises)} exercises ({args.assignment}): "
          f"{pairs} pairs listed in {seconds:.1f} s")


if __name__ == "__main__":
    main()
