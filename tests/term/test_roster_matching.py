"""The class list: LMS exports read into roster.json, and hand-ins matched to its ids.

Each test fails on a small bug in autograder/term/roster.py (`make mutation`): a Canvas
export whose "Points Possible" row becomes a student, two John Smiths merged into one,
a hand-in filed under the wrong student, an id that is not safe as a folder name.
"""

import json
import locale
import os
import stat

import pytest

from autograder.term import roster as roster_module
from autograder.term.roster import (
    Roster,
    RosterError,
    import_roster,
    load_roster,
    name_keys,
    name_tokens,
    safe_id,
    summary_lines,
)
from conftest import tiny_course

ASSIGNMENT = "01_hw"


@pytest.fixture
def course(tmp_path):
    return tiny_course(tmp_path / "course", ASSIGNMENT)


@pytest.fixture
def ascii_locale():
    """A machine whose locale is plain C/ASCII: roster.json is still UTF-8."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    yield
    locale.setlocale(locale.LC_CTYPE, old)


def _csv(tmp_path, text, name="class.csv", encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


def _people(course, tmp_path, text, **kw):
    summary = import_roster(course=course, csv_path=_csv(tmp_path, text, **kw))
    data = json.loads((course.root / "roster.json").read_text(encoding="utf-8"))
    return summary, data


# --- ids and names --------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    (" Ada Lovelace ", "Ada_Lovelace"), ("._x._", "x"), (12345, "12345"),
    ("a/b..c", "a_b..c"), ("Xavier-Y.Z_0", "Xavier-Y.Z_0"), ("../..", ""),
    ("Zoë O'Brien", "Zo_O_Brien"), ("x\t\ny", "x_y"), ("Ünal", "nal"),
])
def test_safe_id_keeps_only_folder_safe_characters(text, expected):
    """An id becomes a folder name: anything but letters, digits, _ . - is replaced."""
    assert safe_id(text) == expected


def test_name_tokens_and_keys():
    """Names match across accents, punctuation, case and order, as LMS file names write them."""
    assert name_tokens("Zoë O'Brien") == ["zoe", "o", "brien"]
    assert name_tokens("SMITH, John 2") == ["smith", "john", "2"]
    assert name_tokens("") == [] and name_tokens(None) == ["none"]
    assert name_keys("Smith, John") == {"smithjohn", "johnsmith", "john smith"}
    assert name_keys("Ada") == {"ada"}
    assert name_keys("--") == set()
    assert "obriensean" in name_keys("Seán O'Brien")  # Canvas: "O'Brien, Seán"
    assert name_tokens("王 小明") == ["王", "小明"] and "王小明" in name_keys("小明 王")


# --- reading the file -----------------------------------------------------------------

def test_a_missing_or_too_big_file_is_refused(course, tmp_path, monkeypatch):
    """No file, or a file over the cap, is refused with a reason (the cap in MiB)."""
    with pytest.raises(RosterError, match="is not a file"):
        import_roster(course=course, csv_path=tmp_path / "nope.csv")
    with pytest.raises(RosterError, match="is not a file"):
        import_roster(course=course, csv_path=tmp_path)
    monkeypatch.setattr(roster_module, "MAX_ROSTER_BYTES", 2 * 1024 * 1024)
    big = "name,id\n" + "x" * (2 * 1024 * 1024 - 8 - 3) + ",1\n"
    path = _csv(tmp_path, big)
    assert path.stat().st_size == 2 * 1024 * 1024
    assert roster_module._read_text(path) == big  # exactly the cap: read
    path = _csv(tmp_path, big + "\n")
    with pytest.raises(RosterError, match=r"class\.csv is larger than 2 MiB"):
        roster_module._read_text(path)
    assert not (course.root / "roster.json").exists()


def test_encodings_a_bom_windows_1252_and_latin_1(tmp_path):
    """Excel's BOM is dropped; a Windows-1252 or Latin-1 file is still read right."""
    assert roster_module._read_text(_csv(tmp_path, "\ufeffname,id\n", "bom.csv")) == "name,id\n"
    assert roster_module._read_text(_csv(tmp_path, "Zoë,€1\n", "cp.csv", "cp1252")) == "Zoë,€1\n"
    assert roster_module._read_text(_csv(tmp_path, b"A\x81,\xe9\n", "l1.csv")) == "A\x81,\xe9\n"


