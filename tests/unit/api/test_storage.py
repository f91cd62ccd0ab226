"""spec.volumes, spec.gcsFuseSidecar and ephemeral-storage: parsed the same for both kinds, every
bad value named, and rendered the way GKE's Cloud Storage FUSE CSI driver documents."""

from decimal import Decimal

import pytest

from tputorch import render
from tputorch.api import quantity, spec, storage

from ..jobs import body
from ..services import service_body

GCS = {"name": "ckpt", "mountPath": "/mnt/ckpt", "gcs": {"bucket": "my-bucket", "mountOptions": ["implicit-dirs"]}}
PVC = {"name": "data", "mountPath": "/data", "readOnly": True, "pvc": {"claimName": "datasets"}}
SCRATCH = {"name": "scratch", "mountPath": "/scratch", "mountOn": ["worker"], "emptyDir": {"sizeLimit": "100Gi"}}


def errors_of(obj, parser=spec.parse):
    with pytest.raises(spec.InvalidSpec) as err:
        parser(obj)
    return [(e.path, e.message) for e in err.value.errors]


def pods(rayjob):
    cluster = rayjob["spec"].get("rayClusterSpec") or rayjob["spec"]["rayClusterConfig"]
    (worker,) = cluster["workerGroupSpecs"]
    return cluster["headGroupSpec"]["template"], worker["template"]


def test_three_kinds_of_volume_parse_with_their_defaults():
    job = spec.parse(body(volumes=[GCS, PVC, SCRATCH]))
    gcs, pvc, scratch = job.volumes
    assert (gcs.source, gcs.bucket, gcs.mount_options, gcs.read_only, gcs.mount_on) == (
        "gcs", "my-bucket", ("implicit-dirs",), False, ("head", "worker"))
    assert (pvc.source, pvc.claim_name, pvc.read_only) == ("pvc", "datasets", True)
    assert (scratch.source, scratch.size_limit, scratch.mount_on) == ("emptyDir", "100Gi", ("worker",))
    assert job.gcs_fuse_sidecar == {}


def test_no_volumes_render_no_storage_keys():
    head, worker = pods(render.rayjob(spec.parse(body())))
    for pod in (head, worker):
        assert "annotations" not in pod["metadata"] and "volumes" not in pod["spec"]
        assert "volumeMounts" not in pod["spec"]["containers"][0]


def fuse_mount(options: str) -> dict:
    """What gcsfuse presents for these mount options (its documented defaults: every file and
    directory owned by the mounting process, root in GKE's sidecar, with modes 0644 and 0755)."""
    opts = dict(o.split("=", 1) for o in options.split(",") if "=" in o) if options else {}
    return {"uid": int(opts.get("uid", 0)), "gid": int(opts.get("gid", 0)),
            "file": int(opts.get("file-mode", "644"), 8), "dir": int(opts.get("dir-mode", "755"), 8)}


def can_write(mount: dict, uid: int, gid: int) -> bool:
    """POSIX: may this user create files in the mount's directories and write its files?"""
    def allows(mode: int) -> bool:
        if uid == 0:
            return True
        if uid == mount["uid"]:
            return bool(mode & 0o200)
        return bool(mode & (0o020 if gid == mount["gid"] else 0o002))
    return allows(mount["dir"]) and allows(mount["file"])


def _gcs_options(**spec_fields) -> str:
    head, _ = pods(render.rayjob(spec.parse(body(volumes=[GCS], **spec_fields))))
    (volume,) = head["spec"]["volumes"]
    return volume["csi"]["volumeAttributes"].get("mountOptions", "")


def test_a_gcs_volume_is_writable_by_the_non_root_ray_user():
    """The Ray containers run as 1000:100: without uid/gid/modes gcsfuse's files are root's, 0644,
    and a checkpoint write gets Permission denied (the control); the rendered options let the
    containers' own user, and only the users it names, write."""
    assert not can_write(fuse_mount("implicit-dirs"), 1000, 100)
    options = _gcs_options()
    assert can_write(fuse_mount(options), 1000, 100) and not can_write(fuse_mount(options), 2000, 2000)
    assert "implicit-dirs" in options.split(",")
    # spec.securityContext's user is the owner
    assert can_write(fuse_mount(_gcs_options(securityContext={"runAsUser": 1234, "runAsGroup": 5678})), 1234, 5678)
    # root needs no option, and none is added
    assert _gcs_options(securityContext={"runAsUser": 0}) == "implicit-dirs"


