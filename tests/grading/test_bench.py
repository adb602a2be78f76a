"""The benchmark runs end to end on a few hand-ins.

Timing targets live in the benchmark (python -m autograder.grading.bench), not here:
this only checks that both graders ran and agree on honest students.
"""

import io
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from autograder.course import Course
from autograder.grading import bench
from autograder.grading.bench import DISHONEST_SAMPLES, format_report, run_bench
from conftest import REPO, FlushCounter


def test_bench_times_both_graders_and_they_agree_on_honest_students(venv_env, monkeypatch):
    monkeypatch.setenv("PATH", venv_env["PATH"])  # nbgrader's alembic and kernels
    bench = run_bench(course=Course.at(REPO), handins=4, workers=2)
    assert bench["stock_seconds"] > 0 and bench["ours_seconds"] > 0
    assert bench["ratio"] == pytest.approx(bench["ours_seconds"] / bench["stock_seconds"])
    assert len(bench["scores"]) == 4
    honest = {s: v for s, v in bench["scores"].items() if v["sample"] not in DISHONEST_SAMPLES}
    assert honest and all(v["stock"] is not None for v in honest.values())
    assert {s: v["stock"] for s, v in honest.items()} == {s: v["ours"] for s, v in honest.items()}
    assert any("ratio ours/stock" in line for line in format_report(bench))


def test_engine_bench_grades_each_half_on_each_engine_in_a_balanced_order(monkeypatch):
    """A bench that graded all hand-ins on one engine, then all on the other, would
    blame whichever ran second for a load that came up meanwhile."""
    from autograder.grading import bench as bench_module

    calls = []

    def fake_pipeline(*, handin_folder, engine, **_):
        students = sorted(p.stem for p in handin_folder.glob("*.ipynb"))
        calls.append((engine, handin_folder.name, students))
        seconds = {"pool": 3.0, "dask": 4.0}[engine]
        return seconds, {s: 1.0 for s in students}, {s: {"kernel_start": 0.5} for s in students}

    monkeypatch.setattr(bench_module, "time_pipeline", fake_pipeline)
    monkeypatch.setattr(bench_module, "_warm_up", lambda: None)
    found = bench_module.run_engine_bench(course=Course.at(REPO), handins=10, workers=2)
    assert [(engine, half) for engine, half, _ in calls] == [
        ("pool", "first"), ("dask", "first"), ("dask", "second"), ("pool", "second")]
    first, second = calls[0][2], calls[2][2]
    assert len(first) == len(second) == 5 and not set(first) & set(second)
    assert calls[1][2] == first and calls[3][2] == second
    assert found["pool"]["seconds"] == 6.0 and found["dask"]["seconds"] == 8.0
    assert found["pool"]["per_minute"] == pytest.approx(60 * 10 / 6.0)
    assert found["ratio"] == pytest.approx(6.0 / 8.0)
    assert found["same_scores"] and len(found["dask"]["scores"]) == 10


# The benchmark's own logic (autograder/grading/bench.py), without grading anything.


@pytest.fixture
def samples(tmp_path, monkeypatch):
    """A sample class of three notebooks for 01_the_recipe (and an expected.json)."""
    folder = tmp_path / "examples" / "01_the_recipe"
    folder.mkdir(parents=True)
    for name in ("cy_wrong", "ada_perfect", "hal_cheats"):
        (folder / f"{name}.ipynb").write_text(f"notebook of {name}")
    (folder / "expected.json").write_text("{}")
    monkeypatch.setattr(bench, "EXAMPLES_DIR", tmp_path / "examples")
    return folder


@pytest.fixture
def clock(monkeypatch):
    """time.monotonic as 100, 110, 120, ... (each call 10 s later)."""
    ticks = iter(range(100, 100_000, 10))
    monkeypatch.setattr(bench, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))


def _course(root):
    for part in ("source", "release"):
        (root / part / "01_the_recipe").mkdir(parents=True)
        (root / part / "01_the_recipe" / "01_the_recipe.ipynb").write_text(part)
    (root / "nbgrader_config.py").write_text("c = get_config()\nc.Exchange.root = 'x'\n")
    return Course(root)


# -- hand-ins --------------------------------------------------------------------------

def test_hand_ins_cycle_through_the_sample_students(samples, tmp_path):
    """N hand-ins named s000_<sample>, s001_..., taking the samples in name order again
    and again, each a copy of its sample."""
    assert bench.sample_students() == {name: samples / f"{name}.ipynb"
                                       for name in ("ada_perfect", "cy_wrong", "hal_cheats")}
    folder = tmp_path / "new" / "handins"
    made = bench.make_handins(folder=folder, handins=5)
    assert made == {"s000_ada_perfect": "ada_perfect", "s001_cy_wrong": "cy_wrong",
                    "s002_hal_cheats": "hal_cheats", "s003_ada_perfect": "ada_perfect",
                    "s004_cy_wrong": "cy_wrong"}
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{s}.ipynb" for s in made)
    assert (folder / "s003_ada_perfect.ipynb").read_text() == "notebook of ada_perfect"
    assert len(bench.make_handins(folder=folder, handins=40)) == 40  # folder exists: fine


