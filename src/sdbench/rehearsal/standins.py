"""Every stand-in of the rehearsal engine, as data: what stands where nothing is measured or published.

docs/methods/rehearsal.md holds the same tables in words (a test checks that each key below
appears there). Values marked "stated" are this project's assumptions, not measurements; the
others name their source. Nothing here comes from the held-out ShareGPT / CNN traces.
"""

from __future__ import annotations

from dataclasses import dataclass

# ----------------------------------------------------------------------------- published traces
# The paper's published Llama-3.1-8B traces the rehearsal replays (the held-out sharegpt and cnn
# traces are never read).
PUBLISHED = ("gsm8k", "instructcoder")


@dataclass(frozen=True)
class Acceptance:
    """How a vLLM method's accepted lengths are made.

    ``trace``: the published field replayed per output position (``acc_ngram`` / ``acc_eagle``);
    ``uplift``: drafts added to a step's accepted drafts where the trace accepted at least one;
    ``rates``: otherwise, the conditional acceptance rate of draft position 1, 2, ... (the last one
    repeats), drawn per position with a seeded generator.
    """

    trace: str | None = None
    uplift: int = 0
    rates: tuple[float, ...] = ()
    why: str = ""


_MTP = Acceptance(
    rates=(0.92, 0.74, 0.56),
    why="the paper's GLM-4.5-Air MTP on GPQA (Sec. 3.2): 0.92, 0.68, 0.38 per position, as conditional rates",
)
METHOD_ACCEPTANCE: dict[str, Acceptance] = {
    "ngram": Acceptance(trace="acc_ngram", why="published n-gram trace"),
    "suffix": Acceptance(trace="acc_ngram", why="stated: suffix decoding copies from context as n-gram does"),
    "eagle": Acceptance(trace="acc_eagle", why="published EAGLE trace"),
    "eagle3": Acceptance(trace="acc_eagle", uplift=1, why="stated: EAGLE-3 accepts one draft more than EAGLE "
                         "where EAGLE accepts any (the paper: EAGLE-3 leads EAGLE on every dataset)"),
    "draft_model": Acceptance(trace="acc_eagle", uplift=1, why="stated: as EAGLE-3 (the paper: draft models "
                              "accept 75-81% on GSM8K, above EAGLE)"),
    "mtp": _MTP,
    "deepseek_mtp": _MTP,
    "qwen3_next_mtp": _MTP,
    "medusa": Acceptance(rates=(0.6, 0.5, 0.4), why="stated: Medusa-1 heads' top-1 accuracy falls with depth"),
}

# Which published trace a dataset's requests replay: by dataset key, then by category, else DEFAULT.
TRACE_BY_DATASET: dict[str, str] = {"gsm8k": "gsm8k", "instructcoder": "instructcoder"}
TRACE_BY_CATEGORY: dict[str, str] = {"math": "gsm8k", "code": "instructcoder", "coding": "instructcoder"}
# stated: chat, summarization, reasoning, SPEED-Bench and random inputs replay GSM8K, whose EAGLE
# acceptance is nearly geometric and whose n-gram acceptance is low (no copying from the prompt).
DEFAULT_TRACE = "gsm8k"


# ----------------------------------------------------------------------------- rehearsal prompt sets
@dataclass(frozen=True)
class LogNormal:
    """A length distribution: ``round(median * exp(sigma * z))``, at least 1 token."""

    median: float
    sigma: float


@dataclass(frozen=True)
class Lengths:
    """Prompt and output lengths of a rehearsal prompt set.

    ``trace``: the lengths of the published trace's records, record i for request i (cycled);
    else ``prompt`` (a distribution, or a fixed length) and ``output`` (a distribution; None: the
    output length of the request's acceptance record). An output distribution gives its spread
    only: its mean is the dataset's expected output (:func:`sdbench.rehearsal.prepare.expected_outputs`).
    """

    trace: str | None = None
    prompt: LogNormal | int | None = None
    output: LogNormal | None = None
    why: str = ""


# By the dataset entry's builder (speed_bench by its configuration, below).
LENGTHS_BY_BUILDER: dict[str, Lengths] = {
    "gsm8k": Lengths(trace="gsm8k", why="published trace: prompt and output length of each record"),
    "instructcoder": Lengths(trace="instructcoder", why="published trace: prompt and output length of each record"),
    "sharegpt": Lengths(prompt=LogNormal(150, 1.2), output=LogNormal(424, 1.05),
                        why="output: log-normal with the paper's Tab. 1 w/o SD mean and std (737 +- 1048); "
                            "prompt: stated"),
    "cnn_dailymail": Lengths(prompt=LogNormal(900, 0.4), output=LogNormal(110, 0.4),
                             why="stated: a news article in, a few-sentence summary out"),
    "aime": Lengths(prompt=LogNormal(160, 0.4), output=LogNormal(12000, 0.5),
                    why="stated: short problems, long thinking (the paper extends max_tokens to 32K)"),
    "gpqa": Lengths(prompt=LogNormal(280, 0.35), output=LogNormal(7000, 0.6),
                    why="stated: a question with four choices, long thinking"),
}
SPEED_BENCH_QUALITATIVE = Lengths(prompt=LogNormal(400, 1.0), output=LogNormal(500, 0.8),
                                  why="stated: SPEED-Bench's qualitative prompts vary widely")
