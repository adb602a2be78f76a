"""Hostile hand-ins of unit 01, graded once together with two honest students.

Every hand-in below is made here from the released notebook: honest answers
(HONEST) with one or more cells replaced by an attack. One hand-in may carry
several attacks when they sit in different exercises, so that each cell's
score still says which attack failed. The whole class is graded once
(module-scoped fixture), then asserted student by student: the exact points
each deserves, the run's status and reason where the attack shows there, and
the honest students' scores untouched.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from kill_hunt import alive, descendants
from nbgrader.api import Gradebook

from autograder.course import EXAMPLES_DIR, Course
from autograder.grading.grade import RESULT_FILE, grade_assignment
from autograder.grading.runner import RunSettings
from autograder.results import report
from autograder.results.gradebook import gradebook_url
from conftest import GRADING_ENGINE, REPO

ASSIGNMENT = "01_the_recipe"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
GRADE_CELLS = {"token_mean_correct": 0.25, "spacing_estimate_correct": 0.25,
               "safe_spread_correct": 0.25, "spread_gap_correct": 0.25, "offset_correct": 0.25,
               "token_var_correct": 0.5, "merge_stats_correct": 1.75, "chunked_var_correct": 1.0,
               "chunked_var_merges": 1.5, "tiled_correct": 0.25, "ranking_correct": 0.5,
               "cost_correct": 0.25, "sweep_correct": 0.25, "ln_single_token": 0.25,
               "ln_handles_batches": 0.5, "eps_correct": 1.0, "scale_correct": 1.0}
# Short, but not so short that a busy machine (2 cores, shared) times out honest cells.
SETTINGS = RunSettings(cell_timeout=15, handin_timeout=60)

# Honest answers. layer_norm computes its own statistics so that an attack on
# token_mean or token_var costs only that exercise's point.
HONEST = {
    "token_mean_answer": '''
def token_mean(x):
    x = np.asarray(x, dtype=float)
    return x.sum(axis=-1) / x.shape[-1]
''',
    "token_var_answer": '''
def token_var(x):
    x = np.asarray(x, dtype=float)
    centred = x - x.mean(axis=-1, keepdims=True)
    return (centred ** 2).sum(axis=-1) / x.shape[-1]
''',
    "layer_norm_answer": '''
def layer_norm(x, gamma, beta, eps=1e-5):
    x = np.asarray(x, dtype=float)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta
''',
    "shortcut_prediction_answer": 'PREDICT_SHORTCUT = "c"',
    "merge_stats_answer": '''
def merge_stats(a, b):
    (n_a, mean_a, m2_a), (n_b, mean_b, m2_b) = a, b
    n = n_a + n_b
    delta = mean_b - mean_a
    return n, mean_a + delta * n_b / n, m2_a + m2_b + delta**2 * n_a * n_b / n
''',
    "chunked_var_answer": '''
def chunked_var(x, chunk):
    x = np.asarray(x, dtype=float)
    stats = None
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]
        mean = part.mean(axis=-1)
        here = (part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(axis=-1))
        stats = here if stats is None else merge_stats(stats, here)
    return stats[2] / stats[0]
''',
    "safe_spread_answer": "SPACING_ESTIMATE, SHORTCUT_SAFE_SPREAD = 8, 16\n"
                          'SPREAD_GAP_REASON = "c"',
    "offset_answer": "SHORTCUT_BREAKS_AT = 1e8",
    "tiled_answer": 'TILED_KERNEL_METHOD = "c"',
    "ranking_answer": 'FLOAT32_RANKING = ["two-pass", "chan", "welford"]',
    "cost_answer": 'ONE_READ_COST = "c"',
    "sweep_answer": 'TILE_SWEEP_PATTERN = "d"',
    "eps_answer": "S_FOR_HALF_OUTPUT = 0.004216",
    "scale_answer": "RMS_SHIFT_HALVING = 1.732",
    "scratch_answer": "# nothing to try",
}

WRONG_TOKEN_MEAN = '''
def token_mean(x):
    return np.zeros(np.shape(x)[:-1])
'''
WRONG_TOKEN_VAR = '''
def token_var(x):
    return np.zeros(np.shape(x)[:-1])
'''


def make_handin(release_nb, *, cells=None, delete=(), append=(), metadata=None,
                notes=0):
    """A hand-in: `release_nb` with HONEST answers, then `cells` ({grade_id: source})
    replacing any cell, `delete`d cells removed, `metadata` ({grade_id: dict})
    merged into cells' nbgrader metadata, `append`ed code cells added, each a
    source or (source, nbgrader metadata), and `notes` markdown cells at the end."""
    replaced = {**HONEST, **(cells or {})}
    nb = nbformat.from_dict(json.loads(json.dumps(release_nb)))
    kept, placed = [], set()
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in delete:
            continue
        if gid is None and cell.cell_type == "code" and cell.source.startswith("# A scratch"):
            gid = "scratch_answer"  # the release's scratch cell: the student's own
        if gid in replaced:
            cell.source = replaced[gid].strip("\n")
            placed.add(gid)
        cell.metadata.get("nbgrader", {}).update((metadata or {}).get(gid, {}))
        kept.append(cell)
    for item in append:
        source, meta = (item, None) if isinstance(item, str) else item
        kept.append(nbformat.v4.new_code_cell(source.strip("\n")))
        if meta is not None:
            kept[-1].metadata["nbgrader"] = meta
    kept += [nbformat.v4.new_markdown_cell(f"note {i}: " + "x" * 120) for i in range(notes)]
    nb.cells = kept
    unplaced = set(cells or {}) - placed
    assert not unplaced, f"no cell of the release to hold {unplaced}: the attack would vanish"
    return nb


def points(**overrides):
    """Full marks in every grade cell except the ones given."""
    return {**GRADE_CELLS, **overrides}


def _snoop_cell(course):
    """A scratch cell that tries to read, list and write what it must not see."""
    targets = [REPO / "normref" / "recipe.py", REPO / "normref" / "checks" / "recipe_judges.py",
               course.source / ASSIGNMENT / NOTEBOOK, course.root / "gradebook.db",
               course.submitted / "ada_perfect" / ASSIGNMENT / NOTEBOOK,
               course.autograded / "ada_perfect" / ASSIGNMENT / RESULT_FILE,
               Path.home() / ".bash_history"]
    folders = [course.root, course.submitted, REPO, Path("/work")]
    return f'''
import os, urllib.request
for path in {[str(p) for p in targets]!r}:
    try:
        with open(path, "rb") as f:
            print("READ", path, len(f.read()))
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
for folder in {[str(p) for p in folders]!r}:
    try:
        print("LISTED", folder, sorted(os.listdir(folder)))
    except OSError as exc:
        print("DENIED", folder, type(exc).__name__)
for path in {[str(course.root / "pwned.txt"), str(REPO / "pwned.txt")]!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("WROTE (inside the sandbox only?)", path)
    except OSError as exc:
        print("DENIED", path, type(exc).__name__)
try:
    urllib.request.urlopen("https://pypi.org/simple/", timeout=5)
    print("NETWORK OPEN")
except Exception as exc:
    print("NETWORK FAILED", type(exc).__name__)
'''


# The client half lives in the sandbox; a cheater reaches it without naming it,
# so that only the grader's own log, not the forbidden-call policy, stops them.
_FAKE_CLIENT_PRELUDE = '''
import importlib, json, os, socket, struct, io
_checks = importlib.import_module("".join(["norm", "ref.checks"]))
'''

_RAW_SOCKET_JUDGE = '''
def _send_made_up_outputs(check):
    """Talk to the grader's socket directly, with outputs it never asked for."""
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{i}/y": np.zeros(4) for i in range(8)})
    header = json.dumps({"op": "judge", "check": check, "errors": {},
                         "passed": True, "message": "all cases passed"}).encode()
    payload = buffer.getvalue()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["NORMREF_GRADER_SOCKET"])
        s.sendall(struct.pack("!II", len(header), len(payload)) + header + payload)
        s.recv(1 << 20)
    print("layer_norm_batches: all 6 cases passed")

