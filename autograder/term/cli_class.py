"""Class-list subcommands for `python -m autograder`:

  roster import FILE           read an LMS class list (Canvas gradebook export, Moodle
                               participants or grading worksheet, or name,id,email) into
                               roster.json
  roster show                  list the roster
  deadlines show ASSIGNMENT    the due date, late policy and extensions of ASSIGNMENT
                               (from deadlines.json), and each hand-in's lateness
  deadlines times ASSIGNMENT FILE
                               import the LMS's submission times (Canvas's submissions
                               API JSON, or a CSV of id,submitted_at)

autograder/cli.py wires them in with `register(sub, add)`.
"""

import sys

from autograder.course import Course
from autograder.term.deadlines import DeadlinesError, import_submission_times, show_lines
from autograder.term.roster import RosterError, import_roster, load_roster, summary_lines


def cmd_roster(args):
    course = Course.at(args.course)
    try:
        if args.action == "import":
            if not args.file:
                print("roster import needs a FILE (the LMS's CSV export)", file=sys.stderr)
                return 2
            print("\n".join(summary_lines(import_roster(course=course, csv_path=args.file))))
            return 0
        roster = load_roster(course)
    except (RosterError, OSError) as problem:
        print(f"roster: {problem}", file=sys.stderr)
        return 1
    if roster is None:
        print("no roster.json: import one with `python -m autograder roster import FILE`")
        return 1
    print(f"{len(roster.students)} students (a {roster.source} list)")
    for student in roster.students:
        extra = ", ".join(x for x in (student.get("email"),
                                      student.get("lms_id") and f"LMS id {student['lms_id']}")
                          if x)
        print(f"  {student['id']}: {student['name']}" + (f" ({extra})" if extra else ""))
    return 0


def cmd_deadlines(args):
    course = Course.at(args.course)
    try:
        if args.action == "times":
            if not args.file:
                print("deadlines times needs a FILE (the LMS's submission times)",
                      file=sys.stderr)
                return 2
            imported, left = import_submission_times(course=course,
                                                     assignment=args.assignment,
                                                     path=args.file)
            print(f"{args.assignment}: {imported} submission time(s) imported")
            for line in left:
                print(f"  left out: {line}")
            return 0
        print("\n".join(show_lines(course, args.assignment)))
    except DeadlinesError as problem:
        print(f"deadlines: {problem}", file=sys.stderr)
        return 1
    return 0


def register(sub, add):
    """Add `roster` and `deadlines` to cli.py's subcommands (`add(name, func, help)`)."""
    del sub  # every subcommand comes through cli.py's add(), which gives it --course
    p = add("roster", cmd_roster, "import or show the class list (roster.json)")
    p.add_argument("action", choices=["import", "show"])
    p.add_argument("file", nargs="?", help="for import: the LMS's CSV export")
    p.set_defaults(late_positionals=("file",))
    p = add("deadlines", cmd_deadlines,
            "show an assignment's due date, late policy and each hand-in's lateness, or "
            "import the LMS's submission times")
    p.add_argument("action", choices=["show", "times"])
    p.add_argument("assignment")
    p.add_argument("file", nargs="?",
                   help="for times: Canvas's submissions (API JSON) or a CSV of id,submitted_at")
    p.set_defaults(late_positionals=("file",))
