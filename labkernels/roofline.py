"""Ceilings and the roofline.

A kernel can go no faster than max(bytes / bandwidth, FLOPs / peak). The two ceilings are *measured* on the
machine at hand (a device-to-device copy; a large matmul per dtype), never quoted from a datasheet. The
ridge point peak / bandwidth (FLOP per byte) splits memory-bound ops (left) from compute-bound ops (right).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import numpy as np
import torch

from labkernels import timing
from labkernels.lane import DEVICE, LANE, size
from labkernels.results import Table, load_reference
from labkernels.traffic import Traffic, copy, matmul

PEAK_KEYS = ("bfloat16", "float16", "float32", "tf32")


@dataclass
class Ceilings:
    """A machine's two roofs: copy bandwidth (GB/s, read + write) and matmul peak per dtype (TFLOP/s)."""

    name: str
    bandwidth_gbps: float
    peak_tflops: dict[str, float] = field(default_factory=dict)

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise KeyError(
                f"{self.name}: no {dtype!r} matmul peak measured; measured: {sorted(self.peak_tflops)}"
            )
        return self.peak_tflops[dtype]

    def ridge_point(self, dtype: str) -> float:
        return ridge_point(self.bandwidth_gbps, self.peak(dtype))

    def best_time_ms(self, traffic: Traffic, dtype: str) -> float:
        return best_time_ms(traffic, self.bandwidth_gbps, self.peak(dtype))


def _check_rates(bandwidth_gbps: float, peak_tflops: float) -> None:
    if not bandwidth_gbps > 0 or not peak_tflops > 0:
        raise ValueError(
            f"bandwidth and peak must be positive, got {bandwidth_gbps} GB/s, {peak_tflops} TFLOP/s"
        )


def ridge_point(bandwidth_gbps: float, peak_tflops: float) -> float:
    """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
    _check_rates(bandwidth_gbps, peak_tflops)
    return peak_tflops * 1e12 / (bandwidth_gbps * 1e9)


def best_time_ms(traffic: Traffic, bandwidth_gbps: float, peak_tflops: float) -> float:
    """The roofline's lower bound on an op's time: the larger of its memory time and its compute time."""
    _check_rates(bandwidth_gbps, peak_tflops)
    memory_ms = traffic.bytes / (bandwidth_gbps * 1e9) * 1e3
    compute_ms = traffic.flops / (peak_tflops * 1e12) * 1e3
    return max(memory_ms, compute_ms)


def bound(traffic: Traffic, bandwidth_gbps: float, peak_tflops: float) -> str:
    """'memory' if the op sits left of the ridge point, else 'compute'."""
    return "memory" if traffic.intensity < ridge_point(bandwidth_gbps, peak_tflops) else "compute"


# --- measuring the ceilings -------------------------------------------------------------------------------


def measure_copy_bandwidth(nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written.

    Default size: 1 GiB on the GPU (far past the L2 cache), 64 MiB on the CPU.
    """
    nbytes = nbytes if nbytes is not None else size(cpu=64 << 20, gpu=1 << 30)
    if not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int >= 4, got {nbytes!r}")
    n = nbytes // 4
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    ms = timing.time_ms(lambda: dst.copy_(src))  # read n, write n
    return timing.gbps(copy(n).bytes, ms)


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """Let (or forbid) cuBLAS run float32 matmuls as TF32 on the tensor cores, inside the block only."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def measure_matmul_peak(dtype: torch.dtype, n: int | None = None, tf32: bool = False) -> float:
    """TFLOP/s of torch.matmul (cuBLAS on the GPU) on random n×n operands."""
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"matmul peak is measured for float dtypes, got {dtype}")
    if tf32 and dtype != torch.float32:
        raise ValueError("tf32 applies to float32 matmuls only")
    n = n if n is not None else size(cpu=512, gpu=8192)
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int, got {n!r}")
    a = torch.randn(n, n, device=DEVICE).to(dtype)  # random data: zeros run faster than real data
    b = torch.randn(n, n, device=DEVICE).to(dtype)
    with tf32_matmuls(tf32):
        ms = timing.time_ms(lambda: a @ b)
    return timing.tflops(matmul(n, n, n, dtype).flops, ms)


def measure_ceilings(name: str | None = None) -> Ceilings:
    """This machine's ceilings. The GPU lane measures bf16, fp16, fp32 and TF32; the CPU lane fp32."""
    from labkernels.env import device_name

    peaks = {"float32": measure_matmul_peak(torch.float32)}
    if LANE == "gpu":
        peaks["tf32"] = measure_matmul_peak(torch.float32, tf32=True)
        peaks["float16"] = measure_matmul_peak(torch.float16)
        peaks["bfloat16"] = measure_matmul_peak(torch.bfloat16)
    return Ceilings(name or device_name(), measure_copy_bandwidth(), peaks)


