"""Server mode across server starts (sdbench.servermode, sdbench.engine.serving.servegroup): the plan's
jobs with and without ``server.interleave``, the rounds spread over ``server.starts``, the
stream-off control, energy per round, and the summary columns of docs/schema.md (server tables).

Fast: synthetic servers and clients, no vLLM.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
import yaml

from sdbench import scheduling
from sdbench.config import ConfigError, validate_config
from sdbench.engine.serving import servegroup
from sdbench.engine.measure.counters import SDCounters
from sdbench.engine.serving.loadgen import RequestResult
from sdbench.servermode import ServerGroup, server_groups, start_order, start_rounds
from sdbench.workflow.plan import Plan

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / ".test" / "config" / "server.yaml"


def _config(**server: Any) -> dict[str, Any]:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["server"].update(server)
    return validate_config(raw)


# ----------------------------------------------------------------------------- the plan
def test_without_interleave_one_job_per_method_as_before() -> None:
    plan = Plan(_config(interleave=False))
    assert plan.server_groups == [ServerGroup("vllm-cpu", "tiny-target", ("ngram-k3",)),
                                  ServerGroup("vllm-cpu", "tiny-target", ("none",))]  # fmt: skip
    assert plan.server_output_patterns() == ["results/server/{engine}/{model}/{method}"]
    assert plan.server_log_pattern(".log") == "logs/serve_group/{engine}/{model}/{method}.log"
    assert plan.server_group_of({"engine": "vllm-cpu", "model": "tiny-target", "method": "none"}).methods == ("none",)


def test_interleave_makes_one_job_per_model_writing_every_arms_directory() -> None:
    plan = Plan(_config(interleave=True, starts=2))
    (group,) = plan.server_groups
    assert group == ServerGroup("vllm-cpu", "tiny-target", ("none", "ngram-k3"), True)
    assert group.as_dict() == {"engine": "vllm-cpu", "model": "tiny-target"}  # the rule's wildcards
    assert plan.server_output_patterns() == ["results/server/{engine}/{model}/none",
                                             "results/server/{engine}/{model}/ngram-k3"]  # fmt: skip
    # The analyses read the same per-arm directories with or without it.
    assert sorted(plan.server_group_dirs()) == sorted(Plan(_config(interleave=False)).server_group_dirs())
    assert plan.server_log_pattern(".server.log") == "logs/serve_group/{engine}/{model}/interleaved.server.log"
    assert plan.server_group_of({"engine": "vllm-cpu", "model": "tiny-target"}) == group
    spec = plan.server_group_spec(group)
    assert list(spec["arms"]) == ["none", "ngram-k3"] and spec["group"]["interleave"] is True


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"starts": 3, "rounds": 2}, "server.starts: 3 starts but server.rounds is 2"),
        ({"stream_control": [3]}, "server.stream_control[0]: 3 is not one of server.concurrency (1, 2)"),
        ({"starts": 0}, "server.starts: 0 is less than the minimum of 1"),
    ],
)
def test_bad_starts_or_control_is_refused_naming_the_key(server: dict[str, Any], message: str) -> None:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["server"].update(server)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(raw)


def test_rounds_go_round_robin_over_the_starts() -> None:
    assert [start_rounds(5, 2, s) for s in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert [start_rounds(3, 3, s) for s in (0, 1, 2)] == [[0], [1], [2]]
    assert start_rounds(2, 1, 0) == [0, 1]  # one start: today's rounds
    with pytest.raises(ValueError, match="need 0 <= start < starts <= rounds"):
        start_rounds(1, 2, 0)


def test_interleaved_starts_alternate_the_arms() -> None:
    # A B B A: the arms' order reversed every other start, so neither always runs first.
    assert start_order(["none", "sd"], 2, True) == [(0, "none"), (0, "sd"), (1, "sd"), (1, "none")]
    assert [m for _, m in start_order(["none", "a", "b"], 3, True)] == ["none", "a", "b", "b", "a", "none", "none", "a", "b"]
    assert start_order(["sd"], 3, False) == [(0, "sd"), (1, "sd"), (2, "sd")]


def test_the_estimate_counts_every_start_of_every_arm() -> None:
    """An interleaved job of 2 arms at 2 starts: 4 server starts, the first at the start-up timeout
    (300 s in the test config), the others at the device's usual start; its timed work is the two
    one-arm jobs' together, and a control level adds one round per start."""
    one = _config(interleave=False, starts=1, stream_control=[])
    usual = scheduling._costs(one, "vllm-cpu").startup_min * 60
    by_arm = [scheduling.estimate_breakdown(one, "server", [Plan(one).server_cell(g)]) for g in server_groups(one)]
    both = _config(interleave=True, starts=2, stream_control=[])
    job = scheduling.estimate_breakdown(both, "server", [Plan(both).server_cell(server_groups(both)[0])])
    assert job.startups == 4 and job.startup_s == pytest.approx(max(300.0, usual) + 3 * usual)
    assert job.decode_s > sum(e.decode_s for e in by_arm)  # warm-up per start
    controlled = _config(interleave=True, starts=2, stream_control=[2])
    more = scheduling.estimate_breakdown(controlled, "server", [Plan(controlled).server_cell(server_groups(controlled)[0])])
    assert more.decode_s > job.decode_s and more.startups == 4


