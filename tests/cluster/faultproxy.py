"""A loopback TCP proxy in front of the API server that can refuse, reset or blackhole the
connections of one client (one operator replica), and counts the writes it forwards.

Plain HTTP in (the replica's kubeconfig points at it, with the cluster's token), TLS to the API
server out, so that it can read each request line: a write is counted when it leaves the proxy for
the API server, with the time, the method and the path. Modes:

- ``pass``: forward;
- ``refuse``: the listening socket is closed (new connections are refused) and open connections
  are reset, as when the API server's process is gone;
- ``reset``: open and new connections are reset (RST);
- ``blackhole``: connections are accepted and nothing is forwarded either way (a silent network):
  calls hang until their own timeout.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass

WRITE_METHODS = (b"POST", b"PUT", b"PATCH", b"DELETE")


@dataclass
class Write:
    at: float  # time.time() when forwarded
    method: str
    path: str


def _rst(sock: socket.socket) -> None:
    """Reset a socket no other thread uses."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def _cut(sock: socket.socket) -> None:
    """Reset a socket that its threads are using: they wake up and close it themselves (closing it
    here would free its descriptor for a new connection while OpenSSL, which holds the raw number,
    may still read or write it: TLS records then reach a plain client)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, not SSLSocket's
    except OSError:
        pass


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], ca_file: str, name: str = "proxy") -> None:
        self.upstream, self.name = upstream, name
        self.ssl = ssl.create_default_context(cafile=ca_file)
        self.ssl.maximum_version = ssl.TLSVersion.TLSv1_2  # see _TLS
        self.mode = "pass"
        self.since = time.time()  # when the mode last changed
        self.writes: list[Write] = []
        self.episodes: list[tuple[float, float, str]] = []  # (start, end, mode)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._changed = threading.Condition()
        self._closed = False
        self._listener = self._listen(0)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _listen(self, port: int) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        return sock

    # --- faults ------------------------------------------------------------------------------------

    def set(self, mode: str) -> None:
        assert mode in ("pass", "refuse", "reset", "blackhole"), mode
        with self._changed:
            before, self.mode = self.mode, mode
            self.since = time.time()  # under the lock that _pass_at reads the mode with
            if mode in ("refuse", "reset"):
                with self._lock:
                    conns = set(self._conns)
                for c in conns:
                    _cut(c)
            if mode == "refuse" and self._listener is not None:
                self._listener.close()
                self._listener = None
            if before == "refuse" and mode != "refuse":
                for _ in range(50):  # the same port again (loopback: nobody else should take it)
                    try:
                        self._listener = self._listen(self.port)
                        break
                    except OSError:
                        time.sleep(0.1)
                threading.Thread(target=self._accept, name=f"{self.name}-accept", daemon=True).start()
            self._changed.notify_all()

    def episode(self, mode: str, seconds: float) -> None:
        start = time.time()
        self.set(mode)
        time.sleep(seconds)
        self.set("pass")
        self.episodes.append((start, time.time(), mode))

    def close(self) -> None:
        self._closed = True
        self.set("reset")
        if self._listener is not None:
            self._listener.close()

    # --- forwarding -----------------------------------------------------------------------------------

    def _pass_at(self) -> float | None:
        """Hold while blackholed; then the time, read under the mode's lock, at which the connection
        may go on (None: it was reset meanwhile). A write forwarded with that time was let through
        before any switch made later than it."""
        with self._changed:
            while self.mode == "blackhole" and not self._closed:
                self._changed.wait(0.5)
            return time.time() if self.mode == "pass" and not self._closed else None

    def _wait_while_blackholed(self) -> bool:
        return self._pass_at() is not None

    def _accept(self) -> None:
        listener = self._listener
        while listener is not None and not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                if self._listener is not listener or self._closed:
                    return  # closed (refuse mode or the end)
                time.sleep(0.01)  # ECONNABORTED: a client gave up before we accepted it
                continue
            if self.mode in ("reset", "refuse"):
                _rst(client)
                continue
            threading.Thread(target=self._serve, args=(client,), name=f"{self.name}-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            self._conns.add(client)
        if not self._wait_while_blackholed():
            self._end(client)
            return
        try:
            raw = socket.create_connection(self.upstream, timeout=10)
        except OSError:
            self._end(client)
            return
        try:
            upstream = _TLS(raw, self.ssl, self.upstream[0])
            raw.settimeout(None)
        except (OSError, ssl.SSLError):
            self._end(client, raw)
            return
        with self._lock:
            self._conns.add(raw)
        pair = _Pair(self, client, raw)
        threading.Thread(target=self._down, args=(upstream, client, pair), name=f"{self.name}-down",
                         daemon=True).start()
        self._up(client, upstream, pair)

    def _down(self, upstream, client, pair) -> None:
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if not self._wait_while_blackholed():
                    break
                client.sendall(data)
        except Exception:  # reset, cut, closed: the connection ends
            pass
        pair.finished()

    def _up(self, client, upstream, pair) -> None:
        buf = b""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    request, buf = _one_request(buf)
                    if request is None:
                        break
                    at = self._pass_at()
                    if at is None or _gone(client):
                        # a dropped packet is not delivered later: once the client gave up, never
                        raise OSError("reset")
                    upstream.sendall(request)
                    method, path = request.split(b" ", 2)[:2]
                    if method in WRITE_METHODS:
                        with self._lock:
                            self.writes.append(Write(at, method.decode(), path.decode("latin-1")))
        except Exception:  # reset, cut, closed: the connection ends
            pass
        pair.finished()

    def _end(self, *socks) -> None:
        """Close sockets no other thread uses any more."""
        with self._lock:
            for s in socks:
                self._conns.discard(s)
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


class _TLS:
    """TLS to the API server through memory BIOs: the SSL object is used only under a lock and
    never while a socket call blocks. The two directions' threads used to share one SSLSocket
    (SSL_read in one while SSL_write ran in the other), which OpenSSL does not allow: the suite's
    process aborted once inside SSL_read during a fault episode. TLS 1.2 at most, so that after the
    handshake reading never makes a record to send (TLS 1.3's post-handshake messages can)."""

    def __init__(self, raw: socket.socket, context: ssl.SSLContext, hostname: str) -> None:
        self.raw = raw
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._in, self._out, server_hostname=hostname)
        self._tls_lock = threading.Lock()  # the SSL object: never held across a socket call
        self._send_lock = threading.Lock()  # records go out in the order they were made
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.raw.sendall(self._out.read())
                if not self._fill():
                    raise OSError("the API server closed the connection during the TLS handshake")
        self.raw.sendall(self._out.read())

    def _fill(self) -> bool:
        data = self.raw.recv(65536)
        if data:
            with self._tls_lock:
                self._in.write(data)
        return bool(data)

    def recv(self, size: int) -> bytes:
        while True:
            with self._tls_lock:
                try:
                    return self._tls.read(size)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    return b""  # the API server's close_notify
            if not self._fill():
                return b""

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            with self._tls_lock:
                self._tls.write(data)
                records = self._out.read()
            self.raw.sendall(records)


