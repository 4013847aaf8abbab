"""The interpreter's memory-access tracer (CPU lane only): who touched which element, masks, strides."""

import pytest  # noqa: I001  (labkernels before triton: it sets the lane)
import torch

import labkernels
from labkernels.trace import OTHER, plot_accesses, trace_accesses

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpreterBuilder

pytestmark = pytest.mark.skipif(labkernels.on_gpu(), reason="the tracer reads the Triton interpreter")


@triton.jit
def _copy_kernel(x_ptr, out_ptr, n_elements, stride_x, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    tl.store(out_ptr + offs, tl.load(x_ptr + offs * stride_x, mask=mask), mask=mask)  # read n, write n


def _copy(x, out, n, stride, block):
    _copy_kernel[(triton.cdiv(n, block),)](x, out, n, stride, BLOCK_SIZE=block)


def test_each_program_touches_its_block_and_masks_the_tail():
    n, block = 10, 4
    x, out = torch.randn(n), torch.full((n,), float("nan"))
    with trace_accesses(x=x, out=out) as tr:
        _copy(x, out, n, 1, block)
    torch.testing.assert_close(out, x, rtol=0, atol=0)
    expected = {(0, 0, 0): [0, 1, 2, 3], (1, 0, 0): [4, 5, 6, 7], (2, 0, 0): [8, 9]}
    assert tr.touched("x", "load") == expected
    assert tr.touched("out", "store") == expected
    assert tr.touched("x", "store") == {} and tr.touched("out", "load") == {}
    # the last program's lanes 2 and 3 point past n: recorded, masked, never read or written
    assert tr.masked("x", "load") == {(2, 0, 0): [10, 11]}
    assert tr.masked("out", "store") == {(2, 0, 0): [10, 11]}
    last = [a for a in tr.of("x", "load") if a.pid == (2, 0, 0)][0]
    assert last.mask.tolist() == [True, True, False, False]
    owner, masked = tr.owner_map("x", 12, "load")
    assert owner.tolist() == [0] * 4 + [1] * 4 + [2, 2, -1, -1]
    assert masked.tolist() == [False] * 10 + [True, True]


def test_strided_column_read_shows_the_stride():
    rows, cols = 5, 6  # read column 1 of a (5, 6) matrix: elements 1, 7, 13, ... six apart
    m, out = torch.randn(rows, cols), torch.full((rows,), float("nan"))
    col = m[:, 1]
    with trace_accesses(m=m, out=out) as tr:
        _copy(col, out, rows, col.stride(0), 2)
    torch.testing.assert_close(out, col, rtol=0, atol=0)
    assert tr.touched("m", "load") == {(0, 0, 0): [1, 7], (1, 0, 0): [13, 19], (2, 0, 0): [25]}
    assert tr.masked("m", "load") == {(2, 0, 0): [31]}  # one past the matrix's last row
    assert tr.touched("out", "store") == {(0, 0, 0): [0, 1], (1, 0, 0): [2, 3], (2, 0, 0): [4]}


def test_addresses_outside_the_named_tensors_are_other():
    x, out = torch.randn(8), torch.full((8,), float("nan"))
    with trace_accesses(x=x) as tr:
        _copy(x, out, 8, 1, 8)
    assert tr.touched("x", "load") == {(0, 0, 0): list(range(8))}
    stores = tr.of(OTHER, "store")
    assert len(stores) == 1 and stores[0].index.tolist() == [out.data_ptr() + 4 * i for i in range(8)]


def test_patching_is_undone_after_the_block_and_after_an_error():
    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    x, out = torch.randn(4), torch.empty(4)
    with trace_accesses(x=x) as tr:
        assert InterpreterBuilder.create_masked_load is not load
    assert (InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store) == (load, store)
    with pytest.raises(RuntimeError, match="inside"):
        with trace_accesses(x=x):
            raise RuntimeError("inside the block")
    assert (InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store) == (load, store)
    _copy(x, out, 4, 1, 4)  # runs untraced now
    assert tr.accesses == []


def test_rejects_a_non_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        with trace_accesses(x=[1, 2]):
            pass


def test_plot_marks_owners_and_masked_lanes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, out = torch.randn(6), torch.empty(6)
    with trace_accesses(x=x) as tr:
        _copy(x, out, 6, 1, 4)
    ax = plot_accesses(tr, "x", (2, 4), kind="load")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["pid 0", "pid 1", "masked lane"]
    assert len(ax.patches) == 2  # the two masked lanes, hatched
    plt.close(ax.figure)
