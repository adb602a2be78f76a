"""Unit 06, zero-centred outputs and low precision: normref.quant against
torch's float8 dtypes and the lesson's figures; the checks against right and
wrong code.
"""

import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from normref import quant
from normref.checks import (
    CheckFailed,
    _registry,
    _runner,
    check_delayed_scaler,
    check_delayed_scaler_saturates,
    check_per_token_round_trip,
    check_scaling_answers,
    check_scaling_table,
    check_spike_answer,
    quant_judges,
    quant_probes,
)
from normref.checks.quant_judges import (
    _judge_delayed,
    _judge_per_token,
    _judge_spike,
    _judge_table,
)
from normref.checks.tolerances import mismatch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
SHAPES = [(7,), (3, 5), (2, 3, 16), (64, 128), (2, 2, 2, 33)]
# The lesson's e4m3 figures (error over std, offset kept / removed), to two
# significant digits; seed 0 and (256, 1024) tokens land within 6% of each.
FIGURES_RTOL = 0.10
KEPT_E4M3 = {0.0: 0.027, 1.0: 0.037, 5.0: 0.13, 20.0: 0.52}
REMOVED_E4M3 = 0.027


def _every_fp8_value(dtype):
    """All finite values of an fp8 format, as float32, from its 256 bit patterns."""
    values = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return values[torch.isfinite(values)]


# ------------------------------------------------------------ formats, torch

def test_fp8_max_is_torch_finfo_max():
    assert quant.fp8_max(E4M3) == 448.0 == torch.finfo(E4M3).max
    assert quant.fp8_max(E5M2) == 57344.0 == torch.finfo(E5M2).max


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_fp8_max_is_the_largest_finite_bit_pattern(dtype):
    assert _every_fp8_value(dtype).max().item() == quant.fp8_max(dtype)


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_casting_works_but_arithmetic_does_not_on_cpu(dtype):
    a = torch.ones(3).to(dtype)
    assert a.dtype == dtype and torch.equal(a.float(), torch.ones(3))
    with pytest.raises(NotImplementedError, match="Float8"):
        a + a


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_clamp_makes_overflow_the_same_on_every_torch_version(dtype):
    x = torch.tensor([1e6, -1e6, 3.0])
    y = quant.fp8_round_trip(x, dtype, scale=1.0)
    fmax = quant.fp8_max(dtype)
    assert torch.equal(y, torch.tensor([fmax, -fmax, 3.0]))


def test_without_a_clamp_e5m2_overflows_to_inf_on_this_torch():
    """The behaviour the clamp protects against (and the checks rely on)."""
    assert torch.isinf(torch.tensor([1e5]).to(E5M2).float()).all()


# ------------------------------------------------------------ per-tensor round trip

@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_round_trip_lands_on_the_scaled_fp8_grid(dtype, seed, shape):
    x = torch.from_numpy(np.random.default_rng(seed).normal(2, 3, shape).astype(np.float32))
    y = quant.fp8_round_trip(x, dtype)
    scale = quant.amax_scale(x, dtype)
    assert y.dtype == torch.float32 and y.shape == x.shape
    scaled = y * scale  # back on the fp8 grid, up to float32 rounding
    assert torch.allclose(scaled, scaled.to(dtype).float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_round_trip_error_is_at_most_half_a_step(dtype, seed, shape):
    x = torch.from_numpy(np.random.default_rng(seed).normal(-1, 2, shape).astype(np.float32))
    y = quant.fp8_round_trip(x, dtype)
    scale = float(quant.amax_scale(x, dtype))
    info = torch.finfo(dtype)
    q = (x.abs() * scale).clamp(min=info.tiny)
    half_step = 2.0 ** torch.floor(torch.log2(q)) * info.eps / 2 / scale
    assert ((y - x).abs() <= half_step * 1.0001).all()


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_round_trip_keeps_amax_zeros_and_signs(dtype):
    x = torch.tensor([0.0, -7.0, 3.0, 0.0, 0.5])
    y = quant.fp8_round_trip(x, dtype)
    assert y[1] == -7.0, "the largest |x| maps onto fmax, which is exact"
    assert y[0] == 0 and y[3] == 0
    assert torch.equal(torch.sign(y), torch.sign(x))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_round_trip_of_zeros_is_zeros(dtype):
    assert torch.equal(quant.fp8_round_trip(torch.zeros(3, 4), dtype), torch.zeros(3, 4))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_round_trip_is_idempotent(dtype):
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1))
    once = quant.fp8_round_trip(x, dtype)
    assert torch.equal(quant.fp8_round_trip(once, dtype), once)


def test_rmse_over_std_and_over_rms_by_hand():
    x, x_rt = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.0, 3.0, 5.0])
    assert quant.rmse_over_std(x, x_rt) == pytest.approx(0.5 / np.sqrt(1.25))
    assert quant.rmse_over_rms(x, x_rt) == pytest.approx(0.5 / np.sqrt(7.5))
    assert quant.rmse_over_std(x, x) == 0.0


def test_norm_outputs_match_torch_modules():
    x = quant.offset_tokens(3.0, 8, 32)
    assert torch.allclose(quant.layer_norm_output(x),
                          torch.nn.LayerNorm(32, elementwise_affine=False)(x), atol=1e-6)
    ms = x.pow(2).mean(-1, keepdim=True)
    assert torch.allclose(quant.rms_norm_output(x), x / torch.sqrt(ms + 1e-5), atol=1e-6)
    assert torch.allclose(quant.rms_norm_output(x), F.rms_norm(x, (32,), eps=1e-5))


# ------------------------------------------------------------ the lesson's figures

@pytest.mark.parametrize("mu", sorted(KEPT_E4M3))
def test_lesson_e4m3_figures(mu):
    errors = quant.norm_errors_for_offset(mu, E4M3)
    kept, removed = KEPT_E4M3[mu], REMOVED_E4M3
    assert errors["raw"] == pytest.approx(kept, rel=FIGURES_RTOL)
    assert errors["rms_norm"] == pytest.approx(kept, rel=FIGURES_RTOL)
    assert errors["centred"] == pytest.approx(removed, rel=FIGURES_RTOL)
    assert errors["layer_norm"] == pytest.approx(removed, rel=FIGURES_RTOL)


def test_rms_norm_error_grows_with_the_offset_and_layer_norm_does_not():
    ln = [quant.norm_errors_for_offset(mu, n_tokens=64, d=256)["layer_norm"]
          for mu in (0, 1, 5, 20)]
    rms = [quant.norm_errors_for_offset(mu, n_tokens=64, d=256)["rms_norm"]
           for mu in (0, 1, 5, 20)]
    assert np.all(np.diff(rms) > 0)
    assert max(ln) / min(ln) < 1.1


def test_e5m2_has_about_twice_the_error_of_e4m3():
    """One mantissa bit fewer: the rounding step, and so the error, doubles."""
    e4 = quant.norm_errors_for_offset(0.0, E4M3)["layer_norm"]
    e5 = quant.norm_errors_for_offset(0.0, E5M2)["layer_norm"]
    assert e5 / e4 == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize("mu", [0.0, 1.0, 5.0, 20.0])
def test_over_its_rms_rms_norms_error_is_flat(mu):
    """Error over RMS: RMSNorm's e4m3 error is about 0.026 at every offset."""
    out = quant.rms_norm_output(quant.offset_tokens(mu))
    assert quant.rmse_over_rms(out, quant.fp8_round_trip(out, E4M3)) == \
        pytest.approx(0.026, rel=0.05)


def test_bf16_figures_at_mu_20():
    x = quant.offset_tokens(20.0)
    ln, rms = quant.layer_norm_output(x), quant.rms_norm_output(x)
    assert quant.rmse_over_std(ln, quant.bf16_round_trip(ln)) == pytest.approx(0.0017,
                                                                               rel=0.05)
    assert quant.rmse_over_std(rms, quant.bf16_round_trip(rms)) == pytest.approx(0.0355,
                                                                                 rel=0.05)



def test_lesson_next_layer_sees_half_the_token_spread_for_rms_norm_at_mu_20():
    """Section 6.2: RMSNorm's output in e4m3 leaves about 0.5 of the next
    layer's token-to-token spread as error; layer norm's under 0.03; over the
    RMS both are under 0.03 (the lesson's seeds and shapes)."""
    tokens = 20 + torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))
    W = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(1)) / 32
    for out, over_spread in [(quant.rms_norm_output(tokens), (0.4, 0.6)),
                             (quant.layer_norm_output(tokens), (0.0, 0.03))]:
        z = out.double() @ W.double().T
        error = (quant.fp8_round_trip(out, E4M3).double() @ W.double().T - z)
        rmse = error.pow(2).mean().sqrt()
        across_tokens = z.std(dim=0, correction=0).pow(2).mean().sqrt()
        assert over_spread[0] < rmse / across_tokens < over_spread[1]
        assert rmse / z.pow(2).mean().sqrt() < 0.03


def test_lesson_outlier_channel_costs_nothing_to_1e3_and_ten_times_at_1e5():
    """Section 7: gamma on channel 0; the e4m3 error on the other channels is
    the same for both norms, flat up to 1e3, x1.25 to x1.6 at 1e4, over x10 at
    1e5."""
    tokens = torch.randn(128, 1024, generator=torch.Generator().manual_seed(0))
    others = torch.ones(128, 1024, dtype=torch.bool)
    others[:, 0] = False
    errors = {}
    for g in (1.0, 1e2, 1e3, 1e4, 1e5):
        gamma = torch.ones(1024, dtype=torch.float64)
        gamma[0] = g
        pair = []
        for norm in (F.layer_norm, F.rms_norm):
            out = norm(tokens.double(), (1024,), weight=gamma, eps=1e-5).float()
            pair.append(quant.rmse_over_std(out[others],
                                            quant.fp8_round_trip(out, E4M3)[others]))
        assert pair[0] == pytest.approx(pair[1], rel=0.02)
        errors[g] = pair[1]
    assert all(errors[g] < 0.03 for g in (1.0, 1e2, 1e3))
    assert 1.25 < errors[1e4] / errors[1.0] < 1.6 and errors[1e5] / errors[1.0] > 10


