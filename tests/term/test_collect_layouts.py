"""collect: hand-ins from LMS zips, nbgrader's layout and folders, into submitted/.

Each test fails on a small bug in autograder/term/collect.py (`make mutation`), among them
the bug of the issue: a hand-in `<student>/<any name>.ipynb` silently dropped, the
report saying "collected 0, ..., unmatched 0". Others: a hand-in filed under the wrong
student, an earlier resubmission kept instead of the latest, a late marker lost, an
existing hand-in overwritten, a reason that does not name the file.
"""

import errno
import hashlib
import json
import os
import stat
import unicodedata
import zipfile
from datetime import UTC, datetime

import pytest

import autograder.term.collect as collect_module
from autograder.course import Course
from autograder.term.collect import CollectReport, collect, student_id_from
from conftest import canvas_download_name, tiny_course, tiny_notebook

A = "01_hw"
NB = f"{A}.ipynb"
FIRST_LINE = "collected {}, unchanged {}, replaced {} (old copies kept), unmatched {}"


@pytest.fixture
def course(tmp_path):
    return tiny_course(tmp_path / "course", A)


@pytest.fixture
def course2(tmp_path):
    """An assignment of two notebooks, p1.ipynb and p2.ipynb."""
    root = tmp_path / "course2"
    (root / "source" / "ps").mkdir(parents=True)
    for name in ("p1.ipynb", "p2.ipynb"):
        (root / "source" / "ps" / name).write_bytes(tiny_notebook("instructor"))
    return Course(root)


def _folder(tmp_path, files, name="inbox"):
    """A folder of {relative path: bytes}."""
    root = tmp_path / name
    root.mkdir()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def _zip(path, members):
    """A zip of {name: bytes or (bytes, date_time)}."""
    with zipfile.ZipFile(path, "w") as z:
        for name, value in members.items():
            data, when = value if isinstance(value, tuple) else (value, (2026, 10, 1, 12, 0, 0))
            z.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


def _run(course, source, assignment=A):
    return collect(course=course, assignment=assignment, source_path=source)


def _got(course, student, name=NB, assignment=A):
    return (course.submitted / student / assignment / name).read_bytes()


def _sidecar(course, student, assignment=A):
    return json.loads((course.submitted / student / assignment / ".handin.json").read_text())


def _stamp(course, student, assignment=A):
    return (course.submitted / student / assignment / "timestamp.txt").read_text()


# --- the bug of the issue -------------------------------------------------------------

def test_a_student_folder_with_any_notebook_name_is_collected(course, tmp_path):
    """`<student>/<any name>.ipynb` must be collected, not dropped with "collected 0,
    unmatched 0": the report counts it and names the renaming."""
    inbox = _folder(tmp_path, {"ada/my homework.ipynb": tiny_notebook("ada"),
                               f"ben/{NB}": tiny_notebook("ben")})
    report = _run(course, inbox)
    assert report.lines()[0] == FIRST_LINE.format(2, 0, 0, 0)
    assert report.collected == ["ada", "ben"] and report.unmatched == []
    assert _got(course, "ada") == tiny_notebook("ada")
    assert _got(course, "ben") == tiny_notebook("ben")
    assert report.renamed == {"ada": f"my homework.ipynb saved as {NB}"}
    assert _sidecar(course, "ada")["files"] == [NB]


def test_a_student_folder_in_a_zip_with_any_notebook_name_is_collected(course, tmp_path):
    report = _run(course, _zip(tmp_path / "h.zip", {"ada/answers.ipynb": tiny_notebook("ada"),
                                                    "ben/": b""}))
    assert report.collected == ["ada"] and report.unmatched == []
    assert _got(course, "ada") == tiny_notebook("ada")
    assert report.renamed == {"ada": f"answers.ipynb saved as {NB}"}


# --- the report -----------------------------------------------------------------------

def test_the_report_lines_name_everything():
    """Each list of the report reaches its line, in order, with its label."""
    report = CollectReport(collected=["ada", "ben"], unchanged=["cy"], replaced=["dee", "eve"],
                           unmatched=["x.txt (not a notebook)"], kept={"dee": "a.bak"},
                           renamed={"ada": "U.ipynb saved as hw.ipynb"}, late=["ben", "cy"],
                           notes=["n1", "n2"])
    assert report.lines() == [
        "collected 2, unchanged 1, replaced 2 (old copies kept), unmatched 1",
        "  collected: ada, ben",
        "  unchanged: cy",
        "  replaced: dee (old copy kept as a.bak)",
        "  replaced: eve (old copy kept as ?)",
        "  renamed: ada (U.ipynb saved as hw.ipynb)",
        "  marked late by the LMS: ben, cy",
        "  note: n1",
        "  note: n2",
        "  not collected: x.txt (not a notebook)"]
    assert CollectReport().lines() == [FIRST_LINE.format(0, 0, 0, 0)]


def test_shown_escapes_unprintable_characters_and_cuts_long_names():
    """A file name in a report line: one line, escaped, at most 120 characters."""
    assert collect_module._shown("a\x00b\nc\u200bd é") == "a\\x00b\\nc\\u200bd é"
    assert collect_module._shown("x" * 120) == "x" * 120
    long = "x" * 100 + "y" * 21
    assert collect_module._shown(long) == "x" * 100 + "..." + "y" * 17
    assert len(collect_module._shown("z" * 500)) == 120


# --- names ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,fields", [
    ("lovelaceada_12345_67890_01_hw.ipynb",
     ("lovelaceada_12345", "lovelaceada_12345", "canvas", "12345", "lovelaceada", False,
      "01_hw.ipynb")),
    ("LovelaceAda_LATE_12345_67890_hw-2.ipynb",
     ("LovelaceAda_12345", "LovelaceAda_12345", "canvas", "12345", "LovelaceAda", True,
      "hw-2.ipynb")),
    ("lovelaceada_late_12345_67890.ipynb",
     ("lovelaceada_12345", "lovelaceada_12345", "canvas", "12345", "lovelaceada", True, None)),
    ("smithj_7_8_x_late", ("smithj_7", "smithj_7", "canvas", "7", "smithj", False, "x_late")),
    ("Full Name_4711_assignsubmission_file_x.ipynb",
     ("Full Name_4711", "Full_Name_4711", "moodle", "4711", "Full Name", False, "x.ipynb")),
    ("ada.ipynb", ("ada", "ada", None, None, "ada", False, None)),
    ("Zoë O'Brien.ipynb", ("Zoë O'Brien", "Zoe_O_Brien", None, None, "Zoë O'Brien", False, None)),
    ("müllerjürgen_4713_99001_01_hw.ipynb",
     ("müllerjürgen_4713", "mullerjurgen_4713", "canvas", "4713", "müllerjürgen", False,
      "01_hw.ipynb")),
    ("mu\u0308llerju\u0308rgen_LATE_4713_99001_01_hw.ipynb",
     ("müllerjürgen_4713", "mullerjurgen_4713", "canvas", "4713", "müllerjürgen", True,
      "01_hw.ipynb")),
    ("王小明_4716_99004_01_hw.ipynb",
     ("王小明_4716", "4716", "canvas", "4716", "王小明", False, "01_hw.ipynb")),
    ("ada", ("ada", "ada", None, None, "ada", False, None)),
    ("ada.ipynb.ipynb", ("ada.ipynb", "ada.ipynb", None, None, "ada.ipynb", False, None)),
])
def test_names_give_the_student_and_the_lms_fields(name, fields):
    """Canvas and Moodle names give the LMS id, the late marker and the original name."""
    ident = collect_module._identify_full(name)
    assert (ident.key, ident.student, ident.lms, ident.uid, ident.name, ident.late,
            ident.original) == fields
    assert ident.reason is None
    assert collect_module._identify(name) == (fields[0], fields[1], None)
    assert student_id_from(name) == fields[1]


@pytest.mark.parametrize("name,prefix", [
    ("lovelaceada_late_12345_67890.ipynb", "lovelaceada_late_12345_67890"),
    ("lovelaceada_12345_67890_01_hw.ipynb", "lovelaceada_12345_67890"),
    ("Full Name_4711_assignsubmission_file_x.ipynb", "Full Name_4711_assignsubmission_file"),
    ("ada.ipynb", None),
])
def test_an_lms_name_keeps_the_prefix_its_feedback_page_is_named_with(name, prefix):
    """The LMS's part of a download's name, up to the student's own file name: the
    feedback zip names each page with it, so the LMS finds the submission again."""
    assert collect_module._identify_full(name).prefix == prefix


@pytest.mark.parametrize("name,reason", [
    ("...ipynb", "no student name in it"), (".ipynb", "no student name in it"),
    ("__.ipynb", "no student name in it"),
    ("y" * 65 + ".ipynb", "student id would be longer than 64 characters"),
])
def test_names_without_a_usable_student_id_are_refused(name, reason):
    ident = collect_module._identify_full(name)
    assert ident.student is None and ident.reason == reason
    assert student_id_from(name) is None


def test_a_student_id_of_64_characters_is_accepted():
    assert student_id_from("y" * 64 + ".ipynb") == "y" * 64


def test_sanitize():
    assert collect_module._sanitize(" a b//c ") == "a_b_c"
    assert collect_module._sanitize("._Ada.-x_.") == "Ada.-x"
    assert collect_module._sanitize("AZaz09") == "AZaz09"
    assert collect_module._sanitize("Xavier_X") == "Xavier_X"


