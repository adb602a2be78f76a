"""The sandbox from the inside: what a hostile kernel can and cannot do.

One notebook of probes runs once in the real sandbox (module-scoped fixture);
each probe cell prints one JSON line of what it found, and each test asserts
on one of them. The grader's own limits (output budget, frames on the check
socket) are tested beside it.
"""

import csv
import io
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import time
import types
import warnings
import zipfile
from pathlib import Path, PosixPath

import nbformat
import numpy as np
import pytest

import normref
from autograder.grading import lifeline, sandbox
from autograder.grading.checkserver import CheckServer
from autograder.grading.runner import RunSettings, run_notebook
from conftest import REPO
from normref.checks import _runner, _wire

pytestmark = pytest.mark.skipif(not sandbox.bwrap_available(),
                                reason="bubblewrap is not installed")

SETTINGS = RunSettings(cell_timeout=60, handin_timeout=240,
                       limits=sandbox.Limits(scratch_bytes=64 * 1024**2),
                       max_output_chars=200_000)


def _probe(name, body):
    """A code cell that runs `body` (which sets `found`) and prints it as JSON."""
    source = f"import json, os, subprocess\nfound = None\n{textwrap.dedent(body)}\n" \
             f"print('PROBE', json.dumps({{'{name}': found}}, default=str))"
    return nbformat.v4.new_code_cell(source)


def _status_field(field):
    return f"[l.split()[1] for l in open('/proc/self/status') if l.startswith('{field}:')][0]"


