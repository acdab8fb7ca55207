"""`sdbench bench parity`: the parts without an engine, and one slow end-to-end run."""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from support import tinybuild
from support.require import import_or_fail
import yaml

from sdbench.bench import parity, paritytool

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def config() -> dict:
    from sdbench.config import load_config

    return load_config(REPO / "config" / "config.yaml")


# --- argument translation ------------------------------------------------------------


def _stub_parser() -> argparse.ArgumentParser:
    """The option kinds the tool's parser uses for engine arguments."""
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--speculative-config", type=json.loads)
    return p


def test_engine_cli_args_spells_each_kind() -> None:
    kwargs = {
        "model": "/m",
        "max_num_seqs": 8,
        "enable_prefix_caching": False,
        "enforce_eager": True,
        "disable_log_stats": False,
        "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
    }
    argv = paritytool.engine_cli_args(kwargs, _stub_parser())
    assert argv == [
        "--model", "/m",
        "--max-num-seqs", "8",
        "--no-enable-prefix-caching",
        "--enforce-eager",
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
    ]  # fmt: skip
    parsed = _stub_parser().parse_args(argv)
    assert parsed.enable_prefix_caching is False and parsed.disable_log_stats is False
    assert parsed.speculative_config == kwargs["speculative_config"]
    assert paritytool.engine_cli_args({"disable_log_stats": True}, _stub_parser()) == ["--disable-log-stats"]


def test_engine_cli_args_refuses_what_the_tool_cannot_take() -> None:
    with pytest.raises(ValueError, match="no option for engine argument 'worker_cls'"):
        paritytool.engine_cli_args({"worker_cls": "x"}, _stub_parser())
    with pytest.raises(ValueError, match="expected a bool"):
        paritytool.engine_cli_args({"enforce_eager": "yes"}, _stub_parser())


@pytest.mark.parametrize("method", ["none", "ngram-k3"])
def test_tool_argv_builds_the_runners_engine_args(config: dict, method: str, tmp_path: Path) -> None:
    """The real tool parser: EngineArgs from the argv equal those LLM(**kwargs) builds."""
    import_or_fail("vllm")
    from sdbench.engine.measure.engine import build_llm_kwargs

    spec = parity.parity_spec(config, "vllm-cpu", "tiny-target", "code-edit", method, 8, 64)
    kwargs = build_llm_kwargs(spec, str(tmp_path / "model"), None)
    parser = paritytool.vllm_bench_parser()
    argv = paritytool.vllm_bench_argv(kwargs, parser, tmp_path / "p.json", 64, 128, parity.warmup_sequences(spec))
    assert argv[:12] == [
        "--backend", "vllm", "--dataset-name", "sharegpt", "--dataset-path", str(tmp_path / "p.json"),
        "--num-prompts", "64", "--output-len", "128", "--num-warmups", "8",
    ]  # fmt: skip
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "1073741824"
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert paritytool.engine_args_diff(kwargs, argv, parser) == {}
    if method == "ngram-k3":
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
            "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 7,
        }  # fmt: skip
    # A real difference is reported.
    assert set(paritytool.engine_args_diff({**kwargs, "max_num_seqs": 4}, argv, parser)) == {"max_num_seqs"}


def test_parity_spec_fixes_the_workload(config: dict) -> None:
    spec = parity.parity_spec(config, "vllm-cpu", "tiny-target", "code-edit", "ngram-k3", 8, 64, max_tokens=32)
    assert spec["run"]["batch_mode"] == "distinct" and spec["run"]["ignore_eos"] is True
    assert spec["run"]["num_requests"] == 64 and spec["run"]["repeats"] == 1
    assert spec["dataset"]["max_tokens"] == 32 and spec["cell"]["batch_size"] == 8
    assert parity.warmup_sequences(spec) == 8
    from sdbench.config import ConfigError

    with pytest.raises(ConfigError, match="methods.nope"):
        parity.parity_spec(config, "vllm-cpu", "tiny-target", "code-edit", "nope", 8, 64)


