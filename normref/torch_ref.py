"""Unit 03, PyTorch's nn.LayerNorm: the same module, written out.

`LayerNorm` behaves like `torch.nn.LayerNorm` (constructor arguments,
parameter names, shapes and initial values, state_dict, repr and the error on
a mismatched input), but its forward pass spells out the recipe over the
trailing dimensions instead of calling `F.layer_norm`.

Shape contract: normalized_shape = (n_1, ..., n_k) names the last k
dimensions of the input; x: (*, n_1, ..., n_k) -> y: same shape, and the
mean and variance are taken over those k dimensions for each index of *.
"""

import numbers

import torch
from torch import nn


def shape_error_message(normalized_shape, input_shape):
    """The text torch 2.13 uses when the input's trailing dims do not match.

    shape_error_message((3, 4), (2, 5, 4)) ->
    "Given normalized_shape=[3, 4], expected input with shape [*, 3, 4],
    but got input of size[2, 5, 4]" (one line).
    """
    expected = "".join(f", {n}" for n in normalized_shape)
    return (
        f"Given normalized_shape={list(normalized_shape)}, "
        f"expected input with shape [*{expected}], "
        f"but got input of size{list(input_shape)}"
    )


class LayerNorm(nn.Module):
    """Layer norm over the trailing dims named by `normalized_shape`.

    normalized_shape: an int d (meaning (d,)) or a tuple/list/torch.Size.
    eps: added to the variance inside the square root.
    elementwise_affine: learn `weight` (gamma, starts at 1) and, if `bias`,
        `bias` (beta, starts at 0), each of shape normalized_shape. Without
        it the module has no parameters and both attributes are None.
    """

    def __init__(
        self,
        normalized_shape,
        eps=1e-5,
        elementwise_affine=True,
        bias=True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.empty(self.normalized_shape, **factory))
            else:
                # registered as None so that `self.bias` exists, as in torch
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """gamma back to 1 and beta back to 0, in place."""
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _check_input_shape(self, x):
        k = len(self.normalized_shape)
        if k == 0:
            raise RuntimeError(
                "Expected normalized_shape to be at least 1-dimensional, i.e., "
                "containing at least one element, but got normalized_shape = []"
            )
        if x.dim() < k or tuple(x.shape[x.dim() - k :]) != self.normalized_shape:
            raise RuntimeError(shape_error_message(self.normalized_shape, x.shape))

    def forward(self, x):
        """x: (*, *normalized_shape) -> y: same shape and dtype."""
        self._check_input_shape(x)
        dims = tuple(range(-len(self.normalized_shape), 0))  # the trailing k dims
        # half-precision inputs are normalized in float32, as torch does
        x_wide = x.to(torch.promote_types(x.dtype, torch.float32))
        mean = x_wide.mean(dim=dims, keepdim=True)  # *, 1, ..., 1
        centred = x_wide - mean  # *, n_1, ..., n_k
        var = (centred * centred).mean(dim=dims, keepdim=True)  # *, 1, ..., 1
        y = centred * torch.rsqrt(var + self.eps)  # *, n_1, ..., n_k
        if self.weight is not None:
            y = y * self.weight  # broadcasts over *
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)

    def extra_repr(self):
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


class AddLayerNorm(LayerNorm):
    """Residual add fused with layer norm, as pre-norm transformers call it.

    forward(x, residual=None) -> (normed, residual_sum), both of x's shape:
    residual_sum = x + residual (x alone when residual is None, the first
    block), normed = layer norm of residual_sum. The order is that of
    flash-attn's layer_norm_fn(..., prenorm=True), which returns (out,
    residual) (flash_attn/ops/triton/layer_norm.py). The parameters are
    LayerNorm's (`weight`, `bias`), so nn.LayerNorm's state_dict loads.

    Dtypes follow the same file's kernel: the add and the statistics run in
    the wider of x's and the residual's dtype, float32 at least (a bfloat16 x
    is widened, and neither input is ever narrowed);
    residual_sum is stored in the residual's dtype when one is given, else in
    float32 if `residual_in_fp32`, else in x's dtype; normed is in x's dtype.
    So a bfloat16 model can carry its residual stream in float32.
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 residual_in_fp32=False, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x, residual=None):
        wide = torch.promote_types(x.dtype, torch.float32)
        if residual is None:
            residual_sum = x.to(wide)  # *, n_1, ..., n_k
            stored = torch.float32 if self.residual_in_fp32 else x.dtype
        else:
            wide = torch.promote_types(wide, residual.dtype)  # never narrow either
            residual_sum = x.to(wide) + residual.to(wide)
            stored = residual.dtype
        # normalized before the sum is stored, as the kernel does
        return super().forward(residual_sum).to(x.dtype), residual_sum.to(stored)
