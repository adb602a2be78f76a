"""Where hand-ins are graded: on a Dask cluster (by default a LocalCluster of
single-threaded worker processes on this machine, or any cluster behind a scheduler
address), or on a local process pool, kept as the benchmark's baseline.

Both engines run a function they are given (grade.grade_task) on HandinTasks and
hand each outcome back to the caller, which alone writes results. A task carries
everything it needs (the hand-in's bytes, the notebooks, the policy, the settings),
so workers need no shared file system, only the same project and packages, which is
checked before any task is sent. At most a few tasks per worker are in flight, so
memory stays bounded however large the class.
"""

import ctypes
import hashlib
import importlib.metadata
import logging
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

_IN_FLIGHT_PER_WORKER = 3
# A LocalCluster's scheduler hands each single-threaded worker one hand-in at a time
# (Dask's default hands it a second one to queue): a worker that dies counts a death
# against every hand-in it holds, so a hand-in that kills its worker would take the
# one queued behind it down with it. The rest spares the hand-ins' cores the
# bookkeeping that is meant for short tasks: no stack sampling every 10 ms for the
# dashboard's profile, no work stealing (nothing waits on a worker to be stolen),
# and event loops that check their health, memory and load less often.
_LOCAL_CLUSTER_CONFIG = {"distributed.scheduler.worker-saturation": 1.0,
                         "distributed.scheduler.work-stealing": False,
                         "distributed.worker.profile.enabled": False,
                         "distributed.worker.memory.monitor-interval": "1s",
                         "distributed.admin.tick.interval": "500ms",
                         "distributed.admin.system-monitor.interval": "2s"}
_PR_SET_PDEATHSIG = 1
# What a worker must share with the client, besides the project's own code.
_PACKAGES = ("numpy", "torch", "nbgrader", "nbclient", "nbformat", "nbconvert",
             "ipykernel", "jupyter_client", "dask", "distributed", "triton")


class WorkerMismatch(RuntimeError):
    """A worker runs another version of the project or its packages."""


def project_fingerprint():
    """{"project": hash of the grader's and checks' source, "python": version,
    package: version}: what a worker must match to grade like this machine."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in ("autograder", "normref"):
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and (path.suffix in (".py", ".json")
                                   and "examples" not in path.relative_to(root).parts):
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    found = {"project": digest.hexdigest(), "python": sys.version.split()[0]}
    for package in _PACKAGES:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = None
    return found


def mismatches(mine, theirs):
    """The differences between two fingerprints, as phrases."""
    return [f"{key} {theirs.get(key)} (here {mine.get(key)})"
            if key != "project" else "another version of the grader or its checks"
            for key in sorted(set(mine) | set(theirs)) if mine.get(key) != theirs.get(key)]


def warm_worker():
    """Load the judges (and torch) once per worker, before its first hand-in, so
    that this is not charged to a student's first cell."""
    from normref.checks import _registry

    _registry.check_names()
    return os.getpid()


def _arm_parent_death_signal():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # no prctl (not Linux)
        pass


