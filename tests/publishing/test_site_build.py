"""The site's build (autograder/publishing/site.py), pinned without running a kernel, npm or
Jupyter Book.

Each test fails on a small bug in site.py (`make mutation`). The slow parts are
replaced by fakes that record what they are asked: the notebook client (a lesson
"runs" instantly), npm (tarballs made here, in npm's layout) and the jupyter-book
process (it writes a few HTML files). The course is the tiny one of
tests/publishing/test_publish_tree.py.
"""

import copy
import io
import json
import os
import re
import sys
import tarfile
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from test_publish_tree import make_course

from autograder.publishing import site
from autograder.publishing.edition import LESSON_DATA, Repository, units

URL = "https://github.com/example-course/layernorm-student"
REPO_ = Repository.parse(URL)
BINDER = "https://mybinder.org/v2/gh/example-course/layernorm-student/main"
COLAB = "https://colab.research.google.com/github/example-course/layernorm-student/blob/main/"

MATHJAX_FILES = {"package/es5/tex-chtml-full.js": b"mathjax",
                 "package/es5/output/chtml/fonts/woff-v2/MathJax_Zero.woff": b"font",
                 "package/LICENSE": b"apache",
                 "package/es5/tex-svg.js": b"unwanted",
                 "package/package.json": b"{}",
                 "package/es5/output/chtml.js": b"unwanted too"}
WIDGETS_FILES = {"package/dist/embed.js": b"embed",
                 "package/dist/embed.js.LICENSE.txt": b"licences",
                 "package/dist/fa.woff2": b"woff2",
                 "package/dist/fa.woff": b"woff",
                 "package/dist/other.js": b"unwanted",
                 "package/src/embed.ts": b"unwanted",
                 "package/dist/fa.WOFF": b"wrong case"}


def _tarball(path, files):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        folder = tarfile.TarInfo("package/es5")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("package/es5/linked.js")
        link.type = tarfile.SYMTYPE
        link.linkname = "tex-chtml-full.js"
        archive.addfile(link)
    return path


def npm_cache(folder):
    """An npm cache holding both pinned packages, as `npm pack` names them."""
    _tarball(folder / "mathjax-3.2.2.tgz", MATHJAX_FILES)
    _tarball(folder / "jupyter-widgets-html-manager-1.0.15.tgz", WIDGETS_FILES)
    return folder


@pytest.fixture
def course(tmp_path):
    course = make_course(tmp_path / "course")
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 03 · PyTorch's `LayerNorm`")]),
        course.root / "notebooks" / "03_gamma.ipynb")
    return course


@pytest.fixture
def no_npm(monkeypatch):
    """npm is never run for real: asking for it is an error of the test."""
    def run(*args, **kwargs):
        raise AssertionError(f"subprocess run: {args}")
    monkeypatch.setattr(site.subprocess, "run", run)
    monkeypatch.setattr(site.shutil, "which", lambda name: None)


# -- the browser-side assets -----------------------------------------------------------

def test_lessons_digest_is_the_sha256_of_each_lesson(course):
    """The site records each lesson's hash, to tell a stale site from a current one."""
    import hashlib

    digest = site.lessons_digest(course)
    assert sorted(digest) == ["01_alpha.ipynb", "02_beta.ipynb", "03_gamma.ipynb"]
    for name, value in digest.items():
        path = course.root / "notebooks" / name
        assert value == hashlib.sha256(path.read_bytes()).hexdigest()


def test_assets_are_unpacked_from_the_pinned_tarballs(tmp_path, no_npm):
    """Only the listed files of each package land in _assets/vendor/, without their
    package/, es5/ or dist/ prefixes (the paths _config.yml names)."""
    cache = npm_cache(tmp_path / "npm")
    static = tmp_path / "_assets"
    folders = site.install_assets(static, cache, log=io.StringIO())
    assert folders == {"mathjax": static / "vendor" / "mathjax",
                       "@jupyter-widgets/html-manager": static / "vendor" / "widgets"}
    found = {str(p.relative_to(static)): p.read_bytes()
             for p in sorted(static.rglob("*")) if p.is_file()}
    assert found == {"vendor/mathjax/tex-chtml-full.js": b"mathjax",
                     "vendor/mathjax/output/chtml/fonts/woff-v2/MathJax_Zero.woff": b"font",
                     "vendor/mathjax/LICENSE": b"apache",
                     "vendor/widgets/embed.js": b"embed",
                     "vendor/widgets/embed.js.LICENSE.txt": b"licences",
                     "vendor/widgets/fa.woff2": b"woff2",
                     "vendor/widgets/fa.woff": b"woff"}


def test_wanted_matches_folders_by_prefix_and_files_by_pattern():
    """A pattern ending in / takes a whole folder; others are globs, case-sensitive,
    on the name without package/."""
    def wanted(name, patterns):
        return site._wanted(SimpleNamespace(name=name), patterns)

    assert wanted("package/es5/output/a.woff", ["es5/output/"])
    assert not wanted("package/es5/outputs.js", ["es5/output/"])
    assert wanted("package/dist/x.woff2", ["dist/*.woff2"])
    assert not wanted("package/dist/x.WOFF2", ["dist/*.woff2"])
    assert wanted("package/LICENSE", ["nothing", "LICENSE"])
    assert not wanted("other/LICENSE", ["LICENSE"])