def test_the_default_is_forty_hand_ins_of_unit_01(samples, tmp_path):
    """Without arguments: 40 hand-ins of 01_the_recipe's samples."""
    made = bench.make_handins(folder=tmp_path / "h")
    assert len(made) == 40 and list(made)[-1] == "s039_ada_perfect"
    other = samples.parent / "02_other"
    other.mkdir()
    (other / "zed.ipynb").write_text("z")
    assert bench.make_handins(folder=tmp_path / "o", handins=1, assignment="02_other") == {
        "s000_zed": "zed"}


def test_submit_files_each_hand_in_as_nbgrader_expects(tmp_path):
    """submitted/<student>/<assignment>/<notebook name>, one per hand-in notebook."""
    handins = tmp_path / "handins"
    handins.mkdir()
    for student in ("s001_b", "s000_a"):
        (handins / f"{student}.ipynb").write_text(student)
    (handins / "notes.txt").write_text("not a hand-in")
    bench._submit(course_root=tmp_path / "course", handin_folder=handins,
                  assignment="01_x", notebook_name="01_x.ipynb")
    submitted = tmp_path / "course" / "submitted"
    assert sorted(str(p.relative_to(submitted)) for p in submitted.rglob("*.ipynb")) == [
        "s000_a/01_x/01_x.ipynb", "s001_b/01_x/01_x.ipynb"]
    assert (submitted / "s001_b" / "01_x" / "01_x.ipynb").read_text() == "s001_b"


# -- stock nbgrader --------------------------------------------------------------------

