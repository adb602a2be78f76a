"""The site (make site): built from a clean checkout, then every page opened in
headless Chromium, served over HTTP from 127.0.0.1 as a static web server would.

A page passes if it loads with no console error, no uncaught exception, no failed
request and no request to any other host; every figure on it is drawn (the plain
figures and those inside the slider cells, which the widget manager renders from the
saved widget state); the sliders stand at their defaults and cannot be moved (no
kernel answers them), and a note just above each cell's widgets says so, with links
to run that lesson on Binder and Colab; every link into the site resolves, with its
#anchor; every lesson links to the previous and the next unit and to its notebook on
Binder and Colab in the public repository.

The build runs every lesson (about a minute on 2 quiet cores, more when they are
busy), once for the whole module. COURSE_SITE_DIR=PATH tests an already built site
instead (one built for SITE_REPO below).
"""

import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

import labbrowser
from autograder.course import Course
from autograder.publishing.edition import Repository, units
from autograder.publishing.publish import find_edition_leaks
from conftest import REPO

playwright_api = pytest.importorskip("playwright.sync_api")

SITE_REPO = Repository.parse("https://github.com/example-course/layernorm-student")
BUILD_TIMEOUT = 3600  # seconds; about 60 s when the machine is quiet
WIDGETS_TIMEOUT_MS = 60_000  # the widget manager has drawn every widget of a page
SLIDER_MODELS = {"FloatSliderModel", "IntSliderModel", "FloatLogSliderModel",
                 "SelectionSliderModel"}

# Every widget placeholder replaced by a drawn widget, and every image decoded.
PAGE_READY = """() => {
  const pending = document.querySelectorAll(
      'script[type="application/vnd.jupyter.widget-view+json"]');
  const drawn = [...pending].every(s => s.previousElementSibling
      && s.previousElementSibling.querySelector('.jupyter-widgets'));
  const images = [...document.images].every(i => i.complete);
  return document.readyState === 'complete' && drawn && images;
}"""

PAGE_FACTS = """() => {
  const NOTE = '.course-static-widgets';
  // The note in a widget's cell output, and where it stands from the widget.
  const note = (output, widget) => {
    const found = output && output.querySelector(NOTE);
    return found && {
      text: found.innerText.trim(),
      links: [...found.querySelectorAll('a[href]')].map(
          a => [a.innerText.trim(), a.getAttribute('href')]),
      visible: found.checkVisibility() && found.getBoundingClientRect().height > 0,
      above: found.getBoundingClientRect().bottom <= widget.getBoundingClientRect().top,
    };
  };
  return {
    images: [...document.querySelectorAll('article img')].map(i => ({
        src: i.getAttribute('src').slice(0, 60), width: i.naturalWidth,
        inWidget: !!i.closest('.jupyter-widgets, .widget-output')})),
    links: [...document.querySelectorAll('a[href]')].map(a => ({
        href: a.getAttribute('href'), text: a.innerText.trim(),
        rel: a.getAttribute('rel') || '', cls: a.className})),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    sliders: [...document.querySelectorAll('.widget-slider')].map(s => ({
        label: (s.querySelector('.widget-label') || {innerText: ''}).innerText.trim(),
        readout: (s.querySelector('.widget-readout') || {innerText: ''}).innerText.trim(),
        disabled: !!s.querySelector('.noUi-target[disabled]'),
        note: note(s.closest('.cell_output'), s),
    })),
    widgetViews: document.querySelectorAll(
        'script[type="application/vnd.jupyter.widget-view+json"]').length,
    widgetsDrawn: document.querySelectorAll('.widget-subarea .jupyter-widgets').length,
    notes: document.querySelectorAll(NOTE).length,
    // Per cell output with widgets: its notes, and the controls drawn in it.
    widgetOutputs: [...document.querySelectorAll('.cell_output')]
        .filter(o => o.querySelector(
            'script[type="application/vnd.jupyter.widget-view+json"]'))
        .map(o => ({notes: o.querySelectorAll(NOTE).length,
                    controls: o.querySelectorAll(
                        '.jupyter-widgets :is(input, select, button, textarea, .noUi-target)')
                        .length})),
  };
}"""


