"""Energy per cell (sdbench.engine.measure.energy, sdbench.analysis.energy): meters read around every timed
call, joules per output token with its interval, SD's energy ratio over no SD, and "not measured".

No GPU and no RAPL exist here: the cells run on the LLM double with the NVML double or a RAPL tree
in a temporary directory as the meter (tests/support/energycells.py gives the costs, known by hand).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from sdbench.engine.measure.energy import NOT_MEASURED, NoMeter, RaplMeter, meter_for
from tests.support import energycells
from tests.support.energycells import nvml_meter
from tests.support.doubles.llm import Bench
from tests.support.doubles.nvml import NVMLDouble
from tests.support.doubles.rootonly import refuse_reads

ENERGY = ["energy_j", "mean_power_w", "joules_per_token", "joules_per_token_ci_low", "joules_per_token_ci_high"]
RATIO = ["energy_ratio", "energy_ratio_ci_low", "energy_ratio_ci_high"]


def cell(cells: list[dict[str, pd.DataFrame]], method: str, bs: int) -> dict[str, pd.DataFrame]:
    return next(c for c in cells if (c["summary"].at[0, "method"], c["summary"].at[0, "batch_size"]) == (method, bs))


def row(table: pd.DataFrame, method: str, bs: int) -> pd.Series:
    return table[(table["method"] == method) & (table["batch_size"] == bs)].iloc[0]


def test_nvml_double_gives_each_call_its_joules_and_each_cell_its_joules_per_token_and_ratio() -> None:
    cells = energycells.measure(nvml_meter)
    sd1 = cell(cells, "ngram-k3", 1)
    calls = sd1["calls"]
    assert set(calls["energy_meter"]) == {"nvml"}
    assert calls.sort_values(["trial", "call_index"])["energy_j"].tolist() == [6.0, 12.0] * 3
    assert sd1["baseline_calls"]["energy_j"].tolist() == [4.0, 12.0] * 3  # the paired no-SD arm's own calls
    # Joules per token: mean over prompts of each prompt's median (6/10, 12/20 -> 0.6; 4/10, 12/20 -> 0.5).
    for method, bs, jpt, watts in (("none", 1, 0.5, 16 / 2), ("none", 2, 0.4, 24 / 2), ("ngram-k3", 1, 0.6, 18 / 1),
                                   ("ngram-k3", 2, 0.2, 12 / 1)):  # fmt: skip
        s = cell(cells, method, bs)["summary"].iloc[0]
        assert s["energy_meter"] == "nvml"
        assert s["joules_per_token"] == pytest.approx(jpt, rel=1e-12)
        assert (s["joules_per_token_ci_low"], s["joules_per_token_ci_high"]) == pytest.approx((jpt, jpt), rel=1e-12)
        assert s["mean_power_w"] == pytest.approx(watts, rel=1e-12)
        assert s["energy_j"] == pytest.approx(3 * watts * (2 if method == "none" else 1), rel=1e-12)
    s = sd1["summary"].iloc[0]
    assert s["paired_baseline_joules_per_token"] == pytest.approx(0.5, rel=1e-12)
    assert [s[f"paired_{c}"] for c in RATIO] == pytest.approx([1.2, 1.2, 1.2], rel=1e-12)
    table = energycells.joined(cells)
    assert [row(table, "ngram-k3", 1)[c] for c in RATIO] == pytest.approx([1.2] * 3, rel=1e-12)
    assert [row(table, "ngram-k3", 2)[c] for c in RATIO] == pytest.approx([0.5] * 3, rel=1e-12)
    assert row(table, "ngram-k3", 2)["baseline_joules_per_token"] == pytest.approx(0.4, rel=1e-12)
    # Which GPUs: the first tensor_parallel_size of those CUDA_VISIBLE_DEVICES names, in its order
    # (the engine's rank 0 runs on GPU-c: 4,000 mJ x 8), else of the node's.
    bench = Bench(joules=8.0, t=1.0)
    nvml = NVMLDouble([("GPU-a", [], 1e3), ("GPU-b", [], 1e3), ("GPU-c", [], 1e3)],
                      energy_mj=lambda i: (1000, 2000, 4000)[i] * bench.joules)  # fmt: skip
    assert meter_for({"device": "cuda"}, 2, nvml=nvml, env={}).read() == 8.0 + 16.0
    assert meter_for({"device": "cuda"}, 1, nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "GPU-c,GPU-a"}).read() == 32.0
    assert row(table, "none", 1)[RATIO].isna().all() and "joules_per_token_boot" not in table


def test_an_independent_energy_ratio_takes_the_interval_of_the_ratio_of_the_two_cells_draws() -> None:
    def summary(method: str, jpt: float, boot: list[float]) -> pd.DataFrame:
        return pd.DataFrame([dict(engine="e", model="m", dataset="d", method=method, batch_size=1, tokens_per_s=10.0,
                                  tokens_per_s_pooled=10.0, energy_meter="rapl", joules_per_token=jpt,
                                  joules_per_token_boot=boot)])  # fmt: skip

    from sdbench.analysis.endtoend import join_cells

    table = join_cells([summary("none", 1.0, [1.0, 1.0, 1.0, 1.0]), summary("sd", 2.5, [1.0, 2.0, 3.0, 4.0])], "none")
    # Ratios of the draws 1, 2, 3, 4: percentiles 2.5 and 97.5 interpolated, 1 + 0.025 x 3 and 4 - 0.075.
    assert [row(table, "sd", 1)[c] for c in RATIO] == pytest.approx([2.5, 1.075, 3.925])


def rapl_tree(root: Path, bench: Bench, domains: dict[str, tuple[str, int, int]] | None = None) -> None:
    """A powercap tree whose counters follow the bench: ``domains`` maps a zone to (name, start in uJ,
    uJ per bench joule), every counter wrapping at 10 J. By default packages 0 and 1 (0.6 and 0.4 of
    the bench's energy; package 0 starts near its wrap and wraps every 16.7 J), a core subzone and the
    psys domain (not counted)."""
    domains = domains or {
        "intel-rapl:0": ("package-0", 9_000_000, 600_000), "intel-rapl:0:0": ("core", 0, 500_000),
        "intel-rapl:1": ("package-1", 0, 400_000), "intel-rapl:2": ("psys", 0, 2_000_000)}  # fmt: skip
    (root / "intel-rapl").mkdir(parents=True, exist_ok=True)  # the control type's own directory: no counter
    for name, (label, _, _) in domains.items():
        (root / name).mkdir(parents=True)
        (root / name / "name").write_text(label + "\n")
        (root / name / "max_energy_range_uj").write_text("10000000\n")

    def write(b: Bench) -> None:
        for name, (_, start, per_joule) in domains.items():
            (root / name / "energy_uj").write_text(f"{(start + round(per_joule * b.joules)) % 10_000_000}\n")

    write(bench)
    bench.listeners.append(write)


def test_a_rapl_tree_with_a_wraparound_gives_the_same_joules_and_the_independent_ratio(tmp_path: Path) -> None:
    roots: list[Path] = []

    def meter(bench: Bench) -> object:
        root = tmp_path / f"powercap{len(roots)}"
        root.mkdir()
        roots.append(root)
        rapl_tree(root, bench)
        return meter_for({"device": "cpu"}, rapl_root=root)

    cells = energycells.measure(meter, device="cpu", paired=False)
    calls = cell(cells, "ngram-k3", 1)["calls"]
    assert set(calls["energy_meter"]) == {"rapl"}
    assert calls.sort_values(["trial", "call_index"])["energy_j"].tolist() == pytest.approx([6.0, 12.0] * 3, rel=1e-12)
    for method, bs, jpt in (("none", 1, 0.5), ("none", 2, 0.4), ("ngram-k3", 1, 0.6), ("ngram-k3", 2, 0.2)):
        s = cell(cells, method, bs)["summary"].iloc[0]
        assert (s["energy_meter"], s["joules_per_token"]) == ("rapl", pytest.approx(jpt, rel=1e-12))
    table = energycells.joined(cells)
    assert set(table.loc[table["method"] != "none", "speedup_design"]) == {"independent"}
    assert [row(table, "ngram-k3", 1)[c] for c in RATIO] == pytest.approx([1.2] * 3, rel=1e-12)
    assert [row(table, "ngram-k3", 2)[c] for c in RATIO] == pytest.approx([0.5] * 3, rel=1e-12)
    # The wrap itself: 9.5 J on a counter at 9 J of its 10 J range reads as 9.5 J.
    root = tmp_path / "one"
    (root / "intel-rapl:0").mkdir(parents=True)
    (root / "intel-rapl:0" / "max_energy_range_uj").write_text("10000000")
    (root / "intel-rapl:0" / "energy_uj").write_text("9000000")
    rapl = RaplMeter([root / "intel-rapl:0"])
    (root / "intel-rapl:0" / "energy_uj").write_text("8500000")
    assert rapl.read() == pytest.approx(9.5, rel=1e-12)
    # A counter that did not move between readings (a call shorter than its update) adds 0 J, not a wrap.
    assert rapl.read() == pytest.approx(9.5, rel=1e-12)
    assert RaplMeter([root / "intel-rapl:0"]).read() == 0.0


def test_without_a_meter_every_energy_column_says_not_measured_never_zero(tmp_path: Path) -> None:
    cells = energycells.measure(lambda bench: None)
    for c in cells:
        assert set(c["calls"]["energy_meter"]) == {NOT_MEASURED} and c["calls"]["energy_j"].isna().all()
        s = c["summary"].iloc[0]
        assert s["energy_meter"] == NOT_MEASURED and all(math.isnan(s[k]) for k in ENERGY)
    table = energycells.joined(cells)
    assert (table["energy_meter"] == NOT_MEASURED).all() and table[ENERGY[1:] + RATIO].isna().all().all()
    from sdbench.analysis.energy import energy_markdown, energy_table

    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in energy_markdown(energy_table(table)).splitlines()
            if line.startswith("| e |")]  # fmt: skip
    assert len(rows) == 4  # J/token, mean W, energy ratio (SD), meter
    assert all(r[6] == r[7] == r[10] == NOT_MEASURED and r[9] in (NOT_MEASURED, "1") for r in rows)
    # On this machine: no RAPL, no NVML; the default config's engine (vllm-cpu) gets no meter.
    from sdbench.config import load_config
    from sdbench.engine.measure.energy import RAPL_ROOT, engine_meter

    default = load_config("config/config.yaml")["engines"]["vllm-cpu"]
    if not RAPL_ROOT.exists():
        assert engine_meter({"engine": default, "model": {}}).kind == NOT_MEASURED
    assert isinstance(meter_for({"device": "cpu"}, rapl_root=tmp_path / "absent"), NoMeter)
    unsupported = meter_for({"device": "cuda"}, nvml=NVMLDouble([("GPU-a", [], 1e3)]))
    assert unsupported.kind == NOT_MEASURED and "Not Supported" in unsupported.reason


def test_the_verdict_names_where_sd_pays_in_time_but_not_in_energy() -> None:
    from sdbench.analysis.verdict import lines_table, points_table, recommendations, verdict_markdown

    points = points_table(energycells.joined(energycells.measure(nvml_meter)))
    at = points.set_index("load")
    assert at.loc[1, ["verdict", "energy", "time_not_energy"]].tolist() == ["pays", "costs", True]
    assert at.loc[2, ["verdict", "energy", "time_not_energy"]].tolist() == ["pays", "saves", False]
    labels = {"ngram-k3": "n-gram k=3"}
    text = verdict_markdown(points, lines_table(points), recommendations(points, labels), labels)
    assert ("- m / d (e), n-gram k=3 at batch size 1: pays in time (2.00x) but costs more energy per token "
            "(energy ratio 1.20 [1.20, 1.20], nvml).") in text  # fmt: skip
    assert "at batch size 2: pays in time" not in text
    unmeasured = points_table(energycells.joined(energycells.measure(lambda bench: None)))
    assert set(unmeasured["energy"]) == {NOT_MEASURED} and not unmeasured["time_not_energy"].any()
    text = verdict_markdown(unmeasured, lines_table(unmeasured), recommendations(unmeasured, {}), {})
    assert "Energy not measured on this run" in text


def test_the_energy_command_writes_its_table_markdown_and_figure(tmp_path: Path) -> None:
    from sdbench.cli import main
    from sdbench.plotting import drawn_path

    energycells.joined(energycells.measure(nvml_meter)).to_parquet(tmp_path / "cells.parquet")
    out = {k: tmp_path / f"energy.{k}" for k in ("parquet", "md", "png")}
    argv = ["energy", "--cells", str(tmp_path / "cells.parquet"), "--output", str(out["parquet"]),
            "--markdown", str(out["md"]), "--figure", str(out["png"])]  # fmt: skip
    assert main(argv) == 0
    table = pd.read_parquet(out["parquet"])
    assert table.set_index(["method", "batch_size"])["joules_per_token"].to_dict() == pytest.approx(
        {("ngram-k3", 1): 0.6, ("ngram-k3", 2): 0.2, ("none", 1): 0.5, ("none", 2): 0.4})
    text = out["md"].read_text()
    assert "| e | m | d | ngram-k3 | 1 | 30.0 [30.0, 30.0] | 0.6 [0.6, 0.6] | 18.0 | 2.00 [2.00, 2.00] " \
           "| 1.20 [1.20, 1.20] | nvml |" in text  # fmt: skip
    assert "Power model fitted from the cells' mean power: P(n) = " in text
    assert out["png"].stat().st_size > 5_000
    # What the figure drew (read back from its artists into energy.csv): tokens/s and joules per token of
    # each method at each batch size, by hand from tests/support/energycells.py; every interval its point.
    drawn = pd.read_csv(drawn_path(out["png"]), keep_default_na=False, na_values=[""])
    assert set(drawn["panel"]) == {"m / d / e"} and set(drawn["mark"]) == {"line"} and drawn["measured"].all()
    by_hand = {("output tokens / s", "ngram-k3", 1): 30.0, ("output tokens / s", "ngram-k3", 2): 60.0,
               ("output tokens / s", "none", 1): 15.0, ("output tokens / s", "none", 2): 30.0,
               ("joules / output token", "ngram-k3", 1): 0.6, ("joules / output token", "ngram-k3", 2): 0.2,
               ("joules / output token", "none", 1): 0.5, ("joules / output token", "none", 2): 0.4}  # fmt: skip
    marks = {(r.ylabel, r.series, int(r.x)): (r.y, r.lo, r.hi) for r in drawn.itertuples()}
    assert len(marks) == len(drawn) and set(marks) == set(by_hand)
    for key, value in by_hand.items():
        assert marks[key] == pytest.approx((value, value, value)), key


def test_the_meter_reads_the_jobs_gpus_in_cuda_visible_devices_order() -> None:
    """CUDA_VISIBLE_DEVICES=3,1 and one GPU: the engine runs on device 3, so the meter reads GPU 3
    (NVML order would give GPU 1, an idle one: its energy ratio reads about 1/speedup). By UUID too."""
    from sdbench.engine.measure.energy import nvml_meter

    nvml = NVMLDouble([(f"GPU-{i}aaa", [], 1e3) for i in range(4)], energy_mj=lambda i: 1000 * (i + 1))
    assert nvml_meter(nvml, ["3", "1"], 1).read() == 4.0  # GPU 3's counter: 4,000 mJ
    assert nvml_meter(nvml, ["3", "1"], 2).read() == 6.0  # GPUs 3 and 1
    assert nvml_meter(nvml, ["GPU-2", "GPU-0"], 1).read() == 3.0
    assert nvml_meter(nvml, None, 1).read() == 1.0  # no list: the node's first
    with pytest.raises(RuntimeError, match=r"no GPU among \['7'\]"):
        nvml_meter(nvml, ["7"], 1)


def test_the_meter_follows_cuda_visible_devices_from_the_environment() -> None:
    """The issue's case end to end through meter_for: CUDA_VISIBLE_DEVICES=3,1, tp=1 meters GPU 3
    (the old code took NVML's first: GPU 0 here, 1,000 mJ)."""
    nvml = NVMLDouble([(f"GPU-{i}aaa", [], 1e3) for i in range(4)], energy_mj=lambda i: 1000 * (i + 1))
    meter = meter_for({"device": "cuda"}, 1, nvml=nvml, env={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert (meter.kind, meter.reason, meter.read()) == ("nvml", "", 4.0)


def dram_tree(root: Path, bench: Bench) -> None:
    """Package 0 (half the bench's joules), its core subzone (a part of the package: not counted
    again), its DRAM (a quarter, starting 1 J below its 10 J wrap) and package 1 (a quarter)."""
    rapl_tree(root, bench, {"intel-rapl:0": ("package-0", 0, 500_000), "intel-rapl:0:0": ("core", 0, 300_000),
                            "intel-rapl:0:1": ("dram", 9_000_000, 250_000), "intel-rapl:1": ("package-1", 0, 250_000)})


def test_rapl_dram_is_metered_beside_the_package_and_kept_apart(tmp_path: Path) -> None:
    bench = Bench()
    dram_tree(tmp_path / "pc", bench)
    meter = meter_for({"device": "cpu"}, rapl_root=tmp_path / "pc")
    assert (meter.kind, meter.reason, meter.dram_j) == ("rapl", "", 0.0)
    bench.spend(1.0, 8.0)  # DRAM: 2 J, from 9 J across its 10 J wrap
    assert (meter.read(), meter.dram_j) == (pytest.approx(8.0, rel=1e-12), pytest.approx(2.0, rel=1e-12))
    # Unmoved counters add 0 J (not a wrap).
    assert (meter.read(), meter.dram_j) == (pytest.approx(8.0, rel=1e-12), pytest.approx(2.0, rel=1e-12))
    # Through the timed calls into the calls and the cell: energy_j is the total, energy_dram_j its DRAM part.
    roots: list[Path] = []

    def tree_meter(b: Bench) -> object:
        roots.append(tmp_path / f"cell{len(roots)}")
        dram_tree(roots[-1], b)
        return meter_for({"device": "cpu"}, rapl_root=roots[-1])

    cells = energycells.measure(tree_meter, device="cpu", paired=False)
    sd1 = cell(cells, "ngram-k3", 1)
    calls = sd1["calls"].sort_values(["trial", "call_index"])
    assert calls["energy_j"].tolist() == pytest.approx([6.0, 12.0] * 3, rel=1e-12)
    assert calls["energy_dram_j"].tolist() == pytest.approx([1.5, 3.0] * 3, rel=1e-12)
    assert set(calls["energy_reason"]) == {""}
    s = sd1["summary"].iloc[0]
    assert (s["energy_j"], s["energy_dram_j"], s["energy_reason"]) == (pytest.approx(54.0), pytest.approx(13.5), "")
    # Without a dram domain (AMD RAPL) the DRAM column is NaN, not 0.
    nodram = tmp_path / "nodram"
    dram_tree(nodram, Bench())
    for f in (nodram / "intel-rapl:0:1").iterdir():
        f.unlink()
    (nodram / "intel-rapl:0:1").rmdir()
    assert math.isnan(meter_for({"device": "cpu"}, rapl_root=nodram).dram_j)


def test_every_meter_that_does_not_measure_says_why_and_the_cells_carry_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sdbench.engine.measure import energy
    from sdbench.engine.measure.energy import RAPL_ROOT, energy_columns, engine_meter

    monkeypatch.setattr(energy, "nvml_module", lambda: None)
    assert meter_for({"device": "cuda"}).reason.startswith("no NVML (pynvml not importable")
    absent = meter_for({"device": "cpu"}, rapl_root=tmp_path / "absent")
    assert absent.reason == (f"no RAPL: {tmp_path / 'absent'} does not exist (no powercap driver: a VM, or a kernel "
                             "without intel_rapl)")  # fmt: skip
    (tmp_path / "empty").mkdir()
    assert meter_for({"device": "cpu"}, rapl_root=tmp_path / "empty").reason.startswith("no RAPL: no package domain")
    # Root-only energy_uj (CVE-2020-8694): this test runs as root, so the read itself is refused.
    dram_tree(tmp_path / "pc", Bench())
    locked = tmp_path / "pc" / "intel-rapl:0:1" / "energy_uj"
    real = refuse_reads(monkeypatch, locked)
    denied = meter_for({"device": "cpu"}, rapl_root=tmp_path / "pc")
    assert denied.kind == NOT_MEASURED and denied.reason.startswith(
        f"RAPL unreadable: permission denied on {locked} (root-only since CVE-2020-8694; to meter, make it readable: "
        "`sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj")  # fmt: skip
    monkeypatch.setattr(Path, "read_text", real)
    # This VM has no powercap: the default CPU engine's meter says so.
    if not RAPL_ROOT.exists():
        assert engine_meter({"engine": {"device": "cpu"}, "model": {}}).reason.startswith(
            "no RAPL: /sys/class/powercap does not exist")
    # A cell whose calls read different meters is not measured, and says so.
    mixed = pd.DataFrame({"energy_meter": ["nvml", "rapl"], "energy_reason": ["", ""], "energy_j": [1.0, 2.0],
                          "num_output_tokens": [10, 10], "duration_s": [1.0, 1.0]})  # fmt: skip
    got = energy_columns(mixed, 0)
    assert (got["energy_meter"], got["energy_reason"]) == (NOT_MEASURED, "mixed meters across trials (nvml, rapl)")
    # The reason rides from the meter through the calls and the cell to the cells table and its page.
    why = "no RAPL: /x does not exist"
    cells = energycells.measure(lambda bench: NoMeter(why))
    assert all(set(c["calls"]["energy_reason"]) == {why} for c in cells)
    assert all(c["summary"].at[0, "energy_reason"] == why for c in cells)
    table = energycells.joined(cells)
    assert set(table["energy_reason"]) == {why}
    from sdbench.analysis.energy import NOT_RECORDED, energy_markdown, energy_table

    text = energy_markdown(energy_table(table))
    assert f"- {why}: 4 cell(s) (e/m/d: ngram-k3 bs1, ngram-k3 bs2, none bs1, none bs2)" in text
    measured = energycells.joined(energycells.measure(nvml_meter))
    assert set(measured["energy_reason"]) == {""}
    assert "Not measured, and why" not in energy_markdown(energy_table(measured))
    old = table.drop(columns="energy_reason")  # a cells table from before the column
    assert set(energy_table(old)["energy_reason"]) == {NOT_RECORDED}