def test_npm_pack_fetches_a_missing_tarball_once(tmp_path, monkeypatch):
    """Without a cached tarball, `npm pack` fetches it into the cache (with a log
    line); with it, npm is not run again."""
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        Path(command[4], "mathjax-3.2.2.tgz").write_bytes(b"tgz")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(site.shutil, "which", lambda name: f"/opt/bin/{name}")
    monkeypatch.setattr(site.subprocess, "run", run)
    cache = tmp_path / "deep" / "npm"
    log = io.StringIO()
    assert site._npm_pack("mathjax", "3.2.2", cache, log) == cache / "mathjax-3.2.2.tgz"
    assert calls == [(["/opt/bin/npm", "pack", "--silent", "--pack-destination", str(cache),
                       "mathjax@3.2.2"], {"capture_output": True, "text": True,
                                          "timeout": 600})]
    assert log.getvalue() == "npm pack mathjax@3.2.2\n"
    assert site._npm_pack("mathjax", "3.2.2", cache, log) == cache / "mathjax-3.2.2.tgz"
    assert len(calls) == 1
    npm_cache(tmp_path / "other")  # a scoped package's tarball name
    assert site._npm_pack("@jupyter-widgets/html-manager", "1.0.15", tmp_path / "other",
                          log).name == "jupyter-widgets-html-manager-1.0.15.tgz"
    assert len(calls) == 1


def test_npm_pack_failures_stop_the_site(tmp_path, monkeypatch):
    """No npm, a failing npm, or an npm that writes no tarball: a SiteError that says
    which, with npm's own output."""
    monkeypatch.setattr(site.shutil, "which", lambda name: None)
    with pytest.raises(site.SiteError) as error:
        site._npm_pack("mathjax", "3.2.2", tmp_path, io.StringIO())
    assert str(error.value) == ("the site needs npm (Debian: apt-get install npm) to fetch "
                                "mathjax@3.2.2")
    monkeypatch.setattr(site.shutil, "which", lambda name: "/opt/bin/npm")
    for code in (1, 0):
        monkeypatch.setattr(site.subprocess, "run", lambda command, code=code, **_:
                            SimpleNamespace(returncode=code, stdout="out:", stderr="E404"))
        with pytest.raises(site.SiteError) as error:
            site._npm_pack("mathjax", "3.2.2", tmp_path, io.StringIO())
        assert str(error.value) == "npm pack mathjax@3.2.2 failed:\nout:E404"
    # npm says it failed although a tarball appeared: still a failure.
    def run_and_fail(command, **_):
        Path(command[4], "mathjax-3.2.2.tgz").write_bytes(b"partial")
        return SimpleNamespace(returncode=1, stdout="", stderr="interrupted")

    monkeypatch.setattr(site.subprocess, "run", run_and_fail)
    with pytest.raises(site.SiteError, match="interrupted"):
        site._npm_pack("mathjax", "3.2.2", tmp_path, io.StringIO())


# -- the book --------------------------------------------------------------------------

def test_index_page_lists_each_unit_with_its_links(course):
    """The first page's table: each lesson's page, Binder and Colab links, and the
    assignment's (or "none")."""
    text = site._index_page(course, REPO_)
    assert (f"| 01 | [The alpha recipe](notebooks/01_alpha.ipynb) | "
            f"[Binder]({BINDER}?urlpath=lab/tree/notebooks/01_alpha.ipynb) · "
            f"[Colab]({COLAB}notebooks/01_alpha.ipynb) | "
            f"[Binder]({BINDER}?urlpath=lab/tree/assignments/01_alpha/01_alpha.ipynb) · "
            f"[Colab]({COLAB}assignments/01_alpha/01_alpha.ipynb) |") in text
    assert (f"| 02 | [The beta relatives](notebooks/02_beta.ipynb) | "
            f"[Binder]({BINDER}?urlpath=lab/tree/notebooks/02_beta.ipynb) · "
            f"[Colab]({COLAB}notebooks/02_beta.ipynb) | none |") in text
    assert "A course in 3 units" in text and f"[course repository]({URL})" in text


def test_index_table_is_one_markdown_row_per_unit(course):
    """Under the table's header come the units' rows, one a line, each a whole
    Markdown row, then a blank line: anything between them breaks the table."""
    text = site._index_page(course, REPO_)
    header = ("| unit | lesson (read here) | run the lesson | assignment |\n"
              "| --- | --- | --- | --- |\n")
    rows = text.split(header)[1].split("\n\n")[0].split("\n")
    assert [row.split(" | ")[0] for row in rows] == ["| 01", "| 02", "| 03"]
    assert all(row.endswith(" |") and row.count(" | ") == 3 for row in rows)
    assert rows[2].startswith("| 03 | [PyTorch's `LayerNorm`](notebooks/03_gamma.ipynb) | ")