def test_the_users_own_owner_options_win():
    volume = {**GCS, "gcs": {"bucket": "my-bucket", "mountOptions": ["uid=2000", "file-mode=600"]}}
    head, _ = pods(render.rayjob(spec.parse(body(volumes=[volume]))))
    assert head["spec"]["volumes"][0]["csi"]["volumeAttributes"]["mountOptions"] == \
        "gid=100,dir-mode=775,uid=2000,file-mode=600"


def test_gcs_volume_is_gkes_csi_form_with_the_sidecar_annotation_on_the_pods_that_mount_it():
    sidecar = {"cpuLimit": "0", "memoryLimit": "0", "ephemeralStorageLimit": "0", "cpuRequest": "500m",
               "memoryRequest": "1Gi", "ephemeralStorageRequest": "50Gi"}
    only_workers = {**GCS, "mountOn": ["worker"], "gcs": {"bucket": "my-bucket", "mountOptions": ["implicit-dirs", "file-cache:max-size-mb:-1"]}}
    head, worker = pods(render.rayjob(spec.parse(body(volumes=[only_workers], gcsFuseSidecar=sidecar))))
    assert worker["spec"]["volumes"] == [{"name": "ckpt", "csi": {
        "driver": "gcsfuse.csi.storage.gke.io", "readOnly": False,
        "volumeAttributes": {"bucketName": "my-bucket", "mountOptions":
                             "uid=1000,gid=100,file-mode=664,dir-mode=775,implicit-dirs,file-cache:max-size-mb:-1"}}}]
    assert worker["metadata"]["annotations"] == {
        "gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0",
        "gke-gcsfuse/ephemeral-storage-limit": "0", "gke-gcsfuse/cpu-request": "500m",
        "gke-gcsfuse/memory-request": "1Gi", "gke-gcsfuse/ephemeral-storage-request": "50Gi"}
    assert worker["spec"]["containers"][0]["volumeMounts"] == [{"name": "ckpt", "mountPath": "/mnt/ckpt"}]
    # The head mounts nothing: no volume, no annotation (the webhook would inject a sidecar for nothing).
    assert "annotations" not in head["metadata"] and "volumes" not in head["spec"]


