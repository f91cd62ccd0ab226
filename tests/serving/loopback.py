"""A stand-in HTTP service on a free 127.0.0.1 port, run on a thread: the lifecycle the fake Hub
and the fake Cloud Storage share. A subclass names its handler class (which gets the service as
`handler.service`) and its thread."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackService:
    handler: type[BaseHTTPRequestHandler]
    thread_name = "stand-in"
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self):
        handler = type(self.handler.__name__, (self.handler,), {"service": self})  # this instance's own
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name=self.thread_name, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
