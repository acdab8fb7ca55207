"""The engine conformance check: every touchpoint against the real vLLM release sources.

``sdbench engines conformance`` downloads each pinned wheel once (containers/images.yaml,
``engine_sources``) into resources/engine-sources/ and reads its Python without importing it.
The "fork-like" tree below is a test double: the authors' draft-model fork cannot be fetched
here (GitHub is unreachable), so the two facts read from it through the public code index
(its runner cuts every step to one committed token; it has no ``sample_tokens``) are laid
over the 0.11.1 wheel's source to show the check catches them.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

from sdbench.engine.release import touchpoints as tp
from sdbench.engine.release.conformance import load_pins, obtain
from sdbench.engine.release.versions import known_versions

CACHE = REPO / "resources" / "engine-sources"
SDBENCH = [sys.executable, "-m", "sdbench.cli"]


def _conformance(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SDBENCH, "engines", "conformance", "--cache-dir", str(CACHE), *args],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sources() -> dict[str, Path]:
    """Every pinned release, unpacked (downloaded on first use)."""
    pins = load_pins(REPO / "containers" / "images.yaml")
    return {v: obtain(pins[v], CACHE) for v in known_versions()}


def test_every_release_has_a_pinned_source() -> None:
    pins = load_pins(REPO / "containers" / "images.yaml")
    assert sorted(pins) == sorted(known_versions())


@pytest.mark.slow  # downloads the pinned releases (1.2 GB) on first use
def test_all_touchpoints_hold_on_every_release(sources: dict[str, Path]) -> None:
    done = _conformance()
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert lines and all(line.endswith("| ok") for line in lines), "\n".join(lines)
    releases = {line.split(" | ")[1] for line in lines}
    assert releases == set(known_versions())
    from sdbench.engine.release.conformance import DEFAULT_CONFIGS, config_touchpoints

    # The package's own touchpoints and, per release, the keys the shipped configs pass through.
    declared = len(tp.registry()) + len(config_touchpoints([REPO / c for c in DEFAULT_CONFIGS]))
    summary = f"# {declared} touchpoints declared, {len(known_versions())} releases, 0 failed"
    assert summary in done.stdout.splitlines(), done.stdout[-500:]


def _fork_like(base: Path, dest: Path) -> Path:
    """0.11.1's source with the fork's truncation (quoted from SpecDecode-Bench/vllm@1867094e,
    ``_bookkeeping_sync``) and without ``sample_tokens`` (the fork samples in execute_model)."""
    shutil.copytree(base / "vllm", dest / "vllm")
    runner = dest / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    text = runner.read_text()
    anchor = "valid_sampled_token_ids = self.rejection_sampler.parse_output("
    end = text.index(")\n", text.index(anchor)) + 2
    pad = " " * 16
    cut = (f"{pad}# Force 1 generated token per request.\n{pad}for i, token_ids in enumerate(valid_sampled_token_ids):\n"
           f"{pad}    valid_sampled_token_ids[i] = token_ids[:1]\n")
    text = text[:end] + cut + text[end:]
    runner.write_text(text.replace("    def sample_tokens(\n", "    def _not_sample_tokens(\n"))
    return dest


@pytest.mark.slow  # downloads the pinned releases (1.2 GB) on first use
def test_catches_a_tracing_build_and_a_runner_without_sample_tokens(
    sources: dict[str, Path], tmp_path: Path
) -> None:
    tree = _fork_like(sources["0.11.1"], tmp_path / "fork-like")
    done = _conformance("--version", "0.11.1", "--source-dir", f"0.11.1={tree}")
    assert done.returncode == 1
    failed = {line.split(" | ")[0]: line for line in done.stdout.splitlines() if "FAILED" in line}
    assert "cuts the accepted rows" in failed["timing.commits_accepted"]
    # Breakdown hooks are chosen by what the build has: without sample_tokens they do not split.
    assert "breakdown.hooks" not in failed


def test_no_network_fails_in_one_line(tmp_path: Path) -> None:
    images = tmp_path / "images.yaml"
    images.write_text(
        "engine_sources:\n"
        '  "0.11.1": {distribution: vllm, url: "https://127.0.0.1:9/vllm-0.11.1-x.whl", sha256: "' + "0" * 64 + '"}\n'
    )
    done = subprocess.run(
        [*SDBENCH, "engines", "conformance", "--version", "0.11.1", "--images", str(images),
         "--cache-dir", str(tmp_path / "cache")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    err = done.stderr.strip().splitlines()
    assert len(err) == 1 and "--source-dir 0.11.1=DIR" in err[0] and "pip download" in err[0]
    assert not (tmp_path / "cache" / "0.11.1").exists()


def test_a_pin_with_a_bad_hash_is_refused(tmp_path: Path) -> None:
    images = tmp_path / "images.yaml"
    images.write_text("engine_sources:\n  \"0.11.1\": {distribution: vllm, url: https://x/y.whl, sha256: abc}\n")
    with pytest.raises(ValueError, match=r"engine_sources.0.11.1: key 'sha256'"):
        load_pins(images)


# --------------------------------------------------------------------------- the registry itself
def _vllm_references(path: Path) -> list[str]:
    """What a module takes from vLLM: imports and ``"vllm.module:Qual"`` hook targets."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
            out += [f"{node.module}:{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("vllm.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(
            r"vllm(\.\w+)+:[\w.]+", node.value
        ):
            out.append(node.value)
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
        ) and node.elts[0].value.startswith("vllm.") and "." not in node.elts[1].value:  # (module, attr)
            out.append(f"{node.elts[0].value}:{node.elts[1].value}")
    return out


