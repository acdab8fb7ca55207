"""TEST DOUBLE: a stand-in for the Hugging Face hub's HTTP API, which cannot be reached here.

It answers the two requests ``sdbench doctor`` makes through the real ``huggingface_hub``
client (pass its ``endpoint`` to the checks):

* ``GET /api/{models|datasets}/{repo}/auth-check``: 200 when the repo is open, or gated and the
  request carries the accepted token; 403 with ``X-Error-Code: GatedRepo`` for a gated repo
  otherwise; 404 with ``X-Error-Code: RepoNotFound`` for an unknown repo (the hub's codes, read by
  ``huggingface_hub.utils.hf_raise_for_status``);
* ``GET /api/{models|datasets}/{repo}[/revision/{rev}]``: the repo's info with its file list
  (``siblings`` with ``rfilename`` and ``size``);
* ``GET [/datasets]/{repo}/resolve/{rev}/{file}``: a file's text, for the files given one
  (``Repo.texts``; 404 with ``X-Error-Code: EntryNotFound`` otherwise).

    with hub_server({"model/org/gated": Repo(files={"model.safetensors": 10}, gated=True)},
                    token="hf_ok") as endpoint:
        ...
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator


@dataclass
class Repo:
    files: dict[str, int] = field(default_factory=dict)
    gated: bool = False
    texts: dict[str, str] = field(default_factory=dict)


_RESOLVE = re.compile(r"^(/datasets)?/([^/]+/[^/]+)/resolve/[^/]+/(.+)$")
_PATH = re.compile(r"^/api/(models|datasets)/([^/]+/[^/?]+)(/auth-check|/revision/[^?]+)?(?:\?.*)?$")


@contextlib.contextmanager
def hub_server(repos: dict[str, Repo], token: str | None = None) -> Iterator[str]:
    """Serve ``repos`` (keys ``model/<id>`` or ``dataset/<id>``) on 127.0.0.1; yields the endpoint."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, code: int, body: dict, error: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error:
                self.send_header("X-Error-Code", error)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            resolve = _RESOLVE.match(self.path)
            if resolve:
                kind = "dataset" if resolve.group(1) else "model"
                repo = repos.get(f"{kind}/{resolve.group(2)}")
                text = repo.texts.get(resolve.group(3)) if repo else None
                if text is None:
                    self._send(404, {"error": "Entry not found"}, "EntryNotFound")
                    return
                data = text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            match = _PATH.match(self.path)
            if match is None:
                self._send(200, [] if self.path.startswith("/api/models?") else {})  # listing: reachable
                return
            kind, repo_id, tail = match.group(1)[:-1], match.group(2), match.group(3) or ""
            repo = repos.get(f"{kind}/{repo_id}")
            if repo is None:
                self._send(404, {"error": "Repository not found"}, "RepoNotFound")
            elif tail == "/auth-check":
                authorised = not repo.gated or self.headers.get("authorization") == f"Bearer {token}"
                if authorised:
                    self._send(200, {})
                else:
                    self._send(403, {"error": "Access to this repo is restricted"}, "GatedRepo")
            else:
                siblings = [{"rfilename": n, "size": s} for n, s in sorted(repo.files.items())]
                self._send(200, {"id": repo_id, "sha": "0" * 40, "siblings": siblings, "gated": repo.gated})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
