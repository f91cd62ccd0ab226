#!/usr/bin/env python3
"""Starts the stand-in Ray dashboard (the hack/fakedash package; its docstring says what it serves)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakedash.server import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