def _covered(ref: str, declared: set[str]) -> bool:
    module, _, name = ref.partition(":")
    keys = {ref, f"{module}.{name}" if name else module}
    return any(d == k or d.startswith((f"{k}.", f"{k}:")) for d in declared for k in keys)


def test_every_vllm_reference_in_the_package_is_a_declared_touchpoint() -> None:
    declared = tp.declared_targets()
    missing = []
    users = set()
    for path in sorted((REPO / "src" / "sdbench").rglob("*.py")):
        refs = _vllm_references(path)
        if refs and path.name not in {"touchpoints.py", "conformance.py"}:
            users.add(".".join(path.relative_to(REPO / "src").with_suffix("").parts))
        missing += [f"{path.relative_to(REPO)}: {ref}" for ref in refs if not _covered(ref, declared)]
    assert not missing, "vLLM references without a touchpoint:\n" + "\n".join(missing)
    assert users <= set(tp.DECLARING_MODULES), sorted(users - set(tp.DECLARING_MODULES))


def test_touchpoint_names_are_unique_and_owned() -> None:
    names = [t.name for t in tp.registry()]
    assert len(names) == len(set(names))
    assert all(t.owner in tp.DECLARING_MODULES for t in tp.registry())


def test_shipped_speculative_config_keys_are_checked() -> None:
    from sdbench.engine.release.conformance import DEFAULT_CONFIGS, config_touchpoints

    configs = [REPO / c for c in DEFAULT_CONFIGS if (REPO / c).exists()]
    names = {t.name for t in config_touchpoints(configs)}
    assert "config.speculative_config" in names


# --------------------------------------------------------------------------- the source reader
@pytest.fixture
def tiny_tree(tmp_path: Path) -> tp.SourceTree:
    pkg = tmp_path / "vllm"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('MODULE_ATTRS = {"Thing": ".sub.mod:Thing"}\n')
    (pkg / "sub" / "__init__.py").write_text("from .mod import Thing as Alias\n")
    (pkg / "sub" / "base.py").write_text("class Base:\n    inherited: int = 0\n    def hook(self, a, b):\n        pass\n")
    (pkg / "sub" / "mod.py").write_text(
        "from vllm.sub.base import Base\n"
        "from typing import Literal\n"
        "Kinds = Literal['a', 'b']\n"
        "More = Literal[Kinds, 'c']\n"
        "class Thing(Base):\n"
        "    field: str = ''\n"
        "    def run(self, x):\n"
        "        self.cut(x)\n"
        "        self.draft(x)\n"
        "        return (x, self)\n"
        "    def cut(self, x):\n"
        "        return self.sampler.parse_output(x)\n"
        "    def draft(self, x):\n"
        "        return self.propose_draft_token_ids(x)\n"
    )
    return tp.SourceTree(tmp_path, "9.9.9")


def test_source_tree_follows_reexports_lazy_tables_and_bases(tiny_tree: tp.SourceTree) -> None:
    assert tiny_tree.has("vllm:Thing.run")
    assert tiny_tree.has("vllm.sub:Alias.hook")  # re-export, then a base-class method
    assert not tiny_tree.has("vllm.sub.mod:Thing.missing")
    assert tiny_tree.params("vllm.sub.mod:Thing.hook") == ["self", "a", "b"]
    assert tiny_tree.class_fields("vllm.sub.mod:Thing") == {"field", "inherited"}
    assert tiny_tree.literal_values("vllm.sub.mod", "More") == {"a", "b", "c"}
    assert tp.return_names(tiny_tree, "vllm.sub.mod:Thing.run") == [["x", "self"]]


def test_call_order_follows_methods_of_the_class(tiny_tree: tp.SourceTree) -> None:
    order = tp.call_order(
        tiny_tree, "vllm.sub.mod:Thing.run",
        {"cut": lambda n: n.endswith("parse_output"), "draft": lambda n: n.endswith("propose_draft_token_ids")},
    )  # fmt: skip
    assert order == {"cut": [8], "draft": [9]}


def test_tuple_layout_refuses_disagreeing_returns() -> None:
    assert tp.tuple_layout([["a", "b"], ["a", "b"]], ["b"]) == {"b": 1}
    with pytest.raises(ValueError, match="positions"):
        tp.tuple_layout([["a", "b"], ["b", "a"]], ["b"])
