"""Unit 06's exercise 10: LayerNorm with a learned beta against RMSNorm,
stored in e4m3 and bf16. normref.quant's table against a float64
computation written another way, and the three checks against right and
wrong answers, down to the sentence a student reads.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch

from normref import quant
from normref.checks import (
    CheckFailed,
    check_beta_folded_error,
    check_beta_loses_more,
    check_beta_table,
    check_beta_why,
    check_spread_fold_errors,
)

E4M3 = torch.float8_e4m3fn


def _float64_outputs():
    """Both outputs computed in float64 by hand, then cast to float32."""
    x = quant.experiment_tokens().double()
    centred = x - x.mean(-1, keepdim=True)
    layer_norm = centred / (centred.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    beta = quant.learned_beta(x.shape[-1]).double()
    rms_norm = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    return {"LayerNorm + beta": (layer_norm + beta).float(), "RMSNorm": rms_norm.float()}


def _error(x, stored):
    x64 = x.double()
    return float((stored.double() - x64).pow(2).mean().sqrt() / x64.std(correction=0))


def _hand_table():
    table = {}
    for name, out in _float64_outputs().items():
        scale = 448.0 / out.abs().max()
        e4m3 = (out * scale).to(E4M3).float() / scale
        table[name] = (_error(out, e4m3), _error(out, out.to(torch.bfloat16).float()))
    return table


def test_beta_table_matches_a_float64_computation_written_another_way():
    ours, hand = quant.beta_table(), _hand_table()
    for name in quant.BETA_TABLE_ROWS:
        assert np.allclose(ours[name], hand[name], rtol=0.01), name


def test_beta_is_about_five_with_a_spread_of_a_half():
    beta = quant.learned_beta()
    assert beta.shape == (256,)
    assert abs(float(beta.mean()) - 5) < 0.1
    assert abs(float(beta.std()) - 0.5) < 0.1


def test_layer_norm_with_beta_loses_several_times_more_in_both_formats():
    table = quant.beta_table()
    for column in (0, 1):
        assert table["LayerNorm + beta"][column] > 3 * table["RMSNorm"][column]


def test_storing_before_beta_is_about_the_same_as_rmsnorm():
    table = quant.beta_table(beta_after_round_trip=True)
    ratio = table["LayerNorm + beta"][0] / table["RMSNorm"][0]
    assert 1 / 1.25 < ratio < 1.25


def test_beta_table_check_passes_the_table_in_any_numeric_type():
    table = quant.beta_table()
    check_beta_table(table)
    check_beta_table({"layernorm_+_beta": [np.float32(v) for v in table["LayerNorm + beta"]],
                      " rmsnorm": tuple(Fraction(v) for v in table["RMSNorm"])})


@pytest.mark.parametrize("make_wrong, words", [
    (lambda t: {name: row[::-1] for name, row in t.items()}, "wrong way round"),
    (lambda t: quant.beta_table(beta_after_round_trip=True), "before beta is added"),
    (lambda t: {name: (row[0] * 1.1, row[1]) for name, row in t.items()},
     "beta included"),
    (lambda t: {"LayerNorm + beta": t["LayerNorm + beta"]}, r"no row for \['RMSNorm'\]"),
    (lambda t: [1, 2], "not a dict"),
    (lambda t: {name: (row[0],) for name, row in t.items()}, "a pair"),
])
def test_beta_table_check_names_the_mistake(make_wrong, words):
    with pytest.raises(CheckFailed, match=words):
        check_beta_table(make_wrong(quant.beta_table()))


@pytest.mark.parametrize("answer", ["LayerNorm", "Layer Norm", " layer_norm ",
                                    "LayerNorm + beta"])
def test_loses_more_accepts_layer_norm_spelled_any_way(answer):
    check_beta_loses_more(answer, quant.beta_table())


def test_loses_more_accepts_what_the_students_own_table_shows():
    check_beta_loses_more("about the same", quant.beta_table(beta_after_round_trip=True))


@pytest.mark.parametrize("answer, table, words", [
    ("RMSNorm", quant.beta_table(), "not yet right"),
    ("about the same", quant.beta_table(), "not yet right"),
    ("about the same", None, "not yet right"),
    ("beta", quant.beta_table(), "one of"),
    (None, quant.beta_table(), "one of"),
])
def test_loses_more_rejects_other_answers(answer, table, words):
    with pytest.raises(CheckFailed, match=words):
        check_beta_loses_more(answer, table)


@pytest.mark.parametrize("answer", ["b", " B ", "B"])
def test_why_accepts_the_right_letter(answer):
    check_beta_why(answer)


@pytest.mark.parametrize("answer, words", [
    ("a", "not yet right"), ("c", "not yet right"), ("d", "not yet right"),
    ("e", "one of the letters"), (None, "one of the letters"),
])
def test_why_rejects_the_other_letters(answer, words):
    with pytest.raises(CheckFailed, match=words):
        check_beta_why(answer)


# ------------------------------ beta folded into the next layer's bias

def _hand_folded_error():
    """LayerNorm's output without beta, stored in e4m3 by hand in float64,
    beta added back, measured on the output with beta."""
    with_beta = _float64_outputs()["LayerNorm + beta"].double()
    beta = quant.learned_beta().double()
    plain = (with_beta - beta).float()
    scale = 448.0 / plain.abs().max()
    stored = (plain * scale).to(E4M3).float() / scale
    return _error(with_beta, stored.double() + beta)


def test_beta_folded_error_matches_a_float64_computation_written_another_way():
    assert quant.beta_folded_error() == pytest.approx(_hand_folded_error(), rel=0.01)


def test_folding_beta_out_brings_the_error_back_to_rmsnorms_level():
    folded = quant.beta_folded_error()
    assert folded < quant.beta_table()["LayerNorm + beta"][0] / 4
    assert folded < 1.25 * quant.beta_table()["RMSNorm"][0]


@pytest.mark.parametrize("as_given", [float, str, np.float32, torch.tensor, Fraction])
def test_beta_folded_error_accepts_any_numeric_type(as_given):
    value = quant.beta_folded_error()
    check_beta_folded_error(as_given(Fraction(value).limit_denominator(10**6))
                            if as_given is Fraction else as_given(value))


@pytest.mark.parametrize("answer, words", [
    (lambda: quant.beta_table()["LayerNorm + beta"][0], "the error with beta stored"),
    (lambda: quant.beta_folded_error(on_output_with_beta=False), "without beta"),
    (lambda: 0.05, "add beta back"),
    (lambda: "about 0.02", "as a number"),
])
def test_beta_folded_error_names_the_slip(answer, words):
    with pytest.raises(CheckFailed, match=words):
        check_beta_folded_error(answer())


def _spread_batch_by_hand():
    """The spread-offset batch and its calibration batch, drawn and normalised
    in float64 by hand, in the order the assignment's cell draws them."""
    gen = torch.Generator().manual_seed(quant.SPREAD_SEED)
    offsets = 20 + 3 * torch.randn(64, 1, generator=gen)
    calibration_offsets = 20 + 3 * torch.randn(64, 1, generator=gen)
    calibration_tokens = torch.randn(64, 256, generator=gen)

    def rms_norm(x):
        x = x.double()
        return (x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()).float()

    return (rms_norm(offsets + quant.experiment_tokens()),
            rms_norm(calibration_offsets + calibration_tokens))