PROBES = {
    "ids": f"found = {{'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid(), "
           f"'groups': os.getgroups(), 'cap_eff': {_status_field('CapEff')}, "
           f"'cap_prm': {_status_field('CapPrm')}, 'cap_bnd': {_status_field('CapBnd')}, "
           f"'no_new_privs': {_status_field('NoNewPrivs')}}}",
    "mounts": """
        def rc(*cmd):
            return subprocess.run(list(cmd), capture_output=True).returncode
        found = {'remount_root': rc('mount', '-o', 'remount,rw', '/'),
                 'umount_course': rc('umount', COURSE),
                 'mount_tmpfs': rc('mount', '-t', 'tmpfs', 'x', '/mnt'),
                 'userns_umount': subprocess.run(
                     ['unshare', '-Urm', 'sh', '-c', f'umount {COURSE}; ls -A {COURSE}'],
                     capture_output=True, text=True).stdout.split()}
    """,
    "visible": """
        def listing(path):
            try:
                return sorted(os.listdir(path))
            except OSError as exc:
                return type(exc).__name__
        def readable(path):
            try:
                open(path, 'rb').read(1)
                return True
            except OSError:
                return False
        found = {'course': listing(COURSE), 'project': listing(PROJECT),
                 'judges': readable(PROJECT + '/normref/checks/recipe_judges.py'),
                 'shadow': readable('/etc/shadow'), 'root_home': listing('/root'),
                 'key_dir': listing(KEY_DIR)}
    """,
    "writes": """
        found = {}
        for where in ('/', '/etc', '/usr', COURSE, LINK):
            try:
                open(os.path.join(where, 'pwned'), 'w').write('x')
                found[where] = 'written'
            except OSError as exc:
                found[where] = type(exc).__name__
        try:
            with open('big', 'wb') as f:
                for _ in range(100):
                    f.write(b'\\0' * 1024 * 1024)
            found['big'] = 'written'
        except OSError as exc:
            found['big'] = type(exc).__name__
        found['cwd'] = os.getcwd()
    """,
    "shadow": """
        import importlib, sys
        os.makedirs('normref/checks', exist_ok=True)
        for init in ('normref/__init__.py', 'normref/checks/__init__.py'):
            open(init, 'w').write('FAKE = True')
        importlib.invalidate_caches()
        import normref.checks
        found = {'fake': getattr(normref.checks, 'FAKE', False),
                 'file': normref.checks.__file__, 'cwd_on_path': os.getcwd() in sys.path}
    """,
    "fds": """
        found = {}
        for fd in os.listdir('/proc/self/fd'):
            try:
                target = os.readlink(f'/proc/self/fd/{fd}')
                flags = int(open(f'/proc/self/fdinfo/{fd}').read().split('flags:')[1].split()[0], 8)
            except OSError:
                continue
            found[fd] = (target, flags & 3)
    """,
    "ptrace": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        found = {'attach_pid1': libc.ptrace(16, 1, 0, 0), 'errno': ctypes.get_errno()}
    """,
    "network": """
        import socket
        # /proc/net/dev lists this network namespace's interfaces (/sys shows the host's)
        found = {'interfaces': sorted(line.split(':')[0].strip()
                                      for line in open('/proc/net/dev').readlines()[2:])}
        for name, address in (('public', ('1.1.1.1', 53)), ('loopback_host', ('10.0.2.2', 80))):
            try:
                socket.create_connection(address, timeout=2).close()
                found[name] = 'connected'
            except OSError as exc:
                found[name] = type(exc).__name__
    """,
    "environment": "found = sorted(os.environ)",
    "interpreter": """
        import sys, sysconfig
        found = {}
        for where in (sys.prefix, sysconfig.get_paths()['purelib'], os.path.dirname(os.__file__)):
            try:
                open(os.path.join(where, 'pwned.py'), 'w').write('x = 1')
                found[where] = 'written'
            except OSError as exc:
                found[where] = type(exc).__name__
    """,
    "limits": """
        import resource
        found = {name: resource.getrlimit(getattr(resource, name))[0]
                 for name in ('RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE',
                              'RLIMIT_CPU')}
        children = []
        try:
            for _ in range(200):
                children.append(subprocess.Popen(['sleep', '30']))
        except OSError as exc:
            found['spawn_error'] = type(exc).__name__
        found['spawned'] = len(children)
        for child in children:
            child.kill()
            child.wait()
    """,
    "parent_death": """
        import ctypes
        signal_number = ctypes.c_int(-1)
        ctypes.CDLL(None).prctl(2, ctypes.byref(signal_number), 0, 0, 0)  # PR_GET_PDEATHSIG
        found = signal_number.value
    """,
}
# Set in the grader's environment while the probes run: the kernel must not see it.
GRADER_SECRET = "AUTOGRADER_TEST_SECRET"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # The course must be hidden because the grader says so, not because it lies in a
    # folder hidden anyway (the temp folder): as root, it goes where nothing else hides it.
    course = (Path("/") / f"course-under-test-{os.getpid()}" if sandbox.grader_is_root()
              else tmp_path_factory.mktemp("course"))
    course.mkdir(exist_ok=True)
    (course / "source").mkdir()
    (course / "source" / "secret.txt").write_text("the answers")
    key_dir = Path(tmp_path_factory.mktemp("keys"))
    (key_dir / "grader.key").write_bytes(b"k" * 32)
    work = tmp_path_factory.mktemp("run")
    prelude = (f"COURSE = {str(course)!r}\nPROJECT = {str(REPO)!r}\n"
               f"KEY_DIR = {str(key_dir)!r}\nLINK = {str(work / 'link')!r}")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(prelude)]
    nb.cells += [_probe(name, body) for name, body in PROBES.items()]
    nb.cells += [
        nbformat.v4.new_code_cell("print('x' * 1_000_000)"),
        nbformat.v4.new_code_cell(
            "from IPython.display import display, update_display\n"
            "h = display('start', display_id=True)\n"
            "for i in range(50):\n    h.update('y' * 1_000_000)"),
        nbformat.v4.new_code_cell("def f(n):\n    return f(n + 1)\nf(0)"),
        nbformat.v4.new_code_cell("raise ValueError('z' * 10_000_000)"),
    ]
    os.environ[GRADER_SECRET] = "the grader's key"
    try:
        result = run_notebook(nb, workdir=work / "scratch", settings=SETTINGS, cell_checks={},
                              hidden=[course, key_dir])
    finally:
        del os.environ[GRADER_SECRET]
    found = {}
    for cell in result.notebook.cells:
        # one print may arrive in several stream messages ("PROBE", " {...}\n") when
        # the kernel flushes between its writes: read the cell's stdout whole
        stdout = "".join(out.get("text", "") for out in cell.get("outputs", [])
                         if out.get("name") == "stdout")
        for line in stdout.splitlines():
            if line.startswith("PROBE "):
                found.update(json.loads(line[len("PROBE "):]))
    yield {"result": result, "found": found, "course": course, "work": work}
    if sandbox.grader_is_root():
        shutil.rmtree(course)


def test_the_kernel_is_an_unprivileged_user(run):
    ids = run["found"]["ids"]
    assert ids["uid"] != 0 and ids["euid"] != 0 and ids["gid"] != 0, ids
    assert 0 not in ids["groups"], ids
    assert int(ids["cap_eff"], 16) == 0 and int(ids["cap_prm"], 16) == 0, ids
    if sandbox.grader_is_root():
        assert int(ids["cap_bnd"], 16) == 0 and ids["no_new_privs"] == "1", ids


def test_the_kernel_cannot_mount_unmount_or_remount(run):
    mounts = run["found"]["mounts"]
    assert mounts["remount_root"] != 0 and mounts["umount_course"] != 0, mounts
    assert mounts["mount_tmpfs"] != 0, mounts
    # A user namespace of its own cannot uncover the locked mount over the course.
    assert "source" not in mounts["userns_umount"], mounts


def test_the_course_the_project_and_private_files_are_invisible(run):
    visible = run["found"]["visible"]
    # Covered by an empty tmpfs, or not there at all (under the kernel's own /tmp).
    assert visible["course"] in ([], "FileNotFoundError"), visible
    assert visible["key_dir"] in ([], "FileNotFoundError"), visible
    assert "normref" not in visible["project"] and "source" not in visible["project"], visible
    assert visible["judges"] is False and visible["shadow"] is False, visible


def test_writes_go_only_to_a_bounded_tmpfs(run):
    writes = run["found"]["writes"]
    for where in ("/", "/etc", "/usr"):
        assert writes[where] in ("PermissionError", "OSError"), writes
    assert writes[str(run["course"])] != "written", writes
    # The link folder (the kernel's sockets) is closed once the kernel is up.
    assert writes[str(run["work"] / "link")] != "written", writes
    # 100 MiB into a 64 MiB tmpfs: the disk fills, not the host's.
    assert writes["big"] == "OSError", writes
    assert not any(run["course"].rglob("pwned")), "the kernel wrote into the course"


def test_a_package_in_the_cwd_cannot_stand_in_for_the_check_client(run):
    shadow = run["found"]["shadow"]
    assert shadow["fake"] is False and shadow["file"].startswith(str(run["work"])), shadow


def test_the_kernel_holds_none_of_the_graders_files(run):
    """No terminal, no log, no file of the host open for writing."""
    for fd, (target, access) in run["found"]["fds"].items():
        assert not target.startswith(("/dev/pts", "/dev/tty")), (fd, target)
        if target.startswith("/") and access != 0:  # open for writing
            assert target == "/dev/null" or target.startswith("/tmp/"), (fd, target)


def test_the_kernel_cannot_ptrace(run):
    ptrace = run["found"]["ptrace"]
    assert ptrace["attach_pid1"] == -1, ptrace


def test_the_kernel_has_no_network(run):
    network = run["found"]["network"]
    assert network["interfaces"] == ["lo"], network
    assert network["public"] != "connected" and network["loopback_host"] != "connected", network


def test_the_kernel_inherits_nothing_of_the_graders_environment(run):
    names = run["found"]["environment"]
    assert GRADER_SECRET not in names
    # what it has is what the grader chose for it (kernel_environment), plus what
    # Python, IPython and bwrap set themselves
    chosen = set(sandbox.kernel_environment(socket_path="s", client_dir="c", home="h"))
    own = {"PWD", "SHLVL", "_", "JPY_PARENT_PID", "PYDEVD_USE_FRAME_EVAL", "CLICOLOR",
           "CLICOLOR_FORCE",
           "FORCE_COLOR", "PAGER", "GIT_PAGER", "TERM", "MPLBACKEND"}
    assert set(names) - chosen - own == set(), names


def test_the_kernel_cannot_change_the_interpreter_or_its_packages(run):
    interpreter = run["found"]["interpreter"]
    assert interpreter and all(v in ("PermissionError", "OSError")
                               for v in interpreter.values()), interpreter


def test_the_kernel_runs_under_the_limits_it_was_given(run):
    limits = run["found"]["limits"]
    expected = SETTINGS.limits
    assert limits["RLIMIT_AS"] == expected.memory_bytes, limits
    assert limits["RLIMIT_FSIZE"] == expected.file_bytes, limits
    assert limits["RLIMIT_NOFILE"] == expected.open_files, limits
    assert limits["RLIMIT_CPU"] == expected.cpu_seconds, limits
    assert limits["RLIMIT_NPROC"] == expected.processes, limits


def test_the_kernel_dies_with_its_parent(run):
    assert run["found"]["parent_death"] == signal.SIGKILL


def test_every_output_counts_against_the_budget(run):
    nb = run["result"].notebook
    size = len(nbformat.writes(nb))
    # 1 MB printed, 50 MB of display updates, a deep traceback and a 10 MB message,
    # against a budget of 200 000 characters plus one short error per cell.
    assert size < 400_000, size
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert len(errors) == 2, errors
    assert all(len(json.dumps(e)) <= 20_000 for e in errors)
    assert errors[-1].ename == "ValueError"


def _frame(header, payload):
    header_bytes = json.dumps(header).encode()
    return struct.pack("!II", len(header_bytes), len(payload)) + header_bytes + payload


def _deflated_npz_of_zeros(nbytes):
    """A small compressed frame that inflates to `nbytes` of zeros."""
    buffer = io.BytesIO()
    npy_header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        npy_header, {"descr": "<f8", "fortran_order": False, "shape": (nbytes // 8,)})
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        with archive.open("0/y.npy", "w", force_zip64=True) as member:
            member.write(npy_header.getvalue())
            chunk = b"\0" * (16 * 1024 * 1024)
            for _ in range(nbytes // len(chunk)):
                member.write(chunk)
    return buffer.getvalue()


def _declared_huge_npz():
    """A stored member whose header declares 10**10 doubles and carries none."""
    buffer = io.BytesIO()
    npy_header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        npy_header, {"descr": "<f8", "fortran_order": False, "shape": (10**10,)})
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("0/y.npy", npy_header.getvalue())
    return buffer.getvalue()


def test_hostile_frames_are_refused_before_any_allocation():
    bomb = _deflated_npz_of_zeros(512 * 1024 * 1024)
    assert len(bomb) < 2 * 1024 * 1024
    for payload in (bomb, _declared_huge_npz(), b"PK\x03\x04garbage"):
        with pytest.raises(_wire.FrameRefused):
            _wire.load_arrays(payload)
    arrays = {"0/y": np.arange(12.0).reshape(3, 4), "1/s": np.array("text")}
    assert {k: v.tolist() for k, v in _wire.load_arrays(
        _wire.pack({}, arrays)[8 + 2:]).items()} == {k: v.tolist() for k, v in arrays.items()}


def test_the_grader_stays_small_under_a_bomb_sent_to_the_check_server(tmp_path):
    """In a fresh process: peak memory of a check server fed a 4.5 GB bomb."""
    script = f"""
import json, resource, socket, struct, sys
sys.path[:0] = [{str(REPO / 'tests')!r}, {str(REPO / 'tests' / 'grading')!r}]
from autograder.grading.checkserver import CheckServer
from normref.checks import _wire
from test_sandbox import _deflated_npz_of_zeros, _frame
bomb = _deflated_npz_of_zeros(4608 * 1024 * 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
checks = {{'c': ('layer_norm_token',)}}
with CheckServer({str(tmp_path / 's.sock')!r}, cell_checks=checks) as server:
    server.current_cell = 'c'
    for op in ('cases', 'judge'):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect({str(tmp_path / 's.sock')!r})
            s.sendall(_frame({{'op': op, 'check': 'layer_norm_token'}}, bomb))
            reply, _ = _wire.receive(s)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{'bomb': len(bomb), 'grew_kb': after - before,
                  'refusals': len(server.refusals), 'verdicts': len(server.verdicts)}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    print("bomb frame", found)
    assert found["grew_kb"] < 100 * 1024, found  # not 4.5 GB: under 100 MB
    assert found["refusals"] == 2 and found["verdicts"] == 0, found


def _ask(path, header, arrays=None):
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        _wire.send(s, header, arrays)
        return _wire.receive(s)


def test_the_check_server_serves_only_the_running_cells_checks_once(tmp_path):
    path = tmp_path / "s.sock"
    with CheckServer(path, cell_checks={"ln": ("layer_norm_token",)}) as server:
        server.current_cell = None
        reply, _ = _ask(path, {"op": "cases", "check": "layer_norm_token"})
        assert reply.get("refused"), reply
        server.current_cell = "ln"
        reply, _ = _ask(path, {"op": "cases", "check": "token_mean"})
        assert reply.get("refused"), reply
        reply, _ = _ask(path, {"op": "judge", "check": "layer_norm_token"})
        assert reply.get("refused"), "a verdict before the inputs"
        reply, cases = _ask(path, {"op": "cases", "check": "layer_norm_token"})
        assert "labels" in reply and cases
        reply, _ = _ask(path, {"op": "cases", "check": "layer_norm_token"})
        assert reply.get("refused"), "the inputs twice"
        wrong = {k.replace("/x", "/y"): np.zeros_like(v) for k, v in cases.items()
                 if k.endswith("/x")}
        reply, _ = _ask(path, {"op": "judge", "check": "layer_norm_token"}, wrong)
        assert reply["passed"] is False
        reply2, _ = _ask(path, {"op": "judge", "check": "layer_norm_token"}, wrong)
        assert reply2.get("refused"), "a second verdict"
    assert len(server.verdicts) == 1 and len(server.refusals) == 5
    # The kernel learns pass or fail and the failing case's label; the log keeps
    # the diagnosis, which quotes values.
    logged = server.verdicts[0].message
    assert "expected [-1.3416" in logged, logged
    assert "expected" not in reply["message"] and "1.34" not in reply["message"], reply
    assert reply["message"].startswith("layer_norm_token: failed on the case"), reply


# The sandbox's pieces, argument by argument, without starting a kernel.

LIMITS = sandbox.Limits(memory_bytes=111, cpu_seconds=22, processes=33, file_bytes=44,
                        open_files=55, scratch_bytes=66)


def _tmpfs_targets(args):
    return [args[i + 1] for i, a in enumerate(args) if a == "--tmpfs"]


# --- what is hidden -------------------------------------------------------------------------


def test_the_project_is_hidden_wherever_it_sits(monkeypatch, tmp_path):
    project = tmp_path / "somewhere" / "checkout"
    project.mkdir(parents=True)
    monkeypatch.setattr(sandbox, "_project_root", lambda: project)
    assert project in sandbox.hidden_folders()
    args = sandbox._bwrap_prefix(link_dir=tmp_path / "l", client_dir=tmp_path / "c",
                                 hidden=(), limits=LIMITS)
    assert str(project) in _tmpfs_targets(args)


def test_the_real_project_root_is_hidden():
    assert sandbox._project_root() == REPO
    assert sandbox._project_root() == Path(normref.__file__).resolve().parent.parent
    assert REPO in sandbox.hidden_folders()


def test_the_usual_folders_and_the_extra_ones_are_hidden(tmp_path):
    extra = tmp_path / "course"
    extra.mkdir()
    hidden = sandbox.hidden_folders([extra, tmp_path / "missing"])
    assert extra in hidden and tmp_path / "missing" not in hidden
    assert hidden == sorted(hidden)
    for folder in ("/root", "/home", "/work", "/srv", "/mnt", "/media", "/opt", "/var",
                   "/run"):
        assert (Path(folder) in hidden) is Path(folder).is_dir(), folder
    assert Path("/tmp") not in hidden  # the kernel's own tmpfs goes there
    assert Path(sandbox.tempfile.gettempdir()) in hidden or \
        Path(sandbox.tempfile.gettempdir()) == Path("/tmp")
    assert Path.home() in hidden or Path.home() == Path("/")


def test_root_s_home_is_hidden_whoever_grades(monkeypatch):
    monkeypatch.setattr(sandbox.Path, "home", staticmethod(lambda: Path("/nonexistent")))
    assert (Path("/root") in sandbox.hidden_folders()) is Path("/root").is_dir()


def test_neither_root_nor_the_kernels_home_is_hidden(monkeypatch):
    monkeypatch.setattr(sandbox.Path, "home", staticmethod(lambda: Path("/")))
    monkeypatch.setattr(sandbox.tempfile, "gettempdir", lambda: "/tmp")
    hidden = sandbox.hidden_folders([Path("/"), Path("/tmp")])
    assert Path("/") not in hidden and Path("/tmp") not in hidden


# --- the bwrap command ----------------------------------------------------------------------


def _controlled(monkeypatch, *, root):
    monkeypatch.setattr(sandbox, "sys", types.SimpleNamespace(prefix="/venv/x",
                                                              base_prefix="/usr"))
    monkeypatch.setattr(sandbox, "hidden_folders",
                        lambda hidden: sorted([Path("/work"), Path("/srv"), *map(Path, hidden)]))
    monkeypatch.setattr(sandbox, "grader_is_root", lambda: root)


def test_a_grader_that_is_not_root_maps_the_kernel_to_nobody(monkeypatch):
    _controlled(monkeypatch, root=False)
    args = sandbox._bwrap_prefix(link_dir="/work/a/b/link", client_dir="/work/a/b/client",
                                 hidden=[], limits=LIMITS)
    # the suite runs as root, so this path cannot be probed from inside a kernel: what
    # bwrap is told, option by option, in any order
    assert {"--unshare-user", "--disable-userns"} <= set(args)
    values = {flag: args[i + 1] for i, flag in enumerate(args)
              if flag in ("--uid", "--gid", "--cap-drop")}
    assert values == {"--uid": "65534", "--gid": "65534", "--cap-drop": "ALL"}
    dirs = [args[i + 1] for i, a in enumerate(args) if a == "--dir"]
    assert dirs == ["/work/a", "/work/a/b"]  # shortest first: bwrap makes them in order


def test_limits_and_privileges(monkeypatch):
    assert sandbox.Limits() == sandbox.Limits(2 * 1024**3, 600, 512, 64 * 1024**2, 1024,
                                              256 * 1024**2)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: f"/bin/{name}")
    assert sandbox._rlimit_prefix(LIMITS) == [
        "/bin/prlimit", "--as=111", "--cpu=22", "--nproc=33", "--fsize=44", "--nofile=55", "--"]
    uid = 1_234_567
    assert sandbox._drop_privileges_prefix(uid) == [
        "/bin/setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--pdeathsig=SIGKILL",
        "--"]
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    assert sandbox._rlimit_prefix(LIMITS) == []
    assert sandbox._drop_privileges_prefix(uid)[0] == "setpriv"
    assert sandbox.bwrap_available() is False


def test_bwrap_is_found_on_the_path(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: "/x/bwrap" if name == "bwrap"
                        else None)
    assert sandbox.bwrap_available() is True


@pytest.mark.parametrize("euid, root", [(0, True), (1000, False)])
def test_root_is_euid_zero(monkeypatch, euid, root):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: euid)
    assert sandbox.grader_is_root() is root