def test_rows_detect_the_delimiter_from_the_header_and_drop_blank_rows():
    """Semicolon and tab files (European Excel) split on their delimiter; blank rows go."""
    assert roster_module._rows("name;id\nSmith, John;7\n\n ; \n") == [
        ["name", "id"], ["Smith, John", "7"]]
    assert roster_module._rows("name\tid\nA, B\t8\n") == [["name", "id"], ["A, B", "8"]]
    assert roster_module._rows("name,id\nA;B,9\n") == [["name", "id"], ["A;B", "9"]]
    assert roster_module._rows("") == [] and roster_module._rows("\n \n") == []
    # Letters of the header never count as delimiters.
    assert roster_module._rows("XXL XX;id\nA;1\n") == [["XXL XX", "id"], ["A", "1"]]


def test_headers_are_normalised():
    assert roster_module._norm("  Full \t  Name ") == "full name"
    assert roster_module._norm(None) == ""


def test_cells_of_short_rows_are_empty():
    """A row shorter than the header gives empty cells, not an IndexError."""
    assert roster_module._cell(["a", " b "], 1) == "b"
    assert roster_module._cell(["a", "b"], 2) == ""
    assert roster_module._cell(["a"], None) == ""
    assert roster_module._column(["name", "id"], "user id", "id") == 1
    assert roster_module._column(["name", "id"], "email") is None


# --- Canvas ---------------------------------------------------------------------------

CANVAS = """Student,ID,SIS User ID,SIS Login ID,Section,Email
    Points Possible,,,,,
"Smith, John",111,S-1,jsmith1@uni.example,Sec A,
"Smith, John",222,S-2,login2,Sec A,john2@uni.example
"Student, Test",999,,,Sec A,
Test Student,998,,,Sec A,
"Lovelace, Ada",,S-3,ada@uni.example,Sec B,
"Park, Kim",x12,S-4,kim@uni.example,Sec B,
,,,,Sec B,
"Hopper, Grace",333,S-5,grace,Sec B,
"""


def test_a_canvas_export_is_read_with_skips_named(course, tmp_path):
    """Points Possible and empty rows are no students; the test student and rows without
    a Canvas user id are skipped and listed by row; e-mail from Email or the login."""
    summary, data = _people(course, tmp_path, CANVAS)
    assert data["source"] == "canvas" and summary["source"] == "canvas"
    assert data["students"] == [
        {"id": "111", "name": "Smith, John", "lms_id": "111", "email": "jsmith1@uni.example",
         "sis_user_id": "S-1", "sis_login_id": "jsmith1@uni.example", "section": "Sec A"},
        {"id": "222", "name": "Smith, John", "lms_id": "222", "email": "john2@uni.example",
         "sis_user_id": "S-2", "sis_login_id": "login2", "section": "Sec A"},
        {"id": "333", "name": "Hopper, Grace", "lms_id": "333", "email": "",
         "sis_user_id": "S-5", "sis_login_id": "grace", "section": "Sec B"},
    ]
    assert data["lms_assignments"] == []
    assert summary["skipped"] == ["row 5: Canvas's test student", "row 6: Canvas's test student",
                                  "row 7: no Canvas user id", "row 8: no Canvas user id"]


def test_canvas_is_recognised_by_any_of_its_columns(course, tmp_path):
    """Student and ID plus one of SIS User ID / SIS Login ID / Section mean Canvas."""
    for extra in ("SIS User ID", "SIS Login ID", "Section"):
        summary, data = _people(course, tmp_path, f"Student,ID,{extra}\n\"Smith, J\",111,x\n")
        assert summary["source"] == "canvas", extra
        assert data["students"][0]["lms_id"] == "111"
    summary, _ = _people(course, tmp_path, "Student,ID\n\"Smith, J\",abc\n")
    assert summary["source"] == "plain"


# --- Moodle ---------------------------------------------------------------------------

WORKSHEET = """Identifier,Full name,Email address,Status
Participant 4711,John Smith,js@uni.example,Submitted
Participant 4712,Olu Adeyemi,,Submitted
Participant,No Number,nn@uni.example,
"""


def test_a_moodle_worksheet_gives_participant_ids(course, tmp_path):
    """The participant number is the id and the LMS id; a row without one is skipped."""
    summary, data = _people(course, tmp_path, WORKSHEET)
    assert summary["source"] == "moodle"
    assert data["students"] == [
        {"id": "4711", "name": "John Smith", "lms_id": "4711", "email": "js@uni.example"},
        {"id": "4712", "name": "Olu Adeyemi", "lms_id": "4712", "email": ""}]
    assert summary["skipped"] == ["row 4: no participant id, ID number, username or e-mail"]


