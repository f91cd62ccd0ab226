"""What GKE's kubelet does before it starts a container and KWOK does not: resolve the Secrets the
pod names. KWOK would run every pod at once (Running, Ready); a kubelet cannot start a container
whose env names a Secret (or a key of one) that does not exist, nor set up a pod whose secret
volume names one:

- a non-optional `env[].valueFrom.secretKeyRef` or `envFrom[].secretRef` whose Secret is missing
  (KubeRay 1.6 puts RAY_AUTH_TOKEN there): the container waits, reason `CreateContainerConfigError`,
  message `secret "<name>" not found`; a missing key: `couldn't find key <key> in Secret <ns>/<name>`
  (kubelet_pods.go makeEnvironmentVariables; envFrom is resolved before env). An init container
  that waits holds the pod's other containers (`PodInitializing`).
- a non-optional `secret` volume whose Secret is missing: the pod is never set up; every container
  waits (`ContainerCreating`, or `PodInitializing` for the app containers of a pod with init
  containers: kubelet's defaults), no message (kubelet says it in FailedMount events, not modelled).

So KWOK's running stage (hack/kwok-pod-stages.yaml) leaves a pod that names a Secret alone until it
carries RESOLVED; the Kubelet thread gives it that annotation once every Secret it names is there
(KWOK then runs it: Running, Ready, probed by prober.py), and until then writes the waiting status
above (phase Pending, Ready/ContainersReady False, `ContainersNotReady`). It looks again every
INTERVAL, so the pod starts by itself once the Secret appears, as kubelet's retries start it.
Not modelled: the pod IP a real pod has while it waits, kubelet's events, ConfigMaps."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse

from .kube import Kube, Poller
from .prober import ready_conditions

RESOLVED = "tputorch.local/secrets-resolved"  # KWOK's running stage waits for it (value "true")
INTERVAL = 0.2  # seconds between looks (only scheduled pods KWOK has not run are listed)
CONFIG_ERROR = "CreateContainerConfigError"
CREATING, INITIALIZING = "ContainerCreating", "PodInitializing"


def names_secrets(pod: dict) -> bool:
    """The rule KWOK's stage applies in jq (kwok-pod-stages.yaml): a secret volume, envFrom or env ref."""
    spec = pod.get("spec") or {}
    containers = (spec.get("containers") or []) + (spec.get("initContainers") or [])
    return any(v.get("secret") for v in spec.get("volumes") or []) \
        or any(r.get("secretRef") for c in containers for r in c.get("envFrom") or []) \
        or any(((e.get("valueFrom") or {}).get("secretKeyRef")) for c in containers for e in c.get("env") or [])


def config_error(container: dict, ns: str, secrets: dict[str, set[str]]) -> str | None:
    """Kubelet's error for the container's env (None: it can start). `secrets`: name -> its keys."""
    refs = [(r["secretRef"].get("name"), None, r["secretRef"].get("optional"))
            for r in container.get("envFrom") or [] if r.get("secretRef")]
    refs += [(ref.get("name"), ref.get("key"), ref.get("optional"))
             for e in container.get("env") or [] for ref in [(e.get("valueFrom") or {}).get("secretKeyRef")] if ref]
    for name, key, optional in refs:
        if optional:
            continue
        if name not in secrets:
            return f'secret "{name}" not found'
        if key is not None and key not in secrets[name]:
            return f"couldn't find key {key} in Secret {ns}/{name}"
    return None


def missing_volume(pod: dict, secrets: dict[str, set[str]]) -> str | None:
    for v in (pod.get("spec") or {}).get("volumes") or []:
        secret = v.get("secret")
        if secret and not secret.get("optional") and secret.get("secretName") not in secrets:
            return secret.get("secretName")
    return None


def _waiting(container: dict, reason: str, message: str | None = None) -> dict:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {"name": container.get("name"), "image": container.get("image"), "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": {"waiting": waiting}}