@pytest.mark.parametrize("root", [True, False])
def test_the_kernel_prefix_with_bwrap(monkeypatch, root):
    monkeypatch.setattr(sandbox, "grader_is_root", lambda: root)
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: True)
    monkeypatch.setattr(sandbox, "_bwrap_prefix", lambda *, link_dir, client_dir, hidden,
                        limits: ["BWRAP", link_dir, client_dir, hidden, limits.cpu_seconds])
    monkeypatch.setattr(sandbox, "_rlimit_prefix", lambda limits: ["RLIMIT", limits])
    monkeypatch.setattr(sandbox, "_drop_privileges_prefix", lambda uid: ["SETPRIV", uid])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prefix = sandbox.kernel_prefix(link_dir="l", client_dir="c", limits=LIMITS,
                                       uid=7, hidden=("h",))
    assert prefix == ["BWRAP", "l", "c", ("h",), 22, "RLIMIT", LIMITS] + (
        ["SETPRIV", 7] if root else [])
    assert sandbox.kernel_prefix(link_dir="l", client_dir="c", limits=LIMITS, uid=7,
                                 use_bwrap=True)[:4] == ["BWRAP", "l", "c", ()]


def test_without_bwrap_a_loud_warning_and_the_limits_alone(monkeypatch):
    monkeypatch.setattr(sandbox, "grader_is_root", lambda: False)
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    monkeypatch.setattr(sandbox, "_rlimit_prefix", lambda limits: ["RLIMIT"])
    for use_bwrap in (False, None):
        with pytest.warns(UserWarning, match=r"^bubblewrap \(bwrap\) is not installed: "
                          "student code runs with resource limits only, and can see the "
                          "network and this machine's files. Install Debian's 'bubblewrap' "
                          "before grading real hand-ins.$") as caught:
            prefix = sandbox.kernel_prefix(link_dir="l", client_dir="c", limits=LIMITS,
                                           uid=7, use_bwrap=use_bwrap)
        assert prefix == ["RLIMIT"]
        assert caught[0].filename != sandbox.__file__  # it names the caller


