"""Ray Serve's REST API (`/api/serve/applications/`) as the stand-in answers it for one RayCluster:
the config last PUT is kept, and GET reports its applications DEPLOYING until `ready_after` seconds
after the PUT, then RUNNING, unless the control API set a status. An LLM application whose
replicas start on TPU hosts (the operator's pin, ray_actor_options.resources) stays DEPLOYING
while its RayCluster's TPU hosts are not all running, as Ray Serve keeps a replica that cannot be
placed pending: its first RUNNING waits for them (the prober tells which clusters have them up)."""

from __future__ import annotations

import json
import time
from functools import lru_cache
from pathlib import Path

from .state import State

SERVE_APP_STATUSES = {"NOT_STARTED", "DEPLOYING", "DEPLOY_FAILED", "RUNNING", "UNHEALTHY", "DELETING"}


def deployment_names(app: dict) -> list[str]:
    """The deployments an application reports: those its config names, else one named after the
    import path's attribute (the stand-in cannot import the application to find the real ones)."""
    names = [d["name"] for d in app.get("deployments") or [] if isinstance(d, dict) and d.get("name")]
    return names or [str(app.get("import_path", "app")).replace(":", ".").rsplit(".", 1)[-1]]


RECORDED = Path(__file__).resolve().parent / "recorded"
LLM_IMPORT_PATH = "ray.serve.llm:build_openai_app"
# Which recorded sequence (tests/serving/record_serve.py, the real chain) gives each status's shape.
_RECORDED_FOR = {"DEPLOYING": ("serve-deploy.json",), "RUNNING": ("serve-deploy.json",),
                 "UNHEALTHY": ("serve-replica-lost.json",), "DEPLOY_FAILED": ("serve-deploy-failed.json",)}


@lru_cache(maxsize=None)
def _recorded(name: str) -> list:
    path = RECORDED / name
    return json.loads(path.read_text()) if path.exists() else []


def recorded_app(status: str, model_id: str) -> dict | None:
    """Ray Serve's own answer for the operator's LLM application in `status`, as recorded from the
    real chain (its last snapshot in that status), renamed to this config's model id."""
    for name in _RECORDED_FOR.get(status, ()):
        for snap in reversed(_recorded(name)):
            app = (snap["details"].get("applications") or {}).get("llm")
            if app and app["status"] == status:
                # The recorded model was "tiny": name this config's model instead.
                app = json.loads(json.dumps(app).replace("LLMServer:tiny", f"LLMServer:{model_id}"))
                deployments = {}
                for dname, d in app["deployments"].items():
                    d["replicas"] = []
                    deployments[dname] = d
                app["deployments"] = deployments
                return app
    return None


def _model_id(app: dict) -> str:
    configs = ((app.get("args") or {}).get("llm_configs") or [{}])
    return str(((configs[0] or {}).get("model_loading_config") or {}).get("model_id", "model"))


def _needs_hosts(app: dict) -> bool:
    """Whether the application's first RUNNING waits for the TPU hosts: an LLM application with at
    least one replica at start (a scale-to-zero one starts with none, RUNNING at once)."""
    if app.get("import_path") != LLM_IMPORT_PATH:
        return False
    for d in app.get("deployments") or []:
        auto = (d or {}).get("autoscaling_config") or {}
        if auto.get("min_replicas") == 0 and auto.get("initial_replicas") in (None, 0):
            return False
    return True


def serve_details(serve: dict | None, ready_after: float, now: float, hosts_up: bool = True) -> dict:
    """Ray Serve's GET /api/serve/applications/ answer (ServeInstanceDetails, the fields KubeRay's
    ServeDetails reads plus a few more) for the config last put on a RayCluster. `hosts_up`: the
    RayCluster's TPU hosts all run; a config that has once been RUNNING stays so (losing a replica
    later is the control API's to play)."""
    details = {"deploy_mode": "MULTI_APP", "proxy_location": "EveryNode", "controller_info": {},
               "http_options": {"host": "0.0.0.0", "port": 8000}, "proxies": {}, "target_capacity": None,
               "applications": {}}
    if serve is None:
        return details
    config = serve["config"]
    details["target_capacity"] = config.get("target_capacity")
    override = serve.get("override")
    for app in config.get("applications") or []:
        name = app.get("name") or "default"
        if override:
            status, message = override["status"], override.get("message", "")
        elif now - serve["deployed_at"] >= ready_after and (hosts_up or serve.get("running_at") or not _needs_hosts(app)):
            status, message = "RUNNING", ""
            serve.setdefault("running_at", now)
        else:
            status, message = "DEPLOYING", "Deploying app (fake dashboard)."
        recorded = recorded_app(status, _model_id(app)) if app.get("import_path") == LLM_IMPORT_PATH else None
        if recorded is not None:  # Ray's own shape and messages; a message the test set wins
            details["applications"][name] = {**recorded, "name": name, "route_prefix": app.get("route_prefix", "/"),
                                             "last_deployed_time_s": serve["deployed_at"], "deployed_app_config": app,
                                             **({"message": message} if override and message else {})}
            continue
        dep_status = {"RUNNING": "HEALTHY", "DEPLOYING": "UPDATING"}.get(status, "UNHEALTHY")
        details["applications"][name] = {
            "name": name, "route_prefix": app.get("route_prefix", "/"), "docs_path": None,
            "status": status, "message": message, "last_deployed_time_s": serve["deployed_at"],
            "deployed_app_config": app, "source": "declarative",
            "deployments": {d: {"name": d, "status": dep_status, "status_trigger": "CONFIG_UPDATE_COMPLETED"
                                if dep_status == "HEALTHY" else "CONFIG_UPDATE_STARTED",
                                "message": message, "replicas": []} for d in deployment_names(app)},
        }
    return details


def serve_running(serve: dict | None, ready_after: float, now: float, hosts_up: bool = True) -> bool:
    apps = serve_details(serve, ready_after, now, hosts_up)["applications"]
    return bool(apps) and all(a["status"] == "RUNNING" for a in apps.values())


def proxy_healthy(serve: dict | None, ready_after: float, now: float) -> bool:
    """The Serve proxy's /-/healthz: healthy once it has a route table (here: once the config put
    has first reached RUNNING), whatever the applications' health after that (Ray 2.60's proxy
    answers 503 only while draining or before its first route table). KubeRay labels the head
    `ray.io/serve=true` on it, so its Ready outlives a lost model replica, as on GKE."""
    return serve is not None and now - serve["deployed_at"] >= ready_after


def handle(state: State, method: str, path: str, cluster: dict, body, now: float | None = None):
    """One call on `/api/serve/applications/` of RayCluster `cluster` (a State.cluster() dict)."""
    now = time.time() if now is None else now
    if method == "GET":
        return 200, serve_details(cluster["serve"], state.serve_ready_after, now, cluster.get("hosts_up", not state.hosts_watched))
    if method == "PUT":
        if not isinstance(body, dict) or not isinstance(body.get("applications"), list):
            return 400, {"error": "expected a ServeDeploySchema JSON object with an 'applications' list"}
        old = cluster["serve"]
        if old is None or old["config"] != body:
            cluster["serve"] = {"config": body, "deployed_at": now,
                                "override": old.get("override") if old else None,
                                "puts": (old or {}).get("puts", 0) + 1}
        return 200, {}
    if method == "DELETE":
        cluster["serve"] = None
        return 200, {}
    return 404, {"error": f"{method} {path} not served by the fake dashboard"}
