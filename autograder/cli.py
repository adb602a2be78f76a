"""python -m autograder: one entry point, a subcommand for each step.

  release                      build release/ from source/ and check it leaks nothing
  collect ASSIGNMENT PATH      copy hand-ins (a folder or an LMS zip) into submitted/
  grade ASSIGNMENT             grade everyone submitted, then write reports/ASSIGNMENT/
  grade-examples [ASSIGNMENT]  grade a sample class in a scratch course, compare with
                               its expected.json
  demo                         release, collect and grade every sample class in a
                               scratch course (build/demo-course); print the tables
  roster import FILE           read the LMS class list (Canvas/Moodle/plain CSV) into
                               roster.json; collect then files hand-ins under its ids
  deadlines show ASSIGNMENT    due date, late policy, extensions and each hand-in's
                               lateness (from deadlines.json)
  new-check NAME --function F --reference MODULE:FUNCTION
                               scaffold a trusted check for a new exercise
  feedback ASSIGNMENT --for canvas|moodle|nbgrader
                               zip the feedback pages, each named as the LMS named the
                               student's download, for the LMS's bulk upload; or release
                               them into nbgrader's exchange
  bench [--handins N]          time stock nbgrader against this pipeline on unit 01
                               (--one-student: grade --student X on a class of 300)
  similarity ASSIGNMENT        rank similar answers per exercise (this term, earlier
                               terms, known solutions) for a person to look at
  publish DIR --repo-url URL   write the student edition (lessons, released assignments,
                               student environment, README, site) into DIR

Every subcommand takes --course DIR (default: the repository root).
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from autograder.authoring.release import LeakError, ReleaseError, release
from autograder.course import EXAMPLES_DIR, REPO_ROOT, Course
from autograder.grading.engines import WorkerMismatch
from autograder.grading.grade import SandboxUnavailable, grade_assignment
from autograder.grading.runner import RunSettings
from autograder.grading.sandbox import Limits
from autograder.results import report
from autograder.results.gradescope import register as register_gradescope
from autograder.results.similarity import register as register_similarity
from autograder.term.cli_class import register as register_class_commands
from autograder.term.collect import collect


def _settings(args):
    return RunSettings(cell_timeout=args.cell_timeout, handin_timeout=args.handin_timeout,
                       limits=Limits(memory_bytes=int(args.memory_gb * 1024**3)),
                       use_bwrap=False if args.no_sandbox else None)


def _grade_and_report(*, course, assignment, args, expected=None):
    results = grade_assignment(course=course, assignment=assignment,
                               settings=_settings(args), workers=args.workers,
                               force=args.force, students=getattr(args, "student", None),
                               engine=args.engine, scheduler=args.scheduler,
                               scale_timeouts=not args.no_scaled_timeouts)
    folder, results = report.write_reports(
        course=course, assignment=assignment, results=results,
        show_hidden_tests=getattr(args, "show_hidden_tests", False))
    print(f"\n{assignment}  (reports in {folder})")
    print(report.grade_table(results, expected=expected))
    return results


def expected_totals(assignment):
    """{student: total points} from autograder/examples/ASSIGNMENT/expected.json."""
    path = EXAMPLES_DIR / assignment / "expected.json"
    data = json.loads(path.read_text())
    return {student: float(sum(cells.values())) for student, cells in data.items()}


def example_assignments():
    return sorted(p.name for p in EXAMPLES_DIR.iterdir()
                  if (p / "expected.json").exists()) if EXAMPLES_DIR.is_dir() else []


def _results_match(results, expected_path):
    """Compare per-cell points with expected.json; returns a list of differences."""
    expected = json.loads(expected_path.read_text())
    problems = []
    got = {r["student_id"]: {c["grade_id"]: c["points"] for c in r["cells"]} for r in results}
    for student, cells in expected.items():
        for gid, points in cells.items():
            actual = got.get(student, {}).get(gid)
            if actual != points:
                problems.append(f"{student} {gid}: expected {points}, got {actual}")
    return problems


def cmd_release(args):
    try:
        release(course=Course.at(args.course), assignments=args.assignments or None)
    except (ReleaseError, LeakError) as problem:
        print(f"release failed: {problem}", file=sys.stderr)
        return 1
    return 0


def cmd_collect(args):
    from autograder.term.roster import RosterError

    try:
        outcome = collect(course=Course.at(args.course), assignment=args.assignment,
                          source_path=args.path)
    except (RosterError, FileNotFoundError) as problem:
        print(f"collect: {problem}", file=sys.stderr)
        return 2
    print("\n".join(outcome.lines()))
    return 0


def cmd_grade(args):
    try:
        _grade_and_report(course=Course.at(args.course), assignment=args.assignment,
                          args=args)
    except (ValueError, WorkerMismatch, FileNotFoundError) as problem:
        print(f"grade: {problem}", file=sys.stderr)
        return 2
    return 0


def cmd_grade_examples(args):
    course = Course.at(args.course)
    failures = 0
    for assignment in [args.assignment] if args.assignment else example_assignments():
        with tempfile.TemporaryDirectory(prefix="examples-") as scratch:
            scratch_course = Course(Path(scratch))
            for part in ("source", "release"):
                shutil.copytree(getattr(course, part) / assignment,
                                getattr(scratch_course, part) / assignment)
            collect(course=scratch_course, assignment=assignment,
                    source_path=EXAMPLES_DIR / assignment)
            results = _grade_and_report(course=scratch_course, assignment=assignment,
                                        args=args, expected=expected_totals(assignment))
            problems = _results_match(results, EXAMPLES_DIR / assignment / "expected.json")
            for problem in problems:
                print("MISMATCH", problem)
            failures += len(problems)
    return 1 if failures else 0


DEMO_COURSE = REPO_ROOT / "build" / "demo-course"


def cmd_demo(args):
    """Release, collect and grade every sample class in a scratch course of its own
    (build/demo-course, remade on each run): the real course is never touched."""
    course = Course.at(args.course)
    demo = Course(Path(args.demo_dir) if args.demo_dir else DEMO_COURSE)
    if demo.root == course.root:
        print("demo: the demo course cannot be the course itself", file=sys.stderr)
        return 2
    marker = demo.root / ".demo-course"
    if demo.root.exists() and any(demo.root.iterdir()) and not marker.exists():
        print(f"demo: {demo.root} is not empty and not a demo course: left alone",
              file=sys.stderr)
        return 2
    shutil.rmtree(demo.root, ignore_errors=True)
    demo.root.mkdir(parents=True)
    marker.touch()
    shutil.copytree(course.source, demo.source)
    shutil.copy(course.root / "nbgrader_config.py", demo.root / "nbgrader_config.py")
    release(course=demo, assignments=args.assignments or None)
    mismatches = 0
    for assignment in args.assignments or example_assignments():
        print("\n".join(collect(course=demo, assignment=assignment,
                                source_path=EXAMPLES_DIR / assignment).lines()))
        results = _grade_and_report(course=demo, assignment=assignment, args=args,
                                    expected=expected_totals(assignment))
        mismatches += len(_results_match(results, EXAMPLES_DIR / assignment / "expected.json"))
    print(f"\nThe demo course is {demo.root} (yours is untouched); delete it any time.")
    return 1 if mismatches else 0


def cmd_new_check(args):
    from autograder.authoring.scaffold import ScaffoldError, scaffold_check

    try:
        written = scaffold_check(name=args.name, function=args.function,
                                 reference=args.reference, shapes=args.shapes)
    except ScaffoldError as problem:
        print(f"new-check: {problem}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    print(f"In the exercise's graded cell, after its visible asserts:\n"
          f"### BEGIN HIDDEN TESTS\nfrom normref.checks import check_{args.name}\n"
          f"check_{args.name}({args.function})\n### END HIDDEN TESTS")
    return 0


def cmd_bench(args):
    from autograder.grading.bench import bench_command

    return bench_command(course=Course.at(args.course),
                         handins=args.handins or (300 if args.one_student else 40),
                         workers=args.workers, engines=args.engines,
                         one_student=args.one_student)


def cmd_feedback(args):
    from autograder.results.lms_feedback import (
        NbgraderFailed,
        release_through_nbgrader,
        write_feedback_zip,
    )

    course = Course.at(args.course)
    if not (course.reports / args.assignment / "feedback").is_dir():
        print(f"feedback: no feedback pages for {args.assignment}: grade it first",
              file=sys.stderr)
        return 2
    if args.lms == "nbgrader":
        try:
            released, left_out = release_through_nbgrader(course=course,
                                                          assignment=args.assignment)
        except NbgraderFailed as problem:
            print(f"feedback: {problem}", file=sys.stderr)
            return 1
        print(f"released {len(released)} feedback page(s) into nbgrader's exchange")
        for student, reason in left_out:
            print(f"  left out: {student} ({reason})")
        print(LMS_UPLOAD_STEPS["nbgrader"])
        return 0
    path, members, left_out = write_feedback_zip(course=course, assignment=args.assignment,
                                                 lms=args.lms)
    print(f"wrote {path}: {len(members)} feedback page(s), each named as {args.lms} named "
          "the student's download")
    for student, reason in left_out:
        print(f"  left out: {student} ({reason})")
    print(LMS_UPLOAD_STEPS[args.lms])
    return 0


LMS_UPLOAD_STEPS = {
    "canvas": "In Canvas: the assignment > Submissions > Re-upload Submissions, choose the "
              "zip; each page is attached to that student's submission as a comment.",
    "moodle": "In Moodle: the assignment > View all submissions > Grading action > Upload "
              "multiple feedback files in a zip (the 'Feedback files' type must be on).",
    "nbgrader": "Students fetch it with `nbgrader fetch_feedback ASSIGNMENT` or the "
                "Assignments tab's Fetch Feedback.",
}


def cmd_publish(args):
    from autograder.publishing.publish import publish_command

    return publish_command(args)


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--course", default=None,
                       help="course directory (default: the repository root)")
        p.set_defaults(func=func)
        return p

    def grading_options(p):
        p.add_argument("--workers", type=int, default=None,
                       help="hand-ins graded at once on this machine (default: the number "
                            "of cores); with --scheduler, the cluster's workers decide")
        p.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                       help="grade on the Dask cluster behind this scheduler (default: a "
                            "Dask LocalCluster of --workers processes here)")
        p.add_argument("--engine", choices=("dask", "pool"), default="dask",
                       help="dask (default) or pool: a local process pool, the "
                            "benchmark's baseline")
        p.add_argument("--no-scaled-timeouts", action="store_true",
                       help="give every cell --cell-timeout, instead of ten times the "
                            "reference solution's time for that cell (at least 10 s)")
        p.add_argument("--cell-timeout", type=float, default=30.0,
                       help="the most seconds one cell may run (default 30; the first "
                            "code cell gets 120 for imports)")
        p.add_argument("--handin-timeout", type=float, default=300.0,
                       help="seconds one hand-in may run in all (default 300)")
        p.add_argument("--memory-gb", type=float, default=2.0,
                       help="memory limit of a hand-in's kernel (default 2)")
        p.add_argument("--force", action="store_true",
                       help="regrade hand-ins that already have a current result")
        p.add_argument("--show-hidden-tests", action="store_true",
                       help="show the hidden tests' code on the feedback pages (default: "
                            "folded away, so they can be used again next term)")
        p.add_argument("--no-sandbox", action="store_true",
                       help="run kernels without bubblewrap (resource limits only)")

    p = add("release", cmd_release, "build release/ and check it for leaks")
    p.add_argument("assignments", nargs="*",
                   help="the assignments to rebuild (default: all of them)")
    p = add("collect", cmd_collect, "copy hand-ins into submitted/")
    p.add_argument("assignment")
    p.add_argument("path", help="a folder of hand-ins or an LMS zip")
    p = add("grade", cmd_grade, "grade an assignment and write its reports")
    p.add_argument("assignment")
    p.add_argument("--student", action="append", metavar="ID",
                   help="grade only this student (again, even if current); repeatable")
    grading_options(p)
    p = add("grade-examples", cmd_grade_examples, "grade sample classes in a scratch course")
    p.add_argument("assignment", nargs="?")
    grading_options(p)
    p = add("demo", cmd_demo, "grade every sample class in a scratch course")
    p.add_argument("assignments", nargs="*", help="only these units (default: all)")
    p.add_argument("--demo-dir", default=None,
                   help="where the scratch course goes (default build/demo-course)")
    grading_options(p)
    p = add("bench", cmd_bench, "time stock nbgrader against this pipeline on unit 01")
    p.add_argument("--handins", type=int, default=None,
                   help="hand-ins to grade: 40, or with --one-student 300")
    p.add_argument("--workers", type=int, default=None,
                   help="this pipeline's parallel hand-ins (default: the number of cores)")
    p.add_argument("--engines", action="store_true",
                   help="compare the Dask path with a plain process pool (hand-ins per minute)")
    p.add_argument("--one-student", action="store_true",
                   help="time grade --student X on a graded class of --handins students")
    p = add("new-check", cmd_new_check, "scaffold a trusted check for a new exercise")
    p.add_argument("name", help="the check's name: check_NAME is what a hidden test calls")
    p.add_argument("--function", required=True,
                   help="the name of the student's function the check calls")
    p.add_argument("--reference", required=True, metavar="MODULE:FUNCTION",
                   help="the reference it is compared with, e.g. normref.recipe:token_mean")
    p.add_argument("--shapes", default="4,8 2,3,16",
                   help='input shapes, space separated (default "4,8 2,3,16")')
    p = add("feedback", cmd_feedback,
            "return the feedback pages: a zip for the LMS's bulk upload (Canvas, Moodle), "
            "or nbgrader's release into its exchange")
    p.add_argument("assignment")
    p.add_argument("--for", dest="lms", required=True, choices=("canvas", "moodle", "nbgrader"),
                   help="where the hand-ins came from")
    p = add("publish", cmd_publish, "write the student edition into DIR")
    p.add_argument("dir", help="the edition's folder: empty, or a clone of its repository")
    p.add_argument("--repo-url", required=True,
                   help="the edition's public GitHub repository, https://github.com/OWNER/NAME")
    p.add_argument("--branch", default="main", help="its branch (default main)")
    p.add_argument("--site-url", default=None,
                   help="where the site is served (default: the repository's GitHub Pages)")
    site = p.add_mutually_exclusive_group()
    site.add_argument("--site", default=None,
                      help="a site built for this edition by `make site` (default: build one)")
    site.add_argument("--no-site", action="store_true", help="an edition without the site")
    register_gradescope(add)
    register_similarity(add)
    register_class_commands(sub, add)
    return parser


def main(argv=None):
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse fills an optional positional before the options that follow it
    # (`roster import --course DIR FILE`): give those to the slots the command names.
    for slot in getattr(args, "late_positionals", ()):
        if extra and getattr(args, slot) is None and not extra[0].startswith("-"):
            setattr(args, slot, extra.pop(0))
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args)
    except SandboxUnavailable as problem:  # grade, grade-examples, demo, bench
        print(f"{args.command}: {problem}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