def test_the_kernels_home(monkeypatch):
    assert sandbox.kernel_home(use_bwrap=True, host_home=Path("/h")) == "/tmp"
    assert sandbox.kernel_home(use_bwrap=False, host_home=Path("/h")) == "/h"
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: False)
    assert sandbox.kernel_home(use_bwrap=None, host_home=Path("/h")) == "/h"
    monkeypatch.setattr(sandbox, "bwrap_available", lambda: True)
    assert sandbox.kernel_home(use_bwrap=None, host_home=Path("/h")) == "/tmp"


def test_the_kernels_environment_carries_no_secrets(monkeypatch):
    for name in list(os.environ):
        monkeypatch.delenv(name)
    monkeypatch.setenv("PATH", "/bin")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("AUTOGRADER_KEY_FILE", "/secret")
    assert sandbox.kernel_environment(socket_path=Path("/l/s"), client_dir=Path("/c"),
                                      home="/tmp") == {
        "PATH": "/bin", "LANG": "C.UTF-8", "OPENBLAS_CORETYPE": "Haswell",
        _runner.SOCKET_ENV: "/l/s", "PYTHONPATH": "/c", "HOME": "/tmp", "TMPDIR": "/tmp",
        "MPLBACKEND": "agg", "MPLCONFIGDIR": "/tmp", "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1", "JUPYTER_PLATFORM_DIRS": "1",
        "TRITON_CACHE_DIR": "/tmp/.triton"}
    monkeypatch.setenv("LC_ALL", "C")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1")
    env = sandbox.kernel_environment(socket_path="s", client_dir="c", home="h")
    assert env["LC_ALL"] == "C" and env["OPENBLAS_L2_SIZE"] == "1"


