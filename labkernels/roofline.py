"""Ceilings and the roofline.

A kernel can go no faster than max(bytes / bandwidth, FLOPs / peak). The two ceilings are *measured* on the
machine at hand, never quoted from a datasheet, the same way in both lanes: the bandwidth by a copy far larger
than the last-level cache (L2 on a GPU, L3 on a CPU), the peak as the best of the library's own matmul
(cuBLAS, or the CPU's BLAS on all threads). The ridge point peak / bandwidth (FLOP per byte) splits
memory-bound ops (left) from compute-bound ops (right).

A point timed with its data in cache (the CPU lane times the same buffers back to back; `do_bench` flushes the
GPU's L2) may pass the memory roof: it never went to DRAM. `plot_roofline` draws such points hollow, and
`beaten` lists any other point that passes its own roof, which would mean a ceiling was measured wrong.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
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
    # Bytes of the last-level cache when this machine's points are timed with their data left in it (the CPU
    # lane); None when timing flushes the cache between runs (do_bench on a GPU) or the size is unknown.
    cache_bytes: int | None = None

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


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's last-level cache in bytes (sysfs, else lscpu), or None if neither says."""
    root = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        for entry in sorted(os.listdir(root)):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(root, entry, "level")) as f:
                level = int(f.read())
            with open(os.path.join(root, entry, "size")) as f:
                nbytes = _parse_size(f.read())
            if nbytes and (best is None or level > best[0]):
                best = (level, nbytes)
    except (OSError, ValueError):
        best = None
    return best[1] if best else _lscpu_cache_bytes()


def _parse_size(text: str) -> int | None:
    """'48K', '2048K', '480 MiB', '32 MB (1 instance)' -> bytes."""
    parts = text.strip().split()
    if not parts:
        return None
    number, unit = parts[0], parts[1] if len(parts) > 1 else ""
    suffix = "".join(c for c in number if c.isalpha()) or unit
    digits = number.rstrip("KMGkmgiBb")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(suffix[:1].lower(), 1)
    try:
        return int(float(digits) * scale)
    except ValueError:
        return None