def test_nbgrader_split():
    """`[submitted/]<student>/<assignment>/<path>`: the hand-in folder and the path in it."""
    split = collect_module._nbgrader_split
    assert split(("ada", A, "x.ipynb"), A) == (("ada", A), "ada", ("x.ipynb",))
    assert split(("submitted", "ada", A, "d", "x.csv"), A) == (
        ("submitted", "ada", A), "ada", ("d", "x.csv"))
    # Three parts: `submitted` is a student's folder name there, not nbgrader's.
    assert split(("submitted", A, "x.ipynb"), A) == (("submitted", A), "submitted", ("x.ipynb",))
    assert split(("submitted", "ada", "ps2", "x.ipynb"), A) is None
    assert split(("submitted", "ada", "ps2", "x.ipynb"), None) == (
        ("submitted", "ada", "ps2"), "ada", ("x.ipynb",))
    assert split(("ada", "x.ipynb"), A) is None and split(("ada", "x.ipynb"), None) is None
    assert split(("other", "ada", A, "x.ipynb"), A) is None


def _classified(parts, assignment=A, others=()):
    candidate = collect_module._Candidate("/".join(parts), tuple(parts))
    return collect_module._classify(tuple(parts), candidate, assignment, others)


@pytest.mark.parametrize("parts,reason", [
    (("notes.txt",), "not a notebook"),
    (("a", "b", "c.ipynb"), "nested too deep"),
    (("a.ipynb", "b.ipynb"), "inside a folder named like a notebook"),
    (("...ipynb",), "no student name in it"),
    (("..", "x.ipynb"), "no student name in it"),
    (("ada", A, "a", "b", "c", "d", "e.csv"), "nested too deep"),
    (("ada", A, "bad\nname.csv"), "an unusable file name"),
    (("ada", A, "n" * 256), "an unusable file name"),
    (("__", A, "x.ipynb"), "no student name in it"),
    (("y" * 65, A, "x.ipynb"), "student id would be longer than 64 characters"),
])
def test_classify_refuses_with_a_reason(parts, reason):
    candidate = _classified(parts)
    assert candidate.reason == reason and candidate.student is None


def test_classify_accepts_the_layouts():
    loose = _classified(("ada.ipynb",))
    assert (loose.key, loose.student, loose.rel, loose.ident.original) == ("ada", "ada", None, None)
    folder = _classified(("Ada L", "hw.ipynb"))
    assert (folder.key, folder.student, folder.ident.original) == ("Ada L", "Ada_L", "hw.ipynb")
    nb = _classified(("Ada L", A, "a", "b", "c", "d.csv"))
    assert (nb.key, nb.student, nb.folder, nb.rel) == ("Ada L", "Ada_L", ("Ada L", A),
                                                       ("a", "b", "c", "d.csv"))
    assert nb.ident.student == "Ada_L" and nb.ident.name == "Ada L" and nb.reason is None
    assert _classified(("ada", A, "n" * 255)).reason is None
    assert _classified(("y" * 64, A, "x.ipynb")).student == "y" * 64
    other = _classified(("ada", "ps2", "x.ipynb"), others={"ps2"})
    assert other.other_assignment == "ps2" and other.reason is None
    # Without an assignment there is no nbgrader layout: a plain (too deep) path.
    candidate = collect_module._Candidate("x", ("ada", A, "x.ipynb"))
    assert collect_module._classify(("ada", A, "x.ipynb"), candidate).reason == "nested too deep"
    # A folder named like an assignment that is not one of the course's: a plain path.
    assert _classified(("ada", "ps3", "x.ipynb"), others={"ps2"}).reason == "nested too deep"


def test_hidden_names():
    assert collect_module._hidden((".git", "x")) and collect_module._hidden(("__MACOSX", "x"))
    assert not collect_module._hidden(("a", "b.ipynb"))
    assert collect_module._hidden_notebook(("ada", ".x.ipynb"))
    assert not collect_module._hidden_notebook((".d", ".x.ipynb"))
    assert not collect_module._hidden_notebook((".x.txt",))
    assert not collect_module._hidden_notebook(("x.ipynb",))
    assert collect_module._hidden_notebook((".x.ipynb",))
    assert collect_module._hidden_notebook(("a", "b", ".x.ipynb"))


# --- folders --------------------------------------------------------------------------

def test_a_folder_of_odd_entries_lists_each_with_its_reason(course, tmp_path):
    """Links, a FIFO, a folder named like a notebook, hidden notebooks: each listed."""
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada"), "notes.txt": b"x",
                               ".hidden.ipynb": b"{}", ".git/HEAD": b"x",
                               "__MACOSX/._ada.ipynb": b"x", "ben/.x.ipynb": b"{}"})
    os.mkfifo(inbox / "pipe.ipynb")
    (inbox / "nb.ipynb").mkdir()
    (inbox / "link.ipynb").symlink_to(inbox / "ada.ipynb")
    (inbox / "dir").symlink_to(tmp_path, target_is_directory=True)
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    hidden = "a hidden notebook (its name starts with a dot): rename it to collect it"
    assert report.unmatched == [
        f".hidden.ipynb ({hidden})",
        f"ben/.x.ipynb ({hidden})",
        "dir (a symbolic link; links are never followed)",
        "link.ipynb (a symbolic link; links are never followed)",
        "nb.ipynb/ (a folder named like a notebook)",
        "notes.txt (not a notebook)",
        "pipe.ipynb (not a regular file)"]


def test_a_hand_in_hard_linked_to_the_courses_own_notebook_is_not_collected(course,
                                                                            tmp_path):
    """A hand-in that is a hard link (to the course's source notebook, with its
    solutions and hidden tests) is refused like a symbolic link: its bytes are not
    the student's. The other students are collected."""
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    os.link(course.source_notebook(A), inbox / "mallory.ipynb")
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    assert report.unmatched == [
        "mallory.ipynb (a hard link; its bytes may be another person's file)"]
    assert not (course.submitted / "mallory").exists()


def test_a_folder_that_cannot_be_opened_is_listed(course, tmp_path, monkeypatch):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada"), "ben/hw.ipynb": b"{}",
                               "cy/deep/hw.ipynb": tiny_notebook("cy")})
    real = collect_module._open_dir

    def refuse(root_fd, parts):
        if parts == ("cy", "deep"):
            raise PermissionError(13, "Permission denied")
        return real(root_fd, parts)

    monkeypatch.setattr(collect_module, "_open_dir", refuse)
    report = _run(course, inbox)
    assert report.collected == ["ada", "ben"]
    assert report.unmatched == ["cy/deep/ (folder cannot be opened: Permission denied)"]


def test_an_entry_that_cannot_be_stat_ed_is_listed(course, tmp_path, monkeypatch):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada"), "ben.ipynb": b"{}",
                               "cy.ipynb": tiny_notebook("cy")})
    real = os.stat

    def failing(path, *args, **kwargs):
        if path == "ben.ipynb":
            raise OSError(5, "Input/output error")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(collect_module.os, "stat", failing)
    report = _run(course, inbox)
    assert report.collected == ["ada", "cy"]
    assert report.unmatched == ["ben.ipynb (cannot be read: Input/output error)"]


def test_open_dir_refuses_links_and_closes_what_it_opened(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        before = len(os.listdir("/proc/self/fd"))
        fd = collect_module._open_dir(root, ("a", "b"))
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "a" / "b"))
        os.close(fd)
        fd = collect_module._open_dir(root, ())
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path)) and fd != root
        os.close(fd)
        with pytest.raises(OSError):
            collect_module._open_dir(root, ("link", "b"))
        (tmp_path / "file").write_bytes(b"x")
        with pytest.raises(NotADirectoryError):
            collect_module._open_dir(root, ("file",))
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        os.close(root)


def _read_folder(root, parts):
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        candidate = collect_module._Candidate("/".join(parts), tuple(parts))
        return candidate, collect_module._read_from_folder(fd, candidate)
    finally:
        os.close(fd)


def test_read_from_folder_reads_the_bytes_and_the_file_time(tmp_path, new_york):
    inbox = _folder(tmp_path, {"ada/hw.ipynb": b"abc"})
    when = datetime(2026, 10, 2, 12, 0, 30, tzinfo=UTC).timestamp()
    os.utime(inbox / "ada" / "hw.ipynb", (when, when))
    candidate, data = _read_folder(inbox, ("ada", "hw.ipynb"))
    assert bytes(data) == b"abc"
    assert candidate.when == datetime(2026, 10, 2, 12, 0, 30, tzinfo=UTC)
    assert candidate.when_source == "file modification time (last resort)"


@pytest.mark.parametrize("parts,reason", [
    (("link.ipynb",), "a symbolic link; links are never followed"),
    (("dirlink", "hw.ipynb"), "a symbolic link; links are never followed"),
    (("gone.ipynb",), "cannot be read: No such file or directory"),
    (("pipe.ipynb",), "not a regular file"),
    (("dir",), "not a regular file"),
    (("hard.ipynb",), "a hard link; its bytes may be another person's file"),
])
def test_read_from_folder_refuses(tmp_path, parts, reason):
    """A link or folder swapped in after listing, a missing file, a FIFO, a hard link:
    refused with the reason (a folder once crashed collect; a link was called
    unreadable; a hard link to the course's source was collected)."""
    inbox = _folder(tmp_path, {"file.ipynb": b"x", "dir/hw.ipynb": b"x"})
    (inbox / "link.ipynb").symlink_to(inbox / "file.ipynb")
    (inbox / "dirlink").symlink_to(inbox / "dir", target_is_directory=True)
    os.mkfifo(inbox / "pipe.ipynb")
    os.link(inbox / "file.ipynb", inbox / "hard.ipynb")
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(collect_module._Refused) as refused:
        _read_folder(inbox, parts)
    assert str(refused.value) == reason
    assert len(os.listdir("/proc/self/fd")) == before


