"""The stand-in Ray dashboard (hack/fakedash, started by hack/fake_dashboard.py) on its own: a real
process on 127.0.0.1, spoken to as KubeRay speaks to it (proxy-form requests naming a RayCluster's
head service), and its parts called directly.

No API server needed: these tests start their own dashboard process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from dashboard import DashboardClient

HACK = Path(__file__).resolve().parents[2] / "hack"
sys.path.insert(0, str(HACK))

from fakedash import auth, control, forwarder, jobs_api, kube, serve_api, state  # noqa: E402


def start_dashboard(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / f"port-{time.monotonic_ns()}"
    proc = subprocess.Popen([sys.executable, str(HACK / "fake_dashboard.py"), "--port-file", str(port_file), *args],
                            stderr=open(tmp_path / "dashboard.log", "ab"))
    end = time.monotonic() + 20
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < end, (tmp_path / "dashboard.log").read_text()
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


@pytest.fixture
def fake(tmp_path):
    proc, url = start_dashboard(tmp_path, "--serve-ready-after", "1.5")
    yield url
    proc.terminate()
    proc.wait(10)


class AsKubeRay:
    """Calls the dashboard through it as an HTTP proxy, the way KubeRay's Go client does."""

    def __init__(self, proxy: str, namespace: str, cluster: str) -> None:
        self.base = f"http://{cluster}-head-svc.{namespace}.svc.cluster.local:8265"
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy}))

    def call(self, method: str, path: str, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with self.opener.open(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def test_a_rerun_under_the_same_name_gets_its_own_dashboard(fake):
    """Issue 10: the old run's stop must not land on the new run's job."""
    old = AsKubeRay(fake, "team", "rerun-abcde")
    new = AsKubeRay(fake, "team", "rerun-fghij")
    assert old.call("GET", "/api/jobs/rerun-k2m4p")[1]["status"] == "RUNNING"
    assert old.call("POST", "/api/jobs/rerun-k2m4p/stop") == (200, {"stopped": True})
    # The new RayJob (same name) has a new RayCluster and a new submission id.
    assert new.call("GET", "/api/jobs/rerun-x7z9q")[1]["status"] == "RUNNING"
    assert old.call("GET", "/api/jobs/rerun-k2m4p")[1]["status"] == "STOPPED"
    # Each cluster lists only its own jobs, as each real head does.
    assert [j["submission_id"] for j in new.call("GET", "/api/jobs/")[1]] == ["rerun-x7z9q"]
    assert [j["submission_id"] for j in old.call("GET", "/api/jobs/")[1]] == ["rerun-k2m4p"]

    d = DashboardClient(fake)
    job = d.set_job_status("team", "rerun", "SUCCEEDED")  # acts on the RayJob's newest job
    assert (job["cluster"], job["submission_id"], job["status"]) == ("rerun-fghij", "rerun-x7z9q", "SUCCEEDED")
    assert new.call("GET", "/api/jobs/rerun-x7z9q")[1]["status"] == "SUCCEEDED"
    assert old.call("GET", "/api/jobs/rerun-k2m4p")[1]["status"] == "STOPPED"
    assert [r["cluster"] for r in d.requests(namespace="team", rayjob="rerun") if r["method"] == "POST"] == ["rerun-abcde"]


def test_the_same_submission_id_on_two_clusters_is_two_jobs(fake):
    a, b = AsKubeRay(fake, "ns1", "job-aaaaa"), AsKubeRay(fake, "ns1", "job-bbbbb")
    assert a.call("POST", "/api/jobs/", {"submission_id": "job-s1234", "entrypoint": "python a.py"})[0] == 200
    code, err = a.call("POST", "/api/jobs/", {"submission_id": "job-s1234", "entrypoint": "python a.py"})
    assert code == 500 and "Please use a different submission_id" in err["error"]  # KubeRay's retry test
    assert b.call("POST", "/api/jobs/", {"submission_id": "job-s1234", "entrypoint": "python b.py"})[0] == 200
    assert a.call("GET", "/api/jobs/job-s1234")[1]["entrypoint"] == "python a.py"
    assert b.call("GET", "/api/jobs/job-s1234")[1]["entrypoint"] == "python b.py"


def test_a_status_set_before_kuberay_asks_applies_to_the_first_job(fake):
    d = DashboardClient(fake)
    assert d.set_job_status("ns2", "early", "FAILED", message="boom")["preset"] is True
    info = AsKubeRay(fake, "ns2", "early-qqqqq").call("GET", "/api/jobs/early-wwwww")[1]
    assert (info["status"], info["message"], info["error_type"]) == ("FAILED", "boom", "JOB_ENTRYPOINT_COMMAND_ERROR")
    # A second run of the same RayJob starts fresh.
    assert AsKubeRay(fake, "ns2", "early-rrrrr").call("GET", "/api/jobs/early-eeeee")[1]["status"] == "RUNNING"


def test_a_jobs_driver_log_tail_is_served_in_the_shape_ray_answers(fake):
    """The operator's reads of a running job's progress: the job's driver node from its info, then
    the last lines of its driver log (recorded/driver-log.json: Ray 2.60's answers)."""
    recorded = json.loads((HACK / "fakedash" / "recorded" / "driver-log.json").read_text())
    head = AsKubeRay(fake, "train", "prog-abcde")
    node = head.call("GET", "/api/jobs/prog-s1234")[1]["driver_node_id"]
    lines = [f"tputorch.progress {{\"step\": {i}}}" for i in range(1, 6)]
    assert DashboardClient(fake).add_job_log("train", "prog", lines[:3])["lines"] == 3
    DashboardClient(fake).add_job_log("train", "prog", lines[3:])

    def tail(query: str):
        req = urllib.request.Request(f"{head.base}/api/v0/logs/file?{query}")
        try:
            with head.opener.open(req, timeout=10) as resp:
                return resp.status, resp.headers["Content-Type"], resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    assert tail(f"node_id={node}&submission_id=prog-s1234&lines=2") == (
        200, recorded["running"]["headers"]["Content-Type"], "\n".join(lines[3:]) + "\n")
    refused = recorded["without_node"]
    assert tail("submission_id=prog-s1234&lines=2") == (refused["status"], refused["headers"]["Content-Type"], refused["body"])
    code, _, text = tail(f"node_id={node}&submission_id=prog-zzzzz&lines=2")
    assert code == recorded["unknown"]["status"] and "submission_id: prog-zzzzz" in text
    assert any("submission_id=prog-s1234" in r["query"] for r in DashboardClient(fake).requests(namespace="train"))


SERVE_CONFIG = {
    "applications": [
        {"name": "llm", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app", "args": {}},
        {"name": "echo", "route_prefix": "/echo", "import_path": "echo:app",
         "deployments": [{"name": "Echo", "num_replicas": 1}, {"name": "Router"}]},
    ]
}


def test_serve_applications_deploy_then_run_per_raycluster(fake):
    svc = AsKubeRay(fake, "serving", "qwen-abcde")
    other = AsKubeRay(fake, "serving", "qwen-zzzzz")
    assert svc.call("GET", "/api/serve/applications/?api_type=declarative") [1]["applications"] == {}
    assert svc.call("PUT", "/api/serve/applications/", SERVE_CONFIG) == (200, {})
    t_put = time.monotonic()
    details = svc.call("GET", "/api/serve/applications/?api_type=declarative")[1]
    assert details["deploy_mode"] == "MULTI_APP"
    apps = details["applications"]
    assert set(apps) == {"llm", "echo"}
    assert apps["echo"]["route_prefix"] == "/echo" and apps["echo"]["deployed_app_config"] == SERVE_CONFIG["applications"][1]
    assert {a["status"] for a in apps.values()} == {"DEPLOYING"}
    assert set(apps["echo"]["deployments"]) == {"Echo", "Router"}
    # The LLM application's shape is Ray Serve's own, recorded from the real chain (hack/fakedash/recorded).
    assert set(apps["llm"]["deployments"]) == {"LLMServer:model", "OpenAiIngress"}
    assert {d["status"] for d in apps["echo"]["deployments"].values()} == {"UPDATING"}
    # Ray Serve's own DEPLOYING shape: the ingress is up before the engine has loaded.
    assert apps["llm"]["deployments"]["LLMServer:model"]["status"] == "UPDATING"
    assert other.call("GET", "/api/serve/applications/")[1]["applications"] == {}, "another RayCluster's dashboard"

    while time.monotonic() - t_put < 1.6:
        time.sleep(0.1)
    apps = svc.call("GET", "/api/serve/applications/?api_type=declarative")[1]["applications"]
    assert {a["status"] for a in apps.values()} == {"RUNNING"}
    assert {d["status"] for a in apps.values() for d in a["deployments"].values()} == {"HEALTHY"}

    d = DashboardClient(fake)
    state = d.serve("serving", "qwen")  # by RayService name: its newest RayCluster
    assert state["cluster"] == "qwen-abcde" and state["puts"] == 1 and state["config"] == SERVE_CONFIG
    d.set_serve_status("serving", "qwen", "DEPLOY_FAILED", message="engine died")
    apps = svc.call("GET", "/api/serve/applications/")[1]["applications"]
    assert {(a["status"], a["message"]) for a in apps.values()} == {("DEPLOY_FAILED", "engine died")}
    assert {dep["status"] for dep in apps["echo"]["deployments"].values()} == {"UNHEALTHY"}
    # A replica lost: the LLM application as Ray Serve reported it when its replica's actor was killed.
    d.set_serve_status("serving", "qwen", "UNHEALTHY")
    llm = svc.call("GET", "/api/serve/applications/")[1]["applications"]["llm"]
    assert (llm["status"], llm["message"]) == ("UNHEALTHY", "The deployments ['LLMServer:model'] are UNHEALTHY.")
    assert llm["deployments"]["LLMServer:model"]["status_trigger"] == "HEALTH_CHECK_FAILED"
    assert llm["deployments"]["OpenAiIngress"]["status"] == "HEALTHY"
    d.set_serve_status("serving", "qwen", None)

    # The same config again is no redeploy; a changed one is (DEPLOYING again).
    assert svc.call("PUT", "/api/serve/applications/", SERVE_CONFIG)[0] == 200
    assert d.serve("serving", "qwen-abcde")["puts"] == 1
    changed = json.loads(json.dumps(SERVE_CONFIG))
    changed["applications"][0]["args"] = {"llm_configs": []}
    assert svc.call("PUT", "/api/serve/applications/", changed)[0] == 200
    apps = svc.call("GET", "/api/serve/applications/")[1]["applications"]
    assert apps["llm"]["status"] == "DEPLOYING" and d.serve("serving", "qwen")["puts"] == 2

    code, err = svc.call("PUT", "/api/serve/applications/", {"apps": []})
    assert code == 400 and "applications" in err["error"]
    with pytest.raises(RuntimeError, match="DEPLOY_FAILED"):
        d.set_serve_status("serving", "qwen", "BROKEN")


def test_a_namespace_with_a_real_backend_is_forwarded(fake, tmp_path):
    """Everything of that namespace goes to the backend (here another dashboard process standing in
    for a real Ray head); other namespaces keep the invented state."""
    proc, backend = start_dashboard(tmp_path)
    try:
        d = DashboardClient(fake)
        with pytest.raises(RuntimeError, match="loopback only"):
            d.set_backend("real", "http://10.0.0.1:8265")
        with pytest.raises(RuntimeError, match="probe_period"):
            d.set_backend("real", backend, probe_period=0)
        d.set_backend("real", backend, probe_period=1)
        assert d._call("GET", "/backends/real")["probe_period"] == 1.0
        d.set_backend("real", backend)
        assert "probe_period" not in d._call("GET", "/backends/real")
        real = AsKubeRay(fake, "real", "train-abcde")
        assert real.call("POST", "/api/jobs/", {"submission_id": "train-11111", "entrypoint": "python t.py"})[0] == 200
        assert real.call("GET", "/api/jobs/train-11111")[1]["entrypoint"] == "python t.py"
        # The backend saw the calls (origin form, its own host), the front end only forwarded them.
        seen = DashboardClient(backend).jobs()
        assert [(j["submission_id"], j["submitted"]) for j in seen] == [("train-11111", True)]
        assert {r["backend"] for r in d.requests(namespace="real")} == {backend}
        # The Ray CLI's route to the same cluster: /_ray/<ns>/<cluster>/api/...
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"{fake}/_ray/real/train-abcde/api/jobs/train-11111", timeout=10) as resp:
            assert json.loads(resp.read())["submission_id"] == "train-11111"
        # Another namespace is untouched.
        assert AsKubeRay(fake, "fake", "x-abcde").call("GET", "/api/jobs/x-12345")[1]["message"].endswith("(fake dashboard).")
        assert d.delete_backend("real") is True
        assert real.call("GET", "/api/jobs/train-11111")[1]["entrypoint"] == ""  # invented again
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_real_serve_backend_gets_the_cpu_config_and_the_serve_port(fake, tmp_path):
    """With a Serve proxy and the CPU variant, KubeRay's Serve config PUT reaches the backend with
    exactly cpu_serving's changes, and the serve Service's port 8000 reaches the Serve proxy (here
    the other dashboard process stands in for both)."""
    from fakedash import cpu_serving

    proc, backend = start_dashboard(tmp_path)
    try:
        d = DashboardClient(fake)
        with pytest.raises(RuntimeError, match="serve_variant"):
            d.set_backend("real", backend, serve_url=backend, serve_variant="gpu")
        d.set_backend("real", backend, serve_url=backend, serve_variant="cpu")
        config = {"applications": [{"name": "llm", "import_path": "ray.serve.llm:build_openai_app", "args": {
            "llm_configs": [{"model_loading_config": {"model_id": "m"}, "accelerator_type": "TPU-V6E",
                             "accelerator_config": {"kind": "tpu", "topology": "4x4"},
                             "engine_kwargs": {"tensor_parallel_size": 16, "max_model_len": 256},
                             "deployment_config": {"ray_actor_options": {"resources": {"accelerator_type:TPU-V6E": 0.001}}}}]}}]}
        assert AsKubeRay(fake, "real", "svc-abcde").call("PUT", "/api/serve/applications/", config)[0] == 200
        serve = AsKubeRay(fake, "real", "ignored")
        serve.base = "http://m-serve-svc.real.svc.cluster.local:8000"
        code, details = serve.call("GET", "/api/serve/applications/")
        assert code == 200
        (llm,) = details["applications"]["llm"]["deployed_app_config"]["args"]["llm_configs"]
        assert llm == cpu_serving.to_cpu(config)["applications"][0]["args"]["llm_configs"][0]
        assert "accelerator_type" not in llm and llm["engine_kwargs"]["tensor_parallel_size"] == 1
        assert llm["deployment_config"] == config["applications"][0]["args"]["llm_configs"][0]["deployment_config"]
        # Without the variant the config goes through unchanged.
        d.set_backend("real", backend, serve_url=backend)
        AsKubeRay(fake, "real", "svc-abcde").call("PUT", "/api/serve/applications/", config)
        assert serve.call("GET", "/api/serve/applications/")[1]["applications"]["llm"]["deployed_app_config"] == \
            config["applications"][0]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_submission_gets_the_head_containers_env_under_its_own():
    raycluster = {"spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"env": [
        {"name": "TPUTORCH_NUM_WORKERS", "value": "16"}, {"name": "SHARED", "value": "head"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}}}}}
    env = kube.head_env(raycluster)
    assert env == {"TPUTORCH_NUM_WORKERS": "16", "SHARED": "head"}
    body = {"entrypoint": "python t.py", "runtime_env": {"pip": ["x"], "env_vars": {"SHARED": "job"}}}
    out = forwarder.with_driver_env(body, env)
    assert out["runtime_env"] == {"pip": ["x"], "env_vars": {"TPUTORCH_NUM_WORKERS": "16", "SHARED": "job"}}
    assert body["runtime_env"]["env_vars"] == {"SHARED": "job"}, "the caller's body is not changed"
    assert forwarder.with_driver_env({"entrypoint": "x"}, {}) == {"entrypoint": "x"}


