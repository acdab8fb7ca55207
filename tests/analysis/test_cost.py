"""Cost per 1M output tokens and per request (sdbench.analysis.cost)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from sdbench.analysis import cost


def _cell(method: str, bs: int, tps: float, speedup: float, model: str = "m") -> dict:
    sd = "none" if method == "none" else "ngram"
    return {
        "engine": "e", "model": model, "dataset": "d", "method": method, "batch_size": bs, "sd_method": sd,
        "tokens_per_s": tps, "tokens_per_s_ci_low": 0.9 * tps, "tokens_per_s_ci_high": 1.1 * tps,
        "output_len_mean": 100.0, "speedup": speedup, "speedup_ci_low": 0.95 * speedup,
        "speedup_ci_high": 1.05 * speedup,
    }  # fmt: skip


CELLS = pd.DataFrame([_cell("none", 1, 100.0, 1.0), _cell("ngram", 1, 170.0, 2.0), _cell("none", 8, 400.0, 1.0)])


def test_cost_follows_price_throughput_and_devices() -> None:
    table = cost.cost_table(CELLS, {"e": 3.6}, {"m": 2}, "USD")
    none1 = table[(table.method == "none") & (table.batch_size == 1)].iloc[0]
    # 7.2 per hour for 2 devices / (100 tok/s x 3600 s) x 1e6 tokens = 20 per 1M tokens
    assert none1["price_per_hour"] == pytest.approx(7.2)
    assert none1["cost_per_1m_tokens"] == pytest.approx(20.0)
    assert none1["cost_per_request"] == pytest.approx(20.0 / 1e6 * 100)
    assert none1["cost_per_1m_tokens_ci_low"] < 20.0 < none1["cost_per_1m_tokens_ci_high"]
    # The SD cell: its no-SD cell's throughput x its (paired) speedup, not its own absolute number.
    sd = table[table.method == "ngram"].iloc[0]
    assert sd["tokens_per_s"] == pytest.approx(200.0)
    assert sd["cost_per_1m_tokens"] == pytest.approx(10.0) and sd["cost_vs_no_sd"] == pytest.approx(0.5)
    assert sd["cost_vs_no_sd_ci_low"] == pytest.approx(1 / 2.1) and sd["cost_vs_no_sd_ci_high"] == pytest.approx(1 / 1.9)
    assert list(table.method) == ["ngram", "none", "none"]  # sorted by cell keys


def test_missing_price_or_baseline_is_named() -> None:
    with pytest.raises(ValueError, match=r"no price for engine\(s\) \['e'\]"):
        cost.cost_table(CELLS, {"other": 1.0}, {}, "USD")
    with pytest.raises(ValueError, match="no no-SD cell for .*'batch_size': 4"):
        cost.cost_table(pd.concat([CELLS, pd.DataFrame([_cell("ngram", 4, 1.0, 1.0)])]), {"e": 1.0}, {}, "USD")
    with pytest.raises(ValueError, match="lacks columns"):
        cost.cost_table(CELLS.drop(columns="speedup"), {"e": 1.0}, {}, "USD")


def test_cost_command_writes_table_markdown_and_figure(tmp_path: Path) -> None:
    from sdbench.cli import main

    CELLS.to_parquet(tmp_path / "cells.parquet")
    out = {k: tmp_path / f"cost.{k}" for k in ("parquet", "md", "png")}
    argv = ["cost", "--cells", str(tmp_path / "cells.parquet"), "--prices", json.dumps({"e": 2.0}),
            "--source", "test price", "--output", str(out["parquet"]), "--markdown", str(out["md"]),
            "--figure", str(out["png"])]  # fmt: skip
    assert main(argv) == 0
    assert len(pd.read_parquet(out["parquet"])) == 3
    text = out["md"].read_text()
    assert "(test price)" in text and "| e | m | d | ngram | 1 |" in text and "0.50 [0.48, 0.53]" in text
    assert out["png"].stat().st_size > 5_000
    assert main([*argv[:4], json.dumps({"e": -1}), *argv[5:]]) == 2
