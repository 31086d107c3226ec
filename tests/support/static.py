"""A threaded static file server for browser tests and benchmarks: roots mounted under prefixes.

    server = StaticServer({"/": Path("demo"), "/pyodide/": Path("build/web/pyodide")})
    server.start()          # server.url == "http://127.0.0.1:<port>"
    server.stop()

By default every response says `no-cache` (with an ETag, so a revalidation is a
304): tests always see the files as built. The benchmarks pass `cache_seconds`
so that a warm start really uses the browser's HTTP cache. Like the reference
server, it sends the cross-origin isolation headers (`isolation=False` does not),
which worker pages need, and it sends with TCP_NODELAY, as it does.
"""

from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

CONTENT_TYPES = {
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".wasm": "application/wasm",
    ".json": "application/json",
    ".whl": "application/zip",
    ".zip": "application/zip",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".py": "text/x-python; charset=utf-8",
}


ISOLATION_HEADERS = (
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Embedder-Policy", "require-corp"),
    ("Cross-Origin-Resource-Policy", "same-origin"),
)


class StaticServer:
    def __init__(
        self,
        mounts: dict[str, Path],
        host: str = "127.0.0.1",
        cache_seconds: int | None = None,
        isolation: bool = True,
    ) -> None:
        # Longest prefix first, so "/pyodide/" wins over "/".
        self.mounts = sorted(
            ((p, r.resolve()) for p, r in mounts.items()), key=lambda m: -len(m[0])
        )
        self.host = host
        self.cache_control = "no-cache" if cache_seconds is None else f"max-age={cache_seconds}"
        self.requests: list[str] = []
        self.headers = ISOLATION_HEADERS if isolation else ()
        self._httpd: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "call start() first"
        return f"http://{self.host}:{self._httpd.server_address[1]}"

    def resolve(self, url_path: str) -> Path | None:
        path = unquote(urlsplit(url_path).path)
        for prefix, root in self.mounts:
            if path.startswith(prefix):
                candidate = (root / path[len(prefix) :]).resolve()
                if candidate.is_relative_to(root) and candidate.is_file():
                    return candidate
                if candidate.is_dir() and (candidate / "index.html").is_file():
                    return candidate / "index.html"
        return None

    def start(self) -> StaticServer:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real server would
            # TCP_NODELAY, as the reference server has it (asyncio sets it on every
            # TCP transport): with Nagle's algorithm a response's body, written after
            # its headers, waits for their ACK, which the browser delays by up to 40 ms.
            disable_nagle_algorithm = True

            def end_headers(self) -> None:
                for name, value in server.headers:
                    self.send_header(name, value)
                super().end_headers()

            def do_GET(self) -> None:
                server.requests.append(self.path)
                file = server.resolve(self.path)
                if file is None:
                    self.send_error(404)
                    return
                stat = file.stat()
                etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
                if self.headers.get("If-None-Match") == etag:
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = file.read_bytes()
                self.send_response(200)
                content_type = CONTENT_TYPES.get(file.suffix, "application/octet-stream")
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", server.cache_control)
                self.send_header("ETag", etag)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer((self.host, 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True, name="static").start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
