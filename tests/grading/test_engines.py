"""The grader on a real Dask cluster: a `dask scheduler` and two `dask worker`
processes over TCP, started here. A sample class grades to its expected scores there;
a worker killed with SIGKILL mid-run costs nobody a grade and grades nobody twice; a
worker that runs another version of the grader is refused before anything is sent.
(The LocalCluster path, the default, grades every sample class in test_grading.py.)
"""

import ctypes
import hashlib
import importlib.metadata
import inspect
import io
import json
import logging
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from autograder.authoring.release import release
from autograder.course import EXAMPLES_DIR, Course
from autograder.grading import engines
from autograder.grading.engines import DaskEngine, PoolEngine, WorkerMismatch
from autograder.grading.grade import RESULT_FILE, grade_assignment
from autograder.grading.runner import RunSettings
from autograder.term.collect import collect
from conftest import REPO, FlushCounter
from minicourse import ASSIGNMENT, handin, make_course
from normref.checks import _registry

DASK = str(Path(sys.executable).parent / "dask")
SETTINGS = RunSettings(cell_timeout=30, handin_timeout=120)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_workers(address, count, timeout=120):
    from dask.distributed import Client

    with Client(address, timeout="60s") as client:
        client.wait_for_workers(count, timeout=timeout)


class Cluster:
    """A scheduler and named workers, each its own process (no nanny: a killed
    worker stays dead, and its tasks must go elsewhere)."""

    def __init__(self, tmp_path):
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.tmp_path = tmp_path
        self.processes = {}
        port = self.address.rsplit(":", 1)[1]
        # as the README starts one: one hand-in at a time per worker
        self._start("scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", port,
                                  "--no-dashboard"],
                    env={**os.environ, "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "1.0"})

    def _start(self, name, command, env=None):
        log = open(self.tmp_path / f"{name}.log", "w")
        self.processes[name] = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp_path,
            env=env or os.environ.copy(), start_new_session=True)

    def add_worker(self, name, env=None):
        self._start(name, [DASK, "worker", self.address, "--nthreads", "1", "--no-nanny",
                           "--no-dashboard", "--name", name], env=env)

    def kill(self, name):
        self.processes[name].send_signal(signal.SIGKILL)

    def close(self):
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path):
    found = Cluster(tmp_path)
    try:
        yield found
    finally:
        found.close()


# Three of the sample class (full marks, a blank and a flagged cheat): the whole class
# grades to its expected scores in the demo's test; here the cluster is what is tested.
CLUSTER_CLASS = ("ada_perfect", "dee_blank", "hal_cheats")


def _sample_course(root, assignment):
    course = Course(root)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / assignment, root / part / assignment)
    inbox = root / "inbox"
    inbox.mkdir()
    for name in CLUSTER_CLASS:
        shutil.copy(EXAMPLES_DIR / assignment / f"{name}.ipynb", inbox / f"{name}.ipynb")
    collect(course=course, assignment=assignment, source_path=inbox)
    return course


def test_a_sample_class_grades_to_its_expected_scores_on_a_cluster(cluster, tmp_path):
    for name in ("w1", "w2"):
        cluster.add_worker(name)
    _wait_for_workers(cluster.address, 2)
    assignment = "01_the_recipe"
    course = _sample_course(tmp_path / "course", assignment)
    results = grade_assignment(course=course, assignment=assignment, settings=SETTINGS,
                               scheduler=cluster.address)
    expected = json.loads((EXAMPLES_DIR / assignment / "expected.json").read_text())
    got = {r["student_id"]: {c["grade_id"]: c["points"] for c in r["cells"]}
           for r in results}
    assert got == {name: expected[name] for name in CLUSTER_CLASS}


def _class_of(course, size):
    """`size` students: every third one wrong, the rest right."""
    folder = course.root / "handins"
    folder.mkdir()
    for i in range(size):
        body = "return x + 2" if i % 3 == 0 else "return x * 2"
        nbformat.write(handin(course, body), folder / f"s{i:02d}.ipynb")
    collect(course=course, assignment=ASSIGNMENT, source_path=folder)
    return {f"s{i:02d}": 0.0 if i % 3 == 0 else 2.0 for i in range(size)}