PARTICIPANTS = """First name,Surname,ID number,Username,Email address
Olu,Adeyemi,u100,olu,olu@uni.example
Nobody,Here,,,
Bob,Smith,,bobs,bob@uni.example
Kim,,,,kim@uni.example
,,,,
"""


def test_moodle_participants_fall_back_from_id_number_to_username_to_email(course, tmp_path):
    """id: ID number, else Username, else e-mail; no LMS id (matched by name); the ID
    number is kept for Moodle's grade import, which maps users by it."""
    summary, data = _people(course, tmp_path, PARTICIPANTS)
    assert summary["source"] == "moodle"
    assert data["students"] == [
        {"id": "u100", "name": "Olu Adeyemi", "lms_id": None, "email": "olu@uni.example",
         "id_number": "u100"},
        {"id": "bobs", "name": "Bob Smith", "lms_id": None, "email": "bob@uni.example"},
        {"id": "kim_uni.example", "name": "Kim", "lms_id": None, "email": "kim@uni.example"}]
    assert summary["skipped"] == ["row 3: no participant id, ID number, username or e-mail"]
    summary, data = _people(course, tmp_path, "First name,Last name,Email\nA,B,a@b\n")
    assert summary["source"] == "moodle"
    assert data["students"] == [{"id": "a_b", "name": "A B", "lms_id": None, "email": "a@b"}]
    # A first name alone (or a surname alone) is no Moodle list.
    summary, _ = _people(course, tmp_path, "First name,ID\nAda,7\n")
    assert summary["source"] == "plain"


# --- plain ----------------------------------------------------------------------------

def test_a_plain_list_with_a_header(course, tmp_path):
    """Any of the id headers works; a numeric id doubles as the LMS id; no id: skipped."""
    summary, data = _people(course, tmp_path,
                            "Student name,LMS user id,E-mail\nAda,12345,a@x\nBob,bob7,\nCy,,c@x\n")
    assert summary["source"] == "plain"
    assert data["students"] == [
        {"id": "12345", "name": "Ada", "lms_id": "12345", "email": "a@x"},
        {"id": "bob7", "name": "Bob", "lms_id": None, "email": ""}]
    assert summary["skipped"] == ["row 4: no id"]
    for header in ("user id", "student id", "lms id"):
        summary, data = _people(course, tmp_path, f"name,{header}\nAda,ada\n")
        assert data["students"][0]["id"] == "ada", header
    for name in ("name", "full name", "student", "student name"):
        for email in ("email", "e-mail", "email address"):
            _, data = _people(course, tmp_path, f"id,{name},x,{email}\n7,Ada L,,a@x\n")
            assert data["students"] == [{"id": "7", "name": "Ada L", "lms_id": "7",
                                         "email": "a@x"}], (name, email)


def test_a_plain_list_without_a_header_counts_rows_from_one(course, tmp_path):
    """name,id[,email] rows without a header: row 1 is a student."""
    summary, data = _people(course, tmp_path, "Ada Lovelace,ada\nBob,,b@x\nAlan Turing,7,a@x\n")
    assert summary["source"] == "plain" and data["source"] == "plain"
    assert data["students"] == [
        {"id": "ada", "name": "Ada Lovelace", "lms_id": None, "email": ""},
        {"id": "7", "name": "Alan Turing", "lms_id": "7", "email": "a@x"}]
    assert summary["skipped"] == ["row 2: no id"]


@pytest.mark.parametrize("text", ["a\nb\n", "a,b,c,d\n1,2,3,4\n", "a,b\n1,2,3,4\n"])
def test_unrecognised_columns_are_refused(course, tmp_path, text):
    """A file that is no known list is refused with the forms it could be."""
    with pytest.raises(RosterError) as raised:
        import_roster(course=course, csv_path=_csv(tmp_path, text))
    assert str(raised.value) == (
        "unrecognised columns: expected Canvas's gradebook export (Student, ID, SIS User ID, "
        "...), Moodle's participants (First name, Last name, Email address, ...) or grading "
        "worksheet (Identifier, Full name, Email address, ...), or name,id,email")


def test_an_empty_file_or_one_without_students_is_refused(course, tmp_path):
    with pytest.raises(RosterError, match="^the file holds no rows$"):
        import_roster(course=course, csv_path=_csv(tmp_path, "\n\n"))
    with pytest.raises(RosterError, match="^the file lists no students$"):
        import_roster(course=course, csv_path=_csv(tmp_path, "name,id\nAda,\n"))


