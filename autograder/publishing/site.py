"""The course's site (make site): every lesson executed and rendered as a static HTML
book that students can read without running anything.

Each lesson runs top to bottom in a fresh kernel (nbclient, which also saves the
widgets' state); Jupyter Book (1.x, Sphinx with MyST-NB) renders the results:
figures, printed tables, and every widget in the state the lesson leaves it in,
drawn by the ipywidgets HTML manager (the sliders sit at their defaults, the figure
they drive is the one drawn for those values). No kernel answers a widget there, so
its controls are disabled and a note above each cell's controls says so, with links
to run that lesson on Binder and Colab (the lessons themselves are left as they are).
Each page links to its notebook on Binder and Colab (the book's launch buttons), ends
on its unit's assignment (links to open it on Binder and Colab), and links to the
previous and the next unit, and to the whole table of contents.

The pages load nothing from other sites: MathJax and the widget manager come from the
npm registry at build time (pinned below, kept in npm's own cache) and are served
from the site's _static/ folder. The result is plain files: any static web server,
GitHub Pages included, serves it as it is.

    python -m autograder.publishing.site --repo-url https://github.com/OWNER/NAME [--out build/site]
"""

import argparse
import copy
import fnmatch
import hashlib
import html
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

import nbformat
import yaml
from jupyter_client import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError

from autograder.course import Course, path_with_tools
from autograder.publishing.edition import (
    COLAB,
    LESSON_DATA,
    LESSONS_DIR,
    Repository,
    notebook_title,
    units,
)

# The browser-side code the pages load, from the npm registry. Only these files of
# each package are served (with the packages' licence files).
NPM_ASSETS = {
    "mathjax": ("3.2.2", "mathjax", ["es5/tex-chtml-full.js", "es5/output/chtml/fonts/woff-v2/",
                                     "LICENSE"]),
    "@jupyter-widgets/html-manager": ("1.0.15", "widgets", [
        "dist/embed.js", "dist/embed.js.LICENSE.txt", "dist/*.woff2", "dist/*.woff"]),
}
SITE_INFO = "site.json"  # in the built site: what it was built from
DEFAULT_OUT = Path("build") / "site"
DEFAULT_RUNS = Path("build") / "lesson-runs"  # each lesson's last run, reused while unchanged
# A lesson's outputs depend on these besides its own text.
LESSON_PACKAGES = ("numpy", "torch", "triton", "matplotlib", "ipywidgets", "ipykernel",
                   "nbclient", "nbformat")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
# Seconds per cell. A whole lesson runs in 5 to 30 s here; a kernel that stops
# answering (it happens, rarely, and then for minutes) is stopped and the lesson
# run again, up to RUNS times in all.
CELL_TIMEOUT = 120
RUNS = 3


class SiteError(RuntimeError):
    """The site could not be built."""


def lessons_digest(course):
    """{lesson file name: sha256 of its bytes}, to tell whether a built site is current."""
    return {unit.lesson.name: hashlib.sha256(unit.lesson.read_bytes()).hexdigest()
            for unit in units(course)}


# -- the browser-side assets -------------------------------------------------------------

