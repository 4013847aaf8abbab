"""Chapter 02 measurements: materialising a transposed matrix, copy-first vs stride-aware.

The question: a kernel is handed x.t() of a square fp32 matrix. Either (a) copy it to a contiguous buffer
first and run a contiguous-only kernel on that (two passes: transpose traffic + copy traffic), or (b, c) run
a stride-aware kernel on the view directly (one pass). Each implementation writes into a preallocated
buffer, so no allocation is timed; "torch .contiguous()" times the `copy_` that `.contiguous()` launches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from labkernels import timing, traffic
from labkernels.bench import benchmark
from labkernels.ch02_strides import (
    profiles,  # noqa: F401  (registers ch02_profile)
    triton_strided,
)
from labkernels.lane import DEVICE, LANE, size
from labkernels.results import Table

SIZES = size(cpu=[256, 512, 1024, 2048], gpu=[1024, 2048, 4096, 8192, 16384])

# impl -> (kernel(x, tmp, out), traffic(n, dtype), lanes where it is timed)
Impl = tuple[Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object], Callable, tuple[str, ...]]


def _cpp():
    from labkernels.ch02_strides import ops

    return ops


def _one_pass(n: int, dtype: torch.dtype) -> traffic.Traffic:
    return traffic.transpose(n, n, dtype)  # read n², write n²


def _two_passes(n: int, dtype: torch.dtype) -> traffic.Traffic:
    return traffic.transpose(n, n, dtype) + traffic.copy(n * n, dtype)  # materialise, then the kernel's pass


def _contiguous_kernel(src: torch.Tensor, out: torch.Tensor):
    """The contiguous-only consumer: Triton's flat copy on the GPU, the C++ op on contiguous input on CPU."""
    if LANE == "gpu":
        return triton_strided.copy_flat(src, out)
    return _cpp().copy_strided(src, out)


IMPLS: dict[str, Impl] = {
    "torch .contiguous()": (lambda x, tmp, out: out.copy_(x), _one_pass, ("gpu", "cpu")),
    "contiguous + kernel": (
        lambda x, tmp, out: _contiguous_kernel(tmp.copy_(x), out),
        _two_passes,
        ("gpu", "cpu"),
    ),
    "kernel alone (contiguous input)": (
        lambda x, tmp, out: _contiguous_kernel(tmp, out),
        lambda n, dtype: traffic.copy(n * n, dtype),
        ("gpu", "cpu"),
    ),
    "triton naive": (lambda x, tmp, out: triton_strided.copy_2d_naive(x, out), _one_pass, ("gpu",)),
    "triton tiled": (lambda x, tmp, out: triton_strided.copy_2d_tiled(x, out), _one_pass, ("gpu",)),
    "C++/CUDA naive": (lambda x, tmp, out: _cpp().copy_strided(x, out), _one_pass, ("gpu", "cpu")),
    "C++/CUDA tiled": (lambda x, tmp, out: _cpp().copy_2d_tiled(x, out), _one_pass, ("gpu", "cpu")),
}


def impls_for_lane() -> list[str]:
    """The implementations worth timing here (Triton under the interpreter is never timed)."""
    return [name for name, (_, _, lanes) in IMPLS.items() if LANE in lanes]


def measure(impl: str, n: int, dtype: torch.dtype = torch.float32) -> dict:
    """Time one implementation on x = (n, n).t(); returns ms, bytes (traffic model) and GB/s."""
    if impl not in IMPLS:
        raise KeyError(f"unknown implementation {impl!r}; known: {list(IMPLS)}")
    kernel, model, lanes = IMPLS[impl]
    if LANE not in lanes:
        raise ValueError(f"{impl!r} is not timed on the {LANE} lane")
    x = torch.randn(n, n, device=DEVICE).to(dtype).t()  # a transposed view: strides (1, n)
    tmp = torch.empty(n, n, device=DEVICE, dtype=dtype)
    out = torch.empty(n, n, device=DEVICE, dtype=dtype)
    kernel(x, tmp, out)
    if impl != "kernel alone (contiguous input)" and not torch.equal(out, x):
        raise AssertionError(f"{impl} copied x.t() wrongly at n={n}")
    ms = timing.time_ms(lambda: kernel(x, tmp, out))
    nbytes = model(n, dtype).bytes
    row = {"ms": ms, "bytes": nbytes, "gbps": timing.gbps(nbytes, ms)}
    if impl == "triton tiled" and LANE == "gpu":
        row["config"] = str(triton_strided._copy_2d_tiled_autotuned.best_config)
    return row


