"""Tiny tokenizers for the dataset tests, saved like a hub model directory.

Both are byte-level BPE without merges (one token per byte, as Qwen's and Llama-3's
byte-level BPE falls back to), so decoding gives back the text exactly and a test can
compare templated text with token ids. Their chat templates reproduce the parts of the
real ones that ``sdbench.datasets.prompts.prepare`` depends on:

* ``qwen3``: ChatML turns; after the assistant header, ``enable_thinking=False`` writes
  the empty think block ``<think>\\n\\n</think>\\n\\n`` (as Qwen/Qwen3-8B's template does);
  no BOS token at all.
* ``llama3``: the template starts with ``{{ bos_token }}`` *and* the tokenizer's
  post-processor adds BOS too (as meta-llama/Llama-3.1-8B-Instruct's does), so a
  tokenization that adds special tokens to the rendered template doubles the BOS.

The template is written into ``tokenizer_config.json`` (the ``chat_template`` key), where
those hub repositories keep it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

THINK_EMPTY = "<think>\n\n</think>\n\n"

QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def _byte_level_bpe() -> Tokenizer:
    """A byte-level BPE with the 256 byte symbols and no merges: lossless and tiny."""
    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _save_with_template(fast: PreTrainedTokenizerFast, out: Path, template: str | None) -> Path:
    fast.save_pretrained(out)
    # transformers 5 saves templates to chat_template.jinja; the hub repositories the
    # pipeline loads keep theirs in tokenizer_config.json, so write it there.
    for extra in out.glob("chat_template.*"):
        extra.unlink()
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    if template is not None:
        cfg["chat_template"] = template
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def save_qwen3_like(out: Path) -> Path:
    """A Qwen3-like tokenizer directory (ChatML template with ``enable_thinking``)."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_bpe(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(["<think>", "</think>"])  # added but not special in Qwen3 either
    return _save_with_template(fast, out, QWEN3_TEMPLATE)


def save_llama3_like(out: Path, *, with_template: bool = True) -> Path:
    """A Llama-3-like tokenizer directory: BOS from the template and from the post-processor."""
    tok = _byte_level_bpe()
    bos = "<|begin_of_text|>"
    tok.add_special_tokens([bos, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>")
    return _save_with_template(fast, out, LLAMA3_TEMPLATE if with_template else None)


def save_tiny_llama(out: Path, max_position_embeddings: int) -> Any:
    """A random two-layer Llama (seed 0) with the Llama-3-like tokenizer, saved at ``out``, for
    tests that start the real vLLM engine on it; returns the tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(save_llama3_like(out))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(out)
    return tok
