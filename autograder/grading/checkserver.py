"""The grader's end of the trusted checks.

One server per hand-in, on a Unix socket that is the only thing the sandbox
shares with the grader. The sandboxed kernel asks it for a check's inputs and
sends back the student's outputs as plain arrays; the server judges them here,
against normref, and logs the verdict under the cell that was running. That
log, not anything the kernel prints, decides the score.

The server answers only what the running grade cell needs: each check that
cell calls, its inputs once and its verdict once. Anything else (a check from
another cell, a repeat, a request between cells) is refused and recorded, so
the checks cannot be used as an oracle. What goes back into the kernel is pass
or fail and the failing case's label; the full diagnosis, which may quote
reference values, stays in the log for the feedback report.
"""

import socket
import threading
import zlib
from collections import Counter
from dataclasses import dataclass

from normref.checks import _registry, _wire

MAX_EXECUTED_NAMES = 2000


@dataclass
class Verdict:
    cell: str
    check: str
    passed: bool
    message: str
    executed: tuple = ()  # torch calls the student's code ran while probed
    recorder_intact: bool = True


@dataclass
class Refusal:
    cell: str
    check: str
    op: str
    why: str


class CheckServer:
    """Serves check requests on `path` in a background thread.

    cell_checks: {grade_id: (check names the cell calls, in order)}; only
    these are served, each once per call in the cell. record_cells: grade ids
    whose probed calls must report what they executed (cells with a policy).
    `current_cell` is set by the runner before each cell executes; every
    verdict is logged against it. `seed` varies the generated inputs (each call
    of a check gets inputs of its own).
    """

    def __init__(self, path, *, cell_checks, record_cells=(), seed=0):
        self.path = str(path)
        self.seed = seed
        self.cell_checks = {gid: Counter(checks) for gid, checks in cell_checks.items()}
        self.record_cells = set(record_cells)
        self.current_cell = None
        self.verdicts = []
        self.refusals = []
        self._served = Counter()
        self._cases = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        # The judges import torch on first use (seconds): loaded now, before the
        # kernel starts, so that no cell's time limit pays for it.
        _registry.check_names()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        # close() alone leaves the thread blocked in accept(), still serving the
        # socket: shutdown() wakes it, and it returns.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _serve(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(120)
                try:
                    header, arrays = _wire.receive(conn)
                    reply, payload = self._answer(header, arrays)
                except Exception as exc:  # a malformed request must not stop the server
                    self._refuse(str(self.current_cell), "?", "?",
                                 f"malformed request ({type(exc).__name__})")
                    reply, payload = {"passed": False, "refused": True,
                                      "message": "the grader refused a malformed request"}, {}
                try:
                    _wire.send(conn, reply, payload)
                except OSError:
                    pass

    def _cases_for(self, cell, name, call):
        """The inputs of the `call`-th call of check `name` in `cell`: fresh for
        every call, so that answers worked out between calls (outside any
        recording) cannot be replayed."""
        key = (cell, name, call)
        if key not in self._cases:
            self._cases[key] = _registry.make_cases(
                name, seed=case_seed(self.seed, cell=cell, check=name, call=call))
        return self._cases[key]

    def _refuse(self, cell, check, op, why):
        with self._lock:
            self.refusals.append(Refusal(cell, check, op, why))
        return {"passed": False, "refused": True,
                "message": f"the grader refused this request: {why}"}, {}

    def _admit(self, cell, name, op):
        """None if `op` on check `name` is due in `cell` now, else why not."""
        if cell not in self.cell_checks:
            return "no graded test cell is running"
        allowed = self.cell_checks[cell][name]
        if not allowed:
            return f"the running cell {cell} does not call {name}"
        key = (cell, name, op)
        if op == "judge" and self._served[(cell, name, "cases")] <= self._served[key]:
            return f"{name} was asked for a verdict before its inputs"
        if self._served[key] >= allowed:
            return f"{name} was already asked for its {op} in {cell}"
        self._served[key] += 1
        return None

    def _answer(self, header, arrays):
        cell, name, op = str(self.current_cell), str(header.get("check")), header.get("op")
        if op not in ("cases", "judge"):
            return self._refuse(cell, name, str(op), "unknown request")
        with self._lock:
            why = self._admit(cell, name, op)
        if why:
            return self._refuse(cell, name, op, why)
        call = self._served[(cell, name, op)] - 1  # _admit counted this request
        if op == "cases":
            labels, flat = _wire.flatten_cases(self._cases_for(cell, name, call))
            return {"labels": labels, "record": cell in self.record_cells}, flat
        errors = {str(k): str(v)[:2000] for k, v in dict(header.get("errors", {})).items()}
        executed = tuple(sorted({str(n)[:200] for n in list(header.get("executed") or [])
                                 [:MAX_EXECUTED_NAMES + 1]}))
        # A list at the cap may have been cut: what it left out cannot be judged.
        intact = (header.get("recorder_intact", True) is True
                  and len(executed) < MAX_EXECUTED_NAMES)
        verdict = _registry.judge(name, self._cases_for(cell, name, call), arrays, errors)
        with self._lock:
            self.verdicts.append(Verdict(
                cell, name, bool(verdict["passed"]), verdict["message"],
                executed=executed[:MAX_EXECUTED_NAMES], recorder_intact=intact))
        return student_reply(name, verdict), {}


def case_seed(seed, *, cell, check, call):
    """The seed of the inputs of the `call`-th call (from 0) of `check` in `cell`,
    in a run whose seed is `seed`."""
    return zlib.crc32(f"{seed}/{cell}/{check}/{call}".encode())


def student_reply(name, verdict):
    """What the kernel may see of a verdict: no reference values, no per-item detail."""
    if verdict["passed"]:
        return {"passed": True, "message": f"{name}: passed"}
    if verdict.get("raised"):  # the student's own exception is theirs to see
        return {"passed": False, "message": verdict["message"]}
    return {"passed": False,
            "message": f"{name}: failed on the case '{verdict.get('case')}'. The feedback "
                       "report says what was wrong."}
