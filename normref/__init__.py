"""normref: the course's hidden reference implementations and grading checks.

Students never get this package. Reference functions are short, pure and
numpy-based unless their topic is torch itself; `normref.checks` holds one
check per graded exercise.

Top-level names load lazily, so that the grading sandbox, which ships only
the client half of `normref.checks`, can import the package without the
references being present.
"""

import importlib

_EXPORTS = {
    # 01 the recipe
    "token_mean": "recipe",
    "token_var": "recipe",
    "layer_norm": "recipe",
    # 02 rows versus columns
    "batch_norm": "batchnorm",
    "rms_norm": "rmsnorm",
    "group_norm": "batchnorm",
    # 04 the backward pass
    "layer_norm_forward": "backward",
    "layer_norm_backward": "backward",
    "rms_norm_backward": "backward",
    # 05 Pre-LN versus Post-LN
    "PreLNBlock": "blocks",
    "PostLNBlock": "blocks",
    "TinyLM": "blocks",
    "AdaLN": "blocks",
    "grad_norms_by_layer": "blocks",
    # 06 low precision
    "fp8_max": "quant",
    "fp8_round_trip": "quant",
    "rmse_over_std": "quant",
    "norm_output_errors": "quant",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'normref' has no attribute {name!r}")
    module = importlib.import_module(f"normref.{_EXPORTS[name]}")
    return getattr(module, name)
