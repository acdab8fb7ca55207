"""Price the simulator on your own hardware: time (and meter) one step of a model's shape, fit a cost model.

``sdbench calibrate`` builds a decoder of a model's architecture (a shipped architecture YAML, a
config's model entry or a ``config.json``) with **random** weights (seeded; nothing is downloaded
or read but the architecture) and times one verification step over a grid of batch size ``B``,
new tokens per sequence ``q`` and context length ``L``: ``B`` sequences x ``q`` tokens through
every layer and the LM head (greedy argmax over every new token) against a KV cache of ``L``
tokens each. The ``q`` new tokens attend to each other without a causal mask: a cost proxy, as in
the shared H100/H200 tables (at most q^2/2 of q(L+q) scores differ). On CUDA (or ROCm) each grid
point is captured in a CUDA graph and replayed, as vLLM runs decode steps; on the CPU it runs eager.

The drafter's step is timed the same way where the model has one: an EAGLE or EAGLE-3 head (fc
plus one decoder layer and an LM head), an MTP layer (fc plus one layer, the target's LM head) or
a draft model (a smaller decoder); its ``q`` is the drafts per sequence, one chained forward of
one token per sequence each (its own KV cache of ``L`` tokens). Not covered, and said so on the
output: n-gram lookup (no forward pass), Medusa, MoE targets, the engine's scheduler, sampler and
per-step bookkeeping (``overhead_per_step``: kept from a base cost model).

Time and energy come from the **same window**: a window replays the step back to back for at
least ``--window-s`` seconds between two synchronisations, and the energy meter
(:mod:`sdbench.engine.energy`: NVML on CUDA, RAPL on the CPU where readable) is read at its two
ends. Of ``--windows`` windows per point the row keeps the one of median time, with its own
energy; without a meter the joules are NaN and ``energy_meter`` says ``not measured`` (never 0).

``sdbench calibrate fit`` fits a cost model in the simulator's format (:mod:`costmodel`) from such
a table, or from any table with columns ``B, q, L, ms`` (a published step-cost table, given by path):
a straight line in batched tokens and a hinge (a knee fitted on a grid) are both fitted, each with
the KV term, on the rows not held out, and the shape with the smaller held-out median relative
error is refitted on every row and written. Its power model (watts against batched tokens,
:mod:`powermodel`) is fitted only from rows whose time and energy came from one window; otherwise
the energy per step is fitted on ``joules`` alone and reported (no power model written).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sdbench.models.spec import ModelSpec

# The calibration table (one row per component x grid point), sorted by component, L, B, q.
COLUMNS: tuple[str, ...] = (
    "component",  # target | drafter
    "method",  # the drafter's kind (eagle, eagle3, mtp, draft_model); "target" for the target
    "model",  # repo id (or local config path) whose architecture was built
    "device",  # torch device and its name
    "dtype",
    "graphs",  # replayed from a CUDA graph (else eager)
    "threads",  # torch's intra-op CPU threads
    "B",
    "q",
    "L",
    "batched_tokens",  # B x q (drafter: proposed tokens)
    "kv_tokens",  # B x L
    "ms",  # per step, the window of median time
    "ms_min",  # per step, fastest and slowest window
    "ms_max",
    "replays",  # steps per window
    "windows",
    "joules",  # per step, the same window as ms (NaN: not measured)
    "watts",  # joules / seconds of that window
    "energy_meter",  # nvml | rapl | not measured
    "power_limit_w",  # the board's enforced limit (NVML), NaN where unknown
    "same_window",  # time and energy from one window (always, here)
    "seed",
    "torch",
)
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
DEFAULT_TOKENS: tuple[int, ...] = (1, 2, 3, 4, 5, 8)
DEFAULT_CONTEXTS: tuple[int, ...] = (1024, 4096)
DRAFTER_KINDS: tuple[str, ...] = ("eagle", "eagle3", "mtp", "draft_model")
HOLDOUT_RULES: tuple[str, ...] = ("every-4th", "random")
# A built model's vocabulary: the project's tokenizer default (sdbench build-tokenizer --vocab-size).
BUILT_VOCAB = 2048
_WEIGHT_STD = 0.02  # random weights: N(0, 0.02), norms 1 (the scale only keeps activations finite)


# ----------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class Shape:
    """What a step's cost depends on: the layers' sizes, not their weights."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int  # embedding rows
    lm_vocab: int  # LM head rows (EAGLE-3: its draft vocabulary)
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    head: str = ""  # "" a decoder; eagle, eagle3 or mtp: a head over the target's features
    fc_in: int = 0  # the head's fc input width (EAGLE-3: the target's aux hidden states)


@dataclass(frozen=True)
class Component:
    """One thing to time: the target's verification step or the drafter's proposal."""

    component: str  # target | drafter
    method: str
    model: str
    shape: Shape


def shape_of(spec: ModelSpec, head: str = "") -> Shape:
    """The :class:`Shape` of an architecture spec (``head``: read it as that kind of drafter head)."""
    if spec.architecture == "glm4_moe" or spec.n_routed_experts:
        raise ValueError(f"{spec.source or spec.repo_id}: architecture {spec.architecture!r} (MoE) is not covered "
                         "by calibrate (a dense decoder only)")  # fmt: skip
    if spec.architecture == "medusa":
        raise ValueError(f"{spec.source or spec.repo_id}: Medusa heads are not covered by calibrate")
    common = dict(hidden=spec.hidden_size, heads=spec.num_attention_heads, kv_heads=spec.num_key_value_heads,
                  head_dim=spec.head_dim, intermediate=spec.intermediate_size, vocab=spec.vocab_size,
                  attention_bias=spec.attention_bias, mlp_bias=spec.mlp_bias,
                  qk_norm=spec.use_qk_norm or spec.architecture == "qwen3")  # fmt: skip
    if spec.architecture == "eagle3" or head == "eagle3":
        aux = spec.num_aux_hidden_states or 3
        fc_in = aux * (spec.target_hidden_size or spec.hidden_size)
        return Shape(layers=1, lm_vocab=spec.draft_vocab_size or spec.vocab_size, head="eagle3", fc_in=fc_in, **common)
    if spec.architecture == "eagle" or head == "eagle":
        return Shape(layers=1, lm_vocab=spec.vocab_size, head="eagle", fc_in=2 * spec.hidden_size, **common)
    if head == "mtp":  # one MTP layer of the target (MiMo / DeepSeek): fc over [embedding, feature]
        return Shape(layers=1, lm_vocab=spec.vocab_size, head="mtp", fc_in=2 * spec.hidden_size, **common)
    return Shape(layers=spec.num_hidden_layers, lm_vocab=spec.vocab_size, **common)


