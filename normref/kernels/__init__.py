"""Unit 07, the fused kernel: Triton layer norm and RMSNorm, forward and backward.

    from normref.kernels import layer_norm, rms_norm

The kernels are imported on first use, not with this package, so that a
script can still switch on Triton's CPU interpreter (TRITON_INTERPRET=1)
after `import normref.kernels` and before it touches a kernel; see
`normref.kernels.ops` for the contract, `python -m normref.kernels.bench`
for the benchmark, and `python -m normref.kernels.compile_check` to compile
the kernels for an H200 (sm_90) on a machine without a GPU.
"""

import importlib

_EXPORTS = {
    "layer_norm": "ops",
    "rms_norm": "ops",
    "LayerNormFunction": "ops",
    "layer_norm_forward": "ops",
    "layer_norm_backward": "ops",
    "rms_norm_forward": "ops",
    "rms_norm_backward": "ops",
    "RMSNormFunction": "ops",
    "interpreter_on": "ops",
    "max_features": "ops",
    "MAX_FUSED_BYTES": "ops",
    "INTERPRETER_HINT": "ops",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'normref.kernels' has no attribute {name!r}")
    module = importlib.import_module(f"normref.kernels.{_EXPORTS[name]}")
    return getattr(module, name)