# --- checking ids ---------------------------------------------------------------------

def _person(uid, name="", lms_id=None, email=""):
    return {"id": uid, "name": name, "lms_id": lms_id, "email": email}


def test_checked_makes_ids_safe_and_drops_a_person_listed_twice():
    """Ids become folder-safe; the same person twice (even in another case) is kept once."""
    out = roster_module._checked([_person(" a b ", "Ada", "", "a@x"), _person("A_B", "ada"),
                                  _person("c", "Cy", "7")])
    assert out == [{"id": "a_b", "name": "Ada", "lms_id": None, "email": "a@x"},
                   {"id": "c", "name": "Cy", "lms_id": "7", "email": ""}]


def test_checked_refuses_clashing_and_unusable_ids_listing_each():
    """Two people on one id, an empty or over-long id: all listed, nothing imported."""
    with pytest.raises(RosterError) as raised:
        roster_module._checked([_person("7", "Ada"), _person("7", "Bob"), _person("..", ""),
                                _person("x" * 65, "Long"), _person("y" * 64, "Ok")])
    assert str(raised.value) == (
        "id 7 is given to both 'Ada' and 'Bob'; ?: id '..' is not usable; "
        f"Long: id {'x' * 65!r} is not usable")


def test_checked_lists_ten_problems_and_counts_the_rest():
    with pytest.raises(RosterError) as raised:
        roster_module._checked([_person("", f"P{i}") for i in range(13)])
    message = str(raised.value)
    assert message.count("is not usable") == 10 and message.endswith(" (and 3 more)")
    with pytest.raises(RosterError) as raised:
        roster_module._checked([_person("", f"P{i}") for i in range(11)])
    assert str(raised.value).endswith("P9: id '' is not usable (and 1 more)")
    with pytest.raises(RosterError) as raised:
        roster_module._checked([_person("", f"P{i}") for i in range(10)])
    assert str(raised.value).endswith("P9: id '' is not usable")


# --- writing and importing ------------------------------------------------------------

def test_roster_json_is_written_atomically_readable_and_in_utf8(course, tmp_path,
                                                                ascii_locale):
    """roster.json: the documented fields, Unicode kept, no scratch file, umask honoured."""
    old = os.umask(0o026)
    try:
        summary = import_roster(course=course, csv_path=_csv(
            tmp_path, "name,id,email\nZoë O'Brien,zoe,z@x\nAda,ada,\n", "Class List.csv"))
    finally:
        os.umask(old)
    path = course.root / "roster.json"
    text = path.read_text(encoding="utf-8")
    assert "Zoë" in text and text.endswith("}\n") and '\n "format"' in text
    data = json.loads(text)
    assert data["format"] == "autograder-roster" and data["version"] == 1
    assert data["imported_from"] == "Class List.csv"
    assert data["imported_at"][:2] == "20" and data["imported_at"].endswith("+00:00")
    assert len(data["imported_at"]) == len("2026-01-01T00:00:00+00:00")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in course.root.iterdir() if p.name.startswith(".")] == []
    assert summary == {"path": str(path), "source": "plain", "students": 2,
                       "added": ["ada", "zoe"], "removed": [], "skipped": []}
    assert load_roster(course).get("zoe")["name"] == "Zoë O'Brien"


def test_a_reimport_reports_added_and_removed_ids(course, tmp_path):
    import_roster(course=course, csv_path=_csv(tmp_path, "name,id\nAda,ada\nBob,bob\n"))
    import_roster(course=course, csv_path=_csv(tmp_path, "name,id\nAda,ada\nBob,bob\nBo,bo\n"))
    summary = import_roster(course=course,
                            csv_path=_csv(tmp_path, "name,id\nAda,ada\nCy,cy\nDee,dee\n"))
    assert summary["added"] == ["cy", "dee"] and summary["removed"] == ["bo", "bob"]
    assert summary_lines(summary) == [
        f"roster: 3 students from a plain list -> {summary['path']}",
        "  added: cy, dee",
        "  no longer listed: bo, bob (their hand-ins in submitted/ are kept)"]


def test_summary_lines_of_a_first_import():
    """A first import lists no "added" (everyone is); skipped rows are listed."""
    summary = {"path": "/c/roster.json", "source": "canvas", "students": 2,
               "added": ["1", "2"], "removed": [], "skipped": ["row 3: no id"]}
    assert summary_lines(summary) == [
        "roster: 2 students from a canvas list -> /c/roster.json", "  skipped row 3: no id"]


