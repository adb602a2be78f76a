"""What the student edition and its site share: the units, where each file of a unit
lies in the edition, and the Binder, Colab and site links built from the public
repository's address.

The edition is a separate, public repository that holds the lessons, the released
assignments and the student environment, and nothing of the grading side. Its layout:

    notebooks/NN_slug_lesson.ipynb          the lessons
    assignments/NN_slug/NN_slug.ipynb       the released assignments

A lesson's file name ends in "_lesson", so that a unit's lesson and assignment never
share a name (two JupyterLab tabs, or the lesson handed in for the assignment).
    docs/                                   the site (static HTML, for GitHub Pages)
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from autograder.course import LESSON_SUFFIX

LESSONS_DIR = "notebooks"
LESSON_DATA = "data"  # in LESSONS_DIR: files the lessons read, by this relative path
ASSIGNMENTS_DIR = "assignments"
SITE_DIR = "docs"
BINDER = "https://mybinder.org"
COLAB = "https://colab.research.google.com"

# "# Lesson 01: the recipe", "# 02 Rows versus ...", "# 03 · PyTorch's ...", "# Unit 06: ..."
_HEADING = re.compile(r"^#\s+(?:(?:lesson|unit|assignment)\s+)?\d+\s*[:·.\-]?\s*(?P<title>.+)$",
                      re.IGNORECASE)
_GITHUB = re.compile(r"^https://github\.com/(?P<owner>[A-Za-z0-9][A-Za-z0-9-]{0,38})/"
                     r"(?P<name>[A-Za-z0-9._-]{1,100}?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Unit:
    """One unit of the course: its lesson and, where there is one, its assignment."""

    slug: str  # "01_the_recipe"
    title: str  # "The layer-norm recipe"
    lesson: Path  # notebooks/01_the_recipe_lesson.ipynb in the course
    assignment: Path | None  # release/01_the_recipe/01_the_recipe.ipynb in the course

    @property
    def number(self):
        return self.slug.split("_", 1)[0]

    @property
    def lesson_path(self):
        """The lesson's path in the edition."""
        return f"{LESSONS_DIR}/{self.lesson.name}"

    @property
    def assignment_path(self):
        """The assignment's path in the edition (None without one)."""
        if self.assignment is None:
            return None
        return f"{ASSIGNMENTS_DIR}/{self.slug}/{self.assignment.name}"

    @property
    def page(self):
        """The lesson's page in the site, relative to the site's root."""
        return f"{LESSONS_DIR}/{self.lesson.stem}.html"


def notebook_title(path):
    """The title of a notebook: its first heading, without "Lesson 01:" and the like."""
    notebook = json.loads(Path(path).read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for line in "".join(cell["source"]).splitlines():
            if line.startswith("# "):
                match = _HEADING.match(line.strip())
                title = (match.group("title") if match else line[2:]).strip()
                return title[:1].upper() + title[1:]
    return Path(path).stem.split("_", 1)[-1].replace("_", " ").capitalize()


def units(course):
    """The course's units, in order: every lesson in notebooks/ (NN_slug_lesson.ipynb),
    paired with the released assignment NN_slug/NN_slug.ipynb."""
    found = []
    for lesson in sorted((course.root / LESSONS_DIR).glob("*.ipynb")):
        slug = lesson.stem.removesuffix(LESSON_SUFFIX)
        released = course.release / slug / f"{slug}.ipynb"
        found.append(Unit(slug=slug, title=notebook_title(lesson), lesson=lesson,
                          assignment=released if released.is_file() else None))
    return found


@dataclass(frozen=True)
class Repository:
    """The public GitHub repository of the edition, and the links into it."""

    owner: str
    name: str
    branch: str = "main"
    site_url: str = ""

    @classmethod
    def parse(cls, url, *, branch="main", site_url=None):
        match = _GITHUB.match((url or "").strip())
        if not match:
            raise ValueError(f"--repo-url must be a GitHub repository address, "
                             f"https://github.com/OWNER/NAME (Binder and Colab open "
                             f"notebooks from GitHub), got {url!r}")
        if not re.fullmatch(r"[A-Za-z0-9._/-]+", branch or ""):
            raise ValueError(f"not a branch name: {branch!r}")
        owner, name = match.group("owner"), match.group("name")
        site = site_url or f"https://{owner.lower()}.github.io/{name}/"
        return cls(owner=owner, name=name, branch=branch,
                   site_url=site if site.endswith("/") else site + "/")

    @property
    def url(self):
        return f"https://github.com/{self.owner}/{self.name}"

    def binder(self, path=None):
        """Binder, opening JupyterLab at `path` (a notebook or a folder)."""
        base = f"{BINDER}/v2/gh/{self.owner}/{self.name}/{quote(self.branch, safe='')}"
        return base if path is None else f"{base}?urlpath={quote('lab/tree/' + path, safe='/')}"

    def colab(self, path):
        """Colab, opening one notebook from the repository."""
        return f"{COLAB}/github/{self.owner}/{self.name}/blob/{self.branch}/{path}"

    def site(self, page=""):
        return self.site_url + page

    def as_dict(self):
        return {"repo_url": self.url, "branch": self.branch, "site_url": self.site_url}
