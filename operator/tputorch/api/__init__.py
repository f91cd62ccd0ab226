"""The API of both kinds, pure: the slice table (topology), the specs and every validation rule (spec,
read through reader), the words their status is written in (phases), and the CRDs generated from the
same source (crd). The lowest layer but for train.py and timestamps.py: imports nothing from render/,
status/, controller/ or cli/ (tests/unit/test_layout.py)."""
