"""Chapter 02 exercises: where a view's element lives, what a chain of view ops does to (sizes, strides,
offset), and a Triton copy kernel correct on any 2-D view.

Every answer is checked against torch itself on views built at grading time. The copy kernel reads views whose
unread storage cells hold NaN (a read outside the view shows up in the result) and writes into a NaN-poisoned
output inside canary guard bands.
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
            t, ops = base, []
            for _ in range(g.randint(1, 4)):
                ops.append(views.random_view_op(t, g.random, kinds))
                t = views.apply_view_ops(t, ops[-1:])
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

    with g.case("transpose and permute", points=1):
        check_chains(("transpose", "permute"), 30)
    with g.case("slice with steps, narrow and select", points=1):
        check_chains(("slice", "narrow", "select"), 30)
    with g.case("expand and unsqueeze", points=1):
        check_chains(("expand", "unsqueeze"), 30)
    with g.case("random chains of every op", points=1):
        check_chains(views.VIEW_OPS, 60)


@exercise(
    "2.3",
    "A Triton copy kernel correct on any 2-D view",
    points=5,
    speed_points=2,
    timeout_s=180,
    requires="triton",
)
def _grade_2_3(student, g):
    # student(x, out): copy the 2-D view x into the contiguous tensor out (same shape, dtype, device).
    rows, cols = size(cpu=(20, 90), gpu=(500, 3000)), size(cpu=(20, 130), gpu=(500, 3000))

    def one(kind: str, dtype: torch.dtype = torch.float32):
        m, n = g.randint(*rows), g.randint(*cols)
        m, n = (m if m % 16 else m + 3), (n if n % 16 else n + 5)  # never a multiple of a tile
        x = views.random_2d_view(m, n, kind, dtype=dtype, device=DEVICE, generator=g.generator)
        out = g.guarded_empty((m, n), dtype)
        student(x, out)
        g.check_close(out, x.clone(memory_format=torch.contiguous_format), atol=0, rtol=0)

    with g.case("a contiguous matrix", points=1):
        one("contiguous")
    with g.case("a transposed matrix (strides (1, M))", points=1):
        one("transpose")
    with g.case("stepped and offset views (x[::2, ::3], x[3:, 5:])", points=1):
        one("step")
        one("offset")
    with g.case("expanded views (stride 0 along rows, along columns)", points=1):
        one("expand_rows")
        one("expand_cols")
    with g.case("a transposed, narrowed, stepped float16 view", points=1):
        one("offset_transpose_step", torch.float16)
    with g.case("bandwidth >= 60% of copy on a transposed 8192 x 8192 float32", points=2, gpu_only=True):
        x = g.randn(8192, 8192).t()  # strides (1, 8192); a grader call first, so a skipped case stops here
        out = g.guarded_empty((8192, 8192), torch.float32)
        student(x, out)
        g.check_close(out[::97, ::89], x[::97, ::89], atol=0, rtol=0)
        g.expect_bandwidth(
            lambda: student(x, out),
            traffic.transpose(8192, 8192, torch.float32),
            fraction=0.6,
            check=lambda x, out: g.check_close(out[::97, ::89], x[::97, ::89], atol=0, rtol=0),
        )
