"""Chat templates and the two ways a templated prompt becomes token ids.

* The template: the model's own (its tokenizer's ``chat_template``, from the downloaded
  ``tokenizer_config.json`` or ``chat_template.jinja``) when it has one; otherwise a template
  shipped with sdbench (``sdbench/data/chat_templates/<name>.jinja``, read through
  :mod:`sdbench.packagedata`) when the caller names one. ``llama3.1`` is the Llama-3.1 Instruct
  format's no-tool path with its default date "26 Jul 2024", the one the paper's prompts carry
  (written for sdbench; it reproduces the format, not Meta's template text), so the paper's
  prompts can be rebuilt without the gated meta-llama repository.
* The form (a dataset entry's ``form``): ``clean`` tokenizes the rendered text *without* the
  tokenizer's special tokens (the template writes the BOS it wants: one); ``authors`` tokenizes it
  *with* them, as ``vllm.LLM.generate(text)`` did for the paper, which gives Llama-3 prompts a
  doubled ``<|begin_of_text|>``.
"""

from __future__ import annotations

from typing import Any

FORMS = ("clean", "authors")
SHIPPED = ("llama3.1",)


def shipped_template(name: str) -> str:
    """The text of the shipped chat template ``name`` (one of :data:`SHIPPED`)."""
    from sdbench.packagedata import read_text

    return read_text("chat_templates", f"{name}.jinja")


def resolve_template(tokenizer: Any, fallback: str | None = None) -> tuple[str | None, str]:
    """``(template, where)``: the tokenizer's chat template, else the shipped ``fallback``, else None.

    ``where`` says which, for logs: ``"model"``, ``"shipped <name>"`` or ``"none"``.
    """
    own = getattr(tokenizer, "chat_template", None)
    if own:
        return own, "model"
    if fallback:
        return shipped_template(fallback), f"shipped {fallback}"
    return None, "none"


def render_text(
    tokenizer: Any,
    turns: list[dict[str, str]],
    template: str,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The conversation ``turns`` rendered by ``template`` as text, with the assistant header."""
    return tokenizer.apply_chat_template(
        turns, chat_template=template, add_generation_prompt=True, tokenize=False, **(chat_template_kwargs or {})
    )


def encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of ``text``."""
    return [int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]


def tokenize_prompt(
    tokenizer: Any,
    turns: list[dict[str, str]] | None,
    text: str,
    form: str,
    template: str | None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt in ``form`` (:data:`FORMS`).

    ``turns`` None, or no ``template``: the raw ``text`` with the tokenizer's special tokens (a
    base model; the authors' AIME prompts). Otherwise the rendered template, tokenized without
    (``clean``) or with (``authors``) the special tokens.
    """
    if form not in FORMS:
        raise ValueError(f"form {form!r}: expected one of {', '.join(FORMS)}")
    if turns is None or not template:
        return encode(tokenizer, text, add_special_tokens=True)
    rendered = render_text(tokenizer, turns, template, chat_template_kwargs)
    return encode(tokenizer, rendered, add_special_tokens=form == "authors")
