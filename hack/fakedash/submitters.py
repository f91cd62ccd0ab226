"""The submitter pods' side: the Signaller finishes the KWOK submitter pods of stand-in jobs that
reached a terminal state; the Runner runs, on this host, the submitter pods of RayClusters that have
a real Ray backend."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse

from .kube import Kube, Poller, container_env, submission_id_of
from .state import EXIT_ANNOTATION, TERMINAL, State, parse_host


class Signaller(threading.Thread):
    """Finishes the submitter pods of terminal jobs (see module doc)."""

    def __init__(self, state: State, kube: Kube, log) -> None:
        super().__init__(daemon=True)
        self.state, self.kube, self.log = state, kube, log

    def run(self) -> None:
        while True:
            time.sleep(1.0)
            try:
                self.submit_presets()
            except Exception as exc:  # keep going; the API server may be restarting
                self.log(f"submit presets: {exc}")
            with self.state.lock:
                todo = [dict(j) for j in self.state.jobs()
                        if j["status"] in TERMINAL and not j.get("submitter_finished") and not j.get("real")]
            for job in todo:
                try:
                    self.signal(job)
                except Exception as exc:  # keep going; the API server may be restarting
                    self.log(f"signal {job['namespace']}/{job['rayjob']}: {exc}")

    def submit_presets(self) -> None:
        """A Ray job whose end a test set before anything asked for it is submitted by its RayJob's
        submitter, as `ray job submit` from a pod of the job's own does on GKE: its run ends (and
        its submitter with it) whether or not KubeRay ever reaches the dashboard (a NetworkPolicy
        may drop KubeRay's calls, network.py)."""
        with self.state.lock:
            waiting = [key for key, preset in self.state.presets.items()
                       if str(preset.get("status", "")).upper() in TERMINAL]
        for ns, name in waiting:
            rayjob = self.kube.get(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/{name}") or {}
            status = rayjob.get("status") or {}
            cluster, sid = status.get("rayClusterName"), status.get("jobId")
            if not cluster or not sid or status.get("jobDeploymentStatus") != "Running":
                continue  # the submitter runs only once the RayJob does
            sel = urllib.parse.quote(f"batch.kubernetes.io/job-name={name}")
            if not self.kube.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]:
                continue
            with self.state.lock:
                if (ns, name) in self.state.presets:
                    self.state.get_or_create(ns, cluster, sid, "submitter")

    def signal(self, job: dict) -> None:
        ns, name = job["namespace"], job["rayjob"]
        sel = urllib.parse.quote(f"batch.kubernetes.io/job-name={name}")
        pods = self.kube.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]
        code = str(job["submitter_exit_code"])
        finished, patched = False, []
        for pod in pods:
            meta = pod["metadata"]
            if submission_id_of(pod) not in (None, job["submission_id"]):
                continue  # a submitter of another run of this RayJob
            if pod.get("status", {}).get("phase") == "Succeeded":
                finished = True
            if (meta.get("annotations") or {}).get(EXIT_ANNOTATION) is None and not meta.get("deletionTimestamp"):
                self.kube.annotate_pod(ns, meta["name"], code)
                patched.append(meta["name"])
        # A failing submitter (exit code != 0) is retried by its Job: keep annotating new pods
        # until the Job gives up; checking the Job itself covers both cases.
        kjob = self.kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
        for cond in (kjob or {}).get("status", {}).get("conditions") or []:
            if cond["type"] in ("Complete", "Failed") and cond["status"] == "True":
                finished = True
        with self.state.lock:
            live = self.state.clusters.get((ns, job["cluster"]), {}).get("jobs", {}).get(job["submission_id"])
            if live is not None:
                live["signalled_pods"] = sorted(set(live["signalled_pods"]) | set(patched))
                live["submitter_finished"] = finished
        if patched:
            self.log(f"annotated submitter pods {ns}/{patched} with {EXIT_ANNOTATION}={code}")



