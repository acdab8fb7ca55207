"""The figure helper: Agg backend, atomic and byte-stable PNGs, figures closed."""

from __future__ import annotations

from pathlib import Path

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