# ----------------------------------------------------------------------------- a synthetic level
class _Client:
    """A client whose round r's wall is 1 + r seconds and whose requests each decode 10 tokens
    (a control's 20 tokens in 1 s); it logs every call."""

    measured = True

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def run_level(self, num_requests: int, round_: int, stream: bool = True, **level: Any):
        self.calls.append((level["base_url"], level["concurrency"], round_, stream))
        tokens = 10 if stream else 20
        results = [RequestResult(round_, i, f"r{i}", 3, tokens, 0.0, 0.1 if stream else math.nan, 0.5,
                                 0.01 if stream else math.nan, 3 if stream else 1, [0.1, 0.1] if stream else [])
                   for i in range(num_requests)]  # fmt: skip
        return results, (1.0 + round_ if round_ >= 0 and stream else 1.0)

    def read_metrics(self, base_url: str) -> SDCounters:
        n = len(self.calls)
        return SDCounters(n, 3 * n, 2 * n, (n,))


class _Meter:
    """A counter that gains 100 J per read."""

    kind, reason = "rapl", ""

    def __init__(self) -> None:
        self.j = 0.0

    def read(self) -> float:
        self.j += 100.0
        return self.j


SPEC = {"server": {"concurrency": [1, 2], "rounds": 3, "starts": 2, "requests_per_level": 2, "warmup_requests": 0,
                   "stream_control": [1]},
        "run": {}, "engine": {"device": "cpu"},
        "group": {"engine": "e", "model": "m", "method": "ngram-k3"},
        "datasets": {"d": {"num_prompts": 1, "max_tokens": 4}},
        "method": {"method": "ngram", "num_speculative_tokens": 3}}  # fmt: skip
PROMPTS = {"d": pd.DataFrame({"request_id": ["r0"], "prompt_token_ids": [[1, 2, 3]]})}
JOB = {"starts": 2, "interleaved": True, "start_sequence": [1, 3], "job_id": "j", "energy_meter": "rapl",
       "energy_reason": "", "server_startup_s": 2.0}  # fmt: skip


def _parts(monkeypatch: pytest.MonkeyPatch) -> tuple[_Client, dict[str, list[servegroup.StartPart]]]:
    monkeypatch.setattr(servegroup, "provenance", lambda **kw: {"hardware": "h"})
    client, meter = _Client(), _Meter()
    parts: dict[str, list[servegroup.StartPart]] = {}
    for start in (0, 1):
        server = SimpleNamespace(base_url=f"http://s{start}", check_alive=lambda: None)
        for sub, part in servegroup.measure_start(server, SPEC, PROMPTS, "disabled", client, start, meter).items():
            parts.setdefault(sub, []).append(part)
    return client, parts