class Runner(Poller):
    """Runs the submitter pods of RayClusters that have a real backend, on this host.

    A running submitter pod's container command and args (KubeRay's `ray job status || ray job
    submit --no-wait ...; ray job logs --follow`) run as they are, with the pod's env (secretKeyRefs
    read as kubelet would: KubeRay's RAY_AUTH_TOKEN; not started while one is missing), except that
    the dashboard address becomes this server's `/_ray/<ns>/<cluster>` route (the websocket of
    `ray job logs --follow` ignores HTTP_PROXY). Output goes to <log dir>/<ns>/<pod>.log; the exit
    code finishes the pod through the KWOK exit annotation. A pod deleted meanwhile (RayJob
    deleted or suspended) has its process group killed.
    """

    what = "runner"

    def __init__(self, state: State, kube: Kube, log, self_url: str, log_dir: str, ray_bin: str) -> None:
        super().__init__(kube, log, 0.5)
        self.state = state
        self.self_url, self.log_dir, self.ray_bin = self_url, log_dir, ray_bin
        self.procs: dict[tuple[str, str], subprocess.Popen] = {}

    def tick(self) -> None:
        with self.state.lock:
            namespaces = {ns for ns, _ in self.state.backends}
        seen = set()
        for ns in sorted(namespaces):
            sel = urllib.parse.quote("batch.kubernetes.io/job-name")
            for pod in self.kube.call("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector={sel}")["items"]:
                key = (ns, pod["metadata"]["name"])
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                seen.add(key)
                with self.state.lock:
                    started = key in self.state.runs
                if not started and pod.get("status", {}).get("phase") == "Running":
                    self.launch(pod)
        for key, proc in list(self.procs.items()):
            if proc.poll() is None and key not in seen:
                self.log(f"runner: pod {key[0]}/{key[1]} is gone: stopping its command (pid {proc.pid})")
                stop_group(proc)
            if proc.poll() is not None:
                self.finish(key, proc)

    def launch(self, pod: dict) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        env = container_env(self.kube, ns, container)  # with RAY_AUTH_MODE/RAY_AUTH_TOKEN from KubeRay
        if env is None:
            return  # a Secret it names is missing: kubelet would not start it; tried again next tick
        address = env.get("RAY_DASHBOARD_ADDRESS", "")
        if "RAY_JOB_SUBMISSION_ID" not in env or not address:
            return
        _, cluster = parse_host(address.removeprefix("http://"))
        with self.state.lock:
            if self.state.backend(ns, cluster) is None:
                return
        route = f"{self.self_url}/_ray/{ns}/{cluster}"
        old = address if address.startswith("http://") else f"http://{address}"
        argv = [a.replace(old, route) for a in (container.get("command") or []) + (container.get("args") or [])]
        env["RAY_DASHBOARD_ADDRESS"] = route
        full_env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        full_env.update(env, PATH=self.ray_bin + os.pathsep + full_env.get("PATH", ""))
        os.makedirs(os.path.join(self.log_dir, ns), exist_ok=True)
        path = os.path.join(self.log_dir, ns, f"{name}.log")
        with open(path, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=full_env, cwd=os.path.join(self.log_dir, ns), start_new_session=True)
        self.procs[(ns, name)] = proc
        with self.state.lock:
            self.state.runs[(ns, name)] = {"namespace": ns, "pod": name, "cluster": cluster,
                                           "submission_id": env["RAY_JOB_SUBMISSION_ID"], "pid": proc.pid,
                                           "argv": argv, "log": path, "started": time.time(),
                                           "exit_code": None, "finished": None}
        self.log(f"runner: pod {ns}/{name}: started pid {proc.pid} (log {path})")

    def finish(self, key: tuple[str, str], proc: subprocess.Popen) -> None:
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        with self.state.lock:
            run = self.state.runs.get(key)
            if run is not None and run["exit_code"] is None:
                run.update(exit_code=code, finished=time.time())
        try:
            self.kube.annotate_pod(key[0], key[1], code)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
        del self.procs[key]
        self.log(f"runner: pod {key[0]}/{key[1]} exited {code}")


def stop_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass
