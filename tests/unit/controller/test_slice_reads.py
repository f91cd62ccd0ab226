"""Issue 56 item 1: a multi-host service's replicas each on one whole slice, read from Ray's state by
the reconcile (controller/slicereads.py) through the fake API adapter and a fake dashboard: read
once per interval while a replica is up, off the reconcile's path; a split is a False condition and
one Warning Event; a failed read changes nothing; a single-host service, or one whose Ray token only
KubeRay holds (made before services got a token Secret of the operator's), is never read; a service
is read with the token of the Secret the operator named when it made the RayService, from either
key of a rotation."""

from __future__ import annotations

import asyncio
import logging
import re

from tputorch.controller.dashboard import DashboardError
from tputorch.controller.writes import STATUS_INTERVAL

from ..fakekube import FakeKube, controller
from ..services import service_body

KIND = "TPUTorchService"
KEY = (KIND, "ml", "qwen")
CLUSTER = "qwen-raycluster-x7k2p"
INTERVAL = 30.0


def node(node_id, slice_name):
    return {"node_id": node_id, "is_head_node": False, "state": "ALIVE",
            "labels": {"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": node_id[-1]}}


NODES = [*(node(f"a{i}", "slice-a") for i in range(4)), *(node(f"b{i}", "slice-b") for i in range(4))]


def group(pg_id, nodes):
    return {"placement_group_id": pg_id, "name": "", "state": "CREATED",
            "bundles": [{"bundle_id": {"placement_group_id": pg_id, "bundle_index": i}, "node_id": n,
                         "unit_resources": {"TPU": 4.0}} for i, n in enumerate(nodes)]}


class FakeDashboard:
    timeout = 600.0

    def __init__(self) -> None:
        self.answers = {"placement_groups": [group("pg1", ["a0", "a1", "a2", "a3"])], "nodes": NODES}
        self.calls: list[tuple] = []
        self.fail: Exception | None = None

    async def state(self, namespace, cluster, what, token=None):
        self.calls.append((namespace, cluster, what, token))
        if self.fail is not None:
            raise self.fail
        return self.answers[what]


class Service:
    """A serving service on a fake clock: its RayService with a running cluster and every host's pod."""

    def __init__(self, topology: str = "4x4", auth: dict | None = None, ray_tokens=None) -> None:
        """``auth``: the cluster's authOptions as stored (default: as the operator made the
        RayService, naming its token Secret; empty: KubeRay dropped them)."""
        self.t = 0.0
        self.dashboard = FakeDashboard()
        self.kube = FakeKube()
        self.ctl = controller(self.kube, monotonic=lambda: self.t, dashboard=self.dashboard,
                              progress_interval=INTERVAL, ray_tokens=ray_tokens)
        self.due: list[tuple[float, tuple]] = []
        self.ctl.queue.add_after = lambda key, delay: self.due.append((self.t + delay, key))
        self.enqueued: list[tuple] = []  # keys a read with news brought back
        self.ctl.slices.enqueue = self.enqueued.append
        self.loop = asyncio.new_event_loop()
        body = service_body(tpu={"accelerator": "v6e", "topology": topology})
        body["metadata"].update(resourceVersion="10")
        self.ctl.parents[KIND].remember(body)
        self.reconcile()  # the RayService is created
        made = self.kube.objects[("rayservices", "ml", "qwen")]
        self.secret = made["spec"]["rayClusterConfig"]["authOptions"].get("secretName")
        if auth is not None:
            made["spec"]["rayClusterConfig"]["authOptions"] = auth
        if not auth and auth is not None:
            del made["spec"]["rayClusterConfig"]["authOptions"]
        made["status"] = {"activeServiceStatus": {"rayClusterName": CLUSTER}}
        self.ctl.children[KIND]._put(self.ctl.children[KIND].slim(made))
        hosts = 4 if topology == "4x4" else 1
        for i in range(hosts):
            self.ctl.pods.remember({"metadata": {"name": f"{CLUSTER}-tpu-{i}", "namespace": "ml", "resourceVersion": "1",
                                                 "labels": {"tputorch.io/service": "qwen", "ray.io/cluster": CLUSTER,
                                                            "ray.io/node-type": "worker"}},
                                    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})

    def reconcile(self) -> None:
        self.loop.run_until_complete(self.ctl.reconcile(KEY))
        while self.ctl.slices.reading:  # the reads in flight end; one with news queues the key
            self.loop.run_until_complete(asyncio.gather(*self.ctl.slices.reading.values(), return_exceptions=True))
        if self.enqueued:  # reconciled as the worker would
            self.enqueued.clear()
            self.loop.run_until_complete(self.ctl.reconcile(KEY))

    def at(self, t: float) -> None:
        """Reconciled at ``t``, and again once the status write a read's news deferred is due
        (STATUS_INTERVAL later): within the read interval, so no read then."""
        self.t = t
        self.reconcile()
        self.t = t + STATUS_INTERVAL + 1
        self.reconcile()
        written(self)

    def condition(self) -> dict | None:
        status = self.ctl.parents[KIND].get(("ml", "qwen")).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == "ReplicasOnWholeSlices"), None)

    def events(self) -> list[str]:
        self.loop.run_until_complete(self.ctl.recorder.drain())
        return [c[2] for c in self.kube.called("event")]

    def close(self) -> None:
        self.loop.close()


