"""The API calls of the user commands (submit, serve, get, describe, logs, delete, wait).

Thin I/O over the official Kubernetes client, with the user's kubeconfig: every decision about
what to show or which exit code to return lives in display.py / submit.py. The operator never
imports this module.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from ..api import crd

GROUP, VERSION = crd.GROUP, crd.VERSION


RAY_GROUP, RAY_VERSION = "ray.io", "v1"


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    short: str
    child_plural: str  # its KubeRay child's (same name)


JOB = Kind(crd.KIND, crd.PLURAL, "ttj", "rayjobs")
SERVICE = Kind(crd.SERVICE_KIND, crd.SERVICE_PLURAL, "ttsvc", "rayservices")
KINDS = (JOB, SERVICE)
SUBMITTER_CONTAINER = "ray-job-submitter"  # KubeRay's K8sJobMode submitter container


class ConnectError(RuntimeError):
    """No usable kubeconfig / context."""


def context_namespace(context: str | None, kubeconfig: str | None) -> str:
    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = active if context is None else next((c for c in contexts if c["name"] == context), None)
    if chosen is None:
        names = ", ".join(c["name"] for c in contexts)
        raise ConnectError(f"--context: {context!r} is not in the kubeconfig; contexts: {names}")
    return (chosen.get("context") or {}).get("namespace") or "default"


class Api:
    """The calls the commands make, on one ApiClient, in one namespace by default."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # ---- TPUTorchJobs and TPUTorchServices
    def create(self, kind: Kind, body: dict, namespace: str) -> dict:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, kind.plural, body)

    def get(self, kind: Kind, name: str, namespace: str) -> dict | None:
        return self._get(GROUP, VERSION, namespace, kind.plural, name)

    def _get(self, group: str, version: str, namespace: str, plural: str, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def find(self, name: str, namespace: str) -> tuple[Kind, dict] | None:
        """The job or service called `name` (jobs first); a kind whose CRD is missing is skipped."""
        for kind in KINDS:
            try:
                obj = self.get(kind, name, namespace)
            except ApiException as err:
                if err.status == 404:  # the CRD itself is not installed
                    continue
                raise
            if obj is not None:
                return kind, obj
        return None

    def list(self, kind: Kind, namespace: str | None) -> list[dict]:
        """Every object of the kind (all namespaces when namespace is None); [] when its CRD is missing."""
        try:
            if namespace is None:
                result = self.custom.list_cluster_custom_object(GROUP, VERSION, kind.plural)
            else:
                result = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, kind.plural)
        except ApiException as err:
            if err.status == 404:
                return []
            raise
        return result.get("items") or []

    def annotate(self, kind: Kind, name: str, namespace: str, annotations: dict[str, str]) -> dict:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, kind.plural, name,
                                                          {"metadata": {"annotations": annotations}})

    def child(self, kind: Kind, name: str, namespace: str) -> dict | None:
        """The object's RayJob / RayService (same name; None when there is none, or no KubeRay)."""
        return self._get(RAY_GROUP, RAY_VERSION, namespace, kind.child_plural, name)

    def delete(self, kind: Kind, name: str, namespace: str) -> bool:
        try:
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, kind.plural, name)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            raise

    def watch_object(self, kind: Kind, name: str, namespace: str, stop: threading.Event,
                     timeout_seconds: int = 60) -> Iterator[dict | None]:
        """The object each time it changes (None once it is gone), until `stop` is set.

        A watch with a field selector on the name; it is re-listed after every expiry or error so
        nothing is missed, and the same version is never yielded twice.
        """
        last_version = None
        while not stop.is_set():
            try:
                items = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, kind.plural, field_selector=f"metadata.name={name}")
                objs = items.get("items") or []
                current = objs[0] if objs else None
                version = current["metadata"]["resourceVersion"] if current else None
                if version != last_version or current is None:
                    last_version = version
                    yield current
                    if current is None:
                        return
                w = watch.Watch()
                for event in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace,
                                      kind.plural, field_selector=f"metadata.name={name}",
                                      resource_version=items["metadata"]["resourceVersion"],
                                      timeout_seconds=timeout_seconds):
                    if stop.is_set():
                        w.stop()
                        return
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        yield None
                        return
                    if event["type"] in ("ADDED", "MODIFIED"):
                        last_version = obj["metadata"]["resourceVersion"]
                        yield obj
            except ApiException as err:
                if err.status in (401, 403):
                    raise
                stop.wait(1.0)
            except Exception:  # a dropped connection: list again
                if stop.is_set():
                    return
                stop.wait(1.0)

    # ---- what the objects made
    def events(self, kind: Kind, name: str, namespace: str) -> list:
        items = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name},involvedObject.kind={kind.kind}").items
        return sorted(items, key=lambda e: _event_time(e))

    def pods(self, kind: Kind, name: str, namespace: str) -> list:
        """The Ray pods of a job or service (the operator labels them with its name)."""
        from ..render.names import JOB_LABEL, SERVICE_LABEL

        label = JOB_LABEL if kind is JOB else SERVICE_LABEL
        return self.core.list_namespaced_pod(namespace, label_selector=f"{label}={name}").items

    def submitter_pods(self, rayjob: str, namespace: str) -> list:
        """Pods of KubeRay's submitter Job for a RayJob (the Job has the RayJob's name), newest last.

        Found through the Job's own selector, so a deleted-and-recreated Job's old pods never match.
        """
        try:
            job = self.batch.read_namespaced_job(rayjob, namespace)
        except ApiException as err:
            if err.status == 404:
                return []
            raise
        labels = (job.spec.selector.match_labels or {}) if job.spec and job.spec.selector else {}
        if not labels:
            return []
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        return sorted(pods, key=lambda p: p.metadata.creation_timestamp)

    def pod_log(self, pod: str, namespace: str, container: str | None = SUBMITTER_CONTAINER,
                follow: bool = False) -> Iterator[str]:
        """The pod's log line by line (as `kubectl logs [-f]`)."""
        resp = self.core.read_namespaced_pod_log(pod, namespace, container=container, follow=follow,
                                                 _preload_content=False)
        try:
            pending = b""
            for chunk in resp.stream(amt=4096, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            resp.release_conn()


def _event_time(event) -> float:
    when = event.last_timestamp or event.event_time or event.first_timestamp or event.metadata.creation_timestamp
    return when.timestamp() if when else 0.0


def connect(context: str | None = None, namespace: str | None = None, kubeconfig: str | None = None) -> Api:
    """An Api from the user's kubeconfig (KUBECONFIG or ~/.kube/config), or in-cluster config.

    The namespace defaults to the context's, as kubectl's does.
    """
    try:
        ns = context_namespace(context, kubeconfig)  # first: it names a missing context clearly
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        ns = namespace or ns
    except config.ConfigException as err:
        if context is not None:
            raise ConnectError(f"kubeconfig: {err}") from err
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise ConnectError(f"no kubeconfig found ({err}); set KUBECONFIG or use --context") from err
        api_client = client.ApiClient()
        ns = namespace or _incluster_namespace()
        # the pod's own ServiceAccount acts from here on: say so, not silently
        print(f"tputorch: no kubeconfig found ({err}); using this pod's ServiceAccount (in-cluster config), "
              f"namespace {ns}", file=sys.stderr)
    return Api(api_client, ns)


def _incluster_namespace() -> str:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def api_error_message(err: ApiException) -> str:
    """The API server's own message (its Status body), not the client's HTTP dump."""
    import json

    try:
        body = json.loads(err.body or "{}")
        return body.get("message") or f"{err.status} {err.reason}"
    except (ValueError, TypeError):
        return f"{err.status} {err.reason}"


def now() -> float:
    return time.monotonic()
