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
    """q (B, Hq, N_q, D), k and v (B, Hkv, N_kv, D) with Hq a multiple of Hkv; the output in q's dtype.
    Computed in the inputs' dtype, as eager torch does. Causal: row i sees keys j <= i + N_kv - N_q (the
    diagonal at the bottom right); a row that sees no key is 0."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k, v = _expand_heads(q, k), _expand_heads(q, v)
    # The scale goes on Q (N x D), not on the scores: scaling N x N scores would be one more kernel reading
    # and writing N^2 elements.
    scores = (q * scale) @ k.transpose(-2, -1)  # read Q, K; write N^2 (B, H, N, N)
    if causal:
        scores = scores.masked_fill(~_causal_keep(q, k), float("-inf"))  # read N^2, write N^2
    p = torch.softmax(scores, dim=-1)  # read N^2, write N^2 (fp32 inside, stored in the dtype)
    if causal and q.shape[-2] > k.shape[-2]:
        p = p.nan_to_num(0.0)  # rows with no key: softmax over nothing
    return p @ v  # read N^2 and V, write O


def _expand_heads(q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """k or v with each key/value head repeated for the query heads of its group (grouped-query)."""
    return kv.repeat_interleave(q.shape[1] // kv.shape[1], dim=1) if kv.shape[1] != q.shape[1] else kv


def _causal_keep(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(N_q, N_kv) True where row i may see key j: j <= i + N_kv - N_q."""
    n_q, n_kv = q.shape[-2], k.shape[-2]
    return torch.ones(n_q, n_kv, dtype=torch.bool, device=q.device).tril(diagonal=n_kv - n_q)


def reference(q, k, v, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """The precise reference the tests and the grader compare to: naive attention in float64."""
    return naive_attention(q.double(), k.double(), v.double(), causal, sm_scale)


def logsumexp_reference(q, k, causal: bool = False, sm_scale: float | None = None) -> torch.Tensor:
    """logsumexp over keys of the scaled scores, (B, Hq, N_q), float64: what flash_attention returns beside O
    (-inf for a row that sees no key)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    k = _expand_heads(q, k)
    scores = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        scores = scores.masked_fill(~_causal_keep(q, k), float("-inf"))
    return torch.logsumexp(scores, dim=-1)