def written(svc: Service) -> None:
    """The status the last patch wrote, as the parent's watch would bring it back."""
    parent = svc.ctl.parents[KIND].get(("ml", "qwen"))
    if not svc.kube.called("patch_status"):
        return
    status = svc.kube.called("patch_status")[-1][4]
    svc.ctl.parents[KIND]._put({**parent, "metadata": {**parent["metadata"], "resourceVersion": str(svc.t + 11)},
                                "status": status})


def test_a_whole_slice_is_said_once_read_and_a_split_is_a_false_condition_and_one_warning():
    svc = Service()
    svc.at(1.0)
    tokens = svc.ctl.progress.ray_tokens.candidates("ml", svc.secret)
    assert svc.dashboard.calls == [("ml", CLUSTER, "placement_groups", tokens[0]), ("ml", CLUSTER, "nodes", tokens[0])]
    cond = svc.condition()
    assert (cond["status"], cond["reason"]) == ("True", "OneSlicePerReplica")

    svc.at(10.0)  # within the interval: not read again
    assert len(svc.dashboard.calls) == 2

    svc.dashboard.answers["placement_groups"] = [group("pg1", ["a0", "a1", "b2", "b3"])]
    svc.at(31.0)
    assert len(svc.dashboard.calls) == 4
    cond = svc.condition()
    assert (cond["status"], cond["reason"]) == ("False", "ReplicaSplitAcrossSlices")
    assert cond["message"].endswith(
        "placement group pg1: its bundles are on slices slice-a (node a0, a1), slice-b (node b2, b3)")
    assert svc.events().count("ReplicaSplitAcrossSlices") == 1
    svc.at(61.0)  # the same split read again: no second event
    assert svc.events().count("ReplicaSplitAcrossSlices") == 1
    assert (KEY in [k for _, k in svc.due]), "read again next interval"
    svc.close()


def test_the_warning_event_is_a_warning():
    from tputorch.status import conditions
    status = {"conditions": [{"type": "ReplicasOnWholeSlices", "status": "False", "reason": "ReplicaSplitAcrossSlices",
                              "message": "m"}]}
    assert [(e.type, e.reason) for e in conditions.events({}, status)] == [("Warning", "ReplicaSplitAcrossSlices")]


def test_a_failed_read_changes_nothing_and_is_logged_once(caplog):
    svc = Service()
    svc.dashboard.fail = DashboardError("placement_groups: HTTP 404: not served", 404)
    with caplog.at_level(logging.DEBUG, logger="tputorch"):
        svc.at(1.0)
        assert svc.condition() is None, "absent until a read succeeds"
        svc.dashboard.fail = None
        svc.at(31.0)
        assert svc.condition()["status"] == "True"
        patches = len(svc.kube.called("patch_status"))
        svc.dashboard.fail = asyncio.TimeoutError()
        svc.at(61.0)
        svc.at(91.0)
    assert svc.condition()["status"] == "True", "a failed read keeps the last check"
    assert len(svc.kube.called("patch_status")) == patches, "and writes nothing"
    warnings = [r.getMessage() for r in caplog.records
                if "placement groups not read" in r.getMessage() and r.levelno == logging.WARNING]
    assert warnings == [
        f"TPUTorchService ml/qwen: the replicas' placement groups not read from RayCluster {CLUSTER}'s dashboard: "
        "DashboardError: placement_groups: HTTP 404: not served",
        f"TPUTorchService ml/qwen: the replicas' placement groups not read from RayCluster {CLUSTER}'s dashboard: "
        "TimeoutError: "], "each failure once"
    svc.close()


