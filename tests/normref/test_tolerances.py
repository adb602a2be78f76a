"""The tolerance table and its comparison, pinned down to the sentence a student reads.

Each test fails on a small bug in normref/checks/tolerances.py (a tolerance
loosened, a branch dropped, a word of the feedback changed): see `make mutation`.
"""

import numpy as np
import pytest

from normref.checks import tolerances
from normref.checks.tolerances import matches, mismatch, tolerance_for


@pytest.mark.parametrize("dtype, expected", [
    ("float64", (1e-6, 1e-8)), ("float32", (1e-4, 1e-5)), ("bfloat16", (2e-2, 2e-2)),
    ("float16", (5e-3, 5e-3)), (np.float32, (1e-4, 1e-5)), (np.dtype("float16"), (5e-3, 5e-3)),
    ("int64", (1e-6, 1e-8)), (np.int32, (1e-6, 1e-8)),
])
def test_each_dtype_has_its_tolerance_and_others_get_float64s(dtype, expected):
    assert tolerance_for(dtype) == expected


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_the_edge_of_each_tolerance(dtype):
    rtol, atol = tolerances.TOLERANCES[dtype]
    expected = np.array([0.0, 100.0])
    inside = expected + 0.9 * np.array([atol, atol + rtol * 100.0])
    outside = expected + 1.1 * np.array([atol, atol + rtol * 100.0])
    assert mismatch(inside, expected, dtype=dtype) is None
    assert matches(inside, expected, dtype=dtype) is True
    assert mismatch(outside, expected, dtype=dtype) is not None
    assert matches(outside, expected, dtype=dtype) is False
    assert matches(outside[:1], expected[:1], dtype=dtype) is False  # atol alone
    assert matches(outside[1:], expected[1:], dtype=dtype) is False  # rtol alone


def test_a_wrong_shape_is_named():
    assert mismatch(np.zeros(3), np.zeros(4), dtype="float64") == (
        "your result has shape (3,); expected shape (4,)")
    assert mismatch(np.zeros((2, 1)), np.zeros(2), dtype="float64", what="y") == (
        "y has shape (2, 1); expected shape (2,)")


def test_values_that_are_not_numbers_are_named_but_booleans_compare():
    assert mismatch(np.array(["a"]), np.array([1.0]), dtype="float64") == (
        "your result holds <U1 values, not numbers")
    assert mismatch(np.array([True, False]), np.array([1.0, 0.0]), dtype="float64") is None
    assert mismatch(np.array([True]), np.array([0.0]), dtype="float64") is not None


def test_nan_where_a_number_is_due_is_named_and_nan_for_nan_is_right():
    assert mismatch(np.array([np.nan, 1.0]), np.array([1.0, 1.0]), dtype="float64") == (
        "your result contains NaN where the answer is a number: [nan,  1.]")
    assert mismatch(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), dtype="float64") is None
    assert mismatch(np.array([1.0]), np.array([np.nan]), dtype="float64") is not None


def test_the_sentence_shows_both_arrays_and_the_largest_difference():
    actual = np.array([[1.0, 5.0], [3.0, 9.0]])
    expected = np.array([[1.0, 2.0], [3.0, 4.0]])
    assert mismatch(actual, expected, dtype="float64") == (
        "your result is [1., 5., 3., 9.]; expected [1., 2., 3., 4.] "
        "(largest difference 5, tolerance rtol=1e-06, atol=1e-08)")
    assert mismatch(np.array(2.1), np.array(2.0), dtype="float64", what="s") == (
        "s is [2.1]; expected [2.] (largest difference 0.1, tolerance rtol=1e-06, atol=1e-08)")


def test_values_alike_at_four_decimals_get_the_worst_index_in_full():
    expected = np.arange(10.0)
    actual = expected.copy()
    actual[9] += 1.0
    assert mismatch(actual, expected, dtype="float32") == (
        "your result is [0., 1., 2., 3., 4., 5., 6., 7., ...]; expected [0., 1., 2., 3., 4., "
        "5., 6., 7., ...]; they look alike at the 4 decimals shown, but at index (9,) yours "
        "is 10 and the answer 9 (largest difference 1, tolerance rtol=0.0001, atol=1e-05)")
    assert mismatch(np.array([1.0, 2.00001]), np.array([1.0, 2.0]), dtype="float64",
                    what="y") == (
        "y is [1., 2.]; expected [1., 2.]; they look alike at the 4 decimals shown, but at "
        "index (1,) yours is 2.00001 and the answer 2 (largest difference 1e-05, tolerance "
        "rtol=1e-06, atol=1e-08)")