def test_nbgrader_runs_from_this_interpreter_and_its_failure_says_why(monkeypatch, tmp_path):
    """nbgrader is run as `python -m nbgrader` with this interpreter's bin/ first on
    PATH (its alembic); a failure raises with the command and the end of its output."""
    calls = []

    def run(command, **kwargs):
        calls.append((command, kwargs))
        return SimpleNamespace(returncode=calls[-1][1].get("code", 0), stdout="", stderr="")

    monkeypatch.setattr(bench.subprocess, "run", run)
    monkeypatch.setenv("PATH", "/usr/bin")
    bench._nbgrader(["autograde", "01_x"], cwd=tmp_path)
    ((command, kwargs),) = calls
    assert command == [sys.executable, "-m", "nbgrader", "autograde", "01_x"]
    assert kwargs["cwd"] == tmp_path and kwargs["capture_output"] and kwargs["text"]
    assert kwargs["env"]["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/usr/bin"
    assert kwargs["env"]["HOME"] == os.environ["HOME"]
    monkeypatch.delenv("PATH")
    assert bench._venv_environment()["PATH"] == \
        f"{Path(sys.executable).parent}{os.pathsep}{os.defpath}"

    monkeypatch.setattr(bench.subprocess, "run", lambda command, **_: SimpleNamespace(
        returncode=1, stdout="x" * 100 + "O" * 3000, stderr="y" * 100 + "E" * 3000))
    with pytest.raises(RuntimeError) as error:
        bench._nbgrader(["generate_assignment", "01_x", "--force"], cwd=tmp_path)
    assert str(error.value) == ("nbgrader generate_assignment 01_x --force failed:\n"
                                + "O" * 3000 + "E" * 3000)


def test_the_stock_course_gets_the_courses_config_and_our_timeout(tmp_path, monkeypatch):
    """The scratch nbgrader course: the course's own config, then its root, gradebook
    and the per-cell timeout (whole seconds), its source, and generate_assignment."""
    course = _course(tmp_path / "course")
    root = tmp_path / "stock"
    root.mkdir()
    calls = []
    monkeypatch.setattr(bench, "_nbgrader", lambda args, *, cwd: calls.append((args, cwd)))
    bench._stock_course(course=course, root=root, assignment="01_the_recipe",
                        cell_timeout=12.7)
    assert (root / "nbgrader_config.py").read_text() == (
        "c = get_config()\nc.Exchange.root = 'x'\n"
        f"\nc.CourseDirectory.root = {str(root)!r}\n"
        f"c.CourseDirectory.db_url = {'sqlite:///' + str(root / 'gradebook.db')!r}\n"
        "c.ExecutePreprocessor.timeout = 12\nc.Execute.timeout = 12\n")
    assert (root / "source" / "01_the_recipe" / "01_the_recipe.ipynb").read_text() == "source"
    assert calls == [(["generate_assignment", "01_the_recipe", "--force"], root)]
    # A course without a config of its own gets a bare one.
    (course.root / "nbgrader_config.py").unlink()
    other = tmp_path / "stock2"
    other.mkdir()
    bench._stock_course(course=course, root=other, assignment="01_the_recipe",
                        cell_timeout=30.0)
    assert (other / "nbgrader_config.py").read_text().startswith(
        "c = get_config()  # noqa: F821\n\nc.CourseDirectory.root")


def test_stock_scores_are_read_from_the_gradebook(tmp_path, monkeypatch):
    """Each submission's score, as a float, by student id, from the scratch course's
    gradebook."""
    import nbgrader.api

    opened = []

    class Gradebook:
        def __init__(self, url):
            opened.append(url)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def find_assignment(self, name):
            assert name == "01_x"
            return SimpleNamespace(submissions=[
                SimpleNamespace(student=SimpleNamespace(id="ada"), score=3),
                SimpleNamespace(student=SimpleNamespace(id="bob"), score=1.5)])

    monkeypatch.setattr(nbgrader.api, "Gradebook", Gradebook)
    scores = bench._stock_scores(tmp_path, "01_x")
    assert scores == {"ada": 3.0, "bob": 1.5} and isinstance(scores["ada"], float)
    assert opened == [f"sqlite:///{tmp_path / 'gradebook.db'}"]


def test_time_stock_nbgrader_times_autograde_only(tmp_path, monkeypatch, clock):
    """Only `nbgrader autograde` is timed, after the course is made and the hand-ins
    submitted under the assignment's notebook name."""
    course = _course(tmp_path / "course")
    handins = tmp_path / "handins"
    handins.mkdir()
    (handins / "s000_ada.ipynb").write_text("ada")
    events = []

    def stock_course(*, course, root, assignment, cell_timeout):
        events.append(("course", assignment, cell_timeout))

    def nbgrader(args, *, cwd):
        events.append(("nbgrader", args,
                       (cwd / "submitted" / "s000_ada" / "01_the_recipe" /
                        "01_the_recipe.ipynb").read_text()))
        bench.time.monotonic()  # 10 s pass while it grades

    monkeypatch.setattr(bench, "_stock_course", stock_course)
    monkeypatch.setattr(bench, "_nbgrader", nbgrader)
    monkeypatch.setattr(bench, "_stock_scores", lambda root, assignment: {"s000_ada": 3.0})
    seconds, scores = bench.time_stock_nbgrader(course=course, handin_folder=handins,
                                                cell_timeout=7.0)
    assert (seconds, scores) == (20.0, {"s000_ada": 3.0})
    assert events == [("course", "01_the_recipe", 7.0),
                      ("nbgrader", ["autograde", "01_the_recipe"], "ada")]


def test_time_pipeline_grades_a_scratch_copy_with_the_engine_asked_for(
        tmp_path, monkeypatch, clock):
    """Our grader runs on a scratch course holding the assignment's source and release
    and the hand-ins, with the cell timeout, workers and engine given; scores and each
    hand-in's phases come back."""
    course = _course(tmp_path / "course")
    handins = tmp_path / "handins"
    handins.mkdir()
    (handins / "s000_ada.ipynb").write_text("ada")
    seen = []

    def grade_assignment(*, course, assignment, settings, workers, engine, progress):
        seen.append(((course.release / assignment / "01_the_recipe.ipynb").read_text(),
                     (course.source / assignment / "01_the_recipe.ipynb").read_text(),
                     course.students(assignment), settings.cell_timeout, workers, engine,
                     progress))
        return [{"student_id": "s000_ada", "score": 3, "phases": {"run": 1.5}},
                {"student_id": "s001_bob", "score": 0}]

    monkeypatch.setattr(bench, "grade_assignment", grade_assignment)
    log = io.StringIO()
    seconds, scores, phases = bench.time_pipeline(
        course=course, handin_folder=handins, workers=3, cell_timeout=9.0, engine="pool",
        progress=log)
    assert seconds == 10.0 and scores == {"s000_ada": 3.0, "s001_bob": 0.0}
    assert isinstance(scores["s000_ada"], float)
    assert phases == {"s000_ada": {"run": 1.5}, "s001_bob": {}}
    assert seen == [("release", "source", ["s000_ada"], 9.0, 3, "pool", log)]
    bench.time_pipeline(course=course, handin_folder=handins)
    assert seen[-1][3:6] == (30.0, None, "dask")


# -- the runs --------------------------------------------------------------------------

def test_warm_up_imports_the_kernels_libraries_without_failing(monkeypatch):
    """The warm-up reads the same libraries both graders' kernels import, and never
    stops the benchmark."""
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda command, **kw: calls.append(
        (command, kw)))
    bench._warm_up()
    ((command, kwargs),) = calls
    assert command[:2] == [sys.executable, "-c"]
    assert command[2] == ("import numpy, torch, matplotlib.pyplot, ipywidgets, ipykernel, "
                          "nbgrader, normref.checks._registry")
    assert kwargs == {"check": False, "capture_output": True}


