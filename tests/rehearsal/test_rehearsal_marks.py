"""``sdbench rehearsal marks``: every figure and Markdown table of a rehearsal's results/paper is
marked exactly when its data is a rehearsal's (sdbench.rehearsal.report.marks_table).

Files are written here by hand (PNG text chunks with Pillow, drawn tables as CSV), not by the
package's plotting code, so that the check is judged against files whose marks are known."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
from PIL import Image, PngImagePlugin

from sdbench.plotting import PNG_MARK_KEY
from sdbench.provenance import MARK
from sdbench.rehearsal.report import marks_report, marks_table


def png(path: Path, marked: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    info = PngImagePlugin.PngInfo()
    if marked:
        info.add_text(PNG_MARK_KEY, MARK)
    Image.new("RGB", (4, 4)).save(path, pnginfo=info)


def drawn(path: Path, measured: list[bool]) -> None:
    pd.DataFrame({"panel": "p", "x": range(len(measured)), "measured": measured}).to_csv(path, index=False)


def paper(root: Path, *, fig_marked: bool = True, md_marked: bool = True) -> Path:
    d = root / "results" / "paper"
    png(d / "fig01_end_to_end.png", fig_marked)  # rehearsal data: one mark from a rehearsal row
    drawn(d / "fig01_end_to_end.csv", [True, False])
    png(d / "fig09_fixed_vs_oracle" / "published" / "exact.png", False)  # the authors' traces
    drawn(d / "fig09_fixed_vs_oracle" / "published" / "exact.csv", [True, True])
    (d / "ext01_speedups.md").write_text((f"> **Rehearsal, not measured.** x\n" if md_marked else "") + "| a |\n")
    (d / "tab04_generated_length").mkdir()
    (d / "tab04_generated_length" / "published.md").write_text("| a |\n")
    return d


def test_a_marked_rehearsal_passes_and_the_authors_data_stays_unmarked(tmp_path: Path) -> None:
    table = marks_table(paper(tmp_path))
    got = {r.path: (r.rehearsal_data, r.marked) for r in table.itertuples()}
    assert got == {"fig01_end_to_end.png": (True, True), "fig09_fixed_vs_oracle/published/exact.png": (False, False),
                   "ext01_speedups.md": (True, True), "tab04_generated_length/published.md": (False, False)}  # fmt: skip
    expect = ["fig01_end_to_end", "fig09_fixed_vs_oracle", "ext01_speedups", "tab04_generated_length"]
    text, ok = marks_report(table, expect)
    assert ok, text
    _, ok = marks_report(table, [*expect, "fig03_runtime_breakdown"])
    assert not ok  # an expected item without a file


def test_an_unmarked_rehearsal_figure_or_table_fails_in_one_line_each(tmp_path: Path) -> None:
    for kwargs, bad in (({"fig_marked": False}, "fig01_end_to_end.png"), ({"md_marked": False}, "ext01_speedups.md")):
        root = tmp_path / bad
        paper(root, **kwargs)
        out = subprocess.run([str(Path(sys.executable).with_name("sdbench")), "rehearsal", "marks", "--paper-dir",
                              str(root / "results" / "paper"), "--expect", "fig01_end_to_end"],
                             capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 1, out.stdout + out.stderr
        assert [line for line in out.stdout.splitlines() if line.startswith("- ") and "marked:" in line] == [
            f"- {bad} (rehearsal data: True, marked: False)"]


def test_a_mark_on_measured_data_fails(tmp_path: Path) -> None:
    d = paper(tmp_path)
    png(d / "fig09_fixed_vs_oracle" / "published" / "exact.png", True)
    _, ok = marks_report(marks_table(d), ["fig01_end_to_end"])
    assert not ok


def test_the_report_is_written_where_asked(tmp_path: Path) -> None:
    d = paper(tmp_path)
    out = tmp_path / "marks.md"
    done = subprocess.run([str(Path(sys.executable).with_name("sdbench")), "rehearsal", "marks", "--paper-dir", str(d),
                           "--expect", "--markdown", str(out)], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("# results/paper: 4 figure-index items, 4 figures and Markdown tables")
