"""Fetching the published traces: local copy, sha256 check, atomic output."""

from __future__ import annotations

import shutil

import pytest

from sdbench.cli import main
from sdbench.traces.fetch import (
    PUBLISHED_SHA256,
    ChecksumError,
    fetch_published_traces,
    published_url,
    sha256_file,
)


def test_pinned_url_and_hashes():
    assert published_url("cnn") == (
        "https://raw.githubusercontent.com/SpecDecode-Bench/simulator/"
        "2fdccbd61b62be339fb85fd90caf43f5e8392aa6/data/llama3.1-8B/combined_cnn.jsonl"
    )
    assert set(PUBLISHED_SHA256) == {"gsm8k", "instructcoder", "sharegpt", "cnn"}
    with pytest.raises(ValueError, match="unknown dataset 'mmlu'"):
        published_url("mmlu")


def test_copy_from_local_dir(published_traces_dir, tmp_path):
    out = tmp_path / "resources" / "combined_gsm8k.jsonl"
    args = ["fetch", "published-traces", "--dataset", "gsm8k", "--output", str(out)]
    assert main([*args, "--local-dir", str(published_traces_dir)]) == 0
    assert sha256_file(out) == PUBLISHED_SHA256["gsm8k"]
    assert out.read_bytes() == (published_traces_dir / "combined_gsm8k.jsonl").read_bytes()


def test_corrupted_local_copy_is_rejected(published_traces_dir, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    bad = local / "combined_gsm8k.jsonl"
    shutil.copyfile(published_traces_dir / "combined_gsm8k.jsonl", bad)
    with open(bad, "ab") as fh:
        fh.write(b"\n")
    out = tmp_path / "out" / "combined_gsm8k.jsonl"
    with pytest.raises(ChecksumError) as err:
        fetch_published_traces("gsm8k", out, local_dir=local)
    msg = str(err.value)
    assert str(bad) in msg and PUBLISHED_SHA256["gsm8k"] in msg and sha256_file(bad) in msg
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temporary left behind

    args = [
        "fetch",
        "published-traces",
        "--dataset",
        "gsm8k",
        "--output",
        str(out),
        "--local-dir",
        str(local),
    ]
    assert main(args) == 2  # bad input: one `error:` line, exit code 2 (sdbench.cli.main)
