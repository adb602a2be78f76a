"""A grader that dies, however and whenever, leaves no student code running.

The kernel of a hand-in must end with the process that started it: a killed
grader (SIGKILL, the OOM killer, a lost Dask worker) must not leave a sandbox
running with no time limit. And a grader that could not clean up (the
machine's cgroups still hold its sandboxes) is cleaned up after by the next.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.grading import sandbox

HUNTER = Path(__file__).with_name("kill_hunt.py")

# The smallest grading run: one hand-in's kernel, started the way grade starts it.
ONE_KERNEL = """
import os, nbformat
from autograder.grading.runner import RunSettings, run_notebook
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time; time.sleep(30)")])
run_notebook(nb, workdir=os.environ["GRADER_SCRATCH"], settings=RunSettings(), cell_checks={})
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_a_grader_killed_at_any_moment_of_kernel_start_up_leaves_nothing_running(
        tmp_path, venv_env):
    """50 graders, each killed at a moment from 0 to 2 s after its kernel's first
    process appears (half of them in the first 50 ms, where the fork and the
    sandbox's own parent-death signal are): not one of their processes may be
    alive 3 s after the last kill."""
    grader = tmp_path / "grader.py"
    grader.write_text(ONE_KERNEL)
    hunt = subprocess.run(
        [sys.executable, str(HUNTER), "50", str(tmp_path / "runs"), "--",
         sys.executable, str(grader)],
        env=venv_env, capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(hunt.stdout)
    assert report["kernels_seen"] == 50, "a grader ended before it started its kernel"
    assert report["survivors"] == [], "processes outlived their killed grader"


def _writable_pids_cgroup():
    return sandbox._cgroup_v1_dir("pids")  # None unless this process may write it


def _sleeper_in_group(parent, name):
    group = parent / name
    group.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    (group / "cgroup.procs").write_text(str(sleeper.pid))
    return group, sleeper


@pytest.mark.skipif(_writable_pids_cgroup() is None,
                    reason="needs a writable cgroup-v1 pids controller (grading as root)")
def test_grade_ends_the_sandboxes_of_a_grader_that_died_and_no_others(tmp_path, venv_env):
    parent = _writable_pids_cgroup()
    me, my_start = os.getpid(), sandbox.process_start_time(os.getpid())
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1  # no process has it
    dead_grader = _sleeper_in_group(parent, f"autograder-{gone}-12345-grade-x")
    pid_reused = _sleeper_in_group(parent, f"autograder-{me}-{my_start + 1}-grade-y")
    live_grader = _sleeper_in_group(parent, f"autograder-{me}-{my_start}-grade-z")
    try:
        (tmp_path / "source" / "01_x").mkdir(parents=True)
        done = subprocess.run(
            [sys.executable, "-m", "autograder", "grade", "01_x", "--course", str(tmp_path)],
            env=venv_env, capture_output=True, text=True, timeout=120)
        # A grader started beside this test (another test worker) may end them first:
        # then this one says nothing. What must hold is that they end and the live
        # grader's sandbox does not.
        said = re.findall(r"ended (\d+) sandbox\(es\) left running by an earlier grader "
                          r"that died", done.stderr)
        assert said in ([], ["1"], ["2"]), done.stderr
        for group, sleeper in (dead_grader, pid_reused):
            assert sleeper.wait(timeout=10) == -signal.SIGKILL
            assert not group.exists()
        time.sleep(0.2)
        assert live_grader[1].poll() is None, "a live grader's sandbox was ended"
        assert live_grader[0].exists()
    finally:
        for group, sleeper in (dead_grader, pid_reused, live_grader):
            sleeper.kill()
            sleeper.wait()
            if group.exists():
                group.rmdir()
