"""`python -m autograder new-check` (autograder/authoring/scaffold.py): what it refuses, and that
the check it writes works, in-process.

Each test fails on a small bug in scaffold.py (`make mutation`). The check is
written into a scratch package folder holding only checks/; its two files are
executed here (the probe with run_check replaced by a recorder), so a wrong name,
shape list or reference in them shows.
"""

import numpy as np
import pytest

from autograder.authoring import scaffold
from autograder.authoring.scaffold import ScaffoldError, scaffold_check
from normref.checks.tolerances import mismatch


@pytest.fixture
def package(tmp_path):
    (tmp_path / "pkg" / "checks").mkdir(parents=True)
    return tmp_path / "pkg"


def _load(path):
    namespace = {"__name__": path.stem}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def test_the_written_check_compares_with_the_reference_on_each_shape(package):
    """The judge's cases are float64 and float32 arrays of each shape asked for; the
    judge passes the reference's own output and names the function on a wrong one;
    the probe hands the student's function a copy of x."""
    probes, judges = scaffold_check(name="negated", function="negate",
                                    reference="numpy:negative", shapes="3 2,5",
                                    package_dir=package)
    assert (probes, judges) == (package / "checks" / "negated_probes.py",
                                package / "checks" / "negated_judges.py")
    judge_ns = _load(judges)
    assert judge_ns["NEGATED_SHAPES"] == [(3,), (2, 5)]
    check = judge_ns["CHECKS"]["negated"]
    cases = check.cases(np.random.default_rng(0))
    assert [(label, case["x"].shape, case["x"].dtype) for label, case in cases] == [
        ("x of shape (3,)", (3,), np.float64), ("a float32 x of shape (3,)", (3,), np.float32),
        ("x of shape (2, 5)", (2, 5), np.float64),
        ("a float32 x of shape (2, 5)", (2, 5), np.float32)]
    for _, case in cases:
        assert check.judge(case, {"y": -case["x"]}) is None
        wrong = check.judge(case, {"y": case["x"]})
        assert wrong and "negate(x)" in wrong
        assert wrong == mismatch(case["x"], -case["x"].astype(np.float64),
                                 dtype=case["x"].dtype, what="negate(x)")

    probe_ns = _load(probes)
    calls = []
    probe_ns["run_check"] = lambda *args: calls.append(args)
    student = object()
    probe_ns["check_negated"](student)
    ((name, function, call),) = calls
    assert (name, function) == ("negated", student)
    x = np.arange(3.0)
    assert call(lambda a: a.__setitem__(0, 9.0) or a, {"x": x})["y"][0] == 9.0
    assert x[0] == 0.0  # the student's function got a copy


def test_default_shapes_are_a_matrix_and_a_batch(package):
    """Without --shapes: "4,8 2,3,16"."""
    _, judges = scaffold_check(name="doubled", function="double",
                               reference="numpy:negative", package_dir=str(package))
    assert _load(judges)["DOUBLED_SHAPES"] == [(4, 8), (2, 3, 16)]


@pytest.mark.parametrize("bad", ["Bad", "two-words", "9lives", "", "class", "x!", "é"])
def test_names_must_be_lower_case_python_names(package, bad):
    """A check or function name that is not a lower-case identifier (or is a keyword)
    would write code that does not import: refused, saying which."""
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name=bad, function="f", reference="numpy:negative",
                       package_dir=package)
    assert str(error.value) == f"the check's name {bad!r} must be a lower-case Python name"
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name="fine", function=bad, reference="numpy:negative",
                       package_dir=package)
    assert str(error.value) == f"--function {bad!r} must be a lower-case Python name"
    assert not list((package / "checks").iterdir())


def test_good_names_pass(package):
    """Underscores and digits after the first letter are fine."""
    assert scaffold._identifier("_private2", "x") == "_private2"
    assert scaffold._identifier("a_1", "x") == "a_1"


@pytest.mark.parametrize("text, message", [
    ("4,x", "--shapes '4,x': give shapes like \"4,8 2,3,16\""),
    ("4,,8", "--shapes '4,,8': give shapes like \"4,8 2,3,16\""),
    ("", "--shapes '': every shape needs positive sizes"),
    ("4,0", "--shapes '4,0': every shape needs positive sizes"),
    ("3 -1", "--shapes '3 -1': every shape needs positive sizes"),
])
def test_shapes_must_be_positive_sizes(package, text, message):
    """Shapes that cannot be parsed, none at all, or a size under 1: refused."""
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name="fresh", function="f", reference="numpy:negative",
                       shapes=text, package_dir=package)
    assert str(error.value) == message


