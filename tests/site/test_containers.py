"""Apptainer definitions: rendered from containers/images.yaml, checked with spython,
and the apptainer test double that stands in for the runtime here."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import sdbench
from sdbench import containercheck, containers
from sdbench.cli import main
from sdbench.config import ConfigError

REPO = Path(__file__).resolve().parents[2]
CONTAINERS = REPO / "containers"
IMAGES = CONTAINERS / "images.yaml"
DOUBLES = REPO / "tests" / "support" / "doubles"
DIGEST = "sha256:" + "ab" * 32


def _images() -> containers.ImagesFile:
    return containers.load_images(IMAGES)


def _minimal() -> dict[str, Any]:
    """A small valid images.yaml: one engine with a fork, one analysis image."""
    return {
        "images": {
            "eng": {
                "kind": "engine",
                "base": f"vllm/vllm-openai:v0.11.1@{DIGEST}",
                "vllm_version": "0.11.1",
                "pip": ["sacrebleu==2.6.0"],
                "datasets_pip": ["datasets==5.2.0"],
                "fork": {"repo": "https://github.com/o/vllm", "branch": "b", "commit": "c" * 40, "adds": "drafts"},
            },
            "ana": {
                "kind": "analysis",
                "base": f"python:3.11-slim-bookworm@{DIGEST}",
                "requirements": "requirements/analysis.txt",
                "build_backend": "setuptools==78.1.1",
            },
        }
    }


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "images.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- rendering ---------------------------------------------------------------------------


def test_render_is_deterministic(tmp_path: Path) -> None:
    first = containers.render_all(IMAGES, tmp_path / "a")
    containers.render_all(IMAGES, tmp_path / "b")
    assert all(changed for _, changed in first)
    names = sorted(p.name for p in (tmp_path / "a").glob("*.def"))
    assert names == sorted(p.name for p in (tmp_path / "b").glob("*.def")) and len(names) == len(_images().images)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    # A second render into the same directory rewrites nothing.
    assert not any(changed for _, changed in containers.render_all(IMAGES, tmp_path / "a"))


def test_committed_definitions_are_up_to_date(tmp_path: Path) -> None:
    containers.render_all(IMAGES, tmp_path)
    for image in _images().images:
        committed = CONTAINERS / f"{image.name}.def"
        assert committed.read_text() == (tmp_path / committed.name).read_text(), f"re-render {committed.name}"
    problems, warnings = containercheck.check_all(IMAGES, CONTAINERS)
    assert problems == []
    assert [w.split(":")[0] for w in warnings] == list(_images().unresolved)


def test_every_configured_container_is_defined_or_explained() -> None:
    images = _images()
    defined = {image.name for image in images.images}
    for config in ("config.yaml", "paper.yaml"):
        engines = yaml.safe_load((REPO / "config" / config).read_text())["engines"]
        for engine in engines.values():
            if "container" in engine:
                name = Path(engine["container"]).stem
                assert name in defined or name in images.unresolved, (config, name)


@pytest.mark.parametrize("image", _images().images, ids=lambda image: image.name)
def test_committed_definition_parses_pinned_labelled_tested(image: containers.ImageSpec) -> None:
    parsed = containercheck.parse_definition(CONTAINERS / f"{image.name}.def")
    assert re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", parsed.from_header)
    assert parsed.from_header == image.base.lower()
    labels = parsed.labels
    assert labels["org.sdbench.image.name"] == image.name
    assert labels["org.opencontainers.image.base.digest"] == parsed.from_header.split("@")[1]
    assert labels["org.sdbench.version"] == sdbench.__version__
    assert parsed.environ["HF_HUB_OFFLINE"] == '"${HF_HUB_OFFLINE:-1}"'
    assert "../src /opt/sdbench/src" in parsed.files
    commands = [line for line in parsed.post if line and not line.startswith("#")]
    assert commands[-2] == "python3 -m pip install --no-deps --no-build-isolation /opt/sdbench"
    # Then the digest of the code it installed, as a label (a run refuses the image once it differs).
    assert commands[-1] == 'python3 -m sdbench.codedigest --label org.sdbench.code.digest >> "$APPTAINER_LABELS"'
    assert parsed.test[-1] == "sdbench --help >/dev/null"
    if image.kind in containers.ENGINE_KINDS:
        assert labels["org.sdbench.vllm.version"] == image.vllm_version
        assert f"vllm.__version__ == '{image.vllm_version}'" in parsed.test[0]
        assert "import sdbench.engine.measure.forcing, sdbench.engine.measure.steptiming, sdbench.engine.release.acceptancetrace, sdbench.engine.release.enginefixes" in parsed.test[1]
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" in parsed.environ
    else:
        assert "org.sdbench.vllm.version" not in labels
        assert parsed.test[0].startswith('python3 -c "import sdbench, sdbench.analysis.acceptance')
    if image.kind == "engine":
        # The image's vLLM/torch stay: every pip install goes without dependency resolution.
        installs = [line for line in parsed.post if line.startswith("python3 -m pip install")]
        assert installs and all("--no-deps" in line for line in installs)
        assert labels["org.sdbench.datasets.version"] == "5.2.0"
    if image.fork:
        assert re.fullmatch(r"[0-9a-f]{40}", labels["org.sdbench.vllm.fork.commit"])
        assert 'python3 -c "import vllm.v1.spec_decode.draft_model"' in parsed.test


def test_labels_and_plugins_follow_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == sdbench.__version__  # the version label reads sdbench.__version__
    plugins = {name: target.split(":")[0] for name, target in project["entry-points"]["vllm.general_plugins"].items()}
    assert plugins == containers.VLLM_PLUGINS


def test_engine_datasets_pin_is_the_locks() -> None:
    lock = (REPO / "requirements" / "lock.txt").read_text().splitlines()
    for image in _images().images:
        if image.kind == "engine":
            assert f"datasets=={image.datasets_version}" in lock


# --- bad images.yaml ---------------------------------------------------------------------


def _mutate(change) -> dict[str, Any]:
    data = copy.deepcopy(_minimal())
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d["images"]["eng"].update(base="vllm/vllm-openai:v0.11.1"),
            r"image 'eng': key 'base': .* not pinned by digest",
        ),
        (
            lambda d: d["images"]["eng"].update(base="vllm/vllm-openai@sha256:abc"),
            r"image 'eng': key 'base': digest 'abc' is not 64",
        ),
        (
            lambda d: d["images"]["ana"].update(base="python:3.11@sha256:" + "AB" * 32),
            r"image 'ana': key 'base': digest .* not 64 lowercase",
        ),
        (lambda d: d["images"]["eng"].pop("vllm_version"), r"image 'eng': key 'vllm_version': missing"),
        (lambda d: d["images"]["ana"].pop("kind"), r"image 'ana': key 'kind': missing"),
        (lambda d: d["images"]["eng"].update(vllm_version=0.11), r"image 'eng': key 'vllm_version': quote it"),
        (
            lambda d: d["images"]["eng"].update(pip=["sacrebleu>=2"]),
            r"image 'eng': key 'pip': 'sacrebleu>=2' is not an exact pin",
        ),
        (
            lambda d: d["images"]["eng"]["fork"].update(commit="main"),
            r"image 'eng': key 'fork.commit': 'main' is not a 40-hex",
        ),
        (lambda d: d["images"]["eng"]["fork"].pop("adds"), r"image 'eng': key 'fork.adds': missing"),
        (
            lambda d: d["images"]["ana"].update(vllm_version="1"),
            r"image 'ana': key 'vllm_version': not a key of kind analysis",
        ),
        (lambda d: d["images"]["ana"].update(kind="gpu"), r"image 'ana': key 'kind': 'gpu' is not one of"),
        (lambda d: d.pop("images"), r"key 'images': missing"),
    ],
)
def test_bad_images_yaml_names_image_and_key(tmp_path: Path, change, message: str) -> None:
    path = _write(tmp_path, _mutate(change))
    with pytest.raises(ConfigError, match=message):
        containers.load_images(path)


def test_cli_reports_config_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _mutate(lambda d: d["images"]["eng"].update(base="vllm/vllm-openai:latest")))
    assert main(["containers", "render", "--images", str(path), "--output-dir", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err and not list(tmp_path.glob("*.def"))


# --- check ---------------------------------------------------------------------------------


def test_check_names_file_and_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "containers"
    images = _write(tmp_path, _minimal())
    assert main(["containers", "render", "--images", str(images), "--output-dir", str(out)]) == 0
    assert main(["containers", "check", "--images", str(images), "--output-dir", str(out)]) == 0

    eng = out / "eng.def"
    text = eng.read_text()
    eng.write_text(text.replace(f"@{DIGEST}", "").replace("'0.11.1', vllm", "'0.11.0', vllm"))
    (out / "ana.def").unlink()
    (out / "stale.def").write_text(text)
    capsys.readouterr()
    assert main(["containers", "check", "--images", str(images), "--output-dir", str(out)]) == 1
    report = capsys.readouterr().out
    assert f"{eng}: From: 'vllm/vllm-openai:v0.11.1' is not pinned" in report
    assert f"{eng}: %test does not check vllm.__version__ == '0.11.1'" in report
    assert f"{eng}: out of date" in report
    assert f"{out / 'ana.def'}: missing" in report
    assert f"{out / 'stale.def'}: not rendered from" in report


def test_check_compares_pins_with_the_lock(tmp_path: Path) -> None:
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements" / "lock.txt").write_text("sacrebleu==2.6.0\ndatasets==5.2.0\nnumpy==2.3.5\n")
    (tmp_path / "requirements" / "analysis.txt").write_text("# pins\nnumpy==2.3.4\n")
    data = _minimal()
    data["images"]["eng"]["pip"] = ["sacrebleu==2.5.0"]
    images = _write(tmp_path, data)
    containers.render_all(images, tmp_path / "containers")
    problems, _ = containercheck.check_all(images, tmp_path / "containers")
    assert any(
        "key 'pip': sacrebleu==2.5.0 differs from requirements/lock.txt (sacrebleu==2.6.0)" in p for p in problems
    )
    assert any("analysis.txt: numpy==2.3.4 differs" in p for p in problems)
    assert len(problems) == 2


# --- the apptainer test double -------------------------------------------------------------


def _double_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{DOUBLES}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SDBENCH_APPTAINER_CALLS"] = str(tmp_path / "calls.jsonl")
    env["SDBENCH_BUILD_SCRATCH"] = str(tmp_path / "scratch")  # build.sh's cache and temp dirs
    env["SDBENCH_BUILD_FREE_KB_OVERRIDE"] = str(10**12)  # build.sh's space check passes on any disk
    return env


def _calls(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]


# --- source builds ---------------------------------------------------------------------------


def test_the_011_image_builds_arctic_inference_with_pinned_requirements() -> None:
    image = next(i for i in _images().images if i.name == "sdbench-vllm-0.11.1")
    (build,) = image.source_builds
    assert build.requirement == "arctic-inference==0.1.1" and build.from_image == ("torch",)
    assert not any(p.startswith("arctic-inference") for p in image.pip)
    post = (CONTAINERS / "sdbench-vllm-0.11.1.def").read_text()
    wheel = post.index("wheel --no-deps --no-build-isolation")
    assert post.index("g++=4:11.2.0-1ubuntu1") < post.index("nanobind==2.9.2") < wheel
    assert f"arctic_inference-0.1.1.tar.gz#sha256={build.sha256}" in post[wheel:]
    assert post.index("rm -rf /tmp/sdbench-build-env") < post.index("/opt/sdbench/datasets \\")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: b["build_pip"].remove("nanobind==2.9.2"), r"'nanobind==2.9.2' is neither in build_pip nor from_image"),
        (lambda b: b["build_pip"].append("protobuf==6.31.1") or b["build_pip"].remove("protobuf==5.29.5"),
         r"pins protobuf==6.31.1, the archive requires 'protobuf==5.29.5'"),
        (lambda b: b.update(apt=["make=4.3-4.1build1"]), r"compiles C/C\+\+ but apt pins no compiler"),
        (lambda b: b.update(from_image=["torch", "numpy"]), r"from_image names numpy, which the archive does not"),
    ],
)
def test_check_reads_the_archive_and_names_an_uncovered_build_requirement(tmp_path: Path, change, message) -> None:
    """The real arctic-inference 0.1.1 archive (PyPI, sha256-pinned; cached in resources/)."""
    data = yaml.safe_load(IMAGES.read_text())
    change(data["images"]["sdbench-vllm-0.11.1"]["source_builds"][0])
    data["images"] = {"sdbench-vllm-0.11.1": data["images"]["sdbench-vllm-0.11.1"]}
    data.pop("unresolved")
    images = _write(tmp_path, data)
    containers.render_all(images, tmp_path / "containers")
    problems, _ = containercheck.check_all(images, tmp_path / "containers", archives=REPO / containercheck.SOURCE_ARCHIVES)
    assert any(re.search(message, p) for p in problems), problems


def test_bad_source_build_names_the_key(tmp_path: Path) -> None:
    data = yaml.safe_load(IMAGES.read_text())
    data["images"]["sdbench-vllm-0.11.1"]["source_builds"][0]["os"] = "jammy"
    with pytest.raises(ConfigError, match=r"image 'sdbench-vllm-0.11.1': key 'source_builds\[0\].os'"):
        containers.load_images(_write(tmp_path, data))


def test_double_answers_version(tmp_path: Path) -> None:
    env = _double_env(tmp_path)
    for args in (["--version"], ["version"]):
        out = subprocess.run(["apptainer", *args], env=env, capture_output=True, text=True, check=True)
        assert out.stdout == "apptainer version 1.4.0\n"


def test_double_runs_snakemake_exec_call(tmp_path: Path) -> None:
    """Snakemake's own version check and exec command line, run against the double."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = """
import subprocess, sys
from pathlib import Path
from snakemake.deployment.singularity import Singularity, shellcmd
s = Singularity()
s.check()
print(s.binary, s.version.strip())
cmd = shellcmd("sif/engine.sif", 'printf "%s" "$FOO" > out.txt', bind=[Path(sys.argv[1])],
               args="--nv --cleanenv -e", envvars={"FOO": "bar"}, container_workdir=sys.argv[1])
sys.exit(subprocess.run(cmd, shell=True).returncode)
"""
    out = subprocess.run(
        [sys.executable, "-c", script, str(workdir)],
        env=_double_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "apptainer apptainer version 1.4.0"
    assert (workdir / "out.txt").read_text() == "bar"  # ran on the host, in --pwd, with SINGULARITYENV_FOO
    (call,) = _calls(tmp_path)
    assert call["subcommand"] == "exec" and call["image"] == "sif/engine.sif" and call["cwd"] == str(tmp_path)
    assert call["command"][:2] == ["sh", "-c"]
    assert ["--home", str(tmp_path)] in call["options"] and ["--nv", None] in call["options"]
    assert ["--pwd", str(workdir)] in call["options"] and ["--bind", str(workdir)] in call["options"]


def test_double_builds_every_definition_with_build_sh(tmp_path: Path) -> None:
    copy_dir = tmp_path / "containers"
    copy_dir.mkdir()
    for path in [*CONTAINERS.glob("*.def"), CONTAINERS / "build.sh"]:
        shutil.copy2(path, copy_dir / path.name)
    subprocess.run(["bash", str(copy_dir / "build.sh")], env=_double_env(tmp_path), check=True, capture_output=True)
    calls = _calls(tmp_path)
    names = sorted(image.name for image in _images().images)
    assert sorted(Path(c["target"]).stem for c in calls) == names
    for call in calls:
        assert call["subcommand"] == "build" and call["cwd"] == str(copy_dir)
        assert call["argv"] == ["build", "--force", call["target"], call["image"]]
        assert (copy_dir / call["target"]).is_file()


def test_build_sh_builds_with_fakeroot_and_node_local_cache_and_temp_dirs(tmp_path: Path) -> None:
    """A cluster user (not root: an ``id`` stand-in says uid 1000) builds with --fakeroot, the layers
    cached and the image assembled under the scratch directory, never the home."""
    copy_dir = tmp_path / "containers"
    copy_dir.mkdir()
    shutil.copy2(CONTAINERS / "build.sh", copy_dir / "build.sh")
    shutil.copy2(CONTAINERS / "sdbench-analysis.def", copy_dir / "sdbench-analysis.def")
    stand_in = tmp_path / "id-stand-in"
    stand_in.mkdir()
    (stand_in / "id").write_text('#!/bin/sh\n[ "$1" = -u ] && echo 1000 || echo alice\n')  # test double of id(1)
    (stand_in / "id").chmod(0o755)
    env = _double_env(tmp_path)
    env["PATH"] = f"{stand_in}{os.pathsep}{env['PATH']}"
    subprocess.run(["bash", str(copy_dir / "build.sh"), "sdbench-analysis"], env=env, check=True, capture_output=True)
    (call,) = _calls(tmp_path)
    assert call["argv"] == ["build", "--fakeroot", "--force", "sif/sdbench-analysis.sif", "sdbench-analysis.def"]
    scratch = tmp_path / "scratch" / "apptainer-alice"
    assert call["env"] == {"APPTAINER_CACHEDIR": str(scratch / "cache"), "APPTAINER_TMPDIR": str(scratch / "tmp")}
    # A site's own build command, and its own cache directory, win.
    env.update(APPTAINER_BUILD="apptainer build --remote", APPTAINER_CACHEDIR=str(tmp_path / "site-cache"))
    subprocess.run(["bash", str(copy_dir / "build.sh"), "sdbench-analysis"], env=env, check=True, capture_output=True)
    call = _calls(tmp_path)[-1]
    assert call["argv"][:3] == ["build", "--remote", "--force"]
    assert call["env"]["APPTAINER_CACHEDIR"] == str(tmp_path / "site-cache")


def _mount(path: Path) -> str:
    """The mount point of the filesystem ``path`` lies on (what df -P names)."""
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return str(path)


def _space_check_dir(tmp_path: Path, *names: str) -> Path:
    copy_dir = tmp_path / "containers"
    copy_dir.mkdir()
    for name in ("build.sh", *(f"{n}.def" for n in names)):
        shutil.copy2(CONTAINERS / name, copy_dir / name)
    return copy_dir


GB_KB = 1024 * 1024


def test_build_sh_sums_the_space_per_filesystem_and_stops_in_one_line(tmp_path: Path) -> None:
    """Temp, cache and sif/ on one filesystem (all under tmp_path): their needs add up. A vLLM
    image: 25 GB temp, 10 GB cache, 10 GB SIF; the analysis image 5, 1, 2 (temp is the largest
    one's: apptainer empties it after each build). The free space is the script's test hook."""
    copy_dir = _space_check_dir(tmp_path, "sdbench-vllm-0.11.1", "sdbench-analysis")
    scratch = tmp_path / "scratch" / f"apptainer-{subprocess.check_output(['id', '-un'], text=True).strip()}"
    env = {**_double_env(tmp_path), "SDBENCH_BUILD_FREE_KB_OVERRIDE": str(30 * GB_KB)}
    done = subprocess.run(["bash", str(copy_dir / "build.sh")], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr == (
        f"build.sh: filesystem {_mount(tmp_path)} has 30 GB free, building 2 image(s): sdbench-analysis "
        f"sdbench-vllm-0.11.1 needs 48 GB there (APPTAINER_TMPDIR {scratch}/tmp 25 GB, APPTAINER_CACHEDIR "
        f"{scratch}/cache 11 GB, sif/ {copy_dir}/sif 12 GB); free space or set APPTAINER_TMPDIR / "
        "APPTAINER_CACHEDIR (or SDBENCH_BUILD_SCRATCH) to a larger node-local disk\n"
    )
    assert not (tmp_path / "calls.jsonl").exists() and not (tmp_path / "scratch").exists()  # before any build
    # Exactly enough: --check-space says so and exits, building and creating nothing.
    env["SDBENCH_BUILD_FREE_KB_OVERRIDE"] = str(48 * GB_KB)
    done = subprocess.run(["bash", str(copy_dir / "build.sh"), "--check-space"], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert done.stdout.startswith(f"build.sh: filesystem {_mount(tmp_path)} has 48 GB free, building 2 image(s)")
    assert not (tmp_path / "calls.jsonl").exists() and not (tmp_path / "scratch").exists()
    assert not (copy_dir / "sif").exists()
    # The analysis image alone needs 8 GB.
    env["SDBENCH_BUILD_FREE_KB_OVERRIDE"] = str(8 * GB_KB)
    subprocess.run(["bash", str(copy_dir / "build.sh"), "sdbench-analysis"], env=env, check=True, capture_output=True)
    assert [c["target"] for c in _calls(tmp_path)] == ["sif/sdbench-analysis.sif"]


def test_build_sh_counts_each_filesystem_alone(tmp_path: Path) -> None:
    """The temp directory on another filesystem (/dev/shm) than the cache and sif/: 25 GB there and
    20 GB here, each within 30 GB, where 45 GB on one filesystem would not be."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or _mount(shm) == _mount(tmp_path):
        pytest.skip("no /dev/shm on another filesystem than the test's temp directory")
    copy_dir = _space_check_dir(tmp_path, "sdbench-vllm-0.11.1")
    env = {**_double_env(tmp_path), "SDBENCH_BUILD_FREE_KB_OVERRIDE": str(30 * GB_KB),
           "APPTAINER_TMPDIR": str(shm / f"sdbench-test-{os.getpid()}" / "tmp")}  # fmt: skip
    done = subprocess.run(["bash", str(copy_dir / "build.sh"), "--check-space"], env=env, capture_output=True,
                          text=True, check=True)  # fmt: skip
    lines = done.stdout.splitlines()
    assert [line.split(" has ")[0] for line in lines] == [
        f"build.sh: filesystem {_mount(shm)}", f"build.sh: filesystem {_mount(tmp_path)}"
    ]
    assert lines[0].endswith(" needs 25 GB there (APPTAINER_TMPDIR " + env["APPTAINER_TMPDIR"] + " 25 GB)")
    assert " needs 20 GB there (APPTAINER_CACHEDIR " in lines[1]
    assert not (shm / f"sdbench-test-{os.getpid()}").exists()  # --check-space creates nothing


def test_build_sh_names_a_bad_name_or_free_space_reading(tmp_path: Path) -> None:
    copy_dir = _space_check_dir(tmp_path, "sdbench-analysis")
    env = _double_env(tmp_path)
    done = subprocess.run(["bash", str(copy_dir / "build.sh"), "nope"], env=env, capture_output=True, text=True,
                          check=False)  # fmt: skip
    assert done.returncode == 1 and done.stderr == (
        "build.sh: no containers/nope.def; `sdbench containers render` writes one per image of "
        "containers/images.yaml\n"
    )
    env["SDBENCH_BUILD_FREE_KB_OVERRIDE"] = "lots"
    done = subprocess.run(["bash", str(copy_dir / "build.sh")], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stderr == (
        "build.sh: SDBENCH_BUILD_FREE_KB_OVERRIDE=lots: expected a number of KB (a test hook; unset it)\n"
    )


# --- an image runs the code it was built with ----------------------------------------------------


def _image_package(tmp_path: Path, edit: bool) -> Path:
    """A copy of the checkout's package (what an image built from it holds), edited or not."""
    root = tmp_path / ("edited" if edit else "same")
    shutil.copytree(REPO / "src" / "sdbench", root / "sdbench", ignore=shutil.ignore_patterns("__pycache__"))
    if edit:  # a statement changed in the checkout since the image was built
        trials = root / "sdbench" / "engine" / "measure" / "trials.py"
        trials.write_text(trials.read_text() + "\nWARMUP_CALLS_OLD = 2\n")
    return root


def _build(tmp_path: Path, package: Path, name: str = "sdbench-vllm-0.11.1") -> Path:
    """``apptainer build`` (the double) of a committed definition, the image holding ``package``."""
    sif = tmp_path / "containers" / "sif" / f"{name}.sif"
    sif.parent.mkdir(parents=True, exist_ok=True)
    env = {**_double_env(tmp_path), "SDBENCH_APPTAINER_IMAGE_SRC": str(package)}
    subprocess.run(["apptainer", "build", str(sif), f"{name}.def"], cwd=CONTAINERS, env=env, check=True,
                   capture_output=True)  # fmt: skip
    return sif


def test_an_image_whose_code_is_not_the_checkouts_is_refused_in_one_line(tmp_path: Path) -> None:
    from sdbench.codedigest import package_digest

    checkout = package_digest()
    stale = _build(tmp_path, _image_package(tmp_path, edit=True))
    held = package_digest(tmp_path / "edited" / "sdbench")
    assert held != checkout
    env = _double_env(tmp_path)
    labels = json.loads(subprocess.run(["apptainer", "inspect", "--json", "--labels", str(stale)], env=env,
                                       capture_output=True, text=True, check=True).stdout)["data"]["attributes"]["labels"]  # fmt: skip
    assert labels[containers.CODE_LABEL] == held  # what the build's %post recorded
    double = str(DOUBLES / "apptainer")
    why = containers.stale_image(str(stale), CONTAINERS, double, checkout)
    assert why == (
        f"{stale} holds sdbench code {held}, the checkout's is {checkout}: the image would not run this checkout's "
        "code; rebuild it: bash containers/build.sh sdbench-vllm-0.11.1"
    )
    with pytest.raises(ConfigError, match=re.escape(why)):
        containers.refuse_stale_images([str(stale)], CONTAINERS, double)
    # The engine process inside that image records the digest of the code it ran.
    code = "from sdbench.engine.site.hardware import provenance; print(provenance()['code_digest'])"
    ran = subprocess.run(["apptainer", "exec", "--cleanenv", str(stale), sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert ran == held
    # Rebuilt from the checkout: accepted.
    fresh = _build(tmp_path, _image_package(tmp_path, edit=False))
    assert containers.stale_image(str(fresh), CONTAINERS, double, checkout) is None
    # An image built before the label existed, and images that are not sdbench's, are not run blind.
    unlabelled = tmp_path / "containers" / "sif" / "sdbench-analysis.sif"
    unlabelled.write_text(json.dumps({"deffile": (CONTAINERS / "sdbench-analysis.def").read_text()}))
    assert "records no sdbench code digest (org.sdbench.code.digest)" in containers.stale_image(
        str(unlabelled), CONTAINERS, double, checkout)  # fmt: skip
    assert containers.stale_image(str(tmp_path / "mine.sif"), CONTAINERS, double, checkout) is None


@pytest.mark.slow  # plans the default grid through Snakemake
def test_snakemake_refuses_a_stale_engine_image_before_any_job(tmp_path: Path) -> None:
    """``snakemake -n --sdm apptainer`` with the default config, its CPU engine image built (by the
    double) from older code: one error line naming both digests and the build command."""
    from sdbench.codedigest import package_digest

    work = tmp_path / "work"
    work.mkdir()
    _build(work, _image_package(tmp_path, edit=True), "sdbench-vllm-cpu-0.32.0")
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    engine = next(iter(config["engines"]))
    config["engines"][engine]["container"] = "containers/sif/sdbench-vllm-cpu-0.32.0.sif"
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    env = _double_env(tmp_path)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "snakemake"), "-n", "--sdm", "apptainer", "--cores", "1",
         "--snakefile", str(REPO / "Snakefile"), "--directory", str(work), "--configfile", str(work / "config.yaml")],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = done.stdout + done.stderr
    held = package_digest(tmp_path / "edited" / "sdbench")
    assert done.returncode != 0
    line = (f"containers/sif/sdbench-vllm-cpu-0.32.0.sif holds sdbench code {held}, the checkout's is "
            f"{package_digest()}: the image would not run this checkout's code; rebuild it: "
            "bash containers/build.sh sdbench-vllm-cpu-0.32.0")  # fmt: skip
    assert line in out, out[-3000:]
    assert not (work / "results").exists()