def test_roster_json_is_written_beside_itself_then_renamed(course, tmp_path, monkeypatch):
    """The scratch file is hidden, in the course folder (a rename is atomic only there);
    a course folder that does not exist yet is made."""
    moves = []
    real = os.replace
    monkeypatch.setattr(roster_module.os, "replace",
                        lambda src, dst: (moves.append((src, dst)), real(src, dst))[1])
    course = type(course)(tmp_path / "new" / "course")
    import_roster(course=course, csv_path=_csv(tmp_path, "name,id\nAda,ada\n"))
    (src, dst), = moves
    assert os.path.dirname(src) == str(course.root) and dst == course.root / "roster.json"
    assert os.path.basename(src).startswith(".roster.json-") and src.endswith(".tmp")
    assert load_roster(course).get("ada")["name"] == "Ada"


def test_write_json_atomically_leaves_nothing_on_failure(tmp_path):
    """A value JSON cannot hold: nothing written, no scratch file left."""
    target = tmp_path / "out.json"
    with pytest.raises(TypeError):
        roster_module.write_json_atomically(target, {"x": object()})
    assert list(tmp_path.iterdir()) == []
    roster_module.write_json_atomically(target, {"b": "é", "a": [1]})
    assert target.read_text(encoding="utf-8") == '{\n "b": "é",\n "a": [\n  1\n ]\n}\n'


# --- loading and matching -------------------------------------------------------------

def test_load_roster(course):
    """No file: None. A file: its students, normalised (ids as text, no empty LMS id)."""
    assert load_roster(course) is None
    (course.root / "roster.json").write_text(json.dumps({"source": "canvas", "students": [
        {"id": 111, "name": "Smith, John", "lms_id": 111, "email": "j@x"},
        {"id": "ada", "name": None, "lms_id": "", "email": None},
        {"id": "bob"}]}), encoding="utf-8")
    roster = load_roster(course)
    assert roster.source == "canvas"
    assert roster.students == [
        {"id": "111", "name": "Smith, John", "lms_id": "111", "email": "j@x"},
        {"id": "ada", "name": "", "lms_id": None, "email": ""},
        {"id": "bob", "name": "", "lms_id": None, "email": ""}]
    (course.root / "roster.json").write_text('{"students": []}')
    assert load_roster(course).source == "plain"


@pytest.mark.parametrize("text", ["{broken", '{"source": "x"}', '{"students": [{"name": "A"}]}',
                                  '{"students": 5}', "[]"])
def test_a_broken_roster_json_is_a_roster_error(course, text):
    (course.root / "roster.json").write_text(text)
    with pytest.raises(RosterError, match="roster.json cannot be read"):
        load_roster(course)


def _roster(source, *students):
    return Roster(source=source, students=[
        {"id": sid, "name": name, "lms_id": lms, "email": ""} for sid, name, lms in students])


@pytest.fixture
def canvas_roster():
    """Made in each test (a roster made at import would escape a mutated __post_init__)."""
    return _roster("canvas", ("111", "Smith, John", "111"), ("222", "Smith, John", "222"),
                   ("12345", "Lovelace, Ada", "12345"), ("kim", "Park, Kim", None))


def test_get_is_by_id_in_any_case():
    roster = _roster("plain", ("Ada", "Ada L", None))
    assert roster.get("ada")["id"] == "Ada" and roster.get("ADA")["id"] == "Ada"
    assert roster.get("bob") is None
    assert _roster("plain", ("7", "", None)).get(7)["id"] == "7"


def test_a_canvas_id_matches_its_student_not_the_namesake(canvas_roster):
    """Two John Smiths: the Canvas id in the file name decides."""
    assert canvas_roster.match(name="smithjohn", lms="canvas", uid="222") == (
        canvas_roster.get("222"), "canvas id 222")
    assert canvas_roster.match(name="x", uid=111)[0]["id"] == "111"
    assert canvas_roster.match(name="x", uid="111")[1] == "LMS id 111"


def test_an_unknown_canvas_id_is_not_filed_by_name(canvas_roster):
    """An id the Canvas roster lacks is refused, even if the name would match someone."""
    entry, how = canvas_roster.match(name="lovelaceada", lms="canvas", uid="999")
    assert entry is None
    assert how == ("canvas id 999 is not in the roster (a canvas list); add the student and "
                   "collect again")