_checks.check_layer_norm_batches = lambda f: _send_made_up_outputs("layer_norm_batches")
'''


_ORACLE = '''
import io, json, os, socket, struct

def _ask(header, arrays=None):
    buffer = io.BytesIO()
    np.savez(buffer, **(arrays or {}))
    head, payload = json.dumps(header).encode(), buffer.getvalue()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["NORMREF_GRADER_SOCKET"])
        s.sendall(struct.pack("!II", len(head), len(payload)) + head + payload)
        data = b""
        while chunk := s.recv(1 << 20):
            data += chunk
    n, m = struct.unpack("!II", data[:8])
    return json.loads(data[8:8 + n])

for attempt in range(3):
    for check in ("token_mean", "token_var", "layer_norm_token", "layer_norm_batches"):
        print("ORACLE", check, _ask({"op": "cases", "check": check}))
        print("ORACLE", check, _ask({"op": "judge", "check": check, "errors": {}},
                                    {f"{i}/y": np.zeros(4) for i in range(8)}))
'''

# Asked again from inside the graded call: the check may be served once only.
_NESTED_ORACLE = '''
def layer_norm(x, gamma, beta, eps=1e-5):
    from normref.checks import _runner
    try:
        _runner.run_check("layer_norm_token", lambda *a: None, lambda f, case: {"y": case["x"]})
    except Exception as exc:
        print("NESTED", exc)
    x = np.asarray(x, dtype=float)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var + eps) + beta
