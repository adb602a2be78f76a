"""Every subcommand's options reach the function it calls (the parser is the only
thing between a person and the grader).
"""

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import autograder.authoring.scaffold
import autograder.grading.bench
import autograder.publishing.publish
from autograder import cli
from autograder.authoring.release import LeakError, ReleaseError
from autograder.cli import build_parser
from autograder.course import Course
from autograder.grading.engines import WorkerMismatch
from autograder.grading.runner import RunSettings
from autograder.grading.sandbox import Limits
from autograder.results import report
from autograder.term.roster import RosterError


def test_bench_takes_engines_and_grade_takes_its_cluster_options():
    args = build_parser().parse_args(["bench", "--handins", "8", "--engines"])
    assert (args.handins, args.engines) == (8, True)
    args = build_parser().parse_args(["grade", "01_the_recipe", "--student", "a",
                                      "--student", "b", "--scheduler", "tcp://h:8786",
                                      "--engine", "pool", "--no-scaled-timeouts"])
    assert args.student == ["a", "b"] and args.scheduler == "tcp://h:8786"
    assert args.engine == "pool" and args.no_scaled_timeouts


# `python -m autograder` (autograder/cli.py): every option reaches the function its
# subcommand calls, each subcommand's exit status and messages, and the help an
# instructor reads.


