"""A loopback shim in front of the GCS emulator (test and demo only, never in front of real GCS).

fake-gcs-server speaks Google's JSON API, which Google's Python client and Hadoop's GCS connector use. delta-rs
(through Rust's `object_store`) speaks GCS's XML API, of which the emulator lacks uploads (`PUT` answers "400
invalid uploadType") and multipart uploads, and whose listing ignores `start-after`. The shim forwards
JSON API calls unchanged and translates those XML API calls to their JSON API equivalents, preconditions
(`x-goog-if-generation-match`) included, so that delta-rs's conditional commits are checked by the emulator itself.

The shim runs as a process of its own (`python -m onceflow.resources.emulators.gcs_shim UPSTREAM PORT`): some delta-rs calls hold
Python's GIL while they wait for the network, which would starve a shim serving from threads of the same process.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import re
import threading
import uuid
from html import unescape
from urllib.parse import parse_qs, quote, unquote, urlsplit

Answer = tuple[int, list[tuple[str, str]], bytes]
JSON_API = ("/storage/", "/upload/", "/download/", "/batch/", "/_internal/")
_HOP_BY_HOP = ("transfer-encoding", "content-length", "connection", "host", "keep-alive")


class LoopbackProxy:
    """Forwards every request to `upstream` (an `http://127.0.0.1:PORT` server); `answer` may be overridden to
    change what a request does. Its URL is `url`."""

    def __init__(self, upstream: str, port: int = 0) -> None:
        target = urlsplit(upstream)
        self.upstream_host, self.upstream_port = target.hostname or "127.0.0.1", target.port or 80
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # The status line and headers, then the body, go out as separate writes: with Nagle's algorithm on,
            # the body waits for the client's delayed ACK of the headers, on every answer.
            disable_nagle_algorithm = True

            def _serve(self) -> None:
                body = _request_body(self)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                status, answer_headers, payload = proxy.answer(self.command, self.path, headers, body)
                self.send_response(status)
                for key, value in answer_headers:
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                if self.command == "HEAD":
                    length = dict((k.lower(), v) for k, v in answer_headers).get("content-length", "0")
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _serve_quietly(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a reader that stopped early
                    self._serve()

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve_quietly

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        """The upstream server's answer to the request, unchanged."""
        connection = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            connection.request(method, path, body=body if method not in ("GET", "HEAD") else None, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        except ConnectionRefusedError:  # the emulator is not up (yet): the client retries
            return 502, [], b""
        finally:
            connection.close()

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        return self.forward(method, path, headers, body)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _request_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while size := int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16):
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
        while handler.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(chunks)
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class XmlApiShim(LoopbackProxy):
    """See the module docstring."""

    def __init__(self, upstream: str, port: int = 0) -> None:
        super().__init__(upstream, port)
        self._parts: dict[str, dict[int, bytes]] = {}  # multipart upload id -> part number -> bytes
        self._lock = threading.Lock()

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        split = urlsplit(path)
        if split.path.startswith(JSON_API) or split.path == "/":
            return self.forward(method, path, headers, body)
        bucket, _, name = split.path.lstrip("/").partition("/")
        bucket, name = unquote(bucket), unquote(name)
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        named = {key.lower(): value for key, value in headers.items()}  # header names are case-insensitive
        match_generation = named.get("x-goog-if-generation-match")
        if not name and method == "GET":
            return self._list(path, headers, query)
        if method == "PUT" and "uploadId" in query:
            with self._lock:
                self._parts[query["uploadId"]][int(query["partNumber"])] = body
            return 200, [("ETag", f'"{uuid.uuid4().hex}"')], b""
        if method == "POST" and "uploads" in query:
            upload = uuid.uuid4().hex
            with self._lock:
                self._parts[upload] = {}
            xml = (f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{name}</Key>"
                   f"<UploadId>{upload}</UploadId></InitiateMultipartUploadResult>")
            return 200, [("Content-Type", "application/xml")], xml.encode()
        if method == "POST" and "uploadId" in query:
            with self._lock:
                parts = self._parts.pop(query["uploadId"])
            status, answer_headers, _ = self._upload(bucket, name, b"".join(parts[n] for n in sorted(parts)),
                                                     match_generation)
            etag = dict(answer_headers).get("ETag", "")
            xml = (f"<CompleteMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{name}</Key><ETag>{etag}</ETag>"
                   "</CompleteMultipartUploadResult>")
            return status, answer_headers, xml.encode() if status < 300 else b""
        if method == "DELETE" and "uploadId" in query:
            with self._lock:
                self._parts.pop(query["uploadId"], None)
            return 204, [], b""
        if method == "PUT":
            return self._upload(bucket, name, body, match_generation)
        if method == "DELETE":
            status, answer_headers, payload = self.forward("DELETE", f"/storage/v1/b/{bucket}/o/{_q(name)}", {}, b"")
            return (204 if status < 300 else status), answer_headers, payload
        return self.forward(method, path, headers, body)

    def _upload(self, bucket: str, name: str, data: bytes, match_generation: str | None) -> Answer:
        # A multipart upload: the emulator checks `ifGenerationMatch` on these (not on a plain media upload).
        path = f"/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        if match_generation is not None:
            path += f"&ifGenerationMatch={match_generation}"
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps({'name': name})}"
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n").encode() + data + \
            f"\r\n--{boundary}--\r\n".encode()
        return self._xml_answer(self.forward("POST", path, {"Content-Type": f"multipart/related; boundary={boundary}"},
                                             body))

    def _xml_answer(self, answer: Answer) -> Answer:
        """An XML API answer to a JSON API one: the object's ETag and generation as headers, no body."""
        status, headers, payload = answer
        if status >= 300:
            return status, headers, payload
        described = json.loads(payload or b"{}")
        return 200, [("ETag", f'"{described.get("etag", "")}"'),
                     ("x-goog-generation", str(described.get("generation", "")))], b""

    def _list(self, path: str, headers: dict[str, str], query: dict[str, str]) -> Answer:
        """The emulator's XML listing, without the entries at or before `start-after` it forgot to leave out."""
        status, answer_headers, payload = self.forward("GET", path, headers, b"")
        after = query.get("start-after")
        if status >= 300 or not after:
            return status, answer_headers, payload

        def keep(entry: re.Match[bytes]) -> bytes:
            key = re.search(rb"<Key>(.*?)</Key>", entry.group(0), re.S)
            return entry.group(0) if key is None or unescape(key.group(1).decode()) > after else b""

        return status, answer_headers, re.sub(rb"<Contents>.*?</Contents>", keep, payload, flags=re.S)


def _q(name: str) -> str:
    return quote(name, safe="")



if __name__ == "__main__":
    import sys

    XmlApiShim(sys.argv[1], int(sys.argv[2]))
    threading.Event().wait()  # serve until the process is stopped
