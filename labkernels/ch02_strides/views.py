"""What a view really points at: a storage, an offset into it, and one stride per dimension.

A tensor is a window onto a flat storage. Element (i_0, ..., i_{n-1}) lives at storage element

    storage_offset + sum_k i_k * stride_k

and at byte address `storage base + element_size * (that)`. `t.data_ptr()` is the address of element
(0, ..., 0): base + storage_offset * element_size. Transpose, permute, slicing, narrow, select, expand and
as_strided only rewrite (sizes, strides, offset); they copy nothing. This module holds that arithmetic
(checked against torch in the tests and the grader), a picture of storage vs view, and a widget to play with
view operations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

# --- address arithmetic -------------------------------------------------------------------------------------


def _check_geometry(sizes: Sequence[int], strides: Sequence[int], offset: int) -> None:
    if len(sizes) != len(strides):
        raise ValueError(f"sizes {tuple(sizes)} and strides {tuple(strides)} have different lengths")
    if any(s < 0 for s in sizes):
        raise ValueError(f"sizes must be >= 0, got {tuple(sizes)}")
    if any(s < 0 for s in strides):
        raise ValueError(f"strides must be >= 0 (torch has no negative strides), got {tuple(strides)}")
    if offset < 0:
        raise ValueError(f"storage offset must be >= 0, got {offset}")


def storage_offset_of(index: Sequence[int], sizes: Sequence[int], strides: Sequence[int], offset: int) -> int:
    """Storage element that view element `index` reads: offset + sum_k index_k * stride_k."""
    _check_geometry(sizes, strides, offset)
    if len(index) != len(sizes):
        raise IndexError(f"index {tuple(index)} has {len(index)} entries, the view has {len(sizes)} dims")
    for k, (i, n) in enumerate(zip(index, sizes, strict=True)):
        if not 0 <= i < n:
            raise IndexError(f"index {i} is out of range for dim {k} of size {n}")
    return offset + sum(i * s for i, s in zip(index, strides, strict=True))


def address_of(t: torch.Tensor, index: Sequence[int]) -> int:
    """Byte address of `t[index]`, computed from the storage base, as a kernel does from data_ptr."""
    base = t.untyped_storage().data_ptr()
    return base + t.element_size() * storage_offset_of(index, t.shape, t.stride(), t.storage_offset())


def span(sizes: Sequence[int], strides: Sequence[int], offset: int) -> tuple[int, int] | None:
    """(lowest, highest) storage element a view touches, or None for an empty view (strides are >= 0)."""
    _check_geometry(sizes, strides, offset)
    if any(n == 0 for n in sizes):
        return None
    return offset, offset + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))


def storage_numel(t: torch.Tensor) -> int:
    """How many elements of t's dtype fit in its storage (the whole allocation, not just the view)."""
    return t.untyped_storage().nbytes() // t.element_size()


def storage_positions(t: torch.Tensor) -> torch.Tensor:
    """An int64 tensor shaped like `t`: the storage element each view element reads."""
    flat = torch.arange(storage_numel(t), dtype=torch.int64)
    return flat.as_strided(t.shape, t.stride(), t.storage_offset())


def check_inside_storage(t: torch.Tensor, name: str = "tensor") -> None:
    """Raise if the highest element the view can reach lies past the end of its storage."""
    reach = span(t.shape, t.stride(), t.storage_offset())
    if reach is not None and reach[1] >= storage_numel(t):
        raise ValueError(
            f"{name} reaches storage element {reach[1]} but its storage holds {storage_numel(t)} elements"
        )


