"""Nothing computed from a rehearsal passes for a measurement (sdbench.provenance): the ``measured``
flag of the inputs reaches every table, figure and Markdown file a command writes."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from PIL import Image

from sdbench import provenance
from sdbench.cli import main
from sdbench.plotting import save_png, subplots

BANNER_START = "> **Rehearsal, not measured.** Drawn from rehearsal data (`measured` = false in "


def summaries(tmp_path: Path, measured: bool | None) -> list[str]:
    """Two cells' summary.parquet (no SD at 100 tokens/s, n-gram at 150): ``measured`` as given,
    or no such column (a run written before it existed)."""
    paths = []
    for method, sd, tps in (("none", "none", 100.0), ("ngram-k3", "ngram", 150.0)):
        row = {"engine": "e", "model": "m", "dataset": "d", "method": method, "batch_size": 1, "sd_method": sd,
               "num_speculative_tokens": 0 if sd == "none" else 3, "tokens_per_s": tps,
               "tokens_per_s_ci_low": tps * 0.95, "tokens_per_s_ci_high": tps * 1.05, "tokens_per_s_pooled": tps,
               "tokens_per_s_boot": [tps * 0.97, tps, tps * 1.03],
               "mean_acceptance_length": float("nan") if sd == "none" else 2.0,
               "acceptance_rate_per_pos": [] if sd == "none" else [0.5, 0.3, 0.2]}  # fmt: skip
        if measured is not None:
            row["measured"] = measured
        path = tmp_path / f"{method}.parquet"
        pd.DataFrame([row]).to_parquet(path)
        paths.append(str(path))
    return paths


def run_analyses(tmp_path: Path, measured: bool | None) -> Path:
    """``sdbench aggregate``, ``verdict`` and ``plot-throughput`` on :func:`summaries`."""
    out = tmp_path / "out"
    cells = str(out / "cells.parquet")
    assert main(["aggregate", "--summaries", *summaries(tmp_path, measured), "--baseline", "none",
                 "--cells", cells, "--speedups-md", str(out / "speedups.md")]) == 0  # fmt: skip
    assert main(["verdict", "--cells", cells, "--output", str(out / "verdict.parquet"),
                 "--markdown", str(out / "verdict.md"), "--figure", str(out / "verdict.png")]) == 0  # fmt: skip
    assert main(["plot-throughput", "--cells", cells, "--output", str(out / "fig01.png")]) == 0
    return out


def test_a_rehearsal_is_said_in_every_table_markdown_and_figure(tmp_path: Path) -> None:
    out = run_analyses(tmp_path, measured=False)
    for table in ("cells", "verdict"):
        path = out / f"{table}.parquet"
        assert pd.read_parquet(path)["measured"].tolist() == ([False, False] if table == "cells" else [False])
        assert pq.read_schema(path).metadata[b"sdbench.measured"] == b"false"
    # The verdict says so in its first line, naming what it was drawn from (the cells table).
    first = (out / "verdict.md").read_text().splitlines()[0]
    assert first == (f"{BANNER_START}`{out / 'cells.parquet'}`): a stand-in engine's preview, not a measurement.")
    assert (out / "speedups.md").read_text().startswith(BANNER_START)
    for png in ("verdict.png", "fig01.png"):
        assert Image.open(out / png).text.get("Warning") == "rehearsal, not measured"
        assert pd.read_csv((out / png).with_suffix(".csv"))["measured"].eq(False).all()


@pytest.mark.parametrize("measured", [True, None], ids=["measured", "no-column"])
def test_a_measured_run_has_no_mark(tmp_path: Path, measured: bool | None) -> None:
    out = run_analyses(tmp_path, measured=measured)
    assert pd.read_parquet(out / "cells.parquet")["measured"].tolist() == [True, True]
    assert pq.read_schema(out / "verdict.parquet").metadata[b"sdbench.measured"] == b"true"
    assert (out / "verdict.md").read_text().startswith("# Does speculative decoding pay here?")
    assert "Warning" not in Image.open(out / "verdict.png").text
    assert pd.read_csv(out / "fig01.csv")["measured"].eq(True).all()


def test_a_table_without_the_column_is_a_measurement() -> None:
    with provenance.command_scope(stamp=True):
        provenance.observe(pd.DataFrame({"a": [1]}), "older-run.parquet")  # written before the column existed
        provenance.observe(pd.DataFrame({"measured": [True, None]}), "partly-filled.parquet")
        assert provenance.measured()
        provenance.observe(pd.DataFrame({"measured": [True, False]}), "rehearsal.parquet")
        assert provenance.rehearsal_sources() == ["rehearsal.parquet"]


def test_one_rehearsal_row_makes_the_whole_output_a_rehearsal(tmp_path: Path) -> None:
    paths = summaries(tmp_path, measured=True)
    pd.read_parquet(paths[1]).assign(measured=False).to_parquet(paths[1])  # the n-gram cell only
    cells = tmp_path / "cells.parquet"
    assert main(["aggregate", "--summaries", *paths, "--baseline", "none", "--cells", str(cells)]) == 0
    assert pd.read_parquet(cells)["measured"].tolist() == [False, False]


def _figure(title: str | None) -> object:
    fig, ax = subplots(figsize=(4, 3))
    ax.plot([1, 2], [3, 4])
    if title:
        fig.suptitle(title)
    return fig


def _texts(fig: object) -> list[str]:
    """Every text drawn on ``fig``: its own texts, its suptitle and its axes' texts and titles."""
    texts = [t.get_text() for t in fig.texts]  # type: ignore[attr-defined]
    for ax in fig.axes:  # type: ignore[attr-defined]
        texts += [t.get_text() for t in ax.texts] + [ax.get_title()]
    return texts