def test_pvc_and_empty_dir_render_without_the_fuse_annotation():
    head, worker = pods(render.rayjob(spec.parse(body(volumes=[PVC, SCRATCH]))))
    assert head["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}]
    assert head["spec"]["containers"][0]["volumeMounts"] == [{"name": "data", "mountPath": "/data", "readOnly": True}]
    assert worker["spec"]["volumes"][1] == {"name": "scratch", "emptyDir": {"sizeLimit": "100Gi"}}
    assert [m["name"] for m in worker["spec"]["containers"][0]["volumeMounts"]] == ["data", "scratch"]
    assert "annotations" not in head["metadata"] and "annotations" not in worker["metadata"]


def test_ephemeral_storage_is_requested_and_limited_per_role():
    head, worker = pods(render.rayjob(spec.parse(body(head={"ephemeralStorage": "20Gi"}, worker={"ephemeralStorage": "200Gi"}))))
    assert head["spec"]["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "20Gi"
    assert worker["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "200Gi"
    head, worker = pods(render.rayjob(spec.parse(body())))
    assert "ephemeral-storage" not in worker["spec"]["containers"][0]["resources"]["requests"]


def test_a_service_takes_the_same_block():
    svc = spec.parse_service(service_body(volumes=[{**GCS, "readOnly": True}], gcsFuseSidecar={"memoryLimit": "4Gi"}))
    head, worker = pods(render.rayservice(svc))
    for pod in (head, worker):
        # issue 56: no sidecar limits (Google's RayService TPU sample's "0"s) but the one the spec sets
        assert pod["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true", "gke-gcsfuse/memory-limit": "4Gi",
                                                  "gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0"}
        assert pod["spec"]["volumes"][0]["csi"]["readOnly"] is True
    assert errors_of(service_body(volumes=[{"name": "x"}]), spec.parse_service)


@pytest.mark.parametrize("volumes,path,fragment", [
    ("bucket", "spec.volumes", "must be a list"),
    ([GCS] * 2, "spec.volumes[1].name", "must be unique"),
    ([GCS, {**PVC, "mountPath": "/mnt/ckpt/"}], "spec.volumes[1].mountPath", "must differ from the mountPath of volume ckpt in the head container"),
    ([{**GCS, "name": "Ckpt"}], "spec.volumes[0].name", "DNS-1123 label"),
    ([{**GCS, "name": "shared-mem"}], "spec.volumes[0].name", "KubeRay's /dev/shm volume"),
    ([{**GCS, "mountPath": "relative"}], "spec.volumes[0].mountPath", "absolute path"),
    ([{**GCS, "mountPath": "/dev/shm"}], "spec.volumes[0].mountPath", "KubeRay mounts shared memory there"),
    ([{**GCS, "mountPath": "/a/../b"}], "spec.volumes[0].mountPath", "must not contain '..'"),
    ([{**GCS, "mountOn": ["driver"]}], "spec.volumes[0].mountOn", "must list head and/or worker"),
    ([{**GCS, "mountOn": []}], "spec.volumes[0].mountOn", "must list head and/or worker"),
    ([{**GCS, "pvc": {"claimName": "x"}}], "spec.volumes[0]", "must have exactly one of gcs, pvc, emptyDir"),
    ([{"name": "n", "mountPath": "/n"}], "spec.volumes[0]", "must have exactly one of gcs, pvc, emptyDir"),
    ([{**GCS, "gcs": {"bucket": "gs://my-bucket"}}], "spec.volumes[0].gcs.bucket", "without gs://"),
    ([{**GCS, "gcs": {"bucket": "my-bucket", "mountOptions": ["a,b"]}}], "spec.volumes[0].gcs.mountOptions[0]", "without commas"),
    ([{**GCS, "gcs": {"bucket": "b1", "onlyDir": "x"}}], "spec.volumes[0].gcs.onlyDir", "is not a known field"),
    ([{**PVC, "pvc": {"claimName": "Bad_Name"}}], "spec.volumes[0].pvc.claimName", "PersistentVolumeClaim name"),
    ([{**SCRATCH, "emptyDir": {"sizeLimit": "lots"}}], "spec.volumes[0].emptyDir.sizeLimit", "Kubernetes quantity"),
    ([{**SCRATCH, "emptyDir": {"medium": "HugePages"}}], "spec.volumes[0].emptyDir.medium", "Memory"),
    ([{**SCRATCH, "readOnly": True}], "spec.volumes[0].readOnly", "nothing could ever write to it"),
    ([{**GCS, "size": 1}], "spec.volumes[0].size", "is not a known field"),
    ([{**GCS, "name": "gke-gcsfuse-cache"}], "spec.volumes[0].name", "takes it as its file cache (set gcs.fileCache)"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {}}}], "spec.volumes[0].gcs.fileCache.capacity", "is required"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {"capacity": "0Gi"}}}], "spec.volumes[0].gcs.fileCache.capacity",
     "must be greater than zero (leave fileCache out for no cache)"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {"capacity": "lots"}}}], "spec.volumes[0].gcs.fileCache.capacity", "Kubernetes quantity"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {"capacity": "1Gi", "medium": "SSD"}}}], "spec.volumes[0].gcs.fileCache.medium",
     "must be \"\" (the node's disk) or Memory"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {"capacity": "1Gi", "ttl": 5}}}], "spec.volumes[0].gcs.fileCache.ttl", "is not a known field"),
    ([{**GCS, "gcs": {"bucket": "b1", "fileCache": {"capacity": "1Gi"}}},
      {**GCS, "name": "b", "mountPath": "/b", "gcs": {"bucket": "b2", "fileCache": {"capacity": "1Gi", "medium": "Memory"}}}],
     "spec.volumes", "gcs.fileCache.medium must be the same for every gcs volume with a fileCache mounted on the head"),
    ([dict(GCS, name=f"v{i}", mountPath=f"/v{i}") for i in range(storage.MAX_VOLUMES + 1)], "spec.volumes", "at most 16 volumes"),
])
def test_bad_volumes_are_named(volumes, path, fragment):
    found = errors_of(body(volumes=volumes))
    assert any(p == path and fragment in m for p, m in found), found


def test_sidecar_settings_need_a_gcs_volume_and_quantities():
    assert ("spec.gcsFuseSidecar", "must not be set without a gcs volume in spec.volumes: there is no sidecar to size") in errors_of(
        body(volumes=[PVC], gcsFuseSidecar={"cpuLimit": "1"}))
    found = errors_of(body(volumes=[GCS], gcsFuseSidecar={"cpuLimit": "one", "gpu": "1"}))
    assert [p for p, _ in found] == ["spec.gcsFuseSidecar.gpu", "spec.gcsFuseSidecar.cpuLimit"]