def _clean_checkout(target):
    """The files a clone of this repository would hold (tracked, plus new files not
    ignored): no build/, no .venv, nothing built before."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for relative in filter(None, listed):
        source = REPO / relative
        if source.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / relative)
    return target


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(site folder, build seconds or None, the course it was built from)."""
    prebuilt = os.environ.get("COURSE_SITE_DIR")
    if prebuilt:
        return Path(prebuilt), None, REPO
    checkout = _clean_checkout(tmp_path_factory.mktemp("checkout"))
    out = checkout / "build" / "site"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autograder.publishing.site", "--course", str(checkout),
         "--repo-url", SITE_REPO.url, "--out", str(out)],
        cwd=checkout, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]
    print(f"\nmake site took {seconds:.0f} s")
    artifacts = REPO / "artifacts" / "site"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "build_time.txt").write_text(f"{seconds:.0f} s\n")
    return out, seconds, checkout


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(site):
    folder = site[0]
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", labbrowser.free_port()), partial(_QuietHandler, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    yield from labbrowser.chromium_session()


def _pages(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*.html")
                  if not p.relative_to(folder).parts[0].startswith("_"))


def _open(browser, base, page_path):
    """Load one page; returns (facts, problems)."""
    problems = []
    context = browser.new_context(viewport=labbrowser.VIEWPORT)
    page = context.new_page()

    def route(route_):
        if urlsplit(route_.request.url).hostname != "127.0.0.1":
            problems.append(f"request to another host: {route_.request.url}")
            route_.abort()
        else:
            route_.continue_()

    page.route("**/*", route)
    page.on("console", lambda m: m.type == "error" and problems.append(
        f"console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"uncaught exception: {e}"))
    page.on("requestfailed", lambda r: problems.append(
        f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(
        f"HTTP {r.status}: {r.url}"))
    try:
        page.goto(urljoin(base, page_path), wait_until="load")
        page.wait_for_function(PAGE_READY, timeout=WIDGETS_TIMEOUT_MS, polling=250)
        page.wait_for_timeout(500)  # late console messages
        facts = page.evaluate(PAGE_FACTS)
        if page_path.startswith("notebooks/"):
            shots = REPO / "artifacts" / "site"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / (Path(page_path).stem + ".png")))
        facts["slidersTried"] = _try_to_move_sliders(page)
    finally:
        context.close()
    return facts, problems


def _try_to_move_sliders(page):
    """Drag each slider's handle along its track to the far end, then press the arrow
    key that points there: [{label, before, after, dragged (pixels)}]. (A vertical
    slider would be dragged across its narrow track, a few pixels: the test that reads
    `dragged` would say so.)"""
    tried = []
    for slider in page.locator(".widget-slider").all():
        slider.scroll_into_view_if_needed()
        handle = slider.locator(".noUi-handle").first
        box, track = handle.bounding_box(), slider.locator(".noUi-target").bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        start, end = track["x"], track["x"] + track["width"]
        far = end if x - start < end - x else start
        readout = slider.locator(".widget-readout")
        before = readout.inner_text().strip()
        page.mouse.move(x, y)
        page.mouse.down()
        page.mouse.move(far, y, steps=8)
        page.mouse.up()
        handle.focus()
        page.keyboard.press("ArrowRight" if far > x else "ArrowLeft")
        page.wait_for_timeout(100)
        tried.append({"label": slider.locator(".widget-label").inner_text().strip(),
                      "before": before, "after": readout.inner_text().strip(),
                      "dragged": abs(far - x)})
    return tried


def _widget_state(html_text):
    match = re.search(r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)'
                      r"</script>", html_text, re.S)
    return json.loads(match.group(1))["state"] if match else {}


def _figures_in_state(state):
    """Output widgets in the saved state that hold a figure."""
    return sum(1 for model in state.values()
               if model["model_name"] == "OutputModel" and any(
                   "image/png" in output.get("data", {})
                   for output in model["state"].get("outputs", [])))


@pytest.fixture(scope="module")
def opened(site, server, browser):
    """{page: (facts, problems)} for every page of the site."""
    folder = site[0]
    return {path: _open(browser, server, path) for path in _pages(folder)}


def test_the_site_has_a_page_per_lesson_and_the_build_time_is_known(site):
    folder, seconds, _ = site
    for unit in units(Course.at(REPO)):
        assert (folder / unit.page).is_file()
    assert (folder / "index.html").is_file() and (folder / ".nojekyll").is_file()
    info = json.loads((folder / "site.json").read_text())
    assert info["repo_url"] == SITE_REPO.url
    if seconds is not None:
        assert seconds < BUILD_TIMEOUT


