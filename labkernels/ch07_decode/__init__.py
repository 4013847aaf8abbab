"""Chapter 07 — Decoding: split-KV attention with grouped heads, a paged KV cache, 4-bit weights, and one
decode step under a CUDA graph.

from labkernels.ch07_decode.decode_attention import decode_attention
from labkernels.ch07_decode.paged import PagedKVCache, paged_append, paged_decode_attention
from labkernels.ch07_decode.int4 import int4_matmul, quantize_int4
"""