def test_a_worker_killed_mid_run_costs_no_grade_and_grades_nobody_twice(cluster, tmp_path):
    for name in ("w1", "w2"):
        cluster.add_worker(name)
    _wait_for_workers(cluster.address, 2)
    course = make_course(tmp_path / "course", REPO)
    release(course=course, log=open(os.devnull, "w"))
    expected = _class_of(course, 12)
    log = tmp_path / "progress.log"
    log.write_text("")
    outcome = {}

    def grade():
        with open(log, "w") as progress:
            try:
                outcome["results"] = grade_assignment(
                    course=course, assignment=ASSIGNMENT, settings=SETTINGS,
                    scheduler=cluster.address, progress=progress)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                outcome["error"] = exc

    runner = threading.Thread(target=grade)
    runner.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "[2/12]" not in log.read_text():
        time.sleep(0.2)
    cluster.kill("w1")  # mid-run: at most 2 of 12 done, hand-ins in flight on w1
    runner.join(timeout=600)
    assert "error" not in outcome, outcome.get("error")
    assert {r["student_id"]: r["score"] for r in outcome["results"]} == expected
    assert all(r["status"] == "graded" for r in outcome["results"])
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("[")]
    graded_once = sorted(ln.split("] ", 1)[1].split(":")[0] for ln in lines)
    assert graded_once == sorted(expected), "each student's result written exactly once"
    assert "worker-saturation" not in log.read_text()
    for student in expected:
        assert (course.autograded / student / ASSIGNMENT / RESULT_FILE).exists()


def test_a_worker_running_another_version_is_refused(cluster, tmp_path):
    other = tmp_path / "other-version"
    for package in ("autograder", "normref"):
        shutil.copytree(REPO / package, other / package,
                        ignore=shutil.ignore_patterns("__pycache__", "examples"))
    changed = other / "normref" / "checks" / "tolerances.py"
    changed.write_text(changed.read_text().replace('"float32": (1e-4, 1e-5)',
                                                   '"float32": (1e-2, 1e-3)'))
    cluster.add_worker("same")
    cluster.add_worker("older", env={**os.environ, "PYTHONPATH": str(other)})
    _wait_for_workers(cluster.address, 2)
    course = make_course(tmp_path / "course", REPO)
    release(course=course, log=open(os.devnull, "w"))
    _class_of(course, 2)
    with pytest.raises(WorkerMismatch, match="another version of the grader"):
        grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS,
                         scheduler=cluster.address)
    assert not list(course.autograded.glob(f"*/{ASSIGNMENT}/{RESULT_FILE}"))


class _Task:
    """What the engine needs of a task to name it; the stand-in grade_task reads `student`."""

    def __init__(self, student):
        self.assignment, self.student = ASSIGNMENT, student


def _grade_or_die(task):
    """A stand-in for grade_task: the hand-in of "killer" takes its worker down."""
    if task.student == "killer":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    return {"student_id": task.student, "status": "graded"}


def test_a_hand_in_that_kills_every_worker_it_meets_fails_alone(monkeypatch):
    """Dask retries the task of a worker that died; one that kills each worker it
    runs on comes back as KilledWorker (a `failed` result with its reason), and
    the hand-ins around it are graded."""
    import cloudpickle

    from autograder.grading import grade
    from autograder.grading.engines import DaskEngine

    # The workers cannot import this test module: send the stand-in by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    work = _grade_or_die
    students = ["a", "b", "killer", "c", "d", "e"]
    done = {}
    with DaskEngine(workers=2, log=open(os.devnull, "w")) as engine:
        engine.run([_Task(s) for s in students], work=work,
                   on_done=lambda task, graded, error: done.setdefault(
                       task.student, (graded, error)))
    assert sorted(done) == sorted(students)
    graded, error = done["killer"]
    assert graded is None and type(error).__name__ == "KilledWorker"
    assert grade._failure_status(error) == "failed"
    for student in set(students) - {"killer"}:
        assert done[student] == ({"student_id": student, "status": "graded"}, None)


# Where hand-ins are graded: the project's fingerprint, the process pool, Dask.

# Pool workers are forked from this process: load the judges before they are.
_registry.check_names()

_PR_GET_PDEATHSIG = 2


def _death_signal():
    """The signal this process gets when its parent dies (0: none)."""
    value = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG, ctypes.byref(value)) == 0
    return value.value