@pytest.fixture
def runs(monkeypatch, samples):
    """Both graders replaced: stock takes 80 s for all, ours 20 s (dask) or 25 s (pool)
    per call; each hand-in's phases: run = its number, check = 1 s."""
    calls = []
    monkeypatch.setattr(bench, "_warm_up", lambda: calls.append("warm up"))

    def stock(*, course, handin_folder, cell_timeout):
        calls.append(("stock", sorted(p.stem for p in handin_folder.iterdir()), cell_timeout))
        return 80.0, {s.stem: 1.0 for s in handin_folder.iterdir()}

    def ours(*, course, handin_folder, workers, cell_timeout, progress, engine="dask"):
        students = sorted(p.stem for p in handin_folder.glob("*.ipynb"))
        half = handin_folder.name if handin_folder.name in ("first", "second") else "all"
        calls.append((engine, half, students, workers, cell_timeout))
        return ({"dask": 20.0, "pool": 25.0}[engine], {s: 1.0 for s in students},
                {s: {"run": float(s[1:4]), "check": 1.0} for s in students})

    monkeypatch.setattr(bench, "time_stock_nbgrader", stock)
    monkeypatch.setattr(bench, "time_pipeline", ours)
    return calls


def test_run_bench_puts_both_timings_side_by_side(runs, monkeypatch):
    """The figures: both times, their ratio, the times per hand-in, each student's two
    scores and the phases of the perfect hand-ins."""
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 6)
    log = io.StringIO()
    found = bench.run_bench(course=None, handins=4, cell_timeout=5.0, progress=log)
    assert runs == ["warm up",
                    ("stock", ["s000_ada_perfect", "s001_cy_wrong", "s002_hal_cheats",
                               "s003_ada_perfect"], 5.0),
                    ("dask", "all", ["s000_ada_perfect", "s001_cy_wrong", "s002_hal_cheats",
                                     "s003_ada_perfect"], 6, 5.0)]
    assert found == {
        "handins": 4, "workers": 6, "cores": 6, "stock_seconds": 80.0, "ours_seconds": 20.0,
        "ratio": 0.25, "stock_seconds_per_handin": 20.0, "ours_seconds_per_handin": 5.0,
        "scores": {s: {"sample": s.split("_", 1)[1], "stock": 1.0, "ours": 1.0}
                   for s in ("s000_ada_perfect", "s001_cy_wrong", "s002_hal_cheats",
                             "s003_ada_perfect")},
        "phases": {"check": 1.0, "run": 1.5}}
    assert log.getvalue() == ("grading 4 hand-ins with stock nbgrader ...\n"
                              "grading 4 hand-ins with this pipeline ...\n")
    assert bench.run_bench(course=None, handins=1, workers=2,
                           progress=io.StringIO())["workers"] == 2
    monkeypatch.setattr(bench.os, "cpu_count", lambda: None)
    assert bench.run_bench(course=None, handins=1, progress=io.StringIO())["workers"] == 1


def test_halves_split_the_hand_ins_in_two(tmp_path):
    """The first half (rounded down) of the hand-ins, by name, goes to first/, the rest
    to second/; other files stay."""
    for index in range(5):
        (tmp_path / f"s{index:03d}_x.ipynb").write_text(str(index))
    (tmp_path / "notes.txt").write_text("n")
    first, second = bench._halves(tmp_path)
    assert (first, second) == (tmp_path / "first", tmp_path / "second")
    assert sorted(p.name for p in first.iterdir()) == ["s000_x.ipynb", "s001_x.ipynb"]
    assert sorted(p.name for p in second.iterdir()) == ["s002_x.ipynb", "s003_x.ipynb",
                                                        "s004_x.ipynb"]
    assert (second / "s004_x.ipynb").read_text() == "4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first", "notes.txt", "second"]


