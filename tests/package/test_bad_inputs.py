"""Bad inputs, one line each: the real CLI (a subprocess) exits non-zero with ONE line on stderr,
``error: ...``, naming the file, key or value and what was expected, and no traceback.

The cases run concurrently in two module fixtures (each ``sdbench`` start-up is a new interpreter;
the cases that break a model are slow: it is built once with ``build-tokenizer`` + ``train-model``),
and the EAGLE-1 / EAGLE-3 heads are written with the layouts vLLM loads (see sdbench.models.check).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sdbench import cli
from sdbench.models.check import check_model_dir
from sdbench.traces.table import MethodTrace, make_trace_table

REPO = Path(__file__).resolve().parents[2]
SDBENCH = Path(sys.executable).with_name("sdbench")
# Six small stdlib files, two of them in the held-out split: a tokenizer in ~1 s instead of ~50 s.
CORPUS = ("_sitebuiltins.py", "_aix_support.py", "bisect.py", "crypt.py", "imghdr.py", "colorsys.py")
TINY = "--layers 1 --hidden 32 --heads 2 --kv-heads 2 --intermediate 64 --steps 2 --batch-size 2 --seq-len 64"
TINY += " --eval-tokens 256 --eval-edit-examples 2"
URL = "https://raw.githubusercontent.com/SpecDecode-Bench/simulator/"


@dataclass(frozen=True)
class Case:
    """``argv`` with ``{d}`` for the inputs directory; ``expect``: substrings of the error line."""

    id: str
    argv: str
    expect: tuple[str, ...]
    model: bool = False  # needs the trained model (runs after the fixture built it)


CASES = [
    # --- config keys (sdbench check-config, what the DAG loads) -------------------------------------
    Case("config-missing", "check-config {d}/nowhere.yaml", ("nowhere.yaml", "config file not found")),
    Case("config-not-yaml", "check-config {d}/not_yaml.yaml", ("not_yaml.yaml", "not valid YAML", "line 2")),
    Case("config-empty", "check-config {d}/empty.yaml", ("empty.yaml", "empty")),
    Case("config-key-typo", "check-config {d}/typo.yaml", ("typo.yaml", "batch_size", "check the spelling")),
    Case("config-bad-value", "check-config {d}/bad_value.yaml", ("grid[0].batch_sizes[1]", "0 is less than")),
    Case("config-unknown-model", "check-config {d}/unknown_model.yaml", ("grid[0].models", "'tiny-targt'")),
    # --- CLI arguments ------------------------------------------------------------------------------
    Case("cli-unknown-command", "frobnicate", ("invalid choice: 'frobnicate'",)),
    Case("cli-bad-choice", "memory --target x/y --dtype fp99", ("--dtype", "'fp99'", "float16")),
    Case("cli-not-int", "simulate --traces t.jsonl --batch-sizes eight", ("--batch-sizes", "'eight'")),
    Case("cli-missing-arg", "simulate --traces {d}/good_trace.parquet", ("--proposer", "--output")),
    Case("cli-bad-json-arg", "prepare-dataset --name x --entry {{num --tokenizer t --output o", ("--entry",)),
    # --- trace tables -------------------------------------------------------------------------------
    Case(
        "trace-truncated",
        "trace stack --inputs {d}/truncated.parquet --output {d}/o.parquet",
        ("truncated.parquet", "trace table", "magic bytes"),
    ),
    Case(
        "trace-footer-flipped",
        "trace stack --inputs {d}/footer_flipped.parquet --output {d}/o.parquet",
        ("footer_flipped.parquet", "not a readable trace table"),
    ),
    Case(
        "trace-empty-file",
        "acceptance table4 --traces {d}/empty.parquet --output {d}/t4.parquet",
        ("empty.parquet", "the file is empty"),
    ),
    Case(
        "trace-wrong-schema",
        "trace stack --inputs {d}/wrong_schema.parquet --output {d}/o.parquet",
        ("wrong_schema.parquet", "lacks column(s)", "acc_len"),
    ),
    Case(
        "trace-acc-len-0",
        "simulate --traces {d}/acc0.parquet --proposer ngram --output {d}/o.csv",
        ("acc0.parquet", "acc_len must be >= 1", "position 1"),
    ),
    Case(
        "trace-missing",
        "simulate --traces {d}/nowhere.parquet --proposer ngram --output {d}/o.csv",
        ("nowhere.parquet", "does not exist"),
    ),
    Case(
        "published-bad-json",
        "trace published --input {d}/combined_bad.jsonl --output {d}/o.parquet",
        ("combined_bad.jsonl:2", "not valid JSON"),
    ),
    # --- cost models --------------------------------------------------------------------------------
    Case("costmodel-bad-yaml", "costmodel show {d}/cm_bad.yaml", ("cm_bad.yaml", "not valid YAML", "line")),
    Case("costmodel-missing-key", "costmodel show {d}/cm_missing.yaml", ("cm_missing.yaml", "overhead_per_step")),
    Case("costmodel-negative", "costmodel show {d}/cm_negative.yaml", ("cm_negative.yaml", "target.c_kv", "-0.5")),
    Case(
        "costmodel-unknown-name",
        "simulate --traces {d}/good_trace.parquet --proposer ngram --output {d}/o.csv --cost-model nonexistent",
        ("'nonexistent'", "llama3.1-8b-h100"),
    ),
    Case(
        "steps-missing-column",
        "costmodel fit --steps {d}/steps.csv --output {d}/cm.yaml --name x",
        ("steps.csv", "verify_s"),
    ),
    # --- prompt / requests tables -------------------------------------------------------------------
    Case(
        "requests-missing-column",
        "bleu buckets --input {d}/req_nocol.parquet --output {d}/o.parquet",
        ("req_nocol.parquet", "output_token_ids"),
    ),
    Case(
        "requests-empty-table",
        "bleu buckets --input {d}/req_empty.parquet --output {d}/o.parquet",
        ("req_empty.parquet", "no requests"),
    ),
    Case(
        "requests-not-parquet",
        "trace ngram --input {d}/not_parquet.parquet --output {d}/o.parquet",
        ("not_parquet.parquet", "not a readable requests table"),
    ),
    # --- published traces offline (https_proxy points at a closed port: no network) ------------------
    Case(
        "fetch-offline",
        "fetch published-traces --dataset gsm8k --output {d}/g.jsonl --timeout 5",
        (URL, "combined_gsm8k.jsonl", "download failed", "--local-dir"),
    ),
    # --- model and head directories (sdbench check-model, sdbench memory) ----------------------------
    Case("memory-unknown-model", "memory --target unknown/model", ("'unknown/model'", "unknown--model.yaml")),
    Case("model-dir-missing", "check-model {d}/models/nowhere", ("models/nowhere", "does not exist")),
    Case("model-no-config", "check-model {d}/models/no_config", ("no_config", "no config.json"), model=True),
    Case("model-bad-config", "check-model {d}/models/bad_config", ("bad_config/config.json", "not valid JSON"), True),
    Case("model-no-weights", "check-model {d}/models/no_weights", ("no_weights", "no weights file"), model=True),
    Case("model-truncated-weights", "check-model {d}/models/truncated", ("model.safetensors", "truncated"), True),
    Case(
        "model-no-q-proj",
        "check-model {d}/models/no_q_proj",
        ("no_q_proj", "model.layers.0.self_attn.q_proj.weight"),
        model=True,
    ),
    Case(
        "model-renamed-norm",
        "check-model {d}/models/renamed_norm --role draft",
        ("renamed_norm", "model.norm.weight"),
        model=True,
    ),
    Case("eagle-no-fc", "check-model {d}/models/eagle_no_fc --role eagle", ("eagle_no_fc", "fc.weight"), True),
    Case(
        "eagle-extra-norm",
        "check-model {d}/models/eagle_extra_norm --role eagle",
        ("eagle_extra_norm", "layers.0.input_layernorm.weight", "unexpected"),
        model=True,
    ),
    Case(
        "eagle3-no-hidden-norm",
        "check-model {d}/models/eagle3_no_hidden_norm --role eagle3",
        ("eagle3_no_hidden_norm", "midlayer.hidden_norm.weight"),
        model=True,
    ),
    Case(
        "eagle-given-target", "check-model {d}/models/target --role eagle", ("target", "fc.weight", "full model"), True
    ),
]


def _sdbench(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SDBENCH), *argv], capture_output=True, text=True, env=env, timeout=120)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SDBENCH_DEBUG", "SDBENCH_DATA_DIR", "NO_PROXY")}
    env.update(https_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", no_proxy="")
    return env


def _argv(case: Case, d: Path) -> list[str]:
    return [a.format(d=d) for a in case.argv.split()]


def _write_inputs(d: Path) -> None:
    """Every bad file the non-model cases read."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    (d / "not_yaml.yaml").write_text("seed: 42\ngrid: [engine: vllm-cpu\n")
    (d / "empty.yaml").write_text("")
    for name, edit in {
        "typo": lambda c: c["grid"][0].update(batch_size=[1]),
        "bad_value": lambda c: c["grid"][0].update(batch_sizes=[1, 0]),
        "unknown_model": lambda c: c["grid"][0].update(models=["tiny-targt"]),
    }.items():
        broken = json.loads(json.dumps(config))
        edit(broken)
        (d / f"{name}.yaml").write_text(yaml.safe_dump(broken))

    trace = make_trace_table([MethodTrace("r0", "ngram", np.array([1, 2, 3]))])
    trace.to_parquet(d / "good_trace.parquet", index=False)
    data = (d / "good_trace.parquet").read_bytes()
    (d / "truncated.parquet").write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    for i in range(len(flipped) - 40, len(flipped) - 8):  # footer metadata, before length + magic
        flipped[i] ^= 0xFF
    (d / "footer_flipped.parquet").write_bytes(bytes(flipped))
    (d / "empty.parquet").write_bytes(b"")
    pd.DataFrame({"a": [1]}).to_parquet(d / "wrong_schema.parquet")
    zero = trace.copy()
    zero.loc[1, "acc_len"] = 0
    zero.to_parquet(d / "acc0.parquet", index=False)
    good = {"id": "r0", "prompt_token_ids": [1], "generated_token_ids": [2], "acc_ngram": {"acc_len": [1]}}
    good["acc_eagle"] = {"acc_len": [1]}
    (d / "combined_bad.jsonl").write_text(json.dumps(good) + '\n{"id": "r1", "prompt_token_ids": [1\n')

    (d / "cm_bad.yaml").write_text("name: x\ntarget: {c_kv: 1, c_compute: 1\n")
    model = {"name": "x", "target": {"c_kv": 1e-6, "c_compute": 1e-4, "c_fixed": 1e-3}}
    model["drafters"] = {"ngram": {"kind": "fraction_of_verify", "fraction": 0.05}}
    (d / "cm_missing.yaml").write_text(yaml.safe_dump(model))
    model |= {"overhead_per_step": 0.0, "target": {"c_kv": -0.5, "c_compute": 1e-4, "c_fixed": 1e-3}}
    (d / "cm_negative.yaml").write_text(yaml.safe_dump(model))
    pd.DataFrame({"method": ["ngram"], "batch_size": [1], "step_s": [0.1]}).to_csv(d / "steps.csv", index=False)

    requests = pd.DataFrame({"request_id": ["a"], "prompt_token_ids": [[1, 2]], "output_token_ids": [[3]]})
    requests.drop(columns="output_token_ids").to_parquet(d / "req_nocol.parquet")
    requests.iloc[:0].to_parquet(d / "req_empty.parquet")
    (d / "not_parquet.parquet").write_text("request_id,prompt_token_ids\na,1 2\n")


def _rewrite(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Copy model directory ``src`` to ``dst`` with ``edit(tensors)`` applied to its safetensors."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})


def _write_head(target: Path, dst: Path, eagle3: bool) -> None:
    """An untrained 1-layer EAGLE-1 or EAGLE-3 head for ``target`` (brief §2 key layouts)."""
    from safetensors.numpy import save_file

    cfg = json.loads((target / "config.json").read_text())
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.02

    p, attn_in = ("midlayer.", 2 * h) if eagle3 else ("layers.0.", h)
    tensors = {
        "fc.weight": w(h, 2 * h),  # EAGLE-1: [embedding, target hidden]; EAGLE-3: two aux layers
        f"{p}self_attn.q_proj.weight": w(q, attn_in),
        f"{p}self_attn.k_proj.weight": w(kv, attn_in),
        f"{p}self_attn.v_proj.weight": w(kv, attn_in),
        f"{p}self_attn.o_proj.weight": w(h, q),
        f"{p}post_attention_layernorm.weight": np.ones(h, np.float32),
        f"{p}mlp.gate_proj.weight": w(inter, h),
        f"{p}mlp.up_proj.weight": w(inter, h),
        f"{p}mlp.down_proj.weight": w(h, inter),
    }
    cfg |= {"num_hidden_layers": 1, "architectures": ["EagleLlamaForCausalLM"]}
    if eagle3:
        tensors |= {f"{p}input_layernorm.weight": np.ones(h, np.float32), f"{p}hidden_norm.weight": np.ones(h)}
        tensors["norm.weight"] = np.ones(h, np.float32)
        cfg |= {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": cfg["vocab_size"]}
        cfg |= {"target_hidden_size": h, "num_aux_hidden_states": 2}
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 1], "use_aux_hidden_state": True}
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.astype(np.float32) for k, v in tensors.items()}, dst / "model.safetensors")


