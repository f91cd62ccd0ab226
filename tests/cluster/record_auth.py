"""Records how a real Ray 2.60 head with token auth (`RAY_AUTH_MODE=token`, as KubeRay 1.6 starts
a RayCluster with `authOptions`) answers dashboard calls with a missing, wrong or right token, in
each place a client may put it: the shapes the stand-in dashboard replays
(hack/fakedash/recorded/auth.json, read by hack/fakedash/auth.py).

    .venv/bin/python tests/cluster/record_auth.py [OUT]     (default: hack/fakedash/recorded/auth.json)
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_backend import RealRay  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "hack" / "fakedash" / "recorded" / "auth.json"
_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(method: str, url: str, headers: dict, body: bytes | None = None) -> dict:
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with _no_proxy.open(req, timeout=30) as resp:
            code, ctype, data = resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        code, ctype, data = exc.code, exc.headers.get("Content-Type", ""), exc.read()
    return {"status": code, "content_type": ctype, "body": data.decode(errors="replace")}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    ray = RealRay().start(warm=False)
    try:
        t = ray.token
        submit = json.dumps({"entrypoint": "true"}).encode()
        cases = {
            # (method, path, headers, body): what a caller without the token, with a wrong one, or
            # with the right one in each accepted place gets.
            "missing": ("GET", "/api/jobs/", {}, None),
            "missing_submit": ("POST", "/api/jobs/", {"Content-Type": "application/json"}, submit),
            "wrong": ("GET", "/api/jobs/", {"Authorization": "Bearer not-the-token"}, None),
            "wrong_x_ray": ("GET", "/api/jobs/", {"X-Ray-Authorization": "Bearer not-the-token"}, None),
            "no_bearer_prefix": ("GET", "/api/jobs/", {"Authorization": t}, None),
            "lowercase_bearer": ("GET", "/api/jobs/", {"Authorization": f"bearer {t}"}, None),
            "right_authorization": ("GET", "/api/jobs/", {"Authorization": f"Bearer {t}"}, None),
            "right_x_ray": ("GET", "/api/jobs/", {"X-Ray-Authorization": f"Bearer {t}"}, None),
            "right_cookie": ("GET", "/api/jobs/", {"Cookie": f"ray-authentication-token={t}"}, None),
            "wrong_authorization_right_x_ray": ("GET", "/api/jobs/", {"Authorization": "Bearer not-the-token",
                                                                      "X-Ray-Authorization": f"Bearer {t}"}, None),
            "public_authentication_mode": ("GET", "/api/authentication_mode", {}, None),
            "public_gcs_healthz": ("GET", "/api/gcs_healthz", {}, None),
            "version_missing": ("GET", "/api/version", {}, None),
            "serve_missing": ("GET", "/api/serve/applications/", {}, None),
        }
        recorded = {}
        for name, (method, path, headers, body) in cases.items():
            answer = call(method, ray.url + path, headers, body)
            if answer["status"] == 200 and path.startswith("/api/jobs"):
                answer["body"] = "<the jobs list>"  # only the refusals' bodies matter
            recorded[name] = {"request": {"method": method, "path": path,
                                          "headers": {k: v.replace(t, "<token>") for k, v in headers.items()}},
                              "response": answer}
    finally:
        ray.stop()
    out.write_text(json.dumps({"ray_version": "2.60.0", "cases": recorded}, indent=1) + "\n")
    for name, r in recorded.items():
        print(f"{name:34} {r['response']['status']} {r['response']['body'][:70]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