def test_bad_ephemeral_storage_is_named():
    assert ("spec.worker.ephemeralStorage", "must be a Kubernetes quantity such as 4, 500m, 16Gi") in errors_of(
        body(worker={"ephemeralStorage": "big"}))


def test_a_file_cache_is_the_csi_drivers_attributes_and_the_pods_cache_volume():
    weights = {"name": "weights", "mountPath": "/models", "readOnly": True, "mountOn": ["worker"],
               "gcs": {"bucket": "my-models", "fileCache": {"capacity": "200Gi"}}}
    head, worker = pods(render.rayjob(spec.parse(body(volumes=[weights, GCS]))))
    csi = worker["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    assert csi == {"bucketName": "my-models", "fileCacheCapacity": "200Gi", "fileCacheForRangeRead": "true",
                   "mountOptions": "uid=1000,gid=100,file-mode=664,dir-mode=775,file-cache:enable-parallel-downloads:true"}
    # One cache volume per pod, larger than what its cached buckets may hold (issue 56: the driver
    # wants it larger; 200Gi + 5%); none where nothing is cached.
    assert worker["spec"]["volumes"][-1] == {"name": "gke-gcsfuse-cache", "emptyDir": {"sizeLimit": "210Gi"}}
    assert "gke-gcsfuse-cache" not in [v["name"] for v in head["spec"]["volumes"]]
    assert [m["name"] for m in worker["spec"]["containers"][0]["volumeMounts"]] == ["weights", "ckpt"]  # the sidecar's, not Ray's


def test_file_caches_share_the_pods_cache_volume_and_the_users_options_win():
    a = {"name": "a", "mountPath": "/a", "gcs": {"bucket": "b-a", "fileCache": {"capacity": "1Gi", "medium": "Memory"}}}
    b = {"name": "b", "mountPath": "/b", "gcs": {"bucket": "b-b", "mountOptions": ["file-cache:enable-parallel-downloads:false"],
                                                 "fileCache": {"capacity": "512Mi", "medium": "Memory", "parallelDownloads": True}}}
    c = {"name": "c", "mountPath": "/c", "gcs": {"bucket": "b-c", "fileCache": {"capacity": "1Gi", "medium": "Memory",
                                                                              "parallelDownloads": False}}}
    head, _ = pods(render.rayjob(spec.parse(body(volumes=[a, b, c]))))
    # 2.5Gi of capacities; 5% of it (128Mi) is below the 1Gi floor of the margin
    assert head["spec"]["volumes"][-1] == {"name": "gke-gcsfuse-cache", "emptyDir": {"sizeLimit": "3584Mi", "medium": "Memory"}}
    options = [v["csi"]["volumeAttributes"]["mountOptions"].split(",") for v in head["spec"]["volumes"][:3]]
    assert options[0][-1] == "file-cache:enable-parallel-downloads:true"
    assert options[1][-1] == "file-cache:enable-parallel-downloads:false" and len(options[1]) == 5
    assert not any(o.startswith("file-cache") for o in options[2])


# Ephemeral storage for what lands on the node's disk. The expected values below are worked out by
# hand from the rule (storage.DISK_HEADROOM = 10Gi): the volumes of known size on the disk, plus 10Gi,
# requested without a limit when spec.<role>.ephemeralStorage is unset. The file cache's volume is its
# capacity plus 5% (at least 1Gi): 200Gi of cache is a 210Gi volume.
WEIGHTS = {"name": "weights", "mountPath": "/models", "readOnly": True, "mountOn": ["worker"],
           "gcs": {"bucket": "my-models", "fileCache": {"capacity": "200Gi"}}}


def ray_resources(pod):
    return pod["spec"]["containers"][0]["resources"]


def test_a_workers_cache_and_scratch_on_the_disk_are_requested_with_headroom_and_not_limited():
    volumes = [WEIGHTS, SCRATCH,  # 200Gi cache (210Gi volume) + 100Gi scratch on the workers' disk
               {"name": "shm2", "mountPath": "/shm2", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},  # RAM
               {"name": "open", "mountPath": "/open", "emptyDir": {}},  # no size to reserve
               PVC]  # not on the node's disk
    head, worker = pods(render.rayjob(spec.parse(body(volumes=volumes))))
    assert ray_resources(worker)["requests"]["ephemeral-storage"] == "320Gi"
    assert "ephemeral-storage" not in ray_resources(worker)["limits"]
    # cpu, memory and the chips stay requests = limits
    assert {k: v for k, v in ray_resources(worker)["requests"].items() if k != "ephemeral-storage"} == ray_resources(worker)["limits"]
    # the head mounts only the RAM, open and PVC volumes: nothing of known size on its disk
    assert "ephemeral-storage" not in ray_resources(head)["requests"]