def _npm_pack(package, version, cache, log):
    """The package's tarball, from npm (`npm pack` checks it against the registry's
    integrity hash; npm's cache makes a second build local)."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = package.lstrip("@").replace("/", "-")
    tarball = cache / f"{stem}-{version}.tgz"
    if tarball.is_file():
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        raise SiteError("the site needs npm (Debian: apt-get install npm) to fetch "
                        f"{package}@{version}")
    print(f"npm pack {package}@{version}", file=log)
    done = subprocess.run([npm, "pack", "--silent", "--pack-destination", str(cache),
                           f"{package}@{version}"], capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0 or not tarball.is_file():
        raise SiteError(f"npm pack {package}@{version} failed:\n{done.stdout}{done.stderr}")
    return tarball


def _wanted(member, patterns):
    name = member.name.removeprefix("package/")
    return any(name.startswith(pattern) if pattern.endswith("/")
               else fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def install_assets(static, cache, log=sys.stderr):
    """Unpack the pinned npm files into `static`/vendor/ (served from _static/vendor/);
    returns {package: folder}."""
    folders = {}
    for package, (version, folder, patterns) in NPM_ASSETS.items():
        target = static / "vendor" / folder
        with tarfile.open(_npm_pack(package, version, cache, log)) as archive:
            for member in archive.getmembers():
                if not member.isfile() or not _wanted(member, patterns):
                    continue
                name = member.name.removeprefix("package/")
                for prefix in ("es5/", "dist/"):
                    name = name.removeprefix(prefix)
                destination = target / name
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(archive.extractfile(member).read())
        folders[package] = target
    return folders


# Our own script, after MathJax: the widget manager typesets with MathJax 2's call
# (MathJax.Hub.Queue), which MathJax 3 answers with typesetPromise.
COURSE_JS = """// The widget manager asks MathJax 2 to typeset what it draws; this site loads
// MathJax 3, which does the same with typesetPromise.
if (window.MathJax && !window.MathJax.Hub) {
  window.MathJax.Hub = {
    Queue: function (job) {
      var node = Array.isArray(job) ? job[2] : null;
      if (node && window.MathJax.typesetPromise) {
        window.MathJax.typesetPromise([node]).catch(function () {});
      }
    },
  };
}
"""

COURSE_CSS = """/* The note above a lesson's widgets: present, not in the way of the lesson. */
.course-static-widgets {
  margin: 0.25rem 0;
  padding: 0.3rem 0.75rem;
  border-left: 3px solid var(--pst-color-info, #459db9);
  background: var(--pst-color-surface, #f3f4f5);
  font-size: 0.85em;
}
"""

FAVICON_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">
<rect width="32" height="32" rx="6" fill="#2b5b84"/>
<text x="16" y="22" font-family="sans-serif" font-size="15" font-weight="bold"
 fill="#ffffff" text-anchor="middle">LN</text>
</svg>
"""

# A Sphinx extension of the book: our script and style sheet; no Thebe (the pages
# link to Binder and Colab instead; its settings script, added twice, stops the
# page's scripts); each script or style sheet once.
PAGES_EXTENSION = '''"""The course site's own adjustments to each page's scripts and styles."""


def _name(item):
    return getattr(item, "filename", None) or str(item)


def _body(item):
    return (getattr(item, "attributes", None) or {}).get("body", "")


def _wanted(item):
    return "thebe" not in (_name(item) or "") and "THEBE_JS_URL" not in _body(item)


def tidy(app, pagename, templatename, context, doctree):
    for key in ("script_files", "css_files"):
        if key in context:
            seen, kept = set(), []
            for item in context[key]:
                identity = (_name(item), _body(item))
                if _wanted(item) and identity not in seen:
                    seen.add(identity)
                    kept.append(item)
            context[key] = kept


def setup(app):
    # After MathJax (priority 500), before the widget manager draws (on load).
    app.add_js_file("course.js", defer="defer", priority=600)
    app.add_css_file("course.css")
    app.connect("html-page-context", tidy, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
'''


# -- the book ------------------------------------------------------------------------

def _index_page(course, repo):
    """The site's first page: the course in a paragraph and a table of the units."""
    rows = []
    for unit in units(course):
        lesson = f"[{unit.title}]({unit.lesson_path})"
        links = (f"[Binder]({repo.binder(unit.lesson_path)}) · "
                 f"[Colab]({repo.colab(unit.lesson_path)})")
        if unit.assignment_path:
            task = (f"[Binder]({repo.binder(unit.assignment_path)}) · "
                    f"[Colab]({repo.colab(unit.assignment_path)})")
        else:
            task = "none"
        rows.append(f"| {unit.number} | {lesson} | {links} | {task} |")
    table = "\n".join(rows)
    return f"""# Layer Normalization, from the recipe to the fused kernel

A course in {len(rows)} units for readers who know a little numpy and PyTorch and want to
understand layer norm all the way down: the mean-and-variance recipe, its relatives
and its gradient, its place in a transformer block, its behaviour in low precision,
and a fused GPU kernel written in Triton.

Each unit has a **lesson** (explanations, worked examples, sliders and questions to
check yourself) and an **assignment** you complete in the notebook. The pages of this
site are the lessons as they look after running from top to bottom, so you can read
them anywhere. To run a lesson, move its sliders or work on an assignment, open it on
Binder or Colab (the rocket button at the top of each page does the same), or on your
own machine from the [course repository]({repo.url}).

| unit | lesson (read here) | run the lesson | assignment |
| --- | --- | --- | --- |
{table}

The sliders on these pages show their starting values and the figures drawn for
them; they move only in a running notebook.

## How to work

1. Read a lesson here, or run it: on Binder everything is installed; on Colab, run
   the first code cell (under the title) before the others (it prepares Colab and
   does nothing anywhere else). Unit 07 compiles its kernels on a GPU: on Colab choose
   *Runtime > Change runtime type > GPU*; without a GPU it runs them in Triton's
   interpreter on the CPU.
2. Open the unit's assignment. Replace each `raise NotImplementedError()` with your
   code and run the tests under each exercise. In JupyterLab, the **Validate**
   button in the notebook's toolbar runs the whole notebook as the grader will.
3. Hand in the assignment's one `.ipynb` file, with its name unchanged, where your
   course collects work. More tests run when it is graded. Binder sessions are
   temporary: download your notebook before you close the tab.
"""


def _book_config(repo, static_folders):
    mathjax = static_folders["mathjax"].name
    widgets = static_folders["@jupyter-widgets/html-manager"].name
    return {
        "title": "Layer Normalization, from the recipe to the fused kernel",
        "author": "",  # no "By ..." line in the footer
        "copyright": "",
        "only_build_toc_files": True,
        "exclude_patterns": ["_build", "**.ipynb_checkpoints"],
        "execute": {"execute_notebooks": "off", "stderr_output": "show"},
        "repository": {"url": repo.url, "path_to_book": "", "branch": repo.branch},
        "launch_buttons": {"notebook_interface": "jupyterlab",
                           "binderhub_url": "https://mybinder.org", "colab_url": COLAB},
        "html": {"use_repository_button": True, "use_issues_button": False,
                 "use_edit_page_button": False, "home_page_in_navbar": True,
                 "baseurl": repo.site_url, "favicon": "_assets/favicon.svg"},
        "sphinx": {"recursive_update": True,
                   "local_extensions": {"course_pages": "_ext"},
                   "config": {
            # Not _static/: Jupyter Book would add every script there to every page.
            "html_static_path": ["_assets"],
            "html_context": {"default_mode": "light"},  # the theme reads it here
            "mathjax_path": f"vendor/{mathjax}/tex-chtml-full.js",
            "nb_ipywidgets_js": {f"vendor/{widgets}/embed.js": {}},
            "html_show_sphinx": False,
            "html_show_copyright": False,
            "html_last_updated_fmt": None,
        }},
    }


def _toc(course):
    return {"format": "jb-book", "root": "index",
            "chapters": [{"file": f"{LESSONS_DIR}/{unit.lesson.stem}",
                          "title": f"{unit.number} · {unit.title.replace('`', '')}"}
                         for unit in units(course)]}


def _static_widgets_note(binder, colab):
    text = ("The controls below are static on this page: they show the lesson's default "
            "values. Moving them needs a running notebook: open this lesson on {binder} "
            "or {colab}.")
    return nbformat.v4.new_output("display_data", data={
        "text/html": '<div class="course-static-widgets" role="note">' + text.format(
            binder=f'<a href="{html.escape(binder)}">Binder</a>',
            colab=f'<a href="{html.escape(colab)}">Colab</a>') + "</div>",
        "text/plain": text.format(binder=f"Binder ({binder})", colab=f"Colab ({colab})")})


def _held_models(model_id, saved):
    """The ids of the saved models a widget view draws: its own and, through the
    references in their states (children, layout, an Output's own widget views),
    every model it holds."""
    held, waiting = set(), [model_id]
    while waiting:
        current = waiting.pop()
        if current in held or current not in saved:
            continue
        held.add(current)
        waiting += _referenced(saved[current]["state"])
    return held


def _referenced(value):
    """The model ids a saved widget state refers to."""
    if isinstance(value, str):
        return [value.removeprefix("IPY_MODEL_")] if value.startswith("IPY_MODEL_") else []
    if isinstance(value, list):
        return [model for item in value for model in _referenced(item)]
    if isinstance(value, dict):
        view = value.get("model_id")
        return ([view] if isinstance(view, str) else []) + [
            model for item in value.values() for model in _referenced(item)]
    return []


def with_static_widgets(notebook, repo, lesson_path):
    """The executed lesson as its page shows it. A page keeps the widgets' saved
    state but no kernel, so a control moved there would change nothing it drives:
    every control in the state (a model with a `disabled` trait) is disabled, and
    above the first of a cell's widgets that holds a control a note says so and links
    to the lesson (`lesson_path` in the edition) on Binder and Colab; widgets with
    nothing to move (an Output, an HTML text) get no note. A lesson without widgets
    comes back equal to `notebook`, which is left as it is."""
    shown = copy.deepcopy(notebook)
    saved = shown.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    controls = {model_id for model_id, model in saved.items()
                if "disabled" in model["state"]}
    for cell in shown.cells:
        with_controls = [
            index for index, output in enumerate(cell.get("outputs", []))
            if WIDGET_VIEW in output.get("data", {}) and controls & _held_models(
                output.data[WIDGET_VIEW].get("model_id"), saved)]
        if with_controls:
            cell.outputs.insert(with_controls[0], _static_widgets_note(
                repo.binder(lesson_path), repo.colab(lesson_path)))
    for model_id in controls:
        saved[model_id]["state"]["disabled"] = True
    return shown


def with_assignment_links(notebook, repo, unit):
    """The lesson as its page shows it, ending on its unit's assignment: the
    assignment's title and links to open it on Binder and Colab. A unit without an
    assignment comes back equal to `notebook`, which is left as it is."""
    shown = copy.deepcopy(notebook)
    if unit.assignment_path is None:
        return shown
    shown.cells.append(nbformat.v4.new_markdown_cell(
        f"## This unit's assignment\n\n"
        f"**Assignment {unit.number}: {notebook_title(unit.assignment)}.** Open it on "
        f"[Binder]({repo.binder(unit.assignment_path)}) or "
        f"[Colab]({repo.colab(unit.assignment_path)}), replace each "
        f"`raise NotImplementedError()` with your code, and hand in the notebook where "
        f"your course collects work."))
    return shown


def execute_lesson(path, out, log=sys.stderr):
    """Run one lesson top to bottom in a fresh kernel (its own scratch folder as the
    working directory, holding a copy of the lessons' data folder) and write it, with
    its outputs and its widgets' state, to `out`. A cell that raises stops the site;
    a kernel that stops answering is stopped and the lesson run again (RUNS in all)."""
    for run in range(1, RUNS + 1):
        notebook = nbformat.read(path, as_version=4)
        started = time.monotonic()
        with (tempfile.TemporaryDirectory(prefix="lesson-") as workdir,
              tempfile.TemporaryDirectory(prefix="kernel-") as sockets):
            if (path.parent / LESSON_DATA).is_dir():
                shutil.copytree(path.parent / LESSON_DATA, Path(workdir) / LESSON_DATA)
            # Unix sockets, not TCP ports: a port found free can be taken by another
            # process's kernel before this one binds it.
            km = KernelManager(kernel_name="python3", transport="ipc",
                               ip=str(Path(sockets) / "kernel"))
            client = NotebookClient(notebook, km=km, timeout=CELL_TIMEOUT,
                                    store_widget_state=True,
                                    resources={"metadata": {"path": workdir}})
            try:
                client.execute()
            except CellTimeoutError as error:
                print(f"{path.name}: no answer from the kernel ({error}); "
                      f"run {run} of {RUNS}", file=log)
                continue
            except CellExecutionError as error:
                raise SiteError(f"{path.name} failed:\n{str(error)[-3000:]}") from None
        nbformat.write(notebook, out)
        print(f"{path.name}: ran in {time.monotonic() - started:.0f} s", file=log)
        return
    raise SiteError(f"{path.name}: the kernel stopped answering {RUNS} times")


def _run_key(lesson):
    """What a lesson's run depends on: its bytes, the lessons' data files, the
    interpreter and the versions of the packages that draw its outputs."""
    digest = hashlib.sha256(lesson.read_bytes())
    data = lesson.parent / LESSON_DATA
    for name in sorted(data.rglob("*")) if data.is_dir() else ():
        if name.is_file():
            digest.update(name.relative_to(data).as_posix().encode() + name.read_bytes())
    digest.update(sys.version.encode())
    for package in LESSON_PACKAGES:
        try:
            version = metadata.version(package)
        except metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{package}={version};".encode())
    return digest.hexdigest()[:24]


def run_lesson(unit, out, *, runs, log=sys.stderr):
    """Write the lesson as it is after a run to `out`: the last run kept in `runs`
    when neither the lesson nor the packages changed since (a lesson takes up to a
    minute), else a new run, which replaces the kept one. runs=None: always run."""
    if runs is None:
        execute_lesson(unit.lesson, out, log)
        return
    kept = runs / f"{unit.slug}-{_run_key(unit.lesson)}.ipynb"
    if kept.is_file():
        shutil.copyfile(kept, out)
        print(f"{unit.lesson.name}: unchanged since its last run, which is reused", file=log)
        return
    execute_lesson(unit.lesson, out, log)
    runs.mkdir(parents=True, exist_ok=True)
    for older in runs.glob(f"{unit.slug}-*.ipynb"):
        older.unlink()
    partial = kept.with_suffix(".partial")
    shutil.copyfile(out, partial)
    partial.replace(kept)


def stage(*, course, repo, folder, asset_cache, runs=None, log=sys.stderr):
    """Write the book's sources into `folder`: configuration, table of contents, the
    first page, every lesson as it is after a run (its widgets shown as static, its
    assignment linked at the end; an unchanged lesson's last run is taken from
    `runs`), and the static files."""
    if not units(course):
        raise SiteError(f"no lessons in {course.root / LESSONS_DIR}")
    (folder / LESSONS_DIR).mkdir(parents=True, exist_ok=True)
    for unit in units(course):
        staged = folder / LESSONS_DIR / unit.lesson.name
        run_lesson(unit, staged, runs=runs, log=log)
        executed = nbformat.read(staged, as_version=4)
        page = with_static_widgets(executed, repo, unit.lesson_path)
        nbformat.write(with_assignment_links(page, repo, unit), staged)
    folders = install_assets(folder / "_assets", asset_cache, log)
    (folder / "_assets" / "course.js").write_text(COURSE_JS)
    (folder / "_assets" / "course.css").write_text(COURSE_CSS)
    (folder / "_assets" / "favicon.svg").write_text(FAVICON_SVG)
    (folder / "_ext").mkdir()
    (folder / "_ext" / "course_pages.py").write_text(PAGES_EXTENSION)
    (folder / "_config.yml").write_text(yaml.safe_dump(_book_config(repo, folders),
                                                       sort_keys=False))
    (folder / "_toc.yml").write_text(yaml.safe_dump(_toc(course), sort_keys=False))
    (folder / "index.md").write_text(_index_page(course, repo))


def build_site(*, course, repo, out, asset_cache=None, runs=DEFAULT_RUNS, log=sys.stderr):
    """Run every lesson (reusing the runs kept under course.root / `runs` of lessons
    that did not change; runs=None runs them all) and write the site to `out`
    (replaced); returns seconds."""
    started = time.monotonic()
    out = Path(out).resolve()
    asset_cache = Path(asset_cache or course.root / "build" / "npm")
    with tempfile.TemporaryDirectory(prefix="site-") as scratch:
        book = Path(scratch) / "book"
        print("building the site: every changed lesson runs (up to a minute each)", file=log)
        stage(course=course, repo=repo, folder=book, asset_cache=asset_cache,
              runs=None if runs is None else course.root / runs, log=log)
        env = {**os.environ, "PATH": path_with_tools(),
               "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        command = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
                   "build", str(book),
                   "--path-output", str(book), "--builder", "html", "--all",
                   "--warningiserror", "--keep-going"]
        done = subprocess.run(command, cwd=book, env=env, capture_output=True, text=True,
                              timeout=1800)
        if done.returncode != 0:
            reports = sorted((book / "_build" / "html" / "reports").rglob("*.err.log")) \
                if (book / "_build" / "html" / "reports").is_dir() else []
            details = "\n".join(path.read_text()[-3000:] for path in reports)
            raise SiteError(f"jupyter-book build failed:\n{done.stdout[-4000:]}"
                            f"{done.stderr[-4000:]}\n{details}")
        html = book / "_build" / "html"
        shutil.rmtree(html / "reports", ignore_errors=True)
        # Not used by a browser reading the pages: source maps, message catalogues.
        for unused in [*html.rglob("*.map"), *html.rglob("*.mo")]:
            unused.unlink()
        shutil.rmtree(html / "_static" / "locales", ignore_errors=True)
        (html / ".nojekyll").write_text("")  # serve _static/ and _images/ as they are
        (html / SITE_INFO).write_text(json.dumps(
            {**repo.as_dict(), "lessons": lessons_digest(course)}, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(html, out)
    seconds = time.monotonic() - started
    print(f"site written to {out} in {seconds:.0f} s", file=log)
    return seconds


def check_site(*, course, repo, site):
    """Problems that make a built site unfit for this edition (empty if none)."""
    info_path = Path(site) / SITE_INFO
    if not info_path.is_file():
        return [f"{site} is not a built site (no {SITE_INFO}): make site"]
    info = json.loads(info_path.read_text())
    problems = []
    for key, value in repo.as_dict().items():
        if info.get(key) != value:
            problems.append(f"the site was built for {key} {info.get(key)!r}, "
                            f"not {value!r}: make site")
    if info.get("lessons") != lessons_digest(course):
        problems.append("the lessons changed since the site was built: make site")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m autograder.publishing.site",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo-url", required=True,
                        help="the student edition's public GitHub repository")
    parser.add_argument("--branch", default="main", help="its branch (default main)")
    parser.add_argument("--site-url", default=None,
                        help="where the site will be served (default: the repository's "
                             "GitHub Pages address)")
    parser.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--course", default=None, help="course directory (default: here)")
    parser.add_argument("--rerun", action="store_true",
                        help=f"run every lesson again, even those unchanged since the run "
                             f"kept in {DEFAULT_RUNS}/")
    args = parser.parse_args(argv)
    course = Course.at(args.course)
    try:
        repo = Repository.parse(args.repo_url, branch=args.branch, site_url=args.site_url)
        build_site(course=course, repo=repo, out=args.out or course.root / DEFAULT_OUT,
                   runs=None if args.rerun else DEFAULT_RUNS)
    except (SiteError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