class _Pair:
    """A client connection and its upstream: the first direction to end cuts both (waking the
    other), the last one closes both, so no descriptor is freed while a thread still uses it."""

    def __init__(self, proxy: FaultProxy, client, upstream) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.ended = 0
        self.lock = threading.Lock()

    def finished(self) -> None:
        _cut(self.client)
        _cut(self.upstream)
        with self.lock:
            self.ended += 1
            last = self.ended == 2
        if last:
            self.proxy._end(self.client, self.upstream)


def _gone(sock: socket.socket) -> bool:
    """The peer closed its end (it gave up on a call while we held it)."""
    try:  # MSG_DONTWAIT: the other direction's thread shares the socket; its mode stays blocking
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _one_request(buf: bytes) -> tuple[bytes | None, bytes]:
    """The first complete HTTP/1.1 request in ``buf`` (headers + Content-Length body) and the rest."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None, buf
    length = 0
    for line in buf[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    total = end + 4 + length
    if len(buf) < total:
        return None, buf
    return buf[:total], buf[total:]


def writers_per_second(proxies: list[FaultProxy], exclude: str = "/leases/") -> dict[int, set[str]]:
    """1-second window -> the names of the proxies (replicas) that forwarded a write in it."""
    windows: dict[int, set[str]] = {}
    for p in proxies:
        for w in p.writes:
            if exclude not in w.path:
                windows.setdefault(int(w.at), set()).add(p.name)
    return windows