# --- the run's folders ----------------------------------------------------------------------


def _mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_the_client_package_is_the_client_half_only_and_world_readable(tmp_path):
    mask = os.umask(0o077)  # a grader's private umask must not make it unreadable
    try:
        sandbox.write_client_package(tmp_path / "client")
    finally:
        os.umask(mask)
    root = tmp_path / "client"
    shipped = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    probes = sorted(f"normref/checks/{p.name}" for p in (REPO / "normref" / "checks").glob(
        "*_probes.py"))
    assert probes
    assert shipped == sorted(["normref", "normref/__init__.py", "normref/checks",
                              "normref/checks/__init__.py", "normref/checks/_runner.py",
                              "normref/checks/_wire.py", *probes])
    assert (root / "normref" / "__init__.py").read_text() == (
        '"""The grading sandbox\'s normref: the check client only."""\n')
    for name in ("_runner.py", "_wire.py", "__init__.py"):
        assert (root / "normref" / "checks" / name).read_bytes() == (
            REPO / "normref" / "checks" / name).read_bytes()
    assert _mode(root) == 0o755
    for path in root.rglob("*"):
        assert _mode(path) == (0o755 if path.is_dir() else 0o644), path
    sandbox.write_client_package(root)  # a second time over the first: no error


@pytest.mark.parametrize("root", [True, False])
def test_the_run_folders(monkeypatch, tmp_path, root):
    monkeypatch.setattr(sandbox, "grader_is_root", lambda: root)
    owners = []
    monkeypatch.setattr(sandbox.os, "chown", lambda path, uid, gid: owners.append(
        (Path(path), uid, gid)))
    scratch = tmp_path / "s" / "t"
    uid = 1_234_567
    link, client, home = sandbox.prepare_run_dirs(scratch, uid=uid)
    assert (link, client, home) == (scratch / "link", scratch / "client", scratch / "home")
    assert (client / "normref" / "checks" / "_wire.py").is_file()
    assert _mode(scratch) == 0o711 and _mode(home) == 0o700
    assert _mode(link) == (0o1777 if root else 0o700)
    assert owners == ([(home, uid, uid)] if root else [])
    sandbox.close_link_dir(link)
    assert _mode(link) == (0o755 if root else 0o700)
    sandbox.prepare_run_dirs(scratch, uid=uid)  # again over the same folders