def test_book_config_points_at_the_served_assets_and_the_repository(course, tmp_path,
                                                                     no_npm):
    """Jupyter Book's settings: MathJax and the widget manager from the files
    install_assets wrote (a wrong path is a page without maths or widgets), launch
    buttons to Binder and Colab on the edition's repository and branch, the site's
    address, nothing executed again, and the theme's extras switched off."""
    repo = Repository.parse(URL, branch="term2", site_url="https://course.example.org/ln")
    static = tmp_path / "_assets"
    folders = site.install_assets(static, npm_cache(tmp_path / "npm"), io.StringIO())
    config = site._book_config(repo, folders)
    sphinx = config["sphinx"]["config"]
    assert (static / sphinx["mathjax_path"]).read_bytes() == b"mathjax"
    (widgets_js,) = sphinx["nb_ipywidgets_js"]
    assert (static / widgets_js).read_bytes() == b"embed"
    assert sphinx["nb_ipywidgets_js"][widgets_js] == {}
    assert config == {
        "title": "Layer Normalization, from the recipe to the fused kernel",
        "author": "",  # no "By ..." line in the footer
        "copyright": "",
        "only_build_toc_files": True,  # no page for stray files
        "exclude_patterns": ["_build", "**.ipynb_checkpoints"],
        "execute": {"execute_notebooks": "off", "stderr_output": "show"},  # ran already
        "repository": {"url": URL, "path_to_book": "", "branch": "term2"},
        "launch_buttons": {"notebook_interface": "jupyterlab",
                           "binderhub_url": "https://mybinder.org",
                           "colab_url": "https://colab.research.google.com"},
        "html": {"use_repository_button": True, "use_issues_button": False,
                 "use_edit_page_button": False, "home_page_in_navbar": True,
                 "baseurl": "https://course.example.org/ln/",
                 "favicon": "_assets/favicon.svg"},
        "sphinx": {"recursive_update": True,
                   "local_extensions": {"course_pages": "_ext"},
                   "config": {"html_static_path": ["_assets"],
                              "html_context": {"default_mode": "light"},
                              "mathjax_path": "vendor/mathjax/tex-chtml-full.js",
                              "nb_ipywidgets_js": {"vendor/widgets/embed.js": {}},
                              "html_show_sphinx": False,
                              "html_show_copyright": False,
                              "html_last_updated_fmt": None}},
    }


def test_toc_lists_every_lesson_in_order_with_a_plain_title(course):
    """The table of contents: every lesson, numbered, titles without backquotes
    (Sphinx shows them literally in the side bar)."""
    assert site._toc(course) == {
        "format": "jb-book", "root": "index",
        "chapters": [{"file": "notebooks/01_alpha", "title": "01 · The alpha recipe"},
                     {"file": "notebooks/02_beta", "title": "02 · The beta relatives"},
                     {"file": "notebooks/03_gamma", "title": "03 · PyTorch's LayerNorm"}]}


# -- the widgets on the pages ----------------------------------------------------------

VIEW = "application/vnd.jupyter.widget-view+json"


def _model(name, module="@jupyter-widgets/controls", **state):
    return {"model_module": module, "model_module_version": "2.0.0", "model_name": name,
            "state": {"_model_name": name, **state}}


def _view(model_id):
    return nbformat.v4.new_output("display_data", data={
        VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0},
        "text/plain": f"Widget({model_id})"})


def _executed_with_widgets():
    """A lesson as nbclient leaves it: a cell that prints, then shows an interact
    (slider and output) and a button; a cell with a figure; the widgets' saved state."""
    code = nbformat.v4.new_code_cell
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Lesson 01: The alpha recipe"),
        code("interact(...); display(button)", outputs=[
            nbformat.v4.new_output("stream", text="before the sliders\n"),
            _view("box"), _view("button")]),
        code("plt.plot(x)", outputs=[nbformat.v4.new_output(
            "display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]),
        code("x = 1")])
    notebook.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {
        "version_major": 2, "version_minor": 0, "state": {
            "box": _model("VBoxModel", children=["IPY_MODEL_gamma", "IPY_MODEL_out"]),
            "gamma": _model("FloatSliderModel", value=1.0, disabled=False,
                            layout="IPY_MODEL_layout"),
            "button": _model("ButtonModel", description="draw", disabled=False),
            "choice": _model("DropdownModel", index=0, disabled=False),
            "ticked": _model("CheckboxModel", value=True, disabled=True),
            "out": _model("OutputModel", "@jupyter-widgets/output", outputs=[]),
            "layout": _model("LayoutModel", "@jupyter-widgets/base", width="50%")}}}
    nbformat.validate(notebook)
    return notebook


class _Markup(HTMLParser):
    """The text of an HTML fragment and its links, [(text, href)]."""

    def __init__(self, markup):
        super().__init__()
        self.text, self.links = "", []
        self._in_link = False
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(("", dict(attrs)["href"]))
            self._in_link = True

    def handle_endtag(self, tag):
        self._in_link = self._in_link and tag != "a"

    def handle_data(self, data):
        self.text += data
        if self._in_link:
            self.links[-1] = (self.links[-1][0] + data, self.links[-1][1])


def _saved_state(notebook):
    return notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]


@pytest.mark.parametrize("lesson_path", ["notebooks/01_alpha.ipynb",
                                         # a name that reads as an HTML entity
                                         "notebooks/01_q&amp;a.ipynb"])