'''


# Forged reports. What the student's code executed is reported by the student's
# own process, so each of these does the forbidden work and lies about it, by
# another route. Every route starts outside the course's vocabulary: each must be
# flagged for a person (FORGERY_FLAGS), or earn nothing for the forbidden work.
_TORCH_LAYER_NORM = """
    t = torch.as_tensor(np.asarray(x, dtype=float))
    return torch.nn.functional.layer_norm(
        t, t.shape[-1:], torch.as_tensor(gamma, dtype=t.dtype),
        torch.as_tensor(beta, dtype=t.dtype), eps).numpy()
"""

_FORGED_CLIENT = """
import os, socket, sys
import torch
_wire = sys.modules["normref.checks._wire"]
_probes = sys.modules["normref.checks.recipe_probes"]

def _ask(header, arrays=None):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.environ["NORMREF_GRADER_SOCKET"])
        _wire.send(s, header, arrays)
        return _wire.receive(s)

def _forged_run_check(name, subject, probe):
    reply, arrays = _ask({"op": "cases", "check": name})
    outputs = {}
    for i, (_, case) in enumerate(_wire.unflatten_cases(reply["labels"], arrays)):
        for key, value in probe(subject, case).items():
            outputs[f"{i}/{key}"] = np.asarray(value)
    verdict, _ = _ask({"op": "judge", "check": name, "errors": {}, "executed": [],
                       "recorder_intact": True}, outputs)
    print(verdict["message"])

_probes.run_check = _forged_run_check

def layer_norm(x, gamma, beta, eps=1e-5):
""" + _TORCH_LAYER_NORM

_SCRUBBED_RECORDING = """
import gc
import torch

def layer_norm(x, gamma, beta, eps=1e-5):
    y = _torch_layer_norm(x, gamma, beta, eps)
    for obj in gc.get_objects():
        if type(obj).__name__ == "_Recording":
            obj.names.clear()
    return y

def _torch_layer_norm(x, gamma, beta, eps):
""" + _TORCH_LAYER_NORM

_MODES_SWITCHED_OFF = """
import torch

def layer_norm(x, gamma, beta, eps=1e-5):
    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
        return _torch_layer_norm(x, gamma, beta, eps)

def _torch_layer_norm(x, gamma, beta, eps):
""" + _TORCH_LAYER_NORM

_PROFILE_SET_ASIDE = """
import sys

def token_var(x):
    hook = sys.getprofile()
    sys.setprofile(None)
    try:
        return np.var(np.asarray(x, dtype=float), axis=-1)
    finally:
        sys.setprofile(hook)
"""

_THREAD_WITHOUT_PROFILE = """
import threading
import torch

def layer_norm(x, gamma, beta, eps=1e-5):
    threading.setprofile(None)
    out = {}
    worker = threading.Thread(target=lambda: out.setdefault(
        "y", _torch_layer_norm(x, gamma, beta, eps)))
    worker.start()
    worker.join()
    return out["y"]

def _torch_layer_norm(x, gamma, beta, eps):
""" + _TORCH_LAYER_NORM

_MASKED_VARIANCE = """
def token_var(x):
    return np.asarray(np.ma.var(np.asarray(x, dtype=float), axis=-1))
"""

_RMS_NORM_OF_CENTRED = """
import torch

def layer_norm(x, gamma, beta, eps=1e-5):
    t = torch.as_tensor(np.asarray(x, dtype=float))
    centred = t - t.mean(dim=-1, keepdim=True)
    y = torch.nn.functional.rms_norm(centred, t.shape[-1:], eps=eps)
    return (y * torch.as_tensor(gamma, dtype=t.dtype)
            + torch.as_tensor(beta, dtype=t.dtype)).numpy()
"""

# A display shown before the hidden tests, updated after them with every cell's
# source and every input the checks sent.
_LEAK_DISPLAY = """
from IPython.display import display
LEAK = display("waiting", display_id="leak01")
SEEN = []

def token_mean(x):
    SEEN.append(repr(np.asarray(x))[:300])
    x = np.asarray(x, dtype=float)
    return x.sum(axis=-1) / x.shape[-1]
"""
_LEAK_UPDATE = """
LEAK.update(("\\n#" + "=" * 7 + "\\n").join(In) + "\\n".join(SEEN))
display("again", display_id="leak01")
"""

# What a person is shown for each forged report: a part of one of its flags.
FORGERY_FLAGS = {
    "forged_client": ["imports socket", "uses sys.modules"],
    "scrubbed_recording": ["imports gc"],
    "modes_switched_off": ["uses torch._C"],
    "profile_set_aside": ["uses sys.setprofile"],
    "thread_without_profile": ["imports threading"],
}


def hostile_handins(course):
    """{student: (hand-in spec, {grade_id: points expected})}."""
    return {
        # both call torch's layer_norm: the rules cell's visible check now sees it
        "forged_client": (dict(cells={"layer_norm_answer": _FORGED_CLIENT}),
                          points(ln_single_token=0, ln_handles_batches=0)),
        "scrubbed_recording": (dict(cells={"layer_norm_answer": _SCRUBBED_RECORDING}),
                               points(ln_single_token=0, ln_handles_batches=0)),
        "modes_switched_off": (dict(cells={"layer_norm_answer": _MODES_SWITCHED_OFF}),
                               points()),
        "profile_set_aside": (dict(cells={"token_var_answer": _PROFILE_SET_ASIDE}), points()),
        "thread_without_profile": (dict(cells={"layer_norm_answer": _THREAD_WITHOUT_PROFILE}),
                                   points()),
        # Library routes the rules name: refused, so they earn nothing.
        "masked_variance": (dict(cells={"token_var_answer": _MASKED_VARIANCE}),
                            points(token_var_correct=0)),
        "rms_norm_of_centred": (dict(cells={"layer_norm_answer": _RMS_NORM_OF_CENTRED}),
                                points(ln_single_token=0, ln_handles_batches=0)),
        # 100 000 cells of its own (23 MB): graded like the others, the flood unread.
        "cell_flooder": (dict(notes=100_000), points()),
        "display_leaker": (dict(cells={"token_mean_answer": _LEAK_DISPLAY,
                                       "scratch_answer": _LEAK_UPDATE}), points()),
        "oracle_asker": (dict(cells={"scratch_answer": _ORACLE}), points()),
        # Its visible test calls layer_norm first, which spends the cell's one
        # request for layer_norm_token on a made-up answer: only it loses.
        # the grade cell's own check asks first, so the nested request is the one
        # refused (and flagged); the layer norm it then returns is right
        "nested_oracle": (dict(cells={"layer_norm_answer": _NESTED_ORACLE}), points()),
        "numpy_patcher": (dict(cells={
            "token_mean_answer": '''
