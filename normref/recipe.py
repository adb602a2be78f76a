"""Unit 01, the recipe: token statistics and layer norm in numpy.

A *token* is one row of d features; every function here works on the last
axis and accepts any leading batch shape. Arithmetic is done in float64 and
the result is returned in the input's floating dtype (float64 for integer
input), so the reference is as exact as the input allows.
"""

import numpy as np


def _as_float(x):
    """Return (x as float64, dtype to give results back in)."""
    x = np.asarray(x)
    out_dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    return x.astype(np.float64), out_dtype


def token_mean(x):
    """Mean of each token's features.

    x: (..., d) -> (...)
    """
    x64, dtype = _as_float(x)
    return x64.mean(axis=-1).astype(dtype)  # ...


def token_var(x):
    """Biased variance of each token's features (divides by d, not d - 1).

    x: (..., d) -> (...)
    """
    x64, dtype = _as_float(x)
    mu = x64.mean(axis=-1, keepdims=True)  # ..., 1
    return ((x64 - mu) ** 2).mean(axis=-1).astype(dtype)  # ...


def layer_norm(x, gamma=None, beta=None, eps=1e-5):
    """Layer norm over the last axis: y = gamma * (x - mu) / sqrt(var + eps) + beta.

    x: (..., d); gamma, beta: (d,) or None (meaning 1 and 0) -> y: (..., d)
    """
    x64, dtype = _as_float(x)
    mu = x64.mean(axis=-1, keepdims=True)  # ..., 1
    var = ((x64 - mu) ** 2).mean(axis=-1, keepdims=True)  # ..., 1
    x_hat = (x64 - mu) / np.sqrt(var + eps)  # ..., d
    if gamma is not None:
        x_hat = x_hat * np.asarray(gamma, dtype=np.float64)  # ..., d
    if beta is not None:
        x_hat = x_hat + np.asarray(beta, dtype=np.float64)  # ..., d
    return x_hat.astype(dtype)


def shortcut_var(x):
    """The one-pass textbook shortcut mean(x^2) - mean(x)^2, in x's own dtype.

    Equal to token_var in exact arithmetic; in floating point it cancels when
    a token's mean is large next to its spread. The checks use it to recognize
    an answer that took the shortcut.

    x: (..., d) floating -> (...)
    """
    x = np.asarray(x)
    return (x * x).mean(axis=-1) - x.mean(axis=-1) ** 2  # ...
