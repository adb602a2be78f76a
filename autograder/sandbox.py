"""The box every process that runs student code lives in.

bubblewrap gives the kernel no network, a read-only view of the system, no
view of the course (source/, the gradebook, other students' hand-ins,
normref's code) and one writable folder: its own working copy. prlimit sets
resource limits inside it. Where bwrap is missing, the limits still apply and
a loud warning says the rest does not.
"""

import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from normref.checks import _runner

# What of normref the sandbox sees: the client half of the checks, no references.
_CLIENT_FILES = ["normref/checks/__init__.py", "normref/checks/_runner.py",
                 "normref/checks/_wire.py"]


@dataclass(frozen=True)
class Limits:
    """Resource limits for one hand-in's kernel (defaults fit a torch import)."""

    memory_bytes: int = 2 * 1024**3
    cpu_seconds: int = 600
    processes: int = 512
    file_bytes: int = 64 * 1024**2
    open_files: int = 1024


class ResourceGroup:
    """A control group that holds one kernel and every process it starts.

    Where the machine lets us write cgroups (v1 `pids` and `memory`
    controllers, or a v2 hierarchy), the group caps the number of processes and
    the real memory (RLIMIT_NPROC does not bind root, and RLIMIT_AS counts
    address space, not memory), and lets the grader kill every process the
    hand-in left behind. Elsewhere it does nothing and the rlimits stand alone.
    """

    def __init__(self, name, limits):
        self.dirs = []
        for controller, settings in (("pids", {"pids.max": limits.processes}),
                                     ("memory", {"memory.limit_in_bytes": limits.memory_bytes,
                                                 "memory.memsw.limit_in_bytes":
                                                     limits.memory_bytes})):
            parent = _cgroup_v1_dir(controller)
            if parent is None:
                continue
            group = parent / name
            try:
                group.mkdir()
                for key, value in settings.items():
                    target = group / key
                    if target.exists():
                        target.write_text(str(value))
                self.dirs.append(group)
            except OSError:
                self._remove(group)

    def prefix(self):
        """A command prefix that moves the process into the group, then execs."""
        if not self.dirs:
            return []
        joins = " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)
        return ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh"]

    def kill_all(self):
        """Kill every process still in the group, then remove the group."""
        for _ in range(20):
            pids = set()
            for group in self.dirs:
                try:
                    pids |= {int(p) for p in (group / "cgroup.procs").read_text().split()}
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
        for group in self.dirs:
            self._remove(group)

    @staticmethod
    def _remove(group):
        try:
            group.rmdir()
        except OSError:
            pass


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


def write_client_package(target):
    """Copy normref's client half (no reference code) under `target`."""
    package_root = _project_root()
    target = Path(target)
    (target / "normref" / "checks").mkdir(parents=True, exist_ok=True)
    (target / "normref" / "__init__.py").write_text(
        '"""The grading sandbox\'s normref: the check client only."""\n')
    for relative in _CLIENT_FILES:
        shutil.copyfile(package_root / relative, target / relative)
    for probes in (package_root / "normref" / "checks").glob("*_probes.py"):
        shutil.copyfile(probes, target / "normref" / "checks" / probes.name)


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


def _bwrap_prefix(workdir, client_dir, also_hidden):
    """bwrap arguments: read-only system, hidden course and temp, one writable dir."""
    hidden = {*map(Path, also_hidden), Path(tempfile.gettempdir()), Path.home(),
              Path("/work"), Path("/srv"), Path("/mnt"), _project_root()}
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--as-pid-1",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in sorted(hidden):
        if path.is_dir():
            args += ["--tmpfs", str(path)]
    # The interpreter and its packages must stay visible under the hidden folders.
    for needed in sorted({Path(sys.prefix), Path(sys.base_prefix)}):
        args += ["--ro-bind", str(needed), str(needed)]
    args += ["--ro-bind", str(client_dir), str(client_dir),
             "--bind", str(workdir), str(workdir), "--chdir", str(workdir),
             "--setenv", "HOME", str(workdir), "--setenv", "TMPDIR", str(workdir)]
    return args + ["--"]


def kernel_prefix(*, workdir, client_dir, limits, use_bwrap=None, hidden=()):
    """The command prefix that puts a kernel in the sandbox.

    hidden: more folders to hide (the course directory) besides the system's
    temp folder, home, /work, /srv, /mnt and the project's own source.
    """
    if use_bwrap is None:
        use_bwrap = bwrap_available()
    prefix = _bwrap_prefix(workdir, client_dir, hidden) if use_bwrap else []
    if not use_bwrap:
        warnings.warn("bubblewrap (bwrap) is not installed: student code runs with resource "
                      "limits only, and can see the network and this machine's files. "
                      "Install Debian's 'bubblewrap' before grading real hand-ins.",
                      stacklevel=2)
    return prefix + _rlimit_prefix(limits)


def kernel_environment(*, socket_path, client_dir, workdir):
    """Environment of the sandboxed kernel: the check client, no secrets."""
    keep = ("PATH", "LANG", "LC_ALL", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update({
        _runner.SOCKET_ENV: str(socket_path),
        "PYTHONPATH": str(client_dir),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "MPLBACKEND": "agg",
        "MPLCONFIGDIR": str(workdir),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "JUPYTER_PLATFORM_DIRS": "1",
    })
    return env
