"""`python -m autograder roster ...` and `deadlines show` (autograder/term/cli_class.py):
their options, what they print and their exit status.

Each test fails on a small bug in cli_class.py (`make mutation`). The roster and
deadline functions are replaced by recorders, except where a real roster.json is
simpler.
"""

import argparse
from types import SimpleNamespace

import pytest

from autograder import cli
from autograder.course import Course
from autograder.term import cli_class
from autograder.term.deadlines import DeadlinesError
from autograder.term.roster import RosterError


def _subparser(name):
    (sub,) = [a for a in cli.build_parser()._actions
              if isinstance(a, argparse._SubParsersAction)]
    return sub, sub.choices[name]


def test_roster_import_reads_the_file_and_prints_the_summary(tmp_path, monkeypatch, capsys):
    """`roster import FILE`: the file reaches import_roster for this course, its summary
    is printed, exit 0."""
    calls = []

    def import_roster(*, course, csv_path):
        calls.append((course, csv_path))
        return {"students": 2}

    monkeypatch.setattr(cli_class, "import_roster", import_roster)
    monkeypatch.setattr(cli_class, "summary_lines",
                        lambda summary: [f"roster: {summary['students']} students", "  more"])
    assert cli.main(["roster", "import", "class.csv", "--course", str(tmp_path)]) == 0
    assert calls == [(Course(tmp_path.resolve()), "class.csv")]
    assert capsys.readouterr().out == "roster: 2 students\n  more\n"
    # the options first, as the README's other commands write them
    assert cli.main(["roster", "import", "--course", str(tmp_path), "later.csv"]) == 0
    assert calls[-1] == (Course(tmp_path.resolve()), "later.csv")
    with pytest.raises(SystemExit) as refused:
        cli.main(["roster", "import", "--course", str(tmp_path), "a.csv", "b.csv"])
    assert refused.value.code == 2 and "unrecognized arguments: b.csv" in capsys.readouterr().err


def test_roster_import_without_a_file_or_with_a_bad_one(tmp_path, monkeypatch, capsys):
    """No FILE: exit 2 and what is missing; a file the roster cannot use, or cannot
    read: exit 1 with the reason."""
    assert cli.main(["roster", "import", "--course", str(tmp_path)]) == 2
    assert capsys.readouterr().err == \
        "roster import needs a FILE (the LMS's CSV export)\n"
    for error in (RosterError("no id column"), FileNotFoundError("class.csv")):
        def import_roster(*, course, csv_path, error=error):
            raise error

        monkeypatch.setattr(cli_class, "import_roster", import_roster)
        assert cli.main(["roster", "import", "x.csv", "--course", str(tmp_path)]) == 1
        assert capsys.readouterr().err == f"roster: {error}\n"


def test_roster_show_lists_each_student_with_what_is_known(tmp_path, monkeypatch, capsys):
    """`roster show`: the count and the list's source, then each student with email and
    LMS id when known (and nothing in brackets when neither is)."""
    roster = SimpleNamespace(source="canvas", students=[
        {"id": "ada", "name": "Ada L", "email": "ada@x.org", "lms_id": "77"},
        {"id": "bob", "name": "Bob M", "email": "", "lms_id": "88"},
        {"id": "cy", "name": "Cy N", "email": "cy@x.org"},
        {"id": "dee", "name": "Dee O", "lms_id": None}])
    seen = []
    monkeypatch.setattr(cli_class, "load_roster", lambda course: seen.append(course) or roster)
    assert cli.main(["roster", "show", "--course", str(tmp_path)]) == 0
    assert seen == [Course(tmp_path.resolve())]
    assert capsys.readouterr().out == (
        "4 students (a canvas list)\n"
        "  ada: Ada L (ada@x.org, LMS id 77)\n"
        "  bob: Bob M (LMS id 88)\n"
        "  cy: Cy N (cy@x.org)\n"
        "  dee: Dee O\n")


def test_roster_show_without_a_roster_or_with_a_broken_one(tmp_path, monkeypatch, capsys):
    """No roster.json: exit 1 and how to make one; an unreadable one: exit 1 and why."""
    assert cli.main(["roster", "show", "--course", str(tmp_path)]) == 1
    assert capsys.readouterr().out == \
        "no roster.json: import one with `python -m autograder roster import FILE`\n"

    def broken(course):
        raise RosterError("roster.json is not JSON")

    monkeypatch.setattr(cli_class, "load_roster", broken)
    assert cli.main(["roster", "show", "--course", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "roster: roster.json is not JSON\n"


def test_deadlines_show_prints_the_lines_or_the_problem(tmp_path, monkeypatch, capsys):
    """`deadlines show A`: the lines for that course and assignment, exit 0; an unusable
    deadlines.json: exit 1 with the reason."""
    calls = []

    def show_lines(course, assignment):
        calls.append((course, assignment))
        return ["due 2026-01-01", "  ada: on time"]

    monkeypatch.setattr(cli_class, "show_lines", show_lines)
    assert cli.main(["deadlines", "show", "01_a", "--course", str(tmp_path)]) == 0
    assert calls == [(Course(tmp_path.resolve()), "01_a")]
    assert capsys.readouterr().out == "due 2026-01-01\n  ada: on time\n"

    def bad(course, assignment):
        raise DeadlinesError("deadlines.json: no due date for 01_a")

    monkeypatch.setattr(cli_class, "show_lines", bad)
    assert cli.main(["deadlines", "show", "01_a", "--course", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "deadlines: deadlines.json: no due date for 01_a\n"


def test_the_subcommands_accept_their_actions_only(capsys):
    """roster takes import or show, deadlines takes show or times and an assignment."""
    parser = cli.build_parser()
    for argv in (["roster", "list"], ["deadlines", "edit", "01_a"], ["deadlines", "show"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    args = parser.parse_args(["roster", "show"])
    assert (args.action, args.file, args.func) == ("show", None, cli_class.cmd_roster)
    args = parser.parse_args(["deadlines", "show", "01_a"])
    assert (args.action, args.assignment, args.func) == ("show", "01_a",
                                                         cli_class.cmd_deadlines)
    capsys.readouterr()


def test_the_help_reads_as_documented():
    """What `roster --help` and `deadlines --help` tell an instructor, word for word,
    and that both take --course like every subcommand."""
    sub, _ = _subparser("roster")
    summaries = {c.dest: c.help for c in sub._choices_actions}
    assert summaries["roster"] == "import or show the class list (roster.json)"
    assert summaries["deadlines"] == ("show an assignment's due date, late policy and each "
                                      "hand-in's lateness, or import the LMS's submission "
                                      "times")
    helps = {name: {a.dest: (a.choices, a.help) for a in sub.choices[name]._actions
                    if a.dest != "help"} for name in ("roster", "deadlines")}
    course = (None, "course directory (default: the repository root)")
    assert helps == {
        "roster": {"course": course, "action": (["import", "show"], None),
                   "file": (None, "for import: the LMS's CSV export")},
        "deadlines": {"course": course, "action": (["show", "times"], None),
                      "assignment": (None, None),
                      "file": (None, "for times: Canvas's submissions (API JSON) or a CSV of "
                                     "id,submitted_at")}}