def _lscpu_cache_bytes() -> int | None:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    sizes = {}
    for line in out.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("L2 cache", "L3 cache"):
            sizes[name.strip()] = _parse_size(value)
    return sizes.get("L3 cache") or sizes.get("L2 cache")


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def copy_bytes_past_cache(
    cache_bytes: int | None, available_bytes: int | None = None, budget: int = 2 << 30
) -> int:
    """Bytes of one copy buffer so that source + destination are >= 4x the last-level cache.

    Unknown cache: 1 GiB in all. Never more than `budget` in all, nor a quarter of the free memory.
    """
    total = 4 * cache_bytes if cache_bytes else 1 << 30
    total = max(total, 64 << 20)
    total = min(total, budget)
    if available_bytes:
        total = min(total, available_bytes // 4)
    return max(4, total // 2) // 4 * 4


def measure_copy_bandwidth(nbytes: int | None = None) -> float:
    """Copy bandwidth in GB/s, counting bytes read plus bytes written, of one buffer of `nbytes`.

    Default size: 1 GiB on the GPU (far past its L2; do_bench also flushes L2 between runs); on the CPU,
    enough that source and destination together are >= 4x the last-level cache (`copy_bytes_past_cache`).
    The default measurement is made once per process: the ceiling does not change while a notebook runs.
    """
    if nbytes is None:
        if LANE == "gpu":
            return _copy_bandwidth_once(1 << 30)
        return _copy_bandwidth_once(copy_bytes_past_cache(last_level_cache_bytes(), _available_bytes()))
    return _copy_bandwidth(nbytes)


@functools.cache
def _copy_bandwidth_once(nbytes: int) -> float:
    return _copy_bandwidth(nbytes)


def _copy_bandwidth(nbytes: int) -> float:
    if not isinstance(nbytes, int) or nbytes < 4:
        raise ValueError(f"nbytes must be an int >= 4, got {nbytes!r}")
    n = nbytes // 4
    src = torch.empty(n, device=DEVICE).fill_(1.0)  # the values do not matter to a copy; randn is slow
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


PEAK_SIZES = {"cpu": (512, 1024, 2048), "gpu": (8192,)}


def measure_matmul_peak(dtype: torch.dtype, n: int | None = None, tf32: bool = False) -> float:
    """TFLOP/s of torch.matmul (cuBLAS on the GPU, the CPU's BLAS on all threads) on random n×n operands.

    Without `n`, the best over a few large sizes (`PEAK_SIZES`): the peak is the best the library reaches.
    """
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"matmul peak is measured for float dtypes, got {dtype}")
    if tf32 and dtype != torch.float32:
        raise ValueError("tf32 applies to float32 matmuls only")
    if n is None:
        return max(measure_matmul_peak(dtype, s, tf32) for s in size(**PEAK_SIZES))
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int, got {n!r}")
    a = torch.randn(n, n, device=DEVICE).to(dtype)  # random data: zeros run faster than real data
    b = torch.randn(n, n, device=DEVICE).to(dtype)
    with tf32_matmuls(tf32):
        if LANE == "gpu":
            ms = timing.time_ms(lambda: a @ b)
        else:  # the fastest of several runs: a host timer on a busy machine only ever adds time
            ms = min(timing.cpu_bench(lambda: a @ b, warmup=1, rep=1) for _ in range(5))
    return timing.tflops(matmul(n, n, n, dtype).flops, ms)


def measure_ceilings(name: str | None = None) -> Ceilings:
    """This machine's ceilings. The GPU lane measures bf16, fp16, fp32 and TF32; the CPU lane fp32."""
    from labkernels.env import device_name

    peaks = {"float32": measure_matmul_peak(torch.float32)}
    if LANE == "gpu":
        peaks["tf32"] = measure_matmul_peak(torch.float32, tf32=True)
        peaks["float16"] = measure_matmul_peak(torch.float16)
        peaks["bfloat16"] = measure_matmul_peak(torch.bfloat16)
    cache = None if LANE == "gpu" else last_level_cache_bytes()
    return Ceilings(name or device_name(), measure_copy_bandwidth(), peaks, cache)


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
        # The best of five batches: a batch the OS scheduler interrupts (another process on a 2-core laptop)
        # says nothing about the memory system, and one such batch would dent the curve.
        batch = lambda: [dst.copy_(src) for _ in range(iters)]  # noqa: E731
        batch()  # warm-up
        ms = min(timing.cpu_bench(batch, warmup=0, rep=1) for _ in range(5)) / iters
    return timing.gbps(copy(n).bytes, ms)


def copy_size_sweep(sizes_bytes: list[int]) -> Table:
    """Hot-cache copy bandwidth for each size in bytes (see `hot_copy_gbps`)."""
    from labkernels.sweep import sweep

    return sweep(lambda nbytes: {"gbps": hot_copy_gbps(nbytes)}, {"nbytes": sizes_bytes}, desc="copy sizes")


# --- the plot -----------------------------------------------------------------------------------------------


@dataclass
class Point:
    """A measured op on the roofline: its traffic (x = intensity) and its time (y = achieved TFLOP/s).

    Points of the same `series` (e.g. one implementation over several shapes) share a marker and a legend
    entry; a point without one gets its own entry, named by its label.
    """

    label: str
    traffic: Traffic
    ms: float
    series: str | None = None

    @property
    def tflops(self) -> float:
        return timing.tflops(self.traffic.flops, self.ms)

    @property
    def gbps(self) -> float:
        return timing.gbps(self.traffic.bytes, self.ms)


def roof_tflops(c: Ceilings, dtype: str, intensity: float) -> float:
    """The roof over an intensity: min(peak, bandwidth × intensity), in TFLOP/s."""
    return min(c.peak(dtype), intensity * c.bandwidth_gbps * 1e9 / 1e12)


def cache_resident(p: Point, c: Ceilings) -> bool:
    """True when every byte the op touches fits in the machine's last-level cache, timed hot (CPU lane)."""
    return c.cache_bytes is not None and p.traffic.bytes <= c.cache_bytes


def beaten(points: list[Point], c: Ceilings, dtype: str, slack: float = 1.02) -> list[Point]:
    """The points (timed on machine `c`) above its roof that are not cache-resident: each one says a
    ceiling was measured too low. `slack` forgives timer noise of a couple of percent."""
    return [
        p
        for p in points
        if p.traffic.flops > 0
        and p.tflops > slack * roof_tflops(c, dtype, p.traffic.intensity)
        and not cache_resident(p, c)
    ]


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes >= 1 << 20 else f"{nbytes / 2**10:,.0f} KiB"


LEGEND_INSIDE_MAX = 7  # legend entries that still fit inside the axes beside the points


def plot_roofline(points: list[Point], ceilings: list[Ceilings], ax=None, dtype: str | None = None):
    """Log-log roofline: one roof per machine (and per dtype peak), measured points placed on it.

    The points were timed on the first machine of `ceilings`. Those whose data fit in its cache are drawn
    hollow (they may pass the memory roof); any other point above that roof is named in the legend as such.
    Points are named in the legend, never by labels on the plot, so no two labels can collide; a legend of
    more than LEGEND_INSIDE_MAX entries goes outside the axes, on the right.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    xs = np.logspace(-2, 4, 200)
    styles = ["-", "--", ":", "-."]
    for i, c in enumerate(ceilings):
        dtypes = [dtype] if dtype else list(c.peak_tflops)
        for d in dtypes:
            if d not in c.peak_tflops:
                continue
            peak = c.peak_tflops[d]
            roof = np.minimum(peak, xs * c.bandwidth_gbps * 1e9 / 1e12)
            ax.plot(xs, roof, styles[i % len(styles)], color=f"C{i}", label=f"{c.name}: {d} roof")
            ax.plot([c.ridge_point(d)], [peak], "k|", markersize=10)
    _plot_points(ax, points, ceilings[0] if ceilings else None, dtype)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of memory traffic)")
    ax.set_ylabel("TFLOP/s")
    ax.grid(True, which="both", alpha=0.2)
    entries = len(ax.get_legend_handles_labels()[0])
    if entries > LEGEND_INSIDE_MAX:  # a long legend inside the axes would hide points near the roof
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        if ax.figure.get_layout_engine() is None:  # make room for it within the figure
            ax.figure.set_layout_engine("constrained")
    elif entries:
        ax.legend(fontsize=7, loc="best")
    return ax


def _plot_points(ax, points: list[Point], own: Ceilings | None, dtype: str | None) -> None:
    markers = "osD^vh<>p8d"  # closed shapes only: hollow, each still reads as hollow (P, * and X do not)
    keys = list(dict.fromkeys(p.series or p.label for p in points if p.traffic.flops > 0))
    above = set()
    if own is not None:
        d = dtype or next(iter(own.peak_tflops), None)
        above = {id(p) for p in beaten(points, own, d)} if d in own.peak_tflops else set()
    for j, key in enumerate(keys):
        group = [p for p in points if (p.series or p.label) == key and p.traffic.flops > 0]
        # earlier series drawn larger, so a point another series repeats still peeks out from under it
        size = max(4, 9 - 1.5 * j)
        style = {"marker": markers[j % len(markers)], "color": f"C{(j + 2) % 10}", "ls": "none", "ms": size}
        hot = [p for p in group if own is not None and cache_resident(p, own)]
        cold = [p for p in group if p not in hot]
        label = key
        if hot and not cold:
            label += " (data in cache)"
        if any(id(p) in above for p in group):
            label += " — above its roof: a ceiling measured too low"
        if cold:
            ax.plot([p.traffic.intensity for p in cold], [p.tflops for p in cold], label=label, **style)
        if hot:
            ax.plot(
                [p.traffic.intensity for p in hot],
                [p.tflops for p in hot],
                mfc="none",
                mew=1.5,
                label=None if cold else label,
                **style,
            )
    if own is not None and any(cache_resident(p, own) for p in points):
        ax.plot(
            [],
            [],
            "o",
            mfc="none",
            color="gray",
            label=f"hollow: all data fit in the {_mib(own.cache_bytes)} cache",
        )
