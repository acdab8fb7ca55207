"""A finished run's figures against its data tables: each drawn table (read back from the figure,
``results/paper/<item>[/<scope>].csv``) checked mark by mark against the data tables the run wrote,
with the expected values computed here by hand formulas (a mean, a median over trials, a quantile,
the verdict's rule), never by the package function that computed the figure.

:func:`check_run` checks every PNG under ``results/paper/`` and returns, per item, the marks
checked; a PNG without its CSV, or of an item without a checker here, is an error. The end-to-end
test (tests/e2e/test_pipeline_e2e.py) runs it on the pipeline's output; tests/analysis/test_drawncheck.py on a
small hand-made run directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

# How the figures name and colour a method (docs/figures.md): written out here, not imported.
FAMILY_LABELS = {"none": "w/o SD", "ngram": "n-gram", "eagle": "EAGLE", "eagle3": "EAGLE-3", "draft_model": "draft model",
                 "mtp": "MTP", "medusa": "Medusa", "suffix": "suffix"}  # fmt: skip
FAMILY_COLORS = {"none": "#444444", "ngram": "#e6821e", "eagle": "#1f6fb4", "eagle3": "#2ca02c",
                 "draft_model": "#8c52b8", "mtp": "#d62728", "medusa": "#e377c2"}  # fmt: skip
VERDICT_COLORS = {"pays": "#b7e4b0", "break-even": "#e6e6e6", "loses": "#f4b6b0", "undecided": "#c9d7ee",
                  "not judged": "#ffffff", "flagged": "#fbe3a1"}  # fmt: skip
STAGE_COLORS = {"propose": "#4c72b0", "verify": "#dd8452", "sample": "#55a868", "other": "#8c8c8c"}
TOL = 1e-9  # drawn values are floats written to CSV and read back


# ----------------------------------------------------------------------------- small helpers
def verdict_rule(low: float, high: float, flagged: bool = False, margin: float = 0.03) -> str:
    """The verdict on a speedup's 95% interval: above 1 pays, below 1 loses, inside [1/(1+margin),
    1+margin] break-even, else undecided; no interval: not judged; a point preempted, contaminated
    or measured on two kinds of machine is flagged, whatever its interval."""
    if flagged:
        return "flagged"
    if low != low or high != high:
        return "not judged"
    if low > 1 or high < 1:
        return "pays" if low > 1 else "loses"
    return "break-even" if 1 / (1 + margin) <= low and high <= 1 + margin else "undecided"


def _flag(row: object, *columns: str) -> bool:
    """Whether any of ``columns`` is true on ``row`` (absent or NaN: false)."""
    return any(bool(getattr(row, c, False)) and getattr(row, c) == getattr(row, c) for c in columns)


def method_label(sd_method: str, k: int | float | None) -> str:
    """A method's label: its family, and ``k=<k>`` for SD."""
    label = FAMILY_LABELS.get(sd_method, sd_method)
    return label if sd_method == "none" or not k or k != k else f"{label} k={int(k)}"


def low(value: float, bound: float) -> float:
    """The lower end a figure draws for an interval: its error bars are clipped at the value (a
    bootstrap bound beyond the point estimate is drawn at the point)."""
    return bound if math.isnan(bound) or math.isnan(value) else min(bound, value)


def high(value: float, bound: float) -> float:
    return bound if math.isnan(bound) or math.isnan(value) else max(bound, value)