def _built_spec(key: str, build: dict[str, Any]) -> ModelSpec:
    """A config's built model (``build: {layers, hidden, heads, kv_heads, intermediate}``)."""
    missing = [k for k in ("layers", "hidden", "heads") if k not in build]
    if missing:
        raise ValueError(f"models.{key}.build: lacks {', '.join(missing)} (the shape to calibrate)")
    heads = int(build["heads"])
    hidden = int(build["hidden"])
    vocab = int(build.get("vocab_size", BUILT_VOCAB))
    return ModelSpec(repo_id=f"local/{key}", architecture="llama", vocab_size=vocab,
                     hidden_size=hidden, intermediate_size=int(build.get("intermediate", 4 * hidden)),
                     num_hidden_layers=int(build["layers"]), num_attention_heads=heads,
                     num_key_value_heads=int(build.get("kv_heads", heads)), head_dim=hidden // heads,
                     tie_word_embeddings=False, torch_dtype="float32", source=f"models.{key}.build")  # fmt: skip


def _entry_spec(config: dict[str, Any], key: str) -> ModelSpec:
    """The architecture of a config's model entry: its hub id's shipped YAML, or its build block."""
    from sdbench.models.spec import load_model_spec

    models = config.get("models") or {}
    if key not in models:
        raise ValueError(f"models.{key}: no such model in the config (has: {', '.join(sorted(models)) or 'none'})")
    entry = models[key]
    if entry.get("hf_id"):
        return load_model_spec(str(entry["hf_id"]))
    if entry.get("build"):
        return _built_spec(key, dict(entry["build"]))
    if (entry.get("head") or {}).get("target"):  # a head on a built target (MTP: the target runs it)
        return _entry_spec(config, str(entry["head"]["target"]))
    raise ValueError(f"models.{key}: neither hf_id, build nor head.target (no architecture to calibrate)")


def resolve_components(
    model: str,
    *,
    config: dict[str, Any] | None = None,
    method: str | None = None,
    drafter: str | None = None,
    drafter_kind: str | None = None,
) -> tuple[list[Component], str]:
    """The target (and drafter) to time, and a sentence on what is not covered ("" if nothing).

    ``model``: a key of ``config``'s models (with ``config``), else a hub repo id with a shipped
    architecture YAML or a local ``config.json`` / model directory. The drafter: the config
    ``method``'s drafter for ``model``, or ``drafter`` (a repo id or path, its kind inferred from its
    architecture unless ``drafter_kind`` says).
    """
    from sdbench.models.spec import load_model_spec

    if config is not None and model in (config.get("models") or {}):
        target_spec = _entry_spec(config, model)
    else:
        target_spec = load_model_spec(model)
    target = Component("target", "target", target_spec.repo_id, shape_of(target_spec))
    kind, spec, name = drafter_kind, None, ""
    if method is not None:
        if config is None:
            raise ValueError("--method needs --config (the method's drafter for the model)")
        methods = config.get("methods") or {}
        if method not in methods:
            raise ValueError(f"methods.{method}: no such method in the config (has: {', '.join(sorted(methods))})")
        entry = methods[method]
        vllm = str(entry.get("method", ""))
        if vllm in ("none",):
            return [target], "drafter: none (method none)"
        if vllm in ("ngram", "suffix"):
            return [target], f"drafter: not covered ({vllm} lookup runs no forward pass; a fraction of verify)"
        if vllm == "medusa":
            return [target], "drafter: not covered (Medusa heads)"
        kind = {"deepseek_mtp": "mtp", "qwen3_next_mtp": "mtp"}.get(vllm, vllm)
        mapped = (entry.get("drafter") or {}).get(model)
        if mapped is None:
            raise ValueError(f"methods.{method}.drafter: has no drafter for model {model!r}")
        head = ((config.get("models") or {}).get(mapped) or {}).get("head")
        if kind == "mtp" or mapped == model:
            spec = target_spec  # MTP: one layer of the target's own shape
        elif head:  # a head the pipeline trains on the target: the target's shape
            spec = target_spec
            kind = str(head.get("kind", kind))
        else:
            spec = _entry_spec(config, mapped)
        name = spec.repo_id if spec is not target_spec else f"{mapped} on {target_spec.repo_id}"
    elif drafter is not None:
        spec = load_model_spec(drafter, expect="eagle" if drafter_kind == "eagle" else None)
        name = spec.repo_id
        if kind is None:
            kind = {"eagle": "eagle", "eagle3": "eagle3"}.get(spec.architecture, "draft_model")
    if spec is None:
        return [target], "drafter: not covered (no --method or --drafter given)"
    if kind not in DRAFTER_KINDS:
        return [target], f"drafter: not covered (method {kind!r})"
    head = "" if kind == "draft_model" else kind
    return [target, Component("drafter", kind, name, shape_of(spec, head=head))], ""