def test_run_engine_bench_compares_pool_and_dask(runs, monkeypatch):
    """Each engine grades each half, in the order pool, Dask, Dask, pool; the times and
    scores of both halves add up; the ratio is Dask's throughput over the pool's."""
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 4)
    log = io.StringIO()
    found = bench.run_engine_bench(course=None, handins=5, cell_timeout=3.0, progress=log)
    first = ["s000_ada_perfect", "s001_cy_wrong"]
    second = ["s002_hal_cheats", "s003_ada_perfect", "s004_cy_wrong"]
    assert runs == ["warm up", ("pool", "first", first, 4, 3.0),
                    ("dask", "first", first, 4, 3.0), ("dask", "second", second, 4, 3.0),
                    ("pool", "second", second, 4, 3.0)]
    assert found["pool"]["seconds"] == 50.0 and found["pool"]["per_minute"] == 6.0
    assert found["dask"]["seconds"] == 40.0 and found["dask"]["per_minute"] == 7.5
    assert found["ratio"] == 1.25
    assert found["same_scores"] is True and found["handins"] == 5
    assert (found["workers"], found["cores"]) == (4, 4)
    assert found["dask"]["phases"] == {"check": 1.0, "run": 1.5}
    assert found["pool"]["phases"] == {"check": 1.0, "run": 1.5}
    assert found["dask"]["scores"] == {s: 1.0 for s in first + second}
    assert log.getvalue() == ("grading half 1 of 5 hand-ins on pool ...\n"
                              "grading half 1 of 5 hand-ins on dask ...\n"
                              "grading half 2 of 5 hand-ins on dask ...\n"
                              "grading half 2 of 5 hand-ins on pool ...\n")
    assert bench.run_engine_bench(course=None, handins=2, workers=2,
                                  progress=io.StringIO())["workers"] == 2
    monkeypatch.setattr(bench.os, "cpu_count", lambda: None)
    assert bench.run_engine_bench(course=None, handins=2,
                                  progress=io.StringIO())["workers"] == 1


def test_engine_bench_notes_differing_scores(runs, monkeypatch):
    """If Dask and the pool disagree on a score, same_scores is False."""
    real = bench.time_pipeline

    def ours(**kwargs):
        seconds, scores, phases = real(**kwargs)
        if kwargs["engine"] == "dask":
            scores["s000_ada_perfect"] = 0.0
        return seconds, scores, phases

    monkeypatch.setattr(bench, "time_pipeline", ours)
    assert bench.run_engine_bench(course=None, handins=2,
                                  progress=io.StringIO())["same_scores"] is False


# -- phases and reports ----------------------------------------------------------------

def test_mean_phases_average_the_chosen_samples_hand_ins():
    """Each phase's mean over the hand-ins of one sample that report phases; a phase
    missing from a hand-in counts 0 s; no such hand-ins: nothing."""
    samples = {"a1": "ada", "a2": "ada", "a3": "ada", "b1": "bob"}
    phases = {"a1": {"run": 2.0, "check": 1.0}, "a2": {"run": 4.0}, "a3": {},
              "b1": {"run": 100.0}}
    assert bench.mean_phases(phases, samples, "ada") == {"check": 0.5, "run": 3.0}
    assert list(bench.mean_phases(phases, samples, "ada")) == ["check", "run"]
    assert bench.mean_phases(phases, samples, "cy") == {}
    assert bench.mean_phases({"a1": {}}, samples, "ada") == {}
    assert bench.PHASE_SAMPLE == "ada_perfect"


def test_format_phases():
    """One line with each phase's mean, in order, two decimals; none without phases."""
    assert bench.format_phases({"start": 1.234, "run": 0.5}) == [
        "  where a perfect hand-in's time goes: start 1.23 s, run 0.50 s"]
    assert bench.format_phases({}) == [] and bench.format_phases(None) == []


def _bench(ratio, scores, phases=None):
    return {"handins": 4, "cores": 2, "workers": 2, "stock_seconds": 80.0,
            "ours_seconds": 80.0 * ratio, "ratio": ratio, "stock_seconds_per_handin": 20.0,
            "ours_seconds_per_handin": 20.0 * ratio, "scores": scores,
            **({"phases": phases} if phases is not None else {})}