@pytest.fixture
def death_signal_restored():
    """This process's parent-death signal is unset for the test, then restored."""
    before = _death_signal()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(engines._PR_SET_PDEATHSIG, 0)
    yield
    libc.prctl(engines._PR_SET_PDEATHSIG, before)


class _Exited(Exception):
    pass


@pytest.fixture
def exits(monkeypatch):
    """os._exit, recorded instead of done."""
    codes = []

    def fake_exit(code):
        codes.append(code)
        raise _Exited(code)

    monkeypatch.setattr(os, "_exit", fake_exit)
    return codes


# --- the fingerprint ----------------------------------------------------------------------


def test_the_fingerprint_names_the_project_python_and_every_package():
    found = engines.project_fingerprint()
    assert set(found) == {"project", "python", *engines._PACKAGES}
    assert found["python"] == platform.python_version()
    for package in ("numpy", "torch", "dask", "distributed", "nbclient"):
        assert found[package] == importlib.metadata.version(package), package
    assert re.fullmatch(r"[0-9a-f]{64}", found["project"])
    assert engines.project_fingerprint() == found


def test_a_package_that_is_not_installed_is_none(monkeypatch):
    monkeypatch.setattr(engines, "_PACKAGES", ("numpy", "no-such-package-here"))
    found = engines.project_fingerprint()
    assert found["no-such-package-here"] is None
    assert found["numpy"] == importlib.metadata.version("numpy")


def _project(root, files):
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def _fingerprint_of(monkeypatch, root):
    monkeypatch.setattr(engines, "__file__", str(root / "autograder" / "grading" / "engines.py"))
    return engines.project_fingerprint()["project"]


FILES = {"autograder/grading/engines.py": b"engine", "autograder/b.py": b"bee",
         "normref/checks/t.json": b"{}", "normref/z.py": b"zed"}


def test_the_project_hash_is_the_sorted_sources_with_their_paths(monkeypatch, tmp_path):
    """The hash of each .py/.json file of autograder/ and normref/, path and bytes, in
    sorted order, so that two machines with the same sources agree whatever order
    their file systems list files in."""
    root = _project(tmp_path / "p", FILES)
    expected = hashlib.sha256()
    for name in sorted(FILES):
        expected.update(name.encode() + b"\0" + FILES[name] + b"\0")
    assert _fingerprint_of(monkeypatch, root) == expected.hexdigest()


def test_only_the_grader_s_and_checks_sources_count(monkeypatch, tmp_path):
    """Examples, other files and other folders may differ between machines."""
    plain = _fingerprint_of(monkeypatch, _project(tmp_path / "plain", FILES))
    other = _project(tmp_path / "other", {
        **FILES, "autograder/examples/e.py": b"x", "normref/examples/sample/e.json": b"x",
        "autograder/readme.md": b"x", "normref/checks/data.txt": b"x", "notes/n.py": b"x",
        "top.py": b"x"})
    (other / "normref" / "folder.py").mkdir()
    assert _fingerprint_of(monkeypatch, other) == plain


@pytest.mark.parametrize("change", [
    {"autograder/b.py": b"bee2"},
    {"normref/checks/t.json": b"{ }"},
    {"normref/new.py": b""},
    {"autograder/b.py": b"be", "normref/checks/t.json": b"e{}"},
])
def test_any_change_to_a_source_changes_the_hash(monkeypatch, tmp_path, change):
    plain = _fingerprint_of(monkeypatch, _project(tmp_path / "plain", FILES))
    assert _fingerprint_of(monkeypatch, _project(tmp_path / "changed",
                                                 {**FILES, **change})) != plain


def test_a_moved_source_changes_the_hash(monkeypatch, tmp_path):
    plain = _fingerprint_of(monkeypatch, _project(tmp_path / "plain", FILES))
    moved = dict(FILES)
    moved["autograder/c.py"] = moved.pop("autograder/b.py")
    assert _fingerprint_of(monkeypatch, _project(tmp_path / "moved", moved)) != plain


def test_mismatches_are_named_package_by_package():
    mine = {"project": "a", "python": "3.11.7", "torch": "2.1", "triton": None}
    theirs = {"project": "b", "python": "3.11.7", "torch": "2.2", "triton": None, "extra": "1"}
    assert engines.mismatches(mine, theirs) == [
        "extra 1 (here None)", "another version of the grader or its checks",
        "torch 2.2 (here 2.1)"]
    assert engines.mismatches(mine, dict(mine)) == []
    assert engines.mismatches({"numpy": "2"}, {}) == ["numpy None (here 2)"]