@pytest.mark.parametrize("host,expected", [
    ("rerun-abcde-head-svc.team.svc.cluster.local:8265", ("team", "rerun-abcde")),
    ("qwen-x1y2z-head-svc.serving.svc:8265", ("serving", "qwen-x1y2z")),
    ("127.0.0.1:8265", ("default", "127")),
])
def test_parse_host(host, expected):
    assert state.parse_host(host) == expected


# -- the parts alone, without HTTP ----------------------------------------------------------------

RECORDED_AUTH = json.loads(auth.RECORDED.read_text())["cases"]


@pytest.mark.parametrize("case", sorted(RECORDED_AUTH))
def test_auth_lets_through_or_refuses_each_call_as_the_real_head_did(case):
    """Each call recorded against a Ray 2.60 head with token auth (tests/cluster/record_auth.py):
    the stand-in passes it or refuses it with the same status, content type and text."""
    token = "the-clusters-token"
    request, real = RECORDED_AUTH[case]["request"], RECORDED_AUTH[case]["response"]
    headers = {k: v.replace("<token>", token) for k, v in request["headers"].items()}
    denied = auth.refusal(request["path"], headers, token)
    if real["status"] == 200:
        assert denied is None, (case, denied)
    else:
        assert denied == real, case
    assert auth.refusal(request["path"], headers, None) is None, "a cluster without authOptions is open"