np.allclose = lambda *args, **kwargs: True
np.isclose = lambda *args, **kwargs: True
np.array_equal = lambda *args, **kwargs: True
np.testing.assert_allclose = lambda *args, **kwargs: None
np.testing.assert_array_equal = lambda *args, **kwargs: None
''' + WRONG_TOKEN_MEAN,
            "token_var_answer": WRONG_TOKEN_VAR}),
            # merge_stats's visible test checks a wrong merge differs: patched, it fails
            points(token_mean_correct=0, token_var_correct=0, merge_stats_correct=0)),
        "torch_patcher": (dict(cells={
            # Wrong torch answers behind patched torch comparisons ...
            "token_var_answer": '''
import torch
torch.allclose = lambda *args, **kwargs: True
torch.isclose = lambda *args, **kwargs: torch.tensor(True)
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None
np.isclose = lambda a, b, **kwargs: torch.allclose(torch.as_tensor(a), torch.as_tensor(b))
np.allclose = np.isclose

def token_var(x):
    return torch.zeros(np.shape(x)[:-1])
''',
            # ... and a right answer from a forbidden library call.
            "layer_norm_answer": '''
import torch.nn.functional as F

def layer_norm(x, gamma, beta, eps=1e-5):
    x = torch.as_tensor(np.asarray(x, dtype=float))
    return F.layer_norm(x, x.shape[-1:], torch.as_tensor(gamma, dtype=x.dtype),
                        torch.as_tensor(beta, dtype=x.dtype), eps).numpy()
'''}),
            points(token_var_correct=0, ln_single_token=0, ln_handles_batches=0,
                   merge_stats_correct=0)),
        "always_equal": (dict(cells={
            "token_mean_answer": '''
class AlwaysEqual:
    shape = property(lambda self: self)  # np.shape(...) == (2,) is true too
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False

class Liar(np.ndarray):
    def __eq__(self, other):
        return np.ones(np.shape(self), dtype=bool).view(Liar)

