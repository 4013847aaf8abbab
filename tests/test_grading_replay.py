"""The grader's replay of a Triton answer's launches (labkernels.grading.replay): what is recorded, what the
timing worker refuses, and how it makes and keeps the timed repetitions. The replay itself runs on a GPU
(tests/test_grading.py, T.2)."""

import copy
import json

import pytest
import torch

from labkernels.grading import child, replay
from labkernels.grading.replay import ReplayError, describe_arg, validate


def test_a_pointer_into_an_argument_is_recorded_as_that_argument_and_an_offset():
    x, out = torch.randn(10, 7), torch.empty(33)
    template, scratch = [x, out], {}
    assert describe_arg(x, template, scratch) == ["tensor", 0, 0]
    assert describe_arg(x[2:], template, scratch) == ["tensor", 0, 2 * 7 * 4]
    assert describe_arg(out[5:], template, scratch) == ["tensor", 1, 5 * 4]
    assert describe_arg(x.t(), template, scratch) == ["tensor", 0, 0]  # same first element, other strides
    assert scratch == {}


def test_a_buffer_the_wrapper_made_is_scratch_with_its_bytes_as_before_the_launch():
    x = torch.randn(8)
    mine = torch.full((6,), 3.0)
    template, scratch = [x], {}
    assert describe_arg(mine[2:], template, scratch) == ["scratch", 0, 8]
    mine.fill_(0.0)  # what a later launch writes is not what the replay starts from
    (index, nbytes, raw) = scratch[mine.untyped_storage().data_ptr()]
    assert (index, nbytes) == (0, 24)
    assert torch.equal(raw.view(torch.float32), torch.full((6,), 3.0))
    assert describe_arg(mine, template, scratch) == ["scratch", 0, 0]  # the same buffer again


def test_numbers_are_values_constexprs_are_dropped_and_host_descriptors_are_refused():
    assert describe_arg(7, [], {}) == ["value", 7]
    assert describe_arg(0.5, [], {}) == ["value", 0.5]
    assert describe_arg(None, [], {}) == ["value", None]
    assert describe_arg(object(), [], {}) == ["value", None]

    class TensorDescriptor:
        pass

    with pytest.raises(ReplayError, match="TensorDescriptor"):
        describe_arg(TensorDescriptor(), [], {})


def _record():
    meta = {"name": "twice_kernel", "target": {"backend": "cuda", "arch": 90, "warp_size": 32}}
    kernel = {
        "hash": "abc",
        "cubin": b"\x7fELF",
        "metadata": json.dumps(meta),
        "signature": [["x_ptr", "*fp32"], ["out_ptr", "*fp32"], ["n", "i32"], ["BLOCK", "constexpr"]],
    }
    launch = {"kernel": 0, "grid": [128, 1, 1], "args": [["tensor", 0, 0], ["scratch", 0, 4], ["value", 9],
                                                         ["value", None]]}  # fmt: skip
    return {"kernels": [kernel], "launches": [launch], "scratch": [torch.zeros(16, dtype=torch.uint8)]}


def _broken(edit):
    record = copy.deepcopy(_record())
    edit(record)
    return record


def test_a_well_formed_record_passes_validation():
    validate(_record())


@pytest.mark.parametrize(
    "edit, what",
    [
        (lambda r: r["kernels"][0]["signature"].__setitem__(2, ["n", 'i32); system("id"); //']), "type"),
        (lambda r: r["kernels"][0]["signature"].__setitem__(0, ["x ptr", "*fp32"]), "name"),
        (lambda r: r["kernels"][0].__setitem__("metadata", json.dumps({"name": "k;", "target": {}})), "name"),
        (lambda r: r["kernels"][0].__setitem__("metadata", json.dumps(
            {"name": "k", "target": {"backend": "hip", "arch": 90, "warp_size": 32}})), "target"),
        (lambda r: r["kernels"][0].__setitem__("metadata", "{not json"), "metadata"),
        (lambda r: r["kernels"][0].__setitem__("cubin", "text"), "binary"),
        (lambda r: r["launches"][0].__setitem__("grid", [0, 1, 1]), "grid"),
        (lambda r: r["launches"][0].__setitem__("grid", [1, 1 << 16, 1]), "grid"),
        (lambda r: r["launches"][0].__setitem__("kernel", 1), "kernel"),
        (lambda r: r["launches"][0]["args"].pop(), "argument count"),
        (lambda r: r["launches"][0]["args"].__setitem__(0, ["tensor", 0, -4]), "pointer"),
        (lambda r: r["launches"][0]["args"].__setitem__(1, ["scratch", 1, 0]), "scratch"),
        (lambda r: r["launches"][0]["args"].__setitem__(2, ["value", "os.system"]), "scalar"),
        (lambda r: r["launches"][0]["args"].__setitem__(2, ["call", 9]), "argument"),
        (lambda r: r.__setitem__("launches", []), "launch list"),
    ],
)
def test_a_malformed_record_is_refused_before_anything_is_built(edit, what):
    with pytest.raises(ReplayError, match=what):
        validate(_broken(edit))


def _worker(entry, order):
    worker = object.__new__(child.Worker)
    worker.entry, worker.requires = entry, None

    def guarded(fn, args, kwargs, requires):
        fn(*args, **kwargs)
        return {"status": "ok"}

    def timed(fn, args, kwargs):
        fn(*args, **kwargs)
        return 0.5

    worker.guarded, worker._timed = guarded, timed
    return worker


def test_each_timed_set_is_made_just_before_its_call_and_only_kept_sets_stay(monkeypatch):
    from labkernels.grading import core

    order = []
    made = core.make_variants

    def make(*args, **kwargs):
        order.append("make")
        return made(*args, **kwargs)

    monkeypatch.setattr(core, "make_variants", make)

    def entry(x, out):
        order.append("call")
        out.copy_(2 * x + 1)

    worker = _worker(entry, order)
    x, out = torch.randn(50), torch.empty(50)
    msg = {"args": (x, out), "kwargs": {}, "outputs": [False, True], "seed": 5, "warmup": 1, "reps": 3}
    reply = worker.time({**msg, "keep": [2]})
    assert reply["result"] == [0.5, 0.5, 0.5]
    assert order == ["make", "call"] * 4  # no set exists before the call that uses it
    assert list(worker.variants) == [2]
    fresh = core.make_variants([x, out], [False, True], 3, 5, only=2)[0]
    assert torch.equal(worker.variants[2][0], 2 * fresh[0] + 1)
    assert worker.handle({"op": "fetch", "indices": [1]})["status"] == "raised"  # not kept: not sent
    assert list(worker.time(msg) and worker.variants) == [0, 1, 2, 3]  # without `keep`, every set


def test_recording_is_refused_off_the_gpu_lane():
    worker = object.__new__(child.Worker)
    worker.recorder = None
    reply = worker.record({"args": (), "kwargs": {}})
    assert reply["status"] == "raised" and "GPU lane" in reply["reason"]


def test_a_recorder_that_saw_no_kernel_says_there_is_nothing_to_time():
    recorder = replay.LaunchRecorder()
    recorder.start([torch.zeros(3)])
    with pytest.raises(ReplayError, match="no compiled Triton kernel"):
        recorder.finish()
