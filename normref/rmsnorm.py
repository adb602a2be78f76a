"""Unit 02, rows versus columns: RMSNorm in numpy (Zhang and Sennrich, 2019).

Like layer norm it works on each token (the last axis) on its own, but it
neither subtracts the mean nor adds a beta: it only divides by the root mean
square. Arithmetic in float64, result in the input's floating dtype.
"""

import numpy as np


def rms_norm(x, gamma=None, eps=1e-5):
    """RMSNorm over the last axis: y = x / sqrt(mean(x ** 2) + eps) * gamma.

    x: (..., d); gamma: (d,) or None (meaning 1) -> y: (..., d)

    eps=None means the machine epsilon of the dtype torch computes in, as in
    torch.nn.functional.rms_norm and nn.RMSNorm: x's own for float32 and float64,
    float32's for half-precision input, which torch computes in float32 (float64's
    for integer input).
    """
    x = np.asarray(x)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    if eps is None:
        eps = float(np.finfo(np.promote_types(dtype, np.float32)).eps)
    x64 = x.astype(np.float64)
    mean_square = (x64**2).mean(axis=-1, keepdims=True)  # ..., 1
    y = x64 / np.sqrt(mean_square + eps)  # ..., d
    if gamma is not None:
        y = y * np.asarray(gamma, dtype=np.float64)
    return y.astype(dtype)
