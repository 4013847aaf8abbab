"""Chapter 02: view arithmetic vs torch, and every stride-aware kernel on random views.

Views come from `random_2d_view`: every storage cell a view does not read holds NaN, so a kernel that reads
outside its view returns NaN and fails the exact comparison. Outputs sit inside canary guard bands.
"""

from __future__ import annotations

import random

import pytest
import torch

import labkernels
from labkernels.ch02_strides import triton_strided as T
from labkernels.ch02_strides import views as V

HAS_CUDA = torch.cuda.is_available()
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")]
CPP_DEVICES = ["cpu", pytest.param("cuda", marks=gpu)]
CANARY = -7777.25
# copies are exact; add+relu rounds once per element in every implementation
TOL = {torch.float16: (1e-3, 1e-3), torch.float32: (1e-6, 1e-6), torch.float64: (1e-12, 1e-12)}


def guarded_out(shape, dtype, device, guard=64):
    """A NaN-poisoned contiguous output inside canary guard bands; returns (out, check)."""
    numel = torch.Size(shape).numel()
    buffer = torch.full((guard + numel + guard,), CANARY, dtype=dtype, device=device)
    out = buffer[guard : guard + numel].view(shape)
    out.fill_(float("nan"))

    def check():
        assert bool((buffer[:guard] == CANARY).all()), "wrote before the output"
        assert bool((buffer[guard + numel :] == CANARY).all()), "wrote after the output"

    return out, check


# --- the arithmetic, against torch --------------------------------------------------------------------------


def test_predict_view_matches_torch_on_random_chains():
    rng = random.Random(2)
    for _ in range(300):
        base = torch.empty(rng.randint(1, 5), rng.randint(1, 6), rng.randint(1, 4))
        t, ops = base, []
        for _ in range(rng.randint(1, 6)):
            ops.append(V.random_view_op(t, rng))
            t = V.apply_view_ops(t, ops[-1:])
        predicted = V.predict_view(base.shape, base.stride(), base.storage_offset(), ops)
        assert predicted == (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.is_contiguous()), ops


def test_storage_offset_of_is_the_real_storage_position():
    rng = random.Random(3)
    storage = torch.arange(400, dtype=torch.float64)  # each cell holds its own index
    for _ in range(200):
        t = storage[rng.randint(0, 20) :].view(-1)[:360].view(6, 6, 10)
        t = V.apply_view_ops(t, [("permute", tuple(rng.sample(range(3), 3))), ("slice", 2, 1, 6, 2)])
        index = tuple(rng.randrange(n) for n in t.shape)
        expected = int(t[index].item())
        assert V.storage_offset_of(index, t.shape, t.stride(), t.storage_offset()) == expected
        assert V.address_of(t, index) == t.data_ptr() + (expected - t.storage_offset()) * 8
    with pytest.raises(IndexError, match="out of range"):
        V.storage_offset_of((3, 0), (3, 4), (4, 1), 0)


def test_positions_span_contiguity_and_overrun():
    x = torch.arange(24.0).view(4, 6)
    assert V.storage_positions(x.t())[1].tolist() == [1, 7, 13, 19]
    assert V.span((4, 3), (1, 6), 2) == (2, 2 + 3 + 12)
    assert V.is_contiguous((3, 1, 4), (4, 99, 1)) and not V.is_contiguous((3, 4), (1, 3))
    for view in (x.t(), x[:, 4:], x[2:, 1:], x[::2, ::3], x.narrow(1, 3, 3)):  # distinct cells: no overrun
        assert V.flat_read_overrun_bytes(view) == 0
    assert V.flat_read_overrun_bytes(x[-1].expand(4, 6)) == (18 + 24 - 24) * 4
    assert V.may_overlap(x[:2], x[1:]) and not V.may_overlap(x[:2], x[2:])


@pytest.mark.parametrize("kind", V.VIEW_KINDS)
def test_random_view_poisons_everything_else(kind):
    v = V.random_2d_view(5, 7, kind)
    assert not v.isnan().any()
    buffer = torch.as_strided(v, (V.storage_numel(v),), (1,), 0)
    touched = V.storage_positions(v).unique()
    assert int(buffer.isnan().sum()) == buffer.numel() - touched.numel()


def test_picture_and_widget():
    import matplotlib

    matplotlib.use("Agg")
    ax = V.draw_view((4, 3), (1, 4), 0, 12)
    assert len(ax.patches) == 12 + 12
    widget = V.view_explorer()
    for op in V.EXAMPLE_VIEWS:
        widget.controls["op"].value = op  # observed: recomputes
        row = widget.table.rows[0]
        assert row["op"] == op and widget.figure is not None
    widget.controls["op"].value = "x.t().contiguous()  (copies)"
    assert widget.table.rows[0]["shares_storage"] is False
    widget.controls["op"].value = "x[:, :1].expand(-1, 3)"
    assert widget.table.rows[0]["strides"][1] == 0


# --- Triton kernels -----------------------------------------------------------------------------------------

