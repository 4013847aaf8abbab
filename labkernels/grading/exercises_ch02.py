"""Chapter 02 exercises: where a view's element lives, what a chain of view ops does to (sizes, strides,
offset), and a Triton copy kernel correct on any 3-D view.

Every answer is checked against torch itself on views built at grading time. Exercise 2.2 is graded on chains
that each hold at least one op `labkernels.ch02_strides.views` does not model (unfold, diagonal, squeeze), so
no shipped function answers it. The copy kernel reads views whose unread storage cells hold NaN (a read
outside the view shows up in the result) and writes into a NaN-poisoned output inside canary guard bands.
"""

from __future__ import annotations

import torch

from labkernels import size, traffic
from labkernels.ch02_strides import views
from labkernels.grading.core import CaseFailed, exercise
from labkernels.lane import DEVICE


def _numbered_storage(n: int) -> torch.Tensor:
    """A float64 storage whose every cell holds its own index: reading a view element tells where it lives."""
    return torch.arange(n, dtype=torch.float64)


@exercise(
    "2.1",
    "The storage position of a view element",
    points=3,
    timeout_s=60,
    forbids=("labkernels.ch02_strides.views",),
)
def _grade_2_1(student, g):
    # student(index, sizes, strides, offset) -> int
    def check_view(t: torch.Tensor, count: int = 25):
        for _ in range(count):
            index = tuple(g.randint(0, n - 1) for n in t.shape)
            got = student(index, tuple(t.shape), tuple(t.stride()), t.storage_offset())
            want = int(t[index].item())
            g.expect(
                isinstance(got, int) and not isinstance(got, bool), f"return an int, got {type(got).__name__}"
            )
            g.expect(
                got == want,
                f"index {index} of a view with sizes {tuple(t.shape)}, strides "
                f"{tuple(t.stride())}, offset {t.storage_offset()}: got {got}, torch reads {want}",
            )

    with g.case("contiguous 2-D and 3-D tensors", points=1):
        check_view(_numbered_storage(600)[: 7 * 9].view(7, 9))
        check_view(_numbered_storage(600)[: 4 * 5 * 6].view(4, 5, 6))
    with g.case("transposed, permuted and stepped views with an offset", points=1):
        base = _numbered_storage(2000)[g.randint(1, 40) :][: 8 * 9 * 10].view(8, 9, 10)
        check_view(base.permute(2, 0, 1))
        check_view(base[1::2, :, 3:].transpose(0, 2))
        check_view(base[:, 2, 1::3])
    with g.case("expanded (stride 0) and as_strided views", points=1):
        store = _numbered_storage(500)
        check_view(store[g.randint(0, 100) :][:12].view(3, 4)[1].expand(5, 4))
        check_view(store[:40].view(8, 5)[:, 2:3].expand(8, 6))
        check_view(store.as_strided((6, 4), (3, 1), g.randint(0, 50)))  # overlapping windows


def _as_result(value):
    sizes, strides, offset, contiguous = value
    return tuple(int(s) for s in sizes), tuple(int(s) for s in strides), int(offset), bool(contiguous)


# Ops that views.py does not model: every graded chain of 2.2 holds at least one of them.
NEW_VIEW_OPS = ("unfold", "diagonal", "squeeze")


def _new_view_op(t: torch.Tensor, rng, kind: str) -> tuple:
    """A random valid `kind` op (one of NEW_VIEW_OPS) for `t`, with dims sometimes negative, never empty; an
    unsqueeze where `t` has too few dims for it (the chain is then drawn again unless it holds a new op)."""
    nd = t.dim()
    if nd < (2 if kind == "diagonal" else 1):
        return ("unsqueeze", rng.randint(-nd - 1, nd))
    if kind == "diagonal":
        d1, d2 = rng.sample(range(nd), 2)
        k = rng.randint(1 - t.shape[d1], t.shape[d2] - 1)  # the diagonal keeps at least one element
        return (kind, k, d1 - rng.choice([0, nd]), d2 - rng.choice([0, nd]))
    if kind == "squeeze":
        ones = [d for d in range(nd) if t.shape[d] == 1]
        d = rng.choice(ones) if ones and rng.random() < 0.7 else rng.randrange(nd)  # else often a no-op
        return (kind, d - rng.choice([0, nd]))
    d = rng.randrange(nd)
    return ("unfold", d - rng.choice([0, nd]), rng.randint(1, t.shape[d]), rng.randint(1, 3))