# --- workers that die with the grader -----------------------------------------------------


def test_arming_the_parent_death_signal_sets_sigkill(death_signal_restored):
    assert _death_signal() == 0
    engines._arm_parent_death_signal()
    assert _death_signal() == 9


@pytest.mark.parametrize("broken", [OSError("no libc"), SimpleNamespace()])
def test_without_prctl_arming_does_nothing(monkeypatch, broken):
    """Not Linux: no libc to load, or no prctl in it. Workers still start."""
    def cdll(*args, **kwargs):
        if isinstance(broken, Exception):
            raise broken
        return broken

    monkeypatch.setattr(engines.ctypes, "CDLL", cdll)
    assert engines._arm_parent_death_signal() is None


def _forget_judges(monkeypatch):
    """Unload the judges modules for this test (as in a fresh worker); restored after."""
    import normref.checks

    judges = sorted(name for name in sys.modules
                    if name.startswith("normref.checks.") and name.endswith("_judges"))
    assert judges
    for name in judges:
        monkeypatch.setattr(normref.checks, name.rsplit(".", 1)[1], sys.modules[name])
        monkeypatch.delitem(sys.modules, name)
    return judges


def test_a_worker_whose_parent_lives_arms_the_signal_and_goes_on(exits, death_signal_restored):
    engines._die_with_parent(os.getppid())
    assert exits == [] and _death_signal() == 9


def test_a_worker_whose_parent_already_died_exits(exits, death_signal_restored):
    """The parent died before prctl took effect: the worker leaves at once, status 1."""
    with pytest.raises(_Exited):
        engines._die_with_parent(os.getppid() + 100000)
    assert exits == [1]


def test_a_pool_worker_dies_with_its_parent_and_loads_the_judges(
        exits, death_signal_restored, monkeypatch):
    judges = _forget_judges(monkeypatch)
    engines._start_pool_worker(os.getppid())
    assert exits == [] and _death_signal() == 9
    assert all(name in sys.modules for name in judges)
    with pytest.raises(_Exited):
        engines._start_pool_worker(os.getppid() + 100000)


def test_warming_a_worker_loads_every_judge_and_names_the_worker(monkeypatch):
    """The judges (and torch) are loaded before the first hand-in, not during it."""
    judges = _forget_judges(monkeypatch)
    assert engines.warm_worker() == os.getpid()
    assert all(name in sys.modules for name in judges)


def test_the_dask_plugin_arms_the_signal_in_its_worker(death_signal_restored):
    from distributed.diagnostics.plugin import WorkerPlugin

    plugin = engines._worker_dies_with_the_grader()
    assert isinstance(plugin, WorkerPlugin)
    assert plugin.name == "die-with-the-grader"
    plugin.setup(worker=None)
    assert _death_signal() == 9


# --- choosing an engine -------------------------------------------------------------------


def test_an_engine_is_chosen_by_name(monkeypatch):
    """dask or pool by name, the Dask engine given the workers, the scheduler and the log
    (by default the standard error the module was imported under), any other refused."""
    made = []
    monkeypatch.setattr(engines, "DaskEngine", lambda **kw: made.append(kw) or "dask")
    log = io.StringIO()
    assert engines.engine_for("dask", workers=3, scheduler="tcp://h:1", log=log) == "dask"
    assert made == [{"workers": 3, "scheduler": "tcp://h:1", "log": log}]
    engines.engine_for("dask", workers=2)
    default_log = inspect.signature(engines.engine_for).parameters["log"].default
    assert made[1] == {"workers": 2, "scheduler": None, "log": default_log}
    with engines.engine_for("pool", workers=2) as pool:
        assert isinstance(pool, PoolEngine) and pool.workers == 2
    with pytest.raises(ValueError, match="unknown engine 'spark': dask or pool"):
        engines.engine_for("spark", workers=1)


def test_the_dashboard_needs_bokeh(monkeypatch):
    assert engines._bokeh_available() is True  # installed with the project's dev tools
    real = importlib.metadata.version

    def version(name):
        if name == "bokeh":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert engines._bokeh_available() is False