class Recorder:
    """A stand-in that records its keyword arguments and returns `result`."""

    def __init__(self, result=None, error=None):
        self.calls, self.result, self.error = [], result, error

    def __call__(self, *args, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        return self.result(**kwargs) if callable(self.result) else self.result


RESULTS = [{"student_id": "ada", "score": 3.0,
            "cells": [{"grade_id": "c1", "points": 1.0}, {"grade_id": "c2", "points": 2.0}]}]


@pytest.fixture
def grading(monkeypatch):
    """grade_assignment, write_reports and grade_table replaced by recorders."""
    fakes = SimpleNamespace(
        grade=Recorder(RESULTS),
        reports=Recorder(lambda **kw: (Path("/reports") / kw["assignment"], kw["results"])),
        table=Recorder("THE TABLE"))
    monkeypatch.setattr(cli, "grade_assignment", fakes.grade)
    monkeypatch.setattr(report, "write_reports", fakes.reports)

    def grade_table(results, *, expected=None):
        fakes.table.calls.append({"results": results, "expected": expected})
        return "THE TABLE"

    monkeypatch.setattr(report, "grade_table", grade_table)
    return fakes


def _course(root):
    for part in ("source", "release"):
        (root / part / "01_x").mkdir(parents=True)
        (root / part / "01_x" / "01_x.ipynb").write_text(f"{part} notebook")
    (root / "nbgrader_config.py").write_text("c = get_config()\n")
    return Course(root.resolve())


@pytest.fixture
def examples(tmp_path, monkeypatch):
    """A sample class for 01_x whose expected.json wants ada 1 + 2 and bob 0."""
    folder = tmp_path / "examples"
    (folder / "01_x").mkdir(parents=True)
    (folder / "01_x" / "expected.json").write_text(json.dumps(
        {"ada": {"c1": 1.0, "c2": 2}, "bob": {"c1": 0}}))
    (folder / "02_no_expected").mkdir()
    (folder / "00_also").mkdir()
    (folder / "00_also" / "expected.json").write_text(json.dumps({"cy": {"a": 0.5}}))
    (folder / "README.md").write_text("x")
    monkeypatch.setattr(cli, "EXAMPLES_DIR", folder)
    return folder


# -- grading options -------------------------------------------------------------------

def test_grade_defaults_reach_the_grader(tmp_path, grading, capsys):
    """`grade A` alone: 30 s cells, 300 s hand-ins, 2 GiB, the sandbox on, Dask on the
    cores here, scaled timeouts, no forced regrade, everyone, hidden tests folded."""
    course = _course(tmp_path / "course")
    assert cli.main(["grade", "01_x", "--course", str(course.root)]) == 0
    (call,) = grading.grade.calls
    assert call == {"course": course, "assignment": "01_x",
                    "settings": RunSettings(cell_timeout=30.0, handin_timeout=300.0,
                                            limits=Limits(memory_bytes=2 * 1024**3),
                                            use_bwrap=None),
                    "workers": None, "force": False, "students": None, "engine": "dask",
                    "scheduler": None, "scale_timeouts": True}
    assert grading.reports.calls == [{"course": course, "assignment": "01_x",
                                      "results": RESULTS, "show_hidden_tests": False}]
    assert grading.table.calls == [{"results": RESULTS, "expected": None}]
    assert capsys.readouterr().out == "\n01_x  (reports in /reports/01_x)\nTHE TABLE\n"


def test_every_grading_option_reaches_the_grader(tmp_path, grading):
    """Each option of `grade`, with its type: a dropped or mistyped option grades with
    the wrong limits, workers, cluster or students."""
    course = _course(tmp_path / "course")
    assert cli.main(["grade", "01_x", "--course", str(course.root), "--student", "a",
                     "--student", "b", "--workers", "3", "--scheduler", "tcp://h:8786",
                     "--engine", "pool", "--no-scaled-timeouts", "--cell-timeout", "12.5",
                     "--handin-timeout", "99.5", "--memory-gb", "0.5", "--force",
                     "--show-hidden-tests", "--no-sandbox"]) == 0
    (call,) = grading.grade.calls
    assert call["settings"] == RunSettings(cell_timeout=12.5, handin_timeout=99.5,
                                           limits=Limits(memory_bytes=512 * 1024**2),
                                           use_bwrap=False)
    assert (call["workers"], call["force"], call["students"], call["engine"],
            call["scheduler"], call["scale_timeouts"]) == (3, True, ["a", "b"], "pool",
                                                            "tcp://h:8786", False)
    assert grading.reports.calls[0]["show_hidden_tests"] is True


def test_hidden_tests_stay_folded_unless_the_options_ask(tmp_path, grading):
    """Options without --show-hidden-tests at all (not only with it unset) fold the
    hidden tests away on the feedback pages."""
    args = cli.build_parser().parse_args(["grade", "01_x", "--course", str(tmp_path)])
    del args.show_hidden_tests
    cli._grade_and_report(course=Course(tmp_path), assignment="01_x", args=args)
    assert grading.reports.calls[0]["show_hidden_tests"] is False


def test_grade_refuses_an_unknown_engine_and_a_missing_subcommand(capsys):
    """--engine takes dask or pool only; a subcommand is required."""
    assert cli.build_parser().parse_args(["grade", "a", "--engine", "dask"]).engine == "dask"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["grade", "a", "--engine", "threads"])
    assert "invalid choice: 'threads'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([])
    assert "required: command" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["release"]).command == "release"


@pytest.mark.parametrize("error", [ValueError("no such assignment"),
                                   WorkerMismatch("the workers run other code")])
