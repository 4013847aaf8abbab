"""The traffic model: one formula per op for the bytes it must move through HBM and the FLOPs it does.

"Must move" means the minimum a perfect kernel needs: every input read once, every output written once.
The roofline plot, the GB/s columns, the grader's performance verdict and the tests all use these, so a
number in one place can never disagree with another.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Traffic:
    """Bytes moved through HBM and floating-point operations of one call of an op."""

    op: str
    bytes: int
    flops: int

    def __post_init__(self):
        for name in ("bytes", "flops"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"Traffic {name} must be a number >= 0, got {value!r}")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per byte: where the op sits on the roofline's x axis."""
        if self.bytes == 0:
            raise ValueError(f"{self.op} moves no bytes: its arithmetic intensity is undefined")
        return self.flops / self.bytes

    def __add__(self, other: Traffic) -> Traffic:
        if not isinstance(other, Traffic):
            return NotImplemented
        return Traffic(f"{self.op}+{other.op}", self.bytes + other.bytes, self.flops + other.flops)

    def __radd__(self, other) -> Traffic:
        if isinstance(other, int) and other == 0:  # sum() of a list of Traffic starts from 0
            return self
        return NotImplemented


def element_size(dtype: torch.dtype) -> int:
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    return torch.empty((), dtype=dtype).element_size()


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def copy(n: int, dtype: torch.dtype = torch.float32) -> Traffic:
    _positive(n=n)
    return Traffic("copy", 2 * n * element_size(dtype), 0)  # read n, write n


def add(n: int, dtype: torch.dtype = torch.float32) -> Traffic:
    _positive(n=n)
    return Traffic("add", 3 * n * element_size(dtype), n)  # read 2n, write n; one add each


def relu(n: int, dtype: torch.dtype = torch.float32) -> Traffic:
    _positive(n=n)
    return Traffic("relu", 2 * n * element_size(dtype), n)  # read n, write n; one max each


def add_relu(n: int, dtype: torch.dtype = torch.float32, *, fused: bool = True) -> Traffic:
    """relu(x + y). Unfused (two kernels) writes the sum to HBM and reads it back: 5n elements, not 3n."""
    _positive(n=n)
    if not fused:
        unfused = add(n, dtype) + relu(n, dtype)
        return Traffic("add_relu_unfused", unfused.bytes, unfused.flops)
    return Traffic("add_relu", 3 * n * element_size(dtype), 2 * n)  # read 2n, write n


def softmax(rows: int, cols: int, dtype: torch.dtype = torch.float32, *, fused: bool = True) -> Traffic:
    """Row softmax. ~5 FLOPs an element (max, subtract, exp, sum, divide).

    Fused: read MN, write MN. The naive torch composition (max, subtract, exp, sum, divide as separate
    kernels) reads 5MN + 2M and writes 3MN + 2M elements, as in Triton's fused-softmax tutorial.
    """
    _positive(rows=rows, cols=cols)
    es = element_size(dtype)
    mn, m = rows * cols, rows
    if fused:
        return Traffic("softmax", 2 * mn * es, 5 * mn)
    return Traffic("softmax_naive", (8 * mn + 4 * m) * es, 5 * mn)


def matmul(m: int, n: int, k: int, dtype: torch.dtype = torch.float32) -> Traffic:
    """C(m,n) = A(m,k) @ B(k,n): 2mnk FLOPs; at best A and B are read once and C written once."""
    _positive(m=m, n=n, k=k)
    return Traffic("matmul", (m * k + k * n + m * n) * element_size(dtype), 2 * m * n * k)