def test_units_mix_into_whole_bytes():
    from kubernetes.utils import parse_quantity

    volumes = [{**WEIGHTS, "gcs": {"bucket": "my-models", "fileCache": {"capacity": "100G"}}},
               {**SCRATCH, "emptyDir": {"sizeLimit": "50Gi"}}]
    _, worker = pods(render.rayjob(spec.parse(body(volumes=volumes))))
    asked = ray_resources(worker)["requests"]["ephemeral-storage"]
    # 100G of cache + 5% (5e9 bytes, rounded up to 4769Mi) + 50Gi + 10Gi
    assert parse_quantity(asked) == 100 * 10**9 + 4769 * 2**20 + 50 * 2**30 + 10 * 2**30


def test_a_cache_in_memory_asks_no_ephemeral_storage():
    weights = {**WEIGHTS, "gcs": {"bucket": "my-models", "fileCache": {"capacity": "200Gi", "medium": "Memory"}}}
    _, worker = pods(render.rayjob(spec.parse(body(volumes=[weights]))))
    assert "ephemeral-storage" not in ray_resources(worker)["requests"]


def test_the_head_gets_its_own_volumes_sum():
    tmp = {"name": "tmp", "mountPath": "/tmp/x", "mountOn": ["head"], "emptyDir": {"sizeLimit": "10Gi"}}
    head, worker = pods(render.rayjob(spec.parse(body(volumes=[tmp, WEIGHTS]))))
    assert ray_resources(head)["requests"]["ephemeral-storage"] == "20Gi"
    assert ray_resources(worker)["requests"]["ephemeral-storage"] == "220Gi"


def test_a_service_sizes_its_hosts_the_same_way():
    svc = spec.parse_service(service_body(volumes=[WEIGHTS]))
    _, worker = pods(render.rayservice(svc))
    assert ray_resources(worker)["requests"]["ephemeral-storage"] == "220Gi"
    assert "ephemeral-storage" not in ray_resources(worker)["limits"]


def test_a_groups_pods_mount_the_workers_volumes_and_ask_for_their_disk():
    job = spec.parse(body(volumes=[WEIGHTS], groups=[{"name": "verifier", "replicas": 2, "cpu": "4", "memory": "16Gi"}]))
    cluster = render.rayjob(job)["spec"]["rayClusterSpec"]
    verifier = next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == "verifier")
    resources = ray_resources(verifier["template"])
    assert resources["requests"] == {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "220Gi"}
    assert resources["limits"] == {"cpu": "4", "memory": "16Gi"}


def test_a_given_ephemeral_storage_that_holds_the_volumes_is_kept_as_request_and_limit():
    # 210Gi of cache volume + 100Gi of scratch + 10Gi for the container's own writes
    _, worker = pods(render.rayjob(spec.parse(body(volumes=[WEIGHTS, SCRATCH], worker={"ephemeralStorage": "320Gi"}))))
    assert ray_resources(worker)["requests"]["ephemeral-storage"] == "320Gi"
    assert ray_resources(worker)["limits"]["ephemeral-storage"] == "320Gi"
    # the sidecar has no limits whatever the Ray container's (issue 56: what Google's RayService TPU
    # sample sets); the pod's disk limit is then the Ray container's alone
    assert {k: worker["metadata"]["annotations"][k] for k in
            ("gke-gcsfuse/cpu-limit", "gke-gcsfuse/memory-limit", "gke-gcsfuse/ephemeral-storage-limit")} == \
        {"gke-gcsfuse/cpu-limit": "0", "gke-gcsfuse/memory-limit": "0", "gke-gcsfuse/ephemeral-storage-limit": "0"}


