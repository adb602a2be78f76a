"""normref's unit-01 references against torch and float64 math, and its checks."""

import math
import statistics
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import normref
from autograder.grading import forbidden
from normref import recipe
from normref.checks import (
    CheckFailed,
    _runner,
    check_breaking_offset,
    check_chunked_var,
    check_chunked_var_merges,
    check_layer_norm_batches,
    check_layer_norm_token,
    check_merge_stats,
    check_s_for_half_output,
    check_safe_spread,
    check_spacing_estimate,
    check_spread_gap_reason,
    check_tiled_method,
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


def _offset_tokens(offset, shape, dtype, seed=0):
    return (offset + np.random.default_rng(seed).normal(size=shape)).astype(dtype)


@pytest.mark.parametrize("offset, dtype", [(1e4, np.float32), (1e8, np.float64)])
def test_reference_variance_is_accurate_where_the_shortcut_is_not(offset, dtype):
    x = _offset_tokens(offset, (4, 64), dtype)
    # statistics.pvariance works in exact fractions: the true variance of x.
    truth = np.array([statistics.pvariance(row.tolist()) for row in x])
    np.testing.assert_allclose(recipe.token_var(x), truth, rtol=1e-6 if dtype == np.float32
                               else 1e-12)
    # torch's var (float64) agrees to float64's precision times the offset.
    torch_var = torch.from_numpy(x).double().var(-1, unbiased=False).numpy()
    np.testing.assert_allclose(torch_var, truth, rtol=1e-7)
    # The shortcut misses by more than the whole variance (about 1).
    assert np.abs(recipe.shortcut_var(x) - truth).max() > 1.0
    # In float64 the shortcut is fine at 1e4 and lost at 1e8 (offset^2 * eps ~ 1).
    shortcut_64 = recipe.shortcut_var(x.astype(np.float64))
    assert (np.abs(shortcut_64 - truth).max() < 1e-6) == (offset == 1e4)


def _two_pass(x):
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(-1, keepdims=True)
    return (centred * centred).mean(-1)


def _two_pass_same_dtype(x):
    x = np.asarray(x)
    centred = x - x.mean(-1, keepdims=True)
    return np.einsum("...d,...d->...", centred, centred) / x.shape[-1]


def _welford_same_dtype(x):
    x = np.asarray(x)
    mean = np.zeros(x.shape[:-1], x.dtype)
    m2 = np.zeros(x.shape[:-1], x.dtype)
    for k in range(x.shape[-1]):
        delta = x[..., k] - mean
        mean = mean + delta / (k + 1)
        m2 = m2 + delta * (x[..., k] - mean)
    return m2 / x.shape[-1]


def _shifted_by_first_feature(x):
    x = np.asarray(x, dtype=np.float64)
    s = x - x[..., :1]
    return (s * s).mean(-1) - s.mean(-1) ** 2


def _shortcut(x):
    x = np.asarray(x)
    return (x * x).mean(-1) - x.mean(-1) ** 2


def _shortcut_64(x):
    return _shortcut(np.asarray(x, dtype=np.float64))


def _ln(x, gamma, beta, eps=1e-5, var=_two_pass):
    mu = x.mean(-1, keepdims=True)
    return gamma * (x - mu) / np.sqrt(var(x)[..., None] + eps) + beta


def _fsum_per_token(x):
    rows = np.asarray(x, dtype=np.float64).reshape(-1, np.shape(x)[-1])
    out = []
    for row in rows:
        mu = math.fsum(row) / row.size
        out.append(math.fsum((v - mu) ** 2 for v in row) / row.size)
    return np.array(out).reshape(np.shape(x)[:-1])


def _shifted_one_pass_same_dtype(x):
    x = np.asarray(x)
    s = x - x[..., :1]
    s1, s2 = s.sum(-1), (s * s).sum(-1)
    return (s2 - s1 * s1 / x.shape[-1]) / x.shape[-1]


def _torch_two_pass(x):
    t = torch.as_tensor(np.asarray(x))
    return ((t - t.mean(-1, keepdim=True)) ** 2).mean(-1)


@pytest.mark.parametrize("token_var", [_two_pass, _two_pass_same_dtype, _welford_same_dtype,
                                       _shifted_by_first_feature, _fsum_per_token,
                                       _shifted_one_pass_same_dtype, _torch_two_pass])
def test_variance_check_accepts_stable_methods(token_var, capsys):
    check_token_var(token_var)
    assert "all 7 cases passed" in capsys.readouterr().out


def test_checks_pass_correct_code(capsys):
    check_token_mean(lambda x: np.mean(x, axis=-1))
    check_token_mean(lambda x: np.einsum("...d->...", x) / x.shape[-1])
    check_layer_norm_token(_ln)
    check_layer_norm_batches(_ln)
    check_layer_norm_batches(lambda x, g, b, eps=1e-5: torch.from_numpy(_ln(x, g, b, eps)))
    check_safe_spread(16)
    check_safe_spread(torch.tensor(16))
    check_breaking_offset("1e8")
    check_breaking_offset(np.float64(1e8))
    check_s_for_half_output(torch.tensor(4 * np.sqrt(1e-5) / 3))
    assert "all 6 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("shortcut", [_shortcut, _shortcut_64])
def test_variance_check_catches_the_shortcut(shortcut):
    with pytest.raises(CheckFailed, match="shortcut"):
        check_token_var(shortcut)


def test_batch_check_catches_a_shortcut_variance():
    check_layer_norm_token(lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, var=_shortcut_64))
    with pytest.raises(CheckFailed, match="1e6.*shortcut"):
        check_layer_norm_batches(lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, var=_shortcut_64))


