"""Kill graders at many moments of a kernel's start-up; print what outlived them.

    python tests/grading/kill_hunt.py KILLS SCRATCH [SPREAD] -- GRADER COMMAND ...

This process becomes a child subreaper, so every process a killed grader
leaves behind is re-parented here instead of to init: after the last kill and
3 s of grace, whatever still descends from this process outlived its grader.
It prints one JSON object: {"kills": n, "survivors": [[pid, cmdline], ...],
"kernels_seen": n}, then kills the survivors so that nothing is left behind.

Each grader command is run with GRADER_SCRATCH set to a fresh folder. The
moment to kill is measured from when the grader's first child process
appears (the kernel's launcher, or a pool or Dask worker): the delays are
spread from 0 to SPREAD seconds (default 2), densest near 0, where the window between fork and the
sandbox's own parent-death signal is.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
GRACE_SECONDS = 3.0


def children(pid):
    """The direct children of `pid` (every thread's), or [] once it is gone."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def descendants(pid):
    found, todo = [], [pid]
    while todo:
        below = children(todo.pop())
        found += below
        todo += below
    return found


def alive(pid):
    """Running or sleeping: not gone, and not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"


def delays(kills, spread):
    """`kills` moments from 0 to `spread` s, half of them in the first 50 ms."""
    return [0.05 * (2 * i / kills) if i < kills // 2 else spread * (i / kills) ** 2
            for i in range(kills)]


def hunt(kills, scratch, command, *, spread=2.0):
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    seen = 0
    for number, delay in enumerate(delays(kills, spread)):
        env = {**os.environ, "GRADER_SCRATCH": str(Path(scratch) / f"run{number}")}
        grader = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not children(grader.pid) and grader.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.0005)
        seen += bool(children(grader.pid))
        time.sleep(delay)
        grader.kill()
        grader.wait()
    time.sleep(GRACE_SECONDS)
    me = os.getpid()
    survivors = [[pid, cmdline(pid)] for pid in descendants(me) if alive(pid)]
    print(json.dumps({"kills": kills, "survivors": survivors, "kernels_seen": seen}))
    for pid, _ in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    # reap them, so that they do not linger as zombies of this process
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


if __name__ == "__main__":
    split = sys.argv.index("--")
    hunt(int(sys.argv[1]), sys.argv[2], sys.argv[split + 1:],
         spread=float(sys.argv[3]) if split > 3 else 2.0)