# --- the cgroup -----------------------------------------------------------------------------


class _FakeCgroup(PosixPath):
    """A folder that behaves like a cgroup-v1 folder: its files appear with it."""

    def mkdir(self, *args, **kwargs):
        super().mkdir(*args, **kwargs)
        for name in ("cgroup.procs", "pids.max", "memory.limit_in_bytes",
                     "memory.memsw.limit_in_bytes"):
            (self / name).write_text("")

    def rmdir(self):
        for child in self.iterdir():
            child.unlink()
        super().rmdir()


@pytest.fixture
def cgroups(monkeypatch, tmp_path):
    parents = {c: _FakeCgroup(tmp_path / c) for c in ("pids", "memory")}
    for parent in parents.values():
        PosixPath.mkdir(parent)
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir", lambda controller: parents[controller])
    monkeypatch.setattr(sandbox, "_start_reaper", lambda: None)  # no reaper for fake groups
    return parents


def test_a_resource_group_caps_processes_and_memory(cgroups):
    group = sandbox.ResourceGroup("g1", LIMITS)
    g1 = group.name
    assert g1.endswith("-g1")
    assert group.dirs == [cgroups["pids"] / g1, cgroups["memory"] / g1]
    assert (cgroups["pids"] / g1 / "pids.max").read_text() == "33"
    assert (cgroups["memory"] / g1 / "memory.limit_in_bytes").read_text() == "111"
    assert (cgroups["memory"] / g1 / "memory.memsw.limit_in_bytes").read_text() == "111"
    assert not (cgroups["pids"] / g1 / "memory.memsw.limit_in_bytes").read_text()
    done = subprocess.run(group.launcher() + ["/bin/echo", "inside"], capture_output=True,
                          text=True, check=True)
    assert done.stdout == "inside\n"
    assert (cgroups["pids"] / g1 / "cgroup.procs").read_text().strip().isdigit()


