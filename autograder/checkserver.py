"""The grader's end of the trusted checks.

One server per hand-in, on a Unix socket that is the only thing the sandbox
shares with the grader. The sandboxed kernel asks it for a check's inputs and
sends back the student's outputs as plain arrays; the server judges them here,
against normref, and logs the verdict under the cell that was running. That
log, not anything the kernel prints, decides the score.
"""

import socket
import threading
from dataclasses import dataclass

from normref.checks import _registry, _wire


@dataclass
class Verdict:
    cell: str
    check: str
    passed: bool
    message: str


class CheckServer:
    """Serves check requests on `path` in a background thread.

    `current_cell` is set by the runner before each cell executes; every
    verdict is logged against it. `seed` varies the generated inputs.
    """

    def __init__(self, path, *, seed=0):
        self.path = str(path)
        self.seed = seed
        self.current_cell = None
        self.verdicts = []
        self._cases = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
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
                    reply, payload = {"passed": False, "message": f"grader error: {exc}"}, {}
                try:
                    _wire.send(conn, reply, payload)
                except OSError:
                    pass

    def _cases_for(self, name):
        if name not in self._cases:
            self._cases[name] = _registry.make_cases(name, seed=self.seed)
        return self._cases[name]

    def _answer(self, header, arrays):
        name = str(header.get("check"))
        if header.get("op") == "cases":
            labels, flat = _wire.flatten_cases(self._cases_for(name))
            return {"labels": labels}, flat
        if header.get("op") == "judge":
            errors = {str(k): str(v) for k, v in dict(header.get("errors", {})).items()}
            verdict = _registry.judge(name, self._cases_for(name), arrays, errors)
            with self._lock:
                self.verdicts.append(Verdict(str(self.current_cell), name,
                                             bool(verdict["passed"]), verdict["message"]))
            return verdict, {}
        raise ValueError(f"unknown request {header.get('op')!r}")