def read_drawn(path: Path) -> pd.DataFrame:
    """A drawn table as written: ``x`` as text (a number or a tick label), empty cells as NaN."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""], dtype={"x": str, "series": str, "label": str,
                                                                          "note": str, "panel": str})  # fmt: skip


def close(got: float, want: float, tol: float = TOL, what: str = "") -> None:
    both_nan = (got is None or (isinstance(got, float) and math.isnan(got))) and (
        want is None or (isinstance(want, float) and math.isnan(want))
    )
    assert both_nan or abs(float(got) - float(want)) <= tol * max(1.0, abs(float(want))), f"{what}: drawn {got}, data {want}"


def one(drawn: pd.DataFrame, what: str, **where: object) -> pd.Series:
    """The one drawn row matching ``where`` (x compared as a number when it is one)."""
    mask = np.ones(len(drawn), dtype=bool)
    for col, value in where.items():
        if col == "x" and isinstance(value, (int, float)):
            mask &= pd.to_numeric(drawn["x"], errors="coerce").to_numpy() == float(value)
        else:
            mask &= (drawn[col].astype(str) == str(value)).to_numpy()
    rows = drawn[mask]
    assert len(rows) == 1, f"{what}: {len(rows)} drawn marks at {where}"
    return rows.iloc[0]


def grid_cells(run: Path) -> pd.DataFrame:
    cells = pd.read_parquet(run / "results/tables/cells.parquet")
    return cells[cells["sweep"].fillna("") == ""] if "sweep" in cells else cells


def aa_failed(run: Path) -> bool:
    """Whether the run's A/A control (cells of sweep aa_control) judged more clean cells pays or loses
    than 95% allows (Binomial(n, 0.05)'s 95% quantile, written out for the few n a run has): then the
    verdict judges no point."""
    cells = pd.read_parquet(run / "results/tables/cells.parquet")
    if "sweep" not in cells:
        return False
    aa = cells[(cells["sweep"].fillna("") == "aa_control") & ~cells["contaminated"].fillna(False).astype(bool)]
    words = [verdict_rule(lo, hi) for lo, hi in zip(aa["speedup_ci_low"], aa["speedup_ci_high"])]
    false = sum(w in ("pays", "loses") for w in words)
    allowed = {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 2}[len(aa)]
    return false > allowed


def panel_of(row: object) -> str:
    return f"{row.model} / {row.dataset} / {row.engine}"


def config(run: Path) -> dict:
    return yaml.safe_load((run / "config" / "config.yaml").read_text())


# ----------------------------------------------------------------------------- Sec. 3 and the verdict
def check_fig01(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    grid = grid_cells(run)
    n = 0
    for ylabel, y, lo, hi in (("output tokens / s", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high"),
                              ("speedup over no SD", "speedup", "speedup_ci_low", "speedup_ci_high")):  # fmt: skip
        lines = drawn[(drawn["mark"] == "line") & (drawn["ylabel"] == ylabel)]
        assert len(lines) == len(grid), f"fig01 {ylabel}: {len(lines)} points for {len(grid)} cells"
        for c in grid.itertuples(index=False):
            what = f"fig01 {ylabel} {panel_of(c)} {c.method} bs{c.batch_size}"
            mark = one(lines, what, panel=panel_of(c), series=c.method, x=c.batch_size)
            close(mark["y"], getattr(c, y), what=what)
            if c.sd_method != "none" or y == "tokens_per_s":
                close(mark["lo"], low(getattr(c, y), getattr(c, lo)), what=what + " low")
                close(mark["hi"], high(getattr(c, y), getattr(c, hi)), what=what + " high")
            assert mark["color"] == FAMILY_COLORS[c.sd_method], f"{what}: colour {mark['color']}"
            for flag, kind in (("contaminated", "ring"), ("preempted", "preempted")):
                marks = drawn[(drawn["mark"] == kind) & (drawn["ylabel"] == ylabel) & (drawn["panel"] == panel_of(c))
                              & (drawn["series"] == c.method) & (pd.to_numeric(drawn["x"]) == c.batch_size)]  # fmt: skip
                flagged = bool(getattr(c, flag, False))
                assert len(marks) == int(flagged), f"{what}: {len(marks)} {kind} marks, {flag} {flagged}"
                if flagged:
                    close(marks["y"].iloc[0], getattr(c, y), what=f"{what} {kind}")
            n += 1
    return n


def check_verdict(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    """Offline squares against the grid's cells; server squares (a panel of the same title, x label
    ``concurrency``) against the server table: SD's tokens/s over no SD's, judged on the range over
    rounds (SD's min over no SD's max, max over min)."""
    grid = grid_cells(run)
    sd = grid[grid["sd_method"] != "none"]
    table = pd.read_parquet(run / "results/tables/verdict.parquet")
    offline = table[table["load_kind"] == "batch size"].set_index(["engine", "model", "dataset", "method", "load"])
    squares = drawn[drawn["mark"] == "square"]
    assert len(squares) == len(table), f"verdict: {len(squares)} squares for {len(table)} points"
    labels = {k: m.get("label", k) for k, m in config(run)["methods"].items()}  # the rule's --labels
    texts = drawn[drawn["mark"] == "text"]
    judge_nothing = aa_failed(run)
    for c in sd.itertuples(index=False):
        what = f"verdict {panel_of(c)} {c.method} bs{c.batch_size}"
        rule = verdict_rule(c.speedup_ci_low, c.speedup_ci_high, _flag(c, "preempted", "contaminated", "hardware_mismatch"))
        rule = "not judged" if judge_nothing and rule != "flagged" else rule
        assert offline.loc[(c.engine, c.model, c.dataset, c.method, c.batch_size), "verdict"] == rule, what
        square = one(squares, what, panel=panel_of(c), xlabel="batch size", series=c.method, x=str(c.batch_size))
        close(square["y"], c.speedup, tol=0.0051, what=what)  # written with two decimals
        assert square["color"] == VERDICT_COLORS[rule], f"{what}: colour {square['color']}, rule {rule}"
        assert square["label"] == labels[c.method], f"{what}: on the row of {square['label']}"
    for (engine, model, dataset, method), rows in sd.groupby(["engine", "model", "dataset", "method"]):
        text = one(texts, "verdict τ", panel=f"{model} / {dataset} / {engine}", xlabel="batch size", series=method)
        close(text["y"], rows["mean_acceptance_length"].mean(), tol=0.0051, what=f"verdict τ {method}")
    server_path = run / "results/tables/server.parquet"
    if not server_path.is_file():
        return len(sd)
    server = pd.read_parquet(server_path)
    base = server[server["sd_method"] == "none"].set_index(["engine", "model", "dataset", "concurrency"])
    points = server[server["sd_method"] != "none"]
    for c in points.itertuples(index=False):
        what = f"verdict {panel_of(c)} {c.method} concurrency {c.concurrency}"
        b = base.loc[(c.engine, c.model, c.dataset, c.concurrency)]
        kind = lambda h: str(h).split(", driver ")[0]  # noqa: E731 - the board and its memory, or the CPU
        apart = kind(getattr(c, "hardware", "")) != kind(b.get("hardware", "")) and getattr(c, "hardware", "") and b.get("hardware", "")
        tainted = _flag(c, "contaminated") or bool(b.get("contaminated", False))
        # One server start per arm: the rounds' range is no interval (sdbench.analysis.intervals); not judged.
        several = int(getattr(c, "starts", 1) or 1) >= 2 and int(b.get("starts", 1) or 1) >= 2
        low, high = (c.speedup_ci_low, c.speedup_ci_high) if several else (float("nan"), float("nan"))
        rule = verdict_rule(low, high, bool(tainted or apart))
        square = one(squares, what, panel=panel_of(c), xlabel="concurrency", series=c.method, x=str(c.concurrency))
        close(square["y"], c.tokens_per_s / b["tokens_per_s"], tol=0.0051, what=what)
        assert square["color"] == VERDICT_COLORS[rule], f"{what}: colour {square['color']}, rule {rule}"
        text = one(texts, "verdict τ", panel=panel_of(c), xlabel="concurrency", series=c.method)
        close(text["y"], c.mean_acceptance_length, tol=0.0051, what=f"{what} τ")
    return len(sd) + len(points)


def check_ext02(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    grid = grid_cells(run)
    sd = grid[grid["acceptance_rate_per_pos"].map(len) > 0]
    n = 0
    for (engine, model, dataset, method), rows in sd.groupby(["engine", "model", "dataset", "method"]):
        per_pos = [list(r) for r in rows["acceptance_rate_per_pos"]]
        width = max(map(len, per_pos))
        for j in range(width):
            values = [r[j] for r in per_pos if j < len(r) and not math.isnan(r[j])]
            what = f"ext02 {model}/{dataset} {method} position {j + 1}"
            mark = one(drawn, what, panel=f"{model} / {dataset} / {engine}", series=method, x=j + 1)
            close(mark["y"], sum(values) / len(values), what=what)
            n += 1
    assert n == len(drawn), f"ext02: {len(drawn)} marks, {n} checked"
    return n


# ----------------------------------------------------------------------------- Sec. 5: breakdown and memory
def check_fig03(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    steps = pd.concat([pd.read_parquet(p) for p in sorted((run / "results/breakdown").rglob("steps.parquet"))])
    grid = grid_cells(run).drop_duplicates("method").set_index("method")
    bars = drawn[drawn["mark"] == "bar"]
    n = 0
    for (method, bs), g in steps.groupby(["method", "batch_size"]):
        total = g["step_s"].sum()
        other = g["other_s"] if "other_s" in g else g["step_s"] - g[["verify_s", "propose_s", "sample_s"]].sum(axis=1)
        shares = {"propose": g["propose_s"].fillna(0).sum() / total, "verify": g["verify_s"].sum() / total,
                  "sample": g["sample_s"].sum() / total, "other": other.sum() / total}  # fmt: skip
        label = method_label(grid.loc[method, "sd_method"], grid.loc[method, "num_speculative_tokens"])
        for stage, share in shares.items():
            what = f"fig03 {method} bs{bs} {stage}"
            bar = one(bars, what, series=stage, x=f"{label} {bs}")
            close(bar["y"], share, tol=1e-6, what=what)
            assert bar["color"] == STAGE_COLORS[stage], what
            n += 1
    assert n == len(bars), f"fig03: {len(bars)} bars, {n} checked"
    return n


def check_tab02(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    memory = pd.read_parquet(run / "results/tables/memory.parquet")
    n = 0
    def first(values: pd.Series) -> float:  # the configuration's first known value (pandas' "first")
        known = values.dropna()
        return float(known.iloc[0]) if len(known) else math.nan

    for (engine, model, method), g in memory.groupby(["engine", "model", "method"]):
        cell = f"{model} | {method}"
        for series in ("analytical_static_gib", "analytical_per_token_kib"):
            close(one(drawn, f"tab02 {cell}", series=series, x=cell)["y"], first(g[series]), what=f"tab02 {cell} {series}")
            n += 1
        weights = first(g["measured_weights_gib"])
        close(one(drawn, f"tab02 {cell}", series="measured_weights_gib", x=cell)["y"],
              0.0 if math.isnan(weights) else weights, what=f"tab02 {cell} weights")  # fmt: skip
        n += 1
        peak = g["peak_memory_gib"].max()
        if not math.isnan(peak):
            close(one(drawn, f"tab02 {cell}", series="peak_memory_gib", x=cell)["y"], peak, what=f"tab02 {cell} peak")
            n += 1
    return n


# ----------------------------------------------------------------------------- Sec. 6: acceptance
def _scope_traces(run: Path, key: str) -> pd.DataFrame:
    """The trace tables behind an acceptance item, each row labelled as the figure labels it."""
    from sdbench.config import validate_config
    from sdbench.workflow.plan import Plan

    plan = Plan(validate_config(config(run)))
    labels = plan.acceptance_labels(key)
    frames = []
    for i, path in enumerate(plan.acceptance_traces(key)):
        t = pd.read_parquet(run / path)
        frames.append(t.assign(dataset=labels[i] if i < len(labels) else Path(path).stem))
    return pd.concat(frames, ignore_index=True)


def _family(method: str) -> str:
    """How Fig. 4 names a traced method (its vLLM method; an offline tracer's by its prefix)."""
    return next((label for key, label in FAMILY_LABELS.items() if method == key), None) or next(
        (label for key, label in FAMILY_LABELS.items() if method.startswith(key)), method
    )


def check_fig04(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    traces = _scope_traces(run, scope)
    n = 0
    for method, t in traces.groupby("method"):
        panel = drawn[drawn["panel"] == f"{t['dataset'].iloc[0]}, {_family(method)}"]
        want = t[t["position"] < 512].set_index(["request_id", "position"])["acc_len"].sort_index()
        got = panel.assign(x=pd.to_numeric(panel["x"]).astype(int)).set_index(["series", "x"])["y"].sort_index()
        assert got.index.tolist() == [(str(r), int(p)) for r, p in want.index], f"fig04 {scope} {method}: cells"
        assert np.allclose(got.to_numpy(), want.to_numpy(float)), f"fig04 {scope} {method}: values"
        n += len(got)
    assert n == len(drawn), f"fig04 {scope}: {len(drawn)} cells drawn, {n} checked"
    return n


# Fig. 5's output-length classes (left-closed), as its panels name them: written out here.
FIG05_CLASSES = ((0, 4096, "<4K"), (4096, 8192, "4K-8K"), (8192, 13312, "8K-13K"), (13312, math.inf, ">=13K"))


def check_fig05(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    traces = _scope_traces(run, scope)
    n = 0
    for (dataset, method), t in traces.groupby(["dataset", "method"]):
        lengths = t.groupby("request_id")["position"].transform("size")
        for low_len, high_len, label in FIG05_CLASSES:
            c = t[(lengths >= low_len) & (lengths < high_len)]
            if c.empty:
                continue
            panel = drawn[drawn["panel"] == f"{dataset}: outputs {label} tokens"]
            # Over 50 requests in a class the figure draws a seeded sample of 50: its mean is then
            # checked to lie within the per-request means of that decile and inside its band.
            sampled = c["request_id"].nunique() > 50
            interval = 10 * c["position"] // lengths[c.index]
            per_request = c.assign(interval=interval).groupby(["interval", "request_id"])["acc_len"].mean()
            for i, means in per_request.groupby(level="interval"):
                values = means.to_numpy(float)
                mean = values.mean()
                half = 1.959963984540054 * (values.std(ddof=1) if len(values) > 1 else 0.0) / math.sqrt(len(values))
                what = f"fig05 {scope} {method} {label} decile {i + 1}"
                series = panel[panel["series"] == method]
                line = one(series[series["mark"] == "line"], what, x=int(i) + 1)
                band = one(series[series["mark"] == "band"], what, x=int(i) + 1)
                if sampled:
                    assert values.min() <= line["y"] <= values.max(), f"{what}: {line['y']} outside the requests' means"
                    assert band["lo"] <= line["y"] <= band["hi"], f"{what}: the line outside its band"
                else:
                    close(line["y"], mean, what=what)
                    close(band["lo"], mean - half, what=what + " low")
                    close(band["hi"], mean + half, what=what + " high")
                n += 2
    assert n == len(drawn), f"fig05 {scope}: {len(drawn)} marks, {n} checked"
    return n


def check_fig06(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    traces = _scope_traces(run, scope)
    n = 0
    for (dataset, method), t in traces.groupby(["dataset", "method"]):
        means = t.groupby("request_id")["acc_len"].mean().to_numpy(float)
        p5, p25, p50, p75, p95 = np.percentile(means, [5, 25, 50, 75, 95])
        what = f"fig06 {dataset} {method}"
        box = one(drawn[drawn["mark"] == "box"], what, panel=dataset, series=method)
        whisker = one(drawn[drawn["mark"] == "whisker"], what, panel=dataset, series=method)
        for got, want in ((box["y"], p50), (box["lo"], p25), (box["hi"], p75), (whisker["lo"], p5), (whisker["hi"], p95)):
            close(got, want, what=what)
        n += 2
    assert n == len(drawn), f"fig06 {scope}: {len(drawn)} marks, {n} checked"
    return n


def check_fig10(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    traces = _scope_traces(run, scope)
    keys = ["request_id", "position"]
    a = traces[traces["method"] == "ngram"][keys + ["acc_len"]]
    b = traces[traces["method"] == "eagle"][keys + ["acc_len"]]
    diff = a.merge(b, on=keys, suffixes=("_n", "_e"))
    diff = diff[diff["position"] < 512].set_index(keys)
    want = (diff["acc_len_n"] - diff["acc_len_e"]).sort_index()
    got = drawn.assign(x=pd.to_numeric(drawn["x"]).astype(int)).set_index(["series", "x"])["y"].sort_index()
    assert got.index.tolist() == [(str(r), int(p)) for r, p in want.index], f"fig10 {scope}: cells"
    assert np.allclose(got.to_numpy(), want.to_numpy(float)), f"fig10 {scope}: values"
    return len(got)


# ----------------------------------------------------------------------------- Sec. 7-8: BLEU and the simulator
def check_fig08_measured(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    table = pd.read_parquet(run / "results/bleu" / scope / "fig8_measured.parquet")
    for r in table.itertuples(index=False):
        cell = one(drawn, f"fig08 {scope} {r.bucket} bs{r.batch_size}", series=str(r.batch_size), x=r.bucket)
        close(cell["y"], (r.relative_speedup - 1.0) * 100.0, what=f"fig08 {scope} {r.bucket} bs{r.batch_size}")
    assert len(drawn) == len(table), f"fig08 {scope}: {len(drawn)} cells for {len(table)} rows"
    return len(table)


def _simulations(run: Path, scope: str) -> pd.DataFrame:
    if scope.startswith("published/"):
        folder = run / "results/simulator/published" / scope.split("/", 1)[1]
    else:
        folder = run / "results/simulator/cells" / scope
    return pd.concat([pd.read_csv(p) for p in sorted(folder.glob("*.csv"))], ignore_index=True)


def check_fig09(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    sims = _simulations(run, scope)
    lines = drawn[drawn["mark"] == "line"]
    shown = sims[sims["proposer"].isin(["eagle", "ngram"])]
    for r in shown.itertuples(index=False):
        what = f"fig09 {scope} {r.dataset} {r.proposer} {r.policy} bs{r.batch_size}"
        panel = f"{r.dataset} / {'EAGLE' if r.proposer == 'eagle' else 'n-gram'}"
        close(one(lines, what, panel=panel, series=r.policy, x=r.batch_size)["y"], r.speedup, what=what)
    assert len(lines) == len(shown), f"fig09 {scope}: {len(lines)} points for {len(shown)} simulated"
    return len(shown)


def check_fig11(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    sims = _simulations(run, scope)
    n = 0
    for dataset, sub in sims.groupby("dataset"):
        oracles = {"Oracle_Combine": ("combined", ("oracle", "oracle-combine")), "Oracle_EAGLE": ("eagle", ("oracle",)),
                   "Oracle_n-gram": ("ngram", ("oracle",))}  # fmt: skip
        for series, (proposer, policies) in oracles.items():
            for r in sub[(sub["proposer"] == proposer) & sub["policy"].isin(policies)].itertuples(index=False):
                what = f"fig11 {scope} {dataset} {series} bs{r.batch_size}"
                close(one(drawn, what, panel=dataset, series=series, x=r.batch_size)["y"], r.speedup, what=what)
                n += 1
        for proposer, series in (("eagle", "best fixed EAGLE"), ("ngram", "best fixed n-gram")):
            fixed = sub[(sub["proposer"] == proposer) & sub["policy"].str.startswith("fixed-")]
            for bs, g in fixed.groupby("batch_size"):
                what = f"fig11 {scope} {dataset} {series} bs{bs}"
                close(one(drawn, what, panel=dataset, series=series, x=bs)["y"], g["speedup"].max(), what=what)
                n += 1
    refs = drawn[drawn["mark"] == "reference"]
    assert set(refs["y"]) == {1.0}, f"fig11 {scope}: reference lines {refs['y'].tolist()}"  # speedup 1
    assert n == len(drawn) - len(refs), f"fig11 {scope}: {len(drawn) - len(refs)} marks, {n} checked"
    return n


def check_ext04(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    report = pd.read_csv(run / "results/simulator/adaptive" / f"{scope}.csv")
    n = 0
    for dataset, sub in report.groupby("dataset"):
        for bs, g in sub.groupby("batch_size"):
            band = one(drawn[drawn["mark"] == "band"], f"ext04 {dataset}", panel=dataset, x=bs)
            # The band is the region between the two; read back, its lower edge is the smaller
            # (the simulated oracle-combine can fall below the best fixed policy).
            edges = sorted((g["best_fixed"].iloc[0], g["oracle_combine"].iloc[0]))
            close(band["lo"], edges[0], tol=1e-6, what=f"ext04 {dataset} bs{bs} best fixed / oracle-combine, lower")
            close(band["hi"], edges[1], tol=1e-6, what=f"ext04 {dataset} bs{bs} best fixed / oracle-combine, upper")
            n += 1
        for r in sub.itertuples(index=False):
            what = f"ext04 {dataset} {r.policy} bs{r.batch_size}"
            close(one(drawn, what, panel=dataset, series=r.policy, x=r.batch_size)["y"], r.speedup, tol=1e-6, what=what)
            n += 1
    return n


def check_ext15(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    table = pd.read_parquet(run / "results/simulator/forced_check.parquet")
    n = 0
    for col in ("predicted", "predicted_refit"):
        points = drawn[(drawn["series"] == col) & (drawn["mark"] == "point")]
        shown = table[table[col].notna()]
        assert len(points) == len(shown), f"ext15 {col}: {len(points)} points for {len(shown)} cells"
        for (_, p), (_, r) in zip(points.iterrows(), shown.iterrows()):
            close(float(p["x"]), r["speedup"], what=f"ext15 {col} x")
            close(p["y"], r[col], what=f"ext15 {col} y")
            close(p["x_lo"], low(r["speedup"], r["speedup_ci_low"]), what=f"ext15 {col} x low")
            close(p["x_hi"], high(r["speedup"], r["speedup_ci_high"]), what=f"ext15 {col} x high")
            n += 1
    return n


# ----------------------------------------------------------------------------- production questions
def _method_lines(drawn: pd.DataFrame, table: pd.DataFrame, what: str, panel: pd.Series, x: str,
                  rows: list[tuple[str, str, str | None, str | None]], series: str = "method") -> int:  # fmt: skip
    n = 0
    for ylabel, y, lo, hi in rows:
        lines = drawn[(drawn["mark"] == "line") & (drawn["ylabel"] == ylabel)]
        # A NaN value is no mark (matplotlib draws nothing there): e.g. no drafts, no acceptance length.
        drawable = table[y].notna().to_numpy()
        assert len(lines) == drawable.sum(), f"{what} {ylabel}: {len(lines)} points for {drawable.sum()} rows"
        for (i, r), p, ok in zip(table.iterrows(), panel, drawable):
            if not ok:
                continue
            at = f"{what} {p} {r[series]} {x}={r[x]}"
            mark = one(lines, at, panel=p, series=r[series], x=r[x])
            close(mark["y"], r[y], what=at)
            if lo:
                close(mark["lo"], low(r[y], r[lo]), what=at + " low")
                close(mark["hi"], high(r[y], r[hi]), what=at + " high")
            n += 1
    return n


def check_ext07(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    cost = pd.read_parquet(run / "results/tables/cost.parquet")
    currency = cost["currency"].iloc[0]
    # The table by hand: price per hour over throughput, per million tokens.
    close_all = (cost["price_per_hour"] / 3600.0 / cost["tokens_per_s"] * 1e6 - cost["cost_per_1m_tokens"]).abs().max()
    assert close_all < 1e-9 * cost["cost_per_1m_tokens"].abs().max(), "ext07: cost is not price / throughput"
    panel = cost["model"] + " / " + cost["dataset"] + " / " + cost["engine"]
    return _method_lines(drawn, cost, "ext07", panel, "batch_size",
                         [(f"{currency} per 1M output tokens", "cost_per_1m_tokens", "cost_per_1m_tokens_ci_low",
                           "cost_per_1m_tokens_ci_high")])  # fmt: skip


def check_ext16(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/energy.parquet")
    cells = grid_cells(run).set_index(["engine", "model", "dataset", "method", "batch_size"])
    for r in t.itertuples(index=False):  # by hand: the grid cell's own numbers, NaN exactly without a meter
        cell = cells.loc[(r.engine, r.model, r.dataset, r.method, r.batch_size)]
        close(r.joules_per_token, cell["joules_per_token"], what=f"ext16 {r.method} bs {r.batch_size} J/token")
        assert math.isnan(r.joules_per_token) == (r.energy_meter == "not measured"), f"ext16 {r.method}: meter"
    unit = "joules / output token" + (" (not measured)" if t["joules_per_token"].isna().all() else "")
    panel = t["model"] + " / " + t["dataset"] + " / " + t["engine"]
    n = _method_lines(drawn, t, "ext16", panel, "batch_size",
                      [("output tokens / s", "tokens_per_s", "tokens_per_s_ci_low", "tokens_per_s_ci_high")])
    measured = t["joules_per_token"].notna()  # a cell without a meter draws no energy point
    return n + _method_lines(drawn, t[measured], "ext16", panel[measured], "batch_size",
                             [(unit, "joules_per_token", "joules_per_token_ci_low", "joules_per_token_ci_high")])


def check_ext08(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/proposal_length.parquet")
    panel = t["model"] + " / " + t["dataset"] + " / bs " + t["batch_size"].astype(str) + " / " + t["engine"]
    return _method_lines(drawn, t, "ext08", panel, "num_speculative_tokens",
                         [("speedup over no SD", "speedup", "speedup_ci_low", "speedup_ci_high"),
                          ("mean accepted length (tokens/step)", "mean_acceptance_length", None, None)],
                         series="base_method")  # fmt: skip


def check_ext10(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/temperature.parquet")
    panel = t["model"] + " / " + t["base_dataset"] + " / bs " + t["batch_size"].astype(str) + " / " + t["engine"]
    return _method_lines(drawn, t, "ext10", panel, "temperature",
                         [("mean accepted length (tokens/step)", "mean_acceptance_length", None, None),
                          ("speedup over no SD at the same T", "speedup", "speedup_ci_low", "speedup_ci_high")])  # fmt: skip


def check_ext09(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/random_inputs.parquet")
    sd = t[t["sd_method"] != "none"]
    grid = grid_cells(run).drop_duplicates("method").set_index("method")
    n = 0
    for side in ("real", "random"):
        bars = drawn[(drawn["mark"] == "bar") & (drawn["note"] == side)]
        for r in sd.itertuples(index=False):
            label = method_label(grid.loc[r.method, "sd_method"], grid.loc[r.method, "num_speculative_tokens"])
            what = f"ext09 {side} {r.method} bs{r.batch_size}"
            bar = one(bars, what, panel=f"{r.model} ({r.engine})", series=r.method, x=f"{label} bs{r.batch_size}")
            value = getattr(r, f"speedup_{side}")
            close(bar["y"], value, what=what)
            close(bar["lo"], low(value, getattr(r, f"speedup_ci_low_{side}")), what=what + " low")
            close(bar["hi"], high(value, getattr(r, f"speedup_ci_high_{side}")), what=what + " high")
            assert bar["color"] == FAMILY_COLORS[r.sd_method], what
            n += 1
    return n


def check_ext13(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    forced = pd.read_parquet(run / "results/tables/forced_acceptance.parquet")
    labels = {k: m.get("label", k) for k, m in config(run)["methods"].items()}
    lines = drawn[drawn["mark"] == "line"]
    for r in forced.itertuples(index=False):
        what = f"ext13 {r.base_method} bs{r.batch_size} forced {r.forced_acceptance_length}"
        panel = f"{labels.get(r.base_method, r.base_method)} / {r.model} / {r.dataset}"
        mark = one(lines, what, panel=panel, series=f"bs {r.batch_size}", x=r.mean_acceptance_length)
        close(mark["y"], r.speedup, what=what)
        close(mark["lo"], low(r.speedup, r.speedup_ci_low), what=what + " low")
        close(mark["hi"], high(r.speedup, r.speedup_ci_high), what=what + " high")
    assert len(lines) == len(forced), f"ext13: {len(lines)} points for {len(forced)} forced cells"
    return len(forced)


def check_ext14(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    gap = pd.read_parquet(run / "results/tables/sd_gap.parquet")
    labels = {k: m.get("label", k) for k, m in config(run)["methods"].items()}
    n = 0
    for r in gap.itertuples(index=False):
        panel = f"{labels.get(r.base_method, r.base_method)} / {r.model} / {r.dataset}"
        # The decomposition by hand: ideal = k + 1, system = ideal - ceiling, acceptance = ceiling - at τ.
        close(r.ideal_speedup, r.num_speculative_tokens + 1, what="ext14 ideal")
        close(r.system_loss, r.ideal_speedup - r.ceiling_speedup, what="ext14 system loss")
        for col in ("measured_speedup", "at_real_speedup", "ceiling_speedup", "ideal_speedup"):
            value = getattr(r, col)
            bar = one(drawn[drawn["mark"] == "bar"], f"ext14 {col}", panel=panel, series=col, x=str(r.batch_size))
            close(bar["y"], 0.0 if math.isnan(value) else value, what=f"ext14 {col} bs{r.batch_size}")
            n += 1
    return n


def check_ext12(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/category_acceptance.parquet")
    bars = drawn[drawn["mark"] == "bar"]
    for r in t.itertuples(index=False):
        what = f"ext12 {r.method} {r.category}"
        bar = one(bars, what, panel=f"{r.model} / {r.dataset} / bs {r.batch_size} / {r.engine}", series=r.method,
                  x=r.category or "(none)")  # fmt: skip
        close(bar["y"], r.request_mean_acceptance_length, what=what)
    assert len(bars) == len(t.dropna(subset=["request_mean_acceptance_length"])), "ext12: bars"
    return len(t)


def check_ext11(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_parquet(run / "results/tables/server.parquet")
    for r in t.itertuples(index=False):
        what = f"ext11 {r.method} concurrency {r.concurrency}"
        mark = one(drawn, what, panel=panel_of(r), series=r.method, x=r.tokens_per_s_per_device)
        close(mark["y"], r.tpot_p50_ms, what=what)
        close(mark["x_lo"], low(r.tokens_per_s_per_device, r.tokens_per_s_min / r.devices), what=what + " low")
        close(mark["x_hi"], high(r.tokens_per_s_per_device, r.tokens_per_s_max / r.devices), what=what + " high")
    return len(t)


# How ext17 colours a region (docs/figures.md), written out here.
REGION_COLORS = {"SD better": "#b7e4b0", "no SD better": "#f4b6b0", "undecided": "#e6e6e6", "neither meets": "#8c8c8c"}


def region_rule(low: float, high: float, sd_goodput: float, base_goodput: float) -> str:
    """Where a target lies: no request of either arm meets it, else the difference's 95% interval vs 0."""
    if sd_goodput == 0 and base_goodput == 0:
        return "neither meets"
    return "SD better" if low > 0 else "no SD better" if high < 0 else "undecided"


def _server_cells(run: Path) -> dict[tuple, tuple[pd.DataFrame, float]]:
    """(engine, model, dataset, method, concurrency) -> (its timed requests, its rounds' summed wall time)."""
    out = {}
    for path in sorted((run / "results/server").glob("*/*/*/*/c*/summary.parquet")):
        s = pd.read_parquet(path).iloc[0]
        key = (s["engine"], s["model"], s["dataset"], s["method"], int(s["concurrency"]))
        out[key] = (pd.read_parquet(path.with_name("requests.parquet")), float(sum(s["round_wall_s"])))
    return out


def _goodput_by_hand(requests: pd.DataFrame, wall: float, ttft: float, tpot: float, e2e: float) -> float:
    """Requests meeting every target set (ms; NaN: none) per second; a one-token request's TPOT is 0."""
    good = np.ones(len(requests), dtype=bool)
    for column, target in (("ttft_s", ttft), ("tpot_s", tpot), ("latency_s", e2e)):
        values = requests[column].to_numpy(dtype=float)
        if not math.isnan(target):
            good &= (np.nan_to_num(values, nan=0.0) if column == "tpot_s" else values) * 1000.0 <= target
    return float(good.sum()) / wall


def check_ext17(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    """Each grid target's goodput (both arms) counted by hand from the server cells' requests, its region
    by the rule on the table's interval, and the square drawn there in that region's colour; the user's
    targets as a star with their region, and the verdict's goodput square saying the same."""
    t = pd.read_parquet(run / "results/tables/goodput_frontier.parquet")
    cells = _server_cells(run)
    labels = {k: m.get("label", k) for k, m in config(run)["methods"].items()}  # the rule's --labels
    verdict_path = run / "results/tables/verdict.parquet"
    verdict = pd.read_parquet(verdict_path) if verdict_path.is_file() else None
    squares, stars = drawn[drawn["mark"] == "cell"], drawn[drawn["mark"] == "target"]
    n = 0
    panels = t.groupby(["engine", "model", "dataset", "method", "concurrency"])
    for (engine, model, dataset, method, c), panel in panels:
        what = f"ext17 {model} / {dataset} {method} concurrency {c}"
        title = f"{model} / {dataset} / {engine} / {labels.get(method, method)}, concurrency {c}"
        def here(marks: pd.DataFrame) -> pd.DataFrame:  # the panel's marks (its title may add its flags)
            return marks[(marks["panel"] == title) | marks["panel"].str.startswith(title + " (flagged: ")]

        sd, base = cells[(engine, model, dataset, method, int(c))], cells[(engine, model, dataset, "none", int(c))]
        grid = panel[panel["point"] == "grid"]
        marks = here(squares[squares["series"] == method])
        assert len(marks) == len(grid), f"{what}: {len(marks)} squares for {len(grid)} grid targets"
        at = {(round(float(x), 9), round(float(y), 9)): (note, color)
              for x, y, note, color in zip(marks["x"], marks["y"], marks["note"], marks["color"])}  # fmt: skip
        for r in panel.itertuples(index=False):
            targets = (r.slo_ttft_ms, r.slo_tpot_ms, r.slo_e2e_ms)
            close(r.goodput_rps, _goodput_by_hand(*sd, *targets), what=f"{what} SD goodput at {targets}")
            close(r.baseline_goodput_rps, _goodput_by_hand(*base, *targets), what=f"{what} no-SD goodput at {targets}")
            rule = region_rule(r.goodput_difference_rps_ci_low, r.goodput_difference_rps_ci_high, r.goodput_rps,
                               r.baseline_goodput_rps)  # fmt: skip
            assert r.region == rule, f"{what}: region {r.region} at {targets}, rule {rule}"
            if r.point == "grid":
                note, color = at[(round(r.slo_tpot_ms, 9), round(r.slo_ttft_ms, 9))]
                assert (note, color) == (rule, REGION_COLORS[rule]), f"{what}: drawn {note} {color} at {targets}"
            else:  # the user's targets: a star, at the grid's loosest value where one is unset
                x = r.slo_tpot_ms if not math.isnan(r.slo_tpot_ms) else grid["slo_tpot_ms"].max()
                y = r.slo_ttft_ms if not math.isnan(r.slo_ttft_ms) else grid["slo_ttft_ms"].max()
                star = one(here(stars), what, series=method)
                close(float(star["x"]), x, what=f"{what} star x")
                close(star["y"], y, what=f"{what} star y")
                assert star["note"] == f"your targets: {rule}", f"{what}: star says {star['note']}, rule {rule}"
                if verdict is not None:
                    v = one(verdict, what, engine=engine, model=model, dataset=dataset, method=method, load=c)
                    assert v["goodput_verdict"] in (rule, "flagged"), f"{what}: verdict {v['goodput_verdict']}, {rule}"
            n += 1
    assert len(squares) == (t["point"] == "grid").sum() and len(stars) == (t["point"] != "grid").sum(), "ext17: marks"
    return n


def check_ext03(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    t = pd.read_csv(run / "results/simulator/compat_vs_exact.csv")
    n = 0
    for r in t.itertuples(index=False):
        for mode in ("compat", "exact"):
            rows = drawn[(drawn["note"] == mode) & drawn["panel"].str.startswith(f"{r.dataset} / {r.proposer} ")]
            close(one(rows, "ext03", series=r.policy, x=r.batch_size)["y"], getattr(r, mode), tol=1e-6,
                  what=f"ext03 {r.dataset} {r.proposer} {r.policy} {mode}")  # fmt: skip
            n += 1
    return n


def check_fig08_simulated(run: Path, scope: str, drawn: pd.DataFrame) -> int:
    dataset, name = scope.split("/")
    table = pd.read_parquet(run / "results/bleu/published" / dataset / f"fig8_{name}.parquet")
    for r in table.itertuples(index=False):
        cell = one(drawn, f"fig08 simulated {scope}", series=str(r.batch_size), x=r.bucket)
        close(cell["y"], (r.relative_speedup - 1.0) * 100.0, what=f"fig08 simulated {scope} {r.bucket}")
    return len(table)


CHECKS: dict[str, Callable[[Path, str, pd.DataFrame], int]] = {
    "ext00_verdict": check_verdict, "fig01_end_to_end": check_fig01, "ext02_acceptance_per_position": check_ext02,
    "fig03_runtime_breakdown": check_fig03, "tab02_memory": check_tab02, "fig04_acceptance_heatmap": check_fig04,
    "fig05_position_deciles": check_fig05, "fig06_request_acceptance": check_fig06,
    "fig10_ngram_minus_eagle": check_fig10, "fig08_bleu_measured": check_fig08_measured,
    "fig08_bleu_simulated": check_fig08_simulated, "fig09_fixed_vs_oracle": check_fig09,
    "fig11_oracle_combine": check_fig11, "ext03_compat_vs_exact": check_ext03, "ext04_adaptive_policies": check_ext04,
    "ext15_simulator_at_forced": check_ext15, "ext07_cost": check_ext07, "ext16_energy_per_token": check_ext16,
    "ext08_proposal_length": check_ext08,
    "ext09_random_inputs": check_ext09, "ext10_temperature": check_ext10, "ext11_latency_throughput": check_ext11,
    "ext17_goodput_frontier": check_ext17,
    "ext12_speed_bench_categories": check_ext12, "ext13_forced_acceptance": check_ext13, "ext14_sd_gap": check_ext14,
}  # fmt: skip


def check_run(run: Path) -> dict[str, tuple[int, int]]:
    """Check every figure of a finished run against its data tables; returns, per figure
    (``<item>[/<scope>]``), (marks drawn, marks checked)."""
    paper = run / "results/paper"
    out = {}
    for png in sorted(paper.rglob("*.png")):
        rel = png.relative_to(paper).with_suffix("")
        item, scope = rel.parts[0], "/".join(rel.parts[1:])
        csv = png.with_suffix(".csv")
        assert csv.is_file(), f"{png}: no drawn table beside it"
        assert item in CHECKS, f"{png}: no check of item {item!r} here"
        drawn = read_drawn(csv)
        out[str(rel)] = (len(drawn), CHECKS[item](run, scope, drawn))
    return out
