"""A Hugging Face hub on 127.0.0.1 for the download tests: the real huggingface_hub client
(``HF_ENDPOINT`` pointed here) against a small HTTP server.

It speaks the parts of the hub's HTTP API that ``snapshot_download`` / ``hf_hub_download`` and
``HfApi.repo_info`` / ``list_repo_files`` of huggingface_hub 2.x use:

* ``GET /api/{models,datasets}/<repo>/revision/<rev>``: the repository's info (``id``, ``sha``,
  ``siblings``, ``gated``);
* ``GET /api/{models,datasets}/<repo>/tree/<rev>[/<path>]?recursive=``: the file listing
  (``type``, ``path``, ``size``, ``oid``), one page;
* ``HEAD`` / ``GET /[datasets/]<repo>/resolve/<rev>/<file>``: a file, with ``X-Repo-Commit``,
  ``ETag`` (and ``X-Linked-Etag``: the sha256), ``Content-Length``.

Errors carry the hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``), which the client turns into its typed errors. A gated
repository's info and listing are public (as on the hub); its files need
``Authorization: Bearer <token>`` (401 without one, 403 with another). A repository is a
directory on disk, served at one commit (``main`` or that commit's sha). Every request is
recorded (:attr:`HubServer.requests`), so a test can check which files were fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Repo:
    """A served repository: its files (a directory), commit and, if gated, the token it accepts."""

    repo_id: str
    repo_type: str  # "model" | "dataset"
    root: Path
    token: str | None = None

    def files(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    @property
    def sha(self) -> str:
        digest = hashlib.sha1(self.repo_id.encode())
        for name in self.files():
            digest.update(name.encode() + b"\0" + (self.root / name).read_bytes())
        return digest.hexdigest()


class HubServer:
    """The hub on ``http://127.0.0.1:<port>`` (:attr:`endpoint`), in a thread; a context manager."""

    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo_id: str, root: str | Path, repo_type: str = "model", token: str | None = None) -> Repo:
        """Serve directory ``root`` as ``repo_id`` (gated behind ``token`` when given)."""
        repo = Repo(repo_id, repo_type, Path(root), token)
        self.repos[(repo_type, repo_id)] = repo
        return repo

    def fetched(self, repo_id: str) -> list[str]:
        """Files of ``repo_id`` whose contents were sent (GET ... /resolve/)."""
        out = []
        for method, path in self.requests:
            for prefix in (f"/{repo_id}/resolve/", f"/datasets/{repo_id}/resolve/"):
                if method == "GET" and path.startswith(prefix):
                    out.append(path[len(prefix) :].split("/", 1)[1])
        return out

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the HTTP API
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._serve(body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(body=False)

            def _send(self, status: int, headers: dict[str, str], data: bytes = b"", body: bool = True) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body and data:
                    self.wfile.write(data)

            def _error(self, status: int, code: str, message: str, body: bool) -> None:
                data = json.dumps({"error": message}).encode()
                headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
                self._send(status, headers, data, body)

            def _json(self, value: object, body: bool) -> None:
                self._send(200, {"Content-Type": "application/json"}, json.dumps(value).encode(), body)

            def _find(self, repo_type: str, parts: list[str]) -> tuple[Repo | None, list[str]]:
                if len(parts) < 2:
                    return None, parts
                return hub.repos.get((repo_type, f"{parts[0]}/{parts[1]}")), parts[2:]

            def _serve(self, body: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                with hub._lock:
                    hub.requests.append((self.command, path))
                parts = [p for p in path.split("/") if p]
                if parts[:1] == ["api"] and len(parts) >= 2 and parts[1] in ("models", "datasets"):
                    repo_type = parts[1][:-1]
                    repo, rest = self._find(repo_type, parts[2:])
                    if repo is None:
                        return self._error(404, "RepoNotFound", f"Repository not found: {path}", body)
                    if len(rest) < 2 or rest[0] not in ("revision", "tree"):
                        return self._error(404, "EntryNotFound", f"no such API route: {path}", body)
                    if rest[1] not in ("main", repo.sha):
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}", body)
                    if rest[0] == "revision":
                        return self._json(self._info(repo), body)
                    recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
                    return self._json(self._tree(repo, "/".join(rest[2:]), recursive), body)
                repo_type = "model"
                if parts[:1] == ["datasets"]:
                    repo_type, parts = "dataset", parts[1:]
                repo, rest = self._find(repo_type, parts)
                if repo is None or len(rest) < 3 or rest[0] != "resolve":
                    return self._error(404, "RepoNotFound", f"Repository not found: {path}", body)
                if repo.token is not None:
                    auth = self.headers.get("Authorization", "")
                    if not auth:
                        return self._error(
                            401, "GatedRepo", f"Access to {repo.repo_id} is restricted. Please log in.", body
                        )
                    if auth != f"Bearer {repo.token}":
                        return self._error(
                            403, "GatedRepo", f"Access to {repo.repo_id} is restricted and you are not in the authorized list.", body
                        )
                if rest[1] not in ("main", repo.sha):
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {rest[1]}", body)
                name = "/".join(rest[2:])
                file = repo.root / name
                if not file.is_file():
                    headers = {"X-Repo-Commit": repo.sha}
                    self.send_response(404)
                    for k, v in {**headers, "X-Error-Code": "EntryNotFound", "Content-Length": "0"}.items():
                        self.send_header(k, v)
                    self.end_headers()
                    return None
                data = file.read_bytes()
                sha256 = hashlib.sha256(data).hexdigest()
                headers = {
                    "X-Repo-Commit": repo.sha,
                    "ETag": f'"{sha256}"',
                    "X-Linked-Etag": f'"{sha256}"',
                    "Content-Length": str(len(data)),
                    "Content-Type": "application/octet-stream",
                    "Accept-Ranges": "bytes",
                }
                return self._send(200, headers, data, body)

            def _info(self, repo: Repo) -> dict[str, object]:
                return {
                    "id": repo.repo_id,
                    "author": repo.repo_id.split("/")[0],
                    "sha": repo.sha,
                    "private": False,
                    "gated": "manual" if repo.token else False,
                    "disabled": False,
                    "siblings": [{"rfilename": f} for f in repo.files()],
                }

            def _tree(self, repo: Repo, under: str, recursive: bool) -> list[dict[str, object]]:
                prefix = f"{under}/" if under else ""
                entries: dict[str, dict[str, object]] = {}
                for name in repo.files():
                    if not name.startswith(prefix):
                        continue
                    rest = name[len(prefix) :]
                    if not recursive and "/" in rest:
                        folder = prefix + rest.split("/", 1)[0]
                        entries[folder] = {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0}
                        continue
                    if recursive:  # the hub lists the folders too
                        parts = rest.split("/")[:-1]
                        for i in range(len(parts)):
                            folder = prefix + "/".join(parts[: i + 1])
                            entries[folder] = {"type": "directory", "path": folder, "oid": "0" * 40, "size": 0}
                    data = (repo.root / name).read_bytes()
                    entries[name] = {
                        "type": "file",
                        "path": name,
                        "size": len(data),
                        "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                    }
                return [entries[k] for k in sorted(entries)]

        return Handler


# ---------------------------------------------------------------------- repositories
def write_model_repo(root: Path) -> Path:
    """A tiny Llama-3-like model repository as meta-llama lays one out: safetensors weights
    with their config, tokenizer and generation files, plus what a snapshot must leave behind:
    a duplicate ``pytorch_model.bin``, ``original/`` (consolidated ``.pth``, params, tokenizer)
    and a flax file."""
    from support.datasets_tokenizers import save_llama3_like

    root.mkdir(parents=True, exist_ok=True)
    save_llama3_like(root)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "num_key_value_heads": 1,
        "vocab_size": 260,
    }
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "generation_config.json").write_text(json.dumps({"do_sample": False, "max_new_tokens": 16}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (root / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 8)
    (root / "pytorch_model.bin").write_bytes(b"duplicate weights in the .bin format " * 64)
    (root / "flax_model.msgpack").write_bytes(b"flax weights " * 32)
    (root / "original").mkdir(exist_ok=True)
    (root / "original" / "consolidated.00.pth").write_bytes(b"original consolidated checkpoint " * 256)
    (root / "original" / "params.json").write_text(json.dumps({"dim": 8, "n_layers": 1}))
    (root / "original" / "tokenizer.model").write_bytes(b"tiktoken ranks")
    (root / "README.md").write_text("---\nlicense: other\n---\n# tiny test model\n")
    (root / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    return root