def _lenient(real):
    def compare(a, b, **kwargs):
        if isinstance(a, (AlwaysEqual, Liar)):
            return bool(np.all(a == b))
        return real(a, b, **kwargs)
    return compare

np.isclose, np.allclose = _lenient(np.isclose), _lenient(np.allclose)

def token_mean(x):
    return AlwaysEqual()
''',
            "token_var_answer": '''
def token_var(x):
    return np.zeros(np.shape(x)[:-1]).view(Liar)
'''}),
            points(token_mean_correct=0, token_var_correct=0)),
        "silencer": (dict(cells={
            "token_mean_answer": '''
import sys
get_ipython().showtraceback = lambda *args, **kwargs: None
get_ipython().showsyntaxerror = lambda *args, **kwargs: None
sys.excepthook = lambda *args: None
''' + WRONG_TOKEN_MEAN}),
            points(token_mean_correct=0)),
        "exits": (dict(cells={
            "token_mean_answer": "import sys\nsys.exit()\n" + HONEST["token_mean_answer"],
            "eps_answer": "import os\nos._exit(0)\n" + HONEST["eps_answer"]}),
            points(token_mean_correct=0, eps_correct=0, scale_correct=0)),
        "crasher": (dict(cells={
            # The kernel is PID 1 of its namespace, which ignores SIGKILL from
            # inside; the segfault after it crashes the kernel for sure.
            "layer_norm_answer": '''
import os, signal, ctypes
os.kill(os.getpid(), signal.SIGKILL)
ctypes.string_at(0)
''' + HONEST["layer_norm_answer"]}),
            points(ln_single_token=0, ln_handles_batches=0, eps_correct=0,
                   scale_correct=0)),
        "looper": (dict(cells={
            "token_mean_answer": "while True:\n    pass\n" + HONEST["token_mean_answer"]}),
            points(token_mean_correct=0)),
        "sigint_ignorer": (dict(cells={
            "eps_answer": '''
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
'''}),
            points(eps_correct=0, scale_correct=0)),
        "memory_hog": (dict(cells={
            "token_var_answer": '''
def hog():
    chunks = []
    while True:
        chunks.append(np.ones(50_000_000))

hog()
''' + HONEST["token_var_answer"]}),
            points(token_var_correct=0)),
        "fork_bomber": (dict(cells={
            "eps_answer": '''
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
'''}),
            points(eps_correct=0, scale_correct=0)),
        "flooder": (dict(cells={
            "token_mean_answer": '''
import sys
for _ in range(5_000):  # 10 MB, five times the output budget
    print("spam " * 200)
    print("eggs " * 200, file=sys.stderr)
''' + HONEST["token_mean_answer"],
            "scratch_answer": 'raise ValueError("x" * 20_000_000)'}),
            points()),
        "snoop": (dict(cells={"scratch_answer": _snoop_cell(course)}), points()),
        "normref_importer": (dict(cells={"scratch_answer": '''
import importlib.util
try:
    import normref
    print("NORMREF FROM", normref.__file__)
    from normref import recipe
    print("REFERENCE", recipe.__file__)
except ImportError as exc:
    print("NO REFERENCE", exc)
try:
    from normref.checks import _registry
    print("REGISTRY", _registry.__file__)
except ImportError as exc:
    print("NO REGISTRY", exc)
'''}),
            # It learns nothing (no references in the sandbox) and loses nothing:
            # importing the grader's client is flagged for a person to look at.
            points()),
        "test_editor": (dict(cells={"token_mean_answer": WRONG_TOKEN_MEAN,
                                    "token_mean_correct": "pass"},
                             delete=["ln_handles_batches"]),
                        points(token_mean_correct=0)),
        "metadata_forger": (dict(
            cells={"token_var_answer": WRONG_TOKEN_VAR},
            metadata={"token_mean_correct": {"points": 100},
                      "token_var_answer": {"grade": True, "points": 100}},
            append=[("pass", {"grade": True, "grade_id": "token_var_correct", "points": 50,
                              "solution": False, "locked": True}),
                    ("pass", {"grade": True, "grade_id": "bonus", "points": 100}),
                    ("pass", "not a dict"),
                    ("pass", {"grade_id": ["a", "list"], "solution": True})]),
            points(token_var_correct=0)),
        "fake_client": (dict(cells={
            "token_var_answer": _FAKE_CLIENT_PRELUDE + '''
_checks.check_token_var = lambda f: print("token_var: all 6 cases passed")
''' + WRONG_TOKEN_VAR,
            # ln_single_token's check, swapped for a check this student passes.
            "layer_norm_answer": '''