def test_every_page_loads_cleanly_and_from_the_site_alone(opened):
    failures = {path: problems for path, (_, problems) in opened.items() if problems}
    assert not failures, json.dumps(failures, indent=1)


def test_every_figure_is_drawn(site, opened):
    folder = site[0]
    for unit in units(Course.at(REPO)):
        path = unit.page
        facts, _ = opened[path]
        broken = [image for image in facts["images"] if image["width"] == 0]
        assert not broken, f"{path}: images not drawn: {broken}"
        state = _widget_state((folder / path).read_text())
        in_widgets = sum(1 for image in facts["images"] if image["inWidget"])
        plain = len(facts["images"]) - in_widgets
        assert in_widgets >= _figures_in_state(state), \
            f"{path}: {in_widgets} figures drawn in widgets, the state holds more"
        assert facts["widgetsDrawn"] >= facts["widgetViews"] > 0, f"{path}: widgets undrawn"
        assert plain + in_widgets > 0, f"{path}: no figure at all"


def test_sliders_stand_at_their_defaults(site, opened):
    folder = site[0]
    for unit in units(Course.at(REPO)):
        path = unit.page
        state = _widget_state((folder / path).read_text())
        models = [m for m in state.values() if m["model_name"] in SLIDER_MODELS]
        facts, _ = opened[path]
        assert len(facts["sliders"]) == len(models), \
            f"{path}: {len(facts['sliders'])} sliders drawn, {len(models)} in the state"
    facts, _ = opened["notebooks/01_the_recipe_lesson.html"]
    readouts = {s["label"]: s["readout"] for s in facts["sliders"]}
    # The defaults that lesson 01's code gives its sliders.
    assert readouts["gamma"] == "1.00" and readouts["beta"] == "0.00"
    assert readouts["k"] == "1.00" and readouts["c"] == "0.00"
    assert readouts["eps"] == "1e-5"


def test_sliders_cannot_be_moved_on_the_site(opened):
    """No kernel answers a slider on the site, so moving one would change nothing it
    drives: each is disabled, and dragging its handle across its track or pressing an
    arrow key on it leaves its value where the lesson set it."""
    with_sliders = {path: facts for path, (facts, _) in opened.items() if facts["sliders"]}
    assert with_sliders, "no page has a slider"
    for path, facts in with_sliders.items():
        assert len(facts["slidersTried"]) == len(facts["sliders"]), path
        for slider, tried in zip(facts["sliders"], facts["slidersTried"]):
            assert slider["disabled"], f"{path}: slider {slider['label']} is not disabled"
            # A drag that never left the handle would prove nothing.
            assert tried["dragged"] > 20, f"{path}: {tried}"
            assert tried["after"] == tried["before"] == slider["readout"], \
                f"{path}: slider {tried['label']} moved: {tried}"


def test_each_control_says_it_is_static_and_links_to_its_lesson_live(site, opened):
    """Just above the controls of each cell, a note says they are static on this page
    and links to this same lesson on Binder and Colab; widgets with nothing to move
    (a figure in an Output, an HTML text) and pages without widgets have no note."""
    lessons = {unit.page: unit for unit in units(Course.at(site[2]))}
    for path, (facts, _) in opened.items():
        if not facts["widgetViews"]:
            assert facts["notes"] == 0, f"{path}: a note without widgets"
            continue
        for output in facts["widgetOutputs"]:
            assert output["notes"] == (1 if output["controls"] else 0), \
                f"{path}: notes and controls per output with widgets: {facts['widgetOutputs']}"
        assert facts["notes"] == sum(o["notes"] for o in facts["widgetOutputs"]), path
        unit = lessons[path]
        for slider in facts["sliders"]:
            note = slider["note"]
            assert note and note["visible"] and note["above"], \
                f"{path}: slider {slider['label']}: note {note}"
            assert note["links"] == [["Binder", SITE_REPO.binder(unit.lesson_path)],
                                     ["Colab", SITE_REPO.colab(unit.lesson_path)]], path
            assert "static on this page" in note["text"], note["text"]


