"""The RL examples' TPUTorchJobs (spec.groups) on the local cluster: the real KubeRay 1.5 operator
takes the groups' top-level labels and resources, and every group's pods land on their own pool
(the training slice and the rollout slice on the two v6e 2x2 pools, rollouts on the L4 GPU pool,
rewards on the CPU pool); the status counts the training slice's hosts only."""

from __future__ import annotations

import pytest

from namespaces import make_bucket_account
from operator_process import kubectl, operator, tputorch_crd  # noqa: F401 (fixtures)
from test_operator_e2e import apply, example, job_status, pods_of, wait_phase

from tputorch import train

# example -> group -> (node pool(s) its pods must be on, pods)
PLACEMENT = {
    "rl/tpu-tpu.yaml": {"tpu-slice": ({"tpu-v6e-2x2", "tpu-v6e-2x2-b"}, 1), "rollout": ({"tpu-v6e-2x2", "tpu-v6e-2x2-b"}, 1),
                        "reward": ({"cpu-pool"}, 1)},
    "rl/tpu-gpu.yaml": {"tpu-slice": ({"tpu-v6e-2x2", "tpu-v6e-2x2-b"}, 1), "rollout": ({"gpu-l4"}, 2),
                        "reward": ({"cpu-pool"}, 1)},
}


@pytest.mark.parametrize("path", sorted(PLACEMENT))
def test_rl_example_schedules_every_group_on_its_pool(kube, namespace, operator, dashboard, path):
    body = example(path)
    name = body["metadata"]["name"]
    make_bucket_account(kube, namespace)  # the example's spec.serviceAccountName, as the runbook makes it
    apply(kube, namespace, body)
    st = wait_phase(kube, namespace, name, "Running", 180)
    st = kube.wait(lambda: (lambda s: s if s.get("hostsReady") == "1/1" else None)(job_status(kube, namespace, name)),
                   120, "1/1 training hosts ready")
    want = PLACEMENT[path]

    def placed():
        workers = [p for p in pods_of(kube, namespace, name) if p.metadata.labels.get("ray.io/node-type") == "worker"
                   and p.status.phase == "Running"]
        return workers if len(workers) == sum(n for _, n in want.values()) else None

    workers = kube.wait(placed, 120, "every group's pods Running")
    pools = {n.metadata.name: n.metadata.labels["cloud.google.com/gke-nodepool"] for n in kube.core.list_node().items}
    by_group: dict[str, list] = {}
    for p in workers:
        by_group.setdefault(p.metadata.labels["ray.io/group"], []).append(p)
        # KubeRay put the group's Ray label on the pod too (its top-level labels field).
        assert p.metadata.labels[train.GROUP_LABEL] == p.metadata.labels["ray.io/group"], p.metadata.labels
    assert {g: len(ps) for g, ps in by_group.items()} == {g: n for g, (_, n) in want.items()}
    for group, (allowed, _) in want.items():
        assert {pools[p.spec.node_name] for p in by_group[group]} <= allowed, (group, [p.spec.node_name for p in by_group[group]])
    if path == "rl/tpu-tpu.yaml":  # two slices of the same shape: one per pool
        assert {pools[p.spec.node_name] for g in ("tpu-slice", "rollout") for p in by_group[g]} == {"tpu-v6e-2x2", "tpu-v6e-2x2-b"}
    # KubeRay passed the labels and the fence resource to `ray start` on the training slice.
    (trainer,) = by_group["tpu-slice"]
    command = " ".join(trainer.spec.containers[0].args or []) + " ".join(trainer.spec.containers[0].command or [])
    assert f"--labels={train.GROUP_LABEL}=tpu-slice" in command.replace(" --labels ", " --labels="), command
    assert train.TRAIN_RESOURCE in command, command
    assert st["hosts"] == 1 and st["workers"] == 4

    dashboard.set_job_status(namespace, name, "SUCCEEDED")
    wait_phase(kube, namespace, name, "Succeeded", 180)
