"""Reading what torch.compile generated: capture Inductor's output code and decode its kernel names.

`torch._inductor.utils.run_and_get_code(fn, *args)` runs a compiled function and returns the Python module
Inductor wrote for it, the same text `TORCH_LOGS=output_code` prints. Its kernels are named after what they
do and which aten ops of the original graph they fused:

    triton_poi_fused_add_mul_sigmoid_0     Triton, pointwise, fused add + mul + sigmoid, kernel #0
    triton_per_fused_add_mean_pow_..._1    Triton, persistent reduction (a whole row in one program)
    triton_red_fused_...                   Triton, reduction with a loop over the reduced dimension
    triton_tem_fused_mm_...                Triton template (a matmul from a template, e.g. max-autotune)
    cpp_fused_add_mul_sigmoid_0            C++ (the CPU backend's kernels)
    extern_kernels.mm / .addmm / .bmm      a library call (cuBLAS, oneDNN): nothing fused into it

The op list in a name is the set of original aten ops (sorted, `_to_copy` is a cast), truncated by
Inductor for very long chains; `ops_in` splits it back into op names.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import torch

KINDS = {
    "poi": "pointwise",
    "per": "persistent reduction",
    "red": "reduction",
    "tem": "template",
    "for": "foreach",
}
# aten op names that contain underscores: the decoder joins their parts back together.
MULTIWORD_OPS = (
    "_to_copy",
    "native_layer_norm",
    "native_batch_norm",
    "clamp_min",
    "clamp_max",
    "scalar_tensor",
    "constant_pad_nd",
    "masked_fill",
    "index_put",
    "new_zeros",
    "full_like",
    "zeros_like",
    "ones_like",
    "_softmax",
    "_log_softmax",
    "sigmoid_backward",
    "gelu_backward",
    "threshold_backward",
    "native_dropout",
    "mm_plus_mm",
    "bitwise_and",
    "bitwise_or",
    "logical_and",
    "logical_not",
    "where_self",
    "_unsafe_view",
)
_DEFINED = re.compile(r"^(triton_\w+|cpp_fused_\w+)\s*=\s*async_compile\.", re.MULTILINE)
_EXTERN = re.compile(r"extern_kernels\.(\w+)\(")


@dataclass(frozen=True)
class Kernel:
    """One kernel of a generated program, decoded from its name."""

    name: str
    backend: str  # "triton", "cpp" or "extern"
    kind: str  # pointwise, persistent reduction, reduction, template, foreach, cpp, library call
    ops: tuple[str, ...]  # the aten ops of the original graph it fused (from its name)


def ops_in(fused: str) -> tuple[str, ...]:
    """'_to_copy_add_mean_mul_pow_rsqrt' -> ('_to_copy', 'add', 'mean', 'mul', 'pow', 'rsqrt')."""
    words, ops, i = fused.split("_"), [], 0
    while i < len(words):
        if words[i] == "":  # a leading underscore: the op name starts with "_"
            words[i + 1] = "_" + words[i + 1] if i + 1 < len(words) else "_"
            i += 1
            continue
        for length in (4, 3, 2):
            candidate = "_".join(words[i : i + length])
            if candidate in MULTIWORD_OPS:
                ops.append(candidate)
                i += length
                break
        else:
            ops.append(words[i])
            i += 1
    return tuple(ops)


def decode(name: str) -> Kernel:
    """A Kernel from a generated kernel's name (or an `extern_kernels.<fn>` call's function name)."""
    match = re.fullmatch(r"triton_(poi|per|red|tem|for)_(?:fused_)?(.*?)(?:_\d+)?", name)
    if match:
        return Kernel(name, "triton", KINDS[match.group(1)], ops_in(match.group(2)))
    match = re.fullmatch(r"cpp_fused_(.*?)(?:_\d+)?", name)
    if match:
        return Kernel(name, "cpp", "cpp", ops_in(match.group(1)))
    match = re.fullmatch(r"(?:extern_kernels\.)?(\w+)", name)
    if match:
        return Kernel(name, "extern", "library call", (match.group(1),))
    raise ValueError(f"not an Inductor kernel name: {name!r}")


def kernels(code: str) -> list[Kernel]:
    """The kernels a generated program defines (Triton or C++), then the library calls it makes."""
    names = list(dict.fromkeys(_DEFINED.findall(code)))
    calls = list(dict.fromkeys(_EXTERN.findall(code)))
    return [decode(n) for n in names] + [decode(f"extern_kernels.{c}") for c in calls]


@dataclass
class Captured:
    """A compiled function's output, the code Inductor generated for it, and its kernels decoded."""

    output: object
    code: str
    kernels: list[Kernel]
    warnings: list[str] = field(default_factory=list)  # what the compiler warned about (e.g. TF32 left off)

    def fused_ops(self) -> list[tuple[str, ...]]:
        """Per generated kernel (library calls excluded), the ops it fused: the same in both lanes for
        graphs that both backends fuse alike."""
        return [k.ops for k in self.kernels if k.backend != "extern"]

    def library_calls(self) -> list[str]:
        return [k.ops[0] for k in self.kernels if k.backend == "extern"]

    def summary(self) -> str:
        lines = []
        for k in self.kernels:
            lines.append(f"{k.name:48s} {k.backend:6s} {k.kind:21s} fuses: {', '.join(k.ops)}")
        return "\n".join(lines)