class LazyVariance:
    def __init__(self, x):
        self.x = np.asarray(x, dtype=np.float64)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(np.var(self.x, axis=-1), dtype=dtype)


@pytest.mark.parametrize("library", [
    lambda x: np.var(x, axis=-1),
    lambda x: np.asarray(x).var(axis=-1),
    lambda x: np.std(x, axis=-1) ** 2,
    lambda x: np.nanvar(x, axis=-1),
    lambda x: np.nanstd(x, axis=-1) ** 2,
    lambda x: np.array([np.cov(row, bias=True) for row in np.reshape(x, (-1, x.shape[-1]))]
                       ).reshape(x.shape[:-1]),
    lambda x: np.array([statistics.pvariance(row) for row in np.reshape(x, (-1, x.shape[-1]))]
                       ).reshape(x.shape[:-1]),
    lambda x: np.asarray(np.ma.var(x, axis=-1)),
    lambda x: np.asarray(np.ma.masked_invalid(x).std(axis=-1)) ** 2,
    lambda x: torch.masked.var(torch.as_tensor(x, dtype=torch.float64), -1,
                               unbiased=False).numpy(),
    lambda x: np.array([statistics.covariance(row, row) * (len(row) - 1) / len(row)
                        for row in np.reshape(x, (-1, x.shape[-1])).tolist()]
                       ).reshape(x.shape[:-1]),
    lambda x: LazyVariance(x),  # its __array__ runs np.var after token_var returned
])
def test_variance_check_refuses_a_library_variance(library):
    with pytest.raises(CheckFailed, match="library variance"):
        check_token_var(library)


def test_variance_check_notices_a_replaced_profiler():
    def hides(x):
        sys.setprofile(None)
        return np.var(x, axis=-1)

    with pytest.raises(CheckFailed, match="library variance"):
        check_token_var(hides)
    assert sys.getprofile() is None


def test_policy_forbids_torch_var_in_token_var():
    def torch_var(x):
        return torch.from_numpy(np.asarray(x, dtype=np.float64)).var(-1, unbiased=False).numpy()

    _runner.last_executed = None
    check_token_var(torch_var)  # right numbers: only the policy refuses them
    policy = forbidden.load_policy("01_the_recipe")["token_var_correct"]
    assert "aten::var" in forbidden.executed_violations(policy, _runner.last_executed)


def test_policy_forbids_torch_var_mean_in_token_var():
    def torch_var_mean(x):
        t = torch.from_numpy(np.asarray(x, dtype=np.float64))
        return torch.var_mean(t, -1, unbiased=False)[0].numpy()

    _runner.last_executed = None
    check_token_var(torch_var_mean)
    policy = forbidden.load_policy("01_the_recipe")["token_var_correct"]
    assert forbidden.executed_violations(policy, _runner.last_executed)


def test_layer_norm_may_use_a_library_variance():
    def with_np_var(x, g, b, eps=1e-5):
        return g * (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) + b

    check_layer_norm_batches(with_np_var)


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


def _ln_in_float32(x, g, b, eps=1e-5):
    """A layer norm that casts its input to float32 "as a GPU kernel would"."""
    x = np.asarray(x, dtype=np.float32)
    mu = x.mean(-1, keepdims=True)
    return np.float32(g) * (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True)
                                              + np.float32(eps)) + np.float32(b)


