"""Where things live in a course directory (see DESIGN.md, "Layout")."""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
EXAMPLES_DIR = PACKAGE_DIR / "examples"
POLICIES_DIR = PACKAGE_DIR / "policies"
REPO_ROOT = PACKAGE_DIR.parent
# A lesson is notebooks/NN_slug_lesson.ipynb: never the name of its assignment's notebook.
LESSON_SUFFIX = "_lesson"


def path_with_tools():
    """PATH with this interpreter's bin/ first, where nbgrader, alembic and
    jupyter-book live even when the virtual environment is not activated.

    Without PATH, programs are looked for in os.defpath: the result keeps looking
    there, rather than in an empty entry (the current folder).
    """
    bin_dir = str(Path(sys.executable).parent)
    rest = [entry for entry in os.environ.get("PATH", os.defpath).split(os.pathsep)
            if entry != bin_dir]
    return os.pathsep.join([bin_dir, *rest])


@dataclass(frozen=True)
class Course:
    """A course directory: source/, release/ and the course data beside them."""

    root: Path

    @classmethod
    def at(cls, root=None):
        return cls(Path(root or REPO_ROOT).resolve())

    @property
    def source(self):
        return self.root / "source"

    @property
    def release(self):
        return self.root / "release"

    @property
    def submitted(self):
        return self.root / "submitted"

    @property
    def autograded(self):
        return self.root / "autograded"

    @property
    def reports(self):
        return self.root / "reports"

    def assignments(self):
        """Assignment names: the folders of source/ that hold a notebook."""
        if not self.source.is_dir():
            return []
        return sorted(p.name for p in self.source.iterdir()
                      if p.is_dir() and any(p.glob("*.ipynb")))

    def notebook_names(self, assignment):
        """The assignment's notebook file names, sorted (nbgrader allows several)."""
        notebooks = sorted(p.name for p in (self.source / assignment).glob("*.ipynb"))
        if not notebooks:
            raise FileNotFoundError(f"source/{assignment} holds no notebook")
        return notebooks

    def notebook_name(self, assignment):
        """The notebook file name of a one-notebook assignment."""
        notebooks = self.notebook_names(assignment)
        if len(notebooks) > 1:
            raise ValueError(f"source/{assignment} holds {len(notebooks)} notebooks: "
                             "use notebook_names")
        return notebooks[0]

    def source_notebook(self, assignment):
        return self.source / assignment / self.notebook_name(assignment)

    def release_notebook(self, assignment):
        return self.release / assignment / self.notebook_name(assignment)

    def students(self, assignment):
        """Students with a hand-in for `assignment` in submitted/."""
        if not self.submitted.is_dir():
            return []
        return sorted(p.name for p in self.submitted.iterdir()
                      if (p / assignment).is_dir())