def test_each_start_measures_its_rounds_then_the_stream_off_control(monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = _parts(monkeypatch)
    # Start 0 runs rounds 0 and 2, start 1 round 1; level 1's control is round 3 + start, streamed off.
    assert client.calls == [
        ("http://s0", 1, 0, True), ("http://s0", 1, 2, True), ("http://s0", 1, 3, False),
        ("http://s0", 2, 0, True), ("http://s0", 2, 2, True),
        ("http://s1", 1, 1, True), ("http://s1", 1, 4, False),
        ("http://s1", 2, 1, True),
    ]  # fmt: skip


def test_a_cell_over_two_starts_summarises_its_timed_rounds_only(monkeypatch: pytest.MonkeyPatch) -> None:
    _, parts = _parts(monkeypatch)
    keys = {"engine": "e", "model": "m", "dataset": "d", "method": "ngram-k3", "concurrency": 1}
    tables = servegroup.assemble_cell(keys, parts["d/c1"], SPEC, True, JOB)
    s, requests = tables["summary"].iloc[0], tables["requests"]
    assert s["round_wall_s"] == [1.0, 2.0, 3.0] and s["round_start"] == [0, 1, 0]
    assert s["rounds"] == 3 and s["requests_per_round"] == 2
    assert s["tokens_per_s"] == pytest.approx(20 / 2.0)  # median of 20/1, 20/2, 20/3: the control left out
    assert s["mean_output_tokens"] == 10.0 and s["tpot_p50_ms"] == pytest.approx(10.0)
    assert s["stream_off_round_wall_s"] == [1.0, 1.0] and s["stream_off_tokens_per_s"] == pytest.approx(40.0)
    assert s["round_energy_j"] == [100.0, 100.0, 100.0]  # one read before, one after each round
    assert (s["starts"], s["interleaved"], s["start_sequence"], s["job_id"]) == (2, True, [1, 3], "j")
    # Counters: each start's timed rounds (the read before the control): start 0 read at 0 and 2
    # calls, start 1 at 5 and 6 (the test client counts its calls).
    assert s["num_drafts"] == (2 - 0) + (6 - 5)
    assert requests["round"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # unique per cell across starts
    assert requests["start"].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 1, 1]
    assert requests["stream"].tolist() == [True] * 6 + [False] * 4
    no_control = servegroup.assemble_cell({**keys, "concurrency": 2}, parts["d/c2"], SPEC, True, JOB)["summary"]
    assert math.isnan(no_control.at[0, "stream_off_tokens_per_s"]) and no_control.at[0, "stream_off_round_wall_s"] == []


def run_standin_interleaved_job(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[dict[str, Path], list[str]]:
    """run_server_group with stand-in servers (no vLLM: a test double for the server process and a
    scripted client), 2 arms (no SD, n-gram k=3) x 2 starts interleaved, an unreadable meter: each
    arm's output directory, and the vLLM method of each server start in the order they started."""
    started: list[str] = []

    class _Server:
        def __init__(self, argv: list[str], env: dict[str, str], log: Path, port: int, cpus: Any = None) -> None:
            self.method, self.base_url, self.log_path = argv[-1], f"http://{argv[-1]}", log
            self.proc = SimpleNamespace(pid=1)

        def __enter__(self) -> _Server:
            started.append(self.method)
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def wait_ready(self, timeout_s: float) -> float:
            return 2.0

        def check_alive(self, grace_s: float = 0.0) -> None:
            return None

    monkeypatch.setattr(servegroup, "ServerProcess", _Server)
    monkeypatch.setattr(servegroup, "build_llm_kwargs", lambda spec, model, drafter: {"m": spec["method"]["method"]})
    monkeypatch.setattr(servegroup, "server_argv", lambda kwargs, version, port: ["py", kwargs["m"]])
    monkeypatch.setattr(servegroup, "free_port", lambda: 1)
    monkeypatch.setattr(servegroup, "cpu_placement", lambda engine: None)
    monkeypatch.setattr(servegroup, "server_env", lambda *a: {})
    monkeypatch.setattr(servegroup, "HTTP_CLIENT", _Client())
    monkeypatch.setattr(servegroup, "provenance", lambda **kw: {"hardware": "h"})
    import sdbench.engine.measure.energy as energy

    monkeypatch.setattr(energy, "engine_meter", lambda spec: energy.NoMeter("RAPL unreadable: permission denied"))
    arms = {"none": {"method": {"method": "none"}, "drafter": None},
            "ngram-k3": {"method": {"method": "ngram", "num_speculative_tokens": 3}, "drafter": None}}  # fmt: skip
    spec = {**{k: v for k, v in SPEC.items() if k not in ("method", "group")}, "seed": 1, "model": {},
            "engine": {"device": "cpu", "vllm_version": "0.32.0"},
            "group": {"engine": "e", "model": "m", "methods": ["none", "ngram-k3"], "interleave": True},
            "server": {**SPEC["server"], "interleave": True}, "arms": arms}  # fmt: skip
    outs = {m: tmp_path / m for m in arms}
    servegroup.run_server_group(spec, PROMPTS, "model", {}, outs, tmp_path / "server.log")
    return outs, started


def test_an_interleaved_job_alternates_its_arms_and_shares_its_id(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """run_server_group with stand-in servers: 2 arms x 2 starts in start_order, each arm's
    directory as without interleave, its summary saying where its starts fell."""
    outs, started = run_standin_interleaved_job(monkeypatch, tmp_path)
    assert started == ["none", "ngram", "ngram", "none"]
    log = (tmp_path / "server.log").read_text()
    assert log.count("=== sdbench: server start") == 4
    summaries = {m: pd.read_parquet(outs[m] / "d" / "c1" / "summary.parquet").iloc[0] for m in outs}
    assert summaries["none"]["start_sequence"].tolist() == [0, 3]
    assert summaries["ngram-k3"]["start_sequence"].tolist() == [1, 2]
    assert summaries["none"]["job_id"] == summaries["ngram-k3"]["job_id"] != ""
    assert all(s["interleaved"] and s["starts"] == 2 for s in summaries.values())
    assert summaries["none"]["energy_reason"] == "RAPL unreadable: permission denied"
    # NaN per round unmetered (a null inside a parquet list: NaN once read as float).
    assert pd.isna(summaries["none"]["round_energy_j"]).all() and len(summaries["none"]["round_energy_j"]) == 3
    assert summaries["ngram-k3"]["method"] == "ngram-k3" and summaries["ngram-k3"]["sd_method"] == "ngram"
    meta = json.loads((outs["none"] / "server.json").read_text())
    assert meta["startups_s"] == [2.0, 2.0] and meta["start_order"][1] == [0, "ngram-k3"]


# ----------------------------------------------------------------------------- the schema doc
NEW_COLUMNS = {
    "requests.parquet": ["start", "stream"],
    "summary.parquet": ["starts", "interleaved", "round_start", "start_sequence", "job_id", "round_energy_j",
                        "energy_meter", "energy_reason", "stream_off_tokens_per_s", "stream_off_round_wall_s"],
}  # fmt: skip


def test_the_schema_doc_names_every_server_column_across_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/schema.md's server-mode tables name each column the job writes for its starts, and
    the job writes each of them."""
    text = (REPO / "docs" / "schema.md").read_text()
    section = text[text.index("- Server mode (`sdbench serve-group`"):text.index("- Rehearsal (`engine_mode: rehearsal`)")]
    tables = {name: section[section.index(f"`{name}`"):] for name in NEW_COLUMNS}
    tables["requests.parquet"] = tables["requests.parquet"][: tables["requests.parquet"].index("`summary.parquet`")]
    for name, columns in NEW_COLUMNS.items():
        missing = [c for c in columns if f"`{c}`" not in tables[name]]
        assert not missing, f"docs/schema.md, server {name}: {missing} not described"
    _, parts = _parts(monkeypatch)
    keys = {"engine": "e", "model": "m", "dataset": "d", "method": "ngram-k3", "concurrency": 1}
    written = servegroup.assemble_cell(keys, parts["d/c1"], SPEC, True, copy.deepcopy(JOB))
    for name, columns in NEW_COLUMNS.items():
        frame = written[name.removesuffix(".parquet")]
        assert set(columns) <= set(frame.columns), set(columns) - set(frame.columns)