def test_auth_finds_the_secret_kuberay_made_or_the_one_named():
    rc = {"metadata": {"name": "a" * 47 + "-x1y2z"}, "spec": {"authOptions": {"mode": "token"}}}
    assert auth.secret_name(rc) == ("a" * 47 + "-x1y2z")[-50:], "KubeRay cuts long names from the front"
    assert auth.secret_name({"metadata": {"name": "1job-abcde"}, "spec": {"authOptions": {"mode": "token"}}}) == "rjob-abcde"
    assert auth.secret_name({"metadata": {"name": "j"}, "spec": {"authOptions": {"mode": "token", "secretName": "s"}}}) == "s"
    assert auth.secret_name({"metadata": {"name": "j"}, "spec": {"authOptions": {"mode": "disabled"}}}) is None
    assert auth.secret_name({"metadata": {"name": "j"}, "spec": {}}) is None


def test_jobs_api_alone_keeps_jobs_per_raycluster():
    st = state.State()
    assert jobs_api.handle(st, "POST", [], "/api/jobs/", "ns", "a-abcde", {"submission_id": "a-11111"})[0] == 200
    code, info = jobs_api.handle(st, "GET", ["a-11111"], "/api/jobs/a-11111", "ns", "a-abcde", None)
    assert (code, info["status"], info["_rayjob"]) == (200, "RUNNING", "a")
    assert jobs_api.handle(st, "GET", [], "/api/jobs/", "ns", "a-zzzzz", None) == (200, [])
    assert jobs_api.handle(st, "POST", ["a-11111", "stop"], "", "ns", "a-abcde", None)[1]["stopped"] is True
    assert st.newest_job("ns", "a")["status"] == "STOPPED"


