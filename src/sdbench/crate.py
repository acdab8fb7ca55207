"""The RO-Crate metadata of a bundle (``ro-crate-metadata.json``): Workflow Run Crate 0.5 with
Process Run Crate 0.5, built by :func:`build_crate` and checked against the manifest by
:func:`crate_problems` (:mod:`sdbench.bundle` writes and verifies the bundle itself).
"""

from __future__ import annotations

import dataclasses
import json
import mimetypes
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote

from sdbench.engine.site.hardware import package_version
from sdbench.provenance import MARK, MEASURED

if TYPE_CHECKING:  # pandas is imported where used: the workflow imports sdbench.bundle at parse time
    import pandas as pd

CRATE_METADATA = "ro-crate-metadata.json"
MANIFEST = "MANIFEST.sha256"
RUN_ID = "#sdbench-run"

WFRUN_CONTEXT = "https://w3id.org/ro/terms/workflow-run/context"
WFRUN_TERMS = "https://w3id.org/ro/terms/workflow-run#"
PROFILES = {
    "https://w3id.org/ro/wfrun/process/0.5": "Process Run Crate",
    "https://w3id.org/ro/wfrun/workflow/0.5": "Workflow Run Crate",
}
# Engine-side packages described as SoftwareApplication entities of the crate.
ENGINE_PACKAGES = {"vllm": "vllm_version", "torch": "torch_version", "transformers": "transformers_version"}
MIME_TYPES = {
    ".parquet": "application/vnd.apache.parquet",
    ".md": "text/markdown",
    ".yaml": "application/yaml",
    ".yml": "application/yaml",
    ".jsonl": "application/jsonl",
    ".sha256": "text/plain",
    ".smk": "text/x-python",
    ".rst": "text/x-rst",
    ".tsv": "text/tab-separated-values",
}


class BundleFile(Protocol):
    """A file of the bundle as the crate sees it (:class:`sdbench.bundle.Member`)."""

    arcname: str

    def size(self) -> int: ...


def _mime(name: str) -> str | None:
    suffix = PurePosixPath(name).suffix.lower()
    return MIME_TYPES.get(suffix) or mimetypes.guess_type(name)[0]


@dataclasses.dataclass
class CrateInfo:
    """What the crate says beyond the file list."""

    workflow: str
    workflow_parts: list[str]
    config: str | None
    report: str | None
    results: list[str]
    environments: dict[str, str]
    provenance: list[str]
    containers_file: str | None
    images: list[dict[str, str]]
    cells: pd.DataFrame
    containers_used: tuple[str, ...] = ()
    start_time: str | None = None
    end_time: str | None = None
    date_published: str | None = None


def image_reference(ref: str) -> dict[str, str]:
    """Split ``docker://registry/name:tag@sha256:...`` into registry, name, tag, sha256 and image type."""
    out: dict[str, str] = {}
    scheme, sep, rest = ref.partition("://")
    if not sep:
        scheme, rest = "", ref
    if rest.endswith(".sif") or scheme in ("library", "oras", "shub"):
        out["type"] = "SIFImage"
    elif scheme in ("", "docker", "oci", "docker-daemon"):
        out["type"] = "DockerImage"
    rest, _, digest = rest.partition("@")
    if digest.startswith("sha256:"):
        out["sha256"] = digest.removeprefix("sha256:")
    if out.get("type") == "DockerImage":
        first, slash, remainder = rest.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            out["registry"], rest = first, remainder
        else:
            out["registry"] = "docker.io"
        name, colon, tag = rest.rpartition(":")
        out["name"], out["tag"] = (name, tag) if colon and "/" not in tag else (rest, "")
    else:
        out["name"] = rest
    return {k: v for k, v in out.items() if v}


