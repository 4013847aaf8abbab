"""One decode step of a small transformer layer, from the course's kernels, eager and under a CUDA graph.

The layer (pre-norm, grouped heads, SwiGLU MLP), for B sequences of one new token each:
    y, h = rmsnorm(delta + residual)          ch05 `rmsnorm_residual`, the add fused in
    q, k, v = y @ Wqkv^T                      `int4_matmul` (4-bit weights)
    q, k = rotary(q, k); append k, v          `rope_append` (one kernel, into the paged cache)
    o = attention(q, cache) @ Wo^T            `paged_decode_attention`, `int4_matmul`
    y, h = rmsnorm(o + h)                     `rmsnorm_residual`
    out = (silu(y Wg^T) * (y Wu^T)) Wd^T      `int4_matmul` (gate and up in one), torch's silu and mul
and returns (out, h) for the next layer. About fifteen kernels, each a few microseconds of GPU work at B = 1:
called from Python each launch costs more host time than that, so the step is host-bound until a CUDA graph
replays it (`Captured`). `TorchLayer` is the same layer in torch with 16-bit weights and a contiguous cache,
for torch eager and torch.compile(mode="reduce-overhead").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from labkernels.ch05_fusion.rmsnorm import rmsnorm_residual
from labkernels.ch07_decode import int4
from labkernels.ch07_decode.paged import paged_decode_attention
from labkernels.ch07_decode.rope_append import inv_frequencies, rope_append


@dataclass(frozen=True)
class LayerConfig:
    d_model: int
    q_heads: int
    kv_heads: int
    head_dim: int
    d_ff: int
    theta: float = 10000.0
    eps: float = 1e-6


def make_weights(cfg: LayerConfig, dtype, device, generator=None) -> dict:
    """Random weights of the layer: the norms' scales and 4-bit (packed, scales) pairs of the projections."""

    def linear(n, k):
        w = torch.randn(n, k, generator=generator) / k**0.5
        return tuple(t.to(device) for t in int4.quantize_int4(w.to(dtype)))

    qkv_out = (cfg.q_heads + 2 * cfg.kv_heads) * cfg.head_dim
    return {
        "attn_norm": (1 + 0.1 * torch.randn(cfg.d_model, generator=generator)).to(dtype).to(device),
        "mlp_norm": (1 + 0.1 * torch.randn(cfg.d_model, generator=generator)).to(dtype).to(device),
        "qkv": linear(qkv_out, cfg.d_model),
        "o": linear(cfg.d_model, cfg.q_heads * cfg.head_dim),
        "gate_up": linear(2 * cfg.d_ff, cfg.d_model),
        "down": linear(cfg.d_model, cfg.d_ff),
        "inv_freq": inv_frequencies(cfg.head_dim, cfg.theta, device),
    }


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x (B, H, T, D) for tokens at positions[b] + t (the half-split form): each pair
    (x_i, x_{i + D/2}) turned by the angle position * theta^(-2i/D), in fp32."""
    head_dim, n_tokens = x.shape[-1], x.shape[2]
    inv_freq = inv_frequencies(head_dim, theta, x.device)
    pos = positions[:, None].float() + torch.arange(n_tokens, device=x.device, dtype=torch.float32)  # (B, T)
    angle = pos[:, None, :, None] * inv_freq  # (B, 1, T, D/2)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def step(cfg: LayerConfig, w: dict, k_pool, v_pool, block_table, positions, delta, residual):
    """One token per sequence: delta, residual (B, d_model); positions (B,) int32, the tokens already cached.
    Writes the new K and V into the pools and returns (out, h). No host read of any tensor: capturable."""
    batch = delta.shape[0]
    hq, d = cfg.q_heads, cfg.head_dim
    y, h = rmsnorm_residual(delta, residual, w["attn_norm"], cfg.eps)
    qkv = int4.int4_matmul(y, *w["qkv"])  # (B, (Hq + 2 Hkv) D)
    q = rope_append(qkv, positions, w["inv_freq"], k_pool, v_pool, block_table, hq)  # k, v into the cache
    attn = paged_decode_attention(q, k_pool, v_pool, block_table, positions + 1, validate=False)
    o = int4.int4_matmul(attn.view(batch, hq * d), *w["o"])
    y, h = rmsnorm_residual(o, h, w["mlp_norm"], cfg.eps)
    gate, up = int4.int4_matmul(y, *w["gate_up"]).chunk(2, dim=-1)
    return int4.int4_matmul((F.silu(gate) * up).contiguous(), *w["down"]), h


class Captured:
    """A function of fixed-shape tensors captured once in a CUDA graph; calling it copies new inputs into the
    captured ones and replays (GPU lane only)."""

    def __init__(self, fn, *inputs, warmup: int = 2):
        self.inputs = inputs
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compiles every kernel and fills the allocator before the capture
            for _ in range(warmup):
                fn(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = fn(*inputs)

    def replay(self):
        self.graph.replay()
        return self.outputs

    def __call__(self, *inputs):
        for mine, theirs in zip(self.inputs, inputs, strict=True):
            if mine is not theirs:
                mine.copy_(theirs)
        return self.replay()


class TorchLayer(torch.nn.Module):
    """The same layer in torch: 16-bit weights (the 4-bit ones dequantised), a contiguous cache (B, Hkv,
    max_len, D) written at each sequence's position, and SDPA over the whole cache with a mask of the valid
    keys (what a compiled model with a static cache runs)."""

    def __init__(self, cfg: LayerConfig, w: dict, batch: int, max_len: int):
        super().__init__()
        self.cfg = cfg
        dense = lambda pair: torch.nn.Parameter(int4.dequantize_int4(*pair), requires_grad=False)  # noqa: E731
        self.wqkv, self.wo = dense(w["qkv"]), dense(w["o"])
        self.wgu, self.wd = dense(w["gate_up"]), dense(w["down"])
        self.attn_norm = torch.nn.Parameter(w["attn_norm"].clone(), requires_grad=False)
        self.mlp_norm = torch.nn.Parameter(w["mlp_norm"].clone(), requires_grad=False)
        shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
        dtype, device = w["attn_norm"].dtype, w["attn_norm"].device
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device))

    def _norm(self, x, residual, weight):
        h = x + residual
        hf = h.float()
        return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + self.cfg.eps) * weight.float()).to(
            h.dtype
        ), h

    def forward(self, positions, delta, residual):
        cfg, batch = self.cfg, delta.shape[0]
        hq, hkv, d = cfg.q_heads, cfg.kv_heads, cfg.head_dim
        y, h = self._norm(delta, residual, self.attn_norm)
        q, k, v = F.linear(y, self.wqkv).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = rotary(q.view(batch, hq, 1, d), positions, cfg.theta)
        k = rotary(k.view(batch, hkv, 1, d), positions, cfg.theta)
        rows = torch.arange(batch, device=delta.device)
        self.k_cache[rows, :, positions.long()] = k[:, :, 0]
        self.v_cache[rows, :, positions.long()] = v.view(batch, hkv, d)
        keys = torch.arange(self.k_cache.shape[2], device=delta.device)
        mask = (keys[None, :] <= positions[:, None])[:, None, None, :]  # (B, 1, 1, max_len)
        attn = F.scaled_dot_product_attention(
            q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=hq != hkv
        )
        o = F.linear(attn.reshape(batch, hq * d), self.wo)
        y, h = self._norm(o, h, self.mlp_norm)
        gate, up = F.linear(y, self.wgu).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.wd), h