def test_widgets_on_a_page_are_disabled_and_announced_with_links_to_run_the_lesson(
        lesson_path):
    """Just above a cell's first widget, a note says the controls are static on the
    page and links to this lesson on the repository's Binder and Colab; every control
    in the saved state (whatever model has `disabled`) is disabled, nothing else in it
    changes; the rest of the lesson, and the notebook given, stay as they were."""
    repo = Repository.parse(URL, branch="term2/week-3")
    executed = _executed_with_widgets()
    before = copy.deepcopy(executed)
    shown = site.with_static_widgets(executed, repo, lesson_path)
    assert executed == before
    nbformat.validate(shown)
    widget_cell = shown.cells[1]
    assert [output.output_type for output in widget_cell.outputs] == [
        "stream", "display_data", "display_data", "display_data"]
    assert widget_cell.outputs[0] == before.cells[1].outputs[0]
    assert widget_cell.outputs[2:] == before.cells[1].outputs[1:]
    note = widget_cell.outputs[1]
    markup = _Markup(note.data["text/html"])
    assert markup.links == [("Binder", repo.binder(lesson_path)),
                            ("Colab", repo.colab(lesson_path))]
    assert "static on this page" in markup.text and "default values" in markup.text
    assert repo.binder(lesson_path) in note.data["text/plain"]
    assert repo.colab(lesson_path) in note.data["text/plain"]
    assert shown.cells[0] == before.cells[0] and shown.cells[2:] == before.cells[2:]
    state, saved = _saved_state(shown), _saved_state(before)
    assert state.keys() == saved.keys()
    for model_id, model in state.items():
        expected = copy.deepcopy(saved[model_id])
        if "disabled" in expected["state"]:
            expected["state"]["disabled"] = True
        assert model == expected, model_id
    assert sorted(i for i, m in state.items() if m["state"].get("disabled") is True) == [
        "button", "choice", "gamma", "ticked"]


def test_the_note_stands_only_above_widgets_that_hold_a_control():
    """A cell whose widgets have nothing to move (an Output, an HTML text) gets no
    note; a cell that shows an Output first and its sliders after gets the note just
    above the sliders; a slider an Output widget displays counts as that Output's."""
    executed = _executed_with_widgets()
    state = _saved_state(executed)
    state.update({
        "text": _model("HTMLModel", value="<b>gamma</b>", layout="IPY_MODEL_layout"),
        "plot": _model("OutputModel", "@jupyter-widgets/output", outputs=[
            nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]),
        "panel": _model("OutputModel", "@jupyter-widgets/output",
                        outputs=[_view("choice")]),
        "sliders": _model("HBoxModel", children=["IPY_MODEL_text", "IPY_MODEL_gamma"])})
    code = nbformat.v4.new_code_cell
    executed.cells = [
        code("display(text, plot)", outputs=[_view("text"), _view("plot")]),
        code("display(plot, sliders)", outputs=[_view("plot"), _view("sliders")]),
        code("display(panel)", outputs=[_view("panel")]),
        code("display(missing)", outputs=[_view("not-saved")])]
    shown = site.with_static_widgets(executed, REPO_, "notebooks/01_alpha.ipynb")
    nbformat.validate(shown)

    def noted(cell):
        return ["note" if "course-static-widgets" in o.data.get("text/html", "")
                else o.data[VIEW]["model_id"] for o in cell.outputs]

    assert [noted(cell) for cell in shown.cells] == [
        ["text", "plot"], ["plot", "note", "sliders"], ["note", "panel"], ["not-saved"]]
    assert _saved_state(shown)["text"] == state["text"], "an HTML text is no control"


def test_a_lesson_without_widgets_is_shown_as_it_ran():
    """No widget shown, no widget state: no note and nothing changed."""
    executed = _executed_with_widgets()
    executed.cells[1].outputs = executed.cells[1].outputs[:1]
    del executed.metadata["widgets"]
    assert site.with_static_widgets(executed, REPO_, "notebooks/01_alpha.ipynb") == executed


class FakeClient:
    """Stands in for nbclient: each execute() takes the next outcome of `plan`."""

    plan = []
    made = []

    def __init__(self, notebook, **kwargs):
        self.notebook, self.kwargs = notebook, kwargs
        FakeClient.made.append(self)

    def execute(self):
        workdir = Path(self.kwargs["resources"]["metadata"]["path"])
        assert workdir.is_dir() and workdir.name.startswith("lesson-")
        outcome = FakeClient.plan.pop(0)
        if outcome is not None:
            raise outcome
        self.notebook.cells[0].outputs = [nbformat.v4.new_output("stream", text="ran")]