def capture(fn, *args, **compile_options) -> Captured:
    """Compile `fn` with torch.compile(**compile_options), run it on args, and capture the generated code.
    A fresh compile each time (dynamo's caches are reset), so the code is always produced and returned."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    # Inductor warns on a GPU that float32 matmuls could use TF32: kept on the result, not printed, so the
    # capture's output is the same in both lanes (chapter 04 covers TF32).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output, codes = run_and_get_code(torch.compile(fn, **compile_options), *args)
    code = "\n".join(codes)
    return Captured(output, code, kernels(code), [str(w.message) for w in caught])


def kernel_source(code: str, name: str) -> str:
    """The source of one generated kernel, cut from the program text (Triton's `def` or C++'s body): from
    `name = async_compile...(` to the end of the line that closes the kernel's triple-quoted text, which
    is `''')` for C++ and `''', device_str='cuda')` for Triton."""
    start = code.find(f"{name} = async_compile.")
    if start < 0:
        raise KeyError(f"no kernel {name!r} in this code")
    opening = code.find("'''", start)
    closing = code.find("'''", opening + 3) if opening >= 0 else -1
    line_end = code.find("\n", closing) if closing >= 0 else -1
    return code[start : line_end if line_end >= 0 else len(code)]


# --- why Inductor fused or refused: its scheduler's fusion log ----------------------------------------------

_ROUND = re.compile(r"^===== attempting fusion \((\d+)/\d+\)")
_NODE = re.compile(
    r"^\s+(\w*SchedulerNode)\(name='(\w+)'\)"
    r"(?:, (\w+)\(\['\[[^\]]*\]', (?:'(\w+)', )?'origins=OrderedSet\(\[([^\]]*)\]\)')?"
)
_REFUSED = re.compile(r"^cannot fuse (\S+) with (\S+): (.*)$")
_FUSED = re.compile(r"^fusing (\S+) with (\S+)$")


@dataclass(frozen=True)
class Decision:
    """One pairing the scheduler considered in a fusion round."""

    round: int
    verdict: str  # "fused" or "refused"
    first: str  # scheduler nodes: "op1", or "op0_op1" once op0 and op1 are fused
    second: str
    reason: str  # the scheduler's reason for a refusal; "" for a fusion


@dataclass
class FusionLog:
    """What Inductor's scheduler said while it fused one compiled function (`TORCH_LOGS=fusion`)."""

    nodes: dict[str, tuple[str, tuple[str, ...]]]  # "op0" -> (kind, the graph's ops it computes)
    decisions: list[Decision]
    text: str  # the log itself
    kernels: list[Kernel] = field(default_factory=list)  # what was generated in the end (as `capture`)

    def ops(self, name: str) -> str:
        """'op0_op1' -> 'add + mean, pow': the ops of each node in a (fused) node name."""
        parts = re.findall(r"op\d+", name)
        return " + ".join(", ".join(self.nodes.get(p, ("", ("?",)))[1]) or "?" for p in parts)

    def library_calls(self) -> list[str]:
        """Nodes that are library calls (extern kernels): the scheduler never pairs them with anything."""
        return [name for name, (kind, _) in self.nodes.items() if kind == "library call"]

    def lines(self) -> list[str]:
        out = [f"{name}: {kind:12s} {', '.join(ops)}" for name, (kind, ops) in self.nodes.items()]
        for d in self.decisions:
            why = f": {d.reason}" if d.reason else ""
            out.append(f"round {d.round}: {d.verdict} {d.first} with {d.second}{why}")
        return out


def _graph_ops(origins: str) -> tuple[str, ...]:
    """'mul_2, mul, add_1, erf' (fx node names) -> ('add', 'erf', 'mul'): the ops, numbering dropped."""
    names = [o.strip() for o in origins.split(",") if o.strip()]
    return tuple(sorted({re.sub(r"_\d+$", "", n) for n in names}))


def parse_fusion_log(text: str) -> FusionLog:
    """The nodes and decisions of a fusion log's text (as `TORCH_LOGS=fusion` prints it, without prefixes)."""
    nodes, decisions, round_ = {}, [], 0
    for line in text.splitlines():
        if m := _ROUND.match(line):
            round_ = int(m.group(1))
        elif (m := _NODE.match(line)) and m.group(2) not in nodes:
            node_type, name, kind, reduction, origins = m.groups()
            if node_type.startswith("Extern"):
                nodes[name] = ("library call", ())
            elif kind is not None:
                label = f"{kind.lower()} ({reduction})" if reduction else kind.lower()
                nodes[name] = (label, _graph_ops(origins))
        elif m := _REFUSED.match(line):
            decisions.append(Decision(round_, "refused", m.group(1), m.group(2), m.group(3)))
        elif m := _FUSED.match(line):
            decisions.append(Decision(round_, "fused", m.group(1), m.group(2), ""))
    return FusionLog(nodes, decisions, text)


def fusion_log(fn, *args, **compile_options) -> FusionLog:
    """Compile `fn` afresh (no cache), run it on args, and return what the scheduler logged as it fused:
    each node's ops, then each round's fusions and refusals with their reasons. Nothing is printed."""
    import logging

    import torch._inductor.scheduler as scheduler

    log = scheduler.fusion_log  # the artifact logger TORCH_LOGS=fusion turns on
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler, level, propagate = Collect(logging.DEBUG), log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False  # into our list, not onto the notebook's stderr
    try:
        with torch._inductor.config.patch(fx_graph_cache=False):  # a cached graph is never scheduled: no log
            captured = capture(fn, *args, **compile_options)
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
    parsed = parse_fusion_log("\n".join(lines))
    parsed.kernels = captured.kernels
    calls = parsed.library_calls()
    if len(calls) == len(captured.library_calls()):  # the log names no library function: the code does
        for name, function in zip(calls, captured.library_calls(), strict=True):
            parsed.nodes[name] = ("library call", (function,))
    return parsed
