"""Small functional pieces shared by the layers."""

from __future__ import annotations

import torch
from torch import Tensor


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Dropout that keeps a 1-byte bool mask on every device (PyTorch's CPU F.dropout keeps it
    in the input dtype; CUDA's fused kernel, like this, keeps bool)."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]
