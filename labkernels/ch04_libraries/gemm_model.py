"""The GEMM cost model: FLOPs, bytes, arithmetic intensity, and how tiles quantize the work into waves.

C(M,N) = A(M,K) @ B(K,N) does 2MNK FLOPs and must at least read A and B and write C once:
(MK + KN + MN) elements (`labkernels.traffic.matmul`, the one formula the course uses). Its intensity
2MNK / (bytes per element · (MK + KN + MN)) grows with all three sizes, but not like "K/2" in general:
- M, N ≫ K: C dominates the traffic and the intensity tends to 2K / bytes per element (K/2 in fp32, K in
  fp16/bf16) — the only regime where the common rule "K/2" holds;
- M = N = K: 2K / (3 · bytes per element) (K/6 in fp32);
- K ≫ M, N: A and B dominate, and K drops out: 2MN / (bytes per element · (M + N)).

A library kernel cuts C into BLOCK_M × BLOCK_N tiles, one per thread block; with S SMs the tiles run in
ceil(tiles / S) waves, and a last wave that is nearly empty costs a full wave's time (wave quantization).
A convolution is an implicit GEMM (M = N·P·Q output pixels, N = output channels, K = C·R·S), so its cost
is modelled here too.
"""

from __future__ import annotations

import math

import torch

from labkernels.traffic import Traffic, element_size, matmul

H200_SMS = 132  # streaming multiprocessors of an H200 (and H100 SXM): one resident tile each, at most

DTYPES = {
    "float32": torch.float32,
    "tf32": torch.float32,  # TF32 reads and writes fp32 bytes: only the multiply is narrower
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def dtype_of(name: str) -> torch.dtype:
    """The storage dtype of a GEMM precision name ("float32", "tf32", "float16", "bfloat16")."""
    if name not in DTYPES:
        raise ValueError(f"unknown GEMM precision {name!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def gemm(m: int, n: int, k: int, dtype: str | torch.dtype = "float32") -> Traffic:
    """FLOPs and minimum bytes of one (M,K) @ (K,N) product; `dtype` is a torch dtype or a precision name."""
    dtype = dtype_of(dtype) if isinstance(dtype, str) else dtype
    return matmul(m, n, k, dtype)


def intensity(m: int, n: int, k: int, dtype: str | torch.dtype = "float32") -> float:
    """Arithmetic intensity in FLOP per byte."""
    return gemm(m, n, k, dtype).intensity


def intensity_limit_large_mn(k: int, dtype: str | torch.dtype = "float32") -> float:
    """The intensity as M, N → ∞ at fixed K: 2K / bytes per element (the "K/2" of fp32)."""
    dtype = dtype_of(dtype) if isinstance(dtype, str) else dtype
    if not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    return 2 * k / element_size(dtype)


def conv2d(
    batch: int,
    channels: int,
    height: int,
    width: int,
    out_channels: int,
    kernel: int = 3,
    stride: int = 1,
    padding: int = 1,
    dtype: torch.dtype = torch.float16,
) -> Traffic:
    """A 2-D convolution as an implicit GEMM: M = batch·P·Q, N = out_channels, K = channels·kernel²."""
    p, q = conv_output_size(height, kernel, stride, padding), conv_output_size(width, kernel, stride, padding)
    es = element_size(dtype)
    flops = 2 * batch * p * q * out_channels * channels * kernel * kernel
    # read the input and the weights once, write the output once
    nbytes = (
        batch * channels * height * width + out_channels * channels * kernel**2 + batch * out_channels * p * q
    )
    return Traffic("conv2d", nbytes * es, flops)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output height (or width) of a convolution: floor((size + 2·padding − kernel) / stride) + 1."""
    for name, value in {"size": size, "kernel": kernel, "stride": stride}.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(padding, int) or padding < 0:
        raise ValueError(f"padding must be a non-negative int, got {padding!r}")
    out = (size + 2 * padding - kernel) // stride + 1
    if out <= 0:
        raise ValueError(f"kernel {kernel} does not fit in size {size} with padding {padding}")
    return out


# --- tiles and waves ---------------------------------------------------------------------------------------


def tiles(m: int, n: int, block_m: int, block_n: int) -> int:
    """Number of BLOCK_M × BLOCK_N output tiles that cover an M × N result (edge tiles count as whole)."""
    for name, value in {"m": m, "n": n, "block_m": block_m, "block_n": block_n}.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return math.ceil(m / block_m) * math.ceil(n / block_n)


def waves(n_tiles: int, sms: int = H200_SMS) -> int:
    """Rounds of tiles when each of `sms` SMs runs one tile at a time: ceil(tiles / SMs)."""
    if not isinstance(n_tiles, int) or n_tiles <= 0 or not isinstance(sms, int) or sms <= 0:
        raise ValueError(f"tiles and sms must be positive ints, got {n_tiles!r}, {sms!r}")
    return math.ceil(n_tiles / sms)


def wave_efficiency(n_tiles: int, sms: int = H200_SMS) -> float:
    """Fraction of SM-slots doing useful tiles: tiles / (waves · SMs). 1.0 when the last wave is full."""
    return n_tiles / (waves(n_tiles, sms) * sms)


def wave_table(m: int, ns: list[int], block_m: int, block_n: int, sms: int = H200_SMS) -> list[dict]:
    """Per N: tiles, waves and the fraction of the last wave that is busy."""
    rows = []
    for n in ns:
        t = tiles(m, n, block_m, block_n)
        rows.append(
            {"n": n, "tiles": t, "waves": waves(t, sms), "efficiency": round(wave_efficiency(t, sms), 3)}
        )
    return rows


def wave_steps(m: int, n_max: int, block_m: int, block_n: int, sms: int = H200_SMS) -> list[int]:
    """The N (multiples of BLOCK_N, up to n_max) at which one more wave starts: the predicted steps in time.

    With tm = ceil(M / BLOCK_M) tile rows, N covers ceil(N / BLOCK_N) tile columns and tm of them per column;
    wave w+1 starts at the first column count c with tm · c > w · SMs.
    """
    tile_rows = math.ceil(m / block_m)
    steps, w = [], waves(tile_rows, sms)  # one column of tiles may already need several waves
    while True:
        columns = w * sms // tile_rows + 1  # the first column count whose tiles overflow w waves
        n = (columns - 1) * block_n + 1  # the smallest N that needs that many columns
        if n > n_max:
            return steps
        steps.append(n)
        w = waves(tile_rows * columns, sms)


def predicted_ms(
    m: int, n: int, k: int, block_m: int, block_n: int, peak_tflops: float, sms: int = H200_SMS
) -> float:
    """Compute-bound time if every wave costs what a full wave of whole tiles costs at `peak_tflops`."""
    if not peak_tflops > 0:
        raise ValueError(f"peak must be positive, got {peak_tflops}")
    per_wave_flops = 2 * block_m * block_n * k * sms
    return waves(tiles(m, n, block_m, block_n), sms) * per_wave_flops / (peak_tflops * 1e12) * 1e3
