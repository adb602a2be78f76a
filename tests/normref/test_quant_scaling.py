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
    check_matmul_answers,
    check_matmul_errors,
    check_mx_blocks,
    check_per_channel,
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


def test_matmul_errors_per_channel_wins_then_blocks_then_tokens_then_tensor():
    errors = quant.matmul_errors()
    order = sorted(errors, key=errors.get)
    assert order == ["per-channel", "per-block", "per-token", "per-tensor"]
    assert 0.02 < errors["per-channel"] < 0.035  # the plain e4m3 error
    assert errors["per-tensor"] / errors["per-channel"] > 10


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
         (quant.mx_quantize, quant.mx_dequantize))


def test_matmul_errors_check_passes_the_measurement():
    check_matmul_errors(_right_matmul_errors(), *PAIRS)


def test_matmul_errors_check_refuses_typed_figures_and_wrong_functions():
    typed = {k: round(v, 2) for k, v in _right_matmul_errors().items()}
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        check_matmul_errors(typed, *PAIRS)
    wrong = (PAIRS[0], (per_row_quantize, per_row_dequantize), PAIRS[2])
    with pytest.raises(CheckFailed, match="per-channel matmul error"):
        check_matmul_errors(_right_matmul_errors(), *wrong)
    with pytest.raises(CheckFailed, match="no entry for"):
        check_matmul_errors({"per-tensor": 0.5}, *PAIRS)


def test_matmul_answers_are_read_with_tolerance_in_any_numeric_type():
    errors = _right_matmul_errors()
    gain = errors["per-tensor"] / errors["per-channel"]
    for answer in (gain, round(gain), np.float32(gain * 1.2), Fraction(round(gain * 0.8))):
        check_matmul_answers("per-channel", answer)
    with pytest.raises(CheckFailed, match="not the scheme with the smallest"):
        check_matmul_answers("per-block", gain)
    with pytest.raises(CheckFailed, match="other way round"):
        check_matmul_answers("per-channel", 1 / gain)
    with pytest.raises(CheckFailed, match="not yet right: you answered 2"):
        check_matmul_answers("per-channel", 2)
    with pytest.raises(CheckFailed, match="must be one of"):
        check_matmul_answers("channel", gain)
    with pytest.raises(CheckFailed, match="as a number"):
        check_matmul_answers("per-channel", None)
