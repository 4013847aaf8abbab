"""The prose of every notebook says only what its cells print, and every cell can be addressed.

A measured number typed into a sentence goes stale the day `make bench` records new references, and nbval
cannot see it. So every number in a notebook's markdown that looks like a result — a percentage, a ratio
(`1.67×`, `2x`), a bandwidth (GB/s) or a throughput (TFLOP/s) — must also appear, with the same unit and to
the precision the prose gives, in the output of a cell of that notebook that nbval checks (not
`nbval-ignore-output`: those outputs differ by lane, so they cannot back a sentence). Reference tables are the
same in both lanes, so the cells that print them are checked, and a change in a CSV shows up as an nbval
failure *and* here as a stale sentence.

Exempt: text inside quotation marks (common claims, quoted in order to check them), inline code,
code blocks and LaTeX; and the few constants on ALLOWED below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted(
    (ROOT / "notebooks/appendix").glob("*.ipynb")
)

NUMBER = r"(\d{1,3}(?:[,\u202f\u2009]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
KINDS = {
    "percentage": re.compile(rf"(?<![\w.]){NUMBER}\s?%"),
    "ratio": re.compile(rf"(?<![\w.]){NUMBER}[×x](?!\w)"),  # "1.67×", "2x"; not "64x96" nor "128 × 128"
    "bandwidth": re.compile(rf"(?<![\w.]){NUMBER}\s?[MGT]B/s"),
    "throughput": re.compile(rf"(?<![\w.]){NUMBER}\s?[GTP]FLOP/s"),
}

# (notebook or "*", kind, number as written): constants of a definition or a formula, not measurements. Keep
# it short, and say why for each.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("*", "percentage", "100%"): "all of the copy bandwidth: the definition of the ceiling, not a result",
    ("*", "percentage", "33%"): "the article's misprinted fusion saving, 2T/(4T + 2T) = 1/3",
    ("*", "percentage", "40%"): "the fusion saving of the traffic model, (5n - 3n) / 5n: a formula's value",
}

EXEMPT = [
    re.compile(r"```.*?```", re.S),  # code blocks
    re.compile(r"`[^`]*`"),  # inline code
    re.compile(r"\$\$.*?\$\$", re.S),  # display math
    re.compile(r"\$[^$]*\$"),  # inline math
    re.compile(r'"[^"]{0,300}"'),  # quotations of the claims being checked
    re.compile(r"“[^”]{0,300}”"),
]


def _prose(source: str) -> str:
    for pattern in EXEMPT:
        source = pattern.sub(" ", source)
    return source


def _value(text: str) -> str:
    return re.sub(r"[,\u202f\u2009]", "", text)


def _same(prose: str, printed: str) -> bool:
    """`printed` rounds to `prose` at the precision the prose gives (1.69 matches 1.6883; 7 matches 7.1)."""
    decimals = len(prose.split(".")[1]) if "." in prose else 0
    return f"{float(printed):.{decimals}f}" == f"{float(prose):.{decimals}f}"


def _checked_output(cells: list[dict]) -> str:
    texts = []
    for cell in cells:
        if cell["cell_type"] != "code" or "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            texts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(texts)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def unbacked_numbers(path: Path) -> list[str]:
    """One message per number in the notebook's markdown that no checked cell prints."""
    cells = json.loads(path.read_text())["cells"]
    printed = _checked_output(cells)
    printed_by_kind = {kind: [_value(m) for m in rx.findall(printed)] for kind, rx in KINDS.items()}
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        prose = _prose("".join(cell["source"]))
        for kind, rx in KINDS.items():
            for match in rx.finditer(prose):
                number = _value(match.group(1))
                if {(path.name, kind, match.group(0).strip()), ("*", kind, match.group(0).strip())} & set(
                    ALLOWED
                ):
                    continue
                if any(_same(number, p) for p in printed_by_kind[kind]):
                    continue
                line = prose[max(0, match.start() - 50) : match.end() + 20].replace("\n", " ").strip()
                problems.append(
                    f"{_shown(path)}, markdown cell {i} (id {cell.get('id')}): the {kind} "
                    f"{match.group(0).strip()!r} is printed by no checked cell. Context: …{line}…"
                )
    return problems


