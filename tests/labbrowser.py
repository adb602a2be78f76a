"""A private JupyterLab server and a headless Chromium, for the browser tests and the
README screenshots.

The server runs from this interpreter's environment on a free loopback port with a
random token, serves a folder the caller chose (always a temporary copy, so nothing in
the repository changes), and keeps its configuration, settings, workspaces and runtime
files in a scratch folder beside it: nothing in ~/.jupyter is read or written.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("COURSE_CHROMIUM", "/usr/bin/chromium")
# No downloads, no background traffic: Chromium never leaves 127.0.0.1.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}

# JupyterLab user settings for the test server only.
LAB_SETTINGS = {
    # Every cell attached to the page, so queries and screenshots see all of them.
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    # No "news?" toast over the notebook, no update checks.
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                    "checkForUpdates": False},
    # Typed code lands as typed (no closing brackets inserted for us).
    "@jupyterlab/codemirror-extension/plugin": {
        "defaultConfig": {"autoClosingBrackets": False}},
}


def chromium_available():
    return os.access(CHROMIUM, os.X_OK)


def launch_chromium(playwright):
    """Debian's Chromium, headless (Playwright's own browsers are never downloaded)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def chromium_session():
    """Yield a headless Chromium for a module's tests (skip when it is missing)."""
    import pytest

    playwright_api = pytest.importorskip("playwright.sync_api")
    if not chromium_available():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    playwright = playwright_api.sync_playwright().start()
    chromium = launch_chromium(playwright)
    yield chromium
    chromium.close()
    playwright.stop()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """`jupyter lab` serving `root`, started by start() and stopped by stop()."""

    def __init__(self, root, scratch, *, start_timeout=120.0, python=None):
        """python: the interpreter of the environment that serves (default this one's)."""
        self.root = Path(root)
        self.bin_dir = Path(python or sys.executable).parent
        self.scratch = Path(scratch)
        self.start_timeout = start_timeout
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = self.scratch / "jupyterlab.log"
        self.process = None

    def _environment(self):
        dirs = {name: self.scratch / name for name in ("config", "data", "runtime", "ipython")}
        for folder in dirs.values():
            folder.mkdir(parents=True, exist_ok=True)
        bin_dir = str(self.bin_dir)
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("JUPYTER", "JPY_"))}
        env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
                   JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
                   JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), IPYTHONDIR=str(dirs["ipython"]))
        return env

    def _write_settings(self):
        settings = self.scratch / "user-settings"
        for plugin, values in LAB_SETTINGS.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        return settings

    def start(self):
        settings = self._write_settings()
        jupyter = self.bin_dir / "jupyter"
        command = [
            str(jupyter if jupyter.exists() else shutil.which("jupyter")), "lab",
            "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}", "--ServerApp.allow_root=True",
            f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={self.scratch / 'workspaces'}",
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        log = self.log_path.open("wb")
        # cwd is the served folder, as with `make lab`: nbgrader reads
        # nbgrader_config.py from there.
        self.process = subprocess.Popen(command, cwd=self.root, env=self._environment(),
                                        stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                self.api("GET", "/api/status", timeout=5)
                return self
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)  # polling a socket: there is nothing to wait on
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer within {self.start_timeout:.0f} s:\n"
                           f"{self.log_tail()}")

    def stop(self, timeout=30.0):
        """Stop our own server by its process id: SIGTERM, then SIGKILL after `timeout`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # the server shuts its kernels down on SIGTERM
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=timeout)

    def url(self, path):
        separator = "&" if "?" in path else "?"
        return f"{self.base}/{path.lstrip('/')}{separator}token={self.token}"

    def api(self, method, path, timeout=30):
        request = urllib.request.Request(
            f"{self.base}{path}", method=method,
            headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self):
        """End every session (and so its kernel), so kernels don't pile up in memory."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def log_tail(self, lines=40):
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# -- driving a notebook in the page ---------------------------------------------------

PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on show

# The page scripts below take the notebook panel's selector as their argument.
KERNEL_READY = """panel => {
  const root = document.querySelector(panel);
  const name = root && root.querySelector('.jp-KernelName');
  const state = root && root.querySelector('.jp-Notebook-ExecutionIndicator');
  return !!name && !name.textContent.includes('No Kernel')
    && !!state && state.dataset.status === 'idle';
}"""

# Run All has finished: the kernel is idle, no cell is queued ([*]), and either every
# code cell has its number or an error stopped the run (the later cells stay [ ]).
RUN_FINISHED = """panel => {
  const root = document.querySelector(panel);
  const state = root.querySelector('.jp-Notebook-ExecutionIndicator').dataset.status;
  // A cell whose code is folded away (source_hidden) shows no prompt at all.
  const prompts = [...root.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
    .map(p => p.textContent.trim()).filter(p => p !== '');
  if (state !== 'idle' || prompts.some(p => p.includes('*'))) return false;
  return prompts.every(p => /^\\[\\d+\\]:$/.test(p))
    || !!root.querySelector('[data-mime-type="application/vnd.jupyter.stderr"]');
}"""

# What a slider drives: the Output widgets of its cell (the figure's image data and
# any printed read-out), without the sliders' own read-outs.
DRIVEN_OUTPUT = """handle => [...handle.closest('.jp-CodeCell').querySelectorAll('.widget-output')]
  .map(o => o.innerText.trim() + ' '
    + [...o.querySelectorAll('img')].map(i => i.getAttribute('src')).join(' '))
  .join('\\n').trim()"""

# A slider's step has been drawn: its output is new, not empty, and the kernel idle.
REDRAWN = f"""([handle, before, panel]) => {{
  const now = ({DRIVEN_OUTPUT})(handle);
  const state = document.querySelector(panel + ' .jp-Notebook-ExecutionIndicator');
  return now.length > 0 && now !== before && state.dataset.status === 'idle';
}}"""


def open_notebook(page, lab, path, workspace, timeout_ms=90_000):
    """Open `path` in a workspace of its own (no tabs restored from another page) and
    wait (bounded) until its kernel is idle."""
    page.goto(lab.url(f"lab/workspaces/{workspace}/tree/{path}?reset"))
    page.wait_for_function(KERNEL_READY, arg=PANEL, timeout=timeout_ms, polling=250)
    # Fold the file browser away: more of the notebook in the screenshots.
    open_tab = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if open_tab.count():
        open_tab.click()


def run_all_cells(page, timeout_ms=180_000):
    """Run > Run All Cells, then wait (bounded) until the run is over; returns the
    seconds it took. The notebook must not have run yet: "every cell has a number"
    is how the end is recognised."""
    prompts = page.locator(f"{PANEL} .jp-CodeCell .jp-InputPrompt").all_inner_texts()
    # A cell whose code is folded away (source_hidden) shows no prompt at all.
    assert all(p.strip() in ("[ ]:", "") for p in prompts), \
        "run_all_cells wants a fresh notebook"
    started = time.monotonic()
    page.locator("#jp-menu-panel").get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_function(RUN_FINISHED, arg=PANEL, timeout=timeout_ms, polling=500)
    return time.monotonic() - started