# ------------------------------------------------------------ per-token scaling

@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
@pytest.mark.parametrize("seed, shape", list(enumerate(SHAPES)))
def test_per_token_is_the_per_tensor_round_trip_of_each_token(dtype, seed, shape):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 10.0 ** rng.uniform(-3, 3, size=shape[:-1] + (1,))
    x = torch.from_numpy(x.astype(np.float32))
    y = quant.per_token_round_trip(x, dtype)
    assert y.dtype == torch.float32 and y.shape == x.shape
    rows, y_rows = x.reshape(-1, shape[-1]), y.reshape(-1, shape[-1])
    for row, y_row in zip(rows, y_rows):
        assert torch.equal(y_row, quant.fp8_round_trip(row, dtype))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_per_token_maps_each_token_amax_onto_fmax(dtype):
    x = torch.tensor([[0.001, -0.003], [5.0, 700.0], [0.0, 0.0]])
    y = quant.per_token_round_trip(x, dtype)
    scale = quant.fp8_max(dtype) / x.abs().amax(-1, keepdim=True)[:2]
    fmax = torch.full((2,), quant.fp8_max(dtype))
    assert torch.allclose((y[:2] * scale).abs().amax(-1), fmax, rtol=1e-6)
    assert torch.allclose(y[:2, 1], x[:2, 1], rtol=1e-6), "each amax is exact"

    assert torch.equal(y[2], torch.zeros(2))


def test_per_token_wins_on_a_loud_token_and_not_on_a_loud_channel():
    table = {name: quant.scaling_errors(x, keep)
             for name, (x, keep) in quant_probes.experiment_token_sets().items()}
    per_tensor, per_token = table["loud token"]
    assert per_tensor > 10 * per_token and per_token == pytest.approx(0.026, rel=0.05)
    assert table["loud channel"][0] == pytest.approx(table["loud channel"][1], rel=0.01)
    assert table["loud channel"][0] > 3 * table["plain"][0]
    rms_tensor, rms_token = table["RMSNorm, mu = 20"]
    assert rms_token > 15 * table["plain"][1] and rms_tensor / rms_token < 1.25
    assert table["plain"][0] == pytest.approx(table["plain"][1], rel=0.05)


def test_the_experiment_batches_are_the_assignments():
    sets = quant_probes.experiment_token_sets()
    assert list(sets) == list(quant_probes.TOKEN_SET_NAMES)
    plain = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sets["plain"][0], plain)
    assert sets["loud token"][0][0].abs().max() > 1e5
    assert int((~sets["loud token"][1]).sum()) == 256
    assert int((~sets["loud channel"][1]).sum()) == 64


# ------------------------------------------------------------ delayed scaling

@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_delayed_scaler_uses_the_scale_from_earlier_calls(dtype):
    stream = [s * torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
              for i, s in enumerate([1.0, 4.0, 0.5, 2.0, 0.25, 0.25, 0.25])]
    scaler = quant.DelayedScaler(dtype, history_len=3)
    assert scaler.scale == 1.0 and scaler.history == []
    amaxes = []
    for x in stream:
        used = scaler.scale
        y = scaler(x)
        assert torch.equal(y, quant.fp8_round_trip(x, dtype, used))
        amaxes.append(float(x.abs().max()))
        assert scaler.history == amaxes[-3:]
        assert scaler.scale == pytest.approx(quant.fp8_max(dtype) / max(amaxes[-3:]))


@pytest.mark.parametrize("dtype", quant.FP8_FORMATS)
def test_delayed_scaler_saturates_a_spike(dtype):
    scaler = quant.DelayedScaler(dtype, history_len=4)
    scaler(torch.tensor([1.0, -2.0]))  # scale becomes fmax / 2
    y = scaler(torch.tensor([100.0, -1.0, -300.0]))
    assert torch.equal(y, torch.tensor([2.0, -1.0, -2.0]))
    assert torch.isfinite(y).all()


def test_delayed_scaler_of_zeros_keeps_scale_one():
    scaler = quant.DelayedScaler(E4M3, history_len=2)
    scaler(torch.zeros(3))
    assert scaler.scale == 1.0 and scaler.history == [0.0]


@pytest.mark.parametrize("history_len", [1, 4, 16])
def test_a_spike_sets_the_scale_for_history_len_calls(history_len):
    assert quant.steps_scaled_by_spike(history_len) == history_len


# ------------------------------------------------------------ student code: per token

def correct_per_token(x, dtype):
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return torch.clamp(x * scale, -fmax, fmax).to(dtype).float() / scale


def unusual_per_token(x, dtype):
    """Right, another way: a loop over rows, divide by amax / fmax, numpy amax."""
    fmax = float(torch.finfo(dtype).max)
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    out = torch.empty_like(rows)
    for i, row in enumerate(rows):
        amax = float(np.abs(row.numpy()).max())
        step = amax / fmax if amax else 1.0
        out[i] = (row / step).clamp(-fmax, fmax).to(dtype).to(torch.float32) * step
    return out.reshape(x.shape)


def whole_tensor_scale(x, dtype):
    return quant.fp8_round_trip(x, dtype)


def per_column_scale(x, dtype):
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax(dim=0, keepdim=True).clamp(min=1e-30)
    return torch.clamp(x * fmax / amax, -fmax, fmax).to(dtype).float() * amax / fmax


def nan_for_zero_rows(x, dtype):
    fmax = torch.finfo(dtype).max
    scale = fmax / x.abs().amax(dim=-1, keepdim=True)
    return torch.clamp(x * scale, -fmax, fmax).to(dtype).float() / scale


def returns_fp8(x, dtype):
    return correct_per_token(x, dtype).to(dtype)


def no_unscale(x, dtype):
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
    return torch.clamp(x * fmax / amax, -fmax, fmax).to(dtype).float()


def fp8_arithmetic(x, dtype):
    fmax = torch.finfo(dtype).max
    scale = fmax / x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
    return torch.clamp(x * scale, -fmax, fmax).to(dtype) / scale


@pytest.mark.parametrize("solution", [correct_per_token, unusual_per_token,
                                      quant.per_token_round_trip])
def test_per_token_check_passes_right_code(solution):
    check_per_token_round_trip(solution)


@pytest.mark.parametrize("mistake, words", [
    (whole_tensor_scale, "one scale for the whole tensor"),
    (per_column_scale, "over tokens"),
    (nan_for_zero_rows, "amax 0"),
    (returns_fp8, "float8 tensor"),
    (no_unscale, "scaled values"),
    (fp8_arithmetic, "not implemented on the CPU"),
], ids=lambda m: getattr(m, "__name__", "words"))
def test_per_token_check_names_the_mistake(mistake, words):
    with pytest.raises(CheckFailed, match=words):
        check_per_token_round_trip(mistake)


# ------------------------------------------------------------ student code: delayed

class CorrectScaler:
    def __init__(self, dtype, history_len=16):
        self.dtype, self.history_len = dtype, history_len
        self.history, self.scale = [], 1.0

    def __call__(self, x):
        fmax = torch.finfo(self.dtype).max
        y = torch.clamp(x * self.scale, -fmax, fmax).to(self.dtype).float() / self.scale
        self.history.append(x.abs().max().item())
        self.history = self.history[-self.history_len:]
        amax = max(self.history)
        self.scale = fmax / amax if amax > 0 else 1.0
        return y


class UnusualScaler:
    """Right, another way: a deque, numpy, the step amax / fmax."""

    def __init__(self, dtype, history_len=16):
        from collections import deque

        self.dtype = dtype
        self.history = deque(maxlen=history_len)
        self.scale = 1.0

    def __call__(self, x):
        fmax = float(torch.finfo(self.dtype).max)
        step = 1.0 / self.scale
        y = (x / step).clamp(-fmax, fmax).to(self.dtype).to(torch.float32) * step
        self.history.append(float(np.abs(x.numpy()).max()))
        biggest = max(self.history)
        self.scale = fmax / biggest if biggest else 1.0
        return y


class JustInTime(CorrectScaler):
    """Scales each tensor by its own amax: current scaling, not delayed."""

    def __call__(self, x):
        self.history.append(x.abs().max().item())
        self.history = self.history[-self.history_len:]
        amax = max(self.history)
        self.scale = torch.finfo(self.dtype).max / amax if amax > 0 else 1.0
        return quant.fp8_round_trip(x, self.dtype)


class OneTooMany(CorrectScaler):
    def __call__(self, x):
        y = quant.fp8_round_trip(x, self.dtype, self.scale)
        self.history.append(x.abs().max().item())
        self.history = self.history[-(self.history_len + 1):]
        amax = max(self.history)
        self.scale = torch.finfo(self.dtype).max / amax if amax > 0 else 1.0
        return y


class NoClamp(CorrectScaler):
    def __call__(self, x):
        y = (x * self.scale).to(self.dtype).float() / self.scale
        self.history.append(x.abs().max().item())
        self.history = self.history[-self.history_len:]
        amax = max(self.history)
        self.scale = torch.finfo(self.dtype).max / amax if amax > 0 else 1.0
        return y


class MeanOfHistory(CorrectScaler):
    def __call__(self, x):
        y = quant.fp8_round_trip(x, self.dtype, self.scale)
        self.history.append(x.abs().max().item())
        self.history = self.history[-self.history_len:]
        amax = float(np.mean(self.history))
        self.scale = torch.finfo(self.dtype).max / amax if amax > 0 else 1.0
        return y