def test_save_png_marks_a_rehearsal_figure_across_it_and_in_its_title(tmp_path: Path) -> None:
    rehearsal = pd.DataFrame({"measured": [True, False]})
    with provenance.command_scope(stamp=True):
        provenance.observe(rehearsal, "cells.parquet")
        titled, untitled = _figure("Fig. 1"), _figure(None)
        save_png(titled, tmp_path / "a.png", dpi=50)
        save_png(untitled, tmp_path / "b.png", dpi=50)
    assert "REHEARSAL, NOT MEASURED" in _texts(titled)
    assert titled._suptitle.get_text() == "Fig. 1 (rehearsal, not measured)"
    assert "REHEARSAL, NOT MEASURED" in _texts(untitled) and "(rehearsal, not measured)" in _texts(untitled)
    with provenance.command_scope(stamp=True):
        provenance.observe(rehearsal.assign(measured=True), "cells.parquet")
        plain = _figure("Fig. 1")
        save_png(plain, tmp_path / "c.png", dpi=50)
    assert not [t for t in _texts(plain) if "rehearsal" in t.lower()] and plain._suptitle.get_text() == "Fig. 1"


def test_the_flag_is_read_from_a_table_read_without_its_column(tmp_path: Path) -> None:
    """A command reading only some columns of a rehearsal table (schema metadata) is still a rehearsal."""
    table = tmp_path / "t.parquet"
    with provenance.command_scope(stamp=True):
        provenance.observe(pd.DataFrame({"measured": [False]}), "x")
        from sdbench.io import read_parquet, write_parquet

        write_parquet(pd.DataFrame({"a": [1, 2]}), table)
    with provenance.command_scope(stamp=True):
        read_parquet(table, columns=["a"])
        assert not provenance.measured() and provenance.rehearsal_sources() == [str(table)]
    assert provenance.measured()  # outside a command nothing is observed