@pytest.fixture
def fake_client(monkeypatch):
    FakeClient.plan, FakeClient.made = [], []
    monkeypatch.setattr(site, "NotebookClient", FakeClient)
    clock = iter(float(t) for t in range(100, 10_000, 7))
    monkeypatch.setattr(site, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    return FakeClient


def _lesson(tmp_path):
    path = tmp_path / "01_alpha.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    return path


def test_a_lesson_runs_once_with_widget_state_and_is_written_with_its_outputs(
        tmp_path, fake_client):
    """A lesson runs in a fresh python3 kernel on Unix sockets (no TCP port to race
    another process for), in a scratch folder, with the cell timeout and its widgets'
    state kept; the notebook written holds its outputs."""
    fake_client.plan = [None]
    out = tmp_path / "out.ipynb"
    log = io.StringIO()
    site.execute_lesson(_lesson(tmp_path), out, log)
    (client,) = fake_client.made
    assert {k: v for k, v in client.kwargs.items() if k not in ("resources", "km")} == {
        "timeout": 120, "store_widget_state": True}
    km = client.kwargs["km"]
    assert (km.kernel_name, km.transport) == ("python3", "ipc") and not km.has_kernel
    assert nbformat.read(out, as_version=4).cells[0].outputs[0]["text"] == "ran"
    assert log.getvalue() == "01_alpha.ipynb: ran in 7 s\n"


def test_a_kernel_that_stops_answering_is_retried_up_to_three_times(tmp_path, fake_client):
    """Two timeouts then a run: the lesson is written, each timeout logged with its run
    number; three timeouts: a SiteError, and no fourth run."""
    fake_client.plan = [CellTimeoutError("cell 3"), CellTimeoutError("cell 4"), None]
    out = tmp_path / "out.ipynb"
    log = io.StringIO()
    site.execute_lesson(_lesson(tmp_path), out, log)
    assert out.is_file() and len(fake_client.made) == 3
    assert log.getvalue().splitlines()[:2] == [
        "01_alpha.ipynb: no answer from the kernel (cell 3); run 1 of 3",
        "01_alpha.ipynb: no answer from the kernel (cell 4); run 2 of 3"]
    fake_client.made.clear()
    fake_client.plan = [CellTimeoutError("t")] * 3 + [None]
    with pytest.raises(site.SiteError) as error:
        site.execute_lesson(_lesson(tmp_path), tmp_path / "never.ipynb", io.StringIO())
    assert str(error.value) == "01_alpha.ipynb: the kernel stopped answering 3 times"
    assert len(fake_client.made) == 3 and not (tmp_path / "never.ipynb").exists()


def test_a_failing_cell_stops_the_site_with_the_end_of_its_error(tmp_path, fake_client):
    """A cell that raises is a SiteError at once (no retry), with the last 3000
    characters of the error."""
    fake_client.plan = [CellExecutionError("A" * 1000 + "B" * 3000, "ValueError", "bad")]
    with pytest.raises(site.SiteError) as error:
        site.execute_lesson(_lesson(tmp_path), tmp_path / "out.ipynb", io.StringIO())
    message = str(error.value)
    assert message.startswith("01_alpha.ipynb failed:\n") and "A" not in message[20:]
    assert message.count("B") >= 3000 - 100 and len(message) == len(
        "01_alpha.ipynb failed:\n") + 3000
    assert len(fake_client.made) == 1


def _fake_execute(calls):
    def execute(path, out, log):
        calls.append((path.name, out, log))
        out.write_bytes(path.read_bytes())
        print(f"{path.name}: ran", file=log)
    return execute


def test_stage_writes_the_books_sources(course, tmp_path, monkeypatch):
    """Every lesson run into notebooks/, the assets (npm fetching what its cache lacks,
    in the same log), our script, favicon and Sphinx extension, and the configuration,
    table of contents and first page."""
    calls = []
    monkeypatch.setattr(site, "execute_lesson", _fake_execute(calls))
    cache = npm_cache(tmp_path / "npm")
    (cache / "mathjax-3.2.2.tgz").rename(tmp_path / "mathjax.tgz")

    def npm(command, **kwargs):
        (tmp_path / "mathjax.tgz").rename(Path(command[4]) / "mathjax-3.2.2.tgz")
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(site.shutil, "which", lambda name: "/opt/bin/npm")
    monkeypatch.setattr(site.subprocess, "run", npm)
    book = tmp_path / "scratch" / "book"
    log = io.StringIO()
    site.stage(course=course, repo=REPO_, folder=book, asset_cache=cache, log=log)
    assert log.getvalue() == ("01_alpha.ipynb: ran\n02_beta.ipynb: ran\n03_gamma.ipynb: ran\n"
                              "npm pack mathjax@3.2.2\n")
    assert calls == [(name, book / "notebooks" / name, log)
                     for name in ("01_alpha.ipynb", "02_beta.ipynb", "03_gamma.ipynb")]
    assert (book / "notebooks" / "02_beta.ipynb").read_bytes() == \
        (course.root / "notebooks" / "02_beta.ipynb").read_bytes()
    assert (book / "_assets" / "vendor" / "mathjax" / "tex-chtml-full.js").is_file()
    assert (book / "_assets" / "course.js").read_text() == site.COURSE_JS
    assert (book / "_assets" / "course.css").read_text() == site.COURSE_CSS
    assert (book / "_assets" / "favicon.svg").read_text() == site.FAVICON_SVG
    assert (book / "_ext" / "course_pages.py").read_text() == site.PAGES_EXTENSION
    config_text = (book / "_config.yml").read_text()
    assert config_text.startswith("title: ")  # the order written, not sorted
    folders = {"mathjax": book / "_assets" / "vendor" / "mathjax",
               "@jupyter-widgets/html-manager": book / "_assets" / "vendor" / "widgets"}
    assert yaml.safe_load(config_text) == site._book_config(REPO_, folders)
    toc_text = (book / "_toc.yml").read_text()
    assert toc_text.startswith("format: jb-book")
    assert yaml.safe_load(toc_text) == site._toc(course)
    assert (book / "index.md").read_text() == site._index_page(course, REPO_)


def test_an_unchanged_lesson_reuses_its_last_run_and_a_changed_one_runs_again(
        course, tmp_path, monkeypatch):
    """A second build runs no lesson that is unchanged, with the same packages, since a
    kept run, and writes that run; an edited lesson, or a newer numpy, runs again and
    its older kept run goes; runs=None runs every lesson."""
    calls = []
    monkeypatch.setattr(site, "execute_lesson", _fake_execute(calls))
    runs = tmp_path / "runs"
    alpha = units(course)[0]

    def build(**kwargs):
        log = io.StringIO()
        out = tmp_path / "out.ipynb"
        site.run_lesson(alpha, out, log=log, **kwargs)
        return log.getvalue(), out.read_bytes()

    first_log, first = build(runs=runs)
    assert first_log == "01_alpha.ipynb: ran\n" and len(calls) == 1
    second_log, second = build(runs=runs)
    assert second == first and len(calls) == 1
    assert second_log == "01_alpha.ipynb: unchanged since its last run, which is reused\n"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")]),
                   alpha.lesson)
    edited_log, edited = build(runs=runs)
    assert edited_log == "01_alpha.ipynb: ran\n" and edited == alpha.lesson.read_bytes()
    assert len(list(runs.iterdir())) == 1, "the run of the old text is not kept"
    real_version = site.metadata.version
    monkeypatch.setattr(site.metadata, "version", lambda package: "9.9" if package == "numpy"
                        else real_version(package))
    assert build(runs=runs)[0] == "01_alpha.ipynb: ran\n"
    assert build(runs=None)[0] == "01_alpha.ipynb: ran\n" and len(calls) == 4