@pytest.mark.parametrize("solution", [CorrectScaler, UnusualScaler, quant.DelayedScaler])
def test_delayed_checks_pass_right_code(solution):
    check_delayed_scaler(solution)
    check_delayed_scaler_saturates(solution)


@pytest.mark.parametrize("mistake, words", [
    (JustInTime, "own amax"),
    (OneTooMany, "one too many"),
    (MeanOfHistory, "not the mean"),
], ids=lambda m: getattr(m, "__name__", "words"))
def test_delayed_check_names_the_mistake(mistake, words):
    with pytest.raises(CheckFailed, match=words):
        check_delayed_scaler(mistake)


def test_no_clamp_fails_only_where_a_spike_saturates():
    """e4m3 casts saturate on this torch, so the saturation check needs e5m2;
    the contract check has no overflow in e5m2, whatever the seed."""
    probe = quant_probes._call_delayed_scaler
    for seed in range(6):
        assert _verdict("quant_delayed_scaler", NoClamp, probe, seed)["passed"], seed
        assert not _verdict("quant_delayed_saturation", NoClamp, probe, seed)["passed"]
    with pytest.raises(CheckFailed, match="clamp"):
        check_delayed_scaler_saturates(NoClamp)


# ------------------------------------------------------------ the experiment

def measured_table(per_token=correct_per_token):
    return {name: (quant.masked_error(x, quant.fp8_round_trip(x, E4M3), keep),
                   quant.masked_error(x, per_token(x, E4M3), keep))
            for name, (x, keep) in quant_probes.experiment_token_sets().items()}


def test_table_check_passes_a_measured_table():
    check_scaling_table(measured_table(), correct_per_token)
    check_scaling_table(measured_table(unusual_per_token), unusual_per_token)


def test_table_that_measures_a_wrong_per_token_function_earns_the_table():
    """Its mistake costs exercise 1's points, not the table's as well."""
    check_scaling_table(measured_table(whole_tensor_scale), whole_tensor_scale)


def test_table_check_refuses_figures_the_code_did_not_measure():
    table = measured_table()

    def not_written(x, dtype):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_scaling_table(table, not_written)
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        check_scaling_table(table, whole_tensor_scale)
    typed = {name: (round(a, 3), round(b, 3)) for name, (a, b) in table.items()}
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        check_scaling_table(typed, correct_per_token)
    with pytest.raises(CheckFailed, match="wrong way round"):
        check_scaling_table({n: pair[::-1] for n, pair in table.items()}, correct_per_token)
    with pytest.raises(CheckFailed, match="no row"):
        check_scaling_table({"plain": table["plain"]}, correct_per_token)
    with pytest.raises(CheckFailed, match="not a dict"):
        check_scaling_table(None, correct_per_token)


def _true_scales_by_hand():
    """The two scales of question 2, in numpy float64 from the batches:
    RMSNorm's largest per-token scale over its smallest, and the largest
    scaled quiet entry of the loud-channel batch."""
    sets = quant_probes.experiment_token_sets()
    rms = sets["RMSNorm, mu = 20"][0].numpy().astype(np.float64)
    scales = 448.0 / np.abs(rms).max(axis=1)
    loud, keep = (t.numpy() for t in sets["loud channel"])
    loud = loud.astype(np.float64)
    stored = loud * (448.0 / np.abs(loud).max(axis=1, keepdims=True))
    return scales.max() / scales.min(), np.abs(stored[keep]).max()


def test_question_2_scales_are_the_by_hand_figures():
    spread, stored = _true_scales_by_hand()
    truths = quant_judges._true_scaling_answers()
    assert truths["rms_scale_spread"] == pytest.approx(spread, rel=1e-12)
    assert truths["quiet_stored_max"] == pytest.approx(stored, rel=1e-12)
    # the mechanism the question is after: RMSNorm's tokens share one scale
    # to within 10%, and the quiet features land near e4m3's smallest normal
    assert 1 < spread < 1.1
    assert torch.finfo(E4M3).tiny < stored < 2 * torch.finfo(E4M3).tiny


@pytest.mark.parametrize("spread, stored", [
    (np.float32, np.float64), (torch.tensor, str), (lambda v: f" {v!r} ", float),
])
def test_question_2_accepts_any_numeric_type(spread, stored):
    true_spread, true_stored = _true_scales_by_hand()
    check_scaling_answers(spread(true_spread), stored(true_stored))
    check_scaling_answers(Fraction(true_spread).limit_denominator(10**6),
                          Fraction(true_stored).limit_denominator(10**9))


@pytest.mark.parametrize("which, wrong, words", [
    (0, lambda s, q: 1 / s, "smallest scale over the largest"),
    (0, lambda s, q: 1.0, "divide the largest of the 64 by the smallest"),
    (1, lambda s, q: 3 * q, "then take the largest"),
    (1, lambda s, q: 448.0, "the loud feature itself"),
    (0, lambda s, q: "about one", "as a number"),
])
def test_question_2_names_the_slip(which, wrong, words):
    answers = list(_true_scales_by_hand())
    answers[which] = wrong(*answers)
    with pytest.raises(CheckFailed, match=words):
        check_scaling_answers(*answers)


def test_question_2_names_the_unscaled_quiet_value():
    spread, _ = _true_scales_by_hand()
    loud, keep = quant_probes.experiment_token_sets()["loud channel"]
    with pytest.raises(CheckFailed, match="before scaling"):
        check_scaling_answers(spread, float(loud[keep].abs().max()))


def test_answers_are_judged():
    check_spike_answer(16)
    check_spike_answer("16")
    for wrong in (15, 17, None, "sixteen"):
        with pytest.raises(CheckFailed):
            check_spike_answer(wrong)
    check_scaling_answers(*_true_scales_by_hand())
    with pytest.raises(CheckFailed, match="give ANSWER_RMS_SCALE_SPREAD as a number"):
        check_scaling_answers(None, _true_scales_by_hand()[1])


# ------------------------------------------------------------ every seed

SUBJECTS = {
    "quant_per_token": (unusual_per_token, quant_probes._call_per_token),
    "quant_delayed_scaler": (UnusualScaler, quant_probes._call_delayed_scaler),
    "quant_delayed_saturation": (CorrectScaler, quant_probes._call_delayed_scaler),
}
MISTAKES = {
    "quant_per_token": whole_tensor_scale,
    "quant_delayed_scaler": JustInTime,
    "quant_delayed_saturation": NoClamp,
}


def _verdict(name, subject, probe, seed):
    cases = _registry.make_cases(name, seed)
    outputs, errors = _runner._probe_all(subject, cases, probe)
    return _registry.judge(name, cases, outputs, errors)


@pytest.mark.parametrize("name", sorted(SUBJECTS))
def test_checks_pass_right_code_and_fail_mistakes_for_any_seed(name):
    subject, probe = SUBJECTS[name]
    for seed in range(6):
        assert _verdict(name, subject, probe, seed)["passed"], seed
        assert not _verdict(name, MISTAKES[name], probe, seed)["passed"], seed


def test_every_quant_check_is_covered_here():
    names = {n for n in _registry.check_names() if n.startswith("quant_")}
    assert names == set(SUBJECTS) | {"quant_scaling_table",
                                     "quant_spike_answer", "quant_scaling_answers",
                                     # test_quant_scaling.py covers these
                                     "quant_per_channel", "quant_mx_blocks",
                                     "quant_mx_matmul",
                                     "quant_smoothquant_fold", "quant_matmul_errors",
                                     "quant_loud_token_errors",
                                     "quant_loud_token_answers",
                                     "quant_best_scheme_loud_channel",
                                     "quant_best_scheme_loud_token",
                                     "quant_best_scheme_rms_offset",
                                     "quant_offset_answer", "quant_zero_point",
                                     "quant_mx_last_exact_k", "quant_mx_first_zero_k",
                                     "quant_factor_out", "quant_per_channel_matmul",
                                     "quant_mx_clipped_fraction", "quant_mx_rule_errors",
                                     # test_quant_beta.py covers these
                                     "quant_beta_table", "quant_beta_loses_more",
                                     "quant_beta_why", "quant_beta_folded_error",
                                     "quant_spread_fold_errors",
                                     # test_quant_fp4.py covers these
                                     "quant_mxfp4", "quant_offset_bracket"}


# Unit 06's checks (fp8 scaling), pinned down to the verdict and the sentence a
# student reads.

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
E4M3_NAME, E5M2_NAME = np.array("float8_e4m3fn"), np.array("float8_e5m2")