def test_shapes_parse_to_tuples():
    """Each space-separated shape becomes a tuple of ints; size 1 is fine."""
    assert scaffold._shapes(" 1  2,3\t4,1,2 ") == [(1,), (2, 3), (4, 1, 2)]


@pytest.mark.parametrize("reference, message", [
    ("numpy", "--reference 'numpy': give MODULE:FUNCTION"),
    (":negative", "--reference ':negative': give MODULE:FUNCTION"),
    ("numpy:", "--reference 'numpy:': give MODULE:FUNCTION"),
    ("numpy:pi", "--reference 'numpy:pi' is not a function"),
    ("no_such_module_here:f", "--reference 'no_such_module_here:f' cannot be imported: "
                              "No module named 'no_such_module_here'"),
    ("numpy:no_such_thing", "--reference 'numpy:no_such_thing' cannot be imported: "
                            "module 'numpy' has no attribute 'no_such_thing'"),
    ("numpy:linalg:norm", "--reference 'numpy:linalg:norm' cannot be imported: "
                          "module 'numpy' has no attribute 'linalg:norm'"),
])
def test_the_reference_must_be_an_importable_function(package, reference, message):
    """The reference is imported before anything is written: a check against a
    reference that is missing or not callable would fail every student."""
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name="fresh", function="f", reference=reference, package_dir=package)
    assert str(error.value) == message
    assert not list((package / "checks").iterdir())


def test_a_dotted_module_reference_is_found():
    """MODULE may be dotted; FUNCTION is what follows the first colon."""
    scaffold._reference_exists("normref.recipe:token_mean")
    scaffold._reference_exists("os.path:join")


def test_a_name_defined_in_any_check_file_is_taken(package):
    """A check name already defined, as a probe (def check_NAME) in any *_probes.py or
    as a judge ("NAME": Check) in any *_judges.py, is refused, naming the file."""
    checks = package / "checks"
    (checks / "mine_probes.py").write_text("x = 1\n\ndef check_fresh(f):\n    pass\n")
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name="fresh", function="f", reference="numpy:negative",
                       package_dir=package)
    assert str(error.value) == "a check named 'fresh' already exists in mine_probes.py"
    (checks / "mine_probes.py").unlink()
    (checks / "theirs_judges.py").write_text("CHECKS = {\n    'fresh':  Check(a, b)}\n")
    with pytest.raises(ScaffoldError, match="already exists in theirs_judges.py"):
        scaffold_check(name="fresh", function="f", reference="numpy:negative",
                       package_dir=package)
    assert sorted(p.name for p in checks.iterdir()) == ["theirs_judges.py"]


def test_a_similar_name_is_not_taken(package):
    """check_fresher, "refresh" or a comment mentioning check_fresh do not take fresh."""
    checks = package / "checks"
    (checks / "a_probes.py").write_text("def check_fresher(f):\n    pass\n"
                                        "    def check_fresh(f):  # nested, not a check\n")
    (checks / "b_judges.py").write_text('CHECKS = {"refresh": Check(a, b)}\n')
    (checks / "notes.py").write_text("def check_fresh(f):\n    pass\n")
    probes, _ = scaffold_check(name="fresh", function="f", reference="numpy:negative",
                               package_dir=package)
    assert probes.is_file()


@pytest.mark.parametrize("taken", ["fresh_probes.py", "fresh_judges.py"])
def test_an_existing_file_is_never_overwritten(package, taken):
    """If either file exists (even without the check in it), nothing is written."""
    (package / "checks" / taken).write_text("# mine\n")
    with pytest.raises(ScaffoldError) as error:
        scaffold_check(name="fresh", function="f", reference="numpy:negative",
                       package_dir=package)
    assert str(error.value) == f"{taken} already exists"
    assert [p.name for p in (package / "checks").iterdir()] == [taken]
    assert (package / "checks" / taken).read_text() == "# mine\n"


def test_the_course_package_is_the_default_place():
    """By default the check goes into the course's normref/checks/, whose names are
    taken already (refused, so nothing is written)."""
    with pytest.raises(ScaffoldError, match="a check named 'token_mean' already exists in "
                                            "recipe_"):
        scaffold_check(name="token_mean", function="f", reference="numpy:negative")