# ----------------------------------------------------------------------------- the network
def build_network(shape: Shape, device: str, dtype: Any, seed: int) -> Any:
    """A decoder (or head) of ``shape`` on ``device`` with random weights drawn from ``seed``.

    Built on the meta device (no default initialisation), then every tensor filled in name order
    from one generator: the same seed gives the same weights on the same device. Nothing is read.
    """
    import torch

    with torch.device("meta"):
        net = _network_class()(shape)
    net = net.to(dtype=dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(net.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, _WEIGHT_STD, generator=gen)
    return net.eval()


def _network_class() -> type:
    """The torch module (defined on first use: the parser and the fit import no torch)."""
    global _NETWORK
    if _NETWORK is not None:
        return _NETWORK
    import torch
    import torch.nn.functional as F
    from torch import nn

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    class Layer(nn.Module):
        def __init__(self, s: Shape, qkv_in: int) -> None:
            super().__init__()
            self.s = s
            self.input_norm = nn.RMSNorm(s.hidden, eps=1e-5)
            # Fused projections, as vLLM runs them (one GEMM for q/k/v, one for gate/up).
            self.qkv = nn.Linear(qkv_in, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=s.attention_bias)
            self.q_norm = nn.RMSNorm(s.head_dim, eps=1e-6) if s.qk_norm else None
            self.k_norm = nn.RMSNorm(s.head_dim, eps=1e-6) if s.qk_norm else None
            self.o = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
            self.post_norm = nn.RMSNorm(s.hidden, eps=1e-5)
            self.gate_up = nn.Linear(s.hidden, 2 * s.intermediate, bias=s.mlp_bias)
            self.down = nn.Linear(s.intermediate, s.hidden, bias=s.mlp_bias)

        def forward(self, x: torch.Tensor, x_in: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: int,
                    cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # fmt: skip
            s, (b, q, _) = self.s, x.shape
            qkv = self.qkv(x_in).view(b, q, s.heads + 2 * s.kv_heads, s.head_dim)
            qh, kh, vh = qkv.split([s.heads, s.kv_heads, s.kv_heads], dim=2)
            if self.q_norm is not None:
                qh, kh = self.q_norm(qh), self.k_norm(kh)
            qh, kh = rope(qh.transpose(1, 2), cos, sin), rope(kh.transpose(1, 2), cos, sin)
            kc[:, :, start : start + q] = kh
            vc[:, :, start : start + q] = vh.transpose(1, 2)
            att = F.scaled_dot_product_attention(qh, kc[:, :, : start + q], vc[:, :, : start + q],
                                                 enable_gqa=s.kv_heads != s.heads)  # fmt: skip
            x = x + self.o(att.transpose(1, 2).reshape(b, q, s.heads * s.head_dim))
            gate, up = self.gate_up(self.post_norm(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up)

    class Network(nn.Module):
        def __init__(self, s: Shape) -> None:
            super().__init__()
            self.s = s
            self.embed = nn.Embedding(s.vocab, s.hidden)
            self.fc = nn.Linear(s.fc_in, s.hidden, bias=False) if s.head else None
            if s.head in ("eagle3", "mtp"):  # the normed embedding and feature the layer reads
                self.embed_norm, self.feature_norm = nn.RMSNorm(s.hidden, eps=1e-5), nn.RMSNorm(s.hidden, eps=1e-5)
            qkv_in = 2 * s.hidden if s.head == "eagle3" else s.hidden
            self.layers = nn.ModuleList(Layer(s, qkv_in) for _ in range(s.layers))
            self.final_norm = nn.RMSNorm(s.hidden, eps=1e-5)
            self.lm_head = nn.Linear(s.hidden, s.lm_vocab, bias=False)

        def verify(self, tokens: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], start: int,
                   cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # fmt: skip
            """One decoder step over ``tokens`` [B, q] at positions start..start+q-1: next tokens [B, q]."""
            x = self.embed(tokens)
            for layer, (kc, vc) in zip(self.layers, caches):
                x = layer(x, layer.input_norm(x), kc, vc, start, cos, sin)
            return self.lm_head(self.final_norm(x)).argmax(dim=-1)

        def head_step(self, token: torch.Tensor, feature: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, start: int,
                      cos: torch.Tensor, sin: torch.Tensor, first: bool) -> tuple[Any, Any]:  # fmt: skip
            """One chained head forward (one token per sequence): (next token, its feature)."""
            layer, emb = self.layers[0], self.embed(token)
            if self.s.head == "eagle":  # fc over [embedding, feature]; layer 0 has no input norm
                x = self.fc(torch.cat((emb, feature), dim=-1))
                x = layer(x, x, kc, vc, start, cos, sin)
            elif self.s.head == "eagle3":  # fc fuses the target's aux states once; q/k/v read 2 x hidden
                f = self.fc(feature) if first else feature
                x = layer(f, torch.cat((self.embed_norm(emb), self.feature_norm(f)), dim=-1), kc, vc, start, cos, sin)
            else:  # mtp: fc over the normed [embedding, feature], then a full layer
                x = self.fc(torch.cat((self.embed_norm(emb), self.feature_norm(feature)), dim=-1))
                x = layer(x, layer.input_norm(x), kc, vc, start, cos, sin)
            return self.lm_head(self.final_norm(x)).argmax(dim=-1), x

    _NETWORK = Network
    return Network


_NETWORK: type | None = None


# ----------------------------------------------------------------------------- one grid point
def _rope_tables(shape: Shape, start: int, count: int, device: str, dtype: Any) -> tuple[Any, Any]:
    import torch

    inv = 1.0 / (500000.0 ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32) / shape.head_dim))
    angles = torch.outer(torch.arange(start, start + count, device=device, dtype=torch.float32), inv)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def make_step(net: Any, comp: Component, b: int, q: int, length: int, device: str, dtype: Any,
              seed: int) -> Callable[[], Any]:  # fmt: skip
    """A closure running one step of ``comp`` (static inputs allocated here, KV caches filled at random).

    Target: ``b`` sequences x ``q`` new tokens against ``length`` cached ones. Drafter: ``q``
    chained forwards of one token per sequence (a draft model: the whole small decoder each).
    """
    import torch

    s = comp.shape
    gen = torch.Generator(device=device).manual_seed(seed + 7919 * b + 31 * q + length)
    span = length + q  # every position the step writes stays inside the cache

    def cache() -> tuple[Any, Any]:
        kv = torch.randn(2, b, s.kv_heads, span, s.head_dim, generator=gen, device=device, dtype=dtype)
        return kv[0], kv[1]

    caches = [cache() for _ in range(s.layers)]
    if comp.component == "target":
        tokens = torch.randint(0, s.vocab, (b, q), generator=gen, device=device)
        cos, sin = _rope_tables(s, length, q, device, dtype)
        return lambda: net.verify(tokens, caches, length, cos, sin)
    token0 = torch.randint(0, s.vocab, (b, 1), generator=gen, device=device)
    tables = [_rope_tables(s, length + i, 1, device, dtype) for i in range(q)]
    if not s.head:  # a draft model: q single-token decoder steps, each feeding the next

        def draft() -> Any:
            tok = token0
            for i, (cos, sin) in enumerate(tables):
                tok = net.verify(tok, caches, length + i, cos, sin)
            return tok

        return draft
    width = s.fc_in if s.head == "eagle3" else s.hidden
    feature0 = torch.randn(b, 1, width, generator=gen, device=device, dtype=dtype)
    kc, vc = caches[0]

    def head() -> Any:
        tok, feat = token0, feature0
        for i, (cos, sin) in enumerate(tables):
            tok, feat = net.head_step(tok, feat, kc, vc, length + i, cos, sin, first=i == 0)
        return tok

    return head


def _graphed(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` captured in a CUDA graph (warmed up on a side stream first, as torch requires); its replay."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


@dataclass(frozen=True)
class Window:
    seconds: float
    joules: float
    replays: int


def time_windows(run: Callable[[], Any], sync: Callable[[], None], meter: Any, window_s: float, windows: int,
                 asynchronous: bool) -> list[Window]:  # fmt: skip
    """``windows`` windows of back-to-back replays, each at least ``window_s`` long: wall time
    between two synchronisations and the meter read at the same two instants.

    ``asynchronous`` (a GPU): the replays per window are fixed from a pilot of five, so that no
    synchronisation interrupts the window; else (the CPU) a window replays until ``window_s`` has
    passed, at least three times.
    """
    for _ in range(2):  # warm-up (the graph's first replays, the CPU's allocator)
        run()
    sync()
    replays = 3
    if asynchronous:
        t0 = time.perf_counter()
        for _ in range(5):
            run()
        sync()
        replays = max(3, math.ceil(window_s / max((time.perf_counter() - t0) / 5, 1e-7)))
    out = []
    for _ in range(windows):
        sync()
        e0, t0 = meter.read(), time.perf_counter()
        done = 0
        while done < replays or (not asynchronous and time.perf_counter() - t0 < window_s):
            run()
            done += 1
        sync()
        t1, e1 = time.perf_counter(), meter.read()
        out.append(Window(t1 - t0, e1 - e0, done))
    return out


# ----------------------------------------------------------------------------- the calibration
@dataclass(frozen=True)
class Grid:
    batch_sizes: tuple[int, ...]
    tokens: tuple[int, ...]
    contexts: tuple[int, ...]

    def points(self) -> list[tuple[int, int, int]]:
        return [(b, q, ell) for ell in self.contexts for b in self.batch_sizes for q in self.tokens]


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{device}: {torch.cuda.get_device_name(torch.device(device))}"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def _power_limit_w(meter: Any) -> float:
    """The first metered GPU's enforced power limit (watts), NaN where NVML cannot say."""
    try:
        return float(meter.nvml.nvmlDeviceGetEnforcedPowerLimit(meter.handles[0])) / 1000.0
    except Exception:  # noqa: BLE001 - no NVML, or a board that does not report it
        return math.nan


def calibrate(
    components: Sequence[Component],
    grid: Grid,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    graphs: bool = True,
    window_s: float = 0.2,
    windows: int = 3,
    seed: int = 0,
    meter: Any = None,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Time every component at every grid point (module docstring): one row each, :data:`COLUMNS`."""
    import torch

    from sdbench.engine.energy import meter_for

    torch_dtype = getattr(torch, dtype)
    cuda = device.startswith("cuda")
    graphs = graphs and cuda
    meter = meter if meter is not None else meter_for({"device": "cuda" if cuda else "cpu"})
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    name, limit = _device_name(device), _power_limit_w(meter)
    points = grid.points()
    if not points:
        raise ValueError("calibrate: the grid is empty (give --batch-sizes, --tokens and --contexts)")
    total, done, rows = len(points) * len(components), 0, []
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    for comp in components:
        net = build_network(comp.shape, device, torch_dtype, seed)
        with torch.inference_mode():  # first calls pay one-off set-up (kernels, allocator): not the first point
            warm = make_step(net, comp, *points[0], device, torch_dtype, seed)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < min(window_s, 0.5):
                warm()
            sync()
            warm = None
        for b, q, ell in points:
            done += 1
            where = f"calibrate [{done}/{total}] {comp.component} B={b} q={q} L={ell}"
            try:
                with torch.inference_mode():
                    step = make_step(net, comp, b, q, ell, device, torch_dtype, seed)
                    run = _graphed(step) if graphs else step
                    got = time_windows(run, sync, meter, window_s, windows, asynchronous=cuda)
            except torch.cuda.OutOfMemoryError:
                say(f"{where}: skipped (out of memory)")
                continue
            finally:
                step = run = None  # free the point's caches and graph before the next
                if cuda:
                    torch.cuda.empty_cache()
            per = sorted(got, key=lambda w: w.seconds / w.replays)
            mid = per[len(per) // 2]  # the window of median time, and its own energy
            ms = [w.seconds / w.replays * 1e3 for w in per]
            joules = mid.joules / mid.replays
            rows.append({
                "component": comp.component, "method": comp.method, "model": comp.model, "device": name,
                "dtype": dtype, "graphs": graphs, "threads": torch.get_num_threads(), "B": b, "q": q, "L": ell,
                "batched_tokens": b * q,
                "kv_tokens": b * ell, "ms": mid.seconds / mid.replays * 1e3, "ms_min": ms[0], "ms_max": ms[-1],
                "replays": mid.replays, "windows": len(per), "joules": joules,
                "watts": mid.joules / mid.seconds if mid.seconds > 0 else math.nan, "energy_meter": meter.kind,
                "power_limit_w": limit, "same_window": True, "seed": seed, "torch": torch.__version__,
            })  # fmt: skip
            energy = "not measured" if math.isnan(joules) else f"{joules:.4g} J"
            say(f"{where}: {rows[-1]['ms']:.4g} ms, {energy}")
        del net
    from sdbench.columns import conform

    table = pd.DataFrame(rows, columns=list(COLUMNS))
    table = table.sort_values(["component", "L", "B", "q"], kind="stable").reset_index(drop=True)
    return conform(table, COLUMNS, "calibration table")


def figure_calibration(table: pd.DataFrame, path: str | os.PathLike[str]) -> pd.DataFrame:
    """Milliseconds per step against batched tokens, a line per context length (the drafter: per
    context length and drafts per sequence, its chained forwards), a panel per component."""
    from sdbench.plotting import drawn_table, save_png, subplots

    comps = sorted(table["component"].unique(), key=lambda c: (c != "target", c)) or ["target"]
    fig, axes = subplots(1, len(comps), figsize=(4.6 * len(comps), 3.4), squeeze=False)
    for ax, comp in zip(axes[0], comps):
        sub = table[table["component"] == comp]
        keys = ["L"] if comp == "target" else ["L", "q"]
        for key, g in sub.groupby(keys, sort=True):
            label = " ".join(f"{k}={v}" for k, v in zip(keys, key))
            g = g.sort_values(["batched_tokens", "B"])
            drawn_table(fig).plot(ax, g["batched_tokens"], g["ms"], marker="o", ms=3, label=label,
                                  series=f"{comp} {label}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batched tokens per step (B x q)" if comp == "target" else "proposed tokens (B x q)")
        ax.set_ylabel("ms per step")
        ax.set_title(f"{comp}: {sub['model'].iloc[0]}" if len(sub) else comp, fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_png(fig, path, dpi=130, bbox_inches="tight")


def write_table(table: pd.DataFrame, path: str | os.PathLike[str]) -> None:
    """Parquet, or CSV for a ``.csv`` path (both stamped ``measured`` in a command)."""
    from sdbench import provenance
    from sdbench.io import write_parquet, write_text

    if str(path).endswith(".csv"):
        write_text(provenance.stamp(table).to_csv(index=False), path)
    else:
        write_parquet(table, path)


# ----------------------------------------------------------------------------- the fit
@dataclass(frozen=True)
class ShapeFit:
    """One shape fitted on the rows not held out, and its errors (relative, |pred - y| / y)."""

    shape: str  # line | hinge
    coef: dict[str, float]  # c_fixed, c_compute, c_kv (+ knee_tokens, c_above_knee)
    heldout_median: float
    heldout_max: float
    train_rows: int
    heldout_rows: int
    worst: str = ""  # the held-out row of the largest error (B, q, L)


@dataclass(frozen=True)
class SeriesFit:
    """A quantity (seconds or joules per step) fitted both ways, the chosen shape refitted on all rows."""

    what: str
    shapes: list[ShapeFit]
    chosen: str
    coef: dict[str, float]
    median: float  # the chosen refit's errors over every row (in-sample)
    largest: float
    notes: list[str] = field(default_factory=list)


def holdout_mask(frame: pd.DataFrame, rule: str, seed: int = 0) -> np.ndarray:
    """Rows held out: ``every-4th`` row in (L, B, q) order (positions 3, 7, 11, ...), or a
    ``random`` 25% drawn with ``seed``."""
    n = len(frame)
    mask = np.zeros(n, bool)
    if rule == "every-4th":
        order = np.lexsort((frame["q"].to_numpy(), frame["B"].to_numpy(), frame["L"].to_numpy()))
        mask[order[3::4]] = True
    elif rule == "random":
        mask[np.random.default_rng(seed).permutation(n)[: round(n / 4)]] = True
    else:
        raise ValueError(f"--holdout: {rule!r} is not a rule (choose from {', '.join(HOLDOUT_RULES)})")
    return mask


def _design(n: np.ndarray, kv: np.ndarray, knee: float | None) -> np.ndarray:
    cols = [np.ones_like(n), n, kv]
    if knee is not None:
        cols.append(np.maximum(n - knee, 0.0))
    return np.column_stack(cols)


def _relative_nnls(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Coefficients >= 0 minimising the squared *relative* error (rows weighted 1/y), and that sum."""
    from sdbench.simulator.forcedcheck import _nonnegative_lstsq

    w = 1.0 / y
    coef = _nonnegative_lstsq(x * w[:, None], y * w)
    return coef, float(np.sum(((x @ coef - y) * w) ** 2))


def fit_shape(n: np.ndarray, kv: np.ndarray, y: np.ndarray, shape: str) -> dict[str, float]:
    """``line``: ``c_fixed + c_compute n + c_kv kv``; ``hinge``: plus ``c_above_knee max(0, n - knee)``,
    the knee the best of a log grid over the rows' batched tokens, refined between its neighbours."""
    if shape == "line":
        c, _ = _relative_nnls(_design(n, kv, None), y)
        return {"c_fixed": c[0], "c_compute": c[1], "c_kv": c[2]}
    lo, hi = float(n.min()), float(n.max())
    if not hi > lo:
        raise ValueError(f"a hinge needs two batched-token counts or more (all rows batch {lo:g})")
    grid, knee = np.geomspace(lo, hi, 122)[1:-1], lo  # inside: a knee at either end is the line again
    for _ in range(3):  # a coarse grid, then finer ones between the best knee's neighbours
        i = int(np.argmin([_relative_nnls(_design(n, kv, k), y)[1] for k in grid]))  # the first best
        knee = float(grid[i])
        grid = np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 41)
    c, _ = _relative_nnls(_design(n, kv, knee), y)
    return {"c_fixed": c[0], "c_compute": c[1], "c_kv": c[2], "knee_tokens": knee, "c_above_knee": c[3]}


def predict(coef: dict[str, float], n: Any, kv: Any) -> np.ndarray:
    n, kv = np.asarray(n, dtype=float), np.asarray(kv, dtype=float)
    out = coef["c_fixed"] + coef["c_compute"] * n + coef["c_kv"] * kv
    if coef.get("c_above_knee", 0.0) > 0:
        out = out + coef["c_above_knee"] * np.maximum(n - coef["knee_tokens"], 0.0)
    return out


def _errors(coef: dict[str, float], n: np.ndarray, kv: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(predict(coef, n, kv) - y) / y


SHAPES: tuple[str, ...] = ("line", "hinge")


def fit_series(frame: pd.DataFrame, y: np.ndarray, hold: np.ndarray, what: str,
               shapes: Sequence[str] = SHAPES) -> SeriesFit:  # fmt: skip
    """Fit each shape on the rows not ``hold``-out, score it on the held-out rows, choose the
    smaller held-out median (ties: the line, fewer parameters) and refit it on every row."""
    n = frame["batched_tokens"].to_numpy(float)
    kv = frame["kv_tokens"].to_numpy(float)
    train = ~hold
    fits, notes = [], []
    for shape in shapes:
        params = 3 if shape == "line" else 5
        if train.sum() < params + 1 or not hold.any():
            notes.append(f"{shape}: not fitted ({int(train.sum())} training / {int(hold.sum())} held-out rows; "
                         f"needs {params + 1} and 1)")  # fmt: skip
            continue
        try:
            coef = fit_shape(n[train], kv[train], y[train], shape)
        except ValueError as exc:
            notes.append(f"{shape}: not fitted ({exc})")
            continue
        err = _errors(coef, n[hold], kv[hold], y[hold])
        row = frame[hold].iloc[int(np.argmax(err))]
        worst = f"B={int(row['B'])} q={int(row['q'])} L={int(row['L'])}"
        fits.append(ShapeFit(shape, coef, float(np.median(err)), float(err.max()), int(train.sum()), int(hold.sum()),
                             worst))  # fmt: skip
    if not fits:
        raise ValueError(f"{what}: too few rows to fit and hold out ({len(frame)}; " + "; ".join(notes) + ")")
    best = min(fits, key=lambda f: (round(f.heldout_median, 12), SHAPES.index(f.shape)))
    chosen = best.shape
    coef = fit_shape(n, kv, y, chosen)
    if chosen == "hinge" and coef["c_above_knee"] <= 0:  # no slope past the knee: it is the line
        notes.append("hinge chosen, but refitted on every row it has no slope above its knee: written as the line")
        chosen, coef = "line", fit_shape(n, kv, y, "line")
    err = _errors(coef, n, kv, y)
    return SeriesFit(what, fits, chosen, coef, float(np.median(err)), float(err.max()), notes)


def read_calibration_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A calibration table (``sdbench calibrate``) or any step table with ``B, q, L, ms`` (the
    shared H100/H200 tables): rows of positive ms, ``component`` target where absent."""
    from sdbench.io import read_csv, read_parquet

    frame = read_csv(path, "calibration table") if str(path).endswith(".csv") else read_parquet(
        path, what="calibration table")  # fmt: skip
    missing = [c for c in ("B", "q", "L", "ms") if c not in frame.columns]
    if missing:
        raise ValueError(f"{path}: calibration table lacks column(s) {', '.join(missing)} (needs B, q, L, ms)")
    for col in ("B", "q", "L", "ms"):
        values = pd.to_numeric(frame[col], errors="coerce")
        bad = frame.index[~(values > 0) if col != "L" else ~(values >= 0)]
        if len(bad):
            value = frame.loc[bad[0], col]
            value = value.item() if hasattr(value, "item") else value  # -1.0, not np.float64(-1.0)
            raise ValueError(f"{path}: row {int(bad[0]) + 2}: column {col!r}: {value!r} "
                             f"is not a {'positive' if col != 'L' else 'non-negative'} number")  # fmt: skip
        frame[col] = values
    return _normalised(frame)


def _normalised(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the columns the fit reads: a table without ``component`` is the target's, one
    without ``same_window`` did not read time and energy over one window (the shared tables)."""
    frame = frame.copy()
    if "component" not in frame.columns:
        frame["component"] = "target"
    frame["batched_tokens"] = frame["B"] * frame["q"]
    frame["kv_tokens"] = frame["B"] * frame["L"]
    if "same_window" not in frame.columns:
        frame["same_window"] = False
    return frame


@dataclass(frozen=True)
class CalibrationFit:
    """What ``calibrate fit`` found: the cost model, the time and energy fits, the power model."""

    model: Any  # CostModel
    time: SeriesFit
    energy: SeriesFit | None
    drafter: SeriesFit | None
    power: Any  # PowerModel | None
    power_reason: str
    implied_watts: dict[str, Any]
    lines: list[str]


def fit_calibration(
    frame: pd.DataFrame,
    name: str,
    *,
    source: str,
    holdout: str = "every-4th",
    seed: int = 0,
    base: str = "llama3.1-8b-h100",
    board_limit_w: float | None = None,
) -> CalibrationFit:
    """The cost model (and power model) of a calibration table (module docstring)."""
    from sdbench.simulator.costmodel import CostModel, DrafterCost, TargetCost, load_cost_model
    from sdbench.simulator.powermodel import PowerModel, fit_power_model

    frame = _normalised(frame)
    target = frame[frame["component"] == "target"].reset_index(drop=True)
    if target.empty:
        raise ValueError(f"{source}: no target rows (component 'target') to fit")
    rule = "every 4th row in (L, B, q) order" if holdout == "every-4th" else f"a random 25% (seed {seed})"
    hold = holdout_mask(target, holdout, seed)
    seconds = target["ms"].to_numpy(float) / 1e3
    tfit = fit_series(target, seconds, hold, "step time")
    lines = [f"{source}: {len(target)} target rows; held out: {rule} ({int(hold.sum())} rows)"]
    lines += _describe(tfit, "s")

    # Energy: a power model only where time and energy came from one window; else joules alone.
    energy, power, reason = None, None, ""
    joules = target["joules"].to_numpy(float) if "joules" in target else np.full(len(target), np.nan)
    metered = np.isfinite(joules) & (joules > 0)
    same = metered & target["same_window"].fillna(False).astype(bool).to_numpy()
    implied: dict[str, Any] = {}
    limit = board_limit_w
    if limit is None and "power_limit_w" in target and target["power_limit_w"].notna().any():
        limit = float(target["power_limit_w"].max())
    if metered.any():
        sub = target[metered].reset_index(drop=True)
        energy = fit_series(sub, joules[metered], holdout_mask(sub, holdout, seed), "energy per step")
        lines += _describe(energy, "J")
        watts = predict(energy.coef, sub["batched_tokens"], sub["kv_tokens"]) / predict(
            tfit.coef, sub["batched_tokens"], sub["kv_tokens"])  # fmt: skip
        implied = {"min_w": float(watts.min()), "max_w": float(watts.max()), "limit_w": limit,
                   "above_limit": None if limit is None else int((watts > limit).sum()), "rows": int(len(watts)),
                   "from": "fitted joules / fitted seconds"}  # fmt: skip
    if same.sum() >= 3:
        sub = target[same]
        fitted = fit_power_model(sub["batched_tokens"], sub["joules"] / (sub["ms"] / 1e3))
        meters = sorted(set(sub["energy_meter"].astype(str))) if "energy_meter" in sub else []
        power = PowerModel(fitted.p_idle_w, fitted.p_span_w, fitted.n_half, fitted.h, fitted.r2,
                           f"calibrated on {len(sub)} same-window rows of {source}"
                           + (f" ({', '.join(meters)})" if meters else ""))  # fmt: skip
        peak = float(np.max(power.watts(sub["batched_tokens"])))
        implied.update(power_model_max_w=peak, power_model_saturated_w=power.p_idle_w + power.p_span_w)
        lines.append(f"  power model: {power.describe()}")
    elif metered.any():
        reason = (f"no power model: time and energy of {source} are not from one window "
                  "(energy per step fitted on joules alone)")  # fmt: skip
    else:
        reason = f"no power model: {source} measured no energy"
    if reason:
        lines.append(f"  {reason}")
    if implied:
        measured_ratio = ""
        if metered.any():
            raw = joules[metered] / (seconds[metered])
            over = "" if limit is None else f", {int((raw > limit).sum())} of {int(metered.sum())} above {limit:g} W"
            measured_ratio = f"; joules / ms as measured: {raw.min():.0f}-{raw.max():.0f} W{over}"
        above = "" if limit is None else f", {implied.get('above_limit')} of {implied.get('rows')} above {limit:g} W"
        if "min_w" in implied:
            lines.append(f"  implied watts (fitted joules / fitted seconds): {implied['min_w']:.0f}-"
                         f"{implied['max_w']:.0f} W{above}{measured_ratio}")  # fmt: skip
        if "power_model_max_w" in implied:
            lines.append(f"  power model's watts over the table: at most {implied['power_model_max_w']:.0f} W "
                         f"(saturating at {implied['power_model_saturated_w']:.0f} W)"
                         + ("" if limit is None else f"; board limit {limit:g} W"))  # fmt: skip

    # Drafter rows: a linear drafter (c_fixed + c_spec x proposed + c_kv x kv), held out the same way.
    base_model = load_cost_model(base)
    drafters = dict(base_model.drafters)
    not_calibrated = ["overhead_per_step", "switching_overhead"]
    dfit = None
    draft_rows = frame[frame["component"] == "drafter"].reset_index(drop=True)
    if not draft_rows.empty:
        method = str(draft_rows["method"].iloc[0]) if "method" in draft_rows else "eagle"
        dfit = fit_series(draft_rows, draft_rows["ms"].to_numpy(float) / 1e3, holdout_mask(draft_rows, holdout, seed),
                          f"drafter {method} proposal", shapes=("line",))  # fmt: skip
        lines += _describe(dfit, "s")
        c = dfit.coef
        drafters[method] = DrafterCost("linear", c_kv=float(c["c_kv"]), c_spec=float(c["c_compute"]),
                                       c_fixed=float(c["c_fixed"]))  # fmt: skip
        kept = sorted(set(drafters) - {method})
    else:
        kept = sorted(drafters)
        lines.append(f"  drafter: not in the table (not covered): drafters {', '.join(kept)} from {base_model.name}")
    not_calibrated += [f"drafters.{m}" for m in kept]
    lines.append(f"  not calibrated (from {base_model.name}): {', '.join(not_calibrated)}")

    c = tfit.coef
    tc = TargetCost(c_kv=float(c["c_kv"]), c_compute=float(c["c_compute"]), c_fixed=float(c["c_fixed"]),
                    knee_tokens=float(c.get("knee_tokens", 0.0)),
                    c_above_knee=float(c.get("c_above_knee", 0.0)))  # fmt: skip
    fit: dict[str, Any] = {
        "method": "calibrate fit: least squares of the relative error, coefficients >= 0, knee on a log grid",
        "table": str(source),
        "holdout": rule,
        "time": _fit_record(tfit),
        "not_calibrated": not_calibrated,
        "base": base_model.name,
    }
    if energy is not None:
        fit["energy"] = {**_fit_record(energy), "unit": "joules per step"}
    if dfit is not None:
        fit["drafter"] = _fit_record(dfit)
    if implied:
        fit["implied_watts"] = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in implied.items()}
    fit["power_model"] = power.label() if power is not None else reason
    model = CostModel(
        name=name,
        target=tc,
        drafters=drafters,
        overhead_per_step=base_model.overhead_per_step,
        switching_overhead=base_model.switching_overhead,
        description=f"calibrated target step ({tfit.chosen}) from {Path(source).name}; "
        f"drafters and overhead as noted in fit.not_calibrated",
        source=f"sdbench calibrate fit {source}",
        fit=fit,
    )
    return CalibrationFit(model, tfit, energy, dfit, power, reason, implied, lines)


def _fit_record(f: SeriesFit) -> dict[str, Any]:
    """The YAML record of a fit: each shape's held-out errors, the choice, its in-sample errors."""
    return {
        "shapes": {s.shape: {"heldout_median": round(s.heldout_median, 6), "heldout_max": round(s.heldout_max, 6),
                             "heldout_max_at": s.worst, "train_rows": s.train_rows, "heldout_rows": s.heldout_rows}
                   for s in f.shapes},
        "chosen": f.chosen,
        "coefficients": {k: float(v) for k, v in f.coef.items()},
        "all_rows_median": round(f.median, 6),
        "all_rows_max": round(f.largest, 6),
    }  # fmt: skip


def _describe(f: SeriesFit, unit: str) -> list[str]:
    out = [f"  {f.what}:"]
    for s in f.shapes:
        knee = f" (knee {s.coef['knee_tokens']:.4g} tokens)" if s.shape == "hinge" else ""
        out.append(f"    {s.shape:5s}{knee}: held-out median {s.heldout_median:.1%}, largest {s.heldout_max:.1%} "
                   f"at {s.worst} ({s.heldout_rows} rows; fitted on {s.train_rows})")  # fmt: skip
    out += [f"    {note}" for note in f.notes]
    c = f.coef
    terms = f"{c['c_fixed']:.4g} {unit} + {c['c_compute']:.4g} {unit}/token + {c['c_kv']:.4g} {unit}/KV token"
    if c.get("c_above_knee", 0.0) > 0:
        terms += f" + {c['c_above_knee']:.4g} {unit}/token above {c['knee_tokens']:.4g} tokens"
    out.append(f"    chosen: {f.chosen}, refitted on every row: {terms} "
               f"(in-sample median {f.median:.1%}, largest {f.largest:.1%})")  # fmt: skip
    return out


# ----------------------------------------------------------------------------- CLI
def _positive(values: Sequence[int], flag: str, minimum: int = 1) -> tuple[int, ...]:
    bad = [v for v in values if v < minimum]
    if bad:
        raise ValueError(f"{flag}: {bad[0]} is not >= {minimum}")
    return tuple(sorted(set(values)))


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from sdbench.config import load_config

    missing = [f"--{k}" for k in ("model", "output") if not getattr(args, k)]
    if missing:  # not argparse-required: `calibrate fit` takes neither
        raise ValueError(f"sdbench calibrate: the following arguments are required: {', '.join(missing)} "
                         "(see sdbench calibrate --help)")  # fmt: skip
    if args.figure:
        from sdbench.drawn import drawn_path

        if drawn_path(args.figure).resolve() == Path(args.output).resolve():
            raise ValueError(f"--figure {args.figure}: its drawn table goes to {drawn_path(args.figure)}, "
                             "the --output; name them apart")  # fmt: skip
    if args.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = args.device
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {device}: torch sees no CUDA (or ROCm) device here")
    grid = Grid(_positive(args.batch_sizes, "--batch-sizes"), _positive(args.tokens, "--tokens"),
                _positive(args.contexts, "--contexts", minimum=0))  # fmt: skip
    if args.windows < 1 or (args.window_s is not None and args.window_s <= 0):
        raise ValueError(f"--windows {args.windows} / --window-s {args.window_s}: need >= 1 window of > 0 s")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads: {args.threads} is not >= 1")
        torch.set_num_threads(args.threads)
    config = load_config(args.config) if args.config else None
    comps, uncovered = resolve_components(args.model, config=config, method=args.method, drafter=args.drafter,
                                          drafter_kind=args.drafter_kind)  # fmt: skip
    if args.no_drafter:
        comps, uncovered = comps[:1], "drafter: not timed (--no-drafter)"
    dtype = args.dtype or ("float32" if device == "cpu" else "bfloat16")  # bf16: as vLLM serves an 8B model
    window_s = args.window_s if args.window_s is not None else (1.0 if device.startswith("cuda") else 0.2)
    print(f"calibrate: {', '.join(f'{c.component} {c.model} ({c.method})' for c in comps)} on {device} {dtype}, "
          f"{len(grid.points())} grid points x {args.windows} windows of >= {window_s:g} s"
          + (f"; {uncovered}" if uncovered else ""), file=sys.stderr)  # fmt: skip
    t0 = time.perf_counter()
    table = calibrate(comps, grid, device=device, dtype=dtype, graphs=not args.no_graphs, window_s=window_s,
                      windows=args.windows, seed=args.seed)  # fmt: skip
    wall = time.perf_counter() - t0
    write_table(table, args.output)
    if args.figure:
        figure_calibration(table, args.figure)
    meters = ", ".join(sorted(set(table["energy_meter"]))) or "none"
    print(f"calibrated {len(table)} rows in {wall:.1f} s (energy: {meters}); {uncovered or 'drafter: timed'}")
    print(f"wrote {args.output}" + (f" and {args.figure}" if args.figure else ""))
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from sdbench.simulator.costmodel import save_cost_model
    from sdbench.simulator.powermodel import save_power_model

    frame = read_calibration_table(args.table)
    result = fit_calibration(frame, args.name, source=str(args.table), holdout=args.holdout, seed=args.seed,
                             base=args.base, board_limit_w=args.board_limit_w)  # fmt: skip
    save_cost_model(result.model, args.output)
    print("\n".join(result.lines))
    wrote = [str(args.output)]
    if args.power_output:
        save_power_model(result.power, args.power_output, result.power_reason)
        wrote.append(str(args.power_output))
    print(f"wrote {' and '.join(wrote)}")
    return 0