def test_killing_a_group_kills_its_processes_and_removes_it(cgroups):
    group = sandbox.ResourceGroup("g2", LIMITS)
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
    (cgroups["pids"] / group.name / "cgroup.procs").write_text(f"{sleepers[0].pid}\n")
    (cgroups["memory"] / group.name / "cgroup.procs").write_text(f"{sleepers[1].pid}\n")
    started = time.monotonic()
    group.kill_all()
    assert [s.wait(timeout=10) for s in sleepers] == [-9, -9]
    assert time.monotonic() - started < 10
    assert not (cgroups["pids"] / group.name).exists()
    assert not (cgroups["memory"] / group.name).exists()


def test_a_process_that_will_not_die_is_killed_twenty_times_at_most(cgroups, monkeypatch):
    group = sandbox.ResourceGroup("g4", LIMITS)
    (cgroups["pids"] / group.name / "cgroup.procs").write_text("123456789\n")
    kills = []
    monkeypatch.setattr(lifeline.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(lifeline.time, "sleep", lambda seconds: None)
    group.kill_all()
    assert kills == [(123456789, signal.SIGKILL)] * 20


def test_a_missing_controller_does_not_stop_the_next(monkeypatch, tmp_path):
    memory = _FakeCgroup(tmp_path / "memory")
    PosixPath.mkdir(memory)
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir",
                        lambda controller: memory if controller == "memory" else None)
    monkeypatch.setattr(sandbox, "_start_reaper", lambda: None)
    group = sandbox.ResourceGroup("g", LIMITS)
    assert group.dirs == [memory / group.name]


def test_an_empty_group_is_removed_at_once(cgroups):
    group = sandbox.ResourceGroup("g3", LIMITS)
    started = time.monotonic()
    group.kill_all()
    assert time.monotonic() - started < 0.5
    assert not (cgroups["pids"] / group.name).exists()


def test_a_group_that_cannot_be_made_is_left_out(cgroups):
    taken = f"autograder-{os.getpid()}-{sandbox.process_start_time(os.getpid())}-taken"
    (cgroups["pids"] / taken).mkdir()
    group = sandbox.ResourceGroup("taken", LIMITS)
    assert group.dirs == [cgroups["memory"] / taken]


def test_without_cgroups_the_group_does_nothing(monkeypatch):
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir", lambda controller: None)
    group = sandbox.ResourceGroup("g", LIMITS)
    assert group.dirs == []
    assert subprocess.run(group.launcher() + ["/bin/true"]).returncode == 0
    group.kill_all()


def test_a_group_whose_file_cannot_be_written_is_removed(monkeypatch, tmp_path):
    class Broken(_FakeCgroup):
        def write_text(self, *args, **kwargs):
            if self.name == "pids.max":
                raise PermissionError("no")
            return super().write_text(*args, **kwargs)

    parent = Broken(tmp_path / "pids")
    PosixPath.mkdir(parent)
    monkeypatch.setattr(sandbox, "_cgroup_v1_dir",
                        lambda controller: parent if controller == "pids" else None)
    assert sandbox.ResourceGroup("g", LIMITS).dirs == []
    assert not list(parent.iterdir())


def _with_proc(monkeypatch, tmp_path, lines, writable=True):
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    real = Path

    def fake_path(value):
        value = str(value)
        if value == "/proc/self/cgroup":
            return real(tmp_path / "cgroup")
        if value == "/sys/fs/cgroup":
            return real(tmp_path / "fs")
        return real(value)

    (tmp_path / "fs" / "pids" / "user" / "a").mkdir(parents=True)
    if not writable:
        (tmp_path / "fs" / "pids" / "user" / "a").chmod(0o500)
    monkeypatch.setattr(sandbox, "Path", fake_path)
    monkeypatch.setattr(sandbox.os, "access", lambda path, mode: mode == os.W_OK and (
        _mode(real(path)) & 0o200 != 0))