def test_a_summary_row_says_whether_its_engine_was_a_rehearsal() -> None:
    from sdbench.engine.measure.summary import summarise

    calls = pd.DataFrame({"num_drafts": [0], "num_draft_tokens": [0], "num_accepted_tokens": [0],
                          "accepted_per_pos": [[]], "tokens_per_s": [10.0], "num_output_tokens": [10],
                          "duration_s": [1.0], "request_id": ["r"], "trial": [0], "call_index": [0]})  # fmt: skip
    requests = pd.DataFrame({"num_output_tokens": [10], "finish_reason": ["stop"]})
    spec = {"seed": 0, "cell": {"method": "none"}, "method": {"method": "none"}, "run": {}}
    keys = {"engine": "e", "model": "m", "dataset": "d", "method": "none", "batch_size": 1}
    assert summarise(keys, spec, calls, requests)["measured"].tolist() == [True]
    assert summarise(keys, {**spec, "engine_mode": "rehearsal"}, calls, requests)["measured"].tolist() == [False]
    assert summarise(keys, spec, calls.assign(measured=False), requests)["measured"].tolist() == [False]


def test_a_server_cell_says_whether_its_client_was_a_rehearsal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server level loop (sdbench.engine.serving.servegroup.measure_levels) writes its client's
    ``measured`` into both of a cell's tables: False from a rehearsal's client, True from HTTP's."""
    from types import SimpleNamespace

    from sdbench.engine.serving import servegroup
    from sdbench.engine.measure.counters import SDCounters
    from sdbench.engine.serving.loadgen import RequestResult

    looked_up: list[bool] = []  # the hardware facts (seconds to gather) are not this test's
    monkeypatch.setattr(servegroup, "provenance", lambda gpus, **kw: looked_up.append(gpus) or {"hardware": "h"})

    def run_level(num_requests: int, round_: int, **level: object) -> tuple[list[RequestResult], float]:
        results = [RequestResult(round_, i, f"r{i}", 3, 4, 0.0, 0.1, 0.4, 0.1, 2, [0.3]) for i in range(num_requests)]
        return results, 1.0

    server = SimpleNamespace(base_url="http://x", startup_s=1.0, check_alive=lambda: None)
    spec = {"server": {"concurrency": [1], "rounds": 1, "requests_per_level": 2, "warmup_requests": 0}, "run": {},
            "group": {"engine": "e", "model": "m", "method": "ngram-k3"},
            "datasets": {"d": {"num_prompts": 1, "max_tokens": 4}},
            "method": {"method": "ngram", "num_speculative_tokens": 3}}  # fmt: skip
    prompts = {"d": pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [[1, 2, 3]]})}
    for measured in (False, True):
        counters = lambda url: SDCounters(0, 0, 0, ())  # noqa: E731
        client = SimpleNamespace(run_level=run_level, read_metrics=counters, measured=measured)
        tables = servegroup.measure_levels(server, spec, prompts, "disabled", client=client)  # type: ignore[arg-type]
        (cell,) = tables.values()
        assert cell["summary"]["measured"].tolist() == [measured]
        assert cell["requests"]["measured"].tolist() == [measured, measured]
    assert looked_up == [False, True]  # a rehearsal looks up no GPU


def test_a_cost_model_fitted_from_rehearsal_steps_carries_the_flag(tmp_path: Path) -> None:
    from sdbench.simulator.costmodel import load_cost_model

    rows = [{"method": m, "batch_size": 1, "num_batched_tokens": b, "num_kv_tokens": kv, "num_proposed_tokens": p,
             "verify_s": 0.01 + 1e-5 * kv + 1e-4 * b, "propose_s": 0.002 * (m == "ngram"), "step_s": 0.02 + 1e-5 * kv,
             "measured": False}
            for m, p in (("none", 0), ("ngram", 3)) for b, kv in ((1, 100), (4, 400), (8, 900), (2, 50))]  # fmt: skip
    steps, model = tmp_path / "steps.csv", tmp_path / "measured.yaml"
    pd.DataFrame(rows).to_csv(steps, index=False)
    assert main(["costmodel", "fit", "--steps", str(steps), "--output", str(model), "--name", "measured"]) == 0
    assert load_cost_model(model).fit["measured"] is False
    with provenance.command_scope(stamp=True):  # a simulation on it is a rehearsal
        load_cost_model(model)
        assert not provenance.measured()
