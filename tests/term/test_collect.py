"""collect against hostile or awkward hand-ins: links, zip bombs, name collisions, odd names."""

import json
import os
import stat
import struct
import zipfile

import pytest

import autograder.term.collect as collect_module
from autograder.course import Course
from autograder.term.collect import collect
from conftest import tiny_course, tiny_notebook

ASSIGNMENT = "01_hw"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
SECRET = b"TOP-SECRET-ANSWER-KEY-7f3a9c"



@pytest.fixture
def course(tmp_path):
    return tiny_course(tmp_path / "course", ASSIGNMENT, extra=SECRET)


def _submitted(course, student):
    return course.submitted / student / ASSIGNMENT / NOTEBOOK


def _all_bytes_under(folder):
    """Every regular file's bytes under `folder`, never following a link."""
    found = []
    for dirpath, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    found.append(f.read())
    return found


def _listed(report, text):
    return [item for item in report.unmatched if text in item]


def _zip(path, members):
    """Write a zip of {name: bytes}."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def test_a_symlinked_handin_is_refused_and_listed(course, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "ada.ipynb").write_bytes(tiny_notebook("ada"))
    (inbox / "mallory.ipynb").symlink_to(secret)
    (inbox / "trent.ipynb").symlink_to(course.source / ASSIGNMENT / NOTEBOOK)
    report = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert report.collected == ["ada"]
    assert _listed(report, "mallory.ipynb") and _listed(report, "trent.ipynb")
    assert all("link" in item for item in _listed(report, "mallory") + _listed(report, "trent"))
    assert not any(SECRET in data for data in _all_bytes_under(course.submitted))
    assert not any(SECRET.decode() in line for line in report.lines())


def test_a_symlinked_student_folder_is_refused_and_listed(course, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "answers.ipynb").write_bytes(tiny_notebook("stolen") + SECRET)
    inbox = tmp_path / "inbox"
    (inbox / "ben").mkdir(parents=True)
    (inbox / "ben" / "hw.ipynb").write_bytes(tiny_notebook("ben"))
    (inbox / "mallory").symlink_to(elsewhere, target_is_directory=True)
    (inbox / "ben" / "deeper").symlink_to(elsewhere, target_is_directory=True)
    report = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert report.collected == ["ben"]
    assert _listed(report, "mallory") and _listed(report, "ben/deeper")
    assert not (course.submitted / "mallory").exists()
    assert not any(SECRET in data for data in _all_bytes_under(course.submitted))


def test_a_symlink_inside_a_zip_is_refused_and_listed(course, tmp_path):
    archive = tmp_path / "handins.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("ada.ipynb", tiny_notebook("ada"))
        link = zipfile.ZipInfo("mallory.ipynb")
        link.create_system = 3
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/shadow")
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert report.collected == ["ada"]
    assert _listed(report, "mallory.ipynb")
    assert "link" in _listed(report, "mallory.ipynb")[0]
    assert not (course.submitted / "mallory").exists()


def _lie_about_size(archive, name, declared):
    """Rewrite the central directory's uncompressed size of member `name`."""
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as z:
        header_offset = z.getinfo(name).header_offset
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        offset = struct.unpack_from("<I", data, at + 42)[0]
        if offset == header_offset and data[at + 46:at + 46 + name_length] == name.encode():
            struct.pack_into("<I", data, at + 24, declared)
        at = data.find(b"PK\x01\x02", at + 4)
    archive.write_bytes(bytes(data))


