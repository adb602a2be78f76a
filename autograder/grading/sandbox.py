"""The box every process that runs student code lives in.

bubblewrap gives the kernel no network, a read-only view of the system, no
view of the course (source/, the gradebook, other students' hand-ins,
normref's code, the grader's key) and a size-limited tmpfs as its home, cwd
and /tmp. The only host folder it can write to is the run's link folder (the
kernel's sockets), and only until the kernel is up: the runner then closes it
(`close_link_dir`).

The kernel is never root and holds no capabilities. When the grader runs as
root, bwrap sets up the mounts and `setpriv` drops the kernel to uid/gid
of its own (one per run, see new_run_uid) with empty
capability sets and no-new-privs before it starts, so the
kernel is an ordinary unprivileged user on the host: it cannot mount,
unmount, remount, ptrace the grader or read files that are not
world-readable, and a user namespace it makes for itself cannot uncover the
locked mounts. When the grader is not root, bwrap's own user namespace maps
the kernel to uid 65534 with no capabilities and forbids further user
namespaces. prlimit and a cgroup (where writable) cap memory, processes, CPU,
file size and open files. Where bwrap is missing, the limits still apply and a
loud warning says the rest does not.
"""

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from autograder.grading import lifeline
from normref.checks import _runner

SANDBOX_UID = SANDBOX_GID = 65534  # inside bwrap's user namespace (grader not root)
_FIRST_RUN_UID = 1_000_000  # grader is root: one uid per run, see new_run_uid()
_runs_started = itertools.count()
HOME_IN_SANDBOX = "/tmp"

# What of normref the sandbox sees: the client half of the checks, no references.
_CLIENT_FILES = ["normref/checks/__init__.py", "normref/checks/_runner.py",
                 "normref/checks/_wire.py"]
_HIDDEN_TMPFS_BYTES = 1024 * 1024
_GROUP_PREFIX = "autograder-"  # then the owner's pid and start time, see end_orphaned_sandboxes
_CONTROLLERS = ("pids", "memory")


@dataclass(frozen=True)
class Limits:
    """Resource limits for one hand-in's kernel (defaults fit a torch import).

    scratch_bytes: the size of the kernel's writable tmpfs (home, cwd, /tmp).
    """

    memory_bytes: int = 2 * 1024**3
    cpu_seconds: int = 600
    processes: int = 512
    file_bytes: int = 64 * 1024**2
    open_files: int = 1024
    scratch_bytes: int = 256 * 1024**2


class ResourceGroup:
    """A control group that holds one kernel and every process it starts.

    Where the machine lets us write cgroups (v1 `pids` and `memory`
    controllers, or a v2 hierarchy), the group caps the number of processes and
    the real memory (RLIMIT_NPROC counts every process of the sandbox's uid,
    and RLIMIT_AS counts address space, not memory), and lets the grader kill
    every process the hand-in left behind, and this process's reaper kill them
    all if this process dies first (see lifeline). Elsewhere it does nothing
    and the rlimits stand alone.
    """

    def __init__(self, label, limits):
        """label: what tells this run's group from the others of this process."""
        self.name = f"{_owner_prefix()}{label}"
        self.dirs = []
        settings_of = {"pids": {"pids.max": limits.processes},
                       "memory": {"memory.limit_in_bytes": limits.memory_bytes,
                                  "memory.memsw.limit_in_bytes": limits.memory_bytes}}
        for controller in _CONTROLLERS:
            settings = settings_of[controller]
            parent = _cgroup_v1_dir(controller)
            if parent is None:
                continue
            group = parent / self.name
            try:
                group.mkdir()
                for key, value in settings.items():
                    target = group / key
                    if target.exists():
                        target.write_text(str(value))
                self.dirs.append(group)
            except OSError:
                self._remove(group)
        if self.dirs:
            _start_reaper()

    def launcher(self):
        """The command prefix every kernel starts behind (see lifeline): it
        dies with this process, however this process dies, then joins the group."""
        return [sys.executable, "-I", "-S", lifeline.__file__, "launch", str(os.getpid()),
                *map(str, self.dirs), "--"]

    def kill_all(self):
        """Kill every process still in the group, then remove the group."""
        lifeline.kill_processes_in(self.dirs)
        for group in self.dirs:
            self._remove(group)

    @staticmethod
    def _remove(group):
        try:
            group.rmdir()
        except OSError:
            pass