def test_read_from_folder_caps_the_size(tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 10)
    inbox = _folder(tmp_path, {"ok.ipynb": b"x" * 10, "big.ipynb": b"x" * 11})
    assert bytes(_read_folder(inbox, ("ok.ipynb",))[1]) == b"x" * 10
    with pytest.raises(collect_module._Refused, match="larger than the 9.53674e-06 MiB cap"):
        _read_folder(inbox, ("big.ipynb",))


def test_read_capped_reads_in_chunks_up_to_the_cap(monkeypatch):
    """Reads until the end; more than the cap is refused while reading."""
    monkeypatch.setattr(collect_module, "_CHUNK", 4)
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 10)
    chunks = iter([b"abcd", b"efgh", b"ij", b""])
    asked = []

    def read(n):
        asked.append(n)
        return next(chunks)

    assert collect_module._read_capped(read) == bytearray(b"abcdefghij")
    assert asked == [4, 4, 4, 4]
    chunks = iter([b"abcd", b"efgh", b"ijk", b"never"])
    with pytest.raises(collect_module._Refused, match="larger than the"):
        collect_module._read_capped(lambda n: next(chunks))


def test_mib():
    assert collect_module._mib(64 * 1024 * 1024) == "64 MiB"
    assert collect_module._mib(1536 * 1024) == "1.5 MiB"


# --- zips -----------------------------------------------------------------------------

def _member(name, mode=None, data=b"x"):
    info = zipfile.ZipInfo(name, date_time=(2026, 10, 1, 12, 0, 0))
    if mode is not None:
        info.external_attr = mode << 16
    return info, data


def test_a_zip_of_odd_members_lists_each_with_its_reason(course, tmp_path):
    archive = tmp_path / "odd.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for info, data in [
            _member("__MACOSX/._x.ipynb"),
            _member("ada.ipynb", stat.S_IFREG | 0o644, tiny_notebook("ada")),
            _member("ben.ipynb", 0o644, tiny_notebook("ben")),
            _member("cy.ipynb", 0, tiny_notebook("cy")),
            _member("/abs.ipynb"), _member("../up.ipynb"), _member("a/./b.ipynb"),
            _member("a//b.ipynb"),
            _member("link.ipynb", stat.S_IFLNK | 0o777, b"/etc/passwd"),
            _member("fifo.ipynb", stat.S_IFIFO | 0o644),
            _member("dir.ipynb/", stat.S_IFDIR | 0o755, b""),
            _member("folder.ipynb", stat.S_IFDIR | 0o755, b""),
            _member("plaindir/", None, b""),
            _member(".hidden.ipynb"), _member(".hidden.ipynb/", None, b""),
            _member(".git/x.ipynb"),
        ]:
            z.writestr(info, data)
    report = _run(course, archive)
    assert report.collected == ["ada", "ben", "cy"]
    assert report.unmatched == [
        "../up.ipynb (unsafe path in zip)",
        ".hidden.ipynb (a hidden notebook (its name starts with a dot): rename it to collect it)",
        "a//b.ipynb (unsafe path in zip)",
        "a/./b.ipynb (unsafe path in zip)",
        "/abs.ipynb (unsafe path in zip)",
        "dir.ipynb/ (a folder named like a notebook)",
        "fifo.ipynb (not a regular file)",
        "folder.ipynb (a folder named like a notebook)",
        "link.ipynb (a symbolic link; links are never followed)",
    ]


def test_a_windows_zip_with_backslashes_is_read(course, tmp_path):
    archive = tmp_path / "win.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("ada\\hw.ipynb", tiny_notebook("ada"))
        z.writestr("..\\evil.ipynb", b"x")
        z.writestr("Xu/hw.ipynbX", b"x")
        z.writestr("Xu.ipynb", tiny_notebook("xu"))
    report = _run(course, archive)
    assert report.collected == ["Xu", "ada"]
    assert report.unmatched == ["../evil.ipynb (unsafe path in zip)",
                                "Xu/hw.ipynbX (not a notebook)"]


def _patch_member(archive, name, **fields):
    """Rewrite fields of a member in both its local header and the central directory."""
    data = bytearray(archive.read_bytes())
    offsets = {"flag": (6, 8), "method": (8, 10)}
    for signature, start in ((b"PK\x03\x04", 0), (b"PK\x01\x02", 2)):
        at = data.find(signature)
        while at >= 0:
            name_at = at + (30 if start == 0 else 46)
            length = int.from_bytes(data[at + (26 if start == 0 else 28):][:2], "little")
            if data[name_at:name_at + length] == name.encode():
                for field, value in fields.items():
                    low = at + offsets[field][0] + start
                    data[low:low + 2] = value.to_bytes(2, "little")
            at = data.find(signature, at + 4)
    archive.write_bytes(bytes(data))


def test_damaged_encrypted_or_oddly_compressed_members_are_listed(course, tmp_path):
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for name in ("ada.ipynb", "crc.ipynb", "enc.ipynb", "lzma.ipynb"):
            z.writestr(name, tiny_notebook(name) * 20)
    data = archive.read_bytes()
    with zipfile.ZipFile(archive) as z:
        crc = z.getinfo("crc.ipynb")
        at = crc.header_offset + 30 + len(crc.filename) + len(crc.extra) + 5
    archive.write_bytes(data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:])
    _patch_member(archive, "enc.ipynb", flag=1)
    _patch_member(archive, "lzma.ipynb", method=99)
    report = _run(course, archive)
    assert report.collected == ["ada"]
    assert report.unmatched == [
        "crc.ipynb (cannot be read: damaged in the zip)",
        "enc.ipynb (cannot be read: encrypted or an unsupported compression)",
        "lzma.ipynb (cannot be read: encrypted or an unsupported compression)"]


def test_read_from_zip_reports_an_os_error_by_its_reason(monkeypatch, tmp_path):
    archive = _zip(tmp_path / "z.zip", {"ada.ipynb": b"x"})
    with zipfile.ZipFile(archive) as z:
        candidate = collect_module._Candidate("ada.ipynb", ("ada.ipynb",),
                                              member=z.getinfo("ada.ipynb"))

        def failing(*args, **kwargs):
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(z, "open", failing)
        with pytest.raises(collect_module._Refused, match="^cannot be read: Input/output error$"):
            collect_module._read_from_zip(z, candidate)

        def failing_quietly(*args, **kwargs):
            raise OSError("no errno")

        monkeypatch.setattr(z, "open", failing_quietly)
        with pytest.raises(collect_module._Refused, match="^cannot be read: damaged in the zip$"):
            collect_module._read_from_zip(z, candidate)


def test_zip_member_dates_and_declared_sizes(tmp_path, monkeypatch):
    """A member's date is its time (1980, the zip's "no date", is none); an oversized
    declared size is refused before reading."""
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 3 * 1024 * 1024)
    archive = tmp_path / "z.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(zipfile.ZipInfo("a.ipynb", date_time=(2026, 10, 1, 12, 30, 4)), b"a")
        z.writestr(zipfile.ZipInfo("b.ipynb", date_time=(1980, 1, 1, 0, 0, 0)), b"b")
        z.writestr(zipfile.ZipInfo("c.ipynb", date_time=(1981, 1, 1, 0, 0, 0)), b"c")
        z.writestr(zipfile.ZipInfo("d.ipynb", date_time=(2026, 10, 1, 12, 0, 0)), b"d" * 10)
    with zipfile.ZipFile(archive) as z:
        def read(name):
            candidate = collect_module._Candidate(name, (name,), member=z.getinfo(name))
            return candidate, bytes(collect_module._read_from_zip(z, candidate))

        a, data = read("a.ipynb")
        assert data == b"a" and a.when == datetime(2026, 10, 1, 12, 30, 4)
        assert a.when_source == "zip member date" and a.when.tzinfo is None
        b, _ = read("b.ipynb")
        assert b.when is None and b.when_source is None
        assert read("c.ipynb")[0].when == datetime(1981, 1, 1)
        z.getinfo("d.ipynb").date_time = (2026, 13, 1, 0, 0, 0)
        d, data = read("d.ipynb")
        assert d.when is None and data == b"d" * 10
        z.getinfo("d.ipynb").file_size = 3 * 1024 * 1024
        assert read("d.ipynb")[1] == b"d" * 10
        z.getinfo("d.ipynb").file_size = 3 * 1024 * 1024 + 512 * 1024
        with pytest.raises(collect_module._Refused) as refused:
            read("d.ipynb")
        assert str(refused.value) == "declared size 3.5 MiB is over the 3 MiB cap"


# --- whole collections ----------------------------------------------------------------

def test_canvas_and_moodle_hand_ins_are_recorded_with_their_lms_fields(course, tmp_path,
                                                                      new_york):
    """The sidecar says where a hand-in came from, the LMS, its id, its late marker and
    its time; timestamp.txt holds the zip date, read in the course's zone."""
    (course.root / "deadlines.json").write_text('{"timezone": "Europe/Berlin"}')
    report = _run(course, _zip(tmp_path / "lms.zip", {
        f"lovelaceada_LATE_12345_67890_{NB}": (tiny_notebook("ada"), (2026, 10, 1, 12, 0, 0)),
        f"Dee Blank_4242_assignsubmission_file_{NB}": (tiny_notebook("dee"),
                                                        (2026, 1, 15, 9, 30, 0)),
    }))
    assert report.collected == ["Dee_Blank_4242", "lovelaceada_12345"]
    assert report.late == ["lovelaceada_12345"] and report.renamed == {} and report.notes == []
    ada = _sidecar(course, "lovelaceada_12345")
    assert datetime.fromisoformat(ada.pop("collected_at")).tzinfo is not None
    assert ada == {"version": 1, "student": "lovelaceada_12345", "assignment": A,
                   "from": f"lovelaceada_LATE_12345_67890_{NB}", "lms": "canvas",
                   "lms_id": "12345", "lms_late": True,
                   "lms_prefix": "lovelaceada_LATE_12345_67890",
                   "submitted_at": "2026-10-01T10:00:00+00:00",
                   "timestamp_source": "zip member date", "roster_match": None,
                   "files": [NB], "notes": []}
    assert _stamp(course, "lovelaceada_12345") == "2026-10-01 10:00:00.000000 UTC"
    dee = _sidecar(course, "Dee_Blank_4242")
    assert (dee["lms"], dee["lms_id"], dee["lms_late"]) == ("moodle", "4242", False)
    assert dee["lms_prefix"] == "Dee Blank_4242_assignsubmission_file"
    assert _stamp(course, "Dee_Blank_4242") == "2026-01-15 08:30:00.000000 UTC"
    text = (course.submitted / "Dee_Blank_4242" / A / ".handin.json").read_text()
    assert text.startswith('{\n "version": 1,\n') and text.endswith("}\n")