# --- the process pool ---------------------------------------------------------------------


def _pool_grade(task):
    """Stands in for grade.grade_task in a pool worker (forked: it sees this module)."""
    if task.fail:
        raise ValueError(f"cannot grade {task.student}")
    return {"student": task.student, "pid": os.getpid(), "parent": os.getppid(),
            "death_signal": _death_signal()}


def _tasks(n, fail=()):
    return [SimpleNamespace(student=f"s{i:02d}", assignment="a1", fail=i in fail)
            for i in range(n)]


class _Recorder:
    """The tasks as an iterator, and on_done: what came back, and how many tasks had
    been taken from the iterator at each answer."""

    def __init__(self, tasks):
        self.tasks, self.pulled, self.done = tasks, 0, []

    def __iter__(self):
        for task in self.tasks:
            self.pulled += 1
            yield task

    def on_done(self, task, graded, error):
        self.done.append((task, graded, error, self.pulled))

    def in_flight(self):
        return [pulled - k for k, (*_, pulled) in enumerate(self.done)]


def test_the_pool_grades_every_task_a_few_at_a_time(monkeypatch):
    """Each task is answered once; at most 3 per worker are in flight; a task that
    raises is its own failure; workers are this process's children, armed to die
    with it."""
    work = _pool_grade
    tasks = _tasks(8, fail={2})
    record = _Recorder(tasks)
    with PoolEngine(workers=1) as engine:
        engine.run(record, work=work, on_done=record.on_done)
    assert sorted(t.student for t, *_ in record.done) == [t.student for t in tasks]
    assert max(record.in_flight()) == 3 and record.in_flight()[0] == 3
    assert len({graded["pid"] for _, graded, _, _ in record.done if graded}) == 1
    for task, graded, error, _ in record.done:
        if task.fail:
            assert graded is None and isinstance(error, ValueError)
            assert str(error) == "cannot grade s02"
        else:
            assert error is None and graded["student"] == task.student
            assert graded["parent"] == os.getpid() and graded["pid"] != os.getpid()
            assert graded["death_signal"] == 9
    with pytest.raises(RuntimeError):
        engine.pool.submit(print)  # closed


def _gated_grade(task):
    """Finishes once the grader lets it (its `go` file exists), or after 5 s."""
    deadline = time.monotonic() + 5
    while not os.path.exists(task.go) and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"released": os.path.exists(task.go), "pid": os.getpid()}


def test_the_pool_answers_each_hand_in_as_soon_as_it_is_graded(monkeypatch, tmp_path):
    """Not batch by batch: here each task may finish only once the previous one's
    answer has reached on_done."""
    work = _gated_grade
    tasks = [SimpleNamespace(student=f"s{i}", go=str(tmp_path / f"go-{i}")) for i in range(6)]
    open(tasks[0].go, "w").close()
    done = []

    def on_done(task, graded, error):
        done.append((task.student, graded, error))
        index = tasks.index(task)
        if index + 1 < len(tasks):
            open(tasks[index + 1].go, "w").close()

    with PoolEngine(workers=1) as engine:
        engine.run(tasks, work=work, on_done=on_done)
    assert [student for student, *_ in done] == [t.student for t in tasks]
    assert all(error is None and graded["released"] for _, graded, error in done), done
    assert len({graded["pid"] for _, graded, _ in done}) == 1  # one worker, as asked


def _slow_grade(task):
    open(task.ran, "w").close()
    time.sleep(0.5)
    return {}


def test_a_grader_stopped_mid_class_drops_the_queued_hand_ins(monkeypatch, tmp_path):
    """Closing the pool cancels what no worker has taken yet (here: 8 sent to 3
    workers, which hold at most 3 running and 4 queued)."""
    work = _slow_grade

    def tasks():
        for i in range(8):
            yield SimpleNamespace(student=f"s{i}", ran=str(tmp_path / f"ran-{i}"))
        raise RuntimeError("the grader was stopped")

    with pytest.raises(RuntimeError, match="the grader was stopped"):
        with PoolEngine(workers=3) as engine:
            engine.run(tasks(), work=work, on_done=lambda *args: None)
    assert len(list(tmp_path.glob("ran-*"))) < 8


