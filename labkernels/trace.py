"""Which program touched which element: a memory-access tracer for the Triton interpreter (CPU lane).

Under TRITON_INTERPRET=1 every `tl.load`/`tl.store` reaches the interpreter's builder as a block of byte
addresses and a mask. `trace_accesses` wraps the builder's masked load and store for the length of a `with`
block and records, per access, the program id, the kind, the element indices relative to the tensor named
by the caller, and the mask. Atomics are not recorded. On the GPU lane there is no interpreter to read: use
labkernels.profile / ncu there.

    with trace_accesses(x=x, out=out) as tr:
        kernel[grid](x, out, n, BLOCK_SIZE=4)
    tr.touched("x")  # {pid: element indices that program read or wrote}
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from labkernels.lane import LANE

OTHER = "other"  # addresses outside every tensor the caller named


@dataclass(frozen=True)
class Access:
    pid: tuple[int, int, int]
    kind: str  # "load" or "store"
    tensor: str  # a name given to trace_accesses, or OTHER
    index: np.ndarray  # elements from the tensor's data_ptr (bytes for OTHER); the block's shape
    mask: np.ndarray  # bool, same shape: False for a masked-off lane


@dataclass
class Trace:
    tensors: dict[str, torch.Tensor]
    accesses: list[Access] = field(default_factory=list)

    @classmethod
    def from_model(cls, tensors: dict[str, torch.Tensor], name: str, kind: str, blocks: dict) -> Trace:
        """A trace built from index math instead of the interpreter (how the GPU lane draws the picture):
        `blocks` maps a program id (an int or a tuple) to (element indices, mask) of one access."""
        accesses = [
            Access(
                (*((pid,) if isinstance(pid, int) else pid), 0, 0)[:3], kind, name, np.array(ix), np.array(m)
            )
            for pid, (ix, m) in blocks.items()
        ]
        return cls(dict(tensors), accesses)

    def of(self, name: str, kind: str | None = None) -> list[Access]:
        return [a for a in self.accesses if a.tensor == name and kind in (None, a.kind)]

    def touched(self, name: str, kind: str | None = None) -> dict[tuple[int, int, int], list[int]]:
        """pid -> sorted element indices of `name` that program accessed (unmasked lanes only)."""
        out: dict[tuple[int, int, int], set[int]] = {}
        for a in self.of(name, kind):
            out.setdefault(a.pid, set()).update(a.index[a.mask].tolist())
        return {pid: sorted(ix) for pid, ix in sorted(out.items()) if ix}

    def masked(self, name: str, kind: str | None = None) -> dict[tuple[int, int, int], list[int]]:
        """pid -> sorted element indices its masked-off lanes pointed at (never read or written)."""
        out: dict[tuple[int, int, int], set[int]] = {}
        for a in self.of(name, kind):
            if not a.mask.all():
                out.setdefault(a.pid, set()).update(a.index[~a.mask].tolist())
        return {pid: sorted(ix) for pid, ix in sorted(out.items())}

    def owner_map(self, name: str, numel: int, kind: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(owner, masked): owner[i] is the linear id of the last program that accessed element i, or -1;
        masked[i] is True where only masked-off lanes pointed at i."""
        owner = np.full(numel, -1, dtype=np.int64)
        masked = np.zeros(numel, dtype=bool)
        grid = _grid_dims(self.accesses)
        for a in self.of(name, kind):
            ix, m = a.index.ravel(), a.mask.ravel()
            inside = (ix >= 0) & (ix < numel)
            owner[ix[inside & m]] = np.ravel_multi_index(a.pid, grid)
            masked[ix[inside & ~m]] = True
        masked &= owner < 0
        return owner, masked


def _grid_dims(accesses: list[Access]) -> tuple[int, int, int]:
    if not accesses:
        return (1, 1, 1)
    return tuple(max(a.pid[d] for a in accesses) + 1 for d in range(3))


def _extents(tensors: dict[str, torch.Tensor]) -> list[tuple[str, int, int, int]]:
    """(name, first byte, one past the last byte, element size) of each tensor's view."""
    out = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
        out.append((name, t.data_ptr(), t.data_ptr() + span * t.element_size(), t.element_size()))
    return out