def _owner_prefix():
    """How the names of this process's groups begin: its pid and start time."""
    return f"{_GROUP_PREFIX}{os.getpid()}-{process_start_time(os.getpid())}-"


_reaper = {}  # pid of the grading process -> its end of the reaper's pipe (one per process)


def _start_reaper():
    """Once per process: the reaper that ends its sandboxes when it dies (see lifeline)."""
    if os.getpid() in _reaper:
        return
    parents = [str(p) for p in map(_cgroup_v1_dir, _CONTROLLERS) if p is not None]
    # Its stdin is a pipe whose only writer is this process: it closes when this
    # process ends, however it ends, and the reaper does its work then.
    starter = subprocess.Popen(
        [sys.executable, "-I", "-S", lifeline.__file__, "reap", _owner_prefix(), *parents],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    starter.wait()  # the reaper goes on in its own child; this keeps the pipe's end
    _reaper[os.getpid()] = starter.stdin


def process_start_time(pid):
    """When process `pid` started, in clock ticks since boot (None if it is gone):
    with the pid, it names one process for ever, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name, in parentheses, may hold spaces: count fields after it
    return int(stat[stat.rindex(")") + 2:].split()[19])


def end_orphaned_sandboxes():
    """Kill the sandboxes whose grading process is gone; returns how many still held
    processes (empty groups left behind are removed without counting).

    A grader's reaper ends its sandboxes when it dies; this is for a machine where
    the reaper could not (it was killed too, or the machine restarted mid-run
    with cgroups that persist). Each sandbox's control
    group is named after the process that started it, by pid and start time, so
    that a live grader's sandboxes are never touched, even one whose pid was
    reused, and nothing is chosen by a process's name.
    """
    orphans = {}
    for controller in _CONTROLLERS:
        parent = _cgroup_v1_dir(controller)
        if parent is None:
            continue
        for group in parent.glob(f"{_GROUP_PREFIX}*"):
            owner = _owner_of(group.name)
            if owner is not None and process_start_time(owner[0]) != owner[1]:
                orphans.setdefault(group.name, []).append(group)
    running = 0
    for groups in orphans.values():
        running += any(_holds_processes(group) for group in groups)
        lifeline.kill_groups([str(group) for group in groups])
    return running


def _holds_processes(group):
    try:
        return bool((group / "cgroup.procs").read_text().split())
    except OSError:
        return False


def _owner_of(group_name):
    """(pid, start time) of the process that made the group named so, or None."""
    pid, _, rest = group_name.removeprefix(_GROUP_PREFIX).partition("-")
    start, _, _ = rest.partition("-")
    return (int(pid), int(start)) if pid.isdigit() and start.isdigit() else None


def _cgroup_v1_dir(controller):
    """This process's writable cgroup-v1 folder for `controller`, or None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                folder = Path("/sys/fs/cgroup") / controller / path.lstrip("/")
                return folder if os.access(folder, os.W_OK) else None
    except OSError:
        return None
    return None


def bwrap_available():
    return shutil.which("bwrap") is not None


def sandbox_problem(limits=None):
    """None when bubblewrap can make this grader's sandbox on this machine; else
    why not, in a few words. Checked by starting `true` in a sandbox built as a
    kernel's is: bwrap may be installed and still refused (user namespaces off)."""
    if not bwrap_available():
        return "bubblewrap (bwrap) is not installed"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as scratch:
        link_dir, client_dir = Path(scratch, "link"), Path(scratch, "client")
        link_dir.mkdir()
        client_dir.mkdir()
        args = _bwrap_prefix(link_dir=link_dir, client_dir=client_dir, hidden=(),
                             limits=limits or Limits())
        try:
            done = subprocess.run([*args, "true"], capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bubblewrap could not be started ({error})"
    if done.returncode != 0:
        said = done.stderr.strip()[-300:] or f"exit status {done.returncode}"
        return f"bubblewrap cannot make a sandbox here ({said})"
    return None


def grader_is_root():
    return os.geteuid() == 0


def new_run_uid():
    """A host uid (and gid) for one run's kernel when the grader is root.

    One per run, so that RLIMIT_NPROC, which counts every process of a uid,
    binds each hand-in alone: a fork bomb must not starve the kernels of
    hand-ins graded beside it, nor the next kernel of the same grading
    process (the bomb's killed processes count against their uid until the
    host's init reaps them, and a kernel that cannot start its threads dies
    before it answers). Distinct among the runs of live grading processes: the
    pid (Linux keeps pids below 2**22) and this process's count of runs, modulo
    1000. No account has it; the largest is below 2**32 - 1.
    """
    return _FIRST_RUN_UID + (os.getpid() % 2**22) * 1000 + next(_runs_started) % 1000


def write_client_package(target):
    """Copy normref's client half (no reference code) under `target`, world-readable."""
    package_root = _project_root()
    target = Path(target)
    (target / "normref" / "checks").mkdir(parents=True, exist_ok=True)
    (target / "normref" / "__init__.py").write_text(
        '"""The grading sandbox\'s normref: the check client only."""\n')
    for relative in _CLIENT_FILES:
        shutil.copyfile(package_root / relative, target / relative)
    for probes in (package_root / "normref" / "checks").glob("*_probes.py"):
        shutil.copyfile(probes, target / "normref" / "checks" / probes.name)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def prepare_run_dirs(scratch, *, uid):
    """(link dir, client dir, host home) under a fresh `scratch` folder.

    uid: the run's kernel's uid when the grader is root (see new_run_uid).

    The link dir holds the kernel's sockets and connection file: writable by
    the sandbox until `close_link_dir`. The host home is used only without
    bwrap (with bwrap the kernel's home is a tmpfs).
    """
    scratch = Path(scratch)
    link, client, home = scratch / "link", scratch / "client", scratch / "home"
    for folder in (link, client, home):
        folder.mkdir(parents=True, exist_ok=True)
    write_client_package(client)
    scratch.chmod(0o711)
    link.chmod(0o1777 if grader_is_root() else 0o700)
    if grader_is_root():
        os.chown(home, uid, uid)
    home.chmod(0o700)
    return link, client, home


def close_link_dir(link):
    """Once the kernel has made its sockets: no more files in the link dir.

    The folder belongs to the grader, so an unprivileged kernel cannot open
    it again.
    """
    if grader_is_root():
        Path(link).chmod(0o755)


def _project_root():
    """The folder holding normref's source (and, usually, the course)."""
    import normref

    return Path(normref.__file__).resolve().parent.parent


def _rlimit_prefix(limits):
    prlimit = shutil.which("prlimit")
    if prlimit is None:
        return []
    return [prlimit, f"--as={limits.memory_bytes}", f"--cpu={limits.cpu_seconds}",
            f"--nproc={limits.processes}", f"--fsize={limits.file_bytes}",
            f"--nofile={limits.open_files}", "--"]


def _drop_privileges_prefix(uid):
    """setpriv to the unprivileged `uid` with no capabilities (the grader is root)."""
    # A change of uid clears the parent-death signal (bwrap's --die-with-parent):
    # set it again, so that the kernel still dies with its parent.
    return [shutil.which("setpriv") or "setpriv", f"--reuid={uid}",
            f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--pdeathsig=SIGKILL", "--"]


def hidden_folders(also_hidden=()):
    """Folders the sandbox covers with an empty tmpfs."""
    candidates = {*map(Path, also_hidden), Path(tempfile.gettempdir()), Path("/tmp"),
                  Path.home(), Path("/root"), Path("/home"), Path("/work"), Path("/srv"),
                  Path("/mnt"), Path("/media"), Path("/opt"), Path("/var"), Path("/run"),
                  _project_root()}
    return sorted(p for p in candidates
                  if p.is_dir() and p not in (Path("/"), Path(HOME_IN_SANDBOX)))


def _bwrap_prefix(*, link_dir, client_dir, hidden, limits):
    """bwrap arguments: read-only system, hidden course and home, a sized tmpfs to write."""
    hidden = hidden_folders(hidden)
    visible = sorted({Path(sys.prefix), Path(sys.base_prefix), Path(client_dir),
                      Path(link_dir)})
    args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    if not grader_is_root():
        args += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
                 "--disable-userns", "--cap-drop", "ALL"]
    for path in hidden:
        args += ["--size", str(_HIDDEN_TMPFS_BYTES), "--perms", "0755", "--tmpfs", str(path)]
    # The kernel's only writable place: home, cwd and /tmp on one sized tmpfs.
    args += ["--size", str(limits.scratch_bytes), "--perms", "1777",
             "--tmpfs", HOME_IN_SANDBOX]
    # Folders that lead to what stays visible are made by hand, so that they
    # are world-readable (bwrap would make them 0700).
    leading = sorted({a for v in visible for a in v.parents
                      if any(h in a.parents for h in hidden + [Path(HOME_IN_SANDBOX)])},
                     key=lambda p: len(p.parts))
    for folder in leading:
        args += ["--perms", "0755", "--dir", str(folder)]
    for needed in sorted({Path(sys.prefix), Path(sys.base_prefix), Path(client_dir)}):
        args += ["--ro-bind", str(needed), str(needed)]
    args += ["--bind", str(link_dir), str(link_dir), "--chdir", HOME_IN_SANDBOX,
             "--setenv", "HOME", HOME_IN_SANDBOX, "--setenv", "TMPDIR", HOME_IN_SANDBOX]
    return args + ["--"]


def kernel_prefix(*, link_dir, client_dir, limits, uid, use_bwrap=None, hidden=()):
    """The command prefix that puts a kernel in the sandbox.

    uid: the kernel's uid when the grader is root (see new_run_uid).

    hidden: more folders to hide (the course directory) besides the system's
    temp folder, homes, /work, /srv, /mnt, /opt, /var, /run (the system's
    sockets) and the project's own source.
    """
    if use_bwrap is None:
        use_bwrap = bwrap_available()
    if not use_bwrap:
        warnings.warn("bubblewrap (bwrap) is not installed: student code runs with resource "
                      "limits only, and can see the network and this machine's files. "
                      "Install Debian's 'bubblewrap' before grading real hand-ins.",
                      stacklevel=2)
    prefix = (_bwrap_prefix(link_dir=link_dir, client_dir=client_dir, hidden=hidden,
                            limits=limits) if use_bwrap else [])
    prefix += _rlimit_prefix(limits)
    if grader_is_root():
        prefix += _drop_privileges_prefix(uid)
    return prefix


def kernel_home(*, use_bwrap, host_home):
    """Where the kernel's home (and cwd, and TMPDIR) is, as the kernel sees it."""
    if use_bwrap is None:
        use_bwrap = bwrap_available()
    return HOME_IN_SANDBOX if use_bwrap else str(host_home)


def kernel_environment(*, socket_path, client_dir, home):
    """Environment of the sandboxed kernel: the check client, no secrets."""
    keep = ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update({
        _runner.SOCKET_ENV: str(socket_path),
        "PYTHONPATH": str(client_dir),
        "HOME": str(home),
        "TMPDIR": str(home),
        "MPLBACKEND": "agg",
        "MPLCONFIGDIR": str(home),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
        "TRITON_CACHE_DIR": f"{home}/.triton",
    })
    return env