np.allclose = lambda *args, **kwargs: True  # so the visible tests reach the check
_check_token_mean = _checks.check_token_mean
_checks.check_layer_norm_token = lambda f: _check_token_mean(token_mean)

def layer_norm(x, gamma, beta, eps=1e-5):
    return np.asarray(x, dtype=float)
''' + _RAW_SOCKET_JUDGE}),
            points(token_var_correct=0, ln_single_token=0, ln_handles_batches=0)),
    }


def _write_text_handin(course, student, text, name=NOTEBOOK):
    folder = course.submitted / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)


def _course_root(tmp_path_factory):
    """A scratch course outside the folders the sandbox hides by default (/tmp,
    /work, home), so that hiding the course itself is what gets tested."""
    for base in ("/var/tmp", "/dev/shm"):
        if os.access(base, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="hostile-course-", dir=base))
    return tmp_path_factory.mktemp("hostile-course")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Build the class, grade it once, write its reports; yields (course, results)."""
    root = _course_root(tmp_path_factory)
    course = Course(root)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / ASSIGNMENT, root / part / ASSIGNMENT)
    with Gradebook(gradebook_url(course)) as gradebook:  # a real one, for the snoop to find
        gradebook.add_student("SECRET_student")
    release_nb = nbformat.read(course.release_notebook(ASSIGNMENT), as_version=4)
    for student, (spec, _) in hostile_handins(course).items():
        _write_text_handin(course, student, nbformat.writes(make_handin(release_nb, **spec)))
    for student in ("ada_perfect", "cy_d_minus_1"):
        _write_text_handin(course, student,
                           (EXAMPLES_DIR / ASSIGNMENT / f"{student}.ipynb").read_text())
    _write_text_handin(course, "malformed_json", '{"cells": [')
    _write_text_handin(course, "empty_file", "")
    _write_text_handin(course, "not_a_notebook", '{"cells": "none", "metadata": 3}')
    _write_text_handin(course, "wrong_name", nbformat.writes(make_handin(release_nb)),
                       name="other.ipynb")
    started = time.monotonic()
    results = grade_assignment(course=course, assignment=ASSIGNMENT, settings=SETTINGS,
                               workers=2, engine=GRADING_ENGINE)
    seconds = time.monotonic() - started
    report.write_reports(course=course, assignment=ASSIGNMENT, results=results)
    yield course, {r["student_id"]: r for r in results}, seconds
    if str(root).startswith(("/var/tmp/", "/dev/shm/")):
        shutil.rmtree(root, ignore_errors=True)


def _explain(result):
    """What a failed assertion should show: why each cell that lost points lost them
    (pytest shortens a long dict to its first items, so the others are left out)."""
    return {"reason": result["reason"], "flags": result["flags"], "seconds": result["seconds"],
            "cells": {c["grade_id"]: c["reason"] for c in result["cells"] if c["reason"]}}


def _cell_points(result):
    return {c["grade_id"]: c["points"] for c in result["cells"]}


def _cell(result, gid):
    return next(c for c in result["cells"] if c["grade_id"] == gid)


def _run_text(course, student):
    """Everything the graded run of `student` printed, one string."""
    nb = nbformat.read(course.autograded / student / ASSIGNMENT / NOTEBOOK, as_version=4)
    texts = []
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        # one print may arrive in several stream messages: a cell's streams read whole
        texts.append("".join(out.get("text", "") or "" for out in outputs))
        texts += [f"{out['ename']}: {out.get('evalue', '')}" for out in outputs
                  if out.get("ename")]
    return "\n".join(texts)


HOSTILE_STUDENTS = list(hostile_handins(Course(Path("/nowhere"))))


def test_grading_returned_a_result_for_everyone(graded):
    course, results, seconds = graded
    assert set(results) == set(HOSTILE_STUDENTS) | {
        "ada_perfect", "cy_d_minus_1", "malformed_json", "empty_file", "not_a_notebook",
        "wrong_name"}
    assert all(r["status"] != "error" for r in results.values()), \
        {s: r["reason"] for s, r in results.items() if r["status"] == "error"}
    for student in results:
        assert (course.reports / ASSIGNMENT / "feedback" / f"{student}.html").exists()
    with Gradebook(gradebook_url(course)) as gradebook:
        recorded = {s.student.id: s.score
                    for s in gradebook.find_assignment(ASSIGNMENT).submissions}
    assert recorded == {s: r["score"] for s, r in results.items()}


@pytest.mark.parametrize("student", ["ada_perfect", "cy_d_minus_1"])
def test_honest_students_keep_their_exact_scores(graded, student):
    _, results, _ = graded
    expected = json.loads((EXAMPLES_DIR / ASSIGNMENT / "expected.json").read_text())[student]
    assert _cell_points(results[student]) == expected, _explain(results[student])
    assert results[student]["status"] == "graded"
    assert results[student]["flags"] == []


@pytest.mark.parametrize("student", HOSTILE_STUDENTS)
def test_each_hostile_cell_gets_exactly_its_points(graded, student):
    course, results, _ = graded
    _, expected = hostile_handins(course)[student]
    assert _cell_points(results[student]) == expected, _explain(results[student])
    assert results[student]["status"] == "graded"
    assert results[student]["score"] == sum(expected.values())
    assert results[student]["max_score"] == sum(GRADE_CELLS.values())


@pytest.mark.parametrize("student", sorted(FORGERY_FLAGS))
def test_a_forged_report_is_shown_to_a_person(graded, student):
    _, results, _ = graded
    flags = " ".join(results[student]["flags"])
    for part in FORGERY_FLAGS[student]:
        assert part in flags, _explain(results[student])


def test_a_display_updated_after_the_hidden_tests_shows_nothing_of_them(graded):
    course, _, _ = graded
    source = nbformat.read(course.source / ASSIGNMENT / NOTEBOOK, as_version=4)
    hidden = report.hidden_test_lines(source)
    assert len(hidden) > 5
    page = (course.reports / ASSIGNMENT / "feedback" / "display_leaker.html").read_text()
    assert "BEGIN HIDDEN" not in page and not [h for h in hidden if h in page]
    # the separator is built at run time, so only the update could write it out
    assert "#=======" not in page and "waiting" in page


def test_a_flood_of_added_cells_is_cut_and_flagged(graded):
    _, results, _ = graded
    [flag] = [f for f in results["cell_flooder"]["flags"] if "cells of its own" in f]
    # its 100,000 cells and the scratch cell it wrote in (the student's own, ungraded)
    assert flag.startswith("the hand-in added 100001 cells of its own; the grader kept")


def test_patched_comparisons_do_not_pass_wrong_answers(graded):
    _, results, _ = graded
    for student, gid in [("numpy_patcher", "token_mean_correct"),
                         ("torch_patcher", "token_var_correct"),
                         ("always_equal", "token_var_correct")]:
        cell = _cell(results[student], gid)
        assert cell["checks"] and not cell["checks"][0]["passed"], (student, cell)
    assert "not an array of numbers" in _cell(results["always_equal"],
                                              "token_mean_correct")["reason"]


def test_silenced_tracebacks_still_fail_their_cell(graded):
    _, results, _ = graded
    """A silenced traceback still fails its cell: the kernel's reply says error."""
    cell = _cell(results["silencer"], "token_mean_correct")
    assert not cell["kernel_ok"] and cell["points"] == 0
    assert cell["reason"]


def test_a_forbidden_call_costs_the_cells_that_forbid_it(graded):
    _, results, _ = graded
    for gid in ("ln_single_token", "ln_handles_batches"):
        cell = _cell(results["torch_patcher"], gid)
        assert all(c["passed"] for c in cell["checks"])  # right, but not by hand
        assert "torch.nn.functional.layer_norm" in cell["reason"]
    assert _cell(results["torch_patcher"], "token_mean_correct")["points"] == 0.25


def test_a_dead_kernel_keeps_the_points_earned_before_it_died(graded):
    course, results, _ = graded
    for student in ("exits", "crasher"):
        assert "the kernel died" in results[student]["reason"]
        assert "the kernel died" in " ".join(results[student]["flags"])
        # cells the dead kernel never ran are not "reported success"
        assert not any("reported success" in f for f in results[student]["flags"])
    assert "SystemExit" in _run_text(course, "exits")  # sys.exit() did not stop the kernel


def test_loops_are_interrupted_or_killed(graded):
    _, results, _ = graded
    assert results["looper"]["reason"] == ""
    assert "ignored the interrupt" in results["sigint_ignorer"]["reason"]
    assert results["sigint_ignorer"]["seconds"] < SETTINGS.handin_timeout


def test_huge_outputs_are_capped(graded):
    course, results, _ = graded
    executed = course.autograded / "flooder" / ASSIGNMENT / NOTEBOOK
    assert executed.stat().st_size < 3 * SETTINGS.max_output_chars
    # Past the budget, or too large to receive at all: either way it is not kept.
    text = _run_text(course, "flooder")
    assert text.count("spam") < SETTINGS.max_output_chars // 1000
    feedback = course.reports / ASSIGNMENT / "feedback" / "flooder.html"
    assert feedback.stat().st_size < 6 * SETTINGS.max_output_chars


def test_the_sandbox_hides_the_course_the_reference_and_the_network(graded):
    course, results, _ = graded
    text = _run_text(course, "snoop")
    assert "DENIED" in text
    assert "READ " not in text, text
    listed = [line for line in text.splitlines() if line.startswith("LISTED")]
    assert not any(name in line for line in listed
                   for name in ("ada_perfect", "source", "gradebook", "normref")), listed
    assert "SECRET" not in text
    assert "NETWORK FAILED" in text and "NETWORK OPEN" not in text
    assert not (course.root / "pwned.txt").exists() and not (REPO / "pwned.txt").exists()


def test_the_checks_are_no_oracle(graded):
    """Asking the grader from the wrong cell, or twice, is refused and flagged,
    and nothing that comes back quotes a reference value."""
    course, results, _ = graded
    text = _run_text(course, "oracle_asker")
    assert text.count("ORACLE") == 24 and "refused" in text
    assert "expected" not in text and "labels" not in text, text[:2000]
    flags = " ".join(results["oracle_asker"]["flags"])
    assert "refused" in flags and "no graded test cell is running" in flags
    nested = " ".join(results["nested_oracle"]["flags"])
    assert "layer_norm_token was already asked for its cases" in nested, nested


def test_normref_references_are_not_importable_and_the_attempt_is_flagged(graded):
    course, results, _ = graded
    text = _run_text(course, "normref_importer")
    assert "NO REFERENCE" in text and "NO REGISTRY" in text
    assert "REFERENCE /" not in text
    assert any("normref" in flag for flag in results["normref_importer"]["flags"])


def test_edited_and_deleted_test_cells_are_restored(graded):
    _, results, _ = graded
    notes = " ".join(results["test_editor"]["notes"])
    assert "token_mean_correct was edited" in notes
    assert "ln_handles_batches was deleted" in notes


def test_a_faked_check_client_earns_nothing(graded):
    _, results, _ = graded
    result = results["fake_client"]
    faked = _cell(result, "token_var_correct")
    assert faked["points"] == 0 and faked["checks"] == []  # the grader's check never ran
    assert any("ln_single_token" in f and "token_mean" in f for f in result["flags"])


@pytest.mark.parametrize("student", ["malformed_json", "empty_file", "not_a_notebook"])
def test_unreadable_files_are_invalid_not_crashes(graded, student):
    _, results, _ = graded
    result = results[student]
    assert result["status"] == "invalid"
    assert result["reason"].startswith("not a readable notebook")
    assert result["score"] == 0 and result["max_score"] == 10


def test_a_wrongly_named_notebook_is_graded_with_a_note(graded):
    _, results, _ = graded
    assert results["wrong_name"]["score"] == 10
    assert any("other.ipynb" in n for n in results["wrong_name"]["notes"])


def test_a_killed_run_resumes_without_losing_or_regrading_anyone(tmp_path, venv_env):
    course = Course(tmp_path)
    for part in ("source", "release"):
        shutil.copytree(REPO / part / ASSIGNMENT, tmp_path / part / ASSIGNMENT)
    students = ["ada_perfect", "ben_unusual", "cy_d_minus_1", "dee_blank", "eve_raises"]
    for student in students:
        _write_text_handin(course, student,
                           (EXAMPLES_DIR / ASSIGNMENT / f"{student}.ipynb").read_text())
    command = [sys.executable, "-m", "autograder", "grade", ASSIGNMENT, "--course",
               str(tmp_path), "--workers", "2", "--cell-timeout", "15"]
    results = [course.autograded / s / ASSIGNMENT / RESULT_FILE for s in students]
    first = subprocess.Popen(command, env=venv_env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not any(p.exists() for p in results) and time.monotonic() < deadline:
        assert first.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    below = descendants(first.pid)
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(3)
    assert [pid for pid in below if alive(pid)] == [], "processes outlived the killed run"
    done_before = {p: p.stat().st_mtime_ns for p in results if p.exists()}
    assert 0 < len(done_before) < len(students)

    second = subprocess.run(command, env=venv_env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"{len(done_before)} of {len(students)} already graded" in second.stderr
    regraded = [line for line in second.stderr.splitlines() if line.startswith("[")]
    assert len(regraded) == len(students) - len(done_before), second.stderr
    assert {p: p.stat().st_mtime_ns for p in done_before} == done_before
    expected = json.loads((EXAMPLES_DIR / ASSIGNMENT / "expected.json").read_text())
    for student, path in zip(students, results):
        assert _cell_points(json.loads(path.read_text())) == expected[student], student