def _apply_op(t: torch.Tensor, op: tuple) -> torch.Tensor:
    kind, *args = op
    if kind in NEW_VIEW_OPS:
        return getattr(t, kind)(*args)  # t.unfold(d, size, step), t.diagonal(k, d1, d2), t.squeeze(d)
    return views.apply_view_ops(t, [op])


def _random_chain(base: torch.Tensor, rng, kinds) -> tuple[list, torch.Tensor]:
    """1-4 random ops of `kinds` holding at least one of NEW_VIEW_OPS, and the view torch makes of them."""
    while True:
        t, ops = base, []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(list(kinds))
            op = _new_view_op(t, rng, kind) if kind in NEW_VIEW_OPS else views.random_view_op(t, rng, (kind,))
            ops.append(op)
            t = _apply_op(t, op)
        if any(op[0] in NEW_VIEW_OPS for op in ops):
            return ops, t


@exercise(
    "2.2",
    "Predict a view chain's sizes, strides, offset and contiguity",
    points=4,
    timeout_s=60,
    forbids=("labkernels.ch02_strides.views",),
)
def _grade_2_2(student, g):
    # student(sizes, strides, offset, ops) -> (sizes, strides, offset, is_contiguous)
    def check_chains(kinds, count: int, dims: int = 3):
        for _ in range(count):
            shape = [g.randint(1, 6) for _ in range(dims)]
            store = torch.empty(200 + 6**dims)
            base = store[g.randint(0, 100) :][: torch.Size(shape).numel()].view(shape)
            ops, t = _random_chain(base, g.random, kinds)
            want = (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous())
            try:
                got = _as_result(
                    student(tuple(base.shape), tuple(base.stride()), base.storage_offset(), list(ops))
                )
            except (TypeError, ValueError) as e:
                raise CaseFailed(
                    f"return (sizes, strides, offset, is_contiguous); got an error: {e}"
                ) from None
            g.expect(
                got == want,
                f"from sizes {tuple(base.shape)}, strides {tuple(base.stride())}, offset "
                f"{base.storage_offset()}, after {ops}: expected {want}, got {got}",
            )

    with g.case("unfold among transpose, slice and narrow", points=1):
        check_chains(("unfold", "transpose", "slice", "narrow"), 30)
    with g.case("diagonal among permute, select and slice", points=1):
        check_chains(("diagonal", "permute", "select", "slice"), 30)
    with g.case("squeeze among unsqueeze, expand and select", points=1):
        check_chains(("squeeze", "unsqueeze", "expand", "select"), 30)
    with g.case("random chains of every op", points=1):
        check_chains(views.VIEW_OPS + NEW_VIEW_OPS, 60)


# The (batch, rows, cols) views of 2.3, as (sizes, strides, offset) in a buffer; GUARD NaN cells before each.
GUARD = 37