def transpose(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> Traffic:
    """Materialising a transposed (or any strided) 2-D view: read rows*cols, write rows*cols."""
    _positive(rows=rows, cols=cols)
    return Traffic("transpose", 2 * rows * cols * element_size(dtype), 0)


def attention(
    batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype = torch.bfloat16
) -> Traffic:
    """Causal-free attention forward: Q, K, V read and O written once; 4·B·H·S²·D FLOPs (two matmuls)."""
    _positive(batch=batch, heads=heads, seq=seq, head_dim=head_dim)
    bhsd = batch * heads * seq * head_dim
    return Traffic("attention", 4 * bhsd * element_size(dtype), 4 * batch * heads * seq * seq * head_dim)


# --- chapter 05: fusion (eager = one kernel per torch op, each reading its inputs and writing its output) ---


def pointwise_chain(n: int, n_ops: int, dtype: torch.dtype = torch.float32, *, fused: bool = True) -> Traffic:
    """`x + y` followed by n_ops - 1 unary ops. Eager: 3n + 2n per unary op = (2N+1)n elements; fused: read
    2n, write n = 3n, whatever N. n_ops=2 with relu is add_relu: 5n eager, 3n fused (a 40% saving)."""
    _positive(n=n, n_ops=n_ops)
    passes = 3 if fused else 2 * n_ops + 1
    return Traffic("chain" if fused else "chain_eager", passes * n * element_size(dtype), n_ops * n)


def mul_add_sigmoid(n: int, dtype: torch.dtype = torch.float32, *, fused: bool = True) -> Traffic:
    """sigmoid(x * a + b). Eager: mul 3n, add 3n, sigmoid 2n = 8n; fused: read 3n, write n = 4n."""
    _positive(n=n)
    passes = 4 if fused else 8
    name = "mul_add_sigmoid" if fused else "mul_add_sigmoid_eager"
    return Traffic(name, passes * n * element_size(dtype), 4 * n)


def rmsnorm_residual(
    rows: int, cols: int, dtype: torch.dtype = torch.float32, *, fused: bool = True
) -> Traffic:
    """h = x + residual; y = h * rsqrt(mean(h^2) + eps) * weight; outputs y and h. Fused: read 2MN + N, write
    2MN. Eager (`ch05_fusion.rmsnorm.reference`, statistics in fp32): add; cast to fp32; pow; mean; + eps;
    rsqrt; * rstd; * weight (and its cast); cast back; the casts are no-ops in fp32."""
    _positive(rows=rows, cols=cols)
    e, f, mn, m, n = element_size(dtype), 4, rows * cols, rows, cols
    flops = 4 * mn
    if fused:
        return Traffic("rmsnorm_residual", (4 * mn + n) * e, flops)
    cast = e != f  # .float() and .to(dtype) are real kernels only for 16-bit storage
    total = 3 * mn * e  # h = x + residual
    total += cast * mn * (e + f)  # h.float()
    total += 2 * mn * f + (mn + m) * f  # pow; mean
    total += 4 * m * f  # + eps; rsqrt
    total += (2 * mn + m) * f  # * rstd
    total += cast * n * (e + f) + (2 * mn + n) * f  # weight.float(); * weight
    total += cast * mn * (f + e)  # .to(dtype)
    return Traffic("rmsnorm_residual_eager", total, flops)


def matmul_bias_gelu(
    m: int, n: int, k: int, dtype: torch.dtype = torch.float32, *, fused: bool = True
) -> Traffic:
    """gelu(A @ B + bias). Fused epilogue: the matmul's bytes plus the bias (N). Eager: the matmul writes C,
    then `+ bias` (read MN + N, write MN) and gelu (read MN, write MN) each pass over C again."""
    _positive(m=m, n=n, k=k)
    base = matmul(m, n, k, dtype)
    extra = n if fused else 4 * m * n + n
    name = "matmul_bias_gelu" if fused else "matmul_bias_gelu_eager"
    return Traffic(name, base.bytes + extra * element_size(dtype), base.flops + 2 * m * n)


def int8_matmul(m: int, n: int, k: int, dtype: torch.dtype = torch.float16, *, fused: bool = True) -> Traffic:
    """A (M,K) @ (W_int8 (K,N) * scale (N,)). Fused prologue: W crosses HBM as 1 byte per element, dequantised
    in registers: read MK + N (dtype) + KN (int8), write MN. Eager: w.to(dtype) (read KN int8, write KN),
    * scale (read KN + N, write KN), then a matmul reading the KN dequantised weights again."""
    _positive(m=m, n=n, k=k)
    e = element_size(dtype)
    flops = 2 * m * n * k + k * n
    if fused:
        return Traffic("int8_matmul", (m * k + n + m * n) * e + k * n, flops)
    dequant = k * n * (1 + e) + (2 * k * n + n) * e
    return Traffic("int8_matmul_eager", dequant + (m * k + k * n + m * n) * e, flops)


def sincos(n: int, dtype: torch.dtype = torch.float32, *, fused: bool = True) -> Traffic:
    """(sin x, cos x): horizontal fusion. Eager: two kernels, each reads x: 4n; fused: read n, write 2n."""
    _positive(n=n)
    passes = 3 if fused else 4
    return Traffic("sincos" if fused else "sincos_eager", passes * n * element_size(dtype), 2 * n)


def flash_attention(
    batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype = torch.bfloat16, *, causal=False
) -> Traffic:
    """Fused attention forward: Q, K, V read and O written once (4·B·H·N·D elements); 4·B·H·N²·D FLOPs,
    half that when causal (the skipped blocks are never computed), the convention FLOP/s figures use."""
    full = attention(batch, heads, seq, head_dim, dtype)
    flops = full.flops // 2 if causal else full.flops
    return Traffic("flash_attention_causal" if causal else "flash_attention", full.bytes, flops)


def attention_scores_bytes(batch: int, heads: int, seq: int, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of one B×H×N×N score matrix: what naive attention holds in HBM (twice: scores, then P)."""
    _positive(batch=batch, heads=heads, seq=seq)
    return batch * heads * seq * seq * element_size(dtype)


def attention_naive(
    batch: int, heads: int, seq: int, head_dim: int, dtype: torch.dtype = torch.bfloat16, *, causal=False
) -> Traffic:
    """softmax(QKᵀ·scale)V in separate torch ops: Q, K, V read and O written (4·B·H·N·D elements), S written,
    read by the softmax which writes P, P read by PV: 4·B·H·N² elements (6 with a causal mask, which reads S
    and writes it again). FLOPs: all 4·B·H·N²·D, masked or not."""
    base = attention(batch, heads, seq, head_dim, dtype)
    scores = (6 if causal else 4) * attention_scores_bytes(batch, heads, seq, dtype)
    return Traffic("attention_naive", base.bytes + scores, base.flops)


def online_softmax(rows: int, cols: int, dtype: torch.dtype = torch.float32, *, one_block=True) -> Traffic:
    """Online softmax: a row held on chip (one block, or split over programs) is read once and written once
    (2MN); a row walked twice (one_block=False) reads 2MN and writes MN, the second read from HBM unless it is
    still in L2."""
    _positive(rows=rows, cols=cols)
    reads = 1 if one_block else 2
    return Traffic("online_softmax", (reads + 1) * rows * cols * element_size(dtype), 5 * rows * cols)
