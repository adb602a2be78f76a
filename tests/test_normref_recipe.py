"""normref's unit-01 references against torch and the syllabus, and its checks."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import normref
from normref.checks import (
    CheckFailed,
    check_layer_norm_batches,
    check_layer_norm_token,
    check_predictions,
    check_token_mean,
    check_token_var,
)


@pytest.mark.parametrize("shape", [(4,), (3, 7), (2, 5, 16), (1, 1, 3), (6, 2, 2, 33)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_layer_norm_matches_torch(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(3.0, 2.0, size=shape).astype(dtype)
    gamma = rng.normal(size=shape[-1]).astype(dtype)
    beta = rng.normal(size=shape[-1]).astype(dtype)
    expected = F.layer_norm(torch.from_numpy(x).double(), (shape[-1],),
                            torch.from_numpy(gamma).double(), torch.from_numpy(beta).double(),
                            eps=1e-5).numpy()
    y = normref.layer_norm(x, gamma, beta)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, expected, rtol=1e-5 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_statistics_match_torch():
    x = np.random.default_rng(1).normal(size=(3, 4, 9))
    t = torch.from_numpy(x)
    np.testing.assert_allclose(normref.token_mean(x), t.mean(-1).numpy())
    np.testing.assert_allclose(normref.token_var(x), t.var(-1, unbiased=False).numpy())


def test_worked_example_a():
    x = [2.0, 4.0, 6.0, 8.0]
    assert normref.token_mean(x) == 5.0
    assert normref.token_var(x) == 5.0
    assert np.sqrt(normref.token_var(x)) == pytest.approx(2.236, abs=5e-4)
    y = normref.layer_norm(x)
    np.testing.assert_allclose(y, [-1.342, -0.447, 0.447, 1.342], atol=5e-4)
    no_eps = normref.layer_norm(x, eps=0.0)
    assert np.abs(y - no_eps).max() < 5e-6  # eps moves only the 6th decimal
    assert np.abs(y - no_eps).max() > 5e-7


def test_worked_example_b():
    z = [2.0, 6.0, 4.0, 12.0]
    assert normref.token_mean(z) == 6.0 and normref.token_var(z) == 14.0
    np.testing.assert_allclose(normref.layer_norm(z), [-1.0690, 0.0, -0.5345, 1.6036],
                               atol=5e-5)
    # The syllabus rounds x_hat to 4 decimals before scaling; exact values differ by 1e-4.
    np.testing.assert_allclose(normref.layer_norm(z, [2.0] * 4, [1.0] * 4),
                               [-1.1380, 1.0000, -0.0690, 4.2072], atol=1.5e-4)


def test_invariance_to_shift_and_scale():
    x = np.array([2.0, 4.0, 6.0, 8.0])
    y = normref.layer_norm(x)
    assert np.array_equal(normref.layer_norm(x + 7.0), y) or \
        np.abs(normref.layer_norm(x + 7.0) - y).max() < 1e-14
    np.testing.assert_allclose(normref.layer_norm(0.001 * x), [-0.775, -0.258, 0.258, 0.775],
                               atol=5e-4)
    assert np.abs(normref.layer_norm(0.25 * x) - y).max() < 1e-4
    np.testing.assert_allclose(normref.layer_norm(-2 * x), -normref.layer_norm(2 * x))
    gamma, beta = np.full(4, 2.0), np.full(4, 1.0)
    np.testing.assert_array_equal(normref.layer_norm(0 * x, gamma, beta), beta)


def test_more_syllabus_checks():
    np.testing.assert_allclose(normref.layer_norm([0.0, 3.0]), [-1.0, 1.0], atol=1e-5)
    np.testing.assert_array_equal(normref.layer_norm([5.0, 5.0, 5.0, 5.0]), np.zeros(4))
    np.testing.assert_allclose(normref.layer_norm([2.0, 4.0, 6.0, 8.0], [2.0] * 4, [1.0] * 4),
                               [-1.683, 0.106, 1.894, 3.683], atol=5e-4)
    near_equal = normref.layer_norm([1.0, 1.001, 1.002, 1.003])
    assert near_equal.std() < 1.0


def test_batch_independence():
    x = np.array([2.0, 4.0, 6.0, 8.0])
    batch = np.stack([x, np.array([100.0, -3.0, 0.5, 9.0])])
    np.testing.assert_array_equal(normref.layer_norm(batch)[0], normref.layer_norm(x))


def _ln(x, gamma, beta, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) + beta


def test_checks_pass_correct_code(capsys):
    check_token_mean(lambda x: np.mean(x, axis=-1))
    check_token_var(lambda x: np.var(x, axis=-1))
    check_layer_norm_token(_ln)
    check_layer_norm_batches(_ln)
    check_layer_norm_batches(lambda x, g, b, eps=1e-5: torch.from_numpy(_ln(x, g, b, eps)))
    check_predictions(shift_changes_output=False, negative_scale_effect="flipped",
                      zero_scale_output="beta", batch_mates_matter=False)
    assert "all 6 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda x, g, b, eps=1e-5: g * (x - x.mean(-1, keepdims=True))
     / np.sqrt(x.var(-1, ddof=1, keepdims=True) + eps) + b, "d - 1"),
    (lambda x, g, b, eps=1e-5: g * (x - x.mean(-1, keepdims=True))
     / (x.std(-1, keepdims=True) + eps) + b, "inside the square root"),
    (lambda x, g, b, eps=1e-5: b * (x - x.mean(-1, keepdims=True))
     / np.sqrt(x.var(-1, keepdims=True) + eps) + g, "gamma scales"),
])
def test_layer_norm_checks_name_the_mistake(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_layer_norm_token(wrong)


def test_batch_check_catches_whole_array_statistics():
    def whole_array(x, g, b, eps=1e-5):
        return g * (x - x.mean()) / np.sqrt(x.var() + eps) + b

    check_layer_norm_token(whole_array)  # fine for one token
    with pytest.raises(CheckFailed, match="per token"):
        check_layer_norm_batches(whole_array)


def test_variance_check_names_the_mistakes():
    with pytest.raises(CheckFailed, match="not d - 1"):
        check_token_var(lambda x: np.var(x, axis=-1, ddof=1))
    with pytest.raises(CheckFailed, match="standard deviation"):
        check_token_var(lambda x: np.std(x, axis=-1))
    with pytest.raises(CheckFailed, match="shape"):
        check_token_mean(lambda x: np.mean(x, axis=0))


def test_checks_report_errors_and_refuse_objects():
    def broken(x):
        raise ZeroDivisionError("oops")

    with pytest.raises(CheckFailed, match="ZeroDivisionError: oops"):
        check_token_mean(broken)

    class AlwaysEqual:
        def __eq__(self, other):
            return True

    with pytest.raises(CheckFailed, match="not an array of numbers"):
        check_token_mean(lambda x: AlwaysEqual())


def test_prediction_check_names_wrong_answers():
    with pytest.raises(CheckFailed, match="other tokens"):
        check_predictions(shift_changes_output=False, negative_scale_effect="flipped",
                          zero_scale_output="beta", batch_mates_matter=True)
    with pytest.raises(CheckFailed, match="no answer"):
        check_predictions(shift_changes_output=False)
