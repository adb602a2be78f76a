"""Unit 06's probes at the edges the judges' tests do not reach: a scaler that
answers with a plain list, and the lesson's round trip on a tensor smaller than 1.

Each test fails on a small bug in normref/checks/quant_probes.py: see `make mutation`.
"""

import numpy as np
import pytest
import torch

from normref import quant
from normref.checks import quant_probes

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