def test_a_zip_bomb_member_is_capped_and_listed(course, tmp_path, monkeypatch):
    cap = 1 << 20
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", cap, raising=False)
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("ada.ipynb", tiny_notebook("ada"))
        for name in ("bomb.ipynb", "liar.ipynb"):
            with z.open(name, "w") as member:
                for _ in range(32):
                    member.write(b"\0" * cap)
    _lie_about_size(archive, "liar.ipynb", 1000)
    extracted = {}
    real_read = zipfile.ZipExtFile.read

    def counting_read(self, n=-1):
        data = real_read(self, n)
        extracted[self.name] = extracted.get(self.name, 0) + len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting_read)
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert report.collected == ["ada"]
    assert _listed(report, "bomb.ipynb") and _listed(report, "liar.ipynb")
    assert max(extracted.values()) <= 2 * cap
    assert not (course.submitted / "bomb").exists() and not (course.submitted / "liar").exists()


def test_two_canvas_students_with_the_same_name_are_both_collected(course, tmp_path):
    archive = _zip(tmp_path / "canvas.zip", {
        f"smithjohn_111_901_{NOTEBOOK}": tiny_notebook("first john"),
        f"smithjohn_222_902_{NOTEBOOK}": tiny_notebook("second john"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["smithjohn_111", "smithjohn_222"]
    assert _submitted(course, "smithjohn_111").read_bytes() == tiny_notebook("first john")
    assert _submitted(course, "smithjohn_222").read_bytes() == tiny_notebook("second john")


def test_two_moodle_names_differing_in_spacing_are_both_collected(course, tmp_path):
    archive = _zip(tmp_path / "moodle.zip", {
        f"John Smith_4711_assignsubmission_file_{NOTEBOOK}": tiny_notebook("john 1"),
        f"John  Smith_4712_assignsubmission_file_{NOTEBOOK}": tiny_notebook("john 2"),
        f"O'Brien_5001_assignsubmission_file_{NOTEBOOK}": tiny_notebook("o'brien"),
        f"OBrien_5002_assignsubmission_file_{NOTEBOOK}": tiny_notebook("obrien"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["John_Smith_4711", "John_Smith_4712",
                                        "OBrien_5002", "O_Brien_5001"]
    assert _submitted(course, "John_Smith_4712").read_bytes() == tiny_notebook("john 2")
    assert report.unmatched == []


def test_two_names_mapping_to_one_id_are_both_refused(course, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "John Smith.ipynb").write_bytes(tiny_notebook("john 1"))
    (inbox / "John  Smith.ipynb").write_bytes(tiny_notebook("john 2"))
    (inbox / "ada.ipynb").write_bytes(tiny_notebook("ada"))
    report = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert report.collected == ["ada"]
    assert _listed(report, "John Smith.ipynb") and _listed(report, "John  Smith.ipynb")
    assert all("John_Smith" in item for item in _listed(report, "Smith"))
    assert not (course.submitted / "John_Smith").exists()
    # Already collected: a later clash still replaces nothing.
    (inbox / "John  Smith.ipynb").unlink()
    assert collect(course=course, assignment=ASSIGNMENT, source_path=inbox).collected == [
        "John_Smith"]
    (inbox / "John  Smith.ipynb").write_bytes(tiny_notebook("john 2"))
    again = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert again.replaced == [] and len(_listed(again, "Smith")) == 2
    assert _submitted(course, "John_Smith").read_bytes() == tiny_notebook("john 1")


def test_a_too_long_or_odd_member_is_listed_while_the_rest_are_collected(course, tmp_path):
    long_name = "x" * 300 + ".ipynb"
    archive = _zip(tmp_path / "odd.zip", {
        "ada.ipynb": tiny_notebook("ada"),
        long_name: tiny_notebook("long"),
        "y" * 80 + ".ipynb": tiny_notebook("long id"),
        "cy.ipynb/": b"",
        "dee.ipynb/inner.ipynb": tiny_notebook("inside a folder named like a notebook"),
        "ben/hw.ipynb": tiny_notebook("ben"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["ada", "ben"]
    assert len(report.unmatched) == 4
    assert any("x" * 40 in item for item in report.unmatched)
    assert _listed(report, "y" * 40) and _listed(report, "cy.ipynb") and _listed(report, "dee")
    assert all(len(line) < 400 for line in report.lines())


def test_student_folders_with_any_notebook_name_are_still_collected(course, tmp_path):
    inbox = tmp_path / "inbox"
    for student, name in [("ada", "my homework.ipynb"), ("ben", NOTEBOOK)]:
        (inbox / student).mkdir(parents=True)
        (inbox / student / name).write_bytes(tiny_notebook(student))
    (inbox / "cy.ipynb").write_bytes(tiny_notebook("cy"))
    report = collect(course=course, assignment=ASSIGNMENT, source_path=inbox)
    assert sorted(report.collected) == ["ada", "ben", "cy"]
    assert _submitted(course, "ada").read_bytes() == tiny_notebook("ada")


def test_canvas_late_names_are_collected_to_the_right_id(course, tmp_path):
    archive = _zip(tmp_path / "late.zip", {
        f"lovelaceada_LATE_12345_67890_{NOTEBOOK}": tiny_notebook("ada late"),
        f"turingalan_late_23456_78901_{ASSIGNMENT}-1.ipynb": tiny_notebook("alan late"),
        f"hopperg_34567_89012_{NOTEBOOK}": tiny_notebook("grace"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["hopperg_34567", "lovelaceada_12345", "turingalan_23456"]
    assert _submitted(course, "lovelaceada_12345").read_bytes() == tiny_notebook("ada late")


def test_recollecting_a_zip_is_unchanged_and_a_changed_one_names_the_replaced(course, tmp_path):
    members = {
        f"lovelaceada_12345_67890_{NOTEBOOK}": tiny_notebook("ada"),
        f"Dee Blank_4242_assignsubmission_file_{NOTEBOOK}": tiny_notebook("dee"),
        "notes.txt": b"not a notebook",
    }
    archive = _zip(tmp_path / "lms.zip", members)
    first = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(first.collected) == ["Dee_Blank_4242", "lovelaceada_12345"]
    assert _listed(first, "notes.txt")
    again = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(again.unchanged) == ["Dee_Blank_4242", "lovelaceada_12345"]
    assert again.collected == [] and again.replaced == []
    members[f"lovelaceada_12345_67890_{NOTEBOOK}"] = tiny_notebook("ada, second try")
    changed = collect(course=course, assignment=ASSIGNMENT,
                      source_path=_zip(tmp_path / "lms2.zip", members))
    assert changed.replaced == ["lovelaceada_12345"]
    assert any("replaced" in line and "lovelaceada_12345" in line for line in changed.lines())
    folder = _submitted(course, "lovelaceada_12345").parent
    kept = [p for p in folder.iterdir() if p.name.endswith(".ipynb.bak")]
    assert len(kept) == 1 and kept[0].read_bytes() == tiny_notebook("ada")
    assert _submitted(course, "lovelaceada_12345").read_bytes() == tiny_notebook("ada, second try")


def test_a_hidden_notebook_is_listed_not_skipped(course, tmp_path):
    folder = tmp_path / "hidden"
    folder.mkdir()
    (folder / ".ada.ipynb").write_text("{}")
    (folder / ".DS_Store").write_text("x")
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "ada-checkpoint.ipynb").write_text("{}")
    report = collect(course=course, assignment=ASSIGNMENT, source_path=folder)
    assert report.collected == []
    assert [item for item in report.unmatched if ".ada.ipynb" in item]
    assert not [item for item in report.unmatched if "checkpoint" in item or "DS_Store" in item]


# Issue 14, items 7 and 11: renamed notebooks, replaced students by name, nbgrader's layout.

def test_an_untitled_notebook_is_collected_with_a_note(course, tmp_path):
    archive = _zip(tmp_path / "canvas.zip", {
        "lovelaceada_12345_67890_Untitled.ipynb": tiny_notebook("ada"),
        f"hopperg_34567_89012_{ASSIGNMENT}-1.ipynb": tiny_notebook("grace, resubmitted"),
        "ben/Untitled1.ipynb": tiny_notebook("ben"),
        "Untitled.ipynb": tiny_notebook("whose?"),
    })
    report = collect(course=course, assignment=ASSIGNMENT, source_path=archive)
    assert sorted(report.collected) == ["ben", "hopperg_34567", "lovelaceada_12345"]
    assert _submitted(course, "lovelaceada_12345").read_bytes() == tiny_notebook("ada")
    assert report.renamed == {"ben": f"Untitled1.ipynb saved as {NOTEBOOK}",
                              "lovelaceada_12345": f"Untitled.ipynb saved as {NOTEBOOK}"}
    assert any("renamed: lovelaceada_12345" in line and "Untitled.ipynb" in line
               for line in report.lines())
    assert _listed(report, "Untitled.ipynb (") and "names no student" in report.unmatched[0]
    assert not (course.submitted / "Untitled").exists()


def test_replaced_students_are_named_in_the_report(course, tmp_path):
    first = {f"{name}_{uid}_1_{NOTEBOOK}": tiny_notebook(name)
             for name, uid in (("lovelaceada", 1), ("turingalan", 2), ("hopperg", 3))}
    collect(course=course, assignment=ASSIGNMENT, source_path=_zip(tmp_path / "1.zip", first))
    second = dict(first)
    second[f"lovelaceada_1_1_{NOTEBOOK}"] = tiny_notebook("ada again")
    second[f"hopperg_3_1_{NOTEBOOK}"] = tiny_notebook("grace again")
    report = collect(course=course, assignment=ASSIGNMENT,
                     source_path=_zip(tmp_path / "2.zip", second))
    assert sorted(report.replaced) == ["hopperg_3", "lovelaceada_1"]
    text = "\n".join(report.lines())
    assert "replaced: lovelaceada_1" in text and "replaced: hopperg_3" in text
    assert "turingalan_2" in text  # unchanged, also by name


def _nbgrader_course(tmp_path, assignment=ASSIGNMENT, notebooks=(NOTEBOOK,)):
    """A folder laid out as nbgrader's exchange leaves submitted/."""
    root = tmp_path / "nbgrader_course"
    stamps = {"bitdiddle": "2015-02-02 14:58:23.948203 America/Los_Angeles",
              "hacker": "2015-02-01 09:28:58.749302 America/Los_Angeles"}
    for student, stamp in stamps.items():
        folder = root / "submitted" / student / assignment
        folder.mkdir(parents=True)
        for name in notebooks:
            (folder / name).write_bytes(tiny_notebook(f"{student} {name}"))
        (folder / "jupyter.png").write_bytes(b"\x89PNG fake image " + student.encode())
        (folder / "timestamp.txt").write_text(stamp)
        (folder / ".ipynb_checkpoints").mkdir()
        (folder / ".ipynb_checkpoints" / "x-checkpoint.ipynb").write_text("{}")
    (root / "source" / assignment).mkdir(parents=True)
    (root / "source" / assignment / notebooks[0]).write_bytes(tiny_notebook("instructor"))
    (root / "submitted" / "hacker" / "ps2").mkdir()
    (root / "submitted" / "hacker" / "ps2" / "problem1.ipynb").write_bytes(tiny_notebook("ps2"))
    return root


def test_nbgrader_submitted_layout_is_collected_with_its_timestamps(course, tmp_path):
    (course.source / "ps2").mkdir()
    (course.source / "ps2" / "problem1.ipynb").write_bytes(tiny_notebook("ps2"))
    root = _nbgrader_course(tmp_path)
    for source_path in (root / "submitted", root):
        report = collect(course=course, assignment=ASSIGNMENT, source_path=source_path)
        assert report.unmatched == [], report.unmatched
    report = collect(course=course, assignment=ASSIGNMENT, source_path=root / "submitted")
    assert report.unchanged == ["bitdiddle", "hacker"]
    folder = course.submitted / "bitdiddle" / ASSIGNMENT
    assert (folder / NOTEBOOK).read_bytes() == tiny_notebook(f"bitdiddle {NOTEBOOK}")
    assert (folder / "jupyter.png").read_bytes() == b"\x89PNG fake image bitdiddle"
    assert (folder / "timestamp.txt").read_text() == "2015-02-02 22:58:23.948203 UTC"
    assert not (folder / ".ipynb_checkpoints").exists()
    assert not (course.submitted / "hacker" / "ps2").exists()
    assert any("ps2" in note for note in report.notes + collect(
        course=course, assignment=ASSIGNMENT, source_path=root).notes)
    from autograder.term.deadlines import lateness
    info = lateness(course=course, assignment=ASSIGNMENT, student="hacker")
    assert info["submitted_at"] == "2015-02-01T17:28:58.749302+00:00"
    assert info["source"] == "nbgrader's timestamp.txt"


def test_nbgrader_layout_with_several_notebooks_in_a_zip(tmp_path):
    root = tmp_path / "course"
    (root / "source" / "ps1").mkdir(parents=True)
    for name in ("problem1.ipynb", "problem2.ipynb"):
        (root / "source" / "ps1" / name).write_bytes(tiny_notebook("instructor"))
    course = Course(root)
    tree = _nbgrader_course(tmp_path, "ps1", ("problem1.ipynb", "problem2.ipynb"))
    archive = tmp_path / "exchange.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted((tree / "submitted").rglob("*")):
            if path.is_file() and "ps1" in path.parts:
                z.write(path, path.relative_to(tree).as_posix())
        z.writestr("submitted/hacker/ps1/data/big.bin", b"\0" * 2048)
        link = zipfile.ZipInfo("submitted/hacker/ps1/secret.txt")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/shadow")
    report = collect(course=course, assignment="ps1", source_path=archive)
    assert report.collected == ["bitdiddle", "hacker"]
    folder = course.submitted / "hacker" / "ps1"
    assert sorted(p.name for p in folder.iterdir()) == [
        ".handin.json", "data", "jupyter.png", "problem1.ipynb", "problem2.ipynb",
        "timestamp.txt"]
    assert (folder / "data" / "big.bin").stat().st_size == 2048
    assert _listed(report, "secret.txt") and "link" in _listed(report, "secret.txt")[0]
    sidecar = json.loads((folder / ".handin.json").read_text())
    assert sidecar["timestamp_source"] == "nbgrader's timestamp.txt"
    assert sorted(sidecar["files"]) == ["data/big.bin", "jupyter.png", "problem1.ipynb",
                                        "problem2.ipynb"]


def test_an_oversized_extra_file_is_refused_and_the_notebook_kept(course, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 4096, raising=False)
    root = _nbgrader_course(tmp_path)
    (root / "submitted" / "hacker" / ASSIGNMENT / "huge.csv").write_bytes(b"1," * 4096)
    (root / "submitted" / "hacker" / ASSIGNMENT / "link.csv").symlink_to(
        course.source / ASSIGNMENT / NOTEBOOK)
    (root / "submitted" / "bitdiddle" / ASSIGNMENT / "timestamp.txt").write_bytes(SECRET)
    report = collect(course=course, assignment=ASSIGNMENT, source_path=root / "submitted")
    assert report.collected == ["bitdiddle", "hacker"]
    assert _listed(report, "huge.csv") and _listed(report, "link.csv")
    assert not (course.submitted / "hacker" / ASSIGNMENT / "huge.csv").exists()
    assert not (course.submitted / "hacker" / ASSIGNMENT / "link.csv").exists()
    assert any("timestamp.txt cannot be read" in note for note in report.notes)
    assert not any(SECRET.decode() in line for line in report.lines())
    assert not any(SECRET in data for data in _all_bytes_under(course.submitted))