@benchmark("ch02_transpose")
def transpose() -> list[dict]:
    from labkernels.roofline import measure_copy_bandwidth

    copy_gbps = measure_copy_bandwidth()
    rows = []
    for n in SIZES:
        for impl in impls_for_lane():
            row = {"impl": impl, "n": n, "dtype": "float32", **measure(impl, n)}
            row["fraction_of_copy"] = row["gbps"] / copy_gbps
            rows.append(row)
    return rows


# --- the notebook's sweep, plot, break-even and widget ------------------------------------------------------


def transpose_sweep(sizes: list[int] | None = None, impls: list[str] | None = None) -> Table:
    """Time each implementation at each size on this lane (a progress bar shows the way)."""
    from labkernels.sweep import sweep

    impls = impls or impls_for_lane()
    return sweep(lambda n, impl: measure(impl, n), {"n": sizes or SIZES, "impl": impls}, desc="transpose")


def plot_transpose(
    table: Table,
    ax=None,
    reference: Table | None = None,
    copy_gbps: float | None = None,
    title: str | None = None,
):
    """GB/s (traffic model) against n, one line per implementation; the reference rows of the same
    implementations dashed beside them; the copy bandwidth as the roof."""
    from labkernels.sweep import plot_sweep

    if reference is not None:
        reference = Table(r for r in reference.rows if r["impl"] in table.unique("impl"))
    ax = plot_sweep(
        table,
        x="n",
        y="gbps",
        by="impl",
        reference=reference,
        ax=ax,
        title=title,
        ylabel="GB/s (traffic model)",
        order=list(IMPLS),  # each implementation one color in both lanes' figures
    )
    if copy_gbps:
        ax.axhline(copy_gbps, color="black", lw=1, ls=":", label="copy bandwidth (the roof)")
        ax.legend(fontsize=7)
    return ax


def break_even_uses(table: Table, n: int, strided: str) -> float:
    """How many uses of the data make copy-first cheaper than a stride-aware kernel at size n.

    Copy first: one transpose, then k passes of the contiguous kernel. Stride-aware: k strided passes.
    Equal when k = t_transpose / (t_strided - t_kernel); infinite when the strided pass is as fast.
    """
    ms = {r["impl"]: r["ms"] for r in table.where(n=n).rows}
    for name in ("torch .contiguous()", "kernel alone (contiguous input)", strided):
        if name not in ms:
            raise KeyError(f"no {name!r} row at n={n}")
    penalty = ms[strided] - ms["kernel alone (contiguous input)"]
    return float("inf") if penalty <= 0 else ms["torch .contiguous()"] / penalty


def transpose_widget():
    """Pick sizes and implementations, run the sweep here, and see it beside the H200 reference."""
    import ipywidgets as widgets

    from labkernels.results import load_reference
    from labkernels.widgets import SweepWidget

    reference = load_reference("ch02_transpose")

    def compute(largest: int, impls: tuple[str, ...]) -> Table:
        return transpose_sweep([n for n in SIZES if n <= largest], list(impls))

    def plot(table: Table, ax) -> None:
        plot_transpose(table, ax=ax, reference=reference, title="transposed fp32 n x n -> contiguous")

    impls = impls_for_lane()
    controls = {
        "largest": widgets.Dropdown(options=SIZES, value=SIZES[-2], description="largest n"),
        "impls": widgets.SelectMultiple(
            options=impls, value=tuple(impls), description="impls", rows=len(impls)
        ),
    }
    return SweepWidget(compute, plot, controls)