HOW_TO_FIX = """
How to fix: print the number from a cell whose output nbval checks (no `nbval-ignore-output` tag) —
compute it from the shipped CSV (labkernels.results.load_reference) or from labkernels.traffic, with the same
unit and at least the precision the sentence gives — then re-execute the notebook
(`python -m labkernels execute <notebook>`). Or reword the sentence so it points at the printed value
instead of repeating it. Quote a number only if it is a claim being checked, in quotation marks. A constant
of a formula (not a measurement) may go on ALLOWED in tests/test_prose.py, with the reason."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_number_in_the_prose_is_printed_by_a_checked_cell(path):
    problems = unbacked_numbers(path)
    assert not problems, "\n".join(problems) + "\n" + HOW_TO_FIX


def test_the_prose_check_can_fail(tmp_path):
    nb = {
        "cells": [
            {
                "cell_type": "markdown",
                "id": "a",
                "metadata": {},
                "source": 'It runs 1.69× faster, "1.5×" said X.',
            },
            {
                "cell_type": "code",
                "id": "b",
                "metadata": {},
                "source": "",
                "execution_count": 1,
                "outputs": [{"output_type": "stream", "name": "stdout", "text": "speed-up 1.6883x\n"}],
            },
        ]
    }
    path = tmp_path / "99_selftest.ipynb"
    path.write_text(json.dumps(nb))
    assert unbacked_numbers(path) == []  # 1.6883x rounds to 1.69; "1.5×" is a quotation
    nb["cells"][1]["outputs"][0]["text"] = "speed-up 1.62x\n"
    path.write_text(json.dumps(nb))
    assert len(unbacked_numbers(path)) == 1
    nb["cells"][1]["metadata"]["tags"] = ["nbval-ignore-output"]  # lane-dependent output backs nothing
    nb["cells"][1]["outputs"][0]["text"] = "speed-up 1.69x\n"
    path.write_text(json.dumps(nb))
    problems = unbacked_numbers(path)
    assert "99_selftest.ipynb, markdown cell 0 (id a): the ratio '1.69×'" in problems[0]


CELL_FOLDERS = ("notebooks", "notebooks/appendix", "solutions", "exercises")


@pytest.mark.parametrize(
    "path",
    [p for folder in CELL_FOLDERS for p in sorted((ROOT / folder).glob("*.ipynb"))],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_cell_has_a_unique_id(path):
    """nbformat 4.5 files need an id per cell; without one JupyterLab adds it on open and marks the notebook
    modified, and nbval warns. Read the raw JSON: nbformat.read fills missing ids in memory and hides them."""
    raw = json.loads(path.read_text())
    if (raw["nbformat"], raw["nbformat_minor"]) < (4, 5):
        pytest.fail(f"{path.name}: nbformat {raw['nbformat']}.{raw['nbformat_minor']}; cells need ids (4.5)")
    missing = [i for i, c in enumerate(raw["cells"]) if not c.get("id")]
    where = path.relative_to(ROOT)
    assert not missing, f"{where}: cells {missing} have no id (nbformat.validator.normalize adds them)"
    ids = [c["id"] for c in raw["cells"]]
    assert len(set(ids)) == len(ids), f"{where}: repeated cell ids"


MAIN_NOTEBOOK_MARKDOWN = 15_000  # characters: a chapter is a lesson; deep dives go to notebooks/appendix/


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.name)
def test_a_chapter_is_a_lesson_not_a_lab_log(path):
    cells = json.loads(path.read_text())["cells"]
    size = sum(len("".join(c["source"])) for c in cells if c["cell_type"] == "markdown")
    assert size <= MAIN_NOTEBOOK_MARKDOWN, f"{path.name}: {size} characters of markdown; move deep dives out"


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks/appendix").glob("*.ipynb")), ids=lambda p: p.name)
def test_an_appendix_opens_with_a_summary_and_is_linked_from_its_chapter(path):
    first = json.loads(path.read_text())["cells"][0]
    summary = "".join(first["source"]) if first["cell_type"] == "markdown" else ""
    assert len(summary) > 200, f"{path.name}: does not open with a summary"
    chapters = list((ROOT / "notebooks").glob(f"{path.name[:2]}_*.ipynb"))
    assert chapters, f"{path.name}: no chapter {path.name[:2]} notebook"
    assert f"appendix/{path.name}" in chapters[0].read_text(), f"{chapters[0].name} does not link {path.name}"


# --- whose claims ----------------------------------------------------------------------------------------

#: Ways of pointing at a document the learner never saw: the course checks public claims, and cites them as
#: such ("a common claim", or the claim with its public source), never as "the article" or "the seed".
PRIVATE_SOURCE = re.compile(
    r"(?i)\bthe seed\b|\bseed['\u2019]s\b|\bseed\s+(?:article|0\d\d)\b|\bsource article\b|\bthe article\b"
    r"|\barticle['\u2019]s\b|\bSEED_[A-Z]"
)
LEARNER_FACING = ("notebooks", "exercises", "solutions", "labkernels", "instructors")


def private_source_citations(root: Path) -> list[str]:
    """Each line of learner-facing text (notebook cells and outputs, package code and its messages, guides)
    that points at a private source."""
    files = [root / "README.md"]
    for folder in LEARNER_FACING:
        for pattern in ("*.ipynb", "*.py", "*.md", "*.cpp", "*.cu", "*.h", "*.cuh", "*.csv"):
            files += sorted((root / folder).rglob(pattern))
    problems = []
    for path in files:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if '"image/' in line:
                continue
            match = PRIVATE_SOURCE.search(line)
            if match:
                where = f"{path.relative_to(root)}:{number}"
                problems.append(f"{where}: {match.group(0)!r} in {line.strip()[:100]!r}")
    return problems


def test_no_learner_facing_text_cites_a_private_source():
    """Before, notebooks 00, 02 and 03 cited "the source article" and two package comments "the seed's"."""
    problems = private_source_citations(ROOT)
    assert not problems, "cite the public claim or call it a common claim:\n" + "\n".join(problems)


def test_the_private_source_check_can_fail(tmp_path):
    (tmp_path / "README.md").write_text("Fine: torch.manual_seed(0), seeded inputs, a common claim.\n")
    (tmp_path / "labkernels").mkdir()
    (tmp_path / "labkernels" / "a.py").write_text("SEED_EXAMPLE = 1  # the seed's shape\nrng = seed\n")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "00.ipynb").write_text('{"source": ["The article says 2x."]}\n')
    found = private_source_citations(tmp_path)
    where = sorted(f.split(":")[0:2] for f in found)
    assert where == [["labkernels/a.py", "1"], ["notebooks/00.ipynb", "1"]]
