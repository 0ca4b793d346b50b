"""Google Cloud Storage on loopback for the tests: fake-gcs-server (Google's JSON API, generation preconditions
included), and a proxy in front of it that can lose the answer to an upload the server did perform."""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Callable
from urllib.parse import urlsplit


class LossyProxy:
    """Forwards every request to `upstream`; a request for which `lose(method, path, body)` is true the first time
    is performed upstream, but its answer is replaced by a 503, so the client retries something already done."""

    def __init__(self, upstream: str, lose: Callable[[str, str, bytes], bool]) -> None:
        target = urlsplit(upstream)
        self.lost: list[str] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                payload = answer.read()
                if lose(self.command, self.path, body) and self.path not in proxy.lost:
                    proxy.lost.append(self.path)
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