# --- ratio math ------------------------------------------------------------------------


def _rows(runner: list[float], vllm: list[float]) -> list[dict]:
    rows = [{"side": "runner", "trial": i, "tokens_per_s": v} for i, v in enumerate(runner)]
    return rows + [{"side": "vllm", "trial": i, "tokens_per_s": v} for i, v in enumerate(vllm)]


def test_summarise_trials_medians_spread_ratio() -> None:
    s = parity.summarise_trials(_rows([90.0, 100.0, 95.0], [100.0, 110.0, 100.0]))
    assert s["runner"]["median"] == 95.0 and s["vllm"]["median"] == 100.0
    assert s["runner"]["spread_pct"] == pytest.approx(100 * 10 / 95)
    assert s["ratio"] == pytest.approx(0.95)
    assert s["pair_ratios"] == pytest.approx([0.9, 100 / 110, 0.95])
    assert s["pair_ratio_median"] == pytest.approx(100 / 110)
    assert s["within_bound"] is False  # 5% slower than the tool
    ok = parity.summarise_trials(_rows([97.5], [100.0]))
    assert ok["within_bound"] is True and ok["ratio"] == pytest.approx(0.975)
    assert parity.summarise_trials(_rows([120.0], [100.0]))["within_bound"] is True


def test_summarise_trials_needs_both_sides() -> None:
    with pytest.raises(ValueError, match="no vllm runs"):
        parity.summarise_trials(_rows([1.0], []))


def test_report_names_the_verdict() -> None:
    rows = [dict(r, output_tokens=128, elapsed_s=1.0) for r in _rows([90.0], [100.0])]
    text = parity.format_report(parity.summarise_trials(rows), rows)
    assert "ratio runner/vllm (medians) 0.900" in text and "VIOLATED" in text


# --- prompt file ------------------------------------------------------------------------


def _tool_order(path: Path, seed: int) -> list[str]:
    """What vLLM's ShareGPTDataset.load_data does to the entries (0.32): filter, seed, shuffle."""
    data = [e for e in json.loads(path.read_text()) if len(e.get("conversations", [])) >= 2]
    random.seed(seed)
    random.shuffle(data)
    return [e["conversations"][0]["value"] for e in data]


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_sharegpt_file_comes_out_in_our_order(tmp_path: Path, n: int) -> None:
    texts = [f"prompt {i}" for i in range(n)]
    path = paritytool.write_sharegpt(tmp_path / "p.json", texts, seed=42)
    assert _tool_order(path, 42) == texts
    if n > 2:
        assert [e["conversations"][0]["value"] for e in json.loads(path.read_text())] != texts


def test_sharegpt_file_with_the_tools_own_loader(tmp_path: Path) -> None:
    import_or_fail("vllm")
    from vllm.benchmarks.datasets.datasets import ShareGPTDataset

    texts = [f"def f{i}(x):\n    return x + {i}\n" for i in range(20)]
    path = paritytool.write_sharegpt(tmp_path / "p.json", texts, seed=7)
    loaded = ShareGPTDataset(random_seed=7, dataset_path=str(path)).data
    assert [e["conversations"][0]["value"] for e in loaded] == texts


class _CharTokenizer:
    """One id per character (id = ord - 30), BOS = 0 added on encode, like the tiny models'."""

    bos_token_id = 0

    def __call__(self, text: str) -> dict:
        return {"input_ids": [0] + [ord(c) - 30 for c in text.replace("<s>", "")]}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("<s>" if t == 0 else chr(t + 30) for t in ids)