def test_the_worst_index_is_the_one_furthest_out_of_tolerance_not_the_largest_gap():
    # Index 0 differs by 3e-6 on 1 (1.99e-6 out of tolerance), index (1, 1) by 2.5e-6 on 0
    # (2.49e-6 out): the sentence points at (1, 1) and quotes 3e-6 as the largest difference.
    expected = np.array([[1.0, 0.0], [0.0, 0.0]])
    actual = expected + np.array([[3.0e-6, 0.0], [0.0, 2.5e-6]])
    message = mismatch(actual, expected, dtype="float64")
    assert "at index (1, 1) yours is 2.5e-06 and the answer 0 " in message, message
    assert "(largest difference 3e-06," in message, message
    # A NaN gap (nan expected and nan given at another place) never wins the argmax.
    expected = np.array([np.nan, 5.0, 5.0])
    actual = np.array([np.nan, 5.0, 5.00001])
    message = mismatch(actual, expected, dtype="float64")
    assert "at index (2,) yours is 5.00001 and the answer 5 " in message, message


def test_an_empty_array_matches_an_empty_array():
    assert mismatch(np.zeros(0), np.zeros(0), dtype="float64") is None


@pytest.mark.parametrize("size, shown", [
    (8, "[0., 1., 2., 3., 4., 5., 6., 7.]"),
    (9, "[0., 1., 2., 3., 4., 5., 6., 7., ...]"),
])
def test_show_cuts_after_eight_values(size, shown):
    assert tolerances._show(np.arange(float(size))) == shown
    assert tolerances._show(np.array([0.123456, 1e-9])) == "[0.1235, 0.    ]"
    assert tolerances._show(np.arange(4.0), limit=2) == "[0., 1., ...]"


def test_a_single_value_alike_at_four_decimals_has_no_index():
    assert mismatch(np.array(2.00001), np.array(2.0), dtype="float64") == (
        "your result is [2.]; expected [2.]; they look alike at the 4 decimals shown, but "
        "yours is 2.00001 and the answer 2 (largest difference 1e-05, tolerance rtol=1e-06, "
        "atol=1e-08)")


def test_integers_compare_as_numbers_and_show_as_floats():
    assert mismatch(np.array([1, 2]), np.array([1.0, 2.0]), dtype="float64") is None
    assert mismatch(np.array([1, 3]), np.array([1.0, 2.0]), dtype="float64") == (
        "your result is [1., 3.]; expected [1., 2.] "
        "(largest difference 1, tolerance rtol=1e-06, atol=1e-08)")
    assert tolerances._show(np.arange(3)) == "[0., 1., 2.]"


@pytest.mark.parametrize("answer, value", [
    (16, 16.0), ("16.0", 16.0), ("1e-3", 0.001), ("1e3", 1000.0), ("2.5E1", 25.0),
    ("-2", -2.0), ("+3", 3.0), (" 3.5 ", 3.5), (np.array("2"), 2.0), ("7/2", 3.5),
    ("np.int64(16)", 16.0), ("np.int32(5)", 5.0), ("np.float32(4.0)", 4.0),
    ("np.float64(0.1)", 0.1), ("tensor(3.5000)", 3.5), ("tensor(6144)", 6144.0),
    ("tensor(16, dtype=torch.int32)", 16.0),
    ("tensor(0.6910, device='cuda:0')", 0.691), ("tensor(0.8500, requires_grad=True)", 0.85),
    ("tensor(2., grad_fn=<MulBackward0>)", 2.0), ("Decimal('3.5')", 3.5),
])
def test_a_numeric_answer_of_any_exact_type_reads_as_its_value(answer, value):
    assert tolerances.number_from_answer(answer) == value


def test_numeric_answers_of_python_numpy_and_torch_types_read_as_their_values():
    """What str() of each type the assignments' text allows gives, read back."""
    from decimal import Decimal
    from fractions import Fraction

    import torch

    for answer in (Fraction(7, 2), Decimal("3.5"), np.float32(3.5), np.float64(3.5),
                   torch.tensor(3.5), 3.5):
        assert tolerances.number_from_answer(str(answer)) == 3.5, answer


@pytest.mark.parametrize("answer", ["True", "abc", "sixteen", "16 images", "nan", "inf",
                                    "-inf", np.array("nan"), None, "1/0", "", "None", "[16]",
                                    "np.int64(16", "tensor([3.])", "3 4",
                                    "tensor(1., device=cuda:0, 2)"])
def test_what_is_not_one_finite_number_reads_as_none(answer):
    assert tolerances.number_from_answer(answer) is None