def test_spread_fold_errors_match_a_computation_by_hand():
    out, calibration = _spread_batch_by_hand()
    shift = calibration.double().mean().item()
    folded = quant.fp8_round_trip((out.double() - shift).float(), E4M3).double() + shift
    by_hand = (_error(out, quant.fp8_round_trip(out, E4M3)), _error(out, folded))
    assert np.allclose(quant.spread_fold_errors(), by_hand, rtol=1e-3)
    # the point of the question: RMSNorm maps every offset from 12 to 28 to a
    # token mean within 0.004 of 1, so one shift still removes the whole cost
    assert by_hand[1] < 0.03 < 0.4 < by_hand[0]
    means = out.double().mean(-1)
    assert means.min() > 0.996 and means.max() < 1


@pytest.mark.parametrize("as_given", [
    tuple, list, np.array, lambda pair: torch.tensor(pair, dtype=torch.float64),
    lambda pair: (Fraction(pair[0]).limit_denominator(10**6), np.float32(pair[1])),
    lambda pair: [torch.tensor(v, dtype=torch.float64) for v in pair],
])
def test_spread_fold_accepts_any_numeric_pair(as_given):
    check_spread_fold_errors(as_given(quant.spread_fold_errors()))


@pytest.mark.parametrize("answer, words", [
    (lambda a, b: (b, a), "wrong way round"),
    (lambda a, b: (a, a), "subtract the shift first"),
    (lambda a, b: (a, quant.spread_fold_errors(20.0)[1]), "not the offset of its input"),
    (lambda a, b: (quant.rms_offset_error(20.0), b), "share the offset 20"),
    (lambda a, b: (a, 0.05), "mean of RMSNorm's output on the calibration batch"),
    (lambda a, b: "about 0.03", "a pair of numbers"),
    (lambda a, b: None, "a pair of numbers"),
])
def test_spread_fold_names_the_slip_and_not_the_answer(answer, words):
    truth = quant.spread_fold_errors()
    with pytest.raises(CheckFailed, match=words) as failure:
        check_spread_fold_errors(answer(*truth))
    assert f"{truth[1]:.4f}" not in str(failure.value)