def _build_models(d: Path, env: dict[str, str]) -> None:
    """Tiny target via the real CLI, EAGLE heads beside it, then one broken copy per case."""
    corpus = d / "corpus"
    corpus.mkdir()
    for name in CORPUS:
        shutil.copy(Path(sysconfig.get_paths()["stdlib"]) / name, corpus / name)
    m = d / "models"
    for argv in (
        f"build-tokenizer --output {m}/tok --vocab-size 300 --corpus-root {corpus}",
        f"train-model --tokenizer {m}/tok --output {m}/target {TINY}",
    ):
        proc = _sdbench(argv.split(), env)
        assert proc.returncode == 0, proc.stderr[-3000:]
    target = m / "target"
    _write_head(target, m / "eagle", eagle3=False)
    _write_head(target, m / "eagle3", eagle3=True)

    shutil.copytree(target, m / "no_config")
    (m / "no_config/config.json").unlink()
    shutil.copytree(target, m / "bad_config")
    (m / "bad_config/config.json").write_text('{"model_type": "llama",')
    shutil.copytree(target, m / "no_weights")
    (m / "no_weights/model.safetensors").unlink()
    shutil.copytree(target, m / "truncated")
    weights = (m / "truncated/model.safetensors").read_bytes()
    (m / "truncated/model.safetensors").write_bytes(weights[: len(weights) // 2])
    _rewrite(target, m / "no_q_proj", lambda t: t.pop("model.layers.0.self_attn.q_proj.weight"))
    _rewrite(target, m / "renamed_norm", lambda t: t.update({"model.final_norm.weight": t.pop("model.norm.weight")}))
    _rewrite(m / "eagle", m / "eagle_no_fc", lambda t: t.pop("fc.weight"))
    _rewrite(
        m / "eagle",
        m / "eagle_extra_norm",
        lambda t: t.update({"layers.0.input_layernorm.weight": t["layers.0.post_attention_layernorm.weight"]}),
    )
    _rewrite(m / "eagle3", m / "eagle3_no_hidden_norm", lambda t: t.pop("midlayer.hidden_norm.weight"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad_inputs")
    _write_inputs(d)
    (d / "models").mkdir()
    return d


@pytest.fixture(scope="module")
def light_results(inputs: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """The cases that need no trained model, 3 processes at a time."""
    env = _env()
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.id: pool.submit(_sdbench, _argv(c, inputs), env) for c in CASES if not c.model}
        return {k: f.result() for k, f in futures.items()}


@pytest.fixture(scope="module")
def model_results(inputs: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    """The cases that break a trained model: the models are built first (the slow tier)."""
    env = _env()
    _build_models(inputs, env)
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {c.id: pool.submit(_sdbench, _argv(c, inputs), env) for c in CASES if c.model}
        return {k: f.result() for k, f in futures.items()}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=[pytest.mark.slow] if c.model else []) for c in CASES], ids=[c.id for c in CASES]
)
def test_bad_input_is_one_error_line(case: Case, request: pytest.FixtureRequest, inputs: Path) -> None:
    results = request.getfixturevalue("model_results" if case.model else "light_results")
    proc = results[case.id]
    lines = proc.stderr.splitlines()
    assert proc.returncode != 0, proc.stdout
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for text in case.expect:
        assert text.format(d=inputs) in lines[0], lines[0]
    assert proc.returncode == cli.EXIT_USER_ERROR, lines[0]


def test_debug_shows_the_traceback(inputs: Path) -> None:
    proc = _sdbench(["--debug", "costmodel", "show", str(inputs / "cm_negative.yaml")], _env())
    assert proc.returncode == cli.EXIT_USER_ERROR
    assert "Traceback (most recent call last)" in proc.stderr and "cost_model_from_dict" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("error: ") and "target.c_kv" in proc.stderr.splitlines()[-1]


def test_internal_error_is_one_line_with_a_hint(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr("sdbench.simulator.costmodel._cmd_show", lambda args: 1 / 0)
    assert cli.main(["costmodel", "show", "x"]) == cli.EXIT_INTERNAL_ERROR
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "error: internal error: ZeroDivisionError: division by zero (rerun as "
        "`sdbench --debug costmodel show x` for the traceback)"
    ]


def test_prompt_table_reader_names_the_file(inputs: Path) -> None:
    from sdbench.datasets.prompttable import read_prompt_table

    good = pd.DataFrame({"request_id": ["a"], "prompt_token_ids": [[1, 2]], "prompt_text": ["x"]})
    good.to_parquet(inputs / "prompts.parquet")
    assert len(read_prompt_table(inputs / "prompts.parquet")) == 1
    good.drop(columns="prompt_token_ids").to_parquet(inputs / "prompts_nocol.parquet")
    good.iloc[:0].to_parquet(inputs / "prompts_empty.parquet")
    for name, match in (
        ("prompts_nocol.parquet", r"prompts_nocol\.parquet: prompt table lacks column\(s\) prompt_token_ids"),
        ("prompts_empty.parquet", r"prompts_empty\.parquet: prompt table has no rows"),
        ("not_parquet.parquet", r"not_parquet\.parquet: not a readable prompt table"),
    ):
        with pytest.raises(ValueError, match=match):
            read_prompt_table(inputs / name)
    with pytest.raises(FileNotFoundError, match="expected a prompt table"):
        read_prompt_table(inputs / "nowhere.parquet")


@pytest.mark.slow
def test_good_models_pass_check_model(model_results: dict, inputs: Path) -> None:
    m = inputs / "models"
    check_model_dir(m / "target", "target")
    check_model_dir(m / "eagle", "eagle")
    check_model_dir(m / "eagle3", "eagle3")


def test_help_lists_every_command_and_the_command_table_is_complete() -> None:
    registered: dict[str, set[str]] = {}
    for stage in cli.STAGE_CLIS:
        sub = argparse.ArgumentParser().add_subparsers()
        stage.register(sub)
        for command in sub.choices:
            registered.setdefault(command, set()).add(stage.__name__)
    assert all(len(stages) == 1 for stages in registered.values()), registered
    top = {"check-config", "figure-index", "bundle", "containers", "compare", "doctor", "rehearsal", "image-gate"}  # added by sdbench.cli itself
    assert set(cli.COMMANDS) == set(registered) | top, "sdbench.cli.COMMANDS must list every stage's commands"
    assert set(cli.TOOLS) <= set(cli.COMMANDS), set(cli.TOOLS) - set(cli.COMMANDS)
    proc = subprocess.run([str(SDBENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    for command in cli.COMMANDS:
        assert command in proc.stdout, command
    # `sdbench check-model` imports its own implementation only, beyond the parser's modules.
    def sdbench_modules(code: str) -> set[str]:
        code = f"import sys; from sdbench import cli; {code}; print(sorted(m for m in sys.modules if 'sdbench' in m))"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        return set(ast.literal_eval(proc.stdout.strip()))

    parser = sdbench_modules("cli.build_parser()")
    ran = sdbench_modules("cli.main(['check-model', '/nowhere'])")
    assert "sdbench.models.check" in ran and ran - parser <= {"sdbench.models.check"}, sorted(ran - parser)