def test_a_broken_deadlines_file_reads_zip_dates_as_utc_with_a_note(course, tmp_path, new_york):
    (course.root / "deadlines.json").write_text('{"timezone": "Mars/Base"}')
    report = _run(course, _zip(tmp_path / "z.zip", {"ada.ipynb": (tiny_notebook("ada"),
                                                                  (2026, 10, 1, 12, 0, 0))}))
    assert report.collected == ["ada"]
    assert report.notes == ["deadlines.json: unknown timezone 'Mars/Base'; zip dates read as UTC"]
    assert _stamp(course, "ada") == "2026-10-01 12:00:00.000000 UTC"


def test_a_folder_hand_in_records_the_file_time(course, tmp_path, new_york):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    when = datetime(2026, 10, 2, 12, 0, tzinfo=UTC).timestamp()
    os.utime(inbox / "ada.ipynb", (when, when))
    _run(course, inbox)
    assert _stamp(course, "ada") == "2026-10-02 12:00:00.000000 UTC"
    ada = _sidecar(course, "ada")
    assert ada["timestamp_source"] == "file modification time (last resort)"
    assert ada["submitted_at"] == "2026-10-02T12:00:00+00:00"
    assert (ada["lms"], ada["lms_id"], ada["lms_late"], ada["from"]) == (None, None, False,
                                                                         "ada.ipynb")


def test_a_zip_without_dates_records_no_time(course, tmp_path):
    """No date in the zip: no timestamp.txt (an old one is removed), the sidecar says so."""
    (course.submitted / "ada" / A).mkdir(parents=True)
    (course.submitted / "ada" / A / "timestamp.txt").write_text("2020-01-01 00:00:00 UTC")
    _run(course, _zip(tmp_path / "z.zip", {"ada.ipynb": (tiny_notebook("ada"),
                                                         (1980, 1, 1, 0, 0, 0))}))
    assert not (course.submitted / "ada" / A / "timestamp.txt").exists()
    ada = _sidecar(course, "ada")
    assert ada["submitted_at"] is None and ada["timestamp_source"] is None


def test_neither_a_folder_nor_a_zip_is_refused(course, tmp_path):
    (tmp_path / "x.txt").write_text("not a zip")
    for path in (tmp_path / "x.txt", tmp_path / "missing"):
        with pytest.raises(FileNotFoundError, match="is neither a folder nor a zip file"):
            _run(course, path)
    with pytest.raises(FileNotFoundError, match="source/nope holds no notebook"):
        _run(course, tmp_path, "nope")


def test_the_root_folder_is_closed_after_collecting(course, tmp_path):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    before = len(os.listdir("/proc/self/fd"))
    _run(course, inbox)
    _run(course, _zip(tmp_path / "z.zip", {"ben.ipynb": b"{}"}))
    assert len(os.listdir("/proc/self/fd")) == before


def test_default_notebook_names_name_no_student(course, tmp_path):
    """Untitled.ipynb or the assignment's own name loose in the folder: whose is it?"""
    inbox = _folder(tmp_path, {"Untitled.ipynb": b"{}", "untitled12.ipynb": b"{}",
                               NB: b"{}", "ada.ipynb": tiny_notebook("ada"),
                               "Untitledx.ipynb": tiny_notebook("x"),
                               f"Copy of {NB}": b"{}", f"{A}-Copy1.ipynb": b"{}",
                               f"x_1_2_{NB}": tiny_notebook("canvas")})
    report = _run(course, inbox)
    assert report.collected == ["Untitledx", "ada", "x_1"]
    why = "names no student; rename it after the student, or put it in a folder named after them"
    assert report.unmatched == [f"{A}-Copy1.ipynb ({A}-Copy1.ipynb {why})",
                                f"{NB} ({NB} {why})", f"Copy of {NB} (Copy of {NB} {why})",
                                f"Untitled.ipynb (Untitled.ipynb {why})",
                                f"untitled12.ipynb (untitled12.ipynb {why})"]


def test_a_colab_copy_in_a_students_folder_or_canvas_name_is_their_hand_in(course, tmp_path):
    """Colab saves a student's work as "Copy of 01_hw.ipynb": inside their folder or
    under their Canvas name it is their hand-in, saved under the assignment's name."""
    inbox = _folder(tmp_path, {f"ada/Copy of {NB}": tiny_notebook("ada"),
                               f"lovelaceada_12345_67890_Copy of {NB}": tiny_notebook("lov")})
    report = _run(course, inbox)
    assert report.collected == ["ada", "lovelaceada_12345"]
    assert _got(course, "ada") == tiny_notebook("ada")
    assert _got(course, "lovelaceada_12345") == tiny_notebook("lov")


def test_default_name_is_only_for_loose_plain_notebooks():
    def candidate(parts, **kw):
        c = collect_module._Candidate("/".join(parts), parts, **kw)
        c.ident = kw.pop("ident", None) or collect_module._identify_full(parts[0])
        return c

    expected = [NB]
    assert collect_module._default_name(candidate(("Untitled.ipynb",)), expected)
    assert collect_module._default_name(candidate(("Untitled", "x.ipynb")), expected) is None
    assert collect_module._default_name(candidate(("Untitled.ipynb",), rel=("x",)),
                                        expected) is None
    assert collect_module._default_name(candidate(("Untitled.ipynb",), reason="r"),
                                        expected) is None
    no_ident = collect_module._Candidate("Untitled.ipynb", ("Untitled.ipynb",))
    assert collect_module._default_name(no_ident, expected) is None
    assert collect_module._default_name(candidate(("x_1_2_Untitled.ipynb",)), expected) is None


def test_a_course_tree_is_read_only_in_submitted(course, tmp_path):
    """A whole nbgrader course given: only submitted/ is read, the rest noted."""
    inbox = _folder(tmp_path, {f"submitted/ada/{A}/hw.ipynb": tiny_notebook("ada"),
                               f"source/{A}/{NB}": b"{}", "ben.ipynb": b"{}"})
    report = _run(course, inbox)
    assert report.collected == ["ada"] and report.unmatched == []
    assert report.notes == ["an nbgrader course: only its submitted/ was read "
                            "(2 other entries left alone)"]
    inbox = _folder(tmp_path, {f"submitted/ada/{A}/hw.ipynb": tiny_notebook("ada")}, "only")
    assert _run(course, inbox).notes == []
    # "submitted" as a student's folder of loose notebooks is no course tree.
    inbox = _folder(tmp_path, {"submitted/x.ipynb": b"{}", "ben.ipynb": tiny_notebook("b")},
                    "flat")
    assert _run(course, inbox).collected == ["ben", "submitted"]


def test_course_tree_needs_four_parts():
    c = collect_module._Candidate
    three = [c("a", ("submitted", "ada", "x.ipynb")), c("b", ("b.ipynb",))]
    assert collect_module._course_tree(three, CollectReport()) == three


def test_nbgrader_layout_with_extras_and_timestamp(course, tmp_path):
    """nbgrader's layout: notebooks and extra files, its timestamp.txt wins."""
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": tiny_notebook("ada"),
                               f"ada/{A}/data/x.csv": b"1,2",
                               f"ada/{A}/data/deep/y.csv": b"3",
                               f"ada/{A}/timestamp.txt": b"2015-02-02 14:58:23.948203 -0800",
                               f"ben/{A}/other.ipynb": tiny_notebook("ben"),
                               f"cy/{A}/x.csv": b"no notebook",
                               f"dee/{A}/{NB}": tiny_notebook("dee"),
                               f"dee/{A}/extra.ipynb": tiny_notebook("dee x")})
    report = _run(course, inbox)
    assert report.collected == ["ada", "ben", "dee"]
    assert report.unmatched == [f"cy/{A}/ (no notebook in it)"]
    assert report.notes == ["dee: not the assignment's notebooks: extra.ipynb"]
    assert _got(course, "dee") == tiny_notebook("dee")
    assert _got(course, "dee", "extra.ipynb") == tiny_notebook("dee x")
    assert _got(course, "ada", "data/deep/y.csv") == b"3"
    assert report.renamed == {"ben": f"other.ipynb saved as {NB}"}
    assert _got(course, "ada", "data/x.csv") == b"1,2"
    assert _stamp(course, "ada") == "2015-02-02 22:58:23.948203 UTC"
    ada = _sidecar(course, "ada")
    assert ada["timestamp_source"] == "nbgrader's timestamp.txt"
    assert ada["files"] == [NB, "data/deep/y.csv", "data/x.csv"] and ada["from"] == f"ada/{A}/"
    assert _sidecar(course, "ben")["timestamp_source"] == "file modification time (last resort)"