def test_an_id_of_another_lms_falls_back_to_the_name(canvas_roster):
    """A Moodle id against a Canvas roster is no evidence: the name decides."""
    assert canvas_roster.match(name="Lovelace Ada", lms="moodle", uid="4711") == (
        canvas_roster.get("12345"), "name")
    entry, how = canvas_roster.match(name="Smith John", lms="moodle", uid="4711")
    assert entry is None and how == ("the name matches 2 students in the roster (111, 222); "
                                     "not merged")


def test_a_roster_without_lms_ids_matches_canvas_files_by_name():
    """A Canvas roster whose people carry no LMS id cannot refuse by id: names decide."""
    roster = _roster("canvas", ("kim", "Park, Kim", None), ("bo", "Bo Li", None))
    assert roster.match(name="parkkim", lms="canvas", uid="5") == (roster.get("kim"), "name")


def test_a_name_of_someone_with_another_lms_id_is_not_merged():
    """Same name, different LMS id: never merged (another person with the same name)."""
    roster = _roster("plain", ("111", "John Smith", "111"), ("zoe", "Zoe Li", None))
    entry, how = roster.match(name="smithjohn", lms="canvas", uid="999")
    assert entry is None
    assert how == ("the name matches 111 in the roster, but the LMS id 999 differs; not merged")
    roster = _roster("plain", ("111", "John Smith", "111"), ("222", "John Smith", "222"))
    assert roster.match(name="smithjohn", lms="canvas", uid="999") == (None, (
        "the name matches 111, 222 in the roster, but the LMS id 999 differs; not merged"))
    # A name matching both someone with an LMS id and someone without: the one without.
    roster = _roster("plain", ("4711", "John Smith", "4711"), ("js", "John Smith", None))
    assert roster.match(name="John Smith", lms="canvas", uid="4799") == (roster.get("js"),
                                                                          "name")
    # Without an LMS id in the file name, the name matches anyone.
    roster = _roster("plain", ("111", "John Smith", "111"))
    assert roster.match(name="John Smith") == (roster.get("111"), "name")
    # An id of another LMS against a Moodle roster: names decide, LMS ids or not.
    roster = _roster("moodle", ("4711", "John Smith", "4711"))
    assert roster.match(name="smithjohn", lms="canvas", uid="999") == (roster.get("4711"),
                                                                       "name")


def test_several_entries_with_one_lms_id_are_not_guessed():
    roster = _roster("plain", ("a", "A", "5"), ("b", "B", "5"))
    assert roster.match(name="A", lms="canvas", uid="5") == (
        None, "LMS id 5 belongs to several roster entries")


def test_the_roster_id_itself_matches_only_without_an_lms_id(canvas_roster):
    """`12345.ipynb` is the roster id; a file name with an LMS id is not matched by id."""
    assert canvas_roster.match(name="12345") == (canvas_roster.get("12345"), "roster id")
    assert canvas_roster.match(name="KIM") == (canvas_roster.get("kim"), "roster id")
    roster = _roster("moodle", ("kim", "Kim Park", None))
    assert roster.match(name="kim", lms="canvas", uid="3") == (None, (
        "not in the roster; add the student and collect again"))


def test_names_match_in_any_order_and_unknown_names_are_listed(canvas_roster):
    assert canvas_roster.match(name="Kim Park") == (canvas_roster.get("kim"), "name")
    assert canvas_roster.match(name="parkkim") == (canvas_roster.get("kim"), "name")
    assert canvas_roster.match(name="Park_Kim") == (canvas_roster.get("kim"), "name")
    assert canvas_roster.match(name="John Smith") == (
        None, "the name matches 2 students in the roster (111, 222); not merged")
    assert canvas_roster.match(name="Alan Turing") == (
        None, "not in the roster; add the student and collect again")
    assert canvas_roster.match(name="") == (
        None, "not in the roster; add the student and collect again")


def test_a_student_without_a_name_matches_no_name():
    roster = Roster(source="plain", students=[{"id": "a"}])
    for name in ("XX XX", "None", ""):
        assert roster.match(name=name) == (None, "not in the roster; add the student and "
                                                 "collect again")
    assert roster.match(name="a") == (roster.get("a"), "roster id")


def test_a_person_listed_under_two_name_forms_is_one_match():
    """One person reachable by several name keys counts once."""
    roster = _roster("plain", ("jd", "John Doe", None))
    assert roster.match(name="doe john") == (roster.get("jd"), "name")