def test_format_report_gives_the_times_the_ratio_and_differing_scores():
    """The report's lines: both times, the ratio against its target (MISSED above it),
    each group of differing scores (cheats explained), then the phases."""
    scores = {"s0_ada": {"sample": "ada", "stock": 3.0, "ours": 3.0},
              "s1_hal": {"sample": "hal_cheats", "stock": 3.0, "ours": 0.0},
              "s3_hal": {"sample": "hal_cheats", "stock": 3.0, "ours": 0.0},
              "s2_eve": {"sample": "eve", "stock": 1.0, "ours": 2.0},
              "s4_lou": {"sample": "lou_hidden_cheat", "stock": 3.0, "ours": 1.0}}
    assert bench.format_report(_bench(0.25, scores, {"run": 1.0})) == [
        "4 hand-ins of 01_the_recipe on 2 cores",
        "  stock nbgrader autograde:    80.0 s  (20.00 s per hand-in, one at a time)",
        "  this pipeline:               20.0 s  (5.00 s per hand-in, 2 workers, sandbox and "
        "trusted checks on)",
        "  ratio ours/stock: 0.25 (target at most 0.25)",
        "  scores differ for 1 x eve: stock 1.0, ours 2.0",
        "  scores differ for 2 x hal_cheats: stock 3.0, ours 0.0 (cheats: stock nbgrader "
        "believes the kernel)",
        "  scores differ for 1 x lou_hidden_cheat: stock 3.0, ours 1.0 (cheats: stock "
        "nbgrader believes the kernel)",
        "  where a perfect hand-in's time goes: run 1.00 s"]
    lines = bench.format_report(_bench(0.5, {}), target_ratio=0.4)
    assert lines[3] == "  ratio ours/stock: 0.50 (target at most 0.4)  MISSED"
    assert len(lines) == 4


def test_a_hand_in_stock_nbgrader_left_unscored_is_reported_after_the_scored_ones():
    """Stock nbgrader can leave a hand-in without a score (None): its group is listed
    after the numbers of the same sample rather than stopping the report."""
    scores = {"s0_fay": {"sample": "fay", "stock": None, "ours": 4.0},
              "s1_fay": {"sample": "fay", "stock": 10.0, "ours": 4.0},
              "s2_fay": {"sample": "fay", "stock": 2.0, "ours": 4.0}}
    assert bench.format_report(_bench(0.25, scores))[4:] == [
        "  scores differ for 1 x fay: stock 2.0, ours 4.0",
        "  scores differ for 1 x fay: stock 10.0, ours 4.0",
        "  scores differ for 1 x fay: stock None, ours 4.0"]
    # A score of 0 is a number like any other: it comes before 1, not level with it.
    scores = {"s0_gus": {"sample": "gus", "stock": 1.0, "ours": 4.0},
              "s1_gus": {"sample": "gus", "stock": 0.0, "ours": 4.0}}
    assert bench.format_report(_bench(0.25, scores))[4:] == [
        "  scores differ for 1 x gus: stock 0.0, ours 4.0",
        "  scores differ for 1 x gus: stock 1.0, ours 4.0"]


def test_format_engine_report():
    """Both engines' time and throughput, the ratio against 0.90 (MISSED below it),
    whether the scores agree, and Dask's phases."""
    found = {"handins": 6, "workers": 2, "cores": 4, "ratio": 0.9, "same_scores": True,
             "pool": {"seconds": 30.0, "per_minute": 12.0, "phases": {}},
             "dask": {"seconds": 33.3, "per_minute": 10.8, "phases": {"run": 2.0}}}
    assert bench.format_engine_report(found) == [
        "6 hand-ins of 01_the_recipe, 2 workers on 4 cores",
        "  process pool (baseline)     30.0 s    12.0 hand-ins per minute",
        "  Dask LocalCluster           33.3 s    10.8 hand-ins per minute",
        "  Dask / pool throughput: 0.90 (target at least 0.90)",
        "  same scores on both: yes",
        "  where a perfect hand-in's time goes: run 2.00 s"]
    found.update(ratio=0.89, same_scores=False)
    found["dask"]["phases"] = {}
    lines = bench.format_engine_report(found)
    assert lines[3:] == ["  Dask / pool throughput: 0.89 (target at least 0.90)  MISSED",
                         "  same scores on both: NO"]


# -- exit status and entry point ---------------------------------------------------------

def test_bench_command_fails_only_when_honest_students_differ(monkeypatch, capsys):
    """Exit 1 when stock nbgrader and ours disagree on an honest student; cheats may
    differ (that is the point); the report is printed."""
    honest_differ = {"s0": {"sample": "ada", "stock": 3.0, "ours": 2.0}}
    cheats_differ = {"s1": {"sample": "hal_cheats", "stock": 3.0, "ours": 0.0},
                     "s2": {"sample": "lou_hidden_cheat", "stock": 3.0, "ours": 1.0},
                     "s3": {"sample": "ada", "stock": 3.0, "ours": 3.0}}
    calls = []
    for scores, status in ((honest_differ, 1), (cheats_differ, 0)):
        monkeypatch.setattr(bench, "run_bench", lambda scores=scores, **kw: calls.append(kw)
                            or _bench(0.2, scores))
        assert bench.bench_command(course="C", handins=4, workers=2) == status
    assert calls[0] == {"course": "C", "handins": 4, "workers": 2}
    out = capsys.readouterr().out
    assert out.startswith("4 hand-ins of 01_the_recipe on 2 cores\n")
    assert "scores differ for 1 x ada: stock 3.0, ours 2.0\n" in out
    bench.bench_command(course="C")
    assert calls[-1] == {"course": "C", "handins": 40, "workers": None}