def test_an_unreadable_nbgrader_timestamp_falls_back_with_a_note(course, tmp_path):
    members = {f"ada/{A}/{NB}": (tiny_notebook("ada"), (2026, 10, 1, 12, 0, 0)),
               f"ada/{A}/timestamp.txt": (b"garbage", (2026, 10, 1, 12, 0, 0)),
               f"ben/{A}/{NB}": (tiny_notebook("ben"), (1980, 1, 1, 0, 0, 0)),
               f"ben/{A}/timestamp.txt": (b"x" * 2000, (1980, 1, 1, 0, 0, 0))}
    report = _run(course, _zip(tmp_path / "z.zip", members))
    assert report.collected == ["ada", "ben"]
    assert report.notes == ["ada: its timestamp.txt cannot be read; zip member date used",
                            "ben: its timestamp.txt cannot be read; no time used"]
    assert _stamp(course, "ada") == "2026-10-01 12:00:00.000000 UTC"
    assert _sidecar(course, "ada")["notes"] == [
        "its timestamp.txt cannot be read; zip member date used"]


def test_the_nbgrader_timestamp_is_read_from_its_first_kilobyte(course, tmp_path):
    stamp = b"2015-02-02 14:58:23 UTC" + b" " * 1001 + b"9"
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": tiny_notebook("ada"),
                               f"ada/{A}/timestamp.txt": stamp})
    _run(course, inbox)
    assert _stamp(course, "ada") == "2015-02-02 14:58:23.000000 UTC"


def test_a_refused_timestamp_file_is_noted(course, tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 100)
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": b"{}",
                               f"ada/{A}/timestamp.txt": b"2015-02-02 14:58:23 UTC" + b" " * 100})
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    assert report.notes == ["ada: its timestamp.txt cannot be read; "
                            "file modification time (last resort) used"]


def test_hand_ins_for_other_assignments_are_left_out_with_a_note(course, tmp_path):
    for name in ("ps2", "ps3"):
        (course.source / name).mkdir()
        (course.source / name / "p.ipynb").write_bytes(b"{}")
    files = {f"ada/{A}/{NB}": tiny_notebook("ada"),
             "ada/ps2/p.ipynb": b"{}", "ada/ps2/d/x.csv": b"1", "ada/ps2/e/y.csv": b"1",
             "ben/ps2/p.ipynb": b"{}", "ben/ps3/p.ipynb": b"{}"}
    note = "left out, hand-ins for other assignments: ps2 (2 folders), ps3 (1 folders)"
    report = _run(course, _folder(tmp_path, files))
    assert report.collected == ["ada"] and report.unmatched == []
    assert report.notes == [note]
    report = _run(course, _zip(tmp_path / "z.zip", files))
    assert report.unchanged == ["ada"] and report.unmatched == []
    assert report.notes == [note]


def test_the_latest_of_several_hand_ins_is_taken(course, tmp_path):
    """Resubmissions: the latest zip date, then Canvas's -N, then the submission id."""
    report = _run(course, _zip(tmp_path / "z.zip", {
        f"ada_1_10_{NB}": (tiny_notebook("ada old"), (2026, 10, 1, 12, 0, 0)),
        f"ada_1_11_{NB}": (tiny_notebook("ada new"), (2026, 10, 2, 12, 0, 0)),
        f"ada_1_12_{NB}": (tiny_notebook("ada older"), (2026, 9, 1, 12, 0, 0)),
        f"ben_2_30_{A}.ipynb": (tiny_notebook("ben 0"), (2026, 10, 1, 12, 0, 0)),
        f"ben_2_20_{A}-2.ipynb": (tiny_notebook("ben 2"), (2026, 10, 1, 12, 0, 0)),
        f"ben_2_25_{A}-1.ipynb": (tiny_notebook("ben 1"), (2026, 10, 1, 12, 0, 0)),
        f"cy_3_9_{NB}": (tiny_notebook("cy 9"), (2026, 10, 1, 12, 0, 0)),
        f"cy_3_10_{NB}": (tiny_notebook("cy 10"), (2026, 10, 1, 12, 0, 0)),
    }))
    assert report.collected == ["ada_1", "ben_2", "cy_3"]
    assert _got(course, "ada_1") == tiny_notebook("ada new")
    assert _got(course, "ben_2") == tiny_notebook("ben 2")
    assert _got(course, "cy_3") == tiny_notebook("cy 10")
    def earlier(shown, student, latest):
        return f"{shown} (an earlier hand-in of {student}; the latest, {latest}, was taken)"

    assert report.unmatched == [
        earlier(f"ada_1_10_{NB}", "ada_1", f"ada_1_11_{NB}"),
        earlier(f"ada_1_12_{NB}", "ada_1", f"ada_1_11_{NB}"),
        earlier(f"ben_2_25_{A}-1.ipynb", "ben_2", f"ben_2_20_{A}-2.ipynb"),
        earlier(f"ben_2_30_{NB}", "ben_2", f"ben_2_20_{A}-2.ipynb"),
        earlier(f"cy_3_9_{NB}", "cy_3", f"cy_3_10_{NB}")]


def test_recency_of_folder_hand_ins(course, tmp_path):
    """Two loose notebooks of one student in a folder: by Canvas's -N, then the name's numbers."""
    inbox = _folder(tmp_path, {"ada/hw-1.ipynb": tiny_notebook("1"),
                               "ada/hw-3.ipynb": tiny_notebook("3"),
                               "ada/hw-2.ipynb": tiny_notebook("2")})
    report = _run(course, inbox)
    assert report.collected == ["ada"] and _got(course, "ada") == tiny_notebook("3")
    assert report.renamed == {"ada": f"hw-3.ipynb saved as {NB}"}


def test_recency_key():
    """The key orders by zip date, then resubmission number, then numbers in the name."""
    def recency(shown, ident_name=None):
        candidate = collect_module._Candidate(shown, (shown,))
        if ident_name:
            candidate.ident = collect_module._identify_full(ident_name)
        return collect_module._recency(collect_module._Handin("k", "s", shown, None, (shown,),
                                                              notebooks=[candidate]))

    # A hand-in without notebooks (never chosen) still gets a key, the lowest.
    empty = collect_module._recency(collect_module._Handin("k", "s", "x", None, ("x",)))
    assert empty == recency("a.ipynb")
    assert recency("a_7_hw_9.ipynb") < recency("a_7_hw_12.ipynb")
    assert recency("a_7_hw_12.ipynb") < recency("a_7_8_hw-3.ipynb", "a_7_8_hw-3.ipynb")


def test_plain_name():
    assert collect_module._plain_name("hw-2.ipynb") == "hw.ipynb"
    assert collect_module._plain_name("hw-12.ipynb") == "hw.ipynb"
    assert collect_module._plain_name("hw-x.ipynb") == "hw-x.ipynb"
    assert collect_module._plain_name("hw-2.txt") == "hw-2.txt"


def test_two_names_for_one_id_are_both_refused_naming_them(course, tmp_path):
    inbox = _folder(tmp_path, {"John Smith.ipynb": b"1", "John  Smith.ipynb": b"2",
                               "john_smith.ipynb": tiny_notebook("j"), "ada.ipynb": b"{}"})
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    names = "John  Smith and John Smith and john_smith"
    assert sorted(report.unmatched) == sorted(
        f"{shown} (different names {names} map to one student id {sid}; none of them collected)"
        for shown, sid in [("John Smith.ipynb", "John_Smith"), ("John  Smith.ipynb", "John_Smith"),
                           ("john_smith.ipynb", "john_smith")])


def test_a_multi_notebook_assignment_as_student_folders(course2, tmp_path):
    """Several notebooks: a student's folder is one hand-in; missing and unknown ones noted."""
    inbox = _folder(tmp_path, {"ada/p1.ipynb": tiny_notebook("ada 1"),
                               "ada/p2.ipynb": tiny_notebook("ada 2"),
                               "ben/p1.ipynb": tiny_notebook("ben 1"),
                               "ben/extra.ipynb": tiny_notebook("ben x"),
                               "ben/zz.ipynb": tiny_notebook("ben z"),
                               "fay/x.ipynb": b"{}", "fay/y.ipynb": b"{}",
                               "cy.ipynb": tiny_notebook("cy"),
                               "dee_4_5_p2-1.ipynb": tiny_notebook("dee"),
                               "eve_6_7_p1-2.ipynb": tiny_notebook("eve")})
    report = _run(course2, inbox, "ps")
    assert report.collected == ["ada", "ben", "dee_4", "eve_6", "fay"]
    assert report.unmatched == ["cy.ipynb (the assignment has 2 notebooks (p1.ipynb, p2.ipynb); "
                                "hand them in as a folder)"]
    assert report.notes == ["ben: not the assignment's notebooks: extra.ipynb, zz.ipynb",
                            "ben: missing: p2.ipynb",
                            "fay: not the assignment's notebooks: x.ipynb, y.ipynb",
                            "fay: missing: p1.ipynb, p2.ipynb"]
    assert report.renamed == {}
    assert _got(course2, "ada", "p2.ipynb", "ps") == tiny_notebook("ada 2")
    assert _got(course2, "dee_4", "p2.ipynb", "ps") == tiny_notebook("dee")
    assert _got(course2, "eve_6", "p1.ipynb", "ps") == tiny_notebook("eve")
    assert sorted(p.name for p in (course2.submitted / "ben" / "ps").iterdir()) == [
        ".handin.json", "extra.ipynb", "p1.ipynb", "timestamp.txt", "zz.ipynb"]


def test_a_renamed_lms_notebook_is_noted(course2, course, tmp_path):
    report = _run(course, _zip(tmp_path / "a.zip", {f"ada_1_2_{A}-2.ipynb": b"{}",
                                                    "ben_3_4_Copy.ipynb": b"{}"}))
    assert report.renamed == {"ben_3": f"Copy.ipynb saved as {NB}"}
    assert _sidecar(course, "ada_1")["notes"] == []
    assert _sidecar(course, "ben_3")["notes"] == [f"Copy.ipynb saved as {NB}"]


