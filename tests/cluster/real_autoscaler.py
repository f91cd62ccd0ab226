"""Ray 2.60's own autoscaler v2 for one RayCluster of the local chain, run as KubeRay's autoscaler
container runs it in the head pod: Ray's KubeRay config reader and cloud provider, its scheduler,
reconciler and drain, talking to the real API server with the token of the ServiceAccount KubeRay
made for that cluster's autoscaler (so with the rights KubeRay's Role gives it), and to the real Ray
head's GCS. What it decides, it writes to the RayCluster (`replicas`, `workersToDelete`), and
KubeRay makes or deletes the pods.

Its env is KubeRay's for that container: the RayCluster's autoscalerOptions.env, read at start.
Two differences from the head pod, both about where things run here, never about a decision:
  * The API server and its CA are on 127.0.0.1 (Ray's own KUBERNETES_SERVICE_HOST and
    RAY_KUBERAY_CA_CERT_PATH), and the token is a file of ours instead of the projected
    /var/run/secrets path (the one constant set below).
  * The Ray nodes are not in pods: one real head stands for every RayCluster's head pod and the
    simulated TPU hosts are started before their pods exist, so no node carries its pod's name in
    RAY_CLOUD_INSTANCE_ID as KubeRay's pods do. The autoscaler's read of the cluster state gets
    each node's pod name and group by the stand-in dashboard's own rule (hack/fakedash/prober.py
    `node_for`, the rule by which pods are probed against nodes); nodes that stand for no pod of
    this cluster keep none, and Ray's reconciler leaves such nodes alone.

    autoscaler = RealAutoscaler(kube, ray, namespace, cluster).start()  # Ray's Python, logs in ray.workdir
    autoscaler.log()      # its monitor log
    autoscaler.stop()

Run as a script (by the serving venv's Python, which has Ray):
    python real_autoscaler.py NAMESPACE CLUSTER GCS_ADDRESS TOKEN_FILE LOG_DIR
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))  # fakedash.prober: the stand-in's rule of which node stands for a pod


class RealAutoscaler:
    def __init__(self, kube, ray, namespace: str, cluster: str) -> None:
        # The RealRay's Python has Ray; its workdir keeps one log directory per cluster.
        self.kube, self.python, self.ray = kube, ray.python, ray
        self.namespace, self.cluster = namespace, cluster
        self.workdir = Path(ray.workdir) / f"autoscaler-{cluster}"
        self.proc: subprocess.Popen | None = None

    def _token(self) -> str:
        """A token of the ServiceAccount KubeRay gives the head pod of an autoscaled cluster."""
        from kubernetes import client

        head = self.kube.core.list_namespaced_pod(
            self.namespace, label_selector=f"ray.io/cluster={self.cluster},ray.io/node-type=head").items[0]
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3600))
        return self.kube.core.create_namespaced_service_account_token(
            head.spec.service_account_name, self.namespace, request).status.token

    def _container_env(self) -> dict[str, str]:
        """The RayCluster's autoscalerOptions.env, which KubeRay puts in the autoscaler container
        (read once, as a container's env is)."""
        rc = self.kube.custom.get_namespaced_custom_object("ray.io", "v1", self.namespace, "rayclusters", self.cluster)
        return {e["name"]: e["value"] for e in rc["spec"].get("autoscalerOptions", {}).get("env") or [] if "value" in e}

    def start(self) -> "RealAutoscaler":
        self.workdir.mkdir(parents=True, exist_ok=True)
        token = self.workdir / "token"
        token.write_text(self._token())
        config = self.kube.api_client.configuration
        server = urlparse(config.host)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.update(KUBERNETES_SERVICE_HOST=server.hostname, KUBERNETES_SERVICE_PORT_HTTPS=str(server.port),
                   RAY_KUBERAY_CA_CERT_PATH=config.ssl_ca_cert, KUBERAY_CRD_VER="v1",
                   RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.ray.token, RAY_USAGE_STATS_ENABLED="0")
        env.update(self._container_env())
        log = open(self.workdir / "autoscaler.out", "ab")
        self.proc = subprocess.Popen(
            [self.python, __file__, self.namespace, self.cluster, self.ray.gcs_address, str(token),
             str(self.workdir)], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        return self

    def log(self) -> str:
        path = self.workdir / "monitor.log"
        out = self.workdir / "autoscaler.out"
        return "".join(p.read_text(errors="replace") for p in (out, path) if p.exists())

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None


# -- in the serving venv ---------------------------------------------------------------------------

def _pods_as_node_ids(client, cluster: str, node_states) -> dict[bytes, tuple[str, str]]:
    """{Ray node id: (pod name, worker group)} for this cluster's running pods, by the prober's rule.
    Only a running pod has a Ray node; a node that could stand for several (the slice attached
    before the first pod existed stands for any pod without one of its own) is the oldest pod's."""
    from fakedash.prober import node_for
    from ray.autoscaler.v2.utils import is_head_node

    nodes = [{"nodeId": n.node_id, "isHeadNode": is_head_node(n), "labels": dict(n.labels), "startTimeMs": 0}
             for n in node_states]
    pods = [p for p in client.get(f"pods?labelSelector=ray.io/cluster={cluster}")["items"]
            if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    out = {}
    for pod in sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"]):
        node = node_for(pod, nodes)
        if node is not None and node["nodeId"] not in out:
            out[node["nodeId"]] = (pod["metadata"]["name"], pod["metadata"]["labels"]["ray.io/group"])
    return out


def main(namespace: str, cluster: str, gcs_address: str, token_file: str, log_dir: str) -> None:
    import logging

    from ray.autoscaler._private.kuberay import node_provider
    from ray.autoscaler._private.kuberay.autoscaling_config import AutoscalingConfigProducer
    from ray.autoscaler.v2 import autoscaler as v2_autoscaler
    from ray.autoscaler.v2.instance_manager.config import KubeRayConfigReader
    from ray.autoscaler.v2.monitor import AutoscalerMonitor

    node_provider.IN_CLUSTER_TOKEN_PATH = token_file
    logging.basicConfig(filename=os.path.join(log_dir, "monitor.log"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = node_provider.KubernetesHttpApiClient(namespace)
    read_state = v2_autoscaler.get_cluster_resource_state

    def state_with_pods(gcs_client):
        state = read_state(gcs_client)
        pods = _pods_as_node_ids(client, cluster, state.node_states)
        for node in state.node_states:
            if node.node_id in pods:
                node.instance_id, node.ray_node_type_name = pods[node.node_id]
        return state

    v2_autoscaler.get_cluster_resource_state = state_with_pods
    AutoscalerMonitor(address=gcs_address, config_reader=KubeRayConfigReader(
        AutoscalingConfigProducer(cluster, namespace)), log_dir=log_dir).run()  # no monitor_ip: no metrics server on Ray's fixed port


if __name__ == "__main__":
    main(*sys.argv[1:6])