def test_the_pool_s_window_grows_with_its_workers(monkeypatch):
    work = _pool_grade
    record = _Recorder(_tasks(9))
    with PoolEngine(workers=2) as engine:
        engine.run(record, work=work, on_done=record.on_done)
    assert len(record.done) == 9
    assert record.in_flight()[0] == 6 and max(record.in_flight()) == 6


def test_the_pool_runs_nothing_for_no_tasks(monkeypatch):
    work = _pool_grade
    record = _Recorder([])
    with PoolEngine(workers=1) as engine:
        engine.run(record, work=work, on_done=record.on_done)
    assert record.done == []


# --- Dask ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dask_engine():
    log = io.StringIO()
    engine = DaskEngine(workers=1, log=log)
    engine.log = log
    try:
        yield engine
    finally:
        engine.close()


def test_the_local_cluster_is_one_checked_warmed_worker_that_dies_with_the_grader(
        dask_engine):
    """A LocalCluster of single-threaded worker processes, announced with its
    dashboard, checked, warmed (the judges loaded) and armed to die with the grader."""
    assert dask_engine.cluster is not None
    assert "dashboard" in dask_engine.cluster.scheduler.services
    log = dask_engine.log.getvalue()
    assert log.startswith("Dask: a LocalCluster on this machine; dashboard http"), log
    assert log.endswith("\n") and log.count("\n") == 1
    assert dask_engine.workers == 1
    (worker,) = dask_engine.client.scheduler_info()["workers"].values()
    assert worker["nthreads"] == 1
    found = dask_engine.client.run(lambda: (os.getpid(), _death_signal(), sorted(
        name for name in sys.modules
        if name.startswith("normref.checks.") and name.endswith("_judges"))))
    ((pid, signal, judges),) = found.values()
    assert pid != os.getpid() and signal == 9
    assert judges == sorted(name for name in sys.modules
                            if name.startswith("normref.checks.") and name.endswith("_judges"))
    plugins = dask_engine.client.run(lambda dask_worker: sorted(dask_worker.plugins))
    assert "die-with-the-grader" in next(iter(plugins.values()))
    assert dask_engine.check_workers() == 1
    # The dashboard the log links to is there, on a port the system chose: not
    # distributed's default 8787, which another Dask on this machine may hold.
    link = dask_engine.client.dashboard_link
    assert urllib.parse.urlsplit(link).port != 8787
    with urllib.request.urlopen(link, timeout=30) as page:
        assert page.status == 200 and b"Dask" in page.read()


def test_a_local_cluster_keeps_distributed_s_log_quiet_while_it_is_open():
    """Where distributed logs to a stream (its own logging config, or the instructor's),
    the cluster quiets it while it is open: a hand-in that kills a worker must not fill
    the grader's log with distributed's warnings."""
    stream = logging.StreamHandler(io.StringIO())
    logger = logging.getLogger("distributed")
    logger.addHandler(stream)
    try:
        with DaskEngine(workers=1, log=io.StringIO()):
            assert stream.level == logging.CRITICAL
        assert stream.level == logging.NOTSET
    finally:
        logger.removeHandler(stream)


def _dask_grade():
    """A stand-in for grade.grade_task, sent by value (workers cannot import tests)."""
    def grade_task(task):
        from distributed import get_worker

        if task.fail:
            raise ValueError(f"cannot grade {task.student}")
        return {"student": task.student, "key": get_worker().get_current_task()}
    return grade_task


def test_dask_grades_every_task_three_at_a_time(dask_engine, monkeypatch):
    """Each task is answered once, under a key that names it; at most 3 per worker in
    flight; a task that raises is its own failure; finished tasks are released."""
    work = _dask_grade()
    tasks = _tasks(7, fail={1}) + [SimpleNamespace(student="s00", assignment="a1",
                                                   fail=False)]
    record = _Recorder(tasks)
    held = []

    def on_done(task, graded, error):
        held.append(len(dask_engine.client.futures))
        record.on_done(task, graded, error)

    dask_engine.run(record, work=work, on_done=on_done)
    assert sorted(t.student for t, *_ in record.done) == sorted(t.student for t in tasks)
    assert record.in_flight() == [3, 3, 3, 3, 3, 3, 2, 1]
    keys = []
    for task, graded, error, _ in record.done:
        if task.fail:
            assert graded is None and isinstance(error, ValueError)
            assert str(error) == "cannot grade s01"
        else:
            assert error is None and graded["student"] == task.student
            assert re.fullmatch(rf"grade-a1-{task.student}-[0-9a-f]{{8}}", graded["key"])
            keys.append(graded["key"])
    assert len(set(keys)) == 7  # the same student twice: two tasks, two keys
    # the task in hand and the two still in flight: none of those already handled
    assert max(held[3:]) <= 3, held


