"""tests/freeports.py, the free_port every test folder uses: a port is handed out once per process,
though the kernel may give a port it just closed again."""

import types

import freeports  # tests/ (the unit package's parent) is on sys.path


def test_a_port_the_kernel_gives_again_is_not_handed_out_twice(monkeypatch):
    ports = iter([40001, 40001, 40002])

    class Socket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            assert address == ("127.0.0.1", 0)  # the kernel picks: its ephemeral range, not the cluster's
            self.port = next(ports)

        def getsockname(self):
            return "127.0.0.1", self.port

    monkeypatch.setattr(freeports, "_given", set())
    monkeypatch.setattr(freeports, "socket", types.SimpleNamespace(socket=Socket))  # this module's only
    assert [freeports.free_port(), freeports.free_port()] == [40001, 40002]


def test_real_ports_are_distinct():
    ports = [freeports.free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(0 < p < 65536 for p in ports)