def _die_with_parent(parent_pid):
    """A local worker dies when the process that started it dies: a worker left
    behind would go on using the machine for a result nobody will write."""
    _arm_parent_death_signal()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_dies_with_the_grader():
    """A Dask plugin that makes a LocalCluster's worker processes die with the grader
    (their nannies live in the grader's process; the kernels die with their worker)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class WorkerDiesWithGrader(WorkerPlugin):
        name = "die-with-the-grader"

        def setup(self, worker):
            _arm_parent_death_signal()

    return WorkerDiesWithGrader()


def _start_pool_worker(parent_pid):
    _die_with_parent(parent_pid)
    warm_worker()


class PoolEngine:
    """A local process pool of `workers` processes (the benchmark's baseline)."""

    def __init__(self, *, workers):
        self.workers = workers
        self.pool = ProcessPoolExecutor(max_workers=workers, initializer=_start_pool_worker,
                                        initargs=(os.getpid(),))

    def run(self, tasks, *, work, on_done):
        """Run work(task) for each of `tasks` (an iterable) in the pool; on_done(task,
        result, error) is called in this process as each finishes."""
        tasks = iter(tasks)
        running = {}

        def refill():
            while len(running) < self.workers * _IN_FLIGHT_PER_WORKER:
                task = next(tasks, None)
                if task is None:
                    return
                running[self.pool.submit(work, task)] = task

        refill()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                task = running.pop(future)
                try:
                    graded = future.result()
                except Exception as exc:  # noqa: BLE001 - a worker's crash is one student's
                    on_done(task, None, exc)
                else:
                    on_done(task, graded, None)
            refill()

    def close(self):
        self.pool.shutdown(cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def engine_for(name, *, workers, scheduler=None, log=sys.stderr):
    """The engine called `name`: "dask" (a LocalCluster, or the cluster at
    `scheduler`) or "pool"."""
    if name == "dask":
        return DaskEngine(workers=workers, scheduler=scheduler, log=log)
    if name == "pool":
        return PoolEngine(workers=workers)
    raise ValueError(f"unknown engine {name!r}: dask or pool")


def _bokeh_available():
    try:
        importlib.metadata.version("bokeh")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


class DaskEngine:
    """A Dask client, on a LocalCluster of `workers` single-threaded processes or on
    the cluster at `scheduler`; refuses workers that differ from this machine."""

    def __init__(self, *, workers, scheduler=None, log=sys.stderr):
        import dask
        from dask.distributed import Client, LocalCluster

        self.cluster = None
        if scheduler:
            self.client = Client(scheduler, timeout="30s")
        else:
            with dask.config.set(_LOCAL_CLUSTER_CONFIG):  # nannies pass it to workers
                self.cluster = LocalCluster(
                    # ":0": a free port, never a fixed one that another Dask on this
                    # machine may hold (without bokeh it serves a page saying so)
                    n_workers=workers, threads_per_worker=1, processes=True,
                    dashboard_address=":0", silence_logs=logging.CRITICAL,
                    worker_dashboard_address=None)
            self.client = Client(self.cluster)
        try:
            if self.cluster is not None:
                self.client.register_plugin(_worker_dies_with_the_grader())
            dashboard = self.client.dashboard_link if _bokeh_available() else None
            where = scheduler or "a LocalCluster on this machine"
            print(f"Dask: {where}; dashboard {dashboard or '(install bokeh to see it)'}",
                  file=log, flush=True)
            if scheduler:
                self.warn_about_queuing(log)
            self.check_workers()
            self.client.run(warm_worker)
        except BaseException:
            self.close()
            raise

    def warn_about_queuing(self, log):
        """Say so if the scheduler hands a worker more hand-ins than it runs at once
        (see _LOCAL_CLUSTER_CONFIG): they would share the fate of a hand-in that kills it."""
        saturation = self.client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.WORKER_SATURATION)
        if saturation > 1.0:
            print(f"Dask: this scheduler queues hand-ins on workers (worker-saturation "
                  f"{saturation}), so a hand-in that kills its worker counts a death "
                  "against those queued behind it too; start the scheduler with "
                  "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION=1.0", file=log, flush=True)

    def check_workers(self):
        mine = project_fingerprint()
        theirs = self.client.run(project_fingerprint)
        if not theirs:
            raise WorkerMismatch("the Dask cluster has no workers")
        wrong = {worker: mismatches(mine, found) for worker, found in theirs.items()
                 if found != mine}
        if wrong:
            lines = [f"{worker}: {', '.join(problems)}" for worker, problems in wrong.items()]
            raise WorkerMismatch(
                "refused: these Dask workers run another version than this machine, so "
                "they could grade differently; install the same project and packages "
                "there (pip install -r requirements-dev.txt && pip install -e .):\n  "
                + "\n  ".join(lines))
        return len(theirs)

    @property
    def workers(self):
        return len(self.client.scheduler_info().get("workers", {})) or 1

    def run(self, tasks, *, work, on_done):
        """Run work(task) (a function workers can import) for each of `tasks`;
        on_done(task, result, error) is called here as each finishes. A task whose
        worker died is retried on another one by the scheduler; one that kills workers
        again and again comes back with an error (KilledWorker), as its own failure."""
        from dask.distributed import as_completed

        tasks = iter(tasks)
        window = self.workers * _IN_FLIGHT_PER_WORKER
        running = {}

        def submit():
            task = next(tasks, None)
            if task is None:
                return None
            key = f"grade-{task.assignment}-{task.student}-{os.urandom(4).hex()}"
            future = self.client.submit(work, task, key=key, pure=False)
            running[future.key] = task
            return future

        first = [f for f in (submit() for _ in range(window)) if f is not None]
        pending = as_completed(first)
        for future in pending:
            task = running.pop(future.key)
            try:
                graded = future.result()
            except Exception as exc:  # noqa: BLE001 - one hand-in's failure is its own
                on_done(task, None, exc)
            else:
                on_done(task, graded, None)
            future.release()
            more = submit()
            if more is not None:
                pending.add(more)

    def close(self):
        # Closing drops the workers' connections: that is expected, not worth a traceback.
        quiet = logging.getLogger("distributed")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        finally:
            quiet.setLevel(level)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
