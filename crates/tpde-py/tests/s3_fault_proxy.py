"""An HTTP proxy in front of an S3 server that fails a share of the requests it passes on, the
ways a busy or flaky object store does: throttling answers (503 SlowDown) and connections reset
before the request reaches the server; server errors (500) and responses cut off mid-body after
the server did the work; slow answers. The tests use it to check that no save is lost to faults
a client is expected to ride out, and that a failure the client sees leaves no upload behind.

It keeps the Host header the client signed (SigV4 signs it), so the server checks signatures as
if the client had talked to it directly.
"""
from __future__ import annotations

import http.client
import random
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Optional, Tuple

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
    b"<Message>We encountered an internal error. Please try again.</Message></Error>"
)


class FaultProxy:
    """``FaultProxy(upstream_port, rate, seed)``: a proxy on 127.0.0.1:``port`` that faults each
    request with probability ``rate`` (over HTTPS with ``tls``, a certificate and its key). ``fail_when`` (method, path with query) -> bool makes
    every matching request fail with a 500, for tests of what a failed upload leaves."""

    KINDS = ("slow-down", "reset-before", "error-after", "truncate-after", "delay")

    def __init__(self, upstream_port: int, rate: float, seed: int = 0, tls: Optional[Tuple[str, str]] = None):
        self.upstream_port = upstream_port
        self.rate = rate
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.fail_when: Optional[Callable[[str, str], bool]] = None
        # Requests matching ``hold_when`` wait, unsent, until ``release`` (an upload held in
        # flight while its writer is stopped); ``held`` counts them.
        self.hold_when: Optional[Callable[[str, str], bool]] = None
        self.held = 0
        self._released = threading.Event()
        self.counts: Dict[str, int] = {"requests": 0, **{k: 0 for k in self.KINDS}}
        # Multipart uploads the server started whose answer never reached the client: no client
        # can abort those (only a listing of the bucket's uploads, or a lifecycle rule, finds them).
        self.lost_creates = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _handle(self):
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:  # (certificate, key): an HTTPS endpoint, as a cloud store is
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._released.set()
        self.server.shutdown()
        self.server.server_close()

    def _fault(self, method: str) -> Optional[str]:
        with self.lock:
            self.counts["requests"] += 1
            if self.random.random() >= self.rate:
                return None
            kinds = list(self.KINDS)
            if method == "HEAD":
                kinds.remove("truncate-after")  # a HEAD has no body to cut
            kind = self.random.choice(kinds)
            self.counts[kind] += 1
            return kind

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        assert "chunked" not in h.headers.get("Transfer-Encoding", ""), "the proxy reads Content-Length bodies only"
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        if self.fail_when is not None and self.fail_when(h.command, h.path):
            self._reply(h, 500, INTERNAL)
            return
        if self.hold_when is not None and self.hold_when(h.command, h.path):
            with self.lock:
                self.held += 1
            self._released.wait()
        kind = self._fault(h.command)
        if kind == "slow-down":
            self._reply(h, 503, SLOW_DOWN)
            return
        if kind == "reset-before":
            self._reset(h)
            return
        if kind == "delay":
            time.sleep(0.25)
        status, headers, data = self._forward(h, body)
        if kind in ("error-after", "truncate-after") and h.command == "POST" and "?uploads" in h.path:
            with self.lock:
                self.lost_creates += 1
        if kind == "error-after":
            self._reply(h, 500, INTERNAL)
            return
        h.send_response(status)
        for k, v in headers:
            # A HEAD's Content-Length is the object's: passed on as it is.
            if k.lower() not in ("connection", "transfer-encoding") and (k.lower() != "content-length" or h.command == "HEAD"):
                h.send_header(k, v)
        if h.command != "HEAD":
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command == "HEAD":
            return
        if kind == "truncate-after" and data:
            h.wfile.write(data[: len(data) // 2])
            self._reset(h)
            return
        h.wfile.write(data)

    def _forward(self, h: BaseHTTPRequestHandler, body: bytes):
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
            for k, v in h.headers.items():
                if k.lower() not in ("connection", "content-length"):
                    conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            r = conn.getresponse()
            data = r.read()
            return r.status, r.getheaders(), data
        finally:
            conn.close()

    @staticmethod
    def _reply(h: BaseHTTPRequestHandler, status: int, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/xml")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    @staticmethod
    def _reset(h: BaseHTTPRequestHandler) -> None:
        h.close_connection = True
        try:
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