def build_crate(members: Sequence[BundleFile], digests: dict[str, str], info: CrateInfo) -> bytes:
    """``ro-crate-metadata.json`` of the bundle (Workflow Run Crate 0.5), as deterministic bytes."""
    from rocrate.model.contextentity import ContextEntity
    from rocrate.rocrate import ROCrate

    crate = ROCrate()
    crate.metadata.extra_contexts.append(WFRUN_CONTEXT)
    root = crate.root_dataset
    root["name"] = "sdbench results bundle"
    root["description"] = (
        "Results, figures, tables, report and provenance of one run of the sdbench speculative-decoding "
        "benchmark workflow. MANIFEST.sha256 checksums every file; `sdbench bundle verify` checks them."
    )
    rehearsed = int((~info.cells[MEASURED]).sum()) if MEASURED in info.cells else 0
    if rehearsed:  # bundled with --allow-rehearsal: the crate says so before anything else
        root["name"] += f" ({MARK})"
        root["description"] = (f"A rehearsal, not a measurement: {rehearsed} of {len(info.cells)} cells were "
                               f"written by a stand-in engine (measured = false). " + root["description"])
    # The library stamps the wall clock; a bundle's date comes from its inputs or is left out.
    if info.date_published:
        root["datePublished"] = info.date_published
    else:
        del root["datePublished"]
    root["license"] = crate.add(
        ContextEntity(crate, "https://spdx.org/licenses/Apache-2.0", {"@type": "CreativeWork", "name": "Apache-2.0"})
    )

    sizes = {m.arcname: m.size() for m in members}

    def file_props(path: str, **extra: Any) -> dict[str, Any]:
        props: dict[str, Any] = {"name": PurePosixPath(path).name, "contentSize": str(sizes[path])}
        if path in digests:
            props["sha256"] = digests[path]
        if mime := _mime(path):
            props["encodingFormat"] = mime
        return {**props, **extra}

    wf_props = file_props(info.workflow, name="sdbench", description="Snakemake workflow of the sdbench benchmark")
    workflow = crate.add_workflow(
        dest_path=info.workflow,
        main=True,
        lang="snakemake",
        lang_version=package_version("snakemake"),
        properties=wf_props,
    )
    for pid, pname in PROFILES.items():
        profile = crate.add(
            ContextEntity(crate, pid, {"@type": ["CreativeWork", "Profile"], "name": pname, "version": "0.5"})
        )
        root.append_to("conformsTo", profile)

    entities: dict[str, Any] = {info.workflow: workflow}
    descriptions = {
        info.config: "Resolved configuration of the run (schema defaults filled in)",
        info.report: "Snakemake HTML report of the run",
        info.containers_file: "Container images and their digests",
    }
    for path, env in sorted((p, e) for e, p in info.environments.items()):
        descriptions[path] = f"Package versions (pip freeze) of environment {env}"
    descriptions.update(
        {
            "provenance/cells.parquet": "Engine package versions and hardware of every cell, from its summary.parquet",
            "provenance/excluded.tsv": "Files of results/ left out of the bundle (path, bytes, sha256, reason)",
        }
    )
    for m in members:
        name = m.arcname
        if name in (info.workflow, CRATE_METADATA):
            continue
        extra: dict[str, Any] = {}
        if name in descriptions:
            extra["description"] = descriptions[name]
        if name in info.environments.values() or name in info.provenance or name == info.report:
            extra["about"] = {"@id": RUN_ID}
        entities[name] = crate.add_file(dest_path=name, properties=file_props(name, **extra))
    crate.add_file(
        dest_path=MANIFEST,
        properties={
            "name": MANIFEST,
            "encodingFormat": "text/plain",
            "description": "sha256sum of every file of the bundle except this one",
        },
    )
    workflow["hasPart"] = [entities[p] for p in info.workflow_parts]

    # Engine versions that produced the cells: the packages the workflow needed at run time.
    software = []
    for package, column in ENGINE_PACKAGES.items():
        versions = info.cells[column].dropna().unique() if column in info.cells else []
        for version in sorted(str(v) for v in versions):
            software.append(
                crate.add(
                    ContextEntity(
                        crate,
                        f"#{package}-{version}",
                        {
                            "@type": "SoftwareApplication",
                            "name": package,
                            "softwareVersion": version,
                        },
                    )
                )
            )
    if software:
        workflow["softwareRequirements"] = software

    # sdbench's images are SIFs built locally from a digest-pinned base: the base carries the sha256.
    by_key = {}
    for image in info.images:
        base_id = f"#image-sha256-{image['base_sha256']}"
        if base_id not in crate:
            props = {
                "@type": "ContainerImage",
                "additionalType": {"@id": WFRUN_TERMS + "DockerImage"},
                "identifier": image["base"],
            }
            props.update(
                {k: image[f"base_{k}"] for k in ("registry", "name", "tag", "sha256") if image.get(f"base_{k}")}
            )
            crate.add(ContextEntity(crate, base_id, props))
        description = f"sdbench {image['kind']} image"
        if image["vllm_version"]:
            description += f" (vLLM {image['vllm_version']})"
        by_key[image["key"]] = crate.add(
            ContextEntity(
                crate,
                f"#image-{quote(image['key'], safe='')}",
                {
                    "@type": "ContainerImage",
                    "additionalType": {"@id": WFRUN_TERMS + "SIFImage"},
                    "name": image["key"],
                    "description": description + f", built from {image['base']} (containers/images.yaml)",
                    "isBasedOn": {"@id": base_id},
                },
            )
        )
    if info.containers_file and by_key:
        entities[info.containers_file]["about"] = list(by_key.values())
    # The run's images: those Snakemake recorded for its jobs, given that they ran there (--containers-used).
    used = []
    for url in info.containers_used:
        key = PurePosixPath(url).stem if url.endswith(".sif") else None
        if key in by_key:
            used.append(by_key[key])
        else:
            ref = image_reference(url)
            used.append(
                crate.add(
                    ContextEntity(
                        crate,
                        f"#image-{quote(url, safe='')}",
                        {
                            "@type": "ContainerImage",
                            "identifier": url,
                            **({"additionalType": {"@id": WFRUN_TERMS + ref["type"]}} if ref.get("type") else {}),
                            **{k: ref[k] for k in ("registry", "name", "tag", "sha256") if ref.get(k)},
                        },
                    )
                )
            )

    action_props: dict[str, Any] = {
        "@type": "CreateAction",
        "name": "Run of the sdbench workflow",
        "actionStatus": {"@id": "http://schema.org/CompletedActionStatus"},
    }
    if info.start_time:
        action_props["startTime"] = info.start_time
    if info.end_time:
        action_props["endTime"] = info.end_time
    action = crate.add_action(
        workflow,
        identifier=RUN_ID,
        properties=action_props,
        object=[entities[info.config]] if info.config else None,
        result=[entities[p] for p in info.results] or None,
    )
    if used:
        action["containerImage"] = used
    root.append_to("mentions", action)

    text = json.dumps(crate.metadata.generate(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    return text.encode()


def crate_problems(crate_bytes: bytes | None, manifest: dict[str, str]) -> list[str]:
    """Manifest files the RO-Crate does not list as File entities, or lists with another sha256."""
    if crate_bytes is None:
        return [f"CRATE: {CRATE_METADATA} missing"]
    try:
        graph = json.loads(crate_bytes)["@graph"]
    except (ValueError, KeyError, TypeError) as exc:
        return [f"CRATE: {CRATE_METADATA} unreadable ({exc})"]
    files = {}
    for entity in graph:
        types = entity.get("@type", [])
        if "File" in (types if isinstance(types, list) else [types]):
            files[entity.get("@id")] = entity
    problems = []
    for name, digest in sorted(manifest.items()):
        if name == CRATE_METADATA:
            continue  # the metadata descriptor describes the crate, it does not list itself as a File
        entity = files.get(quote(name))
        if entity is None:
            problems.append(f"NOT IN CRATE: {name}")
        elif entity.get("sha256") not in (None, digest):
            problems.append(f"CRATE SHA256 DIFFERS: {name}")
    return problems