class KnownDraws:
    """A stand-in for numpy's Generator whose draws are known: normal() is one
    standard deviation above the mean everywhere, uniform() runs evenly from
    low to high. The cases made from it show what each case is built of."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + scale * np.ones(size)

    def uniform(self, low=0.0, high=1.0, size=None):
        return np.linspace(low, high, int(np.prod(size))).reshape(size)


class TwiceDraws(KnownDraws):
    """Like KnownDraws, but normal() is two standard deviations above the mean:
    a case that divides by the draws instead of multiplying shows up."""

    def normal(self, loc=0.0, scale=1.0, size=None):
        return loc + 2.0 * scale * np.ones(size)


def _fp8_values(dtype):
    values = torch.arange(256, dtype=torch.uint8).view(dtype).double().numpy()
    return np.unique(values[np.isfinite(values)])


def _per_token_case(x, dtype=E4M3_NAME):
    return {"x": np.asarray(x, np.float32), "dtype": dtype}


def _per_token_ref(x, dtype=E4M3):
    return quant.per_token_round_trip(torch.from_numpy(np.asarray(x, np.float32)), dtype).numpy()


def _same(*args):
    return bool(quant_judges._same_rounding(*args))


def _out(y):
    return {"y": np.asarray(y), "dtype": np.array("torch.float32")}


# ------------------------------------------------------------ helpers of the judges

def test_listed_shows_three_significant_digits_comma_separated():
    """A list in the feedback ("[1.23, 2, 0.000123]") that drops entries or digits misleads."""
    assert quant_judges._listed(np.array([[1.23456, 2.0], [0.000123456, -7e5]])) == (
        "[1.23, 2, 0.000123, -7e+05]")
    assert quant_judges._listed([]) == "[]"


def test_f32_makes_float32_arrays():
    """The exercise's contract is float32 tokens: a case made in float64 tests something else."""
    made = quant_judges._f32([1.0, 2.5])
    assert made.dtype == np.float32 and made.tolist() == [1.0, 2.5]


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_fp8_step_is_the_gap_to_the_next_fp8_value(dtype):
    """The judge forgives one fp8 step; a wrong step forgives too much or too little.
    The gap is read off the format's 256 bit patterns, in x's units (value * scale
    on the grid, divided back by scale)."""
    grid = _fp8_values(dtype)
    for value, scale in [(1.3, 1.0), (3.0, 2.0), (-0.7, 16.0), (300.0, 0.5), (5e-4, 1.0)]:
        q = abs(value) * scale
        below, above = grid[grid <= q].max(), grid[grid > q].min()
        step = quant_judges._fp8_step(np.array([value]), scale, dtype)
        assert step == pytest.approx([(above - below) / scale], rel=1e-12), (value, scale)
    info = torch.finfo(dtype)
    assert quant_judges._fp8_step(np.array([0.0]), 1.0, dtype) == pytest.approx(
        [info.tiny * info.eps], rel=1e-12), "zero gets the step of the smallest normal"


def test_fp8_step_broadcasts_one_scale_per_token():
    """One scale per token (rows): each row's steps are in its own units."""
    grid = _fp8_values(E4M3)
    values = np.array([[1.3, 0.2], [1.3, 0.2]])
    scales = np.array([[1.0], [40.0]])
    expected = [[(grid[grid > v * s].min() - grid[grid <= v * s].max()) / s for v in row]
                for row, s in zip(values, scales[:, 0])]
    np.testing.assert_allclose(quant_judges._fp8_step(values, scales, E4M3), expected,
                               rtol=1e-12)


def test_same_rounding_accepts_float32_noise_and_one_step_in_a_hundred():
    """A result off by one fp8 step in a few elements (a rounding tie tipped by a
    scale computed another way) is right; more, or further, is not."""
    ref = np.linspace(1.0, 2.0, 200)  # e4m3 step at scale 1: 0.125
    same = _same
    assert same(ref.copy(), ref, 1.0, E4M3) is True
    assert same(ref * (1 + 5e-6), ref, 1.0, E4M3) is True, "float32 noise"
    for n_off, expected in [(1, True), (3, True), (4, False)]:  # 200 elements: at most 3
        y = ref.copy()
        y[:n_off] += 0.125
        assert same(y, ref, 1.0, E4M3) is expected, n_off
    y = ref.copy()
    y[5] += 0.19  # one and a half steps
    assert same(y, ref, 1.0, E4M3) is False
    y = ref.copy()
    y[5] *= 1.001  # off, but less than a step
    assert same(y, ref, 1.0, E4M3) is True


def test_same_rounding_counts_a_hundredth_of_the_elements():
    """At 100 elements two may sit one step away (1 + 100 // 100), not three."""
    ref = np.linspace(1.0, 2.0, 100)
    y = ref.copy()
    y[:2] += 0.125
    assert _same(y, ref, 1.0, E4M3) is True
    y[2] += 0.125
    assert _same(y, ref, 1.0, E4M3) is False
    one = np.array([1.0])
    assert _same(one + 0.125, one, 1.0, E4M3) is True
    assert _same(np.array([1.0, 1.125]), np.array([1.125, 1.0]),
                                       1.0, E4M3) is False


def test_same_rounding_step_edge_and_tiny_differences():
    """Exactly at the step (1.001 of it) is accepted, just past it is not; and
    differences of 1e-10 around exact zeros count as off (atol 1e-12)."""
    info = torch.finfo(E4M3)
    step0 = info.tiny * info.eps
    ref = np.array([0.0])
    assert _same(np.array([1.001 * step0]), ref, 1.0, E4M3) is True
    assert _same(np.array([1.002 * step0]), ref, 1.0, E4M3) is False
    zeros = np.zeros(3)
    assert _same(zeros + 1e-10, zeros, 1.0, E4M3) is False
    assert _same(zeros + 1e-13, zeros, 1.0, E4M3) is True


def test_same_rounding_measures_float32_results_in_float64():
    """atol 1e-12 applies to the values themselves: a float32 result 1.00000003e-12
    from a float32 reference is off, though float32 arithmetic would round the
    tolerance up to meet it (two such elements of two are too many)."""
    ref = np.full(2, 1e-14, np.float32)
    y = np.full(2, np.nextafter(np.float32(1e-14 + 1e-12), np.float32(1)), np.float32)
    assert float(y[0]) - float(ref[0]) > 1e-12 + 1e-5 * float(ref[0])
    assert _same(y, ref, 1.0, E4M3) is False
    assert _same(y.astype(np.float64), ref, 1.0, E4M3) is False


def test_same_rounding_refuses_other_shapes_and_non_finite_values():
    ref = np.ones(3)
    assert _same(np.ones(2), ref, 1.0, E4M3) is False
    assert _same(np.ones((3, 1)), ref, 1.0, E4M3) is False
    assert _same(np.array([1.0, np.nan, 1.0]), ref, 1.0, E4M3) is False
    assert _same(np.array([1.0, np.inf, 1.0]), ref, 1.0, E4M3) is False


def test_row_scales_map_each_token_amax_onto_fmax_and_zeros_onto_one():
    x = np.array([[1.0, -2.0], [0.0, 0.0], [0.5, 0.25]], np.float32)
    np.testing.assert_array_equal(quant_judges._row_scales(x, E4M3), [[224.0], [1.0], [896.0]])
    np.testing.assert_array_equal(quant_judges._row_scales(x[:1], E5M2), [[28672.0]])