def test_the_cgroup_folder_of_a_controller(monkeypatch, tmp_path):
    _with_proc(monkeypatch, tmp_path, ["9:name=systemd:/", "8:cpu,pids:/user/a",
                                       "7:memory:/user/b", "0::/v2"])
    assert sandbox._cgroup_v1_dir("pids") == tmp_path / "fs" / "pids" / "user" / "a"
    (tmp_path / "fs" / "memory" / "X:y").mkdir(parents=True)
    (tmp_path / "cgroup").write_text("7:memory:/X:y\n")  # a colon in the group's name
    assert sandbox._cgroup_v1_dir("memory") == tmp_path / "fs" / "memory" / "X:y"
    (tmp_path / "cgroup").write_text("9:name=systemd:/\n8:cpu,pids:/user/a\n"
                                     "7:memory:/user/b\n0::/v2\n")
    assert sandbox._cgroup_v1_dir("cpu") is None  # no such folder: not writable
    assert sandbox._cgroup_v1_dir("memory") is None
    assert sandbox._cgroup_v1_dir("blkio") is None


def test_a_cgroup_folder_that_is_not_writable(monkeypatch, tmp_path):
    _with_proc(monkeypatch, tmp_path, ["8:pids:/user/a"], writable=False)
    assert sandbox._cgroup_v1_dir("pids") is None


def test_no_proc_no_cgroup(monkeypatch):
    monkeypatch.setattr(sandbox, "Path", lambda value: Path("/nonexistent/proc/cgroup"))
    assert sandbox._cgroup_v1_dir("pids") is None


def test_this_machines_cgroup_folder_is_writable_or_none():
    for controller in ("pids", "memory"):
        folder = sandbox._cgroup_v1_dir(controller)
        assert folder is None or os.access(folder, os.W_OK)


def test_the_module_names_its_constants():
    assert sandbox.SANDBOX_UID == sandbox.SANDBOX_GID == 65534
    assert sandbox.HOME_IN_SANDBOX == "/tmp"
    assert sys.modules["autograder.grading.sandbox"] is sandbox


# --- failing closed where no sandbox can be made ----------------------------------------------

# What bubblewrap prints when the kernel refuses it user namespaces (bubblewrap's
# bubblewrap.c, the message of its failed clone()).
REFUSED = ("bwrap: No permissions to creating new namespace, likely because the kernel does "
           "not allow non-privileged user namespaces.")


def _path_without_bwrap(tmp_path, fake_bwrap=None):
    """A PATH with every program of today's PATH (this interpreter's bin/ first) but
    bwrap, which is `fake_bwrap` (a script) or missing."""
    tools = tmp_path / "tools"
    tools.mkdir(parents=True)
    for folder in [Path(sys.executable).parent, *map(Path, os.environ["PATH"].split(os.pathsep))]:
        for program in (folder.iterdir() if folder.is_dir() else ()):
            if program.name != "bwrap" and not (tools / program.name).exists():
                (tools / program.name).symlink_to(program)
    if fake_bwrap is not None:
        (tools / "bwrap").write_text(fake_bwrap)
        (tools / "bwrap").chmod(0o755)
    return str(tools)


@pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap is not installed")
def test_a_working_bubblewrap_is_a_sandbox_and_a_missing_or_refused_one_says_why(
        tmp_path, monkeypatch):
    assert sandbox.sandbox_problem() is None
    monkeypatch.setenv("PATH", _path_without_bwrap(tmp_path / "none"))
    assert sandbox.sandbox_problem() == "bubblewrap (bwrap) is not installed"
    monkeypatch.setenv("PATH", _path_without_bwrap(
        tmp_path / "refused", f"#!/bin/sh\necho '{REFUSED}' >&2\nexit 1\n"))
    assert sandbox.sandbox_problem() == f"bubblewrap cannot make a sandbox here ({REFUSED})"


def test_grade_runs_no_student_code_without_a_sandbox_unless_told(tmp_path, venv_env):
    """No bwrap: `grade` stops before any hand-in runs, says how to go on, and writes
    no result; with --no-sandbox it grades, and every result is flagged as unsandboxed."""
    from autograder.course import EXAMPLES_DIR, Course
    from autograder.grading.grade import UNSANDBOXED_FLAG

    root = tmp_path / "course"
    for part in ("source", "release"):
        shutil.copytree(REPO / part / "01_the_recipe", root / part / "01_the_recipe")
    course = Course(root)
    (course.submitted / "ada" / "01_the_recipe").mkdir(parents=True)
    shutil.copy(EXAMPLES_DIR / "01_the_recipe" / "ada_perfect.ipynb",
                course.submitted / "ada" / "01_the_recipe" / "01_the_recipe.ipynb")
    env = {**venv_env, "PATH": _path_without_bwrap(tmp_path)}
    grade = [sys.executable, "-m", "autograder", "grade", "01_the_recipe", "--course",
             str(root), "--workers", "1", "--engine", "pool", "--no-scaled-timeouts"]
    refused = subprocess.run(grade, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.startswith("grade: bubblewrap (bwrap) is not installed: no student "
                                     "code was run") and "--no-sandbox" in refused.stderr
    assert not course.autograded.exists() or not any(course.autograded.rglob("*.json"))
    done = subprocess.run(grade + ["--no-sandbox"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = csv.DictReader(io.StringIO(
        (course.reports / "01_the_recipe" / "grades.csv").read_text()))
    assert row["student_id"] == "ada" and float(row["score"]) == float(row["max_score"])
    assert UNSANDBOXED_FLAG in row["flags"]
