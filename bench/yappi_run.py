#!/usr/bin/env python3
"""`python bench/yappi_run.py PROF ARGS...` runs `tputorch ARGS...` under yappi's CPU clock, every
thread included (cProfile sees the event loop's thread only; the watches' JSON decoding and the
kubernetes client's calls run on threads of their own), and saves a pstats file PROF on SIGUSR1 (the
operator under yappi does not always stop on SIGINT: send SIGUSR1, then SIGKILL) and on exit."""

from __future__ import annotations

import signal
import sys

import yappi


def main() -> int:
    prof, args = sys.argv[1], sys.argv[2:]

    def save(*_) -> None:
        yappi.get_func_stats().save(prof, type="pstat")
        print(f"profile saved to {prof}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGUSR1, save)
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    try:
        from tputorch.cli.main import main as tputorch
        return tputorch(args)
    finally:
        yappi.stop()
        save()


if __name__ == "__main__":
    sys.exit(main())