def _view_3d(kind: str, b: int, m: int, n: int) -> tuple[tuple, tuple, int]:
    if kind == "contiguous":
        return (b, m, n), (m * n, n, 1), GUARD
    if kind == "transposed":  # x.transpose(1, 2) of a contiguous (b, n, m)
        return (b, m, n), (m * n, 1, m), GUARD
    if kind == "batch_innermost":  # x.permute(2, 0, 1) of a contiguous (m, n, b)
        return (b, m, n), (1, n * b, b), GUARD
    if kind == "stepped":  # x[1:, ::2, 2::3] of a contiguous (b + 1, 2m, 3n + 1)
        ld = 3 * n + 1
        return (b, m, n), (2 * m * ld, 2 * ld, 3), GUARD + 2 * m * ld + 2
    if kind == "batch_broadcast":  # one (m, n) matrix expanded over the batch
        return (b, m, n), (0, n, 1), GUARD
    if kind == "row_broadcast":  # x[:, :1, :].expand(b, m, n): one row per batch, read m times
        return (b, m, n), (n, 0, 1), GUARD + 1
    # x[1::2, :, 3:].permute(1, 2, 0) of a contiguous (2n + 1, b, m + 3)
    return (b, m, n), (m + 3, 1, 2 * b * (m + 3)), GUARD + b * (m + 3) + 3


def _poisoned_view(sizes, strides, offset, dtype: torch.dtype, g) -> torch.Tensor:
    """A view inside a NaN-filled buffer: only the cells the view reads hold (random) numbers."""
    top = views.span(sizes, strides, offset)[1]
    buffer = torch.full((top + 1 + GUARD,), float("nan"), dtype=dtype, device=DEVICE)
    view = buffer.as_strided(sizes, strides, offset)
    cells = torch.arange(buffer.numel(), device=DEVICE).as_strided(sizes, strides, offset).reshape(-1)
    if 0 in strides:  # several elements share a cell
        cells = cells.unique()
    buffer[cells] = torch.randn(cells.numel(), generator=g.generator).to(DEVICE, dtype)
    return view


@exercise(
    "2.3",
    "A Triton copy kernel correct on any 3-D view",
    points=5,
    speed_points=2,
    timeout_s=180,
    requires="triton",
)
def _grade_2_3(student, g):
    # student(x, out): copy the 3-D view x into the contiguous tensor out (same shape, dtype, device).
    batches = size(cpu=(2, 3), gpu=(2, 4))
    rows, cols = size(cpu=(20, 90), gpu=(300, 2000)), size(cpu=(20, 130), gpu=(300, 2000))

    def one(kind: str, dtype: torch.dtype = torch.float32):
        b, m, n = g.randint(*batches), g.randint(*rows), g.randint(*cols)
        m, n = (m if m % 16 else m + 3), (n if n % 16 else n + 5)  # never a multiple of a tile
        x = _poisoned_view(*_view_3d(kind, b, m, n), dtype, g)
        out = g.guarded_empty((b, m, n), dtype)
        student(x, out)
        g.check_close(out, x.clone(memory_format=torch.contiguous_format), atol=0, rtol=0)

    with g.case("a contiguous batch of matrices", points=1):
        one("contiguous")
    with g.case("transposed matrices, and the batch as the innermost dimension", points=1):
        one("transposed")
        one("batch_innermost")
    with g.case("a stepped view with a storage offset (x[1:, ::2, 2::3])", points=1):
        one("stepped")
    with g.case("expanded views (stride 0 along the batch, along the rows)", points=1):
        one("batch_broadcast")
        one("row_broadcast")
    with g.case("a permuted, narrowed, stepped float16 view", points=1):
        one("permuted_stepped", torch.float16)
    with g.case("bandwidth >= 60% of copy on a (4, 4096, 4096) float32 batch, matrices transposed", points=2,
                gpu_only=True):  # fmt: skip
        x = g.randn(4, 4096, 4096).transpose(1, 2)  # strides (4096², 1, 4096); a grader call first (skips)
        out = g.guarded_empty((4, 4096, 4096), torch.float32)
        student(x, out)
        g.check_close(out[:, ::97, ::89], x[:, ::97, ::89], atol=0, rtol=0)
        g.expect_bandwidth(
            lambda: student(x, out),
            traffic.transpose(4 * 4096, 4096, torch.float32),
            fraction=0.6,
            check=lambda x, out: g.check_close(out[:, ::97, ::89], x[:, ::97, ::89], atol=0, rtol=0),
        )