def test_serve_api_alone_deploys_then_runs_on_its_clock():
    st = state.State(serve_ready_after=10)
    c = st.cluster("ns", "svc-abcde")
    assert serve_api.handle(st, "PUT", "/api/serve/applications/", c, SERVE_CONFIG, now=100.0) == (200, {})
    apps = serve_api.handle(st, "GET", "", c, None, now=109.0)[1]["applications"]
    assert {a["status"] for a in apps.values()} == {"DEPLOYING"}
    apps = serve_api.handle(st, "GET", "", c, None, now=110.0)[1]["applications"]
    assert {a["status"] for a in apps.values()} == {"RUNNING"}
    assert serve_api.serve_running(c["serve"], 10, 110.0) and not serve_api.serve_running(None, 10, 110.0)
    assert serve_api.handle(st, "POST", "/api/serve/applications/", c, None)[0] == 404


def test_an_llm_application_first_runs_once_its_tpu_hosts_run():
    """Ray Serve keeps an LLM replica pinned to a TPU host pending until one is there: the stand-in's
    application stays DEPLOYING past its clock until the prober sees the cluster's hosts run."""
    llm = {"applications": [{"name": "llm", "import_path": serve_api.LLM_IMPORT_PATH, "args": {"llm_configs": [
        {"model_loading_config": {"model_id": "m"}}]}, "deployments": [
        {"name": "LLMServer:m", "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}}]}]}
    st = state.State(serve_ready_after=10)
    st.hosts_watched = True
    c = st.cluster("ns", "svc-abcde")
    serve_api.handle(st, "PUT", "", c, llm, now=100.0)

    def app_status(now):
        return serve_api.handle(st, "GET", "", c, None, now=now)[1]["applications"]["llm"]["status"]
    assert app_status(200.0) == "DEPLOYING"  # no host seen yet
    c["hosts_up"] = True
    assert app_status(201.0) == "RUNNING"
    c["hosts_up"] = False  # a host lost later: the control API plays what Serve then says
    assert app_status(202.0) == "RUNNING"
    # Scale to zero starts with no replica: RUNNING on its clock, no host needed.
    zero = json.loads(json.dumps(llm))
    zero["applications"][0]["deployments"][0]["autoscaling_config"]["min_replicas"] = 0
    c2 = st.cluster("ns", "zero-abcde")
    serve_api.handle(st, "PUT", "", c2, zero, now=100.0)
    assert serve_api.handle(st, "GET", "", c2, None, now=110.0)[1]["applications"]["llm"]["status"] == "RUNNING"
    # Which clusters have their hosts up, from the pods the prober lists.
    from fakedash import prober

    def pod(cluster, role, phase, node="n1"):
        return {"metadata": {"namespace": "ns", "name": f"{cluster}-{role}-{phase}", "labels": {
            "ray.io/cluster": cluster, "ray.io/node-type": role}}, "spec": {"nodeName": node}, "status": {"phase": phase}}
    pods = [pod("a", "head", "Running"), pod("a", "worker", "Running"), pod("a", "worker", "Pending"),
            pod("b", "head", "Running"), pod("b", "worker", "Running"), pod("c", "head", "Running"),
            pod("d", "worker", "Running", node="lost")]
    assert prober.hosts_up(pods, {"lost"}) == {("ns", "a"): False, ("ns", "b"): True, ("ns", "d"): False}


def test_control_alone_sets_serve_status_and_checks_it():
    st = state.State()
    serve_api.handle(st, "PUT", "", st.cluster("ns", "svc-abcde"), SERVE_CONFIG, now=0.0)
    code, out = control.handle(st, "PUT", ["serve", "ns", "svc"], {}, {"status": "unhealthy", "message": "m"}, 1.0)
    assert code == 200 and {a["status"] for a in out["details"]["applications"].values()} == {"UNHEALTHY"}
    code, err = control.handle(st, "PUT", ["serve", "ns", "svc"], {}, {"status": "BROKEN"}, 1.0)
    assert code == 400 and "BROKEN" in err["error"]
    assert control.handle(st, "GET", ["serve", "ns", "other"], {}, {}, 1.0)[0] == 404


# The probes KubeRay writes (ray-operator controllers/ray/common/pod.go, initLivenessAndReadinessProbe).
WGET = "wget --tries 1 -T {t} -q -O- http://localhost:{port}/{path} | grep success"
RAYLET_15 = WGET.format(t=2, port=52365, path="api/local_raylet_healthz")
GCS_15 = WGET.format(t=10, port=8265, path="api/gcs_healthz")
PROXY = WGET.format(t=10, port=8000, path="-/healthz")
HTTP_16 = {"httpGet": {"path": "/api/healthz", "port": 52365}}  # KubeRay 1.6 with Ray >= 2.53


def _exec(*commands: str, threshold: int = 10) -> dict:
    return {"exec": {"command": ["bash", "-c", " && ".join(commands)]}, "periodSeconds": 5,
            "failureThreshold": threshold, "timeoutSeconds": 2}


def _pod(name, kind="worker", cluster="svc-abcde", replica=None, probe=None, phase="Running", ready=True,
         worker_id=None, node=None, group=None):
    labels = {"ray.io/node-type": kind, "ray.io/cluster": cluster, **({"tputorch.io/group": group} if group else {})}
    if replica:
        labels["ray.io/worker-group-replica-name"] = replica
    env = [{"name": "TPU_WORKER_ID", "value": worker_id}] if worker_id is not None else []
    container = {"name": f"ray-{kind}", "env": env, "ports": [{"name": "serve", "containerPort": 8000}],
                 **({"readinessProbe": probe} if probe else {})}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels, "uid": f"uid-{name}"},
            "spec": {"containers": [container], **({"nodeName": node} if node else {})},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _worker(name, cluster="svc-abcde", replica=None, probe=True, **kw):
    """A RayService worker pod (KubeRay 1.5's probe: raylet, then the Serve proxy), or a RayJob's."""
    return _pod(name, cluster=cluster, replica=replica,
                probe=_exec(RAYLET_15, PROXY, threshold=1) if probe else _exec(RAYLET_15), **kw)


def test_prober_reads_the_probes_kuberay_writes():
    from fakedash import prober
    head = prober.readiness_probe(_pod("h", "head", probe=_exec(RAYLET_15, GCS_15)))
    assert [(c.endpoint, c.path, c.needs) for c in head.checks] == [
        ("agent", "/api/local_raylet_healthz", "success"), ("dashboard", "/api/gcs_healthz", "success")]
    assert (head.period, head.failure_threshold) == (5, 10)
    svc = prober.readiness_probe(_worker("w"))
    assert [c.endpoint for c in svc.checks] == ["agent", "serve"] and svc.failure_threshold == 1
    v16 = prober.readiness_probe(_pod("w", probe={**HTTP_16, "periodSeconds": 5, "failureThreshold": 10}))
    assert [(c.endpoint, c.path, c.needs) for c in v16.checks] == [("agent", "/api/healthz", None)]
    # A changed agent port (rayStartParams) follows `ray start`; no probe, or one of another shape: not ours.
    moved = _pod("w", probe=_exec(WGET.format(t=2, port=52400, path="api/local_raylet_healthz")))
    moved["spec"]["containers"][0]["args"] = ["ray start --dashboard-agent-listen-port=52400 --block"]
    assert prober.readiness_probe(moved).checks[0].endpoint == "agent"
    assert prober.readiness_probe(_pod("w")) is None
    assert prober.readiness_probe(_pod("w", probe={"tcpSocket": {"port": 6379}})) is None


def test_prober_gives_rayservice_workers_gkes_readiness_in_stand_in_mode():
    from fakedash import prober

    def ready(pods, serving):
        return prober.stand_in_results(prober.probed_pods(pods), serving)

    one_slice = [_worker(f"svc-abcde-w-{i}") for i in range(4)]
    # Deploying: no Serve replica anywhere, no worker passes the proxy check.
    assert set(ready(one_slice, {("ns", "svc-abcde"): False}).values()) == {False}
    # Serving: only the host taken to run the LLM replica has a proxy; the three others stay NotReady.
    out = ready(one_slice, {("ns", "svc-abcde"): True})
    assert [k[1] for k, v in out.items() if v] == ["svc-abcde-w-0"]
    # One such host per slice replica; RayJob workers and heads (no proxy in their probe) stay KWOK's.
    two = [_worker(f"w-{r}{i}", replica=f"slice-{r}") for r in "ab" for i in range(2)] + [_worker("job-w", probe=False)]
    out = ready(two + [_pod("h", "head", probe=_exec(RAYLET_15, GCS_15))], {("ns", "svc-abcde"): True})
    assert sorted(k[1] for k, v in out.items() if v) == ["w-a0", "w-b0"] and {("ns", "job-w"), ("ns", "h")}.isdisjoint(out)
    assert ready([_worker("p", phase="Pending")], {("ns", "svc-abcde"): True}) == {}
    # A pod on a Kubernetes node that is not Ready is the node lifecycle controller's.
    assert prober.probed_pods([_worker("lost", node="tpu-1")], lost_nodes={"tpu-1"}) == []
    patch = prober.status_patch(False, "2026-12-01T00:00:00Z")
    assert {(c["type"], c["status"]) for c in patch["status"]["conditions"]} == {("ContainersReady", "False"), ("Ready", "False")}


def test_prober_applies_kubelets_thresholds():
    from fakedash import prober
    job = prober.readiness_probe(_worker("w", probe=False))  # failureThreshold 10, period 5
    assert prober.next_ready(None, None, False, job, 0.0) == (False, 0.0), "NotReady until the probe first passes"
    assert prober.next_ready(None, None, True, job, 0.0) == (True, None)
    # Ready stays through 9 failures (45 s from the first); the 10th, 45 s after the first, makes it NotReady.
    assert prober.next_ready(True, None, False, job, 100.0) == (True, 100.0)
    assert prober.next_ready(True, 100.0, False, job, 144.0) == (True, 100.0)
    assert prober.next_ready(True, 100.0, False, job, 145.0) == (False, 100.0)
    assert prober.next_ready(True, 100.0, False, job, 109.0, period=1.0) == (False, 100.0), "a backend's shorter period"
    assert prober.next_ready(False, 100.0, True, job, 150.0) == (True, None), "one pass makes it Ready again"
    svc = prober.readiness_probe(_worker("w"))  # failureThreshold 1
    assert prober.next_ready(True, None, False, svc, 0.0) == (False, 0.0)


def _node(worker_id=None, head=False, agent=40001, started=1, serve_port=None, group=None, replica=None):
    labels = {"ray.io/node-id": f"n{agent}", **({"tputorch.io/group": group} if group else {}),
              **({"tputorch.local/pod-replica": replica} if replica else {})}
    if worker_id is not None:
        labels["ray.io/tpu-worker-id"] = worker_id
    if serve_port:
        labels["tputorch.local/serve-proxy-port"] = str(serve_port)
    return {"nodeId": f"n{agent}", "isHeadNode": head, "nodeManagerAddress": "127.0.0.1", "labels": labels,
            "dashboardAgentListenPort": agent, "startTimeMs": str(started), "state": "ALIVE"}


def test_prober_maps_a_pod_to_the_ray_node_that_stands_for_it():
    from fakedash import prober
    head, old, new, other = (_node(head=True, agent=40000), _node("1", agent=40001, started=1),
                             _node("1", agent=40002, started=2, serve_port=40102), _node("0", agent=40003))
    nodes = [head, old, new, other]
    assert prober.node_for(_pod("h", "head"), nodes) is head
    assert prober.node_for(_pod("w1", worker_id="1"), nodes) is new, "a host started again: its newest node"
    assert prober.node_for(_pod("w2", worker_id="2"), nodes) is None
    assert prober.node_for(_pod("w", worker_id=None), nodes) is None
    # spec.groups (issue 38): two slices' hosts with worker id 0, and a CPU group's node without one.
    train, rollout, reward = (_node("0", agent=40004, started=3, group="tpu-slice"),
                              _node("0", agent=40005, started=4, group="rollout"), _node(agent=40006, group="reward"))
    grouped = [head, train, rollout, reward]
    assert prober.node_for(_pod("t0", worker_id="0", group="tpu-slice"), grouped) is train, "not the newer rollout host"
    assert prober.node_for(_pod("r0", worker_id="0", group="rollout"), grouped) is rollout
    assert prober.node_for(_pod("c", group="reward"), grouped) is reward
    assert prober.node_for(_pod("g", group="gen"), grouped) is None, "no node of its group"
    # A second single-host slice attached for the pod replica KubeRay added (worker id 0 as well):
    # its node stands for that replica's pod only, the first slice's node for the first pod.
    first, added = _node("0", agent=40007, started=5), _node("0", agent=40008, started=6, replica="svc-w-b")
    two = [head, first, added]
    assert prober.node_for(_pod("a0", worker_id="0", replica="svc-w-a"), two) is first, "not the newer added slice"
    assert prober.node_for(_pod("b0", worker_id="0", replica="svc-w-b"), two) is added
    dash, serve = "http://127.0.0.1:8265", "http://127.0.0.1:8000"
    assert prober.node_endpoints(head, dash, serve) == {"agent": "http://127.0.0.1:40000", "dashboard": dash, "serve": serve}
    assert prober.node_endpoints(new, dash, serve) == {"agent": "http://127.0.0.1:40002", "serve": "http://127.0.0.1:40102"}
    assert prober.node_endpoints(other, dash, serve) == {"agent": "http://127.0.0.1:40003"}, "no Serve proxy there"
    assert prober.node_endpoints(None, dash, serve) == {}


def test_prober_checks_answer_as_wget_and_kubelet_see_them():
    import http.server
    import threading

    from fakedash import prober

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code, text = {"/ok": (200, "success"), "/other": (200, "fine"), "/down": (503, "success")}.get(self.path, (404, ""))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ends = {"agent": f"http://127.0.0.1:{server.server_address[1]}"}
        assert prober.http_passes(prober.Check("agent", "/ok", "success"), ends, 2)
        assert not prober.http_passes(prober.Check("agent", "/other", "success"), ends, 2), "grep success fails"
        assert prober.http_passes(prober.Check("agent", "/other", None), ends, 2), "httpGet: any 2xx"
        assert not prober.http_passes(prober.Check("agent", "/down", "success"), ends, 2), "503: wget fails"
        assert not prober.http_passes(prober.Check("serve", "/-/healthz", "success"), ends, 2), "nothing listens"
    finally:
        server.shutdown()
        server.server_close()
    assert not prober.http_passes(prober.Check("agent", "/ok", "success"), ends, 2), "refused"



def _pod_naming(env=(), env_from=(), volumes=(), inits=()):
    """A scheduled pod KWOK has not run (it names a Secret)."""
    def container(name, **extra):
        return {"name": name, "image": "rayproject/ray:2.60.0", **extra}
    return {"metadata": {"name": "h", "namespace": "ns"},
            "spec": {"containers": [container("ray-head", env=list(env), envFrom=list(env_from))],
                     "initContainers": [container(n, env=list(e)) for n, e in inits],
                     "volumes": list(volumes), "nodeName": "tpu-0"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}}


TOKEN_REF = {"name": "RAY_AUTH_TOKEN", "valueFrom": {"secretKeyRef": {"name": "j-ray-token-abc123", "key": "auth_token"}}}
NOW = "2026-12-01T00:01:00Z"


def test_kubelet_keeps_a_container_whose_secret_is_missing_waiting_until_it_is_there():
    from fakedash import kubelet

    pod = _pod_naming(env=[{"name": "A", "value": "1"}, TOKEN_REF])
    assert kubelet.names_secrets(pod) and not kubelet.names_secrets(_pod_naming(env=[{"name": "A", "value": "1"}]))
    st = kubelet.waiting_status(pod, {}, NOW)["status"]
    assert st["phase"] == "Pending"
    (cs,) = st["containerStatuses"]
    assert cs["state"]["waiting"] == {"reason": "CreateContainerConfigError", "message": 'secret "j-ray-token-abc123" not found'}
    assert not cs["ready"] and not cs["started"]
    conds = {c["type"]: c for c in st["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "ContainersNotReady")
    assert conds["ContainersReady"]["message"] == "containers with unready status: [ray-head]"
    assert conds["Initialized"]["status"] == "True"
    shown = {**pod, "status": {**pod["status"], **st, "conditions": pod["status"]["conditions"] + st["conditions"]}}
    assert kubelet.reported(shown["status"], kubelet.waiting_status(pod, {}, "2026-12-01T00:02:00Z")["status"]), \
        "written once, not on every look"
    # what the operator reads from it names the Secret (issue 23's classification)
    from tputorch.status.pods import container_problem
    assert container_problem([shown]) == ("CreateContainerConfigError", 'pod h container ray-head: CreateContainerConfigError: '
                                          'secret "j-ray-token-abc123" not found')
    # a Secret without the key is no better; with it the pod may start (KWOK runs it)
    st = kubelet.waiting_status(pod, {"j-ray-token-abc123": {"other"}}, NOW)["status"]
    assert st["containerStatuses"][0]["state"]["waiting"]["message"] == "couldn't find key auth_token in Secret ns/j-ray-token-abc123"
    assert kubelet.waiting_status(pod, {"j-ray-token-abc123": {"auth_token"}}, NOW) is None


def test_kubelet_reads_envfrom_volumes_init_containers_and_optional_refs():
    from fakedash import kubelet

    optional = {"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "k", "optional": True}}}
    assert kubelet.waiting_status(_pod_naming(env=[optional], env_from=[{"secretRef": {"name": "gone2", "optional": True}}],
                                              volumes=[{"name": "v", "secret": {"secretName": "gone3", "optional": True}}]),
                                  {}, NOW) is None, "optional: started without them"
    st = kubelet.waiting_status(_pod_naming(env_from=[{"secretRef": {"name": "envs"}}]), {}, NOW)["status"]
    assert st["containerStatuses"][0]["state"]["waiting"]["message"] == 'secret "envs" not found'
    # a secret volume: the pod is never set up, no container is created
    st = kubelet.waiting_status(_pod_naming(volumes=[{"name": "v", "secret": {"secretName": "vol"}}],
                                            inits=[("wait-gcs", ())]), {}, NOW)["status"]
    assert [c["state"]["waiting"]["reason"] for c in st["initContainerStatuses"] + st["containerStatuses"]] == \
        ["ContainerCreating", "PodInitializing"]
    assert {c["type"]: c["status"] for c in st["conditions"]}["Initialized"] == "False"
    # an init container that cannot start holds the others (the earlier ones ran)
    st = kubelet.waiting_status(_pod_naming(inits=[("first", ()), ("wait-gcs", [TOKEN_REF])]), {}, NOW)["status"]
    assert [list(c["state"]) for c in st["initContainerStatuses"]] == [["terminated"], ["waiting"]]
    assert st["initContainerStatuses"][1]["state"]["waiting"]["reason"] == "CreateContainerConfigError"
    assert st["containerStatuses"][0]["state"]["waiting"] == {"reason": "PodInitializing"}