def test_dask_runs_nothing_for_no_tasks(dask_engine, monkeypatch):
    work = _dask_grade()
    record = _Recorder([])
    dask_engine.run(record, work=work, on_done=record.on_done)
    assert record.done == []


def test_a_cluster_behind_a_scheduler_is_used_not_made(dask_engine, monkeypatch):
    """--scheduler: the engine connects, checks and counts that cluster's workers
    (not the `workers` asked for), asks whether its scheduler queues hand-ins (told in
    the engine's log), and closing it leaves the cluster running."""
    log = io.StringIO()
    address = dask_engine.cluster.scheduler_address
    asked = []
    real_warn = DaskEngine.warn_about_queuing
    monkeypatch.setattr(DaskEngine, "warn_about_queuing",
                        lambda self, to: asked.append(to) or real_warn(self, to))
    with DaskEngine(workers=5, scheduler=address, log=log) as engine:
        assert asked == [log]
        assert engine.cluster is None
        assert engine.client.scheduler.address == address
        assert engine.workers == 1
        assert log.getvalue().startswith(f"Dask: {address}; dashboard http"), log.getvalue()
    assert engine.client.status == "closed"
    assert dask_engine.client.status == "running"
    assert dask_engine.workers == 1


def test_without_bokeh_the_log_says_how_to_get_the_dashboard(dask_engine, monkeypatch):
    monkeypatch.setattr(engines, "_bokeh_available", lambda: False)
    log = io.StringIO()
    address = dask_engine.cluster.scheduler_address
    with DaskEngine(workers=1, scheduler=address, log=log):
        pass
    assert log.getvalue() == f"Dask: {address}; dashboard (install bokeh to see it)\n"


def test_workers_running_another_version_are_refused_before_anything_is_sent(
        dask_engine, monkeypatch):
    """The engine fails to start, names the worker and what differs, and closes its
    client."""
    here, real = os.getpid(), engines.project_fingerprint

    def fingerprint():
        found = real()
        return found if os.getpid() == here else {**found, "project": "other"}

    monkeypatch.setattr(engines, "project_fingerprint", fingerprint)
    made = []
    real_close = DaskEngine.close
    monkeypatch.setattr(DaskEngine, "close", lambda self: made.append(self) or real_close(self))
    with pytest.raises(WorkerMismatch, match="another version of the grader"):
        DaskEngine(workers=1, scheduler=dask_engine.cluster.scheduler_address,
                   log=io.StringIO())
    (engine,) = made
    assert engine.client.status == "closed"


class _FakeClient:
    """What check_workers and workers ask of a Dask client."""

    def __init__(self, fingerprints):
        self.fingerprints = fingerprints

    def run(self, function):
        return dict(self.fingerprints)

    def scheduler_info(self):
        return {"workers": dict(self.fingerprints)}


def _engine(fingerprints):
    engine = object.__new__(DaskEngine)
    engine.client, engine.cluster = _FakeClient(fingerprints), None
    return engine


def test_check_workers_names_each_wrong_worker_and_what_differs():
    mine = engines.project_fingerprint()
    other = {**mine, "torch": "0.1", "project": "x"}
    older = {**mine, "numpy": "1.0"}
    engine = _engine({"tcp://a:1": mine, "tcp://b:2": other, "tcp://c:3": dict(mine),
                      "tcp://d:4": older})
    with pytest.raises(WorkerMismatch) as caught:
        engine.check_workers()
    assert str(caught.value) == (
        "refused: these Dask workers run another version than this machine, so they "
        "could grade differently; install the same project and packages there (pip "
        "install -r requirements-dev.txt && pip install -e .):\n"
        f"  tcp://b:2: another version of the grader or its checks, torch 0.1 "
        f"(here {mine['torch']})\n"
        f"  tcp://d:4: numpy 1.0 (here {mine['numpy']})")
    assert _engine({"tcp://a:1": mine, "tcp://c:3": dict(mine)}).check_workers() == 2