def test_a_grading_error_exits_2_with_its_message(tmp_path, grading, capsys, error):
    """A refusal of the grader is one line on stderr and exit status 2."""
    grading.grade.error = error
    assert cli.main(["grade", "01_x", "--course", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"grade: {error}\n"


def test_grading_an_assignment_without_a_source_notebook_says_so(tmp_path, capsys):
    """An assignment whose source/ folder holds no notebook (a typo, a half-copied
    course) is one line and exit status 2, not a traceback."""
    (tmp_path / "source" / "01_x").mkdir(parents=True)
    (tmp_path / "submitted" / "ada" / "01_x").mkdir(parents=True)
    assert cli.main(["grade", "01_x", "--course", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "grade: source/01_x holds no notebook\n"


# -- sample classes --------------------------------------------------------------------

def test_expected_totals_and_example_assignments(examples):
    """A sample class's expected total per student is the sum of its cells, as floats;
    the sample classes are the folders with an expected.json, sorted."""
    totals = cli.expected_totals("01_x")
    assert totals == {"ada": 3.0, "bob": 0.0} and isinstance(totals["ada"], float)
    assert cli.example_assignments() == ["00_also", "01_x"]


def test_no_examples_folder_means_no_sample_classes(tmp_path, monkeypatch):
    """A course without autograder/examples has no sample classes (no crash)."""
    monkeypatch.setattr(cli, "EXAMPLES_DIR", tmp_path / "missing")
    assert cli.example_assignments() == []


def test_results_match_names_each_cell_that_differs(tmp_path):
    """Every expected cell compared: a wrong score and a student missing altogether
    are both named."""
    path = tmp_path / "expected.json"
    path.write_text(json.dumps({"ada": {"c1": 1.0, "c2": 2}, "bob": {"c1": 0}}))
    assert cli._results_match(RESULTS, path) == ["bob c1: expected 0, got None"]
    wrong = [{"student_id": "ada", "cells": [{"grade_id": "c1", "points": 1.0},
                                             {"grade_id": "c2", "points": 1.5}]},
             {"student_id": "bob", "cells": [{"grade_id": "c1", "points": 0.0}]}]
    assert cli._results_match(wrong, path) == ["ada c2: expected 2, got 1.5"]


def test_grade_examples_grades_each_sample_class_in_a_scratch_course(
        tmp_path, examples, grading, monkeypatch, capsys):
    """Each sample class is collected into a scratch copy of the course (source and
    release of that assignment), graded with the options, compared with its
    expected.json: a mismatch is printed and exits 1; the course is not touched."""
    course = _course(tmp_path / "course")
    seen = []

    def collect(*, course, assignment, source_path):
        seen.append((course.root, assignment, source_path,
                     (course.source / assignment / "01_x.ipynb").read_text(),
                     (course.release / assignment / "01_x.ipynb").read_text()))

    monkeypatch.setattr(cli, "collect", collect)
    assert cli.main(["grade-examples", "01_x", "--course", str(course.root),
                     "--workers", "2"]) == 1
    ((scratch, assignment, source_path, source_text, release_text),) = seen
    assert scratch != course.root and not scratch.exists()
    assert scratch.name.startswith("examples-")  # the "reports in" line shows this folder
    assert (assignment, source_path) == ("01_x", examples / "01_x")
    assert (source_text, release_text) == ("source notebook", "release notebook")
    assert grading.grade.calls[0]["workers"] == 2
    assert grading.grade.calls[0]["course"].root == scratch
    assert grading.table.calls[0]["expected"] == {"ada": 3.0, "bob": 0.0}
    assert "MISMATCH bob c1: expected 0, got None" in capsys.readouterr().out
    assert sorted(p.name for p in course.root.iterdir()) == [
        "nbgrader_config.py", "release", "source"]


def test_grade_examples_of_every_sample_class_passes_when_all_match(
        tmp_path, examples, grading, monkeypatch):
    """Without an assignment, every sample class is graded; all matching exits 0."""
    course = _course(tmp_path / "course")
    (course.source / "00_also").mkdir()
    (course.release / "00_also").mkdir()
    done = []
    monkeypatch.setattr(cli, "collect", lambda **kw: done.append(kw["assignment"]))
    grading.grade.result = lambda **kw: MATCHING
    assert cli.main(["grade-examples", "--course", str(course.root)]) == 0
    assert done == ["00_also", "01_x"]
    # The first sample class mismatching fails the run, whatever the last one does.
    grading.grade.result = lambda **kw: MATCHING if kw["assignment"] == "01_x" else []
    assert cli.main(["grade-examples", "--course", str(course.root)]) == 1


# -- the demo --------------------------------------------------------------------------

MATCHING = [{"student_id": "ada", "cells": [{"grade_id": "c1", "points": 1.0},
                                           {"grade_id": "c2", "points": 2}]},
            {"student_id": "bob", "cells": [{"grade_id": "c1", "points": 0}]},
            {"student_id": "cy", "cells": [{"grade_id": "a", "points": 0.5}]}]


class CollectReport:
    def __init__(self, assignment):
        self.assignment = assignment

    def lines(self):
        return [f"collected {self.assignment}", "  second line"]


@pytest.fixture
def demo_fakes(monkeypatch, grading, examples):
    fakes = SimpleNamespace(release=Recorder(), collect=Recorder(
        lambda **kw: CollectReport(kw["assignment"])))
    monkeypatch.setattr(cli, "release", fakes.release)
    monkeypatch.setattr(cli, "collect", fakes.collect)
    fakes.grading = grading
    return fakes


def test_demo_remakes_its_scratch_course_and_grades_every_sample_class(
        tmp_path, demo_fakes, monkeypatch, capsys):
    """The demo course (build/demo-course by default) is remade from the course's
    source/ and config, released, and every sample class collected and graded in it;
    the course itself is untouched; a mismatch exits 1."""
    course = _course(tmp_path / "course")
    demo_root = tmp_path / "deep" / "build" / "demo-course"
    monkeypatch.setattr(cli, "DEMO_COURSE", demo_root)
    # 00_also mismatches, 01_x (graded last) matches: still a failure.
    demo_fakes.grading.grade.result = lambda **kw: MATCHING if kw["assignment"] == "01_x" \
        else []
    assert cli.main(["demo", "--course", str(course.root)]) == 1
    assert (demo_root / ".demo-course").is_file()
    assert (demo_root / "source" / "01_x" / "01_x.ipynb").read_text() == "source notebook"
    assert (demo_root / "nbgrader_config.py").read_text() == "c = get_config()\n"
    demo = Course(demo_root)
    assert demo_fakes.release.calls == [{"course": demo, "assignments": None}]
    assert demo_fakes.collect.calls == [
        {"course": demo, "assignment": name, "source_path": cli.EXAMPLES_DIR / name}
        for name in ("00_also", "01_x")]
    assert [c["expected"] for c in demo_fakes.grading.table.calls] == [
        {"cy": 0.5}, {"ada": 3.0, "bob": 0.0}]
    assert [c["course"] for c in demo_fakes.grading.grade.calls] == [demo, demo]
    assert [c["course"] for c in demo_fakes.grading.reports.calls] == [demo, demo]
    out = capsys.readouterr().out
    assert "collected 01_x\n  second line\n" in out
    assert out.endswith(f"\nThe demo course is {demo_root} (yours is untouched); "
                        "delete it any time.\n")
    # A second run starts from scratch: what the last run left is gone.
    (demo_root / "left-over").write_text("x")
    demo_fakes.grading.grade.result = [
        {"student_id": "cy", "cells": [{"grade_id": "a", "points": 0.5}]}]
    assert cli.main(["demo", "00_also", "--course", str(course.root)]) == 0
    assert not (demo_root / "left-over").exists()
    assert demo_fakes.release.calls[-1] == {"course": demo, "assignments": ["00_also"]}
    assert demo_fakes.collect.calls[-1]["assignment"] == "00_also"


def test_demo_refuses_the_course_itself_and_a_folder_of_other_work(
        tmp_path, demo_fakes, capsys):
    """--demo-dir pointing at the course, or at a non-empty folder that is not a demo
    course, is refused with exit 2 and nothing deleted."""
    course = _course(tmp_path / "course")
    assert cli.main(["demo", "--course", str(course.root), "--demo-dir",
                     str(course.root)]) == 2
    assert capsys.readouterr().err == "demo: the demo course cannot be the course itself\n"
    work = tmp_path / "work"
    work.mkdir()
    (work / "thesis.tex").write_text("mine")
    assert cli.main(["demo", "--course", str(course.root), "--demo-dir", str(work)]) == 2
    assert capsys.readouterr().err == f"demo: {work} is not empty and not a demo course: " \
                                      "left alone\n"
    assert (work / "thesis.tex").read_text() == "mine" and demo_fakes.release.calls == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["demo", "00_also", "--course", str(course.root), "--demo-dir",
                     str(empty)]) == 1  # 00_also's cy is not graded by the fake: mismatch
    assert (empty / ".demo-course").is_file()


# -- release and collect ---------------------------------------------------------------

def test_release_passes_the_assignments_or_none(tmp_path, monkeypatch, capsys):
    """`release` rebuilds all (None) or the named assignments; a failure is exit 1 with
    the reason."""
    fake = Recorder()
    monkeypatch.setattr(cli, "release", fake)
    assert cli.main(["release", "--course", str(tmp_path)]) == 0
    assert cli.main(["release", "01_a", "02_b", "--course", str(tmp_path)]) == 0
    assert fake.calls == [{"course": Course(tmp_path.resolve()), "assignments": None},
                          {"course": Course(tmp_path.resolve()), "assignments": ["01_a", "02_b"]}]
    for error in (ReleaseError("nbgrader could not build 01_a"), LeakError("a leak")):
        fake.error = error
        assert cli.main(["release", "--course", str(tmp_path)]) == 1
        assert capsys.readouterr().err == f"release failed: {error}\n"


def test_collect_passes_the_assignment_and_path(tmp_path, monkeypatch, capsys):
    """`collect A PATH` hands both to collect and prints its report; a missing path or
    a roster problem is exit 2."""
    fake = Recorder(lambda **kw: CollectReport(kw["assignment"]))
    monkeypatch.setattr(cli, "collect", fake)
    assert cli.main(["collect", "01_a", "hand-ins.zip", "--course", str(tmp_path)]) == 0
    assert fake.calls == [{"course": Course(tmp_path.resolve()), "assignment": "01_a",
                           "source_path": "hand-ins.zip"}]
    assert capsys.readouterr().out == "collected 01_a\n  second line\n"
    for error in (FileNotFoundError("no hand-ins.zip"), RosterError("two rows for ada")):
        fake.error = error
        assert cli.main(["collect", "01_a", "x", "--course", str(tmp_path)]) == 2
        assert capsys.readouterr().err == f"collect: {error}\n"


# -- new-check, bench, publish ---------------------------------------------------------

def test_new_check_passes_its_options_and_says_what_to_paste(monkeypatch, capsys):
    """The name, function, reference and shapes reach the scaffold (shapes default
    "4,8 2,3,16"); the hidden-test lines to paste name the check and the function."""
    fake = Recorder([Path("a_probes.py"), Path("a_judges.py")])
    monkeypatch.setattr(autograder.authoring.scaffold, "scaffold_check", fake)
    assert cli.main(["new-check", "scaled", "--function", "scale", "--reference",
                     "numpy:negative"]) == 0
    assert cli.main(["new-check", "scaled", "--function", "scale", "--reference",
                     "numpy:negative", "--shapes", "3 2,5"]) == 0
    assert fake.calls == [
        {"name": "scaled", "function": "scale", "reference": "numpy:negative",
         "shapes": "4,8 2,3,16"},
        {"name": "scaled", "function": "scale", "reference": "numpy:negative",
         "shapes": "3 2,5"}]
    out = capsys.readouterr().out
    assert out.startswith("wrote a_probes.py\nwrote a_judges.py\nIn the exercise's graded "
                          "cell, after its visible asserts:\n### BEGIN HIDDEN TESTS\n"
                          "from normref.checks import check_scaled\ncheck_scaled(scale)\n"
                          "### END HIDDEN TESTS\n")


def test_new_check_refusals(monkeypatch, capsys):
    """A refused scaffold is exit 2 with its reason; --function and --reference are
    required."""
    fake = Recorder(error=autograder.authoring.scaffold.ScaffoldError("name taken"))
    monkeypatch.setattr(autograder.authoring.scaffold, "scaffold_check", fake)
    assert cli.main(["new-check", "x", "--function", "f", "--reference", "m:f"]) == 2
    assert capsys.readouterr().err == "new-check: name taken\n"
    for missing in (["--function", "f"], ["--reference", "m:f"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["new-check", "x", *missing])


def test_bench_options_reach_the_benchmark(tmp_path, monkeypatch):
    """--handins (40, or 300 with --one-student), --workers, --engines and --one-student
    reach bench_command, whose exit status is the command's."""
    fake = Recorder(7)
    monkeypatch.setattr(autograder.grading.bench, "bench_command", fake)
    assert cli.main(["bench", "--course", str(tmp_path)]) == 7
    assert cli.main(["bench", "--handins", "8", "--workers", "2", "--engines"]) == 7
    assert cli.main(["bench", "--one-student"]) == 7
    assert fake.calls == [
        {"course": Course(tmp_path.resolve()), "handins": 40, "workers": None,
         "engines": False, "one_student": False},
        {"course": Course.at(), "handins": 8, "workers": 2, "engines": True,
         "one_student": False},
        {"course": Course.at(), "handins": 300, "workers": None, "engines": False,
         "one_student": True}]


def test_publish_options_reach_the_publisher(tmp_path, monkeypatch, capsys):
    """The folder, repository, branch (default main), site address and --site or
    --no-site (not both) reach publish_command."""
    fake = Recorder(3)
    monkeypatch.setattr(autograder.publishing.publish, "publish_command",
                        lambda args: fake(**vars(args)))
    assert cli.main(["publish", "out", "--repo-url", "https://github.com/a/b"]) == 3
    assert cli.main(["publish", "out", "--repo-url", "https://github.com/a/b", "--branch",
                     "t2", "--site-url", "https://x.org/", "--site", "built",
                     "--course", "c"]) == 3
    assert cli.main(["publish", "out", "--repo-url", "https://github.com/a/b",
                     "--no-site"]) == 3
    keys = ("dir", "repo_url", "branch", "site_url", "site", "no_site", "course")
    assert [tuple(call[k] for k in keys) for call in fake.calls] == [
        ("out", "https://github.com/a/b", "main", None, None, False, None),
        ("out", "https://github.com/a/b", "t2", "https://x.org/", "built", False, "c"),
        ("out", "https://github.com/a/b", "main", None, None, True, None)]
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["publish", "o", "--repo-url", "u", "--site", "s",
                                       "--no-site"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["publish", "o"])
    capsys.readouterr()


# -- the help ----------------------------------------------------------------------------

COURSE_HELP = "course directory (default: the repository root)"
GRADING_HELP = {
    "--workers": (None, "hand-ins graded at once on this machine (default: the number of "
                        "cores); with --scheduler, the cluster's workers decide"),
    "--scheduler": ("tcp://HOST:8786", "grade on the Dask cluster behind this scheduler "
                                       "(default: a Dask LocalCluster of --workers "
                                       "processes here)"),
    "--engine": (None, "dask (default) or pool: a local process pool, the benchmark's "
                       "baseline"),
    "--no-scaled-timeouts": (None, "give every cell --cell-timeout, instead of ten times "
                                   "the reference solution's time for that cell (at least "
                                   "10 s)"),
    "--cell-timeout": (None, "the most seconds one cell may run (default 30; the first code "
                             "cell gets 120 for imports)"),
    "--handin-timeout": (None, "seconds one hand-in may run in all (default 300)"),
    "--memory-gb": (None, "memory limit of a hand-in's kernel (default 2)"),
    "--force": (None, "regrade hand-ins that already have a current result"),
    "--show-hidden-tests": (None, "show the hidden tests' code on the feedback pages "
                                  "(default: folded away, so they can be used again next "
                                  "term)"),
    "--no-sandbox": (None, "run kernels without bubblewrap (resource limits only)"),
}
HELP = {
    "release": ("build release/ and check it for leaks", {
        "assignments": (None, "the assignments to rebuild (default: all of them)")}),
    "collect": ("copy hand-ins into submitted/", {
        "assignment": (None, None), "path": (None, "a folder of hand-ins or an LMS zip")}),
    "grade": ("grade an assignment and write its reports", {
        "assignment": (None, None),
        "--student": ("ID", "grade only this student (again, even if current); "
                            "repeatable"), **GRADING_HELP}),
    "grade-examples": ("grade sample classes in a scratch course", {
        "assignment": (None, None), **GRADING_HELP}),
    "demo": ("grade every sample class in a scratch course", {
        "assignments": (None, "only these units (default: all)"),
        "--demo-dir": (None, "where the scratch course goes (default build/demo-course)"),
        **GRADING_HELP}),
    "bench": ("time stock nbgrader against this pipeline on unit 01", {
        "--handins": (None, "hand-ins to grade: 40, or with --one-student 300"),
        "--workers": (None, "this pipeline's parallel hand-ins (default: the number of "
                            "cores)"),
        "--engines": (None, "compare the Dask path with a plain process pool (hand-ins per "
                            "minute)"),
        "--one-student": (None, "time grade --student X on a graded class of --handins "
                                "students")}),
    "new-check": ("scaffold a trusted check for a new exercise", {
        "name": (None, "the check's name: check_NAME is what a hidden test calls"),
        "--function": (None, "the name of the student's function the check calls"),
        "--reference": ("MODULE:FUNCTION", "the reference it is compared with, e.g. "
                                           "normref.recipe:token_mean"),
        "--shapes": (None, 'input shapes, space separated (default "4,8 2,3,16")')}),
    "publish": ("write the student edition into DIR", {
        "dir": (None, "the edition's folder: empty, or a clone of its repository"),
        "--repo-url": (None, "the edition's public GitHub repository, "
                             "https://github.com/OWNER/NAME"),
        "--branch": (None, "its branch (default main)"),
        "--site-url": (None, "where the site is served (default: the repository's GitHub "
                             "Pages)"),
        "--site": (None, "a site built for this edition by `make site` (default: build "
                         "one)"),
        "--no-site": (None, "an edition without the site")}),
}


def _subcommands():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, sub


def test_the_help_reads_as_documented():
    """What `python -m autograder SUBCOMMAND --help` tells an instructor, word for word:
    each subcommand's one-line summary, and each option's metavar and help (cli_class's
    roster and deadlines are pinned in their own tests)."""
    _, sub = _subcommands()
    summaries = {c.dest: c.help for c in sub._choices_actions}
    for name, (summary, options) in HELP.items():
        assert summaries[name] == summary, name
        found = {(a.option_strings[-1] if a.option_strings else a.dest): (a.metavar, a.help)
                 for a in sub.choices[name]._actions if a.dest not in ("help", "course")}
        assert found == options, name
        (course,) = [a for a in sub.choices[name]._actions if a.dest == "course"]
        assert (course.option_strings, course.default, course.help) == (
            ["--course"], None, COURSE_HELP)


def test_every_default_the_help_states_is_the_real_default():
    """A help text that says "(default N)" must be right about N."""
    _, sub = _subcommands()
    checked = 0
    for name, subparser in sub.choices.items():
        for action in subparser._actions:
            match = re.search(r"\(default:? ([\w.\"', ]+?)[;)]", action.help or "")
            if match and action.option_strings and not match.group(1).startswith(
                    ("the ", "a ", "all", "folded", "build")):
                stated = match.group(1).strip('"')
                assert str(action.default).removesuffix(".0") == stated, (name, action.dest)
                checked += 1
    assert checked >= 11


def test_the_overview_keeps_its_layout_and_name(capsys):
    """`python -m autograder --help` shows the module's overview with its columns as
    written (raw), under the name people type."""
    parser, _ = _subcommands()
    text = parser.format_help()
    assert text.startswith("usage: python -m autograder [-h]")
    assert ("  grade-examples [ASSIGNMENT]  grade a sample class in a scratch course, "
            "compare with\n                               its expected.json\n") in text
    with pytest.raises(SystemExit):
        cli.main(["grade", "--help"])
    assert capsys.readouterr().out.startswith("usage: python -m autograder grade")
