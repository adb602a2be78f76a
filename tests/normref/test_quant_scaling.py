"""Unit 06's finer scalings: normref.quant's per-channel and MX block
quantizers against references written another way (every fp8 value listed,
the nearest one picked), the matmul experiment, and the checks against right
and wrong code, down to the sentence a student reads.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normref import quant
from normref.checks import (
    CheckFailed,
    check_best_scheme,
    check_best_schemes,
    check_factor_out,
    check_loud_token_answers,
    check_loud_token_errors,
    check_matmul_errors,
    check_mx_blocks,
    check_mx_clipped_fraction,
    check_mx_first_zero_k,
    check_mx_last_exact_k,
    check_mx_matmul,
    check_mx_outlier_answers,
    check_mx_rule_errors,
    check_offset_answer,
    check_per_channel,
    check_per_channel_matmul,
    check_smoothquant_fold,
    check_zero_point_round_trip,
    quant_judges,
    quant_probes,
)

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _fp8_grid(dtype):
    """Every finite value of the format, float64, sorted."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).double().numpy()
    return np.unique(values[np.isfinite(values)])


def _nearest_fp8(values, dtype):
    """Round to nearest, ties to the even bit pattern, saturating at +-fmax:
    by search over the listed values, not by a cast."""
    grid = _fp8_grid(dtype)
    values = np.clip(np.asarray(values, np.float64), grid[0], grid[-1])
    hi = np.clip(np.searchsorted(grid, values), 1, len(grid) - 1)
    lo = hi - 1
    below, above = values - grid[lo], grid[hi] - values
    codes = torch.tensor(grid).to(dtype).view(torch.uint8).numpy()
    lo_even = codes[lo] % 2 == 0
    pick_hi = (above < below) | ((above == below) & ~lo_even)
    return np.where(pick_hi, grid[hi], grid[lo])


def _mx_by_hand(x, dtype, block=32):
    """MX blocks one at a time in Python floats: math.frexp gives floor(log2)."""
    fmax = float(torch.finfo(dtype).max)
    emax = math.frexp(fmax)[1] - 1
    x = np.asarray(x, np.float64)
    q, scales = np.zeros_like(x), []
    for row_index in np.ndindex(x.shape[:-1]):
        row, row_scales = x[row_index], []
        for start in range(0, row.size, block):
            part = row[start:start + block]
            amax = float(np.abs(part).max())
            X = 1.0 if amax == 0 else 2.0 ** (math.frexp(amax)[1] - 1 - emax)
            q[row_index][start:start + block] = _nearest_fp8(part / X, dtype)
            row_scales.append(X)
        scales.append(row_scales)
    return q, np.array(scales).reshape(x.shape[:-1] + (-1,))


# ------------------------------------------------------------ the references

