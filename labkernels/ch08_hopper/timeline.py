"""Inside one program of the warp-specialized GEMM or the attention forward: when the producer warp waited
and issued, when the consumer warpgroups waited for data, computed and wrote their tiles.

`gemm.gemm_timeline` records the SM's cycle counter at each event of program 0 (`gemm.EVENTS`) and turns
cycles into nanoseconds with the program's own timer; the H200's record ships as ch08_timeline.csv. Here the
events become intervals, one lane per partition, and a picture. Both lanes draw the shipped record; a Hopper
GPU can draw its own beside it.
"""

from __future__ import annotations

from collections import defaultdict

# What each interval means, and its colour in the picture.
KINDS = {
    "waits for a free slot": "#d9d9d9",  # producer: the ring is full, the consumer has not released
    "issues TMA loads": "#1f77b4",
    "waits for data": "#ff7f0e",  # consumer: the slot's bytes have not arrived
    "MMA in flight": "#2ca02c",  # consumer: from issuing this step's wgmma to releasing the previous slot
    "epilogue": "#9467bd",  # the tile's wait for its last MMA, then registers -> shared -> TMA store
}
LANES = ("producer warp", "consumer warpgroups")
# The attention forward's record (attention.EVENTS): each consumer warpgroup on its own lane.
ATTENTION_KINDS = {
    "waits for a free slot": KINDS["waits for a free slot"],
    "issues TMA loads": KINDS["issues TMA loads"],
    "waits for K": "#ff7f0e",
    "softmax, next S in flight": "#d62728",  # exponentials on the SFUs while the tensor cores compute S
    "waits for V": "#ffbb78",
    "waits for its wgmmas": "#2ca02c",  # P V and the next S not yet back
    "epilogue": KINDS["epilogue"],
}
ATTENTION_LANES = ("producer warp", "consumer warpgroup 0", "consumer warpgroup 1")


def rows_from_marks(marks, events: tuple[str, ...]) -> list[dict]:
    """A kernel's (events, slots) int64 clock marks (-1: not reached) as rows (event, index, cycle, ns).
    The last event's row holds the program's (cycles, ns) at its start and (cycles, ns) at its end: cycles
    are counted from the start, and turned into ns at the program's own rate."""
    start, start_ns, end, end_ns = (int(marks[-1, i]) for i in range(4))
    ns_per_cycle = (end_ns - start_ns) / max(1, end - start)
    rows = []
    for event, name in enumerate(events[:-1]):
        for index, cycle in enumerate(marks[event].tolist()):
            if cycle >= 0:
                rows.append({"event": name, "index": index, "cycle": cycle - start,
                             "ns": (cycle - start) * ns_per_cycle})  # fmt: skip
    return rows


def _by_event(rows: list[dict]) -> dict[str, dict[int, float]]:
    events: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        events[r["event"]][int(r["index"])] = float(r["ns"])
    return events


def _is_attention(rows: list[dict]) -> bool:
    return any(r["event"].startswith("c0_") for r in rows)


def intervals(rows: list[dict]) -> list[tuple[str, str, float, float]]:
    """(lane, kind, start ns, end ns) for every load, K step and tile the rows record (the GEMM's or the
    attention forward's, by their events)."""
    e = _by_event(rows)
    spans = _producer_spans(e)
    if _is_attention(rows):
        for half in (0, 1):
            spans += _attention_consumer_spans(e, half)
        return [s for s in spans if s[3] >= s[2]]
    for i, start in sorted(e["consumer_wait"].items()):
        arrived, released = e["consumer_mma"].get(i), e["consumer_release"].get(i)
        if arrived is None or released is None:
            continue
        spans.append((LANES[1], "waits for data", start, arrived))
        spans.append((LANES[1], "MMA in flight", arrived, released))
    for t, start in sorted(e["epilogue_start"].items()):
        end = e["epilogue_end"].get(t)
        if end is not None:
            spans.append((LANES[1], "epilogue", start, end))
    return [s for s in spans if s[3] >= s[2]]


def _attention_consumer_spans(e: dict, half: int) -> list[tuple[str, str, float, float]]:
    lane, steps = ATTENTION_LANES[1 + half], ("wait_k", "s_issued", "softmax_done", "v_ready", "mma_done")
    kinds = ("waits for K", "softmax, next S in flight", "waits for V", "waits for its wgmmas")
    spans = []
    for j in sorted(e[f"c{half}_wait_k"]):
        marks = [e[f"c{half}_{step}"].get(j) for step in steps]
        if None not in marks:
            spans += [(lane, kind, a, b) for kind, a, b in zip(kinds, marks[:-1], marks[1:], strict=True)]
    start, end = e[f"c{half}_epilogue_start"].get(0), e[f"c{half}_epilogue_end"].get(0)
    if start is not None and end is not None:
        spans.append((lane, "epilogue", start, end))
    return spans


def _producer_spans(e: dict) -> list[tuple[str, str, float, float]]:
    spans = []
    for i, start in sorted(e["producer_wait"].items()):
        issued = e["producer_issue"].get(i)
        if issued is None:
            continue
        spans.append((LANES[0], "waits for a free slot", start, issued))
        following = e["producer_wait"].get(i + 1)
        if following is not None:
            spans.append((LANES[0], "issues TMA loads", issued, following))
    return spans


def shares(rows: list[dict]) -> dict[str, dict[str, float]]:
    """lane -> kind -> the fraction of that lane's recorded time spent so."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for lane, kind, start, end in intervals(rows):
        totals[lane][kind] += end - start
    out = {}
    for lane, kinds in totals.items():
        whole = sum(kinds.values())
        out[lane] = {kind: t / whole for kind, t in kinds.items()} if whole > 0 else {}
    return out


def concurrent_share(rows: list[dict], kind: str = "softmax, next S in flight") -> float:
    """Of consumer warpgroup 0's time in `kind`, the fraction during which warpgroup 1 is in `kind` too.
    Two warpgroups in ping-pong would keep it near 0 (one exponentiates while the other's wgmmas run); two
    that run in step put it near 1."""
    spans = intervals(rows)
    first = [(s, e) for lane, k, s, e in spans if lane == ATTENTION_LANES[1] and k == kind]
    second = [(s, e) for lane, k, s, e in spans if lane == ATTENTION_LANES[2] and k == kind]
    total = sum(e - s for s, e in first)
    if total <= 0:
        raise ValueError(f"warpgroup 0 spends no recorded time in {kind!r}")
    both = sum(max(0.0, min(e0, e1) - max(s0, s1)) for s0, e0 in first for s1, e1 in second)
    return both / total


def plot_timeline(rows: list[dict], ax, *, window_us: float | None = None, title: str = "") -> None:
    """One row of bars per lane, x in µs from the program's start; `window_us` shows only the start."""
    from matplotlib.patches import Patch

    spans = intervals(rows)
    lanes, kinds = (ATTENTION_LANES, ATTENTION_KINDS) if _is_attention(rows) else (LANES, KINDS)
    for y, lane in enumerate(lanes):
        for kind, colour in kinds.items():
            bars = [(s / 1e3, (e - s) / 1e3) for ln, k, s, e in spans if ln == lane and k == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=colour, linewidth=0)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlabel("µs from the program's start")
    if window_us is not None:
        ax.set_xlim(0, window_us)
    # beside the lanes, never over them or over the axis label
    ax.legend(handles=[Patch(color=c, label=k) for k, c in kinds.items()], loc="center left",
              bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")  # fmt: skip
    if title:
        ax.set_title(title)