def test_bench_command_with_engines_fails_when_the_engines_disagree(monkeypatch, capsys):
    """--engines: exit 0 when both engines give the same scores, 1 when not."""
    calls = []
    for same, status in ((True, 0), (False, 1)):
        found = {"handins": 6, "workers": 2, "cores": 4, "ratio": 1.0, "same_scores": same,
                 "pool": {"seconds": 1.0, "per_minute": 1.0, "phases": {}},
                 "dask": {"seconds": 1.0, "per_minute": 1.0, "phases": {}}}
        monkeypatch.setattr(bench, "run_engine_bench",
                            lambda found=found, **kw: calls.append(kw) or found)
        assert bench.bench_command(course="C", handins=6, workers=3, engines=True) == status
    assert calls[0] == {"course": "C", "handins": 6, "workers": 3}
    assert capsys.readouterr().out.startswith("6 hand-ins of 01_the_recipe, 2 workers")


def test_main_passes_its_options(monkeypatch, tmp_path):
    """`python -m autograder.grading.bench`: --course, --handins (40, or 300 with
    --one-student), --workers, --engines and --one-student reach bench_command."""
    calls = []
    monkeypatch.setattr(bench, "bench_command", lambda **kw: calls.append(kw) or 5)
    assert bench.main(["--course", str(tmp_path)]) == 5
    assert bench.main(["--handins", "3", "--workers", "2", "--engines"]) == 5
    assert bench.main(["--one-student"]) == 5
    assert calls == [
        {"course": Course(tmp_path.resolve()), "handins": 40, "workers": None,
         "engines": False, "one_student": False},
        {"course": Course.at(), "handins": 3, "workers": 2, "engines": True,
         "one_student": False},
        {"course": Course.at(), "handins": 300, "workers": None, "engines": False,
         "one_student": True}]


def test_main_help_reads_as_documented(capsys):
    """`python -m autograder.grading.bench --help`: the module's overview as written, and each
    option's help, word for word."""
    with pytest.raises(SystemExit):
        bench.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m autograder.grading.bench [-h]")
    assert ("\n    python -m autograder.grading.bench [--handins 40] [--workers N] [--course DIR] "
            "[--engines]\n") in text  # the overview keeps its layout
    words = " ".join(text.split())
    for option, help_text in (
            ("--course COURSE", "course directory (default: the repository root)"),
            ("--handins HANDINS", "hand-ins to grade: 40, or with --one-student 300"),
            ("--workers WORKERS", "this pipeline's parallel hand-ins (default: the number of "
                                  "cores)"),
            ("--engines", "compare the Dask path with a process pool instead"),
            ("--one-student", "time grade --student X on a graded class instead")):
        assert f"{option} {help_text} " in words + " ", option


def test_progress_lines_are_flushed_as_they_are_written(runs):
    """Each progress line reaches the stream at once (grading takes minutes after it),
    whatever the stream is."""
    progress = FlushCounter()
    bench.run_bench(course=None, handins=1, progress=progress)
    first = "grading 1 hand-ins with stock nbgrader ...\n"
    assert progress.flushed[:2] == [first, first + "grading 1 hand-ins with this pipeline ...\n"]
    progress = FlushCounter()
    bench.run_engine_bench(course=None, handins=2, progress=progress)
    assert progress.flushed == [
        progress.getvalue()[:len("grading half 1 of 2 hand-ins on pool ...\n") * n]
        for n in (1, 2, 3, 4)]


def test_a_second_submission_replaces_the_first(tmp_path):
    """Submitting into a course that already holds a student's hand-in replaces it."""
    handins = tmp_path / "handins"
    handins.mkdir()
    (handins / "s000_a.ipynb").write_text("first")
    course_root = tmp_path / "course"
    bench._submit(course_root=course_root, handin_folder=handins, assignment="01_x",
                  notebook_name="01_x.ipynb")
    (handins / "s000_a.ipynb").write_text("second")
    bench._submit(course_root=course_root, handin_folder=handins, assignment="01_x",
                  notebook_name="01_x.ipynb")
    assert (course_root / "submitted" / "s000_a" / "01_x" / "01_x.ipynb").read_text() == \
        "second"