def test_row_scales_of_a_zero_token_raise_no_warning():
    """In-process (nbgrader validate, the tests) a numpy warning from the judge
    would be printed under the student's check: no division by zero is made."""
    x = np.array([[0.0, 0.0], [1.0, -4.0]], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scales = quant_judges._row_scales(x, E4M3)
    np.testing.assert_array_equal(scales, [[1.0], [112.0]])


# ------------------------------------------------------------ per-token: cases

def test_per_token_cases_are_what_their_labels_say():
    """Each label describes its case; a case that lost its zero token or its
    loud token no longer tests what the feedback says it does."""
    cases = quant_judges._per_token_cases(KnownDraws())
    assert [label for label, _ in cases] == [
        "x = [[0.5, -1, 3, 7], [0.01, 0.02, -0.04, 0]], e4m3",
        "N(0, 1) tokens, shape (32, 64), e4m3",
        "tokens whose sizes range from 0.001 to 1000, shape (32, 64), e4m3",
        "token 3 is 10^4 times louder, shape (16, 64), e4m3",
        "token 2 is all zeros, shape (6, 16), e4m3",
        "a 3-D batch (2, 3, 16) of tokens of different sizes, e5m2",
        "one token, shape (64,), e5m2",
        "tokens whose entries range from 0.01 to 10^6 within each token, shape (8, 32), "
        "e5m2",
    ]
    xs = [case["x"] for _, case in cases]
    assert [str(case["dtype"]) for _, case in cases] == ["float8_e4m3fn"] * 5 + ["float8_e5m2"] * 3
    assert all(x.dtype == np.float32 for x in xs)
    assert [x.shape for x in xs] == [(2, 4), (32, 64), (32, 64), (16, 64), (6, 16),
                                     (2, 3, 16), (64,), (8, 32)]
    np.testing.assert_array_equal(xs[0], np.array([[0.5, -1, 3, 7], [0.01, 0.02, -0.04, 0]],
                                                  np.float32))
    np.testing.assert_array_equal(xs[1], np.ones((32, 64)))
    np.testing.assert_allclose(xs[2][:, 0], np.logspace(-3, 3, 32), rtol=1e-6)
    assert np.all(xs[2] == xs[2][:, :1])
    loud = np.ones((16, 64))
    loud[3] = 1e4
    np.testing.assert_array_equal(xs[3], loud)
    zero = np.ones((6, 16))
    zero[2] = 0
    np.testing.assert_array_equal(xs[4], zero)
    np.testing.assert_allclose(xs[5], np.logspace(-2, 2, 6).reshape(2, 3, 1) * np.ones(16),
                               rtol=1e-6)
    np.testing.assert_array_equal(xs[6], np.full(64, 3.0))
    # 10^8 within each token: scaled onto 448 in e5m2, the small entries are lost
    np.testing.assert_allclose(xs[7].ravel(), np.logspace(-2, 6, 256), rtol=1e-6)


def test_per_token_cases_multiply_the_draws_by_the_token_sizes():
    """With draws of 2, the tokens of sizes 0.001 to 1000 are 2 * size, not size / 2."""
    cases = quant_judges._per_token_cases(TwiceDraws())
    sized = cases[2][1]["x"]
    np.testing.assert_allclose(sized[:, 0], 2.0 * np.logspace(-3, 3, 32), rtol=1e-6)
    assert np.all(sized == sized[:, :1])


def test_per_token_loud_token_is_a_louder_normal_token():
    """Token 3 is the other tokens' kind of noise, 10^4 times larger: not a constant."""
    cases = quant_judges._per_token_cases(np.random.default_rng(0))
    loud = cases[3][1]["x"]
    assert np.unique(loud[3]).size == 64
    ratio = np.abs(loud[3]).mean() / np.abs(np.delete(loud, 3, axis=0)).mean()
    assert 5e3 < ratio < 2e4


# ------------------------------------------------------------ per-token: verdicts

SMALL = quant_judges.SMALL_EXAMPLE


def test_per_token_right_answers_pass():
    """The reference, and a result one fp8 step off in one element of 2048, pass."""
    assert _judge_per_token(_per_token_case(SMALL), _out(_per_token_ref(SMALL))) is None
    x = np.linspace(0.5, 1.0, 32 * 64, dtype=np.float32).reshape(32, 64) * np.float32(1.3)
    ref = _per_token_ref(x)
    y = ref.copy()
    y[5, 7] += float(quant_judges._fp8_step(ref[5, 7], quant_judges._row_scales(x, E4M3)[5],
                                            E4M3)[0])
    assert mismatch(y, ref, dtype="float32") is not None
    assert _judge_per_token(_per_token_case(x), _out(y)) is None


def test_per_token_float32_noise_passes():
    """y within float32's tolerance (rtol 1e-4) of the reference passes, though it
    is not the same rounding everywhere."""
    ref = _per_token_ref(SMALL)
    assert _judge_per_token(_per_token_case(SMALL), _out(ref * (1 + 5e-5))) is None


def test_per_token_float8_result_is_named():
    """A float8 tensor returned as is gets the sentence about casting back."""
    output = {"y": _per_token_ref(SMALL), "dtype": np.array("torch.float8_e4m3fn")}
    assert _judge_per_token(_per_token_case(SMALL), output) == (
        "your result is a float8 tensor; cast it back with .float() and unscale in float32 "
        "(fp8 stores numbers here, it does not compute)")


def test_per_token_wrong_shape_and_non_numbers_get_the_comparison_only():
    """A result of text (a list of strings survives the trip as an array of str)
    is told so; it used to crash the judge, which the grader reports as a
    malformed request instead of the student's mistake."""
    y = _per_token_ref(SMALL)[:, :3]
    assert _judge_per_token(_per_token_case(SMALL), _out(y)) == (
        "your result has shape (2, 3); expected shape (2, 4)")
    assert _judge_per_token(_per_token_case(SMALL), _out(np.full((2, 4), "a"))) == (
        "your result holds <U1 values, not numbers")


def test_per_token_nan_for_a_zero_token_is_explained():
    """amax 0 for a token of zeros: the hint says to give it scale 1."""
    x = np.array([[1.0, 2.0], [0.0, 0.0]], np.float32)
    y = _per_token_ref(x)
    y[1] = np.nan
    assert _judge_per_token(_per_token_case(x), _out(y)) == (
        mismatch(y, _per_token_ref(x), dtype="float32")
        + ". A token of zeros has amax 0: give it a scale of 1 instead of dividing by zero")


def test_per_token_inf_without_a_zero_token_asks_for_the_clamp():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    y = _per_token_ref(x)
    y[0, 1] = np.inf
    assert _judge_per_token(_per_token_case(x), _out(y)) == (
        mismatch(y, _per_token_ref(x), dtype="float32")
        + ". Clamp the scaled values to [-fmax, fmax] before the cast")


def test_per_token_inf_for_a_single_token_asks_for_the_clamp():
    """A case of one token (shape (64,) in the check) has only the last axis."""
    one = np.array([1.0, -3.0, 0.25, 2.0], np.float32)
    ref = _per_token_ref(one, E5M2)
    y = ref.copy()
    y[1] = np.inf
    assert _judge_per_token(_per_token_case(one, E5M2_NAME), _out(y)) == (
        mismatch(y, ref, dtype="float32")
        + ". Clamp the scaled values to [-fmax, fmax] before the cast")


def test_per_token_whole_tensor_scale_is_named():
    y = quant.fp8_round_trip(torch.from_numpy(SMALL.copy()), E4M3).numpy()
    assert _judge_per_token(_per_token_case(SMALL), _out(y)) == (
        mismatch(y, _per_token_ref(SMALL), dtype="float32")
        + ". Hint: this is one scale for the whole tensor; each token (row, the last axis) "
        "needs its own amax and scale")


def test_per_token_scaled_values_are_named():
    y = _per_token_ref(SMALL) * np.array([[448 / 7], [448 / 0.04]])
    assert _judge_per_token(_per_token_case(SMALL), _out(y)) == (
        mismatch(y, _per_token_ref(SMALL), dtype="float32")
        + ". Hint: you returned the scaled values: divide by each token's scale after "
        "casting back")


def test_per_token_scale_per_feature_is_named():
    x = np.array([[1.0, 300.0, 2.0], [0.003, 5.0, 7.0], [2.0, 0.1, 0.5]], np.float32)
    fmax = 448.0
    amax = np.abs(x).max(axis=0, keepdims=True)
    scale = torch.from_numpy((fmax / amax).astype(np.float32))
    y = ((torch.from_numpy(x) * scale).clamp(-fmax, fmax).to(E4M3).float() / scale).numpy()
    message = _judge_per_token(_per_token_case(x), _out(y))
    assert message == (mismatch(y, _per_token_ref(x), dtype="float32")
                       + ". Hint: the amax was taken over tokens (a scale per feature); take "
                       "it over the last axis, within each token")


PER_FEATURE_HINT = (". Hint: the amax was taken over tokens (a scale per feature); take it "
                    "over the last axis, within each token")


def _per_feature_round_trip(x, dtype=E4M3):
    """The mistake by hand: amax over the tokens (axis -2), scale 1 for a zero column."""
    fmax = quant.fp8_max(dtype)
    amax = np.abs(x).max(axis=-2, keepdims=True)
    scale = torch.from_numpy(np.where(amax > 0, fmax / np.where(amax > 0, amax, 1),
                                      1.0).astype(np.float32))
    return ((torch.from_numpy(x) * scale).clamp(-fmax, fmax).to(dtype).float() / scale).numpy()


QUIET_AND_ZERO_COLUMNS = np.array([[1.0, 300.0, 0.0, 0.2], [0.003, 5.0, 0.0, -0.7],
                                   [2.0, 0.1, 0.0, 0.05]], np.float32)


def test_per_token_scale_per_feature_is_named_with_quiet_and_zero_features():
    """Feature 3 peaks at 0.7 (scale 448 / 0.7, not 1 or 448) and feature 2 is all
    zeros (scale 1): the hint still comes, and without a numpy warning, which
    in-process would be printed under the check."""
    x = QUIET_AND_ZERO_COLUMNS
    y = _per_feature_round_trip(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = _judge_per_token(_per_token_case(x), _out(y))
    assert message == mismatch(y, _per_token_ref(x), dtype="float32") + PER_FEATURE_HINT


def test_per_token_scale_per_feature_is_named_when_float32_rounding_decides():
    """The candidate is computed as the student's code does, in float32: x = 27 * 3 / 448
    times the scale 448 / 3 is 26.999998 in float32 (e4m3: 26), but 26.9999994 in
    float64, which the cast rounds through float32 onto the tie 27 (e4m3: 28). In
    float64 two of the six values would be a step off, and the hint lost."""
    x = np.array([[3.0, 100.0], [27 * 3 / 448, 50.0], [27 * 3 / 448, -20.0]], np.float32)
    y = _per_feature_round_trip(x)
    np.testing.assert_array_equal(y[1:, 0] * np.float32(448 / 3), [26.0, 26.0])
    assert _judge_per_token(_per_token_case(x), _out(y)) == (
        mismatch(y, _per_token_ref(x), dtype="float32") + PER_FEATURE_HINT)


def test_per_token_scale_per_feature_is_named_for_a_batch_of_tokens():
    """In a (2, 3, 4) batch the per-feature amax is over the 3 tokens of each example."""
    x = np.stack([QUIET_AND_ZERO_COLUMNS, 3 * QUIET_AND_ZERO_COLUMNS[::-1]])
    y = _per_feature_round_trip(x, E5M2)
    assert _judge_per_token(_per_token_case(x, E5M2_NAME), _out(y)) == (
        mismatch(y, _per_token_ref(x, E5M2), dtype="float32") + PER_FEATURE_HINT)


def test_per_token_other_mistakes_get_no_hint():
    """A hint that names a mistake the student did not make would mislead."""
    y = _per_token_ref(SMALL) * 1.5
    assert _judge_per_token(_per_token_case(SMALL), _out(y)) == mismatch(
        y, _per_token_ref(SMALL), dtype="float32")
    one = np.array([1.0, -3.0, 0.25, 2.0], np.float32)
    y = _per_token_ref(one) + 0.5
    assert _judge_per_token(_per_token_case(one, E5M2_NAME), _out(y)) == mismatch(
        y, _per_token_ref(one, E5M2), dtype="float32")


def test_per_token_mistake_never_names_a_candidate_that_is_the_reference():
    """For one token the whole-tensor scale is the per-token one: no hint for it."""
    one = np.array([0.3, -3.0, 0.25, 2.0], np.float32)
    ref = _per_token_ref(one)
    scale = quant_judges._row_scales(one, E4M3)
    assert quant_judges._per_token_mistake(one, E4M3, ref.astype(np.float64), ref, scale) is None


# ------------------------------------------------------------ delayed: cases

def test_stream_is_one_tensor_per_size_float32():
    made = quant_judges._stream(KnownDraws(), 3, (2, 2), [0.5, 2.0, 4.0, 8.0])
    assert made.dtype == np.float32
    np.testing.assert_array_equal(made, np.array([0.5, 2.0, 4.0])[:, None, None] * np.ones(
        (3, 2, 2)))

    twice = quant_judges._stream(TwiceDraws(), 2, (2,), [0.5, 4.0])
    np.testing.assert_array_equal(twice, [[1.0, 1.0], [8.0, 8.0]])


def test_delayed_cases_are_what_their_labels_say():
    cases = quant_judges._delayed_cases(KnownDraws())
    assert [label for label, _ in cases] == [
        "e4m3, history_len = 4, ten tensors whose size grows, then shrinks",
        "e4m3, history_len = 16, a spike of 50 at call 4 of 24",
        "e4m3, history_len = 1 (only the previous tensor counts)",
        "e5m2, history_len = 3, sizes shrinking from 64 to 1/16",
        "e4m3, history_len = 2, the first two tensors all zeros",
    ]
    assert [str(c["dtype"]) for _, c in cases] == ["float8_e4m3fn"] * 3 + ["float8_e5m2",
                                                                           "float8_e4m3fn"]
    assert [int(c["history_len"]) for _, c in cases] == [4, 16, 1, 3, 2]
    sizes = [c["stream"].reshape(len(c["stream"]), -1)[:, 0].tolist() for _, c in cases]
    assert [c["stream"].shape for _, c in cases] == [(10, 8, 16), (24, 4, 32), (10, 8, 16),
                                                     (6, 4, 8), (6, 4, 8)]
    assert sizes[0] == [0.5, 1, 2, 4, 8, 4, 2, 1, 0.5, 0.25] == sizes[2]
    assert sizes[1] == [1.0] * 3 + [50.0] + [1.0] * 20
    assert sizes[3] == [64.0, 16.0, 4.0, 1.0, 0.25, 0.0625]
    assert sizes[4] == [0.0, 0.0, 3.0, 1.0, 1.0, 2.0]


def test_saturation_cases_are_what_their_labels_say():
    cases = quant_judges._saturation_cases(KnownDraws())
    assert [label for label, _ in cases] == [
        "e5m2, history_len = 4, a spike 1000 times larger at call 6 of 8",
        "e5m2, history_len = 2, the first tensor reaches 10^5 (scale 1, fmax 57344)",
        "e4m3, history_len = 3, a spike 100 times larger at call 4 of 6",
    ]
    assert [str(c["dtype"]) for _, c in cases] == ["float8_e5m2", "float8_e5m2",
                                                   "float8_e4m3fn"]
    assert [int(c["history_len"]) for _, c in cases] == [4, 2, 3]
    assert [c["stream"].shape for _, c in cases] == [(8, 8, 16), (3, 4), (6, 8, 16)]
    assert cases[0][1]["stream"][:, 0, 0].tolist() == [1.0] * 5 + [1000.0] + [1.0] * 2
    assert cases[2][1]["stream"][:, 0, 0].tolist() == [1.0] * 3 + [100.0] + [1.0] * 2
    np.testing.assert_array_equal(cases[1][1]["stream"], [[1.0, 1e5, -1e5, 7e4],
                                                          [1.0, 2.0, -3.0, 4.0],
                                                          [1e5, -2.0, 5.0, 0.5]])
    assert cases[1][1]["stream"].dtype == np.float32


def test_histories_are_the_last_history_len_amaxes():
    case = {"stream": np.array([[1.0, -2.0], [4.0, 0.0], [0.5, 0.5], [-3.0, 1.0]]),
            "history_len": np.array(2)}
    assert quant_judges._histories(case) == [[2.0], [2.0, 4.0], [4.0, 0.5], [0.5, 3.0]]
    case["history_len"] = np.array(1)
    assert quant_judges._histories(case) == [[2.0], [4.0], [0.5], [3.0]]


# ------------------------------------------------------------ delayed: verdicts

def _delayed_case(stream=((1.0, -2.0), (4.0, 0.0), (0.5, 0.5)), history_len=2,
                  dtype=E4M3_NAME):
    return {"stream": np.asarray(stream, np.float32), "dtype": dtype,
            "history_len": np.array(history_len)}


def _delayed_right(case):
    outputs, _, after, lengths, history = quant_judges._reference_delayed(case)
    return {"y": outputs, "scales": after, "lengths": lengths, "history": history}


def test_reference_delayed_by_hand():
    """Scale 1 first; after [1, -2] it is 448 / 2; after [4, 0], 448 / 4, which
    the call with [4, 0] did not use: 4 * 224 saturates at 448, so y = 2."""
    outputs, used, after, lengths, history = quant_judges._reference_delayed(_delayed_case())
    np.testing.assert_array_equal(outputs, [[1.0, -2.0], [2.0, 0.0], [0.5, 0.5]])
    np.testing.assert_array_equal(used, [1.0, 224.0, 112.0])
    np.testing.assert_array_equal(after, [224.0, 112.0, 112.0])
    np.testing.assert_array_equal(lengths, [1, 2, 2])
    np.testing.assert_array_equal(history, [4.0, 0.5])


def test_delayed_right_answers_pass():
    case = _delayed_case()
    assert _judge_delayed(case, _delayed_right(case)) is None


def test_delayed_float8_result_is_named():
    assert _judge_delayed(_delayed_case(), {"dtype": np.array("torch.float8_e5m2")}) == (
        "your scaler returns a float8 tensor; cast it back with .float() and unscale in "
        "float32")


@pytest.mark.parametrize("lengths, hint", [
    ([1, 2, 3], ". Hint: the history holds 3 amaxes, one too many: keep the last "
                "history_len = 2"),
    ([1, 1, 1], ". Hint: the history holds 1 amaxes, one too few: keep the last "
                "history_len = 2"),
    ([1, 2, 4], ""),
    ([], ""),
])
def test_delayed_history_length_is_named(lengths, hint):
    case = _delayed_case()
    output = {**_delayed_right(case), "lengths": np.array(lengths, int)}
    assert _judge_delayed(case, output) == (
        f"after each call your history has {quant_judges._listed(lengths)} entries; "
        f"expected [1, 2, 2]{hint}")


def test_delayed_empty_history_of_length_one_is_one_too_few():
    """history_len = 1 and nothing kept: 0 amaxes, one too few."""
    case = _delayed_case(history_len=1)
    output = {**_delayed_right(case), "lengths": np.array([0, 0, 0])}
    assert _judge_delayed(case, output) == (
        "after each call your history has [0, 0, 0] entries; expected [1, 1, 1]. Hint: the "
        "history holds 0 amaxes, one too few: keep the last history_len = 1")


@pytest.mark.parametrize("history", [[0.5, 4.0], [4.0, 0.55], [4.0 * (1 + 3e-6), 0.5], [],
                                     [4.0, 0.5, 0.5]])
def test_delayed_wrong_history_is_shown(history):
    """The amaxes are exact: a history in another order, another value, or of
    another length is refused (the lengths reported may still be right)."""
    case = _delayed_case()
    output = {**_delayed_right(case), "history": np.array(history)}
    assert _judge_delayed(case, output) == (
        f"after the last call your history is {quant_judges._listed(history)}; expected the "
        "amaxes of the last 2 tensors, oldest first: [4, 0.5]")


def test_delayed_history_of_one_repeated_amax_must_still_be_complete():
    case = _delayed_case(stream=((2.0, 1.0), (-2.0, 0.0)))
    output = {**_delayed_right(case), "history": np.array([2.0])}
    assert _judge_delayed(case, output) == (
        "after the last call your history is [2]; expected the amaxes of the last 2 tensors, "
        "oldest first: [2, 2]")


def test_delayed_wrong_scales_are_shown():
    case = _delayed_case()
    output = {**_delayed_right(case), "scales": np.array([224.0, 112.0, 112.0 * 1.001])}
    assert _judge_delayed(case, output) == (
        "your scale after each call is [224, 112, 112]; expected [224, 112, 112]")
    output["scales"] = np.array([224.0, 112.0, 112.0 * (1 + 2e-5)])
    assert _judge_delayed(case, output) is not None
    output["scales"] = np.array([224.0, 112.0, 112.0 * (1 + 5e-6)])
    assert _judge_delayed(case, output) is None


def test_delayed_mean_of_history_is_named():
    """Means of the amaxes [2], [2, 4], [4, 0.5]: 448 / 2, 448 / 3, 448 / 2.25."""
    case = _delayed_case()
    output = {**_delayed_right(case), "scales": np.array([224.0, 448 / 3, 448 / 2.25])}
    assert _judge_delayed(case, output) == (
        "your scale after each call is [224, 149, 199]; expected [224, 112, 112]. Hint: use "
        "the largest amax in the history, not the mean")


def test_delayed_mean_of_history_is_named_when_the_first_tensors_are_zeros():
    """A history of zeros keeps scale 1, for the mean as for the max."""
    case = _delayed_case(stream=((0.0, 0.0), (0.0, 0.0), (2.0, -1.0), (4.0, 1.0)))
    means = [1.0, 1.0, 448 / 1.0, 448 / 3.0]
    output = {**_delayed_right(case), "scales": np.array(means)}
    message = _judge_delayed(case, output)
    assert message.endswith(". Hint: use the largest amax in the history, not the mean")


def test_delayed_outputs_of_another_shape_are_named():
    case = _delayed_case()
    output = {**_delayed_right(case)}
    output["y"] = output["y"][:2]
    assert _judge_delayed(case, output) == "your outputs have shape (2, 2); expected (3, 2)"


def test_delayed_wrong_call_names_the_call_and_the_scale_it_used():
    case = _delayed_case(stream=[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1.0]] * 2)
    output = _delayed_right(case)
    output["y"] = output["y"].copy()
    output["y"][1] *= 1.5
    assert _judge_delayed(case, output) == (
        "call 2: from element 0 on, the round trip is [1.5, 3, 4.5, 6]...; expected "
        "[1, 2, 3, 4]..., "
        "with the scale 64 chosen before this tensor was seen")


def test_delayed_wrong_call_shows_where_it_differs_not_an_equal_prefix():
    """Only element 6 is off: the message starts there, so got and expected differ."""
    case = _delayed_case(stream=[[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1.0]] * 2)
    output = _delayed_right(case)
    output["y"] = output["y"].copy()
    output["y"][1, 6] = 8.0
    assert _judge_delayed(case, output) == (
        "call 2: from element 6 on, the round trip is [8, 1]...; expected [7, 1]..., "
        "with the scale 64 chosen before this tensor was seen")


def test_delayed_overflow_asks_for_the_clamp():
    case = _delayed_case()
    output = _delayed_right(case)
    output["y"] = output["y"].copy()
    output["y"][1, 0] = np.inf
    assert _judge_delayed(case, output) == (
        "call 2: from element 0 on, the round trip is [inf, 0]...; expected [2, 0]..., with the "
        "scale 224 chosen "
        "before this tensor was seen. Hint: values beyond the remembered amax overflow; clamp "
        "the scaled values to [-fmax, fmax] before the cast, so they saturate")


def test_delayed_current_scaling_is_named():
    """Each tensor scaled by its own amax: the call with [4, 0] gives [4, 0]."""
    case = _delayed_case()
    output = _delayed_right(case)
    output["y"] = np.array([[1.0, -2.0], [4.0, 0.0], [0.5, 0.5]])
    assert _judge_delayed(case, output) == (
        "call 2: from element 0 on, the round trip is [4, 0]...; expected [2, 0]..., with the "
        "scale 224 chosen "
        "before this tensor was seen. Hint: this is scaled by the tensor's own amax; delayed "
        "scaling uses the scale from the history of earlier calls, then records this "
        "tensor's amax")


def test_delayed_current_scaling_is_named_for_tensors_of_several_rows():
    """The tensor's own amax is over all of it, not row by row."""
    stream = [[[1.0, 2.0], [1.0, 0.5]], [[300.0, 1.0], [0.3, 7.0]]]  # call 1: exact both ways
    case = _delayed_case(stream=stream, dtype=E5M2_NAME)
    output = _delayed_right(case)
    own = [quant.fp8_round_trip(torch.tensor(x), E5M2).numpy() for x in stream]
    output["y"] = np.stack(own)
    message = _judge_delayed(case, output)
    assert message.startswith("call 2: ") and message.endswith(
        "then records this tensor's amax")


def test_delayed_current_scaling_is_named_for_tensors_of_odd_size():
    """Three values a call: the tensor's own amax is that of all three."""
    case = _delayed_case(stream=((1.0, -2.0, 0.5), (4.0, 0.0, 1.0), (0.5, 0.5, 0.25)))
    output = _delayed_right(case)
    output["y"] = np.array([[1.0, -2.0, 0.5], [4.0, 0.0, 1.0], [0.5, 0.5, 0.25]])
    assert _judge_delayed(case, output) == (
        "call 2: from element 0 on, the round trip is [4, 0, 1]...; expected [2, 0, 1]..., "
        "with the scale 224 "
        "chosen before this tensor was seen. Hint: this is scaled by the tensor's own amax; "
        "delayed scaling uses the scale from the history of earlier calls, then records this "
        "tensor's amax")


def test_delayed_other_mistakes_get_no_hint():
    case = _delayed_case()
    output = _delayed_right(case)
    output["y"] = np.array([[1.0, -2.0], [3.0, 0.0], [0.5, 0.5]])
    assert _judge_delayed(case, output) == (
        "call 2: from element 0 on, the round trip is [3, 0]...; expected [2, 0]..., with the "
        "scale 224 chosen "
        "before this tensor was seen")


# ------------------------------------------------------------ predictions, spike, answers

def test_spike_answer_is_the_number_of_calls():
    assert quant.steps_scaled_by_spike(16) == 16
    for right in ("16", " 16 ", "16.0"):
        assert _judge_spike({}, {"steps": np.array(right)}) is None
    assert _judge_spike({}, {"steps": np.array("15")}) == (
        "not yet right: you answered 15. Count the calls after the spike whose scale still "
        "comes from it, with history_len = 16")
    assert _judge_spike({}, {"steps": np.array("17")}) is not None
    assert _judge_spike({}, {"steps": np.array("sixteen")}) == (
        "give the number of calls as a number (you gave 'sixteen')")
    assert _judge_spike({}, {}) == "give the number of calls as a number (you gave 'None')"


# ------------------------------------------------------------ the table (issue: tolerance)

def _measured():
    return quant_judges._reference_table().copy()


def test_table_that_is_the_measurement_passes():
    measured = _measured()
    assert _judge_table({}, {"table": measured * (1 + 5e-4), "measured": measured}) is None


def test_table_five_percent_off_the_measurement_is_refused():
    """The issue's bug: with the table's tolerance loosened from 1e-3 to 1e-1,
    figures 5% off what the student's own functions measure would pass."""
    measured = _measured()
    table = measured * 1.05
    assert _judge_table({}, {"table": table, "measured": measured}) == (
        f"your table says {quant_judges._listed(table[:, 0])} (per-tensor) and "
        f"{quant_judges._listed(table[:, 1])} (per-token), but your functions measure "
        f"{quant_judges._listed(measured[:, 0])} and {quant_judges._listed(measured[:, 1])} "
        "on those batches (error over the kept entries only): fill the table from your "
        "measurement, do not type the figures in")
    table = measured.copy()
    table[3, 1] *= 1.002
    assert _judge_table({}, {"table": table, "measured": measured}) is not None


def test_table_rows_the_wrong_way_round_are_named():
    measured = _measured()
    assert _judge_table({}, {"table": measured[:, ::-1], "measured": measured}) == (
        "each row is the wrong way round: (per-tensor error, per-token error)")

    table = measured[:, ::-1] * (1 + 5e-4)  # within the table's rtol 1e-3 of the measurement
    assert _judge_table({}, {"table": table, "measured": measured}) == (
        "each row is the wrong way round: (per-tensor error, per-token error)")


def test_table_measured_with_a_wrong_per_token_function_earns_the_table():
    """A table that faithfully measures the student's own per-token function
    passes, however wrong that function is: its mistake costs exercise 1's
    points, not these as well. A NaN it cannot hold is still refused."""
    reference = _measured()
    measured = reference.copy()
    measured[:, 1] = reference[:, 0]  # a "per-token" function that is per-tensor
    assert _judge_table({}, {"table": measured, "measured": measured}) is None
    measured[:, 1] = np.nan
    assert "do not type the figures in" in _judge_table(
        {}, {"table": reference, "measured": measured})



def test_table_per_tensor_column_must_be_the_lessons():
    reference = _measured()
    for factor in (1.1, 1 + 3e-6):
        measured = reference.copy()
        measured[:, 0] *= factor
        assert _judge_table({}, {"table": measured, "measured": measured}) == (
            "the lesson's per-tensor round trip gave other figures here")


# ------------------------------------------------------------ probes

def test_probe_helpers():
    """Dtype names travel as text; tensors handed to the student are copies."""
    assert quant_probes._torch_dtype(np.array("float8_e5m2")) is E5M2
    assert str(quant_probes._dtype_name(torch.zeros(1, dtype=E4M3))) == "torch.float8_e4m3fn"
    assert str(quant_probes._dtype_name([1.0])) == "list"
    case_x = np.array([1.0, 2.0], np.float32)
    t = quant_probes._tensor(case_x)
    t.mul_(3)
    assert t.tolist() == [3.0, 6.0] and case_x.tolist() == [1.0, 2.0]


def test_float8_errors_get_the_hint_and_others_pass_through():
    def fp8_add():
        raise NotImplementedError('"add_stub" not implemented for \'Float8_e4m3fn\'')

    with pytest.raises(NotImplementedError) as caught:
        quant_probes._with_float8_hint(fp8_add)
    assert str(caught.value) == (
        '"add_stub" not implemented for \'Float8_e4m3fn\' (hint: arithmetic on float8 tensors '
        "is not implemented on the CPU; cast back with .float() first, then unscale in "
        "float32)")
    for exc in (RuntimeError("shape mismatch"), ValueError("Float8 is odd")):
        def raises(exc=exc):
            raise exc

        with pytest.raises(type(exc)) as caught:
            quant_probes._with_float8_hint(raises)
        assert caught.value is exc
    assert quant_probes._with_float8_hint(lambda: 7) == 7


def test_experiment_token_sets_are_the_assignments():
    """64 tokens of 256 N(0, 1) features from seed 0; token 0 (or feature 0 of
    every token) made loud and left out of the error; RMSNorm of 20 + x."""
    sets = quant_probes.experiment_token_sets()
    assert list(sets) == ["plain", "loud token", "loud channel", "RMSNorm, mu = 20"]
    plain = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    everywhere = torch.ones(64, 256, dtype=torch.bool)
    x, keep = sets["plain"]
    assert torch.equal(x, plain) and torch.equal(keep, everywhere)
    x, keep = sets["loud token"]
    assert torch.equal(x[1:], plain[1:]) and torch.equal(x[0], plain[0] * 1e5)
    assert torch.equal(keep[1:], everywhere[1:]) and not keep[0].any()
    x, keep = sets["loud channel"]
    assert torch.equal(x[:, 1:], plain[:, 1:]) and torch.equal(x[:, 0], plain[:, 0] + 1e5)
    assert torch.equal(keep[:, 1:], everywhere[:, 1:]) and not keep[:, 0].any()
    x, keep = sets["RMSNorm, mu = 20"]
    shifted = (20 + plain).double()
    expected = shifted / (shifted.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    assert x.dtype == torch.float32 and torch.allclose(x.double(), expected, rtol=1e-6)
    assert torch.equal(x, torch.nn.functional.rms_norm(20 + plain, (256,), eps=1e-5))
    assert torch.equal(keep, everywhere)
    small = quant_probes.experiment_token_sets(n_tokens=3, d=4, seed=1)
    assert torch.equal(small["plain"][0],
                       torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))


def test_lessons_per_tensor_round_trip_is_the_references():
    for x in (torch.tensor([0.3, -7.0, 2.5, 1e-3]), torch.zeros(3),
              torch.randn(4, 8, generator=torch.Generator().manual_seed(2)) * 1e3):
        for dtype in (E4M3, E5M2):
            assert torch.equal(quant_probes.per_tensor_round_trip(x, dtype),
                               quant.fp8_round_trip(x, dtype))


def test_masked_error_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 100.0])
    x_rt = torch.tensor([1.0, 2.0, 3.0, 5.0, 0.0])
    keep = torch.tensor([True, True, True, True, False])
    assert quant_probes.masked_error(x, x_rt, keep) == pytest.approx(0.5 / np.sqrt(1.25),
                                                                     rel=1e-12)


