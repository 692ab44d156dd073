"""RMSNorm in one call (`radixlm.model.fused_ops` puts it in place of the model's own norm modules)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.model.ops import direct_kernel


class FusedRMSNorm(nn.Module):
    """transformers' RMSNorm, `weight * (x * rsqrt(mean(x * x) + eps))` over the last dimension, as one call."""

    def __init__(self, weight: nn.Parameter, eps: float, kernel: Callable[..., torch.Tensor] | None = None) -> None:
        """`kernel`: radixlm._C's `rms_norm` (float32 or bfloat16 CPU weights), used for inputs of the weight's dtype
        without autograd."""
        super().__init__()
        self.weight = weight
        self.eps = eps
        # The kernel's arguments after x, gathered once (61 calls a decode step on the default model).
        self._kernel_args = None if kernel is None else (weight, eps)
        self._kernel = kernel

    def pad_rows(self) -> bool:
        """Write bfloat16 rows that the packed linear would copy apart already apart (`pad_rows_for_readers`);
        whether the kernel does."""
        if self._kernel is None or self.weight.dtype != torch.bfloat16:
            return False
        self._kernel = direct_kernel("rms_norm_padded")
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._kernel_args is not None and x.dtype == self.weight.dtype and not torch.is_grad_enabled():
            return self._kernel(x, *self._kernel_args)
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