def is_contiguous(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """torch's rule: row-major with no gaps; dims of size 1 may have any stride; empty tensors qualify."""
    if any(n == 0 for n in sizes):
        return True
    expected = 1
    for n, s in zip(reversed(sizes), reversed(strides), strict=True):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def flat_read_overrun_bytes(t: torch.Tensor) -> int:
    """Bytes past the end of t's storage that a contiguous-only kernel would read.

    Such a kernel reads t.numel() elements in a row starting at data_ptr(), i.e. storage elements
    [storage_offset, storage_offset + numel). Whatever lies past the storage is someone else's memory.
    """
    end = t.storage_offset() + t.numel()
    return max(0, end - storage_numel(t)) * t.element_size()


def byte_range(t: torch.Tensor) -> tuple[int, int] | None:
    """[first, last) byte addresses spanned by the view (every byte it can touch lies inside), or None."""
    reach = span(t.shape, t.stride(), t.storage_offset())
    if reach is None:
        return None
    base = t.untyped_storage().data_ptr()
    return base + reach[0] * t.element_size(), base + (reach[1] + 1) * t.element_size()


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if the byte spans of two views on the same device intersect (conservative: interleaved views
    such as x[::2] and x[1::2] count as overlapping)."""
    if a.device != b.device:
        return False
    ra, rb = byte_range(a), byte_range(b)
    return ra is not None and rb is not None and ra[0] < rb[1] and rb[0] < ra[1]


# --- input checks shared by every ch02 launcher and op wrapper ----------------------------------------------

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_view(x, name: str, *, ndim: int | None = None, dtypes=FLOAT_DTYPES) -> None:
    """A readable view: a tensor of a supported dtype (and rank), positive sizes, inside its storage."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {x.dtype}; supported: {', '.join(str(d) for d in dtypes)}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
    if any(n <= 0 for n in x.shape):
        raise ValueError(f"{name} has shape {tuple(x.shape)}: every size must be positive")
    check_inside_storage(x, name)


def check_out(out, shape, like: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Allocate a contiguous output like `like`, or check the one given: same device, dtype and shape,
    contiguous, and not overlapping any input (a kernel would overwrite what it still has to read)."""
    if out is None:
        return torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.device != like.device:
        raise ValueError(f"out is on {out.device}, the input on {like.device}")
    if out.dtype != like.dtype:
        raise TypeError(f"out has dtype {out.dtype}, the input {like.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.is_contiguous():
        raise ValueError(
            f"out must be contiguous (strides {tuple(out.stride())} for shape {tuple(out.shape)})"
        )
    check_inside_storage(out, "out")
    for name, t in inputs.items():
        if may_overlap(out, t):
            raise ValueError(
                f"out overlaps {name} in memory: the kernel would overwrite what it still has to read"
            )
    return out


def describe(t: torch.Tensor) -> str:
    """One line: sizes, strides, storage offset (elements), contiguity. Lane-independent."""
    return (
        f"sizes {tuple(t.shape)}  strides {tuple(t.stride())}  offset {t.storage_offset()}  "
        f"contiguous {t.is_contiguous()}"
    )


# --- view operations as pure arithmetic ---------------------------------------------------------------------
# An op is a tuple: ("transpose", d0, d1), ("permute", dims), ("slice", dim, start, stop, step),
# ("narrow", dim, start, length), ("select", dim, index), ("expand", sizes), ("unsqueeze", dim).

VIEW_OPS = ("transpose", "permute", "slice", "narrow", "select", "expand", "unsqueeze")


def _dim(d: int, ndim: int) -> int:
    if not -ndim <= d < ndim:
        raise IndexError(f"dim {d} out of range for a {ndim}-d view")
    return d % ndim


def apply_view_op(sizes, strides, offset, op) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(sizes, strides, offset) after one view op, computed without touching any data."""
    sizes, strides = list(sizes), list(strides)
    kind, args = op[0], op[1:]
    nd = len(sizes)
    if kind == "transpose":
        a, b = _dim(args[0], nd), _dim(args[1], nd)
        sizes[a], sizes[b] = sizes[b], sizes[a]
        strides[a], strides[b] = strides[b], strides[a]
    elif kind == "permute":
        dims = [_dim(d, nd) for d in args[0]]
        if sorted(dims) != list(range(nd)):
            raise ValueError(f"permute needs each of {nd} dims once, got {tuple(args[0])}")
        sizes, strides = [sizes[d] for d in dims], [strides[d] for d in dims]
    elif kind == "slice":  # x[..., start:stop:step, ...] along dim
        d, start, stop, step = _dim(args[0], nd), *args[1:]
        if step < 1 or not 0 <= start <= stop <= sizes[d]:
            raise ValueError(f"bad slice {start}:{stop}:{step} of a dim of size {sizes[d]}")
        offset += start * strides[d]
        sizes[d] = (stop - start + step - 1) // step
        strides[d] *= step
    elif kind == "narrow":
        d, start, length = _dim(args[0], nd), args[1], args[2]
        if start < 0 or length < 0 or start + length > sizes[d]:
            raise ValueError(f"narrow({start}, {length}) does not fit a dim of size {sizes[d]}")
        offset += start * strides[d]
        sizes[d] = length
    elif kind == "select":
        d, i = _dim(args[0], nd), args[1]
        if not 0 <= i < sizes[d]:
            raise IndexError(f"select index {i} out of range for a dim of size {sizes[d]}")
        offset += i * strides[d]
        del sizes[d], strides[d]
    elif kind == "expand":
        target = list(args[0])
        if len(target) < nd:
            raise ValueError(f"expand to {tuple(target)} has fewer dims than the view ({nd})")
        new = len(target) - nd
        sizes, strides = [1] * new + sizes, [0] * new + strides
        for k, want in enumerate(target):
            if want == -1 and k >= new:
                continue
            if sizes[k] == want:
                continue
            if sizes[k] != 1:
                raise ValueError(f"expand: dim {k} has size {sizes[k]}, only size-1 dims can grow")
            sizes[k], strides[k] = want, 0
    elif kind == "unsqueeze":
        d = args[0] % (nd + 1)
        # torch's rule: the new dim's stride is size*stride of the dim it is put in front of (1 at the end)
        stride = sizes[d] * strides[d] if d < nd else 1
        sizes.insert(d, 1)
        strides.insert(d, stride)
    else:
        raise ValueError(f"unknown view op {kind!r}; known: {VIEW_OPS}")
    return tuple(sizes), tuple(strides), offset


def predict_view(sizes, strides, offset, ops) -> tuple[tuple[int, ...], tuple[int, ...], int, bool]:
    """(sizes, strides, offset, is_contiguous) after a chain of view ops."""
    sizes, strides = tuple(sizes), tuple(strides)
    for op in ops:
        sizes, strides, offset = apply_view_op(sizes, strides, offset, op)
    return sizes, strides, offset, is_contiguous(sizes, strides)


def apply_view_ops(t: torch.Tensor, ops) -> torch.Tensor:
    """The same chain applied to a real tensor with torch's own view functions."""
    for op in ops:
        kind, args = op[0], op[1:]
        if kind == "transpose":
            t = t.transpose(args[0], args[1])
        elif kind == "permute":
            t = t.permute(*args[0])
        elif kind == "slice":
            index = [slice(None)] * t.dim()
            index[args[0]] = slice(args[1], args[2], args[3])
            t = t[tuple(index)]
        elif kind == "narrow":
            t = t.narrow(args[0], args[1], args[2])
        elif kind == "select":
            t = t.select(args[0], args[1])
        elif kind == "expand":
            t = t.expand(*args[0])
        elif kind == "unsqueeze":
            t = t.unsqueeze(args[0])
        else:
            raise ValueError(f"unknown view op {kind!r}; known: {VIEW_OPS}")
    return t


def random_view_op(t: torch.Tensor, rng, kinds: Sequence[str] = VIEW_OPS) -> tuple:
    """A random valid view op for `t` (rng: a random.Random), one of `kinds`; never makes an empty view."""
    nd = t.dim()
    kind = rng.choice(list(kinds))
    if nd == 0:
        return ("unsqueeze", 0)
    d = rng.randrange(nd)
    n = t.shape[d]
    if kind == "transpose":
        return (kind, rng.randrange(nd), rng.randrange(nd))
    if kind == "permute":
        dims = list(range(nd))
        rng.shuffle(dims)
        return (kind, tuple(dims))
    if kind == "slice":
        start = rng.randrange(n)
        return (kind, d, start, rng.randint(start + 1, n), rng.randint(1, 3))
    if kind == "narrow":
        start = rng.randrange(n)
        return (kind, d, start, rng.randint(1, n - start))
    if kind == "select" and nd > 1:
        return (kind, d, rng.randrange(n))
    if kind == "expand":
        target = [rng.choice([m, 3]) if m == 1 else rng.choice([m, -1]) for m in t.shape]
        return (kind, tuple(([2] if rng.random() < 0.3 else []) + target))
    return ("unsqueeze", rng.randint(-nd - 1, nd))


# --- random 2-D views, poisoned around, for tests and the grader --------------------------------------------

VIEW_KINDS = (
    "contiguous",
    "transpose",
    "step",
    "offset",
    "expand_rows",
    "expand_cols",
    "offset_transpose_step",
)


def random_2d_view(
    rows: int,
    cols: int,
    kind: str,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    poison: float = float("nan"),
) -> torch.Tensor:
    """A (rows, cols) view of `kind` inside a larger buffer. Every buffer cell the view does NOT read holds
    `poison` (NaN), with guard bands before and after, so a kernel that reads outside its view produces
    NaN and fails a comparison. The view's own elements are random."""
    if kind not in VIEW_KINDS:
        raise ValueError(f"unknown view kind {kind!r}; known: {VIEW_KINDS}")
    if rows < 1 or cols < 1:
        raise ValueError(f"rows and cols must be >= 1, got {rows}, {cols}")
    guard = 37
    if kind == "contiguous":
        sizes, strides, offset = (rows, cols), (cols, 1), guard
    elif kind == "transpose":  # a (cols, rows) row-major matrix, transposed
        sizes, strides, offset = (rows, cols), (1, rows), guard
    elif kind == "step":  # x[::2, ::3] of a (2*rows, 3*cols + 1) matrix
        sizes, strides, offset = (rows, cols), (2 * (3 * cols + 1), 3), guard
    elif kind == "offset":  # x[3:, 5:] of a (rows + 3, cols + 5) matrix
        ld = cols + 5
        sizes, strides, offset = (rows, cols), (ld, 1), guard + 3 * ld + 5
    elif kind == "expand_rows":  # a row vector expanded down: stride 0 along rows
        sizes, strides, offset = (rows, cols), (0, 1), guard
    elif kind == "expand_cols":  # a column of a matrix, expanded across: stride 0 along cols
        sizes, strides, offset = (rows, cols), (2, 0), guard + 1
    else:  # a transposed (cols*2+1, rows+2) matrix, narrowed and stepped: y[2:, 1::2].t()
        ld = rows + 2
        sizes, strides, offset = (rows, cols), (1, 2 * ld), guard + ld + 2
    top = span(sizes, strides, offset)[1]
    buffer = torch.full((top + 1 + guard,), poison, dtype=dtype, device=device)
    view = buffer.as_strided(sizes, strides, offset)
    positions = storage_positions(view).reshape(-1)
    if kind.startswith("expand"):  # stride 0: several view elements share a cell
        positions = positions.unique()
    positions = positions.to(buffer.device)
    values = torch.randn(positions.numel(), generator=generator, dtype=torch.float64)
    buffer[positions] = values.to(device=device, dtype=dtype)
    return view


# --- the picture --------------------------------------------------------------------------------------------


def draw_view(
    sizes: Sequence[int],
    strides: Sequence[int],
    offset: int,
    n_storage: int,
    ax=None,
    title: str | None = None,
    max_cells: int = 64,
):
    """Storage as a row of cells (top) and the logical view as a grid (bottom).

    Each view element gets a number, its position in logical (row-major) order, and a colour. A storage cell
    shows the number(s) of the view elements that read it; a grid cell shows the storage index it reads.
    Grey storage cells are not part of the view. Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    _check_geometry(sizes, strides, offset)
    sizes = tuple(int(s) for s in sizes) or (1,)
    strides = tuple(int(s) for s in strides) or (1,)
    numel = math.prod(sizes)
    if n_storage > max_cells or numel > max_cells:
        raise ValueError(
            f"the picture is for small tensors (<= {max_cells} cells); got storage {n_storage}, view {numel}"
        )
    reach = span(sizes, strides, offset)
    if reach is not None and reach[1] >= n_storage:
        raise ValueError(f"the view reaches element {reach[1]} past a storage of {n_storage} elements")
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6, n_storage * 0.32), 4))

    cols = sizes[-1]
    rows = numel // cols if cols else 0
    pos = torch.arange(n_storage).as_strided(sizes, strides, offset).reshape(-1).tolist()
    cmap = plt.get_cmap("viridis")
    colour = [cmap(0.15 + 0.75 * k / max(1, numel - 1)) for k in range(numel)]
    readers: dict[int, list[int]] = {}
    for k, p in enumerate(pos):
        readers.setdefault(p, []).append(k)

    cell = 1.0
    top = rows * cell + 1.6  # storage row sits above the grid
    for j in range(n_storage):
        who = readers.get(j)
        face = colour[who[0]] if who else (0.88, 0.88, 0.88)
        ax.add_patch(Rectangle((j * cell, top), cell, cell, facecolor=face, edgecolor="black", lw=0.6))
        if who:
            label = ",".join(str(k) for k in who[:3]) + ("…" if len(who) > 3 else "")
            size = 7 if len(who) == 1 else 5
            ax.text(
                j + 0.5, top + 0.5, label, ha="center", va="center", fontsize=size, color=_ink(who[0], numel)
            )
        ax.text(j + 0.5, top - 0.25, str(j), ha="center", va="center", fontsize=6, color="dimgray")
    ax.annotate(
        "offset",
        xy=(offset + 0.5, top + cell),
        xytext=(offset + 0.5, top + cell + 0.7),
        ha="center",
        fontsize=7,
        arrowprops={"arrowstyle": "->", "lw": 0.8},
    )
    ax.text(-0.3, top + 0.5, "storage", ha="right", va="center", fontsize=8)

    ax.set_xlim(-2.2, max(n_storage, cols) + 0.5)
    ax.set_ylim(-0.5, top + cell + 1.2)
    # Two lines of text fit in a grid cell only if it is tall enough on paper; else keep the storage index.
    both = _cell_points(ax) >= 30
    for k in range(numel):
        r, c = divmod(k, cols)
        y = (rows - 1 - r) * cell
        ax.add_patch(Rectangle((c * cell, y), cell, cell, facecolor=colour[k], edgecolor="black", lw=0.6))
        if both:
            ax.text(c + 0.5, y + 0.62, f"#{k}", ha="center", va="center", fontsize=6, color=_ink(k, numel))
        ax.text(
            c + 0.5,
            y + (0.3 if both else 0.5),
            f"s{pos[k]}",
            ha="center",
            va="center",
            fontsize=7,
            color=_ink(k, numel),
        )
    ax.text(-0.3, rows / 2, "view", ha="right", va="center", fontsize=8)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(title or f"sizes {sizes}  strides {strides}  offset {offset}", fontsize=9)
    return ax


def _cell_points(ax) -> float:
    """Side of one unit cell in points once the equal aspect is applied: the smaller of the two scales."""
    fig_w, fig_h = ax.figure.get_size_inches() * 72
    box = ax.get_position()
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    return min(fig_w * box.width / (x1 - x0), fig_h * box.height / (y1 - y0))


def _ink(k: int, numel: int) -> str:
    """Text colour readable on the viridis cell colour of element k (dark cells: white, light: black)."""
    return "white" if k <= 0.6 * max(1, numel - 1) else "black"


# --- the widget ---------------------------------------------------------------------------------------------

EXAMPLE_VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "x": lambda x: x,
    "x.t()": lambda x: x.t(),
    "x[:, ::2]": lambda x: x[:, ::2],
    "x[1:, 1:]": lambda x: x[1:, 1:],
    "x.narrow(1, 1, 2)": lambda x: x.narrow(1, 1, 2),
    "x[1]": lambda x: x[1],
    "x[:, 1]": lambda x: x[:, 1],
    "x[0].expand(3, -1)": lambda x: x[0].expand(3, -1),
    "x[:, :1].expand(-1, 3)": lambda x: x[:, :1].expand(-1, 3),
    "x.flatten().unfold(0, 3, 2)": lambda x: x.flatten().unfold(0, 3, 2),
    "x.as_strided((3, 3), (1, 2), 1)": lambda x: x.as_strided((3, 3), (1, 2), 1),
    "x.view(cols, rows)": lambda x: x.view(x.shape[1], x.shape[0]),
    "x.t().reshape(-1)   (copies)": lambda x: x.t().reshape(-1),
    "x.t().contiguous()  (copies)": lambda x: x.t().contiguous(),
}


def view_row(op: str, rows: int, cols: int) -> dict:
    """Apply a named example view op to x = arange(rows*cols).view(rows, cols); describe the result."""
    if op not in EXAMPLE_VIEWS:
        raise KeyError(f"unknown example view {op!r}; known: {list(EXAMPLE_VIEWS)}")
    x = torch.arange(rows * cols, dtype=torch.float32).view(rows, cols)
    y = EXAMPLE_VIEWS[op](x)
    shares = y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return {
        "op": op,
        "sizes": tuple(y.shape),
        "strides": tuple(y.stride()),
        "offset": y.storage_offset(),
        "contiguous": y.is_contiguous(),
        "shares_storage": shares,
        "storage_numel": storage_numel(y),
    }


def view_explorer():
    """A dropdown of view ops and sliders for x's shape; shows the strides and the storage picture."""
    import ipywidgets as widgets

    from labkernels.results import Table
    from labkernels.widgets import SweepWidget

    def compute(op: str, rows: int, cols: int) -> Table:
        return Table([view_row(op, rows, cols)])

    def plot(table: Table, ax) -> None:
        r = table.rows[0]
        where = "same storage as x" if r["shares_storage"] else "NEW storage (copied)"
        title = (
            f"{r['op']}: sizes {r['sizes']} strides {r['strides']} offset {r['offset']}\n"
            f"contiguous={r['contiguous']}, {where}"
        )
        draw_view(r["sizes"], r["strides"], r["offset"], r["storage_numel"], ax=ax, title=title)

    controls = {
        "op": widgets.Dropdown(options=list(EXAMPLE_VIEWS), value="x.t()", description="view"),
        "rows": widgets.IntSlider(value=3, min=3, max=5, description="x rows"),
        "cols": widgets.IntSlider(value=4, min=3, max=6, description="x cols"),
    }
    widget = SweepWidget(compute, plot, controls, run_label="Apply")
    for control in controls.values():
        control.observe(lambda _: widget.run(), names="value")
    widget.run()
    return widget
