"""The sandbox from the inside: what a hostile kernel can and cannot do.

One notebook of probes runs once in the real sandbox (module-scoped fixture);
each probe cell prints one JSON line of what it found, and each test asserts
on one of them. The grader's own limits (output budget, frames on the check
socket) are tested beside it.
"""

import io
import json
import socket
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import nbformat
import numpy as np
import pytest

from autograder import sandbox
from autograder.checkserver import CheckServer
from autograder.runner import RunSettings, run_notebook
from conftest import REPO
from normref.checks import _wire

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
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
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
    result = run_notebook(nb, workdir=work / "scratch", settings=SETTINGS, cell_checks={},
                          hidden=[course, key_dir])
    found = {}
    for cell in result.notebook.cells:
        for out in cell.get("outputs", []):
            for line in out.get("text", "").splitlines():
                if line.startswith("PROBE "):
                    found.update(json.loads(line[len("PROBE "):]))
    return {"result": result, "found": found, "course": course, "work": work}


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
sys.path.insert(0, {str(REPO / 'tests')!r})
from test_sandbox_hardening import _deflated_npz_of_zeros, _frame
from autograder.checkserver import CheckServer
from normref.checks import _wire
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