def test_engine_report_is_printed_one_line_each(monkeypatch, capsys):
    """--engines prints the engine report as it is, one line per line, nothing added."""
    found = {"handins": 6, "workers": 2, "cores": 4, "ratio": 1.0, "same_scores": True,
             "pool": {"seconds": 1.0, "per_minute": 360.0, "phases": {}},
             "dask": {"seconds": 1.0, "per_minute": 360.0, "phases": {"run": 0.5}}}
    monkeypatch.setattr(bench, "run_engine_bench", lambda **kw: found)
    assert bench.bench_command(course="C", engines=True) == 0
    assert capsys.readouterr().out == (
        "6 hand-ins of 01_the_recipe, 2 workers on 4 cores\n"
        "  process pool (baseline)      1.0 s   360.0 hand-ins per minute\n"
        "  Dask LocalCluster            1.0 s   360.0 hand-ins per minute\n"
        "  Dask / pool throughput: 1.00 (target at least 0.90)\n"
        "  same scores on both: yes\n"
        "  where a perfect hand-in's time goes: run 0.50 s\n")


def test_the_benchmarks_defaults_are_the_documented_ones(runs):
    """Without options, the stock comparison grades 40 hand-ins and the engine comparison
    200, both with the CLI's 30 s per cell."""
    found = bench.run_bench(course=None, progress=io.StringIO())
    assert found["handins"] == 40 and len(found["scores"]) == 40
    assert [call[-1] for call in runs[1:]] == [30.0, 30.0]
    runs.clear()
    found = bench.run_engine_bench(course=None, progress=io.StringIO())
    assert found["handins"] == 200 and len(found["dask"]["scores"]) == 200
    assert [call[-1] for call in runs[1:]] == [30.0] * 4


def test_both_graders_get_the_course_and_the_progress_stream(samples, monkeypatch):
    """The course given (its source and release) reaches every grading run, and ours
    reports its progress to the stream given."""
    monkeypatch.setattr(bench, "_warm_up", lambda: None)
    course, log, seen = object(), io.StringIO(), []

    def stock(*, course, handin_folder, cell_timeout):
        seen.append(("stock", course))
        return 1.0, {}

    def ours(*, course, handin_folder, workers, cell_timeout, progress, engine="dask"):
        seen.append((engine, course, progress))
        return 1.0, {}, {}

    monkeypatch.setattr(bench, "time_stock_nbgrader", stock)
    monkeypatch.setattr(bench, "time_pipeline", ours)
    bench.run_bench(course=course, handins=2, progress=log)
    assert seen == [("stock", course), ("dask", course, log)]
    seen.clear()
    bench.run_engine_bench(course=course, handins=2, progress=log)
    assert seen == [(engine, course, log) for engine in ("pool", "dask", "dask", "pool")]


def test_stock_nbgrader_sets_up_grades_and_reads_one_scratch_course(tmp_path, monkeypatch,
                                                                     clock):
    """The scratch nbgrader course is made from the course given, autograded, and its
    gradebook read for the assignment, all in the same folder; the per-cell timeout is
    30 s unless told."""
    course = _course(tmp_path / "course")
    handins = tmp_path / "handins"
    handins.mkdir()
    events = []
    monkeypatch.setattr(bench, "_stock_course", lambda **kw: events.append(("course", kw)))
    monkeypatch.setattr(bench, "_nbgrader", lambda args, *, cwd: events.append(("run", cwd)))
    monkeypatch.setattr(bench, "_stock_scores", lambda root, assignment: events.append(
        ("scores", root, assignment)) or {"s000_ada": 2.0})
    assert bench.time_stock_nbgrader(course=course, handin_folder=handins)[1] == {
        "s000_ada": 2.0}
    (_, made), (_, graded_in), (_, read_from, assignment) = events
    assert made["course"] is course and made["cell_timeout"] == 30.0
    assert isinstance(graded_in, Path) and made["root"] == graded_in == read_from
    assert assignment == "01_the_recipe"


def test_one_student_bench_times_grade_student_on_a_class_whose_copies_verify(monkeypatch):
    """The one-student benchmark grades each different hand-in once, gives its copies
    that result signed for them (so `grade` takes them as current, as grading them
    would), and times `grade --student X` through the CLI; it prints both figures."""
    samples = bench.sample_students()
    monkeypatch.setattr(bench, "sample_students", lambda assignment=bench.ASSIGNMENT: {
        name: samples[name] for name in ("ada_perfect", "dee_blank")})
    progress = io.StringIO()
    found = bench.run_one_student_bench(course=Course.at(), class_size=5, workers=1,
                                        progress=progress)
    assert found["class_size"] == 5 and found["student"] == "s002_ada_perfect"
    assert "grading the 2 different hand-ins of a class of 5" in progress.getvalue()
    assert 0 < found["one_student_seconds"] and 0 < found["class_reports_seconds"]
    lines = bench.format_one_student_report({**found, "one_student_seconds": 12.0})
    assert lines[0] == "a class of 5 hand-ins of 01_the_recipe"
    assert lines[2].endswith("12.0 s (target under 10 s)  MISSED")