def test_every_link_into_the_site_resolves(site, opened):
    folder = site[0]
    ids = {path: set(facts["ids"]) for path, (facts, _) in opened.items()}
    broken = []
    for path, (facts, _) in opened.items():
        for link in facts["links"]:
            href = link["href"]
            parts = urlsplit(href)
            if parts.scheme in ("http", "https", "mailto"):
                continue
            target = (folder / path).parent / parts.path if parts.path else folder / path
            target = target.resolve()
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{path}: {href}")
                continue
            relative = str(target.relative_to(folder.resolve()))
            if parts.fragment and relative in ids and parts.fragment not in ids[relative]:
                broken.append(f"{path}: {href} (no #{parts.fragment} there)")
    assert not broken, "\n".join(broken)


def test_external_links_are_well_formed(opened):
    bad = [f"{path}: {link['href']}" for path, (facts, _) in opened.items()
           for link in facts["links"]
           if urlsplit(link["href"]).scheme == "http"
           or (urlsplit(link["href"]).scheme == "https"
               and not urlsplit(link["href"]).hostname)]
    assert not bad, "\n".join(bad)


def test_each_lesson_links_to_its_neighbours_binder_colab_and_its_assignment(opened):
    course = Course.at(REPO)
    all_units = units(course)
    for index, unit in enumerate(all_units):
        path = unit.page
        facts, _ = opened[path]
        hrefs = [link["href"] for link in facts["links"]]
        assert SITE_REPO.binder(unit.lesson_path) in hrefs, f"{path}: no Binder link"
        assert SITE_REPO.colab(unit.lesson_path) in hrefs, f"{path}: no Colab link"
        if unit.assignment_path:  # the unit's assignment, to open from its lesson
            assert SITE_REPO.binder(unit.assignment_path) in hrefs, \
                f"{path}: no Binder link to its assignment"
            assert SITE_REPO.colab(unit.assignment_path) in hrefs, \
                f"{path}: no Colab link to its assignment"
        for other in all_units:  # the table of contents
            assert any(h.split("#")[0].endswith(Path(other.page).name) for h in hrefs) \
                or other is unit, f"{path}: no link to {other.slug}"
        neighbours = {link["href"].split("#")[0] for link in facts["links"]
                      if {"left-prev", "right-next"} & set(link["cls"].split())}
        if index > 0:
            assert any(h.endswith(Path(all_units[index - 1].page).name) for h in neighbours), \
                f"{path}: no link to the previous unit"
        if index + 1 < len(all_units):
            assert any(h.endswith(Path(all_units[index + 1].page).name) for h in neighbours), \
                f"{path}: no link to the next unit"
    index_facts, _ = opened["index.html"]
    hrefs = [link["href"] for link in index_facts["links"]]
    for unit in all_units:
        assert any(h.endswith(unit.page) for h in hrefs)
        if unit.assignment_path:
            assert SITE_REPO.colab(unit.assignment_path) in hrefs
            assert SITE_REPO.binder(unit.assignment_path) in hrefs


def test_no_page_shows_a_librarys_run_time_noise(site):
    """A lesson's page shows what its cells print, not what a library writes on each run
    (torch's profiler printed a line at each start and stop, so every build differed)."""
    for page in (site[0] / "notebooks").glob("*.html"):
        text = page.read_text()
        assert "profiler_start" not in text and "USDT:" not in text, page.name


def test_the_site_shows_no_grading_material(site):
    folder = site[0]
    assert find_edition_leaks(course=Course.at(REPO), folder=folder) == []


def test_the_site_is_published_with_the_edition(site, tmp_path):
    folder, _, course = site
    dest = tmp_path / "edition"
    done = subprocess.run(
        [sys.executable, "-m", "autograder", "publish", str(dest), "--repo-url",
         SITE_REPO.url, "--course", str(course), "--site", str(folder)],
        capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (dest / "docs" / "index.html").read_bytes() == (folder / "index.html").read_bytes()
    assert (dest / "docs" / ".nojekyll").is_file()
    readme = (dest / "README.md").read_text()
    assert SITE_REPO.site("notebooks/01_the_recipe_lesson.html") in readme
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    files = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    (REPO / "artifacts" / "site").mkdir(parents=True, exist_ok=True)
    (REPO / "artifacts" / "site" / "edition_files.txt").write_text(
        "\n".join(files) + f"\n{len(files)} files, {size / 2**20:.1f} MiB\n")
    print(f"\nthe edition: {len(files)} files, {size / 2**20:.1f} MiB")