def test_call_per_token_returns_the_result_and_its_dtype():
    case = _per_token_case(SMALL)
    result = quant_probes._call_per_token(quant.per_token_round_trip, case)
    assert torch.equal(result["y"], torch.from_numpy(_per_token_ref(SMALL)))
    assert str(result["dtype"]) == "torch.float32"

    def as_fp8(x, dtype):
        assert dtype is E4M3
        return x.to(dtype)

    assert str(quant_probes._call_per_token(as_fp8, case)["dtype"]) == "torch.float8_e4m3fn"


def test_call_delayed_scaler_reports_what_the_reference_would():
    case = _delayed_case()
    result = quant_probes._call_delayed_scaler(quant.DelayedScaler, case)
    expected = _delayed_right(case)
    assert result.keys() == expected.keys()
    for key in expected:
        np.testing.assert_array_equal(result[key], expected[key])
    assert result["y"].dtype == np.float64


class _KeywordOnlyScaler(quant.DelayedScaler):
    """A scaler whose history_len must be given by name, that returns numpy or a
    tensor that requires grad: the probe handles either."""

    def __init__(self, dtype, *, history_len, as_numpy=False):
        super().__init__(dtype, history_len)
        self.as_numpy = as_numpy

    def __call__(self, x):
        y = super().__call__(x)
        return y.numpy() if self.as_numpy else y.requires_grad_()