def test_a_lesson_reads_the_lessons_data_folder_by_its_relative_path(tmp_path):
    """A lesson opens data/... as it would beside the lessons in the course, the
    edition or Binder: the site's run (a real kernel, in a scratch folder) finds it."""
    lessons = tmp_path / "notebooks"
    (lessons / LESSON_DATA).mkdir(parents=True)
    (lessons / LESSON_DATA / "numbers.csv").write_text("1,2,3\n")
    path = lessons / "01_alpha.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'print(open("data/numbers.csv").read().strip())')]), path)
    out = tmp_path / "out.ipynb"
    site.execute_lesson(path, out, io.StringIO())
    assert nbformat.read(out, as_version=4).cells[0].outputs[0]["text"] == "1,2,3\n"


def test_a_lesson_runs_again_when_the_data_it_reads_changes(course, tmp_path, monkeypatch):
    """A kept run is reused only while the lessons' data files are the same too."""
    calls = []
    monkeypatch.setattr(site, "execute_lesson", _fake_execute(calls))
    runs, alpha = tmp_path / "runs", units(course)[0]
    data = alpha.lesson.parent / LESSON_DATA
    data.mkdir()
    (data / "table.csv").write_text("1\n")
    for _ in range(2):
        site.run_lesson(alpha, tmp_path / "out.ipynb", runs=runs, log=io.StringIO())
    assert len(calls) == 1
    (data / "table.csv").write_text("2\n")
    site.run_lesson(alpha, tmp_path / "out.ipynb", runs=runs, log=io.StringIO())
    assert len(calls) == 2


def test_stage_shows_each_lessons_widgets_as_static_with_links_to_that_lesson(
        course, tmp_path, monkeypatch, no_npm):
    """Each lesson, once run, goes into the book with its controls disabled and its
    note linking to that lesson, not another, on Binder and Colab."""
    def execute(path, out, log):
        nbformat.write(_executed_with_widgets(), out)

    monkeypatch.setattr(site, "execute_lesson", execute)
    book = tmp_path / "book"
    site.stage(course=course, repo=REPO_, folder=book, asset_cache=npm_cache(tmp_path / "npm"),
               log=io.StringIO())
    for unit in units(course):
        staged = nbformat.read(book / "notebooks" / unit.lesson.name, as_version=4)
        note = staged.cells[1].outputs[1]
        assert _Markup(note.data["text/html"]).links == [
            ("Binder", f"{BINDER}?urlpath=lab/tree/notebooks/{unit.lesson.name}"),
            ("Colab", f"{COLAB}notebooks/{unit.lesson.name}")]
        assert _saved_state(staged)["gamma"]["state"]["disabled"] is True


def test_stage_ends_each_lesson_on_its_assignment_with_links_to_open_it(
        course, tmp_path, monkeypatch, no_npm):
    """A reader of a lesson's page finds the unit's assignment at its end, by its title,
    with links to open that assignment (not the lesson, not another unit's) on Binder
    and Colab; a unit without an assignment gets nothing added, and the lessons
    themselves are left as they are."""
    release = course.release / "01_alpha" / "01_alpha.ipynb"
    titled = nbformat.read(release, as_version=4)
    titled.cells.insert(0, nbformat.v4.new_markdown_cell("# Assignment 01: the alpha batch"))
    nbformat.write(titled, release)
    lessons = {unit.slug: unit.lesson.read_bytes() for unit in units(course)}
    monkeypatch.setattr(site, "execute_lesson",
                        lambda path, out, log: nbformat.write(_executed_with_widgets(), out))
    book = tmp_path / "book"
    site.stage(course=course, repo=REPO_, folder=book, asset_cache=npm_cache(tmp_path / "npm"),
               log=io.StringIO())
    assert {unit.slug: unit.lesson.read_bytes() for unit in units(course)} == lessons
    ran = len(_executed_with_widgets().cells)
    for unit in units(course):
        staged = nbformat.read(book / "notebooks" / unit.lesson.name, as_version=4)
        nbformat.validate(staged)
        if unit.assignment is None:
            assert len(staged.cells) == ran, unit.slug
            continue
        assert len(staged.cells) == ran + 1
        last = staged.cells[-1]
        assert last.cell_type == "markdown"
        assert "Assignment 01: The alpha batch" in last.source
        assert re.findall(r"\[(\w+)\]\(([^)]+)\)", last.source) == [
            ("Binder", f"{BINDER}?urlpath=lab/tree/assignments/01_alpha/01_alpha.ipynb"),
            ("Colab", f"{COLAB}assignments/01_alpha/01_alpha.ipynb")]


