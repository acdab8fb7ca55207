"""Cost models: the shipped paper model, schema validation, least-squares fit."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import yaml

from sdbench.cli import main
from sdbench.simulator.costmodel import (
    STEP_COLUMNS,
    available_cost_models,
    cost_model_from_dict,
    fit_cost_model,
    load_cost_model,
    predict_step_times,
)


def test_shipped_model_is_the_papers() -> None:
    m = load_cost_model("llama3.1-8b-h100")
    assert (m.target.c_kv, m.target.c_compute, m.target.c_fixed) == (3.92645679e-08, 2.10103129e-05, 5.88590713e-03)
    eagle = m.drafter("eagle")
    assert (eagle.kind, eagle.c_kv, eagle.c_spec, eagle.c_fixed) == (
        "linear",
        2.37768493e-09,
        8.41429603e-07,
        2.13526175e-03,
    )
    ngram = m.drafter("ngram")
    assert (ngram.kind, ngram.fraction) == ("fraction_of_verify", 0.005875)
    assert m.overhead_per_step == 1.20683946e-03
    assert "llama3.1-8b-h100" in available_cost_models()
    # Verify time of the published simulator's formula.
    assert m.target.time(1000, 8) == pytest.approx(1000 * 3.92645679e-08 + 8 * 2.10103129e-05 + 5.88590713e-03)


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda d: d["drafters"]["eagle"].update(c_spc=1.0), "drafters.eagle"),
        (lambda d: d["drafters"]["eagle"].pop("c_spec"), "drafters.eagle"),
        (lambda d: d["drafters"]["ngram"].update(kind="fraction"), "drafters.ngram.kind"),
        (lambda d: d["target"].update(c_kv=-1.0), "target.c_kv"),
        (lambda d: d.pop("overhead_per_step"), "<top level>"),
    ],
)
def test_schema_errors_name_file_and_key(tmp_path, mutate, key) -> None:
    data = load_cost_model("llama3.1-8b-h100").to_dict()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError) as err:
        load_cost_model(path)
    assert str(path) in str(err.value) and key in str(err.value)


def test_unknown_name_lists_available() -> None:
    with pytest.raises(FileNotFoundError, match="llama3.1-8b-h100"):
        load_cost_model("no-such-model")


def _synthetic_steps(rng: np.random.Generator, n: int = 600, noise: float = 0.01) -> tuple[pd.DataFrame, dict]:
    """Step timings drawn from known coefficients with multiplicative noise."""
    true = {
        "c_kv": 4e-8,
        "c_compute": 2e-5,
        "c_fixed": 6e-3,
        "frac": 0.006,
        "e_kv": 2.5e-9,
        "e_spec": 8e-7,
        "e_fixed": 2e-3,
        "overhead": 1.2e-3,
    }
    method = rng.choice(["none", "ngram", "eagle"], size=n)
    batch = rng.choice([1, 4, 8, 16, 32, 64], size=n)
    k = np.where(method == "none", 0, rng.integers(1, 6, size=n))
    kv = batch * rng.integers(100, 3000, size=n)
    batched = batch * (1 + k)
    proposed = batch * k
    verify = true["c_kv"] * kv + true["c_compute"] * batched + true["c_fixed"]
    propose = np.select(
        [method == "ngram", method == "eagle"],
        [true["frac"] * verify, true["e_kv"] * kv + true["e_spec"] * proposed + true["e_fixed"]],
        0.0,
    )
    jitter = lambda x: x * (1 + noise * rng.standard_normal(n))  # noqa: E731
    verify, propose = jitter(verify), jitter(propose)
    step = verify + propose + true["overhead"] * (1 + noise * rng.standard_normal(n))
    df = pd.DataFrame(
        {
            "method": method,
            "batch_size": batch,
            "num_batched_tokens": batched,
            "num_kv_tokens": kv,
            "num_proposed_tokens": proposed,
            "verify_s": verify,
            "propose_s": propose,
            "step_s": step,
        }
    )
    return df[list(STEP_COLUMNS)], true


def test_fit_recovers_known_coefficients() -> None:
    steps, true = _synthetic_steps(np.random.default_rng(0))
    m = fit_cost_model(steps, "synthetic")
    assert m.target.c_kv == pytest.approx(true["c_kv"], rel=0.03)
    assert m.target.c_compute == pytest.approx(true["c_compute"], rel=0.03)
    assert m.target.c_fixed == pytest.approx(true["c_fixed"], rel=0.03)
    assert m.drafter("ngram").fraction == pytest.approx(true["frac"], rel=0.03)
    eagle = m.drafter("eagle")
    assert eagle.c_fixed == pytest.approx(true["e_fixed"], rel=0.03)
    assert eagle.c_spec == pytest.approx(true["e_spec"], rel=0.1)
    assert m.overhead_per_step == pytest.approx(true["overhead"], rel=0.05)
    r2 = m.fit["r2"]
    assert set(r2) == {"target", "ngram", "eagle", "step"}
    assert all(v > 0.98 for v in r2.values())
    assert np.corrcoef(predict_step_times(m, steps), steps["step_s"])[0, 1] > 0.99


def test_fit_cli_writes_valid_yaml_and_prints_r2(tmp_path, capsys) -> None:
    steps, _ = _synthetic_steps(np.random.default_rng(1), n=200)
    steps_path, out = tmp_path / "steps.parquet", tmp_path / "fitted.yaml"
    steps.to_parquet(steps_path)
    assert main(["costmodel", "fit", "--steps", str(steps_path), "--output", str(out), "--name", "cpu-test"]) == 0
    printed = capsys.readouterr().out
    assert "R^2 target" in printed and "R^2 eagle" in printed
    model = load_cost_model(out)  # validates against the schema
    assert model.name == "cpu-test" and not math.isnan(model.fit["r2"]["target"])
    # The fitted model is usable by name-or-path resolution and round-trips.
    assert cost_model_from_dict(yaml.safe_load(out.read_text()), str(out)) == model


def test_fit_rejects_missing_columns(tmp_path, capsys) -> None:
    steps, _ = _synthetic_steps(np.random.default_rng(2), n=20)
    path = tmp_path / "steps.csv"
    steps.drop(columns=["verify_s"]).to_csv(path, index=False)
    # Bad input: one `error:` line on stderr, exit code 2 (sdbench.cli.main).
    assert main(["costmodel", "fit", "--steps", str(path), "--output", str(tmp_path / "x.yaml"), "--name", "x"]) == 2
    assert re.search(r"^error: .*steps\.csv.*verify_s", capsys.readouterr().err)