TRITON_COPIES = {
    "naive": T.copy_2d_naive,
    "tiled_16x32": lambda x, out=None: T.copy_2d_tiled(x, out, block_m=16, block_n=32),
}


@pytest.mark.parametrize("kind", V.VIEW_KINDS)
@pytest.mark.parametrize("impl", list(TRITON_COPIES))
def test_triton_copies_on_random_views(kind, impl):
    x = V.random_2d_view(37, 53, kind, device=labkernels.DEVICE)
    out, check = guarded_out(x.shape, x.dtype, x.device)
    result = TRITON_COPIES[impl](x, out)
    check()
    assert result is out
    torch.testing.assert_close(out, T.reference(x), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["transpose", "step", "expand_cols"])
def test_triton_tiled_autotuned(kind):
    x = V.random_2d_view(45, 70, kind, device=labkernels.DEVICE)
    torch.testing.assert_close(T.copy_2d_tiled(x), T.reference(x), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_triton_copies_dtypes(dtype):
    x = V.random_2d_view(33, 20, "offset_transpose_step", dtype=dtype, device=labkernels.DEVICE)
    for fn in TRITON_COPIES.values():
        torch.testing.assert_close(fn(x), T.reference(x), atol=0, rtol=0)


@pytest.mark.parametrize("kind_y", ["expand_rows", "transpose", "expand_cols"])
def test_triton_add_relu_on_views(kind_y):
    x = V.random_2d_view(37, 53, "step", device=labkernels.DEVICE)
    y = V.random_2d_view(37, 53, kind_y, device=labkernels.DEVICE)
    out, check = guarded_out(x.shape, x.dtype, x.device)
    T.add_relu_2d(x, y, out)
    check()
    atol, rtol = TOL[torch.float32]
    torch.testing.assert_close(
        out, T.reference_add_relu(x.double(), y.double()).float(), atol=atol, rtol=rtol
    )


def test_contiguous_only_kernel_is_wrong_on_a_transpose_and_guarded():
    x = torch.randn(8, 8, device=labkernels.DEVICE)
    wrong = T.copy_flat(x.t(), check_contiguous=False)  # same storage, wrong order
    torch.testing.assert_close(wrong, x, atol=0, rtol=0)
    assert not torch.equal(wrong, x.t())
    torch.testing.assert_close(T.copy_flat(x.t().contiguous()), x.t(), atol=0, rtol=0)
    with pytest.raises(ValueError, match="needs a contiguous x"):
        T.copy_flat(x.t())
    with pytest.raises(ValueError, match="bytes past its end"):
        T.copy_flat(x[-1].expand(8, 8), check_contiguous=False)


BAD_TRITON = [T.copy_2d_naive, T.copy_2d_tiled, lambda x, out=None: T.copy_flat(x, out)]


@pytest.mark.parametrize("fn", BAD_TRITON)
def test_triton_bad_inputs(fn):
    dev = labkernels.DEVICE
    x = torch.randn(6, 5, device=dev)
    with pytest.raises(ValueError, match="is on meta"):
        fn(torch.empty(6, 5, device="meta"))
    with pytest.raises(TypeError, match="dtype"):
        fn(torch.ones(6, 5, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="out has shape"):
        fn(x, torch.empty(5, 6, device=dev))
    with pytest.raises(ValueError, match="out must be contiguous"):
        fn(x, torch.empty(5, 6, device=dev).t())
    buffer = torch.randn(60, device=dev)
    with pytest.raises(ValueError, match="overlaps x"):
        fn(buffer[:30].view(6, 5), buffer[10:40].view(6, 5))
    with pytest.raises(ValueError, match="positive"):
        fn(torch.empty(0, 5, device=dev))


def test_triton_bad_shapes():
    dev = labkernels.DEVICE
    with pytest.raises(ValueError, match="2-D"):
        T.copy_2d_naive(torch.randn(2, 3, 4, device=dev))
    with pytest.raises(ValueError, match="same shape"):
        T.add_relu_2d(torch.randn(3, 4, device=dev), torch.randn(4, 3, device=dev))
    with pytest.raises(ValueError, match="power of two"):
        T.copy_2d_tiled(torch.randn(3, 4, device=dev), block_m=24, block_n=32)
    x = torch.randn(6, 6, device=dev)
    with pytest.raises(ValueError, match="overlaps y"):
        T.add_relu_2d(torch.randn(6, 6, device=dev), x.t(), x)


# --- C++ / CUDA ops -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ops():
    from labkernels.ch02_strides import ops

    ops.ensure_loaded()
    return ops


@pytest.mark.parametrize("device", CPP_DEVICES)
@pytest.mark.parametrize("kind", V.VIEW_KINDS)
def test_cpp_copies_on_random_views(ops, device, kind):
    x = V.random_2d_view(37, 53, kind, device=device)
    for fn in (ops.copy_strided, ops.copy_2d_tiled):
        out, check = guarded_out(x.shape, x.dtype, x.device)
        fn(x, out)
        check()
        torch.testing.assert_close(out, T.reference(x), atol=0, rtol=0)


@pytest.mark.parametrize("device", CPP_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cpp_any_rank_and_dtypes(ops, device, dtype):
    base = torch.randn(70, 9, 11, dtype=torch.float64).to(device=device, dtype=dtype)
    x = base[3::2, :, 1:].permute(2, 0, 1)  # (10, 34, 9): every stride changed, an offset
    torch.testing.assert_close(ops.copy_strided(x), x.contiguous(), atol=0, rtol=0)
    y = torch.randn(34, 1, dtype=torch.float64).to(device=device, dtype=dtype).expand(10, 34, 9)  # stride 0
    atol, rtol = TOL.get(dtype, (1e-2, 1e-2))
    expected = torch.relu(x.double() + y.double()).to(dtype)
    torch.testing.assert_close(ops.add_relu_strided(x, y), expected, atol=atol, rtol=rtol)
    big = torch.randn(300, 200, dtype=torch.float64).to(device=device, dtype=dtype)  # several tiles/threads
    torch.testing.assert_close(ops.copy_2d_tiled(big.t()), big.t().contiguous(), atol=0, rtol=0)


@pytest.mark.parametrize("device", CPP_DEVICES)
def test_cpp_bad_inputs(ops, device):
    x = torch.randn(6, 5, device=device)
    for fn in (ops.copy_strided, ops.copy_2d_tiled):
        with pytest.raises(ValueError, match="cpu or cuda"):
            fn(torch.empty(6, 5, device="meta"))
        with pytest.raises(TypeError, match="dtype"):
            fn(torch.ones(6, 5, dtype=torch.int64, device=device))
        with pytest.raises(ValueError, match="out has shape"):
            fn(x, torch.empty(5, 6, device=device))
        with pytest.raises(ValueError, match="out must be contiguous"):
            fn(x, torch.empty(5, 6, device=device).t())
        buffer = torch.randn(60, device=device)
        with pytest.raises(ValueError, match="overlaps x"):
            fn(buffer[:30].view(6, 5).t(), buffer[25:55].view(5, 6))
    with pytest.raises(ValueError, match="2-D"):
        ops.copy_2d_tiled(torch.randn(2, 3, 4, device=device))
    with pytest.raises(ValueError, match="same shape"):
        ops.add_relu_strided(x, torch.randn(5, 6, device=device))
    if device == "cuda":
        with pytest.raises(ValueError, match="one device"):
            ops.add_relu_strided(x, x.cpu())


@pytest.mark.parametrize("device", CPP_DEVICES)
def test_cpp_checks_in_cpp_too(ops, device):
    """The C++ impls check on their own: calling the raw op skips the Python checks."""
    buffer = torch.randn(60, device=device)
    x, out = buffer[:30].view(6, 5), buffer[20:50].view(6, 5)
    with pytest.raises(RuntimeError, match="out overlaps x"):
        torch.ops.labkernels.copy_strided_out.default(x, out)
    with pytest.raises(RuntimeError, match="out must be contiguous"):
        torch.ops.labkernels.copy_2d_tiled_out.default(x, torch.empty(5, 6, device=device).t())
    with pytest.raises(RuntimeError, match="same shape"):
        torch.ops.labkernels.add_relu_strided_out.default(x, x, torch.empty(5, 6, device=device))


@pytest.mark.parametrize("device", CPP_DEVICES)
def test_cpp_opcheck(ops, device):
    x = torch.randn(7, 5, device=device).t()
    y = torch.randn(5, 1, device=device).expand(5, 7)
    torch.library.opcheck(torch.ops.labkernels.copy_strided.default, (x,))
    torch.library.opcheck(torch.ops.labkernels.copy_2d_tiled.default, (x,))
    torch.library.opcheck(torch.ops.labkernels.add_relu_strided.default, (x, y))
    torch.library.opcheck(
        torch.ops.labkernels.copy_strided_out.default, (x, torch.empty(5, 7, device=device))
    )


# --- measurement helpers ------------------------------------------------------------------------------------


def test_break_even_uses():
    from labkernels.ch02_strides import bench
    from labkernels.results import Table

    rows = [
        {"n": 8, "impl": "torch .contiguous()", "ms": 2.0},
        {"n": 8, "impl": "kernel alone (contiguous input)", "ms": 1.0},
        {"n": 8, "impl": "slow", "ms": 5.0},
        {"n": 8, "impl": "fast", "ms": 1.0},
    ]
    assert bench.break_even_uses(Table(rows), 8, "slow") == 0.5
    assert bench.break_even_uses(Table(rows), 8, "fast") == float("inf")


def test_transpose_widget_runs_a_small_sweep():
    import matplotlib

    matplotlib.use("Agg")
    from labkernels.ch02_strides import bench

    widget = bench.transpose_widget()
    widget.controls["largest"].value = bench.SIZES[0]
    widget.controls["impls"].value = ("torch .contiguous()",)
    table = widget.run()
    assert table.column("impl") == ["torch .contiguous()"] and table.column("n") == [bench.SIZES[0]]
    assert table.rows[0]["gbps"] > 0 and widget.figure is not None