def waiting_status(pod: dict, secrets: dict[str, set[str]], now: str) -> dict | None:
    """The status kubelet reports for a pod whose Secrets (`secrets`: those of its namespace, name
    -> keys) keep a container from starting; None when none does (the pod may start)."""
    spec = pod.get("spec") or {}
    ns = pod["metadata"]["namespace"]
    inits, apps = spec.get("initContainers") or [], spec.get("containers") or []
    if missing_volume(pod, secrets) is not None:
        init_states = [_waiting(c, CREATING) for c in inits]
        app_states = [_waiting(c, INITIALIZING if inits else CREATING) for c in apps]
    else:
        errors = [config_error(c, ns, secrets) for c in inits]
        blocked = next((i for i, err in enumerate(errors) if err), None)
        if blocked is not None:  # init containers run in order: the earlier ones ran
            init_states = [{"name": c.get("name"), "image": c.get("image"), "imageID": "", "ready": True,
                            "restartCount": 0, "started": False,
                            "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now,
                                                     "finishedAt": now}}} for c in inits[:blocked]]
            init_states += [_waiting(inits[blocked], CONFIG_ERROR, errors[blocked])]
            init_states += [_waiting(c, CREATING) for c in inits[blocked + 1:]]
            app_states = [_waiting(c, INITIALIZING) for c in apps]
        else:
            errors = [config_error(c, ns, secrets) for c in apps]
            if not any(errors):
                return None
            init_states = []  # not modelled: the init containers' run before; they ran (KWOK's view)
            # The app containers that could start are kept waiting too (ContainerCreating): the pod
            # stays KWOK's to run only once every container can start.
            app_states = [_waiting(c, CONFIG_ERROR, err) if err else _waiting(c, CREATING) for c, err in zip(apps, errors)]
    incomplete = [s["name"] for s in init_states if "terminated" not in s["state"]]
    unready = " ".join(s["name"] for s in app_states)
    initialized = {"type": "Initialized", "status": "True", "lastTransitionTime": now}
    if incomplete:
        initialized.update(status="False", reason="ContainersNotInitialized",
                           message=f"containers with incomplete status: [{' '.join(incomplete)}]")
    conditions = [initialized, *ready_conditions(False, now, unready)]
    status = {"phase": "Pending", "conditions": conditions, "containerStatuses": app_states}
    if init_states:
        status["initContainerStatuses"] = init_states
    return {"status": status}


def reported(status: dict, new: dict) -> bool:
    """The pod already shows that status (times aside): no patch, no new resourceVersion each look."""
    def core(s: dict) -> tuple:
        conds = sorted((c.get("type"), c.get("status"), c.get("reason")) for c in s.get("conditions") or []
                       if c.get("type") in ("Initialized", "ContainersReady", "Ready"))
        states = [(cs.get("name"), (cs.get("state") or {}).get("waiting"), "terminated" in (cs.get("state") or {}))
                  for cs in (s.get("initContainerStatuses") or []) + (s.get("containerStatuses") or [])]
        return s.get("phase"), conds, states
    return core(status) == core(new)


def describe(status: dict) -> str:
    said = sorted({w["reason"] + (f": {w['message']}" if w.get("message") else "")
                   for cs in (status.get("initContainerStatuses") or []) + status["containerStatuses"]
                   for w in [(cs.get("state") or {}).get("waiting")] if w})
    return "; ".join(said)


class Kubelet(Poller):
    """Applies the rule above to the scheduled pods KWOK has not run yet (no pod IP)."""

    what = "kubelet"

    def __init__(self, kube: Kube, log, interval: float = INTERVAL) -> None:
        super().__init__(kube, log, interval)

    def tick(self) -> None:
        sel = urllib.parse.quote("spec.nodeName!=,status.podIP=")
        pods = [p for p in self.kube.call("GET", f"/api/v1/pods?fieldSelector={sel}")["items"]
                if not p["metadata"].get("deletionTimestamp") and names_secrets(p)
                and (p["metadata"].get("annotations") or {}).get(RESOLVED) != "true"]
        secrets: dict[str, dict[str, set[str]]] = {}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for p in pods:
            ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
            if ns not in secrets:
                secrets[ns] = {s["metadata"]["name"]: set((s.get("data") or {}).keys())
                               for s in self.kube.call("GET", f"/api/v1/namespaces/{ns}/secrets")["items"]}
            patch = waiting_status(p, secrets[ns], stamp)
            try:
                if patch is None:  # every Secret it names is there: KWOK runs it now
                    self.kube.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
                                   {"metadata": {"annotations": {RESOLVED: "true"}}}, "application/merge-patch+json")
                    continue
                if reported(p.get("status") or {}, patch["status"]):
                    continue
                self.kube.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", patch,
                               "application/strategic-merge-patch+json")
                self.log(f"kubelet: pod {ns}/{name} waits: {describe(patch['status'])}")
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # deleted meanwhile
                    raise