def test_stage_refuses_a_course_without_lessons(tmp_path):
    """No lessons: a SiteError naming where they were looked for."""
    from autograder.course import Course

    empty = Course(tmp_path)
    with pytest.raises(site.SiteError) as error:
        site.stage(course=empty, repo=REPO_, folder=tmp_path / "book",
                   asset_cache=tmp_path / "npm")
    assert str(error.value) == f"no lessons in {tmp_path / 'notebooks'}"


class FakeBook:
    """Stands in for the jupyter-book process: records the call, writes its HTML."""

    def __init__(self, returncode=0, stdout="", stderr="", report=None):
        self.returncode, self.stdout, self.stderr, self.report = (returncode, stdout, stderr,
                                                                  report)
        self.calls = []

    def __call__(self, command, **kwargs):
        self.calls.append((command, kwargs))
        html = Path(command[4]) / "_build" / "html"
        for name, text in {"index.html": "<p>index</p>",
                           "notebooks/01_alpha.html": "<p>one</p>",
                           "_static/app.js": "js", "_static/app.js.map": "map",
                           "_static/locales/de/LC_MESSAGES/sphinx.mo": "mo",
                           "_static/locales/de/LC_MESSAGES/sphinx.js": "js",
                           "_static/translations/fr/LC_MESSAGES/booktheme.mo": "mo",
                           "reports/a.log": "log"}.items():
            (html / name).parent.mkdir(parents=True, exist_ok=True)
            (html / name).write_text(text)
        if self.report is not None:
            (html / "reports" / "01_alpha.err.log").write_text(self.report)
            (html / "reports" / "sub").mkdir()
            (html / "reports" / "sub" / "02_beta.err.log").write_text("SECOND")
        return SimpleNamespace(returncode=self.returncode, stdout=self.stdout,
                               stderr=self.stderr)


@pytest.fixture
def quick_stage(monkeypatch, course, tmp_path):
    monkeypatch.setattr(site, "execute_lesson", _fake_execute([]))
    monkeypatch.setattr(site.shutil, "which", lambda name: None)
    npm_cache(course.root / "build" / "npm")  # the default asset cache
    clock = iter(float(t) for t in range(100, 10_000, 12))
    monkeypatch.setattr(site, "time", SimpleNamespace(monotonic=lambda: next(clock)))


def test_build_site_runs_jupyter_book_and_keeps_only_what_browsers_read(
        course, tmp_path, monkeypatch, quick_stage):
    """The book is built strictly (warnings are errors) with this interpreter's tools
    first on PATH; the site written drops reports, source maps and message catalogues,
    gets .nojekyll and site.json (what it was built from), and replaces an old site;
    the output folder's missing parents are made. Message catalogues go wherever they
    are (a theme may keep them outside _static/locales/)."""
    book = FakeBook()
    monkeypatch.setattr(site.subprocess, "run", book)
    out = tmp_path / "new" / "term1" / "site"
    log = io.StringIO()
    assert site.build_site(course=course, repo=REPO_, out=out, log=log) == 12.0
    ((command, kwargs),) = book.calls
    folder = command[4]
    assert command == [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                       "build", folder, "--path-output", folder, "--builder", "html",
                       "--all", "--warningiserror", "--keep-going"]
    assert kwargs["cwd"] == Path(folder) and kwargs["timeout"] == 1800
    assert kwargs["capture_output"] is True and kwargs["text"] is True
    env = kwargs["env"]
    bin_dir = str(Path(sys.executable).parent)
    assert env["PATH"] == os.pathsep.join(
        [bin_dir, *(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir)])
    assert env["PYDEVD_DISABLE_FILE_VALIDATION"] == "1" and env["HOME"] == os.environ["HOME"]
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [".nojekyll", "_static/app.js", "index.html", "notebooks/01_alpha.html",
                     "site.json"]
    assert (out / ".nojekyll").read_text() == ""
    info_text = (out / "site.json").read_text()
    assert json.loads(info_text) == {"repo_url": URL, "branch": "main",
                                     "site_url": "https://example-course.github.io/"
                                                 "layernorm-student/",
                                     "lessons": site.lessons_digest(course)}
    assert info_text.startswith('{\n "repo_url"') and info_text.endswith("}\n")
    assert log.getvalue() == ("building the site: every changed lesson runs (up to a minute "
                              "each)\n"
                              "01_alpha.ipynb: ran\n02_beta.ipynb: ran\n03_gamma.ipynb: ran\n"
                              f"site written to {out.resolve()} in 12 s\n")
    assert site.check_site(course=course, repo=REPO_, site=out) == []
    # A second build replaces the first: a file only the old site had is gone. This
    # book has no reports or locales, and there is no PATH.
    (out / "stale.html").write_text("old")

    def bare_book(command, **kwargs):
        done = book(command, **kwargs)
        import shutil
        html = Path(command[4]) / "_build" / "html"
        shutil.rmtree(html / "reports")
        shutil.rmtree(html / "_static" / "locales")
        return done

    monkeypatch.setattr(site.subprocess, "run", bare_book)
    monkeypatch.delenv("PATH")
    site.build_site(course=course, repo=REPO_, out=str(out), asset_cache=course.root / "build"
                    / "npm", log=io.StringIO())
    assert not (out / "stale.html").exists() and (out / "index.html").is_file()
    assert book.calls[-1][1]["env"]["PATH"] == \
        f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}"


