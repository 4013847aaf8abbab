"""Naive attention, the reference: softmax(Q K^T * scale) V in plain torch, with the N x N scores in HBM.

Per (batch, head): S = Q K^T is written (N^2 elements), read by the softmax which writes P (N^2), and P is
read by P V. So the traffic grows as N^2 and so does the memory the scores occupy
(`traffic.attention_naive`, `scores_bytes`); a fused kernel keeps each block of S in registers and holds
O(N) memory; its HBM traffic is Q, K, V and O once at best (`traffic.attention`), more where K and V are
read again for each query block (`flash_attention.forward_hbm_bytes`).
"""

from __future__ import annotations

import math

import torch


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """(B, H, N, D) inputs; the output in q's dtype. Computed in the inputs' dtype, as eager torch does."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    # The scale goes on Q (N x D), not on the scores: scaling N x N scores would be one more kernel reading
    # and writing N^2 elements.
    scores = (q * scale) @ k.transpose(-2, -1)  # read Q, K; write N^2 (B, H, N, N)
    if causal:
        n = q.shape[-2]
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))  # read N^2, write N^2
    p = torch.softmax(scores, dim=-1)  # read N^2, write N^2 (fp32 inside, stored in the dtype)
    return p @ v  # read N^2 and V, write O


def reference(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """The precise reference the tests and the grader compare to: naive attention in float64."""
    return naive_attention(q.double(), k.double(), v.double(), causal, sm_scale)


def logsumexp_reference(q, k, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """logsumexp over keys of the scaled scores, (B, H, N), float64: what flash_attention returns beside O."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        n = q.shape[-2]
        keep = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(scores, dim=-1)
