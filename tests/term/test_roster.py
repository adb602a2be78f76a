"""Who is who: an LMS class list becomes roster.json, and hand-ins are filed under its ids.

Issue 14, item 5: two different "John Smith"s were merged and the second one's work was
not collected; one class ended up with three naming styles; there was no roster.
"""

import argparse
import json

import pytest

from autograder.term.cli_class import register
from autograder.term.collect import collect
from autograder.term.roster import RosterError, import_roster, load_roster
from conftest import tiny_course, tiny_notebook, zip_of

ASSIGNMENT = "01_hw"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"

CANVAS_CSV = """Student,ID,SIS User ID,SIS Login ID,Section,01_hw (1234)
    Points Possible,,,,,10
"Smith, John",111,S-1,jsmith1@uni.example,Sec A,
"Smith, John",222,S-2,jsmith2@uni.example,Sec A,
"Lovelace, Ada",12345,S-3,ada@uni.example,Sec B,
"Park, Kim",333,S-4,kim@uni.example,Sec B,
"""

MOODLE_WORKSHEET = """Identifier,Full name,Email address,Status,Grade,Maximum Grade
Participant 4711,John Smith,js@uni.example,Submitted for grading,,10
Participant 4712,Olu Adeyemi,olu@uni.example,Submitted for grading,,10
"""

MOODLE_PARTICIPANTS = """First name,Last name,ID number,Email address
Olu,Adeyemi,u100,olu@uni.example
Bob,Smith,u101,bob@uni.example
Kim,Park,u102,kim@uni.example
"""



@pytest.fixture
def course(tmp_path):
    return tiny_course(tmp_path / "course", ASSIGNMENT)


