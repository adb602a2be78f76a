"""Unit 06, zero-centred outputs and low precision: normref.quant against
torch's float8 dtypes and the lesson's figures; the checks against right and
wrong code."""

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
    check_scaling_predictions,
    check_scaling_table,
    check_spike_answer,
    quant_probes,
)

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


def test_table_check_refuses_figures_the_code_did_not_measure():
    table = measured_table()

    def not_written(x, dtype):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="NotImplementedError"):
        check_scaling_table(table, not_written)
    with pytest.raises(CheckFailed, match="pass its own check"):
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


def test_predictions_are_graded_for_being_given():
    check_scaling_predictions("per-tensor", "per-token", "about the same")
    with pytest.raises(CheckFailed, match="your guess"):
        check_scaling_predictions(None, "per-token", "about the same")
    with pytest.raises(CheckFailed, match="rms_offset"):
        check_scaling_predictions("per-token", "per-token", "yes")


def test_answers_are_judged():
    check_spike_answer(16)
    check_spike_answer("16")
    for wrong in (15, 17, None, "sixteen"):
        with pytest.raises(CheckFailed):
            check_spike_answer(wrong)
    check_scaling_answers("a", "per-channel")
    with pytest.raises(CheckFailed, match="not yet right"):
        check_scaling_answers("b", "per-channel")
    with pytest.raises(CheckFailed, match="not yet right"):
        check_scaling_answers("a", "per-token")
    with pytest.raises(CheckFailed, match="must be one of"):
        check_scaling_answers(None, "per-channel")


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
    assert names == set(SUBJECTS) | {"quant_predictions", "quant_scaling_table",
                                     "quant_spike_answer", "quant_scaling_answers"}