def test_prompt_texts_retokenize_to_the_same_ids() -> None:
    tok = _CharTokenizer()
    ids = [tok("def f(): pass")["input_ids"], tok("x = 1")["input_ids"]]
    texts, bad = paritytool.prompt_texts(tok, ids)
    assert bad == [] and [tok(t)["input_ids"] for t in texts] == ids
    # Without a BOS no text re-tokenizes to these ids: reported, never silently changed.
    texts, bad = paritytool.prompt_texts(tok, [[40, 41]])
    assert bad == [0]


# --- command line -------------------------------------------------------------------------


def test_bench_parity_is_registered() -> None:
    from sdbench.cli import build_parser

    argv = ["bench", "parity", "--model", "tiny-target", "--dataset", "code-edit", "--method", "none",
            "--batch-size", "8", "--model-dir", "M", "--prompts", "P", "--workdir", "W"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert args.func.resolve() is parity._cmd_bench_parity and args.repeats == parity.DEFAULT_REPEATS
    assert args.vllm_sampling == "runner" and args.vllm_env == "runner"


# --- end to end ---------------------------------------------------------------------------


def _sdbench(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(BIN / "sdbench"), *args], cwd=cwd, capture_output=True, text=True, timeout=1800)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


CONTENDED = "(contended; not trustworthy)"  # how parity.py words a run other processes shared the CPU with


@pytest.mark.slow
def test_parity_end_to_end(tmp_path: Path, tiny_target_build: Path) -> None:
    """Both sides run the same work on a tiny model; no timing assertion (not a timed test). The
    model is the session's shared tiny target (support/tinybuild.py), its tokenizer beside it."""
    d = tmp_path
    tok, model = (tiny_target_build / out for out in tinybuild.OUTPUTS)
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    entry = {**config["datasets"]["code-edit"], "num_prompts": 4}
    _sdbench("prepare-dataset", "--name", "code-edit", "--entry", json.dumps(entry), "--tokenizer", str(tok),
             "--seed", "42", "--output", str(d / "prompts.parquet"), cwd=d)  # fmt: skip
    config["engines"]["vllm-cpu"]["llm_kwargs"]["kv_cache_memory_bytes"] = 268435456
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    # No wait for an idle machine (default up to 600 s per run) and no reruns of a contended run: beside other
    # work a run may come out contended, which the command reports (exit 1) but which is no fault of the code.
    out = _sdbench("bench", "parity", "--config", str(d / "config.yaml"), "--model", "tiny-target",
                   "--dataset", "code-edit", "--method", "ngram-k3", "--batch-size", "4",
                   "--model-dir", str(model), "--prompts", str(d / "prompts.parquet"),
                   "--max-tokens", "16", "--repeats", "1", "--workdir", str(d / "work"),
                   "--quiet-wait", "0", "--retries", "0",
                   "--output-json", str(d / "parity.json"), cwd=d, check=False)  # fmt: skip
    assert (d / "parity.json").is_file(), out.stdout[-3000:] + out.stderr[-5000:]
    report = json.loads((d / "parity.json").read_text())
    assert out.returncode == (1 if report["problems"] else 0), out.stdout[-3000:] + out.stderr[-5000:]
    # Same prompt ids, output lengths and engine config on both sides; contention is the machine's, not a fault.
    assert [p for p in report["problems"] if not p.endswith(CONTENDED)] == []
    assert report["retokenization_mismatches"] == []
    assert [(t["side"], t["attempt"]) for t in report["trials"]] == [("runner", 0), ("vllm", 0)]  # no reruns
    assert all(isinstance(t["contended"], bool) and math.isfinite(t["foreign_cpu_share"]) for t in report["trials"])
    s = report["summary"]  # its structure only: which side is faster is no test's business
    assert {"runner", "vllm", "ratio", "within_bound"} <= set(s) and math.isfinite(s["ratio"])
    assert report["identical_outputs"] == 4  # greedy on both sides: the same work
    assert all(t["output_tokens"] == 4 * 16 for t in report["trials"])
    assert "--speculative-config" in report["vllm_bench_throughput_args"]
    assert "ratio runner/vllm" in out.stdout