def test_call_delayed_scaler_takes_numpy_and_tensors_that_need_grad():
    case = _delayed_case()
    expected = _delayed_right(case)
    for as_numpy in (False, True):
        def make(dtype, history_len, as_numpy=as_numpy):
            return _KeywordOnlyScaler(dtype, history_len=history_len, as_numpy=as_numpy)

        result = quant_probes._call_delayed_scaler(make, case)
        np.testing.assert_array_equal(result["y"], expected["y"])


def test_call_delayed_scaler_stops_at_a_float8_output():
    class Fp8Scaler(quant.DelayedScaler):
        def __call__(self, x):
            return super().__call__(x).to(self.dtype)

    assert {k: str(v) for k, v in
            quant_probes._call_delayed_scaler(Fp8Scaler, _delayed_case()).items()} == {
        "dtype": "torch.float8_e4m3fn"}


def _measured_table(per_token=quant.per_token_round_trip):
    return {name: quant.scaling_errors(x, keep)
            for name, (x, keep) in quant_probes.experiment_token_sets().items()}


def test_table_probe_measures_with_the_students_function():
    table = _measured_table()
    result = quant_probes._table_probe((table, quant.per_token_round_trip), {})
    np.testing.assert_allclose(result["measured"], quant_judges._reference_table(), rtol=1e-12)
    np.testing.assert_array_equal(result["table"], [table[name] for name in
                                                    quant_probes.TOKEN_SET_NAMES])
    whole = quant_probes._table_probe((table, quant.fp8_round_trip), {})["measured"]
    np.testing.assert_allclose(whole[:, 1], whole[:, 0], rtol=1e-12)


