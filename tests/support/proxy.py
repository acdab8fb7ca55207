"""A forwarding HTTP proxy on 127.0.0.1 for the download tests: what a site's ``http_proxy`` is.

A client configured with ``http_proxy=http://127.0.0.1:<port>`` sends it requests in absolute
form (``GET http://host:port/path HTTP/1.1``); the proxy forwards each to its target with the
client's headers and relays the answer. Every request is recorded (:attr:`LoopbackProxy.requests`:
method and absolute URL), so a test can check that a download went through it. Plain HTTP only
(the loopback hub speaks HTTP; CONNECT tunnels are answered 501).
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Hop-by-hop headers (RFC 9110 7.6.1): not forwarded.
HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding",
       "upgrade"}  # fmt: skip


class LoopbackProxy:
    """The proxy on ``http://127.0.0.1:<port>`` (:attr:`url`), in a thread; a context manager."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> LoopbackProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                with proxy._lock:
                    proxy.requests.append((self.command, self.path))
                target = urlsplit(self.path)
                if target.scheme != "http" or not target.hostname:
                    self.send_error(501, "the loopback proxy forwards absolute http:// requests only")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                path = target.path + (f"?{target.query}" if target.query else "")
                upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=60)
                try:
                    upstream.request(self.command, path or "/", body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    # A HEAD answer's Content-Length is the size of what a GET would return.
                    if key.lower() not in HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_POST = _forward  # noqa: N815 - http.server's names

            def do_CONNECT(self) -> None:  # noqa: N802
                self._forward()

        return Handler
