"""Run as a script by test_upgrade_diff.py: renders the TPUTorchJob / TPUTorchService bodies it
reads as one JSON object (key -> body) on stdin with whichever tputorch is first on PYTHONPATH
(this checkout's, or a previous release's sources), and writes to stdout as JSON
{"tputorch": the package's file, "rendered": {key: child}, "refused": {key: why}}.

One process renders every body, so the check costs one import of each tree. It uses only what
every release has had (tputorch.api.spec.parse_any, tputorch.render.render_any): it must run
against the previous release's code unchanged."""

import json
import sys

import tputorch
from tputorch.api.spec import InvalidSpec, parse_any
from tputorch.render import render_any


def main() -> None:
    out = {"tputorch": tputorch.__file__, "rendered": {}, "refused": {}}
    for key, body in json.load(sys.stdin).items():
        try:
            out["rendered"][key] = render_any(parse_any(body))
        except InvalidSpec as e:
            out["refused"][key] = str(e)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