def test_a_lesson_handed_in_for_the_assignment_is_noted(course, tmp_path):
    """A unit's lesson is NN_slug_lesson.ipynb: handed in by mistake, on an LMS or in a
    student's folder, it is collected (and will score what it answers) with a note
    that says what it looks like."""
    report = _run(course, _zip(tmp_path / "a.zip", {
        f"ada_1_2_{A}_lesson.ipynb": b"{}", f"ben_3_4_{A}_lesson-1.ipynb": b"{}",
        f"cy_5_6_{A}.ipynb": b"{}"}))
    assert _sidecar(course, "ada_1")["notes"] == [
        f"{A}_lesson.ipynb is named as a lesson, not as the assignment: was the lesson "
        f"handed in by mistake?", f"{A}_lesson.ipynb saved as {NB}"]
    assert _sidecar(course, "ben_3")["notes"][0].startswith(f"{A}_lesson-1.ipynb is named as")
    assert _sidecar(course, "cy_5")["notes"] == []
    report = _run(course, _folder(tmp_path, {f"dee/{A}_lesson.ipynb": tiny_notebook("d")}))
    assert report.collected == ["dee"]
    assert _sidecar(course, "dee")["notes"][0].startswith(f"{A}_lesson.ipynb is named as")


def test_extras_of_a_hand_in_over_the_file_count_are_listed(course, tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_FILES_PER_HANDIN", 3)
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": tiny_notebook("ada"),
                               **{f"ada/{A}/f{i}.csv": b"x" for i in range(4)}})
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    assert report.unmatched == [f"ada/{A}/f2.csv (more than 3 files in one hand-in)",
                                f"ada/{A}/f3.csv (more than 3 files in one hand-in)"]
    assert _sidecar(course, "ada")["files"] == [NB, "f0.csv", "f1.csv"]


def test_a_hand_in_over_four_times_the_cap_in_all_is_refused(course, tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 1024 * 1024)
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": b"x" * 1024,
                               **{f"ada/{A}/f{i}.bin": b"x" * (1024 * 1024) for i in range(4)},
                               f"ben/{A}/{NB}": b"x" * 1024,
                               **{f"ben/{A}/f{i}.bin": b"x" * (1024 * 1024) for i in range(3)},
                               f"ben/{A}/g.bin": b"x" * (1024 * 1024 - 1024)})
    report = _run(course, inbox)
    assert report.collected == ["ben"]
    assert report.unmatched == [f"ada/{A}/ (larger than the 4 MiB cap in all)"]
    assert not (course.submitted / "ada").exists()


def test_a_refused_notebook_refuses_the_hand_in_a_refused_extra_only_itself(
        course, tmp_path, monkeypatch):
    monkeypatch.setattr(collect_module, "MAX_HANDIN_BYTES", 100)
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": b"{" * 101, f"ada/{A}/x.csv": b"1",
                               f"ben/{A}/{NB}": b"{}", f"ben/{A}/x.csv": b"1" * 101,
                               f"ben/{A}/y.csv": b"2"})
    report = _run(course, inbox)
    assert report.collected == ["ben"]
    cap = "larger than the 9.53674e-05 MiB cap"
    assert report.unmatched == [f"ada/{A}/ ({cap})", f"ben/{A}/x.csv ({cap})"]
    assert _sidecar(course, "ben")["files"] == [NB, "y.csv"]


def test_the_time_of_a_hand_in_is_its_latest_notebook_not_an_extra(course2, tmp_path):
    """Several notebooks: the latest one's time; extra files' times do not count."""
    inbox = _folder(tmp_path, {"ada/ps/p1.ipynb": b"1", "ada/ps/p2.ipynb": b"2",
                               "ada/ps/data.csv": b"3"})
    for name, day in (("p1.ipynb", 2), ("p2.ipynb", 3), ("data.csv", 9)):
        when = datetime(2026, 10, day, 12, 0, tzinfo=UTC).timestamp()
        os.utime(inbox / "ada" / "ps" / name, (when, when))
    _run(course2, inbox, "ps")
    assert _stamp(course2, "ada", "ps") == "2026-10-03 12:00:00.000000 UTC"
    members = {"ben/p1.ipynb": (b"1", (2026, 10, 2, 12, 0, 0)),
               "ben/p2.ipynb": (b"2", (2026, 10, 4, 12, 0, 0))}
    _run(course2, _zip(tmp_path / "z.zip", members), "ps")
    assert _stamp(course2, "ben", "ps") == "2026-10-04 12:00:00.000000 UTC"


def test_an_undecodable_nbgrader_timestamp_is_noted_not_a_crash(course, tmp_path):
    inbox = _folder(tmp_path, {f"ada/{A}/{NB}": tiny_notebook("ada"),
                               f"ada/{A}/timestamp.txt": b"2015-02-02 \xff\xfe UTC"})
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    assert report.notes == ["ada: its timestamp.txt cannot be read; "
                            "file modification time (last resort) used"]


def test_global_and_per_student_notes_are_all_kept(course, tmp_path):
    (course.root / "deadlines.json").write_text('{"timezone": "Nowhere/Land"}')
    inbox = _folder(tmp_path, {f"submitted/ada/{A}/{NB}": tiny_notebook("ada"),
                               f"submitted/ada/{A}/timestamp.txt": b"garbage",
                               "README.md": b"x"})
    report = _run(course, inbox)
    assert report.notes == [
        "an nbgrader course: only its submitted/ was read (1 other entries left alone)",
        "deadlines.json: unknown timezone 'Nowhere/Land'; zip dates read as UTC",
        "ada: its timestamp.txt cannot be read; file modification time (last resort) used"]


def test_a_partly_changed_hand_in_is_replaced_keeping_each_old_file(course, tmp_path):
    """A resubmission that changes some files: those are replaced, old copies kept;
    the record says where the new one came from."""
    files = {f"ada/{A}/{NB}": tiny_notebook("ada"), f"ada/{A}/a.csv": b"1",
             f"ada/{A}/b.csv": b"2"}
    _run(course, _folder(tmp_path, files, "one"))
    files[f"ada/{A}/b.csv"] = b"2 changed"
    report = _run(course, _zip(tmp_path / "two.zip", files))
    assert report.replaced == ["ada"] and report.unchanged == []
    assert report.kept["ada"].startswith("b.replaced-") and report.kept["ada"].endswith(".csv.bak")
    assert _got(course, "ada", "b.csv") == b"2 changed"
    ada = _sidecar(course, "ada")
    assert ada["timestamp_source"] == "zip member date"
    assert _stamp(course, "ada") == "2026-10-01 12:00:00.000000 UTC"
    files[f"ada/{A}/{NB}"] = tiny_notebook("ada 3")
    files[f"ada/{A}/a.csv"] = b"1 changed"
    report = _run(course, _zip(tmp_path / "three.zip", files))
    kept = report.kept["ada"].split(", ")
    assert len(kept) == 2 and kept[0].startswith("01_hw.replaced-")
    assert kept[1].startswith("a.replaced-")
    assert _got(course, "ada", "a.csv") == b"1 changed"