def test_table_probe_refuses_tables_of_the_wrong_form():
    table = _measured_table()
    with pytest.raises(TypeError, match=r"^the table is list, not a dict \{name: "
                                        r"\(per-tensor error, per-token error\)\}$"):
        quant_probes._table_probe((list(table.items()), quant.per_token_round_trip), {})
    with pytest.raises(KeyError) as caught:
        quant_probes._table_probe(({"plain": table["plain"]}, quant.per_token_round_trip), {})
    assert caught.value.args[0] == (
        "the table has no row for ['loud token', 'loud channel', 'RMSNorm, mu = 20']; it "
        "needs ['plain', 'loud token', 'loud channel', 'RMSNorm, mu = 20']")
    for row in ((0.1,), (0.1, 0.2, 0.3)):
        with pytest.raises(ValueError, match=r"^each row must be a pair \(per-tensor error, "
                                             r"per-token error\)$"):
            quant_probes._table_probe(({**table, "plain": row}, quant.per_token_round_trip),
                                      {})


def test_answers_travel_as_text():
    assert {k: str(v) for k, v in quant_probes._answers_as_text({"a": 16, "b": None},
                                                                {}).items()} == {
        "a": "16", "b": "None"}


# ------------------------------------------------------------ the checks end to end

def test_every_check_function_runs_its_check():
    """Each check_* function runs the check of its name with its probe: right
    answers pass, wrong ones raise CheckFailed with the judge's sentence."""
    quant_probes.check_per_token_round_trip(quant.per_token_round_trip)
    with pytest.raises(CheckFailed, match="one scale for the whole tensor"):
        quant_probes.check_per_token_round_trip(quant.fp8_round_trip)
    quant_probes.check_delayed_scaler(quant.DelayedScaler)
    quant_probes.check_delayed_scaler_saturates(quant.DelayedScaler)

    class NoClamp(quant.DelayedScaler):
        def __call__(self, x):
            y = (x * self.scale).to(self.dtype).float() / self.scale
            super().__call__(x)
            return y

    quant_probes.check_delayed_scaler(NoClamp)
    with pytest.raises(CheckFailed, match="quant_delayed_saturation, .* clamp"):
        quant_probes.check_delayed_scaler_saturates(NoClamp)
    quant_probes.check_scaling_table(_measured_table(), quant.per_token_round_trip)
    with pytest.raises(CheckFailed, match="do not type the figures in"):
        quant_probes.check_scaling_table({k: (a * 1.05, b) for k, (a, b) in
                                          _measured_table().items()},
                                         quant.per_token_round_trip)
    quant_probes.check_spike_answer(16)
    with pytest.raises(CheckFailed, match="you answered 15"):
        quant_probes.check_spike_answer(15)
    quant_probes.check_scaling_answers(*_true_scales_by_hand())
    with pytest.raises(CheckFailed, match="ANSWER_QUIET_STORED_MAX is not yet right"):
        quant_probes.check_scaling_answers(_true_scales_by_hand()[0], 0.5)


def test_registry_cases_have_the_checks_inputs():
    """The seeded cases the grader sends are the generators' (spot check)."""
    labels = [label for label, _ in _registry.make_cases("quant_delayed_saturation")]
    assert labels[1] == ("e5m2, history_len = 2, the first tensor reaches 10^5 "
                         "(scale 1, fmax 57344)")


# Unit 06's probes at the edges the judges' tests do not reach: a scaler that
# answers with a plain list, and the lesson's round trip on a tensor smaller than 1.

STREAM = np.array([[1.0, -2.0], [4.0, 0.0], [0.5, 0.5]], np.float32)


class ListScaler(quant.DelayedScaler):
    """A correct scaler that returns each output as a Python list (no dtype)."""

    def __call__(self, x):
        return super().__call__(x).tolist()


def test_a_scaler_that_returns_lists_is_measured_like_any_other():
    """A list has no dtype: the probe must still read its values, not fail on it."""
    case = {"stream": STREAM, "dtype": np.array("float8_e4m3fn"), "history_len": np.array(2)}
    as_list = quant_probes._call_delayed_scaler(ListScaler, case)
    as_tensor = quant_probes._call_delayed_scaler(quant.DelayedScaler, case)
    assert as_list.keys() == as_tensor.keys()
    for key in as_tensor:
        np.testing.assert_array_equal(as_list[key], as_tensor[key])
    np.testing.assert_array_equal(as_list["y"], [[1.0, -2.0], [2.0, 0.0], [0.5, 0.5]])


def test_per_tensor_round_trip_scales_up_a_tensor_smaller_than_one():
    """amax 0.3 still maps onto fmax: the round trip of small values is as fine
    as that of large ones, and equal to the reference's."""
    x = torch.tensor([0.3, -0.02, 1e-3, 0.17])
    for dtype in quant.FP8_FORMATS:
        y = quant_probes.per_tensor_round_trip(x, dtype)
        assert torch.equal(y, quant.fp8_round_trip(x, dtype))
        unscaled = x.to(dtype).float()  # no scale: 1e-3 falls among fp8's subnormals
        assert not torch.equal(y, unscaled)
    # amax lands on fmax (448, exact in e4m3) and comes back as itself; unscaled,
    # 0.3 would round to e4m3's 0.3125.
    largest = quant_probes.per_tensor_round_trip(x, torch.float8_e4m3fn)[0]
    assert largest == pytest.approx(0.3, rel=1e-6)
    assert x[:1].to(torch.float8_e4m3fn).float().item() == 0.3125


def _per_token_onto_448(x, dtype):
    """Per-token scaling with e4m3's largest value hard-coded, whatever the dtype."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, 448.0 / amax, torch.ones_like(amax))
    fmax = torch.finfo(dtype).max
    return (x * scale).clamp(-fmax, fmax).to(dtype).float() / scale


def test_per_token_scaled_onto_448_fails_on_e5m2s_wide_range_case():
    """Away from the subnormals, 448 and 57344 give e5m2 the same rounding; a token
    spanning 10^8 is where they part, and the hint names the hard-coded 448."""
    with pytest.raises(CheckFailed, match="scale onto the largest value of the format"):
        check_per_token_round_trip(_per_token_onto_448)
