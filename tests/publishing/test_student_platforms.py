"""The edition installs on the machines students have: its requirements.txt resolves
from PyPI alone, wheels only, on Linux (x86-64 and aarch64), macOS on Apple silicon and
Windows, for the edition's Python 3.11.

Resolved by uv (`uv pip compile --python-platform`), which reads each wheel's metadata
from PyPI without downloading it; the answer is PyPI's, not this machine's: its pip
configuration and local wheels are ignored (UV_NO_CONFIG, --index-url). torch 2.13.0
publishes wheels for manylinux_2_28 x86-64 and aarch64, macOS 14 arm64 and win_amd64
only (an Intel Mac has none: Colab or Binder), and on Linux requires triton==3.7.1
itself. A pin with no wheel for a platform, or two pins that cannot go together there,
fail here with uv's explanation.
"""

import os
import re
import subprocess

import pytest
from packaging.requirements import Requirement

from conftest import REPO

PYPI = "https://pypi.org/simple"
PLATFORMS = {  # uv's name -> the environment markers of such a machine
    "x86_64-manylinux_2_28": {"sys_platform": "linux", "platform_machine": "x86_64"},
    "aarch64-manylinux_2_28": {"sys_platform": "linux", "platform_machine": "aarch64"},
    "aarch64-apple-darwin": {"sys_platform": "darwin", "platform_machine": "arm64"},
    "x86_64-pc-windows-msvc": {"sys_platform": "win32", "platform_machine": "AMD64"},
}
UNREACHABLE = re.compile(r"dns error|failed to lookup address|Connect|timed out",
                         re.IGNORECASE)


def _requirements():
    return [Requirement(line.split("#")[0]) for line in
            (REPO / "requirements.txt").read_text().splitlines() if line.split("#")[0].strip()]


def _resolve(platform, tmp_path):
    from uv import find_uv_bin

    lock = tmp_path / f"{platform}.txt"
    done = subprocess.run(
        [find_uv_bin(), "pip", "compile", str(REPO / "requirements.txt"), "--python-platform",
         platform, "--python-version", "3.11", "--only-binary", ":all:", "--index-url", PYPI,
         "--no-header", "--quiet", "--output-file", str(lock)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "UV_NO_CONFIG": "1", "UV_CACHE_DIR": str(tmp_path / "cache"),
             # torch 2.13.0's macOS wheels are for macOS 14 and later
             "MACOSX_DEPLOYMENT_TARGET": "14.0"})
    if done.returncode and UNREACHABLE.search(done.stderr) and "No solution" not in done.stderr:
        pytest.skip(f"PyPI is not reachable from here: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, f"{platform}:\n{done.stderr[-3000:]}"
    return {Requirement(line).name.lower(): Requirement(line).specifier
            for line in lock.read_text().splitlines() if line and not line.startswith(" ")
            and not line.startswith("#")}


@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_requirements_resolve_from_pypi_alone_on_each_students_platform(
        platform, tmp_path):
    resolved = _resolve(platform, tmp_path)
    markers = PLATFORMS[platform]
    for requirement in _requirements():
        name = requirement.name.lower()
        applies = requirement.marker is None or requirement.marker.evaluate(
            {**markers, "python_version": "3.11", "python_full_version": "3.11.9"})
        if applies:
            (pin,) = requirement.specifier
            assert str(resolved[name]) == f"=={pin.version}", f"{name} on {platform}"
        else:
            assert name not in resolved, f"{name} is pinned off {platform}, yet installed"


def test_triton_is_pinned_where_it_has_wheels_and_as_torch_requires_it():
    """Triton on Linux only, at the version PyPI's torch itself requires there: another
    version cannot be installed beside torch from PyPI (the edition's pin once was)."""
    triton = next(r for r in _requirements() if r.name == "triton")
    assert str(triton.marker) == 'sys_platform == "linux"'
    assert str(triton.specifier) == "==3.7.1"
