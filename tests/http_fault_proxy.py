"""An HTTP proxy in front of the moto S3 server that answers the first ``failures`` requests for each object (and
each listing) with an S3 error, then forwards: a store in a storm of 503 SlowDown, for the tests of retries.
``refuse`` answers, instead of forwarding, the requests a store would refuse (the OCI stand-in's rules)."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, failures: int = 3, status: int = 503,
                 methods: tuple[str, ...] = ("GET", "HEAD"),
                 refuse: Callable[[str, str, Mapping[str, str]], tuple[int, str, str] | None] | None = None):
        self.target = (target_host, target_port)
        self.failures, self.status, self.methods = failures, status, methods
        self.refuse = refuse  # (method, path, headers) -> (status, S3 error code, message) to answer, or None
        self.refused: list[tuple[str, str, str]] = []  # (method, path, code) of each refused request
        self.seen: dict[tuple[str, str], int] = {}  # (method, path) -> requests so far
        self.answered_with_errors = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: botocore sends "Expect: 100-continue" with every upload and, answered by an HTTP/1.0
            # server, waits a second for the "100 Continue" that never comes before it sends the body
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _answer(self, status: int, error: bytes) -> None:
                """An S3-style XML error (no body for HEAD)."""
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(0 if self.command == "HEAD" else len(error)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(error)

            def _handle(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                refusal = proxy.refuse(self.command, self.path, self.headers) if proxy.refuse else None
                if refusal is not None:
                    status, code, message = refusal
                    with proxy._lock:
                        proxy.refused.append((self.command, self.path, code))
                    self._answer(status, (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                                          f"<Message>{message}</Message></Error>").encode())
                    return
                with proxy._lock:
                    count = proxy.seen.get((self.command, self.path), 0)
                    proxy.seen[(self.command, self.path)] = count + 1
                    fail = self.command in proxy.methods and count < proxy.failures
                    proxy.answered_with_errors += fail
                if fail:
                    self._answer(proxy.status, SLOW_DOWN)
                    return
                upstream = http.client.HTTPConnection(*proxy.target, timeout=30)
                hop_by_hop = ("expect", "connection", "keep-alive")  # this hop's: answered here, not forwarded
                upstream.request(self.command, self.path, body=body or None,
                                 headers={k: v for k, v in self.headers.items() if k.lower() not in hop_by_hop})
                response = upstream.getresponse()
                data = response.read()
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                # a HEAD's length is the object's, as the store said (its body is empty)
                length = response.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
