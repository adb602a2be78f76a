"""The student environment (environment.yml) and the pip pins agree."""

import re

from conftest import REPO


def _pins(lines):
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip().lstrip("- ").strip()
        match = re.match(r"^([A-Za-z0-9_.-]+)\s*==\s*([^\s;]+)\s*(;.*)?$", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def test_environment_yml_names_the_pinned_student_packages():
    requirements = _pins((REPO / "requirements.txt").read_text().splitlines())
    environment = _pins((REPO / "environment.yml").read_text().splitlines())
    assert set(requirements) == set(environment)
    for name, version in requirements.items():
        assert environment[name] == version, f"{name}: {environment[name]} vs {version}"


def test_environment_yml_pins_python_311_and_leaves_out_instructor_code():
    text = (REPO / "environment.yml").read_text()
    assert re.search(r"python\s*=\s*3\.11", text)
    assert "normref" not in text and "autograder" not in text and "-e ." not in text


def test_required_student_packages_are_pinned():
    requirements = _pins((REPO / "requirements.txt").read_text().splitlines())
    for name in ("jupyterlab", "ipywidgets", "numpy", "matplotlib", "nbgrader", "torch",
                 "triton"):
        assert name in requirements


def _lines(lines):
    return sorted(line.split("#")[0].strip().lstrip("- ").strip() for line in lines
                  if re.match(r"^\s*-?\s*[A-Za-z0-9_.-]+\s*==", line))


def test_environment_yml_and_requirements_txt_have_the_same_platform_markers():
    """A pin for some platforms only (Triton, on Linux) is so in both files."""
    assert _lines((REPO / "requirements.txt").read_text().splitlines()) == \
        _lines((REPO / "environment.yml").read_text().splitlines())