def _record(trace: Trace, extents, pid, kind: str, ptrs: np.ndarray, mask: np.ndarray) -> None:
    addr = np.asarray(ptrs, dtype=np.uint64).astype(np.int64)
    mask = np.broadcast_to(np.asarray(mask, dtype=bool), addr.shape)
    owner = np.full(addr.shape, -1)
    for k, (_, lo, hi, _) in enumerate(extents):
        owner[(owner < 0) & (addr >= lo) & (addr < hi)] = k
    live = owner[mask]
    # masked-off lanes go with the tensor their live lanes hit (they may point past its end)
    primary = np.bincount(live[live >= 0]).argmax() if (live >= 0).any() else _nearest_below(extents, addr)
    owner[~mask] = primary
    for k in np.unique(owner):
        lanes = owner == k
        if k < 0:
            name, index = OTHER, np.where(lanes, addr, 0)
        else:
            name, lo, _, es = extents[k]
            index = np.where(lanes, (addr - lo) // es, 0)
        trace.accesses.append(Access(pid, kind, name, index, mask & lanes))


def _nearest_below(extents, addr: np.ndarray) -> int:
    """The tensor whose start is the closest below the block's lowest address (a fully masked access)."""
    below = [(lo, k) for k, (_, lo, _, _) in enumerate(extents) if lo <= addr.min()]
    return max(below)[1] if below else -1


@contextlib.contextmanager
def trace_accesses(**tensors: torch.Tensor):
    """Record every tl.load / tl.store run inside the block; name the tensors whose elements you want."""
    if LANE != "cpu":
        raise RuntimeError("the tracer reads the interpreter; on the GPU lane use labkernels.profile/ncu")
    from triton.runtime.interpreter import InterpreterBuilder

    trace = Trace(dict(tensors))
    extents = _extents(tensors)
    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def traced_load(self, ptrs, mask, other, *args, **kwargs):
        _record(trace, extents, tuple(self.grid_idx), "load", ptrs.data, mask.data)
        return load(self, ptrs, mask, other, *args, **kwargs)

    def traced_store(self, ptrs, value, mask, *args, **kwargs):
        _record(trace, extents, tuple(self.grid_idx), "store", ptrs.data, mask.data)
        return store(self, ptrs, value, mask, *args, **kwargs)

    InterpreterBuilder.create_masked_load = traced_load
    InterpreterBuilder.create_masked_store = traced_store
    try:
        yield trace
    finally:
        InterpreterBuilder.create_masked_load = load
        InterpreterBuilder.create_masked_store = store


def plot_accesses(
    trace: Trace, name: str, shape: tuple[int, int], *, kind: str | None = None, ax=None, title=None
):
    """Colour each element of `name`, laid out as `shape` (row-major over its element indices), by the
    program that accessed it; hatched grey: only masked-off lanes pointed there; white: never touched.
    `shape` may cover more elements than the tensor holds, to show masked lanes past its end."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch, Rectangle

    rows, cols = shape
    owner, masked = trace.owner_map(name, rows * cols, kind)
    owner, masked = owner.reshape(shape), masked.reshape(shape)
    programs = np.unique(owner[owner >= 0])
    if ax is None:
        _, ax = plt.subplots(figsize=(min(2.5 + 0.45 * cols, 10), min(1 + 0.45 * rows, 8)))
    few = len(programs) <= 20  # a legend for a few programs, a colour bar for many
    cmap = (
        ListedColormap(plt.get_cmap("tab20").colors[: max(len(programs), 1)])
        if few
        else plt.get_cmap("viridis")
    )
    rank = np.searchsorted(programs, owner)  # programs renumbered 0..P-1 for the colour map
    norm = BoundaryNorm(np.arange(len(programs) + 1) - 0.5, cmap.N) if few else None
    image = ax.imshow(np.ma.masked_where(owner < 0, rank if few else owner), cmap=cmap, norm=norm)
    for r, c in zip(*np.nonzero(masked), strict=True):
        ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, facecolor="0.85", hatch="//", edgecolor="0.4", lw=0))
    ax.set_xlim(-0.5, cols - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_xticks(range(0, cols, max(1, cols // 8)))
    ax.set_yticks(range(0, rows, max(1, rows // 8)))
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    verb = {"load": "loaded", "store": "stored", None: "accessed"}[kind]
    ax.set_title(title or f"{name}: which program {verb} each element", fontsize=10)
    if rows * cols <= 128:  # small enough to number each element: its index from data_ptr
        for r, c in np.ndindex(rows, cols):
            ax.text(c, r, r * cols + c, ha="center", va="center", fontsize=7, color="0.15")
    grid = _grid_dims(trace.accesses)
    label = (lambda p: f"pid {p}") if grid[1:] == (1, 1) else (lambda p: f"pid {np.unravel_index(p, grid)}")
    handles = [Patch(color=cmap(i), label=label(p)) for i, p in enumerate(programs)] if few else []
    if not few:
        ax.figure.colorbar(image, ax=ax, label="program id (linear)")
    if masked.any():
        handles.append(Patch(facecolor="0.85", hatch="//", edgecolor="0.4", label="masked lane"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    return ax