def _csv(tmp_path, text, name="roster.csv"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_two_john_smiths_without_a_roster_are_not_merged(course, tmp_path):
    """The problem as reported: same name, different Canvas ids -> two students."""
    archive = zip_of(tmp_path / "canvas.zip", {
        f"smithjohn_111_901_{NOTEBOOK}": tiny_notebook("first john"),
        f"smithjohn_222_902_{NOTEBOOK}": tiny_notebook("second john"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["smithjohn_111", "smithjohn_222"]


def test_a_canvas_gradebook_export_is_imported(course, tmp_path):
    summary = import_roster(course=course, csv_path=_csv(tmp_path, CANVAS_CSV))
    assert summary["source"] == "canvas" and summary["students"] == 4
    data = json.loads((course.root / "roster.json").read_text())
    assert data["source"] == "canvas"
    assert [s["id"] for s in data["students"]] == ["111", "222", "12345", "333"]
    assert data["students"][0] == {"id": "111", "name": "Smith, John", "lms_id": "111",
                                   "email": "jsmith1@uni.example", "sis_user_id": "S-1",
                                   "sis_login_id": "jsmith1@uni.example", "section": "Sec A"}
    assert data["lms_assignments"] == [{"name": "01_hw", "id": "1234"}]
    roster = load_roster(course)
    assert roster.lms_column("01_hw") == roster.lms_column("01 HW") == "01_hw (1234)"
    assert roster.lms_column("02_hw") is None and roster.get("111")["section"] == "Sec A"
    assert not [p for p in course.root.iterdir() if p.name.endswith(".tmp")]
    assert load_roster(course).get("12345")["name"] == "Lovelace, Ada"


def test_two_john_smiths_with_a_canvas_roster_stay_two_students(course, tmp_path):
    import_roster(course=course, csv_path=_csv(tmp_path, CANVAS_CSV))
    archive = zip_of(tmp_path / "canvas.zip", {
        f"smithjohn_111_901_{NOTEBOOK}": tiny_notebook("first john"),
        f"smithjohn_LATE_222_902_{NOTEBOOK}": tiny_notebook("second john"),
        f"lovelaceada_12345_903_{NOTEBOOK}": tiny_notebook("ada"),
        f"smithjohn_999_904_{NOTEBOOK}": tiny_notebook("a third john, not enrolled"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["111", "12345", "222"]
    assert (course.submitted / "111" / ASSIGNMENT / NOTEBOOK).read_bytes() == \
        tiny_notebook("first john")
    assert (course.submitted / "222" / ASSIGNMENT / NOTEBOOK).read_bytes() == \
        tiny_notebook("second john")
    unknown = [item for item in report.unmatched if "999" in item]
    assert len(unknown) == 1 and "not in the roster" in unknown[0]
    assert report.unknown == [f"smithjohn_999_904_{NOTEBOOK}"]
    assert not (course.submitted / "smithjohn_999").exists()


def test_a_name_matching_two_roster_entries_is_listed_not_merged(course, tmp_path):
    import_roster(course=course, csv_path=_csv(tmp_path, CANVAS_CSV))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "John Smith.ipynb").write_bytes(tiny_notebook("which john?"))
    (inbox / "Kim Park.ipynb").write_bytes(tiny_notebook("kim"))
    (inbox / "12345.ipynb").write_bytes(tiny_notebook("ada by roster id"))
    report = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert sorted(report.collected) == ["12345", "333"]
    ambiguous = [item for item in report.unmatched if "John Smith" in item]
    assert len(ambiguous) == 1 and "111" in ambiguous[0] and "222" in ambiguous[0]
    assert any("Kim Park.ipynb filed as 333" in note for note in report.notes)


def test_one_id_style_for_a_class_from_moodle_and_folders(course, tmp_path):
    """smithbob, Olu_Adeyemi, kim_park: three styles before; the roster's ids after."""
    import_roster(course=course, csv_path=_csv(tmp_path, MOODLE_PARTICIPANTS))
    archive = zip_of(tmp_path / "moodle.zip", {
        f"Olu Adeyemi_4712_assignsubmission_file_{NOTEBOOK}": tiny_notebook("olu"),
        "smithbob/hw.ipynb": tiny_notebook("bob"),
        "kim_park.ipynb": tiny_notebook("kim"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["u100", "u101", "u102"]
    assert sorted(p.name for p in course.submitted.iterdir()) == ["u100", "u101", "u102"]


def test_a_moodle_worksheet_matches_by_participant_id(course, tmp_path):
    summary = import_roster(course=course, csv_path=_csv(tmp_path, MOODLE_WORKSHEET))
    assert summary["source"] == "moodle"
    archive = zip_of(tmp_path / "moodle.zip", {
        f"John Smith_4711_assignsubmission_file_{NOTEBOOK}": tiny_notebook("john"),
        f"John Smith_4799_assignsubmission_file_{NOTEBOOK}": tiny_notebook("another john"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert report.collected == ["4711"]
    assert [item for item in report.unmatched if "4799" in item]


def test_a_plain_file_without_header_is_imported(course, tmp_path):
    summary = import_roster(course=course, csv_path=_csv(
        tmp_path, "Ada Lovelace,ada,ada@uni.example\nAlan Turing,alan,alan@uni.example\n"))
    assert summary["source"] == "plain" and summary["students"] == 2
    with_header = import_roster(course=course, csv_path=_csv(
        tmp_path, "email,name,id\nada@uni.example,Ada Lovelace,ada\n", "two.csv"))
    assert with_header["removed"] == ["alan"]
    assert load_roster(course).get("ada")["email"] == "ada@uni.example"


def test_a_clashing_or_unknown_csv_is_refused_and_the_old_roster_kept(course, tmp_path):
    import_roster(course=course, csv_path=_csv(tmp_path, CANVAS_CSV))
    before = (course.root / "roster.json").read_bytes()
    with pytest.raises(RosterError, match="given to both"):
        import_roster(course=course, csv_path=_csv(
            tmp_path, "name,id\nAda,7\nBob,7\n", "clash.csv"))
    with pytest.raises(RosterError, match="unrecognised columns"):
        import_roster(course=course, csv_path=_csv(
            tmp_path, "a,b,c,d\n1,2,3,4\n", "odd.csv"))
    assert (course.root / "roster.json").read_bytes() == before


def _run(argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, help_text):  # as autograder/cli.py defines it
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--course", default=None)
        p.set_defaults(func=func)
        return p

    register(sub, add)
    args = parser.parse_args(argv)
    return args.func(args)


def test_the_roster_command_imports_and_shows(course, tmp_path, capsys):
    path = _csv(tmp_path, CANVAS_CSV)
    assert _run(["roster", "import", str(path), "--course", str(course.root)]) == 0
    assert "4 students from a canvas list" in capsys.readouterr().out
    assert _run(["roster", "show", "--course", str(course.root)]) == 0
    assert "12345: Lovelace, Ada" in capsys.readouterr().out