def test_a_cluster_without_workers_is_refused():
    with pytest.raises(WorkerMismatch, match="^the Dask cluster has no workers$"):
        _engine({}).check_workers()


def test_a_cluster_with_no_workers_yet_counts_as_one():
    """Sizing the tasks in flight needs at least one worker."""
    assert _engine({}).workers == 1
    assert _engine({"a": {}, "b": {}, "c": {}}).workers == 3


def test_closing_quiets_distributed_only_while_it_closes():
    """The workers' dropped connections are not logged; the level is restored after."""
    logger = logging.getLogger("distributed")
    before = logger.level
    levels = []

    class Closing:
        def close(self):
            levels.append(logger.level)

    engine = object.__new__(DaskEngine)
    engine.client, engine.cluster = Closing(), Closing()
    logger.setLevel(logging.INFO)
    try:
        engine.close()
        assert levels == [logging.CRITICAL, logging.CRITICAL]
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(before)
    engine.cluster = None
    engine.close()
    assert len(levels) == 3


class _Scheduler:
    def __init__(self, saturation):
        self.WORKER_SATURATION = saturation


@pytest.mark.parametrize(("saturation", "warned"), [(1.1, True), (float("inf"), True),
                                                      (1.0, False)])
def test_a_scheduler_that_queues_hand_ins_on_workers_is_named(saturation, warned):
    """A hand-in queued on a worker behind one that kills it would share its deaths:
    the grader says how to start the scheduler so that it does not."""
    engine = _engine({})
    engine.client.run_on_scheduler = lambda function: function(
        dask_scheduler=_Scheduler(saturation))
    log = io.StringIO()
    engine.warn_about_queuing(log)
    if warned:
        assert log.getvalue() == (
            f"Dask: this scheduler queues hand-ins on workers (worker-saturation "
            f"{saturation}), so a hand-in that kills its worker counts a death against "
            "those queued behind it too; start the scheduler with "
            "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0\n")
    else:
        assert log.getvalue() == ""


def test_the_local_cluster_hands_each_worker_one_hand_in_at_a_time(dask_engine):
    """Its scheduler runs with worker-saturation 1.0, and a client of it is not warned."""
    assert dask_engine.client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.WORKER_SATURATION) == 1.0
    log = io.StringIO()
    with DaskEngine(workers=1, scheduler=dask_engine.cluster.scheduler_address, log=log):
        pass
    assert "worker-saturation" not in log.getvalue()
    assert log.getvalue().startswith(f"Dask: {dask_engine.cluster.scheduler_address};")


def test_the_queuing_warning_is_flushed_at_once():
    """The warning is out before the class is graded, whatever the log's buffering."""
    engine = _engine({})
    engine.client.run_on_scheduler = lambda function: function(
        dask_scheduler=_Scheduler(2.0))
    log = FlushCounter()
    engine.warn_about_queuing(log)
    assert log.flushed and log.flushed[-1] == log.getvalue()
    assert "worker-saturation 2.0" in log.getvalue()


class _FakeDaskClient:
    """A client of a remote scheduler with one worker like this machine (in-process)."""

    made = []
    dashboard_link = "http://h:8787/status"

    def __init__(self, address, *, timeout):
        self.made.append((address, timeout))

    def run(self, function):
        return {"tcp://w:1": function()}

    def run_on_scheduler(self, function):
        return function(dask_scheduler=_Scheduler(1.0))

    def close(self):
        pass


def test_connecting_to_a_scheduler_gives_up_after_30_s_and_announces_it_at_once(monkeypatch):
    """--scheduler: the client waits at most 30 s for it; the announcement is flushed
    before any hand-in is graded."""
    import dask.distributed

    monkeypatch.setattr(dask.distributed, "Client", _FakeDaskClient)
    monkeypatch.setattr(_FakeDaskClient, "made", [])
    log = FlushCounter()
    with DaskEngine(workers=1, scheduler="tcp://h:1", log=log) as engine:
        assert engine.cluster is None
    assert _FakeDaskClient.made == [("tcp://h:1", "30s")]
    assert log.getvalue() == "Dask: tcp://h:1; dashboard http://h:8787/status\n"
    assert log.flushed and log.flushed[-1] == log.getvalue()
