"""Chapter 06 — FlashAttention: the online softmax, O(N) memory, a kernel that races the libraries.

from labkernels.ch06_attention.naive import naive_attention
from labkernels.ch06_attention.online_softmax import online_softmax
from labkernels.ch06_attention.flash_attention import flash_attention
"""
