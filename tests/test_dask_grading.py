"""The grader on a real Dask cluster: a `dask scheduler` and two `dask worker`
processes over TCP, started here. A sample class grades to its expected scores there;
a worker killed with SIGKILL mid-run costs nobody a grade and grades nobody twice; a
worker that runs another version of the grader is refused before anything is sent.
(The LocalCluster path, the default, grades every sample class in test_grading.py.)"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from autograder.collect import collect
from autograder.course import EXAMPLES_DIR, Course
from autograder.engines import WorkerMismatch
from autograder.grade import RESULT_FILE, grade_assignment
from autograder.release import release
from autograder.runner import RunSettings
from conftest import REPO
from minicourse import ASSIGNMENT, handin, make_course

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


def _sample_course(root, assignment):
    course = Course(root)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / assignment, root / part / assignment)
    collect(course=course, assignment=assignment, source_path=EXAMPLES_DIR / assignment)
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
    assert got == expected


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

    from autograder import grade
    from autograder.engines import DaskEngine

    # The workers cannot import this test module: send the stand-in by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(grade, "grade_task", _grade_or_die)
    students = ["a", "b", "killer", "c", "d", "e"]
    done = {}
    with DaskEngine(workers=2, log=open(os.devnull, "w")) as engine:
        engine.run([_Task(s) for s in students],
                   on_done=lambda task, graded, error: done.setdefault(
                       task.student, (graded, error)))
    assert sorted(done) == sorted(students)
    graded, error = done["killer"]
    assert graded is None and type(error).__name__ == "KilledWorker"
    assert grade._failure_status(error) == "failed"
    for student in set(students) - {"killer"}:
        assert done[student] == ({"student_id": student, "status": "graded"}, None)
