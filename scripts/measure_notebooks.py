"""Run every lesson and source notebook once and print its wall time and the
kernel's peak memory (resident set size), for the course's 60 s / 1.5 GB budget.

Usage: .venv/bin/python scripts/measure_notebooks.py [NOTEBOOK ...]
The figures depend on the machine and its load: compare them side by side in
one run, not across runs.
"""

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import psutil
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent


def _peak_rss_of(pid, stop, peak):
    while not stop.is_set():
        try:
            process = psutil.Process(pid)
            rss = process.memory_info().rss + sum(
                child.memory_info().rss for child in process.children(recursive=True))
            peak[0] = max(peak[0], rss)
        except psutil.Error:
            pass
        time.sleep(0.05)


def measure(path):
    """(seconds, peak kernel RSS in bytes) for one top-to-bottom run of `path`."""
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        # a copy of the notebook's folder: lessons read data/ beside them, and may write
        shutil.copytree(Path(path).parent, scratch, dirs_exist_ok=True)
        client = NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": scratch}})
        stop, peak = threading.Event(), [0]
        started = time.monotonic()
        with client.setup_kernel():
            pid = client.km.provisioner.process.pid
            watcher = threading.Thread(target=_peak_rss_of, args=(pid, stop, peak))
            watcher.start()
            try:
                for index, cell in enumerate(nb.cells):
                    client.execute_cell(cell, index)
            finally:
                stop.set()
                watcher.join()
        return time.monotonic() - started, peak[0]


def main(paths):
    paths = [Path(p) for p in paths] or sorted(
        list((REPO / "notebooks").glob("*.ipynb")) + list((REPO / "source").glob("*/*.ipynb")))
    print(f"{'notebook':<58} {'seconds':>8} {'peak MB':>8}")
    for path in paths:
        seconds, peak = measure(path)
        name = str(path.resolve().relative_to(REPO))
        print(f"{name:<58} {seconds:>8.1f} {peak / 2**20:>8.0f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