def test_a_failed_book_build_reports_its_output_and_logs(course, tmp_path, monkeypatch,
                                                         quick_stage):
    """jupyter-book failing: a SiteError with the end of its output and of each error
    report, and no site written."""
    book = FakeBook(returncode=1, stdout="o" * 1000 + "OUT" + "p" * 3997,
                    stderr="e" * 1000 + "ERR" + "f" * 3997, report="r" * 500 + "REPORT" +
                    "s" * 2994)
    monkeypatch.setattr(site.subprocess, "run", book)
    out = tmp_path / "site"
    with pytest.raises(site.SiteError) as error:
        site.build_site(course=course, repo=REPO_, out=out, log=io.StringIO())
    message = str(error.value)
    assert message.startswith("jupyter-book build failed:\nOUT" + "p" * 3997 + "ERR")
    assert message.endswith("f" * 3997 + "\nREPORT" + "s" * 2994 + "\nSECOND")
    assert "o" not in message.split("\n", 1)[1][:5] and not out.exists()
    book = FakeBook(returncode=2, stdout="x", stderr="y")

    def no_reports(command, **kwargs):
        done = book(command, **kwargs)
        import shutil
        shutil.rmtree(Path(command[4]) / "_build" / "html" / "reports")
        return done

    monkeypatch.setattr(site.subprocess, "run", no_reports)
    with pytest.raises(site.SiteError) as error:
        site.build_site(course=course, repo=REPO_, out=out, log=io.StringIO())
    assert str(error.value) == "jupyter-book build failed:\nxy\n"


def test_check_site_names_every_mismatch(course, tmp_path):
    """A folder that is no site, a site built for another repository, branch or address,
    or from older lessons: each a problem of its own."""
    folder = tmp_path / "site"
    folder.mkdir()
    assert site.check_site(course=course, repo=REPO_, site=folder) == [
        f"{folder} is not a built site (no site.json): make site"]
    other = Repository.parse("https://github.com/someone/else", branch="dev")
    info = {**other.as_dict(), "lessons": {"01_alpha.ipynb": "old"}}
    (folder / "site.json").write_text(json.dumps(info))
    assert site.check_site(course=course, repo=REPO_, site=str(folder)) == [
        "the site was built for repo_url 'https://github.com/someone/else', not "
        f"{URL!r}: make site",
        "the site was built for branch 'dev', not 'main': make site",
        "the site was built for site_url 'https://someone.github.io/else/', not "
        "'https://example-course.github.io/layernorm-student/': make site",
        "the lessons changed since the site was built: make site"]
    info = {**REPO_.as_dict(), "lessons": site.lessons_digest(course)}
    (folder / "site.json").write_text(json.dumps(info))
    assert site.check_site(course=course, repo=REPO_, site=folder) == []


def test_main_passes_its_options_to_build_site(course, tmp_path, monkeypatch, capsys):
    """`python -m autograder.publishing.site`: the repository, branch, address and output folder
    reach build_site (default out: build/site in the course; kept runs reused unless
    --rerun); a bad address exits 1."""
    calls = []
    monkeypatch.setattr(site, "build_site", lambda **kwargs: calls.append(kwargs))
    assert site.main(["--repo-url", URL, "--course", str(course.root)]) == 0
    assert calls == [{"course": course, "repo": REPO_,
                      "out": course.root / "build" / "site", "runs": site.DEFAULT_RUNS}]
    calls.clear()
    assert site.main(["--repo-url", URL, "--course", str(course.root), "--branch", "term2",
                      "--site-url", "https://course.example.org/", "--out", "elsewhere",
                      "--rerun"]) == 0
    assert calls == [{"course": course, "out": "elsewhere", "runs": None,
                      "repo": Repository.parse(URL, branch="term2",
                                               site_url="https://course.example.org/")}]
    assert site.main(["--repo-url", "https://gitlab.com/a/b", "--course",
                      str(course.root)]) == 1
    assert capsys.readouterr().err.startswith("error: --repo-url must be")

    def failing(**_):
        raise site.SiteError("npm is missing")

    monkeypatch.setattr(site, "build_site", failing)
    assert site.main(["--repo-url", URL, "--course", str(course.root)]) == 1
    assert capsys.readouterr().err == "error: npm is missing\n"
    with pytest.raises(SystemExit):
        site.main(["--course", str(course.root)])  # --repo-url is required
    assert "--repo-url" in capsys.readouterr().err


def test_main_help_reads_as_documented(capsys):
    """`python -m autograder.publishing.site --help`: the module's first paragraph and each
    option's help, word for word (--repo-url required, the rest defaulted)."""
    with pytest.raises(SystemExit):
        site.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m autograder.publishing.site [-h] --repo-url REPO_URL")
    words = " ".join(text.split())
    assert ("The course's site (make site): every lesson executed and rendered as a static "
            "HTML book that students can read without running anything.") in words
    assert "Each lesson runs top to bottom" not in words
    for option, help_text in (
            ("--repo-url REPO_URL", "the student edition's public GitHub repository"),
            ("--branch BRANCH", "its branch (default main)"),
            ("--site-url SITE_URL", "where the site will be served (default: the "
                                    "repository's GitHub Pages address)"),
            ("--out OUT", f"output folder (default {site.DEFAULT_OUT})"),
            ("--course COURSE", "course directory (default: here)")):
        assert f"{option} {help_text} " in words + " ", option
