"""What ties a sandbox's processes to the life of the grader that started them.

A hand-in's kernel must end with the process that started it (the grader, or
a Dask worker), however that process dies: SIGKILL, the OOM killer, a lost
worker. Two programs here do it, each run as `python -I -S lifeline.py ...`
so that they start in milliseconds and import only the standard library.

    lifeline.py launch GRADER_PID [CGROUP_DIR ...] -- COMMAND ...

The first program of every sandboxed kernel. bwrap's --die-with-parent arms
the parent-death signal only once bwrap runs, a few milliseconds after the
fork: a grader killed in that window left the sandbox running for ever. The
launcher arms the signal first, then checks that its parent is still
GRADER_PID (if the grader died before the signal was armed, the check sees
it and the launcher exits; if it dies after, the signal fires), joins the
run's cgroups and execs the rest of the command, which keeps the signal.

    lifeline.py reap GROUP_NAME_PREFIX CGROUP_PARENT ...

One per grading process, started with the first cgroup it makes, in a
session of its own so that nothing aimed at the grader reaches it, and not
as its child (it forks and its first process exits). It waits
for its standard input to close, which happens when the grader exits or is
killed, and then kills every process in the grader's cgroups and removes
them. This covers what the parent-death signal cannot: bwrap's own inner
process arms its signal after bwrap forks it, and a grader killed in that
window orphans it; so do processes a hand-in starts in a new session.
"""

import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
GRADER_GONE = 70  # the launcher's exit status when the grader died before the kernel started
_KILL_ROUNDS = 20


def die_with(parent_pid):
    """Arm SIGKILL on the parent's death; exit at once if the parent is already gone."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent_pid:
        os._exit(GRADER_GONE)


def join_groups(group_dirs):
    """Move this process into each control group (its children follow it)."""
    for group in group_dirs:
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))


def kill_groups(group_dirs):
    """Kill every process in these control groups, then remove the groups."""
    kill_processes_in(group_dirs)
    for group in group_dirs:
        try:
            os.rmdir(group)
        except OSError:
            pass


def kill_processes_in(group_dirs):
    """Kill every process in these control groups, again until none is left
    (a process may fork while the others are killed), at most 20 rounds."""
    for _ in range(_KILL_ROUNDS):
        pids = set()
        for group in group_dirs:
            try:
                with open(os.path.join(group, "cgroup.procs")) as procs:
                    pids |= {int(p) for p in procs.read().split()}
            except OSError:
                pass
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)


def groups_named(prefix, parents):
    """The control groups under `parents` whose names start with `prefix`."""
    found = []
    for parent in parents:
        try:
            found += [os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(prefix)]
        except OSError:
            pass
    return found


def launch(argv):
    split = argv.index("--")
    parent_pid, group_dirs, command = int(argv[0]), argv[1:split], argv[split + 1:]
    die_with(parent_pid)
    join_groups(group_dirs)
    os.execvp(command[0], command)


def reap(argv):
    prefix, parents = argv[0], argv[1:]
    # Leave the grader's children at once: nothing the grader counts or waits for
    # (a check's census of the kernel's processes, a pool's workers) sees the reaper.
    if os.fork():
        os._exit(0)
    while sys.stdin.buffer.read(65536):  # nothing is ever written: this waits for the end
        pass
    kill_groups(groups_named(prefix, parents))


if __name__ == "__main__":
    {"launch": launch, "reap": reap}[sys.argv[1]](sys.argv[2:])