@pytest.mark.parametrize("cast_back", [False, True])
def test_layer_norm_checks_name_a_float32_cast(cast_back):
    def wrong(x, g, b, eps=1e-5):
        y = _ln_in_float32(x, g, b, eps)
        return y.astype(np.float64) if cast_back else y

    with pytest.raises(CheckFailed, match="near 100 .*must be computed in float64"):
        check_layer_norm_token(wrong)
    with pytest.raises(CheckFailed, match="1e6.*must be computed in float64") as failed:
        check_layer_norm_batches(wrong)
    assert "shortcut" not in str(failed.value)  # it used a stable variance, in float32


def test_layer_norm_checks_name_torch_run_in_float32():
    def torch_float32(x, g, b, eps=1e-5):
        t = torch.as_tensor(x).float()
        return F.layer_norm(t, (t.shape[-1],), torch.as_tensor(g).float(),
                            torch.as_tensor(b).float(), eps).double().numpy()

    with pytest.raises(CheckFailed, match="must be computed in float64"):
        check_layer_norm_token(torch_float32)


def test_layer_norm_checks_pass_float64_code_beside_the_float32_hint(capsys):
    check_layer_norm_token(_ln)
    check_layer_norm_token(lambda x, g, b, eps=1e-5: F.layer_norm(
        torch.as_tensor(x), (x.shape[-1],), torch.as_tensor(g), torch.as_tensor(b), eps).numpy())
    assert capsys.readouterr().out.count("all 10 cases passed") == 2


def test_batch_check_catches_whole_array_statistics():
    def whole_array(x, g, b, eps=1e-5):
        return g * (x - x.mean()) / np.sqrt(x.var() + eps) + b

    check_layer_norm_token(whole_array)  # fine for one token
    with pytest.raises(CheckFailed, match="per token"):
        check_layer_norm_batches(whole_array)


def test_variance_check_names_the_mistakes():
    def d_minus_1(x):
        return ((x - x.mean(-1, keepdims=True)) ** 2).sum(-1) / (x.shape[-1] - 1)

    with pytest.raises(CheckFailed, match="not d - 1"):
        check_token_var(d_minus_1)
    with pytest.raises(CheckFailed, match="standard deviation"):
        check_token_var(lambda x: np.sqrt(_two_pass(x)))
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


def test_inline_answers_are_graded_for_being_right():
    check_spacing_estimate(8)
    check_spread_gap_reason("c")
    with pytest.raises(CheckFailed, match="you answered 4.*more than 25%"):
        check_safe_spread(4)
    with pytest.raises(CheckFailed, match="you answered 1e\\+16"):
        check_breaking_offset(1e16)
    with pytest.raises(CheckFailed, match="give a number"):
        check_s_for_half_output(None)


def test_inline_answers_follow_from_float_formats():
    assert np.float32(1e8) + np.float32(8) == np.nextafter(np.float32(1e8), np.float32(np.inf))
    assert 1e4 < 1 / np.sqrt(np.finfo(np.float64).eps) < 1e16


# ---------------------------------------------------------------- statistics in chunks


def _np_stats(x):
    """(count, mean, M2) of each token, by numpy in float64."""
    x = np.asarray(x, dtype=np.float64)
    return x.shape[-1], np.mean(x, axis=-1), np.var(x, axis=-1) * x.shape[-1]


@pytest.mark.parametrize("split", [1, 3, 7])
def test_merged_chunk_stats_equal_numpys_stats_of_the_whole_token(split):
    x = np.random.default_rng(split).normal(4.0, 3.0, size=(2, 5, 8))
    n, mean, m2 = recipe.merge_stats(recipe.chunk_stats(x[..., :split]),
                                     recipe.chunk_stats(x[..., split:]))
    n_np, mean_np, m2_np = _np_stats(x)
    assert n == n_np
    np.testing.assert_allclose(mean, mean_np, rtol=1e-12)
    np.testing.assert_allclose(m2, m2_np, rtol=1e-12)