def test_a_single_host_service_is_never_read():
    svc = Service(topology="2x2")
    svc.at(1.0)
    svc.at(31.0)
    assert svc.ctl.parents[KIND].get(("ml", "qwen")) is not None
    assert svc.kube.called("patch_status")[-1][4]["readyReplicas"] == 1  # it serves
    assert svc.dashboard.calls == [] and svc.condition() is None
    svc.close()


def test_a_service_whose_token_only_kuberay_holds_is_never_read_and_said_once(caplog):
    svc = Service(auth={"mode": "token"})  # made before services got a token Secret: KubeRay's own
    with caplog.at_level(logging.INFO, logger="tputorch"):
        svc.at(1.0)
        svc.at(31.0)
    assert svc.dashboard.calls == []
    said = [r for r in caplog.records if "KubeRay's own" in r.getMessage() and r.levelno >= logging.INFO]
    assert len(said) == 1
    svc.close()


def test_a_cluster_without_token_auth_is_read_without_a_token():
    svc = Service(auth={})  # KubeRay 1.5 dropped authOptions: the head is open
    svc.at(1.0)
    assert svc.dashboard.calls == [("ml", CLUSTER, "placement_groups", None), ("ml", CLUSTER, "nodes", None)]
    svc.close()


def test_a_service_as_the_operator_makes_it_is_read_with_the_token_of_its_own_secret():
    """The RayService names the token Secret the operator made with it (owned by it, its token
    derived from the operator's key): the slice check reads a real service, not only a test's."""
    svc = Service()
    assert re.fullmatch(r"qwen-ray-token-[0-9a-f]{6}", svc.secret)
    secret = svc.kube.objects[("secrets", "ml", svc.secret)]
    made = svc.kube.objects[("rayservices", "ml", "qwen")]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == made["metadata"]["uid"]
    assert secret["stringData"]["auth_token"] == svc.ctl.slices.ray_tokens.token("ml", svc.secret)
    svc.at(1.0)
    token = secret["stringData"]["auth_token"]
    assert svc.dashboard.calls == [("ml", CLUSTER, "placement_groups", token), ("ml", CLUSTER, "nodes", token)]
    assert (svc.condition()["status"], svc.condition()["reason"]) == ("True", "OneSlicePerReplica")
    svc.close()


def test_a_service_made_before_a_key_rotation_is_read_with_the_previous_key():
    """docs/tasks/rotate-token-key.md: a RayService's Secret keeps the token of the key it was made
    under for the service's life; after a rotation the previous key's token is tried where the head
    refuses the current one's (403), as for a job."""
    from tputorch.controller.raytoken import RayTokens

    old, new = b"o" * 32, b"n" * 32
    svc = Service(ray_tokens=RayTokens(new, previous=old))
    held = RayTokens(old).token("ml", svc.secret)  # as if made by the operator before the rotation
    answer = svc.dashboard.state

    async def state(namespace, cluster, what, token=None):
        if token != held:
            svc.dashboard.calls.append((namespace, cluster, what, token))
            raise DashboardError(f"{what}: HTTP 403: Forbidden", 403)
        return await answer(namespace, cluster, what, token)

    svc.dashboard.state = state
    svc.at(1.0)
    current = RayTokens(new).token("ml", svc.secret)
    assert [c[2:] for c in svc.dashboard.calls] == [("placement_groups", current), ("placement_groups", held),
                                                    ("nodes", held)]
    assert (svc.condition()["status"], svc.condition()["reason"]) == ("True", "OneSlicePerReplica")
    svc.close()