# SPEED-Bench throughput configurations: every prompt of the bucket's input length (tokens).
SPEED_BENCH_INPUT = {"throughput_1k": 1024, "throughput_2k": 2048, "throughput_8k": 8192,
                     "throughput_16k": 16384, "throughput_32k": 32768}  # fmt: skip
SPEED_BENCH_THROUGHPUT_OUTPUT = LogNormal(500, 0.8)  # stated
DEFAULT_LENGTHS = Lengths(prompt=LogNormal(300, 0.8), output=None,
                          why="stated prompt lengths; output lengths of the acceptance record")


# ----------------------------------------------------------------------------- stand-in models
@dataclass(frozen=True)
class ModelFacts:
    """config.json facts a stand-in model directory needs that the architecture YAMLs do not hold."""

    eos_token_id: int
    max_position_embeddings: int
    bos_token_id: int | None = None


MODEL_FACTS: dict[str, ModelFacts] = {
    "meta-llama/Llama-3.1-8B-Instruct": ModelFacts(128009, 131072, 128000),
    "meta-llama/Llama-3.2-1B-Instruct": ModelFacts(128009, 131072, 128000),
    "meta-llama/Meta-Llama-3-70B-Instruct": ModelFacts(128009, 8192, 128000),
    "Qwen/Qwen3-8B": ModelFacts(151645, 40960, 151643),
    "Qwen/Qwen3-0.6B": ModelFacts(151645, 40960, 151643),
    "Qwen/Qwen3-1.7B": ModelFacts(151645, 40960, 151643),
    "Qwen/Qwen3-32B": ModelFacts(151645, 40960, 151643),
    "zai-org/GLM-4.5-Air": ModelFacts(151329, 131072, None),
}
# stated, for a model with no entry: the last id ends an output; an 8K context.
DEFAULT_CONTEXT = 8192

# ----------------------------------------------------------------------------- step costs
# The cost model every step is priced with: the paper simulator's Llama-3.1-8B / one H100 /
# vLLM 0.10.1.1 model (src/sdbench/data/cost_models/llama3.1-8b-h100.yaml), and its target.
BASE_COST_MODEL = "llama3.1-8b-h100"
BASE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# stated: tensor parallelism's two all-reduces per layer cost 20% on every target coefficient.
TP_OVERHEAD = 0.20
# stated: every engine version runs at the cost model's speed (no per-version model is published).
VERSION_FACTOR: dict[str, float] = {}
# Drafting cost per vLLM method: "ngram" prices a step as the cost model's n-gram fraction of the
# verify pass; "eagle" as its EAGLE head (linear in KV and proposed tokens), scaled like the
# target; "draft_model" as num_speculative_tokens passes of the target at one token per
# sequence, times DRAFT_MODEL_RATIO.
DRAFTING: dict[str, str] = {
    "ngram": "ngram",
    "suffix": "ngram",  # stated: a suffix-tree lookup on the CPU, like n-gram's
    "eagle": "eagle",
    "eagle3": "eagle",  # stated: one decoder layer and an LM head, as EAGLE's
    "mtp": "eagle",  # stated: one MTP layer reused per draft position
    "deepseek_mtp": "eagle",
    "qwen3_next_mtp": "eagle",
    "medusa": "eagle",  # stated: heads on the last hidden state
    "draft_model": "draft_model",
}
# Draft-model forward pass / target forward pass (the paper, Sec. 3.2): 12.5% for Llama3-70B with
# Llama3.2-1B, an estimated 37.5% for 8B targets; stated: 37.5% for any other target.
DRAFT_MODEL_RATIO: dict[str, float] = {"meta-llama/Meta-Llama-3-70B-Instruct": 0.125}
DEFAULT_DRAFT_MODEL_RATIO = 0.375

# ----------------------------------------------------------------------------- the engine
# stated: engine start-up = a fixed part (process start, CUDA graph capture, compilation) plus
# loading each rank's share of the weights at LOAD_GIB_PER_S.
STARTUP_FIXED_S = 60.0
LOAD_GIB_PER_S = 2.0
# vLLM V1's chunked prefill: at most this many tokens per step (decodes first, then prefill chunks).
MAX_NUM_BATCHED_TOKENS = 8192
# KV-cache accounting of the memory report: vLLM's default gpu_memory_utilization and block size,
# and (stated) activations and CUDA graphs per GPU.
GPU_MEMORY_UTILIZATION = 0.9
BLOCK_SIZE = 16
ACTIVATION_RESERVE_GIB = 4.0
DEFAULT_DEVICE_MEMORY_GIB = 80.0  # an H100 80GB, where the engine entry names no device_memory_gib