def test_merge_of_the_worked_halves_of_example_a():
    assert recipe.merge_stats((2, 3.0, 2.0), (2, 7.0, 2.0)) == (4, 5.0, 20.0)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8, 100])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_chunked_var_matches_numpys_float64_variance_for_any_chunk(chunk, dtype):
    x = np.random.default_rng(chunk).normal(2.0, 3.0, size=(3, 4, 13)).astype(dtype)
    y = recipe.chunked_var(x, chunk)
    assert y.dtype == dtype and y.shape == (3, 4)
    np.testing.assert_allclose(y, np.var(x.astype(np.float64), axis=-1),
                               rtol=1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize(("offset", "dtype"), [(1e4, np.float32), (1e8, np.float64)])
def test_chunked_var_keeps_the_variance_where_running_sums_lose_it(offset, dtype):
    x = _offset_tokens(offset, (4, 64), dtype)
    truth = np.var(x.astype(np.float64), axis=-1)
    np.testing.assert_allclose(recipe.chunked_var(x, 16), truth, rtol=1e-6)
    naive = recipe.naive_chunked_var(x, 16)
    assert np.all(np.abs(naive - truth) > 0.1 * truth)  # the naive one-pass cancels
    near_zero = x - np.asarray(offset, dtype)
    np.testing.assert_allclose(recipe.naive_chunked_var(near_zero, 16),
                               np.var(near_zero.astype(np.float64), axis=-1), rtol=1e-4)


def test_chunked_checks_pass_right_answers_and_name_the_mistakes(capsys):
    check_merge_stats(recipe.merge_stats)
    check_chunked_var(recipe.chunked_var)
    check_chunked_var_merges(recipe.chunked_var)
    check_tiled_method("c")
    assert "merge_stats: all 6 cases passed" in capsys.readouterr().out

    def no_delta(a, b):
        n = a[0] + b[0]
        return n, a[1] + (b[1] - a[1]) * b[0] / n, a[2] + b[2]

    with pytest.raises(CheckFailed, match="M2_a \\+ M2_b alone"):
        check_merge_stats(no_delta)
    with pytest.raises(CheckFailed, match="naive one-pass formula"):
        check_chunked_var(recipe.naive_chunked_var)
    with pytest.raises(CheckFailed, match="reuse your merge_stats: chunked_var never called it"):
        check_chunked_var_merges(lambda x, chunk: recipe.naive_chunked_var(
            np.asarray(x, np.float64) - np.asarray(x, np.float64).mean(-1, keepdims=True),
            chunk))
    with pytest.raises(CheckFailed, match="two-pass needs the mean"):
        check_tiled_method("a")


def _stats_of(part):
    mean = part.mean(-1)
    return part.shape[-1], mean, ((part - mean[..., None]) ** 2).sum(-1)


def merge_stats(a, b):  # the name the grader rewires while chunked_var runs
    return recipe.merge_stats(a, b)


def test_chunked_merges_needs_the_variance_from_merges_of_disjoint_unions_of_chunks():
    def for_show(x, chunk):  # merges, then returns a two-pass variance
        x = np.asarray(x, dtype=np.float64)
        stats = None
        for s in range(0, x.shape[-1], chunk):
            here = _stats_of(x[..., s:s + chunk])
            stats = here if stats is None else merge_stats(stats, here)
        return recipe.token_var(x)

    def global_mean(x, chunk):  # two passes: each chunk's M2 about the token's mean
        x = np.asarray(x, dtype=np.float64)
        mu, stats = x.mean(-1), None
        for s in range(0, x.shape[-1], chunk):
            part = x[..., s:s + chunk]
            here = (part.shape[-1], mu, ((part - mu[..., None]) ** 2).sum(-1))
            stats = here if stats is None else merge_stats(stats, here)
        return stats[2] / stats[0]

    def skipping(x, chunk):  # merges chunk 0 with chunk 2, then chunk 1: exact too
        x = np.asarray(x, dtype=np.float64)
        pieces = [_stats_of(x[..., s:s + chunk]) for s in range(0, x.shape[-1], chunk)]
        stats = pieces[0]
        for here in pieces[2:] + pieces[1:2]:
            stats = merge_stats(stats, here)
        return stats[2] / stats[0]

    def halving(x, chunk):  # a GPU block's tree: chunk i merged with chunk i + half
        x = np.asarray(x, dtype=np.float64)
        pieces = [_stats_of(x[..., s:s + chunk]) for s in range(0, x.shape[-1], chunk)]
        while len(pieces) > 1:
            half = (len(pieces) + 1) // 2
            pieces = [merge_stats(pieces[i], pieces[i + half]) if i + half < len(pieces)
                      else pieces[i] for i in range(half)]
        return pieces[0][2] / pieces[0][0]


    def vector_tree(x, chunk):  # every pair of a level in one call, counts as arrays
        x = np.asarray(x, dtype=np.float64)
        pieces = [_stats_of(x[..., s:s + chunk]) for s in range(0, x.shape[-1], chunk)]
        n = np.array([p[0] for p in pieces], dtype=float)
        mean = np.stack([p[1] for p in pieces], -1)
        m2 = np.stack([p[2] for p in pieces], -1)
        while n.shape[-1] > 1:
            if n.shape[-1] % 2:  # an odd piece out waits for the next level
                n_odd, mean_odd, m2_odd = n[-1:], mean[..., -1:], m2[..., -1:]
                n, mean, m2 = n[:-1], mean[..., :-1], m2[..., :-1]
            else:
                n_odd = None
            n, mean, m2 = merge_stats((n[0::2], mean[..., 0::2], m2[..., 0::2]),
                                      (n[1::2], mean[..., 1::2], m2[..., 1::2]))
            if n_odd is not None:
                n, mean = np.append(n, n_odd), np.concatenate([mean, mean_odd], -1)
                m2 = np.concatenate([m2, m2_odd], -1)
        return m2[..., 0] / n[0]

    for right in (for_show, global_mean, skipping, halving, vector_tree):
        check_chunked_var(right)
    for merged_exactly in (skipping, halving, vector_tree):  # Chan's merge of any disjoint pieces
        check_chunked_var_merges(merged_exactly)
    with pytest.raises(CheckFailed, match="returned the same variance"):
        check_chunked_var_merges(for_show)
    with pytest.raises(CheckFailed, match="about its own mean"):
        check_chunked_var_merges(global_mean)


def test_chunked_merges_rejects_two_pieces_that_share_features():
    """A merge of chunk 0 with itself: each side is a chunk's own statistics, but
    together they count chunk 0 twice (the merge judge alone; such a variance is
    wrong and chunked_var_correct already says so)."""
    from normref.checks.recipe_judges import _not_chunk_unions
    x = np.array([2.0, 4.0, 6.0, 8.0])

    def noted(*sides):  # what the probe notes: counts, means and length of each side
        return {"side_counts": np.array([n for n, _ in sides], dtype=float),
                "side_means": np.array([m for _, m in sides], dtype=float),
                "side_sizes": np.ones(len(sides), dtype=np.int64)}

    assert _not_chunk_unions(x, 1, noted((1, 2.0), (1, 6.0), (1, 8.0), (1, 4.0))) is None
    assert _not_chunk_unions(x, 2, noted((2, 3.0), (2, 7.0))) is None
    assert "not two separate sets" in _not_chunk_unions(x, 2, noted((2, 3.0), (2, 3.0)))
    assert "not the mean of any 2" in _not_chunk_unions(x, 2, noted((2, 4.0), (2, 6.0)))


def _streamed_in_float32(x, tile, merge):
    """A kernel's loop over tiles of `tile` features that keeps two float32 numbers
    per token between tiles; the count is the loop's, shared by every token."""
    x = np.asarray(x, dtype=np.float32)
    first, second = np.zeros(x.shape[:-1], np.float32), np.zeros(x.shape[:-1], np.float32)
    for start in range(0, x.shape[-1], tile):
        first, second = merge(start, first, second, x[..., start:start + tile])
    return first, second


def test_inline_question_3_two_float32_numbers_per_token_suffice_for_chans_merge_alone():
    x = _offset_tokens(1e4, (8, 64), np.float32, seed=5)
    truth = np.array([statistics.pvariance(row.tolist()) for row in x.astype(np.float64)])

    def chan(n_a, mean_a, m2_a, part):
        n_b = np.float32(part.shape[-1])
        mean_b = part.mean(-1, dtype=np.float32)
        m2_b = ((part - mean_b[..., None]) ** 2).sum(-1, dtype=np.float32)
        n = np.float32(n_a) + n_b
        delta = mean_b - mean_a
        return (mean_a + delta * (n_b / n),
                m2_a + m2_b + delta * delta * (np.float32(n_a) * n_b / n))

    def running_sums(_, s1, s2, part):
        return s1 + part.sum(-1, dtype=np.float32), s2 + (part * part).sum(-1, dtype=np.float32)

    _, m2 = _streamed_in_float32(x, 16, chan)
    np.testing.assert_allclose(m2 / 64, truth, rtol=1e-2)
    s1, s2 = _streamed_in_float32(x, 16, running_sums)
    naive = s2 / np.float32(64) - (s1 / np.float32(64)) ** 2
    assert np.all(np.abs(naive - truth) > 0.25 * truth)
    with pytest.raises(CheckFailed, match="check that claim for each of a, b and c"):
        check_tiled_method("d")


def test_inline_question_5_rms_shift_matches_torch_rms_norm_and_names_the_slips():
    """The shift c at which RMSNorm's output of [-1, 1, -1, 1] + c keeps half its
    spread, from torch's RMSNorm; right answers of any numeric type pass."""
    from fractions import Fraction

    from normref.checks import check_rms_shift_halving
    from normref.checks.recipe_judges import RMS_EPS, RMS_SHIFT_TOKEN, rms_shift_halving

    x = torch.tensor(RMS_SHIFT_TOKEN, dtype=torch.float64)

    def spread(c):
        y = torch.nn.functional.rms_norm(x + c, (4,), eps=RMS_EPS)
        return float(y.var(correction=0).sqrt())

    c = rms_shift_halving()
    assert spread(c) == pytest.approx(spread(0.0) / 2, rel=1e-12)
    assert spread(0.99 * c) > spread(0.0) / 2 > spread(1.01 * c)
    for right in [1.732, 1.73, -1.732, "1.73", np.float32(np.sqrt(3)), np.int64(2) - 0.268,
                  torch.tensor(3 * (1 + 1e-5), dtype=torch.float64).sqrt(),
                  Fraction(1732, 1000)]:
        check_rms_shift_halving(right)
    with pytest.raises(CheckFailed, match="not c\\*\\*2 alone"):
        check_rms_shift_halving(2)
    with pytest.raises(CheckFailed, match="c\\*\\*2 at the halving point"):
        check_rms_shift_halving(np.int64(3))
    with pytest.raises(CheckFailed, match="grows by sqrt\\(2\\)"):
        check_rms_shift_halving(1.0)
    with pytest.raises(CheckFailed, match="0.555 of its spread"):
        check_rms_shift_halving(1.5)
    with pytest.raises(CheckFailed, match="does not cancel"):
        check_rms_shift_halving("never")
    with pytest.raises(CheckFailed, match="give a number"):
        check_rms_shift_halving(None)


_CARL = '''
import numpy as np

def token_mean(x):
    x = np.asarray(x)
    return x.sum(axis=-1) / x.shape[-1]

def token_var(x):  # the shortcut, in float64: cancels near 1e8
    x = np.asarray(x, dtype=np.float64)
    return token_mean(x * x) - token_mean(x) ** 2

def merge_stats(a, b):
    n = a[0] + b[0]
    delta = b[1] - a[1]
    return n, a[1] + delta * b[0] / n, a[2] + b[2] + delta**2 * a[0] * b[0] / n

def chunked_var(x, chunk):
    x = np.asarray(x, dtype=np.float64)
    stats = None
    for start in range(0, x.shape[-1], chunk):
        part = x[..., start:start + chunk]
        here = (part.shape[-1], token_mean(part), token_var(part) * part.shape[-1])
        stats = here if stats is None else merge_stats(stats, here)
    return stats[2] / stats[0]

def layer_norm(x, gamma, beta, eps=1e-5):
    x = np.asarray(x, dtype=np.float64)
    var = token_var(x)[..., None]
    return gamma * (x - token_mean(x)[..., None]) / np.sqrt(var + eps) + beta
'''


def test_a_shortcut_token_var_costs_token_vars_point_alone(capsys):
    """A notebook whose only slip is token_var (the float64 shortcut) fails
    check_token_var alone: chunked_var and layer_norm, which call it, are graded
    with the grader's token_var in its place, and the notebook's is back after."""
    notebook = {}
    exec(compile(_CARL, "<notebook>", "exec"), notebook)  # noqa: S102
    own = notebook["token_var"]
    far = 1e8 + np.random.default_rng(0).normal(size=(3, 32))
    assert not np.allclose(own(far), recipe.token_var(far), rtol=0.1)  # the slip is real
    with pytest.raises(CheckFailed, match="shortcut"):
        check_token_var(own)
    check_chunked_var(notebook["chunked_var"])
    check_chunked_var_merges(notebook["chunked_var"])
    check_layer_norm_token(notebook["layer_norm"])
    check_layer_norm_batches(notebook["layer_norm"])
    assert notebook["token_var"] is own
    assert not np.allclose(own(far), recipe.token_var(far), rtol=0.1)  # restored