@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
@pytest.mark.parametrize("shape", [(8, 64), (5, 40), (2, 3, 70), (3, 32), (1, 7)])
def test_mx_quantize_is_the_blockwise_algorithm_done_by_hand(dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=gen) * 10.0 ** (4 * torch.rand(*shape[:-1], 1,
                                                                      generator=gen) - 2)
    q, X = quant.mx_quantize(x, dtype)
    q_ref, X_ref = _mx_by_hand(x.numpy(), dtype)
    np.testing.assert_array_equal(X.double().numpy(), X_ref)
    np.testing.assert_array_equal(q.double().numpy(), q_ref)
    assert q.dtype == dtype and X.shape == x.shape[:-1] + (-(-shape[-1] // 32),)


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_mx_block_amax_lands_between_two_to_emax_and_fmax_or_saturates(dtype):
    fmax = quant.fp8_max(dtype)
    emax = math.floor(math.log2(fmax))
    x = torch.tensor([[1.0] * 31 + [1.95], [0.1] * 31 + [-1.5]]) * 2.0**-3
    q, X = quant.mx_quantize(x, dtype)
    top = q.float().abs().amax(dim=-1)
    assert torch.all(top >= 2.0**emax) and torch.all(top <= fmax)
    assert q.float()[0, -1] == fmax  # 1.95 * 2**emax passes fmax: saturated
    assert torch.all(torch.log2(X) == torch.log2(X).round())


def test_mx_zero_block_gets_scale_one_and_stays_zero():
    x = torch.zeros(2, 64)
    x[0, :32] = torch.linspace(-3, 3, 32)
    q, X = quant.mx_quantize(x, E4M3)
    assert X[0, 1] == 1 and X[1, 0] == 1 and X[1, 1] == 1
    assert torch.equal(quant.mx_dequantize(q, X)[:, 32:], torch.zeros(2, 32))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_mx_round_trip_error_is_half_a_step_or_a_saturation(dtype):
    """Inside fmax each value is off by at most half an fp8 step of its block;
    beyond it (amax / X can reach 2 ** (emax + 1)) it comes back as fmax * X."""
    x = torch.randn(16, 96, generator=torch.Generator().manual_seed(3))
    q, X = quant.mx_quantize(x, dtype)
    y = quant.mx_dequantize(q, X)
    info = torch.finfo(dtype)
    X_each = torch.repeat_interleave(X, 32, dim=-1)  # 16, 96
    inside = (x / X_each).abs() <= info.max
    scaled = (x / X_each).abs().clamp(min=info.tiny)
    step = X_each * 2.0 ** torch.floor(torch.log2(scaled)) * info.eps
    assert torch.all(((y - x).abs() <= step / 2 * (1 + 1e-6))[inside])
    assert (~inside).any()  # this draw has values that saturate
    assert torch.equal(y[~inside], (info.max * X_each * x.sign())[~inside])


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_per_channel_is_the_per_token_round_trip_of_the_transpose(dtype):
    x = torch.randn(40, 24, generator=torch.Generator().manual_seed(1))
    x = x * 10.0 ** torch.linspace(-3, 3, 24)
    q, scale = quant.per_channel_quantize(x, dtype)
    assert q.dtype == dtype and scale.shape == (24,)
    np.testing.assert_array_equal(quant.per_channel_dequantize(q, scale).numpy(),
                                  quant.per_token_round_trip(x.T, dtype).T.numpy())


def test_per_channel_maps_each_channel_amax_onto_fmax_and_zero_channels_onto_one():
    x = torch.tensor([[0.5, 0.0, -3.0], [-2.0, 0.0, 1.0]])
    q, scale = quant.per_channel_quantize(x, E4M3)
    np.testing.assert_allclose(scale.numpy(), [448 / 2, 1.0, 448 / 3])
    np.testing.assert_array_equal(q.float().abs().amax(dim=0).numpy(), [448, 0, 448])


def test_outlier_layer_is_layer_norm_with_gamma_and_the_layer_without_outliers():
    A, W = quant.outlier_layer()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randn(128, 256, generator=gen)
    W_plain = torch.randn(256, 128, generator=gen) / 16
    plain = F.layer_norm(tokens, (256,))
    torch.testing.assert_close(A.double() @ W.double(), plain.double() @ W_plain.double(),
                               rtol=1e-5, atol=1e-6)
    loud = list(quant.OUTLIER_CHANNELS)
    assert A[:, loud].abs().max() > 1e5 and A[:, 6:77].abs().max() < 5
    A_probe, W_probe = quant_probes.outlier_layer()
    assert torch.equal(A, A_probe) and torch.equal(W, W_probe)
    assert quant_probes.OUTLIER_CHANNELS == quant.OUTLIER_CHANNELS


def test_matmul_relative_error_by_hand():
    A = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    W = torch.eye(2)
    assert quant.matmul_relative_error(A, A + torch.tensor([[0.0, 0.0], [0.0, 1.0]]), W) == (
        pytest.approx(1 / math.sqrt(5)))


def test_matmul_errors_per_channel_and_smoothquant_win_then_blocks_then_tokens_then_tensor():
    errors = quant.matmul_errors()
    order = sorted(errors, key=errors.get)
    assert set(order[:2]) == {"per-channel", "smoothquant"}
    assert order[2:] == ["per-block", "per-token", "per-tensor"]
    assert 0.02 < errors["per-channel"] < 0.035  # the plain e4m3 error
    assert 0.02 < errors["smoothquant"] < 0.035
    assert errors["per-tensor"] / errors["per-channel"] > 10


def test_matmul_relative_error_measures_the_folded_weight_and_the_rows_asked_for():
    A = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    W = torch.eye(2)
    nudged = A + torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    # a fold: the stored activation halved, the weight it meets doubled
    assert quant.matmul_relative_error(A, nudged / 2, W, 2 * W) == pytest.approx(1 / math.sqrt(5))
    assert quant.matmul_relative_error(A, nudged, W, rows=[0]) == 0.0
    assert quant.matmul_relative_error(A, nudged, W, rows=torch.tensor([False, True])) == (
        pytest.approx(0.5))


@pytest.mark.parametrize("alpha", [0.5, 0.8, 0.3, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_smoothquant_fold_leaves_the_product_exact_in_float64(alpha, seed):
    """X diag(s)^-1 diag(s) W == X W, to float64 rounding."""
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(32, 16, generator=gen)
    X[:, 3] *= 1e4
    W = torch.randn(16, 8, generator=gen)
    X_smooth, W_smooth = quant.smoothquant_fold(X, W, alpha)
    assert X_smooth.dtype == W_smooth.dtype == torch.float64
    exact = X.double() @ W.double()
    assert torch.allclose(X_smooth @ W_smooth, exact, rtol=1e-12,
                          atol=1e-12 * float(exact.abs().max()))


def test_smoothing_factors_by_hand_and_their_meeting_point():
    X = torch.tensor([[1.0, 100.0, 0.0], [-2.0, 50.0, 0.0]])
    W = torch.tensor([[1.0, 1.0], [0.01, 0.04], [3.0, 1.0]])
    s = quant.smoothing_factors(X, W, 0.5)
    assert torch.allclose(s, torch.tensor([math.sqrt(2.0), 50.0, 1.0], dtype=torch.float64))
    X_smooth, W_smooth = quant.smoothquant_fold(X, W, 0.5)
    # alpha = 0.5: each live channel's maxima meet at sqrt(max|X_c| max|W_c|)
    meet = torch.tensor([math.sqrt(2.0), 2.0], dtype=torch.float64)
    assert torch.allclose(X_smooth.abs().amax(0)[:2], meet)
    assert torch.allclose(W_smooth.abs().amax(1)[:2], meet)
    assert torch.equal(X_smooth[:, 2], torch.zeros(2, dtype=torch.float64))  # s = 1, no change
    assert torch.allclose(quant.smoothing_factors(X, W, 1.0)[:2],
                          torch.tensor([2.0, 100.0], dtype=torch.float64))


def test_loud_tokens_keep_per_token_and_blocks_and_defeat_the_channel_schemes():
    errors = quant.loud_token_errors()
    best = min(errors.values())
    assert {name for name, e in errors.items() if e < 1.25 * best} == {"per-token",
                                                                      "per-block"}
    for scheme in ("per-tensor", "per-channel", "smoothquant"):
        assert errors[scheme] > 5 * best, scheme
    assert 0.02 < errors["per-token"] < 0.035  # the plain e4m3 error


def test_why_smoothquant_fails_on_loud_tokens():
    A, W, quiet = quant.loud_token_layer()
    # the fold stays exact
    A_smooth, W_smooth = quant.smoothquant_fold(A, W)
    exact = A.double() @ W.double()
    assert torch.allclose(A_smooth @ W_smooth, exact, rtol=1e-10,
                          atol=1e-10 * float(exact.abs().max()))
    # the fold divides a whole channel, so within each channel the gap between the
    # loud and the quiet tokens is what it was, thousands of times
    def gap(a):
        return a[~quiet].abs().amax(0) / a[quiet].abs().amax(0)

    assert torch.allclose(gap(A_smooth), gap(A.double()))
    assert torch.all(gap(A.double()) > 1e3)
    # with alpha = 1 the quiet tokens are no better off
    A_one, W_one = quant.smoothquant_fold(A, W, 1.0)
    stored = quant.fp8_round_trip(A_one.float(), E4M3)
    one = quant.matmul_relative_error(A, stored, W, W_one, rows=quiet)
    assert one > 5 * quant.loud_token_errors()["per-token"]


def test_the_loud_token_layer_is_the_assignments_and_the_probes():
    from normref.checks.quant_probes import loud_token_layer, outlier_layer

    A, W, quiet = quant.loud_token_layer()
    for ours, theirs in zip((A, W, quiet), loud_token_layer()):
        assert torch.equal(ours, theirs)
    assert torch.allclose(W[5], outlier_layer()[1][5] * 1e5)  # W before rows were divided
    assert quiet.sum() == 124


# ------------------------------------------------------------ the checks

def unusual_per_channel_quantize(x, dtype):
    """Right, written as per-token scaling of the transpose, in numpy."""
    top = float(torch.finfo(dtype).max)
    cols = x.numpy().T.astype(np.float64)
    amax = np.abs(cols).max(axis=1)
    scale = np.array([top / a if a else 1.0 for a in amax], np.float32)
    stored = torch.from_numpy(np.clip(cols * scale[:, None], -top, top).T.astype(np.float32))
    return stored.to(dtype), torch.from_numpy(scale)


def unusual_per_channel_dequantize(q, scale):
    return torch.stack([column.float() / s for column, s in zip(q.T, scale)], dim=1)


def per_row_quantize(x, dtype):
    fmax = torch.finfo(dtype).max
    scale = fmax / x.abs().amax(dim=1)  # one per token: the slip
    return (x * scale[:, None]).clamp(-fmax, fmax).to(dtype), scale


def per_row_dequantize(q, scale):
    return q.float() / scale[:, None]


def square_per_row_quantize(x, dtype):
    """The per-row slip shaped like per-channel scales (x is square)."""
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax(dim=1)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (x * scale[:, None]).clamp(-fmax, fmax).to(dtype), scale


def multiplying_dequantize(q, scale):
    return q.float() * scale


def unusual_mx_quantize(x, dtype):
    """Right, one block at a time in Python, exponent from math.frexp."""
    fmax = float(torch.finfo(dtype).max)
    emax = math.frexp(fmax)[1] - 1
    flat = x.reshape(-1, x.shape[-1])
    qs, scales = [], []
    for row in flat:
        q_row, s_row = [], []
        for part in torch.split(row, 32):
            amax = float(part.abs().max())
            X = 1.0 if amax == 0 else math.ldexp(1.0, math.frexp(amax)[1] - 1 - emax)
            q_row.append(torch.clamp(part / X, -fmax, fmax))
            s_row.append(X)
        qs.append(torch.cat(q_row))
        scales.append(s_row)
    q = torch.stack(qs).reshape(x.shape).to(dtype)
    return q, torch.tensor(scales).reshape(*x.shape[:-1], -1)


def unusual_mx_dequantize(q, X):
    return q.float() * torch.repeat_interleave(X, 32, dim=-1)[..., :q.shape[-1]]


def mx_no_clamp(x, dtype):
    q, X = quant.mx_quantize(x, dtype)
    return (quant._blocks(x, 32) / X.unsqueeze(-1)).flatten(-2)[..., :x.shape[-1]].to(dtype), X


def mx_not_power_of_two(x, dtype):
    fmax = torch.finfo(dtype).max
    blocks = quant._blocks(x, 32)
    amax = blocks.abs().amax(dim=-1)
    X = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    q = (blocks / X.unsqueeze(-1)).clamp(-fmax, fmax).flatten(-2)[..., :x.shape[-1]]
    return q.to(dtype), X


def mx_float32_log2(x, dtype):
    """The spec's rule with floor(log2 amax) taken in float32."""
    fmax = torch.finfo(dtype).max
    blocks = quant._blocks(x, 32)
    amax = blocks.abs().amax(dim=-1)
    emax = math.floor(math.log2(fmax))
    X = torch.where(amax > 0, 2.0 ** (torch.floor(torch.log2(amax)) - emax), 1.0)
    q = (blocks / X.unsqueeze(-1)).clamp(-fmax, fmax).flatten(-2)[..., :x.shape[-1]]
    return q.to(dtype), X


def mx_along_columns(x, dtype):
    q, X = quant.mx_quantize(x.T.contiguous(), dtype)
    return q.T.contiguous(), X.T.contiguous()


def mx_along_columns_dequantize(q, X):
    return quant.mx_dequantize(q.T.contiguous(), X.T.contiguous()).T


def mx_whole_blocks_only(x, dtype):
    d = x.shape[-1] // 32 * 32
    q, X = quant.mx_quantize(x[..., :d], dtype)
    return torch.cat([q, x[..., d:].to(dtype)], dim=-1), X


def mx_round_up(x, dtype):
    fmax = torch.finfo(dtype).max
    blocks = quant._blocks(x, 32)
    amax = blocks.abs().amax(dim=-1)
    X = torch.where(amax > 0, 2.0 ** torch.ceil(torch.log2(amax / fmax)), torch.ones_like(amax))
    q = (blocks / X.unsqueeze(-1)).clamp(-fmax, fmax).flatten(-2)[..., :x.shape[-1]]
    return q.to(dtype), X


def mx_reciprocal(x, dtype):
    q, X = quant.mx_quantize(x, dtype)
    return q, 1.0 / X


def mx_nan_for_zero_blocks(x, dtype):
    fmax = torch.finfo(dtype).max
    blocks = quant._blocks(x, 32)
    X = 2.0 ** (torch.floor(torch.log2(blocks.abs().amax(dim=-1))) - math.floor(math.log2(fmax)))
    q = (blocks / X.unsqueeze(-1)).clamp(-fmax, fmax).flatten(-2)[..., :x.shape[-1]]
    return q.to(dtype), X


def mx_dividing_dequantize(q, X):
    return q.float() / torch.repeat_interleave(X, 32, dim=-1)[..., :q.shape[-1]]


def mx_float32_q(x, dtype):
    q, X = quant.mx_quantize(x, dtype)
    return q.float(), X


@pytest.mark.parametrize("pair", [
    (quant.per_channel_quantize, quant.per_channel_dequantize),
    (unusual_per_channel_quantize, unusual_per_channel_dequantize),
], ids=["reference", "unusual"])
def test_per_channel_check_passes_right_code(pair):
    check_per_channel(*pair)


@pytest.mark.parametrize("pair, words", [
    ((per_row_quantize, per_row_dequantize), "one per token"),
    ((quant.per_channel_quantize, multiplying_dequantize), "do not multiply"),
    ((lambda x, d: (quant.per_channel_quantize(x, d)[0].float(),
                    quant.per_channel_quantize(x, d)[1]), quant.per_channel_dequantize),
     "store it in the fp8 format"),
], ids=["per-row", "multiplies", "float32-q"])
def test_per_channel_check_names_the_mistake(pair, words):
    with pytest.raises(CheckFailed, match=words):
        check_per_channel(*pair)


def test_per_channel_judge_names_row_scales_when_the_shapes_cannot():
    """With as many tokens as channels the shape says nothing: the values do."""
    case = dict(quant_judges._per_channel_cases(np.random.default_rng(0)))[
        "16 tokens x 16 channels of different sizes, e5m2"]
    x = torch.from_numpy(case["x"].copy())
    q, scale = square_per_row_quantize(x, E5M2)
    out = {"q": q.double().numpy(), "q_dtype": np.array(str(q.dtype)),
           "scales": scale.double().numpy(),
           "y": per_row_dequantize(q, scale).double().numpy()}
    assert "scales of the rows" in quant_judges._judge_per_channel(case, out)


def test_per_channel_judge_names_the_zero_channel_and_the_reciprocal():
    case = dict(quant_judges._per_channel_cases(np.random.default_rng(0)))[
        "channel 7 is all zeros, (12, 20), e4m3"]
    q, scale, y = quant_judges._reference_per_channel(case["x"], E4M3)
    out = {"q": q, "q_dtype": np.array("torch.float8_e4m3fn"), "y": y}
    with np.errstate(divide="ignore"):
        bad = np.where(scale == 1.0, np.inf, scale)
    assert "amax 0" in quant_judges._judge_per_channel(case, {**out, "scales": bad})
    assert "reciprocal" in quant_judges._judge_per_channel(case, {**out,
                                                                  "scales": 1 / scale})
    assert quant_judges._judge_per_channel(case, {**out, "scales": scale}) is None


@pytest.mark.parametrize("pair", [
    (quant.mx_quantize, quant.mx_dequantize),
    (unusual_mx_quantize, unusual_mx_dequantize),
], ids=["reference", "unusual"])
def test_mx_check_passes_right_code(pair):
    check_mx_blocks(*pair)


@pytest.mark.parametrize("quantize, dequantize, words", [
    (mx_no_clamp, quant.mx_dequantize, "clamp to"),
    (mx_not_power_of_two, quant.mx_dequantize, "not a power of two"),
    (mx_along_columns, mx_along_columns_dequantize, "run down the columns"),
    (mx_whole_blocks_only, quant.mx_dequantize, "a last, shorter one"),
    (mx_round_up, quant.mx_dequantize, "never saturates"),
    (mx_reciprocal, quant.mx_dequantize, "these are 1 / X"),
    (mx_nan_for_zero_blocks, quant.mx_dequantize, "all-zero block"),
    (quant.mx_quantize, mx_dividing_dequantize, "multiply, do not divide"),
    (mx_float32_q, quant.mx_dequantize, "store it in the fp8 format"),
], ids=lambda v: getattr(v, "__name__", None))
def test_mx_check_names_the_mistake(quantize, dequantize, words):
    with pytest.raises(CheckFailed, match=words):
        check_mx_blocks(quantize, dequantize)


def test_mx_no_clamp_is_caught_only_in_e5m2():
    """This torch saturates an e4m3fn cast by itself; e5m2 overflows to inf."""
    cases = dict(quant_judges._mx_cases(np.random.default_rng(0)))
    for label, case in cases.items():
        x = torch.from_numpy(case["x"].copy())
        dtype = getattr(torch, str(case["dtype"]))
        q, X = mx_no_clamp(x, dtype)
        out = {"q": q.double().numpy(), "q_dtype": np.array(str(q.dtype)),
               "scales": X.double().numpy(),
               "y": quant.mx_dequantize(q, X).double().numpy()}
        verdict = quant_judges._judge_mx(case, out)
        if dtype == E4M3:
            assert verdict is None, label
        elif "must saturate" in label:
            assert "clamp to [-fmax, fmax]" in verdict, label


def _right_matmul_errors():
    return quant.matmul_errors()


PAIRS = (quant.per_token_round_trip, (quant.per_channel_quantize, quant.per_channel_dequantize),
         (quant.mx_quantize, quant.mx_dequantize), quant.smoothquant_fold)


def test_matmul_errors_check_passes_the_measurement():
    check_matmul_errors(_right_matmul_errors(), *PAIRS)


def test_matmul_errors_check_refuses_typed_figures_and_wrong_functions():
    typed = {k: round(v, 2) for k, v in _right_matmul_errors().items()}
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        check_matmul_errors(typed, *PAIRS)
    wrong = (PAIRS[0], (per_row_quantize, per_row_dequantize), *PAIRS[2:])
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        check_matmul_errors(_right_matmul_errors(), *wrong)
    with pytest.raises(CheckFailed, match="no entry for"):
        check_matmul_errors({"per-tensor": 0.5}, *PAIRS)


def test_matmul_errors_are_read_whatever_the_case_and_separators_of_their_names():
    renamed = {name.upper().replace("-", "_") + " ": error
               for name, error in _right_matmul_errors().items()}
    check_matmul_errors(renamed, *PAIRS)


def test_matmul_errors_that_measure_wrong_functions_earn_the_table():
    """The table is checked against the student's own functions only: their
    mistakes cost their own exercises' points, not the table's as well."""
    wrong = (PAIRS[0], (per_row_quantize, per_row_dequantize), PAIRS[2],
             _fold_with_slips(divide=False))
    A, W = quant.outlier_layer()
    measured = dict(zip(quant_probes.MATMUL_SCHEMES,
                        quant_probes._measure_schemes(wrong, A, W)))
    assert measured["per-channel"] > 2 * _right_matmul_errors()["per-channel"]
    check_matmul_errors(measured, *wrong)


def test_loud_token_errors_check_passes_the_measurement_and_refuses_the_outlier_layers():
    check_loud_token_errors(quant.loud_token_errors(), *PAIRS)
    with pytest.raises(CheckFailed, match="check the batch"):
        check_loud_token_errors(quant.matmul_errors(), *PAIRS)


def _smooth_spread_by_hand():
    """Question 3's ratio in numpy float64: SmoothQuant's s_c from the loud-token
    layer, then the loud rows' max over the quiet rows' max."""
    A, W, quiet = (t.numpy().astype(np.float64) if t.dtype != torch.bool else t.numpy()
                   for t in quant.loud_token_layer())
    s = np.abs(A).max(axis=0) ** 0.5 / np.abs(W).max(axis=1) ** 0.5
    smooth = A / s
    return np.abs(smooth[~quiet]).max() / np.abs(smooth[quiet]).max()


def test_the_loud_tokens_stay_tens_of_thousands_of_times_louder_after_the_fold():
    spread = _smooth_spread_by_hand()
    assert quant_judges._true_smooth_spread()[0] == pytest.approx(spread, rel=1e-12)
    assert spread > 1e4


@pytest.mark.parametrize("as_given", [float, np.float32, torch.tensor, str,
                                      lambda v: Fraction(v).limit_denominator(1000)])
def test_smooth_spread_accepts_any_numeric_type(as_given):
    check_loud_token_answers(as_given(_smooth_spread_by_hand()), quant.smoothquant_fold)


def test_smooth_spread_measured_with_the_students_own_fold_passes():
    """A wrong fold costs exercise 6's points; the ratio it measures is right here."""
    slipped = _fold_with_slips(divide=False)
    A, W, quiet = quant.loud_token_layer()
    own = quant.loud_to_quiet_ratio(torch.as_tensor(slipped(A, W)[0]), quiet)
    assert own != pytest.approx(_smooth_spread_by_hand(), rel=0.01)
    check_loud_token_answers(own, slipped)
    with pytest.raises(CheckFailed, match="not yet right"):
        check_loud_token_answers(own, quant.smoothquant_fold)


def test_smooth_spread_of_a_fold_that_raises_is_judged_on_the_reference():
    def broken(X, W, alpha=0.5):
        raise NotImplementedError()

    check_loud_token_answers(_smooth_spread_by_hand(), broken)


@pytest.mark.parametrize("wrong, words", [
    (lambda r, before: before, "before the fold"),
    (lambda r, before: 1 / r, "turn it over"),
    (lambda r, before: 1.0, "measure it rather than reason it out"),
    (lambda r, before: 2 * r, "divide the largest"),
    (lambda r, before: "large", "as a number"),
    (lambda r, before: None, "as a number"),
])
def test_smooth_spread_names_the_slip(wrong, words):
    A, _, quiet = quant.loud_token_layer()
    before = quant.loud_to_quiet_ratio(A, quiet)
    with pytest.raises(CheckFailed, match=words):
        check_loud_token_answers(wrong(_smooth_spread_by_hand(), before),
                                 quant.smoothquant_fold)


def test_mx_float32_log2_is_accepted_on_an_amax_just_below_a_power_of_two():
    """floor(torch.log2(amax)) in float32: for the float32 just below 2**k its
    log2 rounds to k, the nearest float32, and X doubles. That rounding is
    accepted, with q judged against the scale it gives."""
    x = torch.tensor([[8 * (1 - 2.0**-24)] + [0.5] * 31])
    assert torch.log2(x[0, 0]).item() == 3.0 and math.frexp(float(x[0, 0]))[1] == 3
    assert quant.mx_quantize(x, E4M3)[1].item() == 2.0**-6
    check_mx_blocks(mx_float32_log2, quant.mx_dequantize)


def test_mx_scale_doubled_where_float32_log2_is_exact_still_fails():
    def doubled_everywhere(x, dtype):
        q, X = mx_float32_log2(x, dtype)
        return mx_float32_log2(x / 2, dtype)[0], 2 * X

    with pytest.raises(CheckFailed, match="off by a factor of two"):
        check_mx_blocks(doubled_everywhere, quant.mx_dequantize)


def _fold_with_slips(w_axis=1, divide=True):
    def fold(X, W, alpha=0.5):
        s = X.double().abs().amax(0) ** alpha / W.double().abs().amax(w_axis) ** (1 - alpha)
        s = torch.where(torch.isfinite(s) & (s > 0), s, 1.0)
        if divide:
            return X.double() / s, s[:, None] * W.double()
        return X.double() * s, W.double() / s[:, None]
    return fold


def _fold_without_zero_guard(X, W, alpha=0.5):
    s = X.double().abs().amax(0) ** alpha / W.double().abs().amax(1) ** (1 - alpha)
    return X.double() / s, s[:, None] * W.double()


def test_smoothquant_check_passes_right_code_in_float32_and_float64():
    check_smoothquant_fold(quant.smoothquant_fold)
    check_smoothquant_fold(lambda X, W, alpha=0.5: tuple(
        part.float() for part in quant.smoothquant_fold(X, W, alpha)))


@pytest.mark.parametrize("fold, words", [
    (lambda X, W, alpha=0.5: quant.smoothquant_fold(X, W, 1 - alpha), "wrong way round"),
    (_fold_with_slips(divide=False), "multiplied by s"),
    (_fold_with_slips(w_axis=0), "must match the size"),  # W (8, 4): the shapes object
    (_fold_without_zero_guard, "all zeros"),
])
def test_smoothquant_check_names_the_mistake(fold, words):
    with pytest.raises(CheckFailed, match=words):
        check_smoothquant_fold(fold)


def test_smoothquant_judge_names_the_column_max_where_the_shapes_cannot():
    case = next(case for label, case in quant_judges._fold_cases(np.random.default_rng(0))
                if "square" in label)
    x, w = (torch.from_numpy(case[k].copy()) for k in ("x", "w"))
    X_smooth, W_smooth = _fold_with_slips(w_axis=0)(x, w, float(case["alpha"]))
    verdict = quant_judges._judge_fold(case, {"x_smooth": X_smooth.numpy(),
                                              "w_smooth": W_smooth.numpy()})
    assert "down its columns" in verdict


# ------------------------------------------------------------ the MX matmul


def _mx_operands(n_tokens, d, d_out, seed, dtype=E4M3):
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(n_tokens, d, generator=gen) * 10.0 ** torch.randint(-3, 4, (1, d),
                                                                          generator=gen)
    W = torch.randn(d, d_out, generator=gen)
    return (*quant.mx_quantize(A, dtype), *quant.mx_quantize(W.T.contiguous(), dtype))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
@pytest.mark.parametrize("n_tokens, d, d_out", [(3, 64, 2), (4, 40, 5), (2, 97, 3)])
def test_mx_matmul_is_the_matmul_of_the_dequantized_operands(dtype, n_tokens, d, d_out):
    """Block by block with the scales applied after each partial sum is, up to
    float32 rounding, the float64 matmul of the two dequantized operands."""
    qa, Xa, qw_t, Xw_t = _mx_operands(n_tokens, d, d_out, seed=d, dtype=dtype)
    exact = (quant.mx_dequantize(qa, Xa).double()
             @ quant.mx_dequantize(qw_t, Xw_t).double().T)
    z = quant.mx_matmul(qa, Xa, qw_t, Xw_t)
    assert z.dtype == torch.float32 and z.shape == (n_tokens, d_out)
    scale = (quant.mx_dequantize(qa, Xa).double().abs()
             @ quant.mx_dequantize(qw_t, Xw_t).double().abs().T)
    assert torch.all((z.double() - exact).abs() <= 1e-6 * scale)


def test_mx_block_partials_by_hand_with_loops():
    qa, Xa, qw_t, Xw_t = _mx_operands(2, 40, 3, seed=1)
    a, w = qa.double().numpy(), qw_t.double().numpy()
    by_hand = np.zeros((2, 3, 2))
    for t in range(2):
        for j in range(3):
            for c in range(40):
                by_hand[t, j, c // 32] += a[t, c] * w[j, c]
    partials = quant.mx_block_partials(qa, qw_t)
    assert partials.shape == (2, 3, 2)
    np.testing.assert_allclose(partials.double().numpy(), by_hand, rtol=1e-6)


def _mx_partials_by_slices(qa, qw_t):
    a, w = qa.float(), qw_t.float()
    return torch.stack([a[:, s:s + 32] @ w[:, s:s + 32].T
                        for s in range(0, a.shape[-1], 32)], dim=-1)


def _mx_matmul_in_numpy(qa, Xa, qw_t, Xw_t):
    partials = np.asarray(quant.mx_block_partials(qa, qw_t), np.float64)
    return (partials * Xa.numpy()[:, None, :] * Xw_t.numpy()[None]).sum(-1)


@pytest.mark.parametrize("partials, matmul", [
    (quant.mx_block_partials, quant.mx_matmul),
    (_mx_partials_by_slices, quant.mx_matmul),
    (quant.mx_block_partials, _mx_matmul_in_numpy),
], ids=["reference", "slices", "numpy"])
def test_mx_matmul_check_passes_right_code(partials, matmul):
    check_mx_matmul(partials, matmul)


def _scaled_partials(qa, qw_t):
    return quant.mx_block_partials(qa, qw_t) * 2.0**-3


def _summed_partials(qa, qw_t):
    return quant.mx_block_partials(qa, qw_t).sum(-1)


def _unscaled(qa, Xa, qw_t, Xw_t):
    return quant.mx_block_partials(qa, qw_t).sum(-1)


def _divided(qa, Xa, qw_t, Xw_t):
    return (quant.mx_block_partials(qa, qw_t) / Xa[:, None, :] / Xw_t[None]).sum(-1)


def _first_block_scales(qa, Xa, qw_t, Xw_t):
    return quant.mx_block_partials(qa, qw_t).sum(-1) * Xa[:, :1] * Xw_t[:, 0]


def _outputs_first(qa, Xa, qw_t, Xw_t):
    return quant.mx_matmul(qa, Xa, qw_t, Xw_t).T


def _fp8_products(qa, qw_t):
    return (qa.unsqueeze(1) * qw_t.unsqueeze(0)).sum(-1)


@pytest.mark.parametrize("partials, matmul, words", [
    (_summed_partials, quant.mx_matmul, "keep the block axis"),
    (_scaled_partials, quant.mx_matmul, "expected shape"),
    (quant.mx_block_partials, _unscaled, "needs its own two scales"),
    (quant.mx_block_partials, _divided, "do not divide"),
    (quant.mx_block_partials, _first_block_scales, "then add, instead of adding first"),
    (quant.mx_block_partials, _outputs_first, "A's tokens come first"),
    (_fp8_products, quant.mx_matmul, "cast back with .float"),
], ids=lambda v: getattr(v, "__name__", None))
def test_mx_matmul_check_names_the_slip(partials, matmul, words):
    with pytest.raises((CheckFailed, NotImplementedError, RuntimeError), match=words):
        check_mx_matmul(partials, matmul)


def test_mx_matmul_judge_names_partials_that_carry_the_scales():
    qa, Xa, qw_t, Xw_t = _mx_operands(2, 64, 3, seed=2)
    case = {"qa": qa.float().numpy(), "Xa": Xa.numpy(), "qw_t": qw_t.float().numpy(),
            "Xw_t": Xw_t.numpy(), "dtype": np.array("float8_e4m3fn")}
    partials = quant.mx_block_partials(qa, qw_t) * Xa[:, None, :] * Xw_t[None]
    output = {"partials": partials.double().numpy(),
              "z": quant.mx_matmul(qa, Xa, qw_t, Xw_t).double().numpy()}
    assert "already carry the scales" in quant_judges._judge_mx_matmul(case, output)
    output["partials"] = quant.mx_block_partials(qa, qw_t).double().numpy()
    assert quant_judges._judge_mx_matmul(case, output) is None


# ------------------------------------------- question 5: the conclusions

def _best_by_hand(errors):
    """The schemes within 25% of the smallest error, in numpy."""
    names = list(errors)
    values = np.array([errors[name] for name in names], np.float64)
    return {name for name, v in zip(names, values) if v / values.min() <= 1.25}


def test_fair_best_schemes_are_those_within_a_quarter_of_the_smallest():
    assert quant.fair_best_schemes({"a": 1.0, "b": 1.25, "c": 1.26}) == {"a", "b"}
    for errors in (quant.matmul_errors(), quant.loud_token_errors()):
        assert quant.fair_best_schemes(errors) == _best_by_hand(errors)


def test_the_cases_have_the_winners_the_unit_teaches():
    """Per channel and SmoothQuant tie on loud channels, per token and MX
    blocks on loud tokens, and no finer scale helps RMSNorm's offset."""
    assert quant.fair_best_schemes(quant.matmul_errors()) == {"per-channel",
                                                              "smoothquant"}
    assert quant.fair_best_schemes(quant.loud_token_errors()) == {"per-token",
                                                                  "per-block"}
    rms_out, keep = quant_probes.experiment_token_sets()["RMSNorm, mu = 20"]
    assert quant.token_scaling_verdict(*quant.scaling_errors(rms_out, keep)) == \
        "about-the-same"
    assert quant.token_scaling_verdict(1.0, 0.5) == "per-token"
    assert quant.token_scaling_verdict(0.5, 1.0) == "per-tensor"


RIGHT_BEST = {"loud channel": "per-channel", "loud token": "per-token",
              "RMSNorm, mu = 20": "about the same"}


@pytest.mark.parametrize("answers", [
    RIGHT_BEST,
    {"Loud_Channel ": "SmoothQuant", "LOUD TOKEN": "Per_Block",
     "rmsnorm, mu = 20": " About-The-Same"},
])
def test_best_schemes_accept_any_fair_winner_in_any_spelling(answers):
    check_best_schemes(answers, *PAIRS)


def test_best_schemes_are_read_against_the_students_own_functions_or_the_reference():
    """A per-channel pair that takes the amax down the rows measures per-token
    figures: on the student's own numbers per-channel no longer wins the loud
    channels. Naming what their table shows passes, and so does the true
    answer: the slip costs its own exercise, not this question too. An answer
    right by neither still fails."""
    wrong = (PAIRS[0], (per_row_quantize, per_row_dequantize), *PAIRS[2:])
    A, W = quant.outlier_layer()
    own = dict(zip(quant_probes.MATMUL_SCHEMES, quant_probes._measure_schemes(wrong, A, W)))
    assert "per-channel" not in quant.fair_best_schemes(own)
    check_best_schemes(RIGHT_BEST, *wrong)
    check_best_schemes({**RIGHT_BEST, "loud channel": "smoothquant"}, *wrong)
    with pytest.raises(CheckFailed, match="loud channel"):
        check_best_schemes({**RIGHT_BEST, "loud channel": "per-tensor"}, *wrong)


def test_a_whole_tensor_per_token_function_does_not_cost_the_true_loud_token_answer():
    """Per-token scaling done with one scale for the whole tensor: on the
    student's own figures per-token no longer wins the loud tokens, but the
    true answer, read off the reference, still passes."""
    whole_tensor = (quant.fp8_round_trip, *PAIRS[1:])
    A, W, quiet = quant.loud_token_layer()
    own = dict(zip(quant_probes.MATMUL_SCHEMES,
                   quant_probes._measure_schemes(whole_tensor, A, W, quiet)))
    assert "per-token" not in quant.fair_best_schemes(own)
    check_best_schemes(RIGHT_BEST, *whole_tensor)


def test_best_schemes_of_functions_that_raise_are_read_against_the_reference():
    def broken(x, dtype):
        raise NotImplementedError()

    check_best_schemes(RIGHT_BEST, broken, *PAIRS[1:])


@pytest.mark.parametrize("case, answer, words", [
    ("loud channel", "per-token", "still sets every token's own scale"),
    ("loud channel", "per-tensor", "largest error in your MATMUL_ERRORS"),
    ("loud channel", "per-block", "nor within 25% of it"),
    ("loud token", "per-channel", "still sets every channel's own scale"),
    ("loud token", "smoothquant", "divides whole channels"),
    ("loud token", "per-tensor", "largest error in your LOUD_TOKEN_ERRORS"),
    ("loud token", "zero-point", "not one of the schemes"),
    ("RMSNorm, mu = 20", "per-token", "the question's 25% rule"),
    ("RMSNorm, mu = 20", "per-channel", "not one of"),
])
def test_best_schemes_name_the_slip_and_not_the_answer(case, answer, words):
    with pytest.raises(CheckFailed, match=words) as failure:
        check_best_schemes({**RIGHT_BEST, case: answer}, *PAIRS)
    message = str(failure.value)
    assert case in message and message.count("not yet right") + \
        message.count("not one of") == 1
    if "not yet right" in message:
        right = {"per-channel", "smoothquant", "per-block", "about"} - {answer}
        assert not any(name in message for name in right)


def test_each_best_scheme_case_is_graded_on_its_own():
    """The assignment grades the three cases in three cells: one wrong or
    missing case costs that case's quarter point, not the others'."""
    one_wrong = {**RIGHT_BEST, "loud channel": "per-token"}
    check_best_scheme(one_wrong, "loud token", *PAIRS)
    check_best_scheme(one_wrong, "RMSNorm, mu = 20", *PAIRS)
    with pytest.raises(CheckFailed, match="still sets every token's own scale") as failure:
        check_best_scheme(one_wrong, "loud channel", *PAIRS)
    assert "loud token" not in str(failure.value)
    only_one = {"LOUD_TOKEN": "Per Token"}
    check_best_scheme(only_one, "loud token", *PAIRS)
    with pytest.raises(CheckFailed, match="no entry for"):
        check_best_scheme(only_one, "RMSNorm, mu = 20", *PAIRS)
    with pytest.raises(CheckFailed, match="not one of"):
        check_best_scheme({**RIGHT_BEST, "RMSNorm, mu = 20": "per-block"},
                          "RMSNorm, mu = 20", *PAIRS)


def test_best_schemes_need_every_case():
    with pytest.raises(CheckFailed, match="no entry for"):
        check_best_schemes({"loud token": "per-token"}, *PAIRS)


# ------------------------------ exercise 9: the offset and the zero-point

def _rms_offset_error_by_hand(mu):
    """RMSNorm in float64 numpy, the round trip by search over e4m3's values."""
    x = mu + quant.experiment_tokens().numpy().astype(np.float64)
    out = (x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-5)).astype(np.float32)
    out = out.astype(np.float64)
    scale = 448.0 / np.abs(out).max()
    back = _nearest_fp8(out * scale, E4M3) / scale
    return np.sqrt(((back - out) ** 2).mean()) / out.std()


def test_offset_crossing_is_where_a_fine_sweep_passes_the_limit():
    mus = np.arange(3.0, 4.5, 0.01)
    errors = np.array([_rms_offset_error_by_hand(mu) for mu in mus])
    assert np.all(np.diff(errors) > 0)
    swept = mus[np.argmax(errors >= quant.OFFSET_ERROR_LIMIT)]
    assert quant.offset_crossing() == pytest.approx(swept, abs=0.015)
    assert quant.offset_crossing(E5M2) < quant.offset_crossing() - 1


def test_exercise_3s_batch_is_the_assignments_plain_tokens():
    assert torch.equal(quant.experiment_tokens(),
                       quant_probes.experiment_token_sets()["plain"][0])


def test_range_round_trip_is_the_midpoint_mapping_done_by_hand():
    x = quant.rms_norm_output(20 + quant.experiment_tokens()).numpy().astype(np.float64)
    lo, hi = x.min(axis=-1, keepdims=True), x.max(axis=-1, keepdims=True)
    zero, half = (lo + hi) / 2, (hi - lo) / 2
    by_hand = _nearest_fp8((x - zero) * (448.0 / half), E4M3) * (half / 448.0) + zero
    ours = quant.range_round_trip(torch.from_numpy(x).float(), E4M3).double().numpy()
    # float32 against float64 arithmetic: a value on a rounding boundary may tip
    off = ~np.isclose(ours, by_hand, rtol=1e-5, atol=1e-6)
    assert off.mean() < 0.01
    # each token's smallest and largest value land on -448 and 448 exactly
    assert np.allclose(ours.min(axis=-1), x.min(axis=-1), rtol=1e-6)
    assert np.allclose(ours.max(axis=-1), x.max(axis=-1), rtol=1e-6)
    error = np.sqrt(((by_hand - x) ** 2).mean()) / x.std()
    assert error < 0.04 < 0.1 * _rms_offset_error_by_hand(20)


def test_range_round_trip_keeps_a_constant_token_exact():
    x = torch.tensor([[3.0, 3.0, 3.0], [0.0, 1.0, 4.0]])
    assert torch.equal(quant.range_round_trip(x, E4M3), x)


@pytest.mark.parametrize("as_given", [float, np.float32, torch.tensor, str,
                                      lambda v: Fraction(v).limit_denominator(100)])
def test_offset_answer_accepts_any_numeric_type_within_the_tolerance(as_given):
    crossing = quant.offset_crossing()
    for answer in (crossing - 0.04, crossing + 0.04):
        check_offset_answer(as_given(answer))


@pytest.mark.parametrize("wrong, words", [
    (lambda c: quant.offset_crossing(E5M2), "in e5m2"),
    (lambda c: c + 0.1, "refine your sweep or bisect"),
    (lambda c: c + 3, "is not near 0.1 there"),
    (lambda c: 25.0, "between mu = 0 and mu = 20"),
    (lambda c: "about four", "as a number"),
    (lambda c: None, "as a number"),
])
def test_offset_answer_names_the_slip_and_not_the_answer(wrong, words):
    crossing = quant.offset_crossing()
    with pytest.raises(CheckFailed, match=words) as failure:
        check_offset_answer(wrong(crossing))
    assert f"{crossing:.2f}" not in str(failure.value)


def _range_with(zero_of, half_of, add_back=True, per_token=True):
    """A zero-point round trip built from a zero-point and a half-width rule."""
    def zero_point(x, dtype):
        fmax = torch.finfo(dtype).max
        zero, half = zero_of(x), half_of(x)
        if not per_token:
            half = half.max()
        scale = torch.where(half > 0, fmax / half, torch.ones_like(half))
        stored = ((x - zero) * scale).clamp(-fmax, fmax).to(dtype).float() / scale
        return stored + zero if add_back else stored
    return zero_point


def _midpoint(x):
    return (x.amin(-1, keepdim=True) + x.amax(-1, keepdim=True)) / 2


def _half_range(x):
    return (x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)) / 2


def _range_in_numpy(x, dtype):
    x64 = x.double().numpy()
    lo, hi = x64.min(axis=-1, keepdims=True), x64.max(axis=-1, keepdims=True)
    zero, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    unit = np.where(half > 0, half / float(torch.finfo(dtype).max), 1.0)
    stored = torch.from_numpy((x64 - zero) / unit).float().to(dtype)
    return stored.double().numpy() * unit + zero


def _range_without_constant_guard(x, dtype):
    fmax = torch.finfo(dtype).max
    zero, scale = _midpoint(x), fmax / _half_range(x)
    return ((x - zero) * scale).clamp(-fmax, fmax).to(dtype).float() / scale + zero


@pytest.mark.parametrize("zero_point", [
    quant.range_round_trip,
    _range_in_numpy,
    _range_with(lambda x: _midpoint(x.double()).float(), _half_range),
    # the whole range onto fmax / 2: a power of two, so the same rounding
    _range_with(_midpoint, lambda x: 2 * _half_range(x)),
])
def test_zero_point_check_passes_right_code(zero_point):
    check_zero_point_round_trip(zero_point)


@pytest.mark.parametrize("zero_point, words", [
    (_range_with(_midpoint, _half_range, add_back=False), "add each token's midpoint back"),
    (lambda x, dtype: x.clone(), "nothing was stored in fp8"),
    (lambda x, dtype: quant.zero_point_round_trip(x, dtype, per_token_scale=True),
     "each token's mean as its zero-point;"),
    (quant.zero_point_round_trip, "and one scale for the whole tensor"),
    (_range_with(_midpoint, _half_range, per_token=False), "each token needs its own scale"),
    (lambda x, dtype: quant.fp8_round_trip(x - (x.min() + x.max()) / 2, dtype)
     + (x.min() + x.max()) / 2, "one zero-point and one scale for the whole tensor"),
    (quant.per_token_round_trip, "without a zero-point"),
    (lambda x, dtype: quant.range_round_trip(x, dtype).to(dtype), "float8 tensor"),
    (_range_without_constant_guard, "give it a scale of 1"),
])
def test_zero_point_check_names_the_slip(zero_point, words):
    with pytest.raises(CheckFailed, match=words):
        check_zero_point_round_trip(zero_point)


# ------------------------------- exercise 5: one loud entry in an MX block

def _others_by_hand(k):
    """The 31 quiet entries of the block after MX blocks done by hand."""
    block = np.full((1, 32), 1.875)
    block[0, 0] = 1.875 * 2.0**k
    q, X = _mx_by_hand(block, E4M3)
    return (q * X)[0, 1:]


def test_mx_outlier_thresholds_match_blocks_done_by_hand():
    backs = {k: _others_by_hand(k) for k in range(1, 30)}
    last_exact = max(k for k, b in backs.items() if np.all(b == 1.875))
    first_zero = min(k for k, b in backs.items() if np.all(b == 0))
    assert quant.mx_outlier_thresholds() == (last_exact, first_zero)
    # between the two the others are rounded on the subnormal grid, not lost
    assert all(np.all((b != 0) & (b != 1.875)) for k, b in backs.items()
               if last_exact < k < first_zero)


def test_mx_outlier_thresholds_refuse_a_quiet_value_the_format_cannot_hold():
    with pytest.raises(ValueError, match="not exact"):
        quant.mx_outlier_thresholds(E5M2)


@pytest.mark.parametrize("as_given", [int, float, str, np.int64, torch.tensor, Fraction])
def test_mx_outlier_answers_accept_any_numeric_type(as_given):
    check_mx_outlier_answers(*(as_given(k) for k in quant.mx_outlier_thresholds()))


@pytest.mark.parametrize("shift, words", [
    ((1, 0), "already rounded"),
    ((-1, 0), "still normal in e4m3"),
    ((0, -1), "round up to it, not down to 0"),
    ((0, 1), "already land below half"),
    ((0.5, 0), "a whole number"),
])
def test_mx_outlier_answers_name_the_slip_and_not_the_answer(shift, words):
    right = quant.mx_outlier_thresholds()
    answers = [k + d for k, d in zip(right, shift)]
    with pytest.raises(CheckFailed, match=words) as failure:
        check_mx_outlier_answers(*answers)
    message = str(failure.value)
    assert not any(f" {k} " in message or f" {k})" in message or f"{k}:" in message
                   for k in right if k not in answers)


def test_each_mx_outlier_k_is_graded_on_its_own():
    """Two cells, 0.75 points each: a slip in one k costs only that k, and
    its message names only that k."""
    last_exact, first_zero = quant.mx_outlier_thresholds()
    check_mx_last_exact_k(np.int64(last_exact))
    check_mx_first_zero_k(Fraction(first_zero))
    with pytest.raises(CheckFailed, match="round up to it") as failure:
        check_mx_first_zero_k(first_zero - 1)
    assert "LAST_EXACT" not in str(failure.value)
    with pytest.raises(CheckFailed, match="already rounded") as failure:
        check_mx_last_exact_k(last_exact + 3)
    assert "FIRST_ZERO" not in str(failure.value)
    with pytest.raises(CheckFailed, match="as a number"):
        check_mx_last_exact_k(None)


@pytest.mark.parametrize("value", [torch.tensor(1.2345678e-3), np.float32(1.2345678e-3),
                                   np.float64(1.2345678e-3),
                                   torch.tensor(1.2345678e-3, dtype=torch.float64)])
def test_scalar_answers_travel_at_full_precision(value):
    """str() of a 0-d tensor keeps 4 decimals ("tensor(0.0012)"), 3% off here:
    answers travel as the scalar's Python value instead."""
    sent = quant_probes._answers_as_text({"answer": value}, {})["answer"]
    assert float(str(sent)) == pytest.approx(1.2345678e-3, rel=1e-6)


def test_answers_that_are_not_scalars_travel_as_they_print():
    sent = quant_probes._answers_as_text({"a": torch.tensor([14, 19]), "b": "3.6"}, {})
    assert str(sent["a"]) == str(torch.tensor([14, 19])) and str(sent["b"]) == "3.6"


# ------------------------------ question 4: which scales a matmul can take

@pytest.mark.parametrize("answer", [
    ["per-token", "per-output-column"], ("Per_Output_Column", "PER TOKEN"),
    {"per-token", "per-output-column"}, np.array(["per-output-column", "per-token"]),
])
def test_factor_out_accepts_the_two_scales_in_any_collection_and_spelling(answer):
    check_factor_out(answer)


@pytest.mark.parametrize("answer, words", [
    (["per-token", "per-output-column", "per-channel"], "a different number in each term"),
    (["per-token"], "r_j, is one number"),
    ("per-channel", "s_t, is one number"),
    ([], "s_t, is one number"),
    (["per-row"], "each entry is one of"),
    (None, "each entry is one of"),
])
def test_factor_out_names_the_slip(answer, words):
    with pytest.raises(CheckFailed, match=words):
        check_factor_out(answer)


def _fold_into_w(q, s, W):
    return q.float() @ (W / s[:, None])


@pytest.mark.parametrize("per_channel_matmul", [
    _fold_into_w,
    lambda q, s, W: (q.double() / s.double()) @ W.double(),  # dequantize, then float64
    lambda q, s, W: torch.from_numpy(q.float().numpy() @ (W.numpy() / s.numpy()[:, None])),
])
def test_per_channel_matmul_accepts_any_way_to_the_same_product(per_channel_matmul):
    check_per_channel_matmul(per_channel_matmul)


def test_per_channel_matmul_matches_dequantize_then_multiply_in_float64():
    """The reference written another way: per_channel_quantize's q and s, the
    product of the dequantized A with W in float64."""
    A = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    W = torch.randn(40, 6, generator=torch.Generator().manual_seed(4))
    q, s = quant.per_channel_quantize(A, E4M3)
    expected = quant.per_channel_dequantize(q, s).double() @ W.double()
    assert torch.allclose(_fold_into_w(q, s, W).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("per_channel_matmul, words", [
    (lambda q, s, W: q.float() @ (W * s[:, None]), "do not multiply it"),
    (lambda q, s, W: q.float() @ W, "the scales are left out"),
    (lambda q, s, W: q @ (W / s[:, None]), "cast back with .float"),
    (lambda q, s, W: (q.float() @ (W / s[:, None])).to(E4M3), "return float32"),
    (lambda q, s, W: (q.float() @ W) / s.mean(), "expected shape"),
])
def test_per_channel_matmul_names_the_slip(per_channel_matmul, words):
    with pytest.raises(CheckFailed, match=words):
        check_per_channel_matmul(per_channel_matmul)


# ------------------------------ exercise 5, continued: the scale rounded up

def _nearest_on_grid(values, grid):
    """Round each value to the nearest of the sorted grid, ties to the even
    pattern being irrelevant for random data; clamps at the ends."""
    idx = np.clip(np.searchsorted(grid, values), 1, len(grid) - 1)
    lo, hi = grid[idx - 1], grid[idx]
    return np.where(values - lo <= hi - values, lo, hi)


def test_mx_rule_figures_match_a_computation_written_another_way():
    """Clipping from the mantissa (amax / X > 448 exactly when amax's frexp
    mantissa passes 0.875), the round-up rule by nearest value on e4m3's list."""
    x = quant.mx_rule_blocks().double().numpy()
    amax = np.abs(x).max(axis=1)
    mantissa, exponent = np.frexp(amax)
    clipped = float(np.mean(mantissa > 448 / 512))
    grid = _fp8_grid(E4M3)
    X = 2.0 ** np.ceil(np.log2(amax / 448))
    back = _nearest_on_grid(x / X[:, None], grid) * X[:, None]
    round_up = float(np.sqrt(np.mean((back - x) ** 2)) / x.std())
    ours = quant.mx_rule_figures()
    assert ours[0] == pytest.approx(clipped, abs=1e-12)
    assert ours[2] == pytest.approx(round_up, rel=1e-3)
    assert ours[1] > 1.05 * ours[2]  # the floor rule loses more, through its clipped blocks


def test_the_round_up_rule_never_clips():
    x = quant.mx_rule_blocks()
    q, X = quant.mx_round_up_quantize(x, E4M3)
    assert float((x.abs().amax(-1) / X.squeeze(-1)).max()) <= 448


@pytest.mark.parametrize("as_given", [float, str, np.float32, torch.tensor])
def test_mx_rule_answers_accept_any_numeric_type(as_given):
    clipped, floor_error, round_up = quant.mx_rule_figures()
    pair = (quant.mx_quantize, quant.mx_dequantize)
    check_mx_clipped_fraction(as_given(clipped), *pair)
    check_mx_rule_errors((as_given(floor_error), as_given(round_up)), *pair)
    check_mx_clipped_fraction(Fraction(int(round(clipped * 4096)), 4096), *pair)
    check_mx_rule_errors(torch.tensor([floor_error, round_up]), *pair)
    check_mx_rule_errors(np.array([floor_error, round_up]), *pair)


def test_mx_rule_answers_are_read_against_the_students_own_mx_quantize():
    """A non-power-of-two X (amax / 448) clips nothing: naming what that
    function measures fails, since that X is not the floor rule's, and the
    true figure passes; a broken pair falls back on the reference."""
    def amax_scale(x, dtype):
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        X = blocks.abs().amax(-1) / 448
        return (blocks / X.unsqueeze(-1)).to(dtype).flatten(-2), X

    def broken(x, dtype):
        raise NotImplementedError()

    clipped = quant.mx_rule_figures()[0]
    with pytest.raises(CheckFailed, match="not the floor rule's"):
        check_mx_clipped_fraction(0.0, amax_scale, quant.mx_dequantize)
    check_mx_clipped_fraction(clipped, amax_scale, quant.mx_dequantize)
    check_mx_clipped_fraction(clipped, broken, quant.mx_dequantize)
    with pytest.raises(CheckFailed):
        check_mx_clipped_fraction(0.0, broken, quant.mx_dequantize)


@pytest.mark.parametrize("answer, words", [
    (lambda c, f, u: 100 * c, "a percentage"),
    (lambda c, f, u: 4096 * c, "the number of blocks"),
    (lambda c, f, u: c / 32, "count blocks, not elements"),
])
def test_mx_clipped_fraction_names_the_slip(answer, words):
    with pytest.raises(CheckFailed, match=words):
        check_mx_clipped_fraction(answer(*quant.mx_rule_figures()), quant.mx_quantize,
                                  quant.mx_dequantize)


@pytest.mark.parametrize("answer, words", [
    (lambda c, f, u: (u, f), "wrong way round"),
    (lambda c, f, u: (f, f), "rounded up, not down"),
    (lambda c, f, u: (0.5, u), "floor rule's error is not yet right"),
    (lambda c, f, u: f, "a pair of numbers"),
])
def test_mx_rule_errors_name_the_slip(answer, words):
    with pytest.raises(CheckFailed, match=words):
        check_mx_rule_errors(answer(*quant.mx_rule_figures()), quant.mx_quantize,
                             quant.mx_dequantize)


def test_the_students_side_measures_the_reference_pair_as_the_grader_does():
    """The probe runs in the student's kernel, without normref.quant: its own
    blocks and measurement, given the reference pair, give the grader's figures."""
    own = quant_probes._own_mx_rule_figures(quant.mx_quantize, quant.mx_dequantize)
    assert quant_probes.MX_RULE_SHAPE == quant.MX_RULE_SHAPE
    assert np.allclose(own[:2], quant.mx_rule_figures()[:2], rtol=1e-9)
    assert own[2] == 1.0  # the reference's X is the floor rule's


def test_a_round_up_mx_quantize_earns_nothing_for_the_floor_rules_figures():
    """An mx_quantize with the round-up rule clips nothing, and its round trip
    is the round-up rule's: neither figure is the floor rule's, so naming
    them as the floor rule's fails."""
    def round_up(x, dtype):
        blocks = x.reshape(*x.shape[:-1], -1, 32)
        amax = blocks.abs().amax(-1).double()
        X = torch.exp2(torch.ceil(torch.log2(amax / 448))).float()
        q = (blocks / X.unsqueeze(-1)).clamp(-448, 448).to(dtype)
        return q.flatten(-2), X

    clipped, floor_error, round_up_error = quant.mx_rule_figures()
    with pytest.raises(CheckFailed, match="not the floor rule's"):
        check_mx_clipped_fraction(0.0, round_up, quant.mx_dequantize)
    check_mx_clipped_fraction(clipped, round_up, quant.mx_dequantize)
    with pytest.raises(CheckFailed, match="floor rule's error is not yet right"):
        check_mx_rule_errors((round_up_error, round_up_error), round_up,
                             quant.mx_dequantize)
    check_mx_rule_errors((floor_error, round_up_error), round_up, quant.mx_dequantize)