def test_scratch_files_are_hidden_and_beside_their_target(course, tmp_path, monkeypatch):
    """Each file is written to a hidden scratch file in its own folder, then renamed
    (a rename across folders or file systems is not atomic)."""
    moves = []
    real = os.replace

    def spy(src, dst):
        moves.append((src, dst))
        return real(src, dst)

    monkeypatch.setattr(collect_module.os, "replace", spy)
    _run(course, _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")}))
    assert len(moves) == 3
    for src, dst in moves:
        src = os.fsdecode(src)
        assert os.path.dirname(src) == str(dst.parent)
        assert os.path.basename(src).startswith(".collect-") and src.endswith(".tmp")


# --- writing --------------------------------------------------------------------------

def test_recollecting_is_unchanged_and_a_change_keeps_the_old_copy(course, tmp_path, monkeypatch):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    first = _run(course, inbox)
    assert first.collected == ["ada"]
    sidecar = (course.submitted / "ada" / A / ".handin.json").read_bytes()
    again = _run(course, inbox)
    assert again.unchanged == ["ada"] and again.collected == [] and again.replaced == []
    assert (course.submitted / "ada" / A / ".handin.json").read_bytes() == sidecar
    real = collect_module.time.strftime
    monkeypatch.setattr(collect_module.time, "strftime", lambda fmt, *args: (
        "20261001T120000" if fmt == "%Y%m%dT%H%M%S" else real(fmt, *args)))
    for n, text in enumerate(["ada 2", "ada 3", "ada 4"]):
        (inbox / "ada.ipynb").write_bytes(tiny_notebook(text))
        report = _run(course, inbox)
        assert report.replaced == ["ada"] and report.collected == []
        kept = "01_hw.replaced-20261001T120000" + (f"-{n}" if n else "") + ".ipynb.bak"
        assert report.kept == {"ada": kept}
        assert f"  replaced: ada (old copy kept as {kept})" in report.lines()
    folder = course.submitted / "ada" / A
    assert _got(course, "ada") == tiny_notebook("ada 4")
    assert (folder / "01_hw.replaced-20261001T120000-2.ipynb.bak").read_bytes() == \
        tiny_notebook("ada 3")
    assert (folder / "01_hw.replaced-20261001T120000.ipynb.bak").read_bytes() == \
        tiny_notebook("ada")


def test_kept_name_uses_the_current_time(tmp_path):
    kept = collect_module._kept_name(tmp_path / "hw.ipynb")
    assert kept.parent == tmp_path and kept.name.startswith("hw.replaced-20")
    assert kept.name.endswith(".ipynb.bak") and len(kept.name) == len(
        "hw.replaced-20261001T120000.ipynb.bak")


def test_an_unchanged_hand_in_gets_its_missing_record(course, tmp_path):
    """A hand-in collected before sidecars existed gets one; its time is written."""
    folder = course.submitted / "ada" / A
    folder.mkdir(parents=True)
    (folder / NB).write_bytes(tiny_notebook("ada"))
    (folder / "timestamp.txt").write_text("2020-01-01 00:00:00 UTC")
    report = _run(course, _zip(tmp_path / "z.zip", {"ada.ipynb": (tiny_notebook("ada"),
                                                                  (1980, 1, 1, 0, 0, 0))}))
    assert report.unchanged == ["ada"]
    assert _sidecar(course, "ada")["from"] == "ada.ipynb"
    assert _stamp(course, "ada") == "2020-01-01 00:00:00 UTC"  # kept: nothing better known


def test_written_files_follow_the_umask(course, tmp_path):
    old = os.umask(0o026)
    try:
        _run(course, _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")}))
        assert os.umask(0o026) == 0o026  # left as it was
    finally:
        os.umask(old)
    folder = course.submitted / "ada" / A
    for name in (NB, ".handin.json", "timestamp.txt"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o640, name
    assert [p.name for p in folder.iterdir() if p.name.startswith(".collect-")] == []


def test_write_atomically_checks_the_copy(tmp_path):
    target = tmp_path / "x.bin"
    collect_module._write_atomically(target, b"abc", hashlib.sha256(b"abc").hexdigest())
    assert target.read_bytes() == b"abc"
    with pytest.raises(collect_module._Refused, match="the copy does not match the original"):
        collect_module._write_atomically(target, b"abd", hashlib.sha256(b"abc").hexdigest())
    assert target.read_bytes() == b"abc" and sorted(p.name for p in tmp_path.iterdir()) == [
        "x.bin"]


def test_links_and_odd_files_in_submitted_are_left_alone(course, tmp_path):
    """submitted/ is the instructor's: a link or a folder in the way refuses the hand-in."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    course.submitted.mkdir()
    (course.submitted / "ada").symlink_to(elsewhere, target_is_directory=True)
    (course.submitted / "ben" / A).mkdir(parents=True)
    (course.submitted / "ben" / A / NB).symlink_to(elsewhere / "x")
    (course.submitted / "cy" / A / NB).mkdir(parents=True)
    (course.submitted / "dee").mkdir()
    (course.submitted / "dee" / A).symlink_to(elsewhere, target_is_directory=True)
    (course.submitted / "eve" / A).mkdir(parents=True)
    (course.submitted / "eve" / A / "data").symlink_to(elsewhere, target_is_directory=True)
    inbox = _folder(tmp_path, {f"{s}.ipynb": tiny_notebook(s) for s in ("ada", "ben", "cy", "dee")})
    (inbox / "eve" / A / "data").mkdir(parents=True)
    (inbox / "eve" / A / NB).write_bytes(b"{}")
    (inbox / "eve" / A / "data" / "x.csv").write_bytes(b"1")
    report = _run(course, inbox)
    assert report.collected == []
    assert report.unmatched == [
        "ada.ipynb (submitted/ada is a symbolic link (left alone))",
        f"ben.ipynb (submitted/ben/{A}/{NB} is a symbolic link (left alone))",
        f"cy.ipynb (submitted/cy/{A}/{NB} is not a regular file (left alone))",
        f"dee.ipynb (submitted/dee/{A} is a symbolic link (left alone))",
        f"eve/{A}/ (submitted/eve/{A}/data is a symbolic link (left alone))"]
    assert list(elsewhere.iterdir()) == []


def test_a_linked_sidecar_is_not_written_and_noted(course, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for student, name in (("ada", ".handin.json"), ("ben", "timestamp.txt")):
        (course.submitted / student / A).mkdir(parents=True)
        (course.submitted / student / A / name).symlink_to(elsewhere / name)
    (course.submitted / "cy" / A / ".handin.json").mkdir(parents=True)
    inbox = _folder(tmp_path, {f"{s}.ipynb": tiny_notebook(s) for s in ("ada", "ben", "cy")})
    report = _run(course, inbox)
    assert report.collected == ["ada", "ben", "cy"]
    assert report.notes == [
        f"ada: its time and LMS marker were not recorded: submitted/ada/{A}/.handin.json is not "
        "a regular file (left alone)",
        f"ben: its time and LMS marker were not recorded: submitted/ben/{A}/timestamp.txt is not "
        "a regular file (left alone)",
        f"cy: its time and LMS marker were not recorded: submitted/cy/{A}/.handin.json is not "
        "a regular file (left alone)"]
    assert list(elsewhere.iterdir()) == []


def test_a_write_error_is_listed(course, tmp_path, monkeypatch):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(collect_module, "_write_atomically", failing)
    report = _run(course, inbox)
    assert report.unmatched == ["ada.ipynb (cannot be written to submitted/: "
                                "No space left on device)"]


def test_a_record_write_error_is_noted(course, tmp_path, monkeypatch):
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    real = collect_module._write_atomically

    def failing(target, data, digest=None):
        if target.name in ("timestamp.txt", ".handin.json"):
            raise OSError(28, "No space left on device")
        return real(target, data, digest)

    monkeypatch.setattr(collect_module, "_write_atomically", failing)
    report = _run(course, inbox)
    assert report.collected == ["ada"]
    assert report.notes == ["ada: its time and LMS marker were not recorded: cannot be "
                            "written to submitted/: No space left on device"]


# --- with a roster --------------------------------------------------------------------

def _roster(course, source, students):
    (course.root / "roster.json").write_text(json.dumps({"source": source, "students": [
        {"id": sid, "name": name, "lms_id": lms} for sid, name, lms in students]}))


def test_a_roster_files_hand_ins_under_its_ids(course, tmp_path):
    _roster(course, "canvas", [("111", "Smith, John", "111"), ("222", "Smith, John", "222"),
                               ("kim", "Park, Kim", None)])
    report = _run(course, _zip(tmp_path / "z.zip", {
        f"smithjohn_LATE_222_9_{NB}": tiny_notebook("john 2"),
        f"smithjohn_111_8_{NB}": tiny_notebook("john 1"),
        "Kim Park.ipynb": tiny_notebook("kim"),
        f"smithjohn_999_7_{NB}": tiny_notebook("john 3"),
        "John Smith.ipynb": tiny_notebook("which?"),
    }))
    assert report.collected == ["kim", "111", "222"]
    assert report.late == ["222"]
    assert report.notes == ["Kim Park.ipynb filed as kim (Park, Kim), matched by name"]
    assert report.unknown == ["John Smith.ipynb", f"smithjohn_999_7_{NB}"]
    assert report.unmatched == [
        "John Smith.ipynb (the name matches 2 students in the roster (111, 222); not merged)",
        f"smithjohn_999_7_{NB} (canvas id 999 is not in the roster (a canvas list); add the "
        "student and collect again)"]
    assert _got(course, "222") == tiny_notebook("john 2")
    assert _sidecar(course, "222")["roster_match"] == "canvas id 222"
    assert _sidecar(course, "kim")["roster_match"] == "name"


CANVAS_CLASS = [  # (sortable name, Canvas user id, late)
    ("Müller, Jürgen", 4713, False),
    ("Nguyễn, Thị Hoa", 4714, True),
    ("O'Brien, Seán", 4715, False),
    ("王, 小明", 4716, False),
    ("Smith-Jones, Ann", 4717, False),
]


def test_canvas_names_in_any_script_are_collected_to_their_roster_ids(course, tmp_path):
    """Canvas keeps accented and CJK letters in its file names: each hand-in is filed
    by its Canvas user id, the late one marked late, whether the zip spells the
    accents composed or (as macOS unzips them) decomposed."""
    _roster(course, "canvas", [(f"s{uid}", name, str(uid)) for name, uid, _ in CANVAS_CLASS])
    members = {canvas_download_name(name, uid, 99000 + uid, NB, late=late):
               tiny_notebook(name) for name, uid, late in CANVAS_CLASS}
    assert "müllerjürgen_4713_103713_01_hw.ipynb" in members
    assert "nguyễnthịhoa_LATE_4714_103714_01_hw.ipynb" in members
    assert "obrienseán_4715_103715_01_hw.ipynb" in members
    decomposed = {unicodedata.normalize("NFD", name): data for name, data in members.items()}
    for source, label in ((members, "nfc"), (decomposed, "nfd")):
        report = _run(course, _zip(tmp_path / f"{label}.zip", source))
        assert sorted(report.collected + report.unchanged) == [
            f"s{uid}" for _, uid, _ in CANVAS_CLASS], (label, report.unmatched)
        assert report.unmatched == [] and report.unknown == []
        for name, uid, late in CANVAS_CLASS:
            assert _got(course, f"s{uid}") == tiny_notebook(name)
            assert _sidecar(course, f"s{uid}")["lms_late"] is late


def test_canvas_names_match_a_roster_without_canvas_ids_by_name(course, tmp_path):
    """A plain class list (no Canvas ids): the name Canvas wrote still finds its
    student, accents, apostrophes, hyphens and family names first included."""
    _roster(course, "plain", [("jm", "Jürgen Müller", None), ("hoa", "Nguyễn Thị Hoa", None),
                              ("sean", "Seán O'Brien", None), ("xm", "王 小明", None),
                              ("ann", "Ann Smith-Jones", None)])
    report = _run(course, _zip(tmp_path / "plain.zip", {
        canvas_download_name(name, uid, 1, NB, late=late): tiny_notebook(name)
        for name, uid, late in CANVAS_CLASS}))
    assert sorted(report.collected) == ["ann", "hoa", "jm", "sean", "xm"], report.unmatched


def test_a_roster_names_hand_ins_under_ids_it_does_not_know(course, tmp_path):
    for n in range(12):
        (course.submitted / f"old{n:02}" / A).mkdir(parents=True)
    (course.submitted / "kim" / A).mkdir(parents=True)
    (course.submitted / "zed" / "ps9").mkdir(parents=True)
    _roster(course, "plain", [("kim", "Kim Park", None)])
    report = _run(course, _folder(tmp_path, {"kim.ipynb": tiny_notebook("kim")}))
    assert report.collected == ["kim"]
    assert report.notes == [
        "submitted/ holds 12 hand-ins of 01_hw under ids that are not in the roster (collected "
        "before it?): old00, old01, old02, old03, old04, old05, old06, old07, old08, old09 ..."]
    for n in range(2, 12):
        (course.submitted / f"old{n:02}" / A).rmdir()
    report = _run(course, _folder(tmp_path, {"kim.ipynb": tiny_notebook("kim")}, "again"))
    assert report.notes == [
        "submitted/ holds 2 hand-ins of 01_hw under ids that are not in the roster (collected "
        "before it?): old00, old01"]
    for n in range(2):
        (course.submitted / f"old{n:02}" / A).rmdir()
    assert _run(course, _folder(tmp_path, {"kim.ipynb": b"{}"}, "third")).notes == []


def test_ten_stale_ids_are_listed_without_dots(course, tmp_path):
    for n in range(10):
        (course.submitted / f"old{n}" / A).mkdir(parents=True)
    _roster(course, "plain", [("kim", "Kim Park", None)])
    report = _run(course, _folder(tmp_path, {"kim.ipynb": tiny_notebook("kim")}))
    assert report.notes[-1].endswith("old7, old8, old9")


# --- further small bugs ---------------------------------------------------------------

def test_two_unchanged_students_are_listed_with_a_comma():
    report = CollectReport(unchanged=["cy", "dee"])
    assert report.lines()[1] == "  unchanged: cy, dee"


def test_eleven_stale_ids_list_ten_and_dots(course, tmp_path):
    """More than ten ids unknown to the roster: the first ten, then " ..."."""
    for n in range(11):
        (course.submitted / f"old{n:02}" / A).mkdir(parents=True)
    _roster(course, "plain", [("kim", "Kim Park", None)])
    report = _run(course, _folder(tmp_path, {"kim.ipynb": tiny_notebook("kim")}))
    assert report.notes == [
        "submitted/ holds 11 hand-ins of 01_hw under ids that are not in the roster (collected "
        "before it?): old00, old01, old02, old03, old04, old05, old06, old07, old08, old09 ..."]


def test_other_assignments_in_a_course_tree_are_counted_by_student_folder(course, tmp_path):
    """In a whole course's submitted/, a hand-in of another assignment is named by that
    assignment (not by the student) and each student folder is counted once."""
    (course.source / "ps2").mkdir()
    (course.source / "ps2" / "p.ipynb").write_bytes(b"{}")
    report = _run(course, _zip(tmp_path / "z.zip", {
        f"submitted/ada/{A}/{NB}": tiny_notebook("ada"),
        "submitted/ada/ps2/p.ipynb": b"{}", "submitted/ada/ps2/d.csv": b"1",
        "submitted/ben/ps2/p.ipynb": b"{}"}))
    assert report.collected == ["ada"] and report.unmatched == []
    assert report.notes == ["left out, hand-ins for other assignments: ps2 (2 folders)"]


def test_a_student_folder_named_submitted_is_a_folder_of_its_own(course, tmp_path):
    """`submitted/ps2/...` (the student `submitted`, read without the course prefix) and
    `submitted/submitted/ps2/...` are two folders, each counted."""
    (course.source / "ps2").mkdir()
    (course.source / "ps2" / "p.ipynb").write_bytes(b"{}")
    report = _run(course, _zip(tmp_path / "z.zip", {
        "submitted/ps2/p.ipynb": b"{}", "submitted/submitted/ps2/p.ipynb": b"{}"}))
    assert report.notes == ["left out, hand-ins for other assignments: ps2 (2 folders)"]


def test_two_nbgrader_folders_for_one_id_are_both_refused(course, tmp_path):
    """`Ada/<assignment>/` and `ada/<assignment>/` are one student id under two names:
    neither is collected, both are listed naming the two."""
    report = _run(course, _zip(tmp_path / "z.zip", {f"Ada/{A}/{NB}": tiny_notebook("Ada"),
                                                    f"ada/{A}/{NB}": tiny_notebook("ada")}))
    assert report.collected == [] and report.replaced == []
    assert sorted(report.unmatched) == [
        f"{folder}/{A}/ (different names Ada and ada map to one student id {folder}; none of "
        "them collected)" for folder in ("Ada", "ada")]
    assert not course.submitted.exists() or list(course.submitted.iterdir()) == []


def test_a_roster_files_an_nbgrader_folder_under_its_id(course, tmp_path):
    """An nbgrader-layout hand-in is matched against the roster by its folder's name."""
    _roster(course, "plain", [("ada", "Ada Lovelace", None)])
    report = _run(course, _zip(tmp_path / "z.zip", {f"ada/{A}/{NB}": tiny_notebook("ada")}))
    assert report.collected == ["ada"] and report.unmatched == []
    assert _got(course, "ada") == tiny_notebook("ada")
    assert _sidecar(course, "ada")["roster_match"] == "roster id"


@pytest.mark.filterwarnings("error")
def test_reading_from_a_folder_warns_about_nothing(tmp_path):
    """Reading a hand-in prints no warning (binary files cannot be line-buffered)."""
    inbox = _folder(tmp_path, {"ada.ipynb": b"abc"})
    assert bytes(_read_folder(inbox, ("ada.ipynb",))[1]) == b"abc"


def test_a_read_error_in_a_folder_file_is_refused_with_its_reason(tmp_path, monkeypatch):
    def failing(read):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(collect_module, "_read_capped", failing)
    inbox = _folder(tmp_path, {"ada.ipynb": b"abc"})
    with pytest.raises(collect_module._Refused) as refused:
        _read_folder(inbox, ("ada.ipynb",))
    assert str(refused.value) == "cannot be read: Input/output error"


def test_a_file_time_keeps_its_zone_in_a_course_with_another_zone(course, tmp_path):
    """A file's time is an instant (UTC): the course's zone is only for zone-less zip dates."""
    (course.root / "deadlines.json").write_text('{"timezone": "Europe/Berlin"}')
    inbox = _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")})
    when = datetime(2026, 10, 2, 12, 0, tzinfo=UTC).timestamp()
    os.utime(inbox / "ada.ipynb", (when, when))
    _run(course, inbox)
    assert _sidecar(course, "ada")["submitted_at"] == "2026-10-02T12:00:00+00:00"


def test_a_stored_copy_that_does_not_match_is_refused(course, monkeypatch):
    """The bytes written into submitted/ are checked against the hand-in's; a mismatch is
    refused with its reason and leaves nothing behind."""
    class Corrupted(type(collect_module.Path())):
        def read_bytes(self):
            return b"not what was written"

    monkeypatch.setattr(collect_module, "Path", Corrupted)
    with pytest.raises(collect_module._Refused) as refused:
        collect_module._store(course, "ada", A, [((NB,), b"hand-in")], CollectReport())
    assert str(refused.value) == "the copy does not match the original"
    assert list((course.submitted / "ada" / A).iterdir()) == []


def test_the_old_copy_of_a_link_swapped_in_is_the_link_not_its_target(course, tmp_path,
                                                                      monkeypatch):
    """A hand-in replaced just when a link is swapped in for it: the kept old copy is the
    link itself, the file it points to is never copied into submitted/."""
    _run(course, _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada")}))
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"secret")
    real = collect_module._kept_name

    def swap(target):
        target.unlink()
        target.symlink_to(secret)
        return real(target)

    monkeypatch.setattr(collect_module, "_kept_name", swap)
    report = _run(course, _folder(tmp_path, {"ada.ipynb": tiny_notebook("ada 2")}, "again"))
    assert report.replaced == ["ada"]
    kept = course.submitted / "ada" / A / report.kept["ada"]
    assert kept.is_symlink() and os.readlink(kept) == str(secret)
    assert _got(course, "ada") == tiny_notebook("ada 2")


def test_a_file_swapped_in_for_the_source_folder_is_refused_naming_it(course, tmp_path,
                                                                     monkeypatch):
    """The source is opened as a folder: a file there (swapped in after the check) is
    refused with an error that names its path."""
    class SeenAsFolder(type(collect_module.Path())):
        def is_dir(self):
            return True

    source = tmp_path / "inbox"
    source.write_text("not a folder")
    monkeypatch.setattr(collect_module, "Path", SeenAsFolder)
    with pytest.raises(NotADirectoryError) as error:
        _run(course, source)
    assert str(error.value.filename) == str(source)


def test_a_notebook_named_saved_as_is_a_note_not_a_renaming(course, tmp_path):
    """Only a notebook saved under the assignment's name is reported as renamed: an extra
    notebook whose own name says "saved as" is a plain note (it was once listed as renamed)."""
    report = _run(course, _folder(tmp_path, {
        f"ada/{A}/{NB}": tiny_notebook("ada"),
        f"ada/{A}/draft saved as final.ipynb": tiny_notebook("draft")}))
    assert report.collected == ["ada"] and report.renamed == {}
    assert report.notes == ["ada: not the assignment's notebooks: draft saved as final.ipynb"]
