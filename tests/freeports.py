"""free_port(): the loopback port for a server a test starts, one implementation for tests/unit,
tests/serving and tests/cluster (and the scripts that import their helpers).

The kernel picks it (a bind to port 0), so it comes from the ephemeral range
(ip_local_port_range, 32768-60999 by default). hack/cluster.sh's free_port picks the local
cluster's ports from 20000-32767, below that range, because its components bind theirs again at
every restart: a port a test took from 20000-32767 could be one of them between two of its binds.
The two ranges do not meet (cluster.sh stops below the ephemeral range), so a test's port never
is one of them. A test's server binds its port moments after the pick and holds it for the test;
Ray's workers (10002-19999) are below both.

The kernel may hand out a port it just closed again: two servers given the same port fail the
second's start (seen once with two components of one Ray node: the GCS and the dashboard agent's
gRPC). So a port is handed out once per process.
"""

from __future__ import annotations

import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A 127.0.0.1 TCP port free just now that this process has not handed out before."""
    with _lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _given:
                _given.add(port)
                return port
