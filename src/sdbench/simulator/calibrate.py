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
(:mod:`sdbench.engine.measure.energy`: NVML on CUDA, RAPL on the CPU where readable) is read at its two
ends. Of ``--windows`` windows per point the row keeps the one of median time, with its own
energy; without a meter the joules are NaN and ``energy_meter`` says ``not measured`` (never 0).

The fit of such a table (``sdbench calibrate fit``) is :mod:`sdbench.simulator.calibratefit`.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

    from sdbench.engine.measure.energy import meter_for

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