def ceilings_rows(c: Ceilings) -> list[dict]:
    rows = [{"quantity": "copy_bandwidth", "dtype": "float32", "value": c.bandwidth_gbps, "unit": "GB/s"}]
    rows += [
        {"quantity": "matmul_peak", "dtype": k, "value": v, "unit": "TFLOP/s"}
        for k, v in c.peak_tflops.items()
    ]
    return rows


def ceilings_from_table(table: Table) -> Ceilings:
    """Ceilings from a table of `ceilings_rows` (one copy_bandwidth row, matmul_peak rows)."""
    if not len(table) or "quantity" not in table.columns or "value" not in table.columns:
        raise ValueError(f"not a ceilings table (needs quantity and value columns): {table.columns}")
    bandwidths = table.where(quantity="copy_bandwidth").column("value")
    if len(bandwidths) != 1:
        raise ValueError(f"a ceilings table needs exactly one copy_bandwidth row, found {len(bandwidths)}")
    bandwidth = bandwidths[0]
    peaks = {r["dtype"]: r["value"] for r in table.where(quantity="matmul_peak").rows}
    return Ceilings(str(table.rows[0].get("device", "reference")), float(bandwidth), peaks)


def reference_ceilings() -> Ceilings | None:
    """The H200's ceilings as recorded by `make bench` (labkernels/reference/ceilings.csv)."""
    table = load_reference("ceilings")
    return ceilings_from_table(table) if table is not None else None


def hot_copy_gbps(nbytes: int, iters: int | None = None) -> float:
    """Copy bandwidth when the same buffers are copied back to back: small sizes stay in cache.

    Unlike `measure_copy_bandwidth` (do_bench clears L2 between runs), this is meant to *see* the caches:
    the size sweep shows where L2 (or the CPU's caches) ends and HBM (or DRAM) begins.
    """
    if not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int >= 4, got {nbytes!r}")
    n = nbytes // 4
    src = torch.randn(n, device=DEVICE)
    dst = torch.empty_like(src)
    iters = iters or max(3, min(200, (256 << 20) // nbytes))
    if LANE == "gpu":
        for _ in range(3):
            dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / iters
    else:
        ms = timing.cpu_bench(lambda: [dst.copy_(src) for _ in range(iters)], warmup=1, rep=3) / iters
    return timing.gbps(copy(n).bytes, ms)


def copy_size_sweep(sizes_bytes: list[int]) -> Table:
    """Hot-cache copy bandwidth for each size in bytes (see `hot_copy_gbps`)."""
    from labkernels.sweep import sweep

    return sweep(lambda nbytes: {"gbps": hot_copy_gbps(nbytes)}, {"nbytes": sizes_bytes}, desc="copy sizes")


# --- the plot -----------------------------------------------------------------------------------------------


@dataclass
class Point:
    """A measured op on the roofline: its traffic (x = intensity) and its time (y = achieved TFLOP/s)."""

    label: str
    traffic: Traffic
    ms: float

    @property
    def tflops(self) -> float:
        return timing.tflops(self.traffic.flops, self.ms)

    @property
    def gbps(self) -> float:
        return timing.gbps(self.traffic.bytes, self.ms)


def plot_roofline(points: list[Point], ceilings: list[Ceilings], ax=None, dtype: str | None = None):
    """Log-log roofline: one roof per machine (and per dtype peak), measured points placed on it."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5))
    xs = np.logspace(-2, 4, 200)
    styles = ["-", "--", ":", "-."]
    for i, c in enumerate(ceilings):
        dtypes = [dtype] if dtype else list(c.peak_tflops)
        for d in dtypes:
            if d not in c.peak_tflops:
                continue
            peak = c.peak_tflops[d]
            roof = np.minimum(peak, xs * c.bandwidth_gbps * 1e9 / 1e12)
            ax.plot(xs, roof, styles[i % len(styles)], label=f"{c.name}: {d} peak, copy bandwidth")
            ax.plot([c.ridge_point(d)], [peak], "k|", markersize=10)
    for p in points:
        if p.traffic.flops > 0:
            ax.plot([p.traffic.intensity], [p.tflops], "o")
            ax.annotate(
                p.label,
                (p.traffic.intensity, p.tflops),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of HBM traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.2)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    return ax
