"""The figure helper: Agg backend, atomic and byte-stable PNGs, figures closed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sdbench.plotting import pyplot, save_png, subplots


def _figure():
    fig, ax = subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [3, 1, 2], marker="o")
    ax.set_title("probe")
    return fig


def test_agg_backend_and_byte_stable_png(tmp_path: Path) -> None:
    assert pyplot().get_backend().lower() == "agg"
    a, b = tmp_path / "a.png", tmp_path / "sub" / "b.png"
    save_png(_figure(), a, dpi=80)
    save_png(_figure(), b, dpi=80)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert a.read_bytes() == b.read_bytes()  # no "Software" (matplotlib version) entry, no timestamp
    assert b"matplotlib" not in a.read_bytes()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["a.png", "b.png"]
    assert pyplot().get_fignums() == []  # closed


def test_failed_save_leaves_nothing_and_closes(tmp_path: Path) -> None:
    fig = _figure()
    with pytest.raises(TypeError):
        save_png(fig, tmp_path / "bad.png", dpi=80, no_such_option=1)
    assert list(tmp_path.iterdir()) == []
    assert pyplot().get_fignums() == []


def test_adaptive_policies_wrap_into_a_grid_with_one_legend(tmp_path: Path) -> None:
    # The default's five datasets were one 2190 x 430 px strip (5.1:1).
    from PIL import Image

    from sdbench.simulator.figures import figure_adaptive

    rows = [dict(dataset=f"d{i}", policy=p, batch_size=b, speedup=1.0 + i / 10, best_fixed=1.0, oracle_combine=2.0)
            for i in range(5) for p in ("combined:adaptive", "eagle:dynamic-k") for b in (1, 4, 8)]  # fmt: skip
    out = tmp_path / "ext04.png"
    figure_adaptive(pd.DataFrame(rows), out)
    w, h = Image.open(out).size
    assert w <= 3000 and w / h <= 4.0