# 310Gi: exactly the volumes (once they are full, the first log line passes the pod's limit);
# 311Gi: the volumes plus 0.2.0's 1Gi, no room for Ray's rotated logs and ~/.cache (issue 56)
@pytest.mark.parametrize("given", ["310Gi", "311Gi", "319Gi"])
@pytest.mark.parametrize("parser,make", [(spec.parse, body), (spec.parse_service, service_body)])
def test_a_given_ephemeral_storage_smaller_than_the_volumes_is_refused(parser, make, given):
    with pytest.raises(spec.InvalidSpec) as err:
        parser(make(volumes=[WEIGHTS, SCRATCH], worker={"ephemeralStorage": given}))
    (e,) = [e for e in err.value.errors if e.path == "spec.worker.ephemeralStorage"]
    assert e.value == given
    assert e.message.startswith("must be at least 320Gi: the worker pod's volumes on the node's disk")
    assert "plus 10Gi for the container's own logs, ~/.cache and writable layer" in e.message
    assert "gke-gcsfuse-cache (weights gcs.fileCache.capacity 200Gi + 5%, at least 1Gi) 210Gi" in e.message
    assert "scratch emptyDir.sizeLimit 100Gi" in e.message


def test_a_head_ephemeral_storage_is_checked_against_the_heads_volumes_only():
    # 5Gi holds nothing of the workers' 300Gi, and the head mounts none of it: accepted.
    head, _ = pods(render.rayjob(spec.parse(body(volumes=[WEIGHTS, SCRATCH], head={"ephemeralStorage": "5Gi"}))))
    assert ray_resources(head)["limits"]["ephemeral-storage"] == "5Gi"
    tmp = {"name": "tmp", "mountPath": "/tmp/x", "mountOn": ["head"], "emptyDir": {"sizeLimit": "10Gi"}}
    assert ("spec.head.ephemeralStorage" in [p for p, _ in errors_of(body(volumes=[tmp], head={"ephemeralStorage": "9Gi"}))])


@pytest.mark.parametrize("count,text", [(200 * 2**30, "200Gi"), (1536 * 2**20, "1536Mi"), (1000, "1000"),
                                        (Decimal("0.5"), "1"), (2**30 + 1, "1073741825")])
def test_bytes_read_back_as_the_same_quantity(count, text):
    assert quantity.bytes_quantity(count) == text


@pytest.mark.parametrize("sidecar_limit,ok", [("0", True), ("320Gi", True), ("400Gi", True), ("319Gi", False), ("311Gi", False),
                                               ("5Gi", False)])
def test_a_sidecar_disk_limit_that_would_limit_the_whole_pod_is_refused(sidecar_limit, ok):
    """With spec.worker.ephemeralStorage unset the Ray container has no limit, so the kubelet's pod
    limit is the sidecar's alone, and the 310Gi of volumes (+10Gi) count against it."""
    def sidecar_errors(obj):
        try:
            spec.parse(obj)
        except spec.InvalidSpec as err:
            return [(e.path, e.message) for e in err.errors if e.path == "spec.gcsFuseSidecar.ephemeralStorageLimit"]
        return []

    errors = sidecar_errors(body(volumes=[WEIGHTS, SCRATCH], gcsFuseSidecar={"ephemeralStorageLimit": sidecar_limit}))
    assert (not errors) == ok, errors
    if not ok:
        assert errors[0][1].startswith('must be "0" (none) or at least 320Gi while spec.worker.ephemeralStorage is unset')
    # a Ray container with a limit of its own makes the pod's limit the sum: any sidecar limit is fine
    assert not sidecar_errors(body(volumes=[WEIGHTS, SCRATCH], gcsFuseSidecar={"ephemeralStorageLimit": "5Gi"},
                                   worker={"ephemeralStorage": "320Gi"}))


@pytest.mark.parametrize("sidecar,asked", [
    ({}, "5Gi"),  # limit "0" (ours) and no request: the webhook's default request
    ({"ephemeralStorageLimit": "0"}, "5Gi"),
    ({"ephemeralStorageLimit": "400Gi"}, "400Gi"),  # a limit without a request: the webhook sets request := limit
    ({"ephemeralStorageLimit": "400Gi", "ephemeralStorageRequest": "2Gi"}, "2Gi"),
    ({"ephemeralStorageRequest": "0"}, None),  # "0": no request at all
])
def test_the_sidecars_disk_request_is_what_the_drivers_webhook_sets(sidecar, asked):
    """Issue 56: GKE's webhook makes a sidecar's request its limit annotation when only that is
    given, and takes its default request when the limit is "0" (no limit) and no request is given."""
    job = spec.parse(body(volumes=[WEIGHTS], gcsFuseSidecar=sidecar))
    assert storage.sidecar_disk_request(job.volumes, job.gcs_fuse_sidecar, "worker") == asked
    assert storage.sidecar_disk_request(job.volumes, job.gcs_fuse_sidecar, "head") is None  # mounted on the workers
