"""The listing of mutants kept on purpose (docs/mutation_equivalents/) stays true:
each kept change is found again by its text after edits elsewhere renumber mutmut's
mutants, and every line it names still exists in its function."""

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("mutation", REPO / "scripts" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)

LISTINGS = sorted(p for p in mutation.EQUIVALENTS.glob("*.md") if p.name != "README.md")

# Prints, as JSON, {mutant name: the diff `mutmut show` prints for it} for a module,
# with mutmut's own mutant generator (run where a pyproject names the source folder).
MUTMUT_DIFFS = """
import json, sys
from pathlib import Path
import libcst as cst
from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.utils.format_utils import get_mutant_name
path = Path(sys.argv[1])
mutated = mutate_file_contents(str(path), path.read_text(), None, None)
print(json.dumps({get_mutant_name(path, n): get_diff_for_mutant(
    get_mutant_name(path, n), source=mutated.code, path=path) for n in mutated.mutant_names}))
"""


def _mutmut_diffs(folder, source):
    (folder / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["pkg"]\n')
    (folder / "pkg").mkdir(exist_ok=True)
    (folder / "pkg" / "mod.py").write_text(textwrap.dedent(source))
    done = subprocess.run([sys.executable, "-c", MUTMUT_DIFFS, "pkg/mod.py"], cwd=folder,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_a_kept_change_is_still_recognised_after_an_edit_renumbers_the_mutants(tmp_path):
    before = _mutmut_diffs(tmp_path, """
        def label(count):
            return f"{count} item(s)" if count else "none"
        """)
    (kept,) = [name for name, diff in before.items() if "if (count) or True" in diff]
    listing = f"```diff {mutation._function(kept)}\n" + "\n".join(
        line for line in before[kept].splitlines()
        if line[:1] in "+-" and line[:3] not in ("---", "+++")) + "\n```\nwhy\n"
    listed = mutation.equivalents(listing)

    after = _mutmut_diffs(tmp_path, """
        def label(count):
            count = int(count)
            if count < 0:
                raise ValueError("a count is never negative")
            return f"{count} item(s)" if count else "none"
        """)
    matches = [name for name, diff in after.items()
               if (mutation._function(name), *mutation._changed_lines(diff)) in listed]
    assert len(matches) == 1
    assert matches[0] != kept, "the edit was meant to renumber the mutant"
    assert "if (count) or True" in after[matches[0]]


def _function_node(tree, qualified):
    """The definition of `Class.method` or `function` in a parsed module, or None."""
    scope = tree.body
    *classes, name = qualified.split(".")
    for class_name in classes:
        (node,) = [n for n in scope if isinstance(n, ast.ClassDef) and n.name == class_name]
        scope = node.body
    found = [n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and n.name == name]
    return found[0] if found else None


@pytest.mark.parametrize("listing", LISTINGS, ids=lambda p: p.stem)
def test_every_line_a_kept_change_takes_out_is_still_in_its_function(listing):
    text = listing.read_text()
    module = text.splitlines()[0].removeprefix("# ").strip()
    assert mutation._listing(module) == listing, f"{listing.name} is not named after {module}"
    source = (REPO / module).read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    kept = mutation.equivalents(text)
    assert kept, f"{listing.name} lists no change"
    stale = []
    for function, taken_out, _ in sorted(kept):
        node = _function_node(tree, function)
        body = ({line.strip() for line in lines[node.lineno - 1:node.end_lineno]}
                if node else set())
        stale += [f"{function}: {line}" for line in taken_out if line not in body]
    assert not stale, (f"{listing.name} names lines its module no longer has (update or "
                       "drop those entries):\n" + "\n".join(stale))
