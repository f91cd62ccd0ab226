"""spec.volumes and spec.gcsFuseSidecar: storage the Ray pods mount, shared by both kinds.

Three kinds of volume cover what training and serving on GKE need: a Cloud Storage bucket through
GKE's Cloud Storage FUSE CSI driver (checkpoints, datasets, model weights, the XLA compile cache),
a PersistentVolumeClaim, and an emptyDir for scratch. Each volume is mounted at one path in the
head's and/or the workers' container (``mountOn``); a pod gets only the volumes its container
mounts. The parse functions write their errors to the spec parser's reader; the CRD (schema.py)
builds its schema from the constants here; render/volumes.py puts them into the pods.
"""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Mapping

from .quantity import ZERO_QUANTITY, bytes_quantity, quantity, quantity_value

# spec.gcsFuseSidecar field -> the pod annotation GKE documents for it (the annotations that size
# GKE's Cloud Storage FUSE sidecar).
SIDECAR_ANNOTATIONS = {
    "cpuRequest": "gke-gcsfuse/cpu-request",
    "cpuLimit": "gke-gcsfuse/cpu-limit",
    "memoryRequest": "gke-gcsfuse/memory-request",
    "memoryLimit": "gke-gcsfuse/memory-limit",
    "ephemeralStorageRequest": "gke-gcsfuse/ephemeral-storage-request",
    "ephemeralStorageLimit": "gke-gcsfuse/ephemeral-storage-limit",
}

MAX_VOLUMES = 16
MAX_MOUNT_OPTIONS = 32
ROLES = ("head", "worker")
VOLUME_FIELDS = {"name", "mountPath", "readOnly", "mountOn", "gcs", "pvc", "emptyDir"}
SOURCES = ("gcs", "pvc", "emptyDir")
GCS_FIELDS = {"bucket", "mountOptions", "fileCache"}
# spec.volumes[].gcs.fileCache: Cloud Storage FUSE's file cache, so that a file read once (a model's
# weights, at every replica start, retry and upgrade on the node) is read from the node afterwards
# and, with parallel downloads, fetched at many streams at once on its first read. The cache lives in
# the pod's volume named CACHE_VOLUME, which GKE's sidecar uses when the pod has one: an emptyDir the
# operator adds, sized above the capacities of the pod's cached volumes ("" the node's boot disk,
# Memory the host's RAM; either counts against the pod's memory or ephemeral storage).
FILE_CACHE_FIELDS = {"capacity", "medium", "parallelDownloads"}
CACHE_VOLUME = "gke-gcsfuse-cache"
PVC_FIELDS = {"claimName"}
EMPTY_DIR_FIELDS = {"sizeLimit", "medium"}
EMPTY_DIR_MEDIA = ("", "Memory")
# KubeRay adds /dev/shm (volume shared-mem) to every Ray container, and ray-logs with the autoscaler.
RESERVED_VOLUME_NAMES = {"shared-mem": "KubeRay's /dev/shm volume", "ray-logs": "KubeRay's log volume with the autoscaler",
                         "autoscaler-api-token": "the operator's API token volume of KubeRay's autoscaler",
                         CACHE_VOLUME: "GKE's Cloud Storage FUSE sidecar takes it as its file cache (set gcs.fileCache)",
                         "gke-gcsfuse-tmp": "GKE's Cloud Storage FUSE sidecar takes it as its temp directory",
                         "gke-gcsfuse-buffer": "GKE's Cloud Storage FUSE sidecar takes it as its write buffer"}
RESERVED_MOUNT_PATHS = {
    "/dev/shm": "KubeRay mounts shared memory there",
    "/proc": "the container runtime refuses a mount over /proc",
    # /var/run is /run in the Ray images: both spellings are the same directory
    "/var/run/secrets/kubernetes.io/serviceaccount": "Kubernetes mounts the ServiceAccount token there",
    "/run/secrets/kubernetes.io/serviceaccount": "Kubernetes mounts the ServiceAccount token there (/var/run is /run)",
}
# The admission-time form of RESERVED_MOUNT_PATHS for the CRD ([.] for a dot: it goes into a CEL literal).
RESERVED_MOUNT_PATTERN = "^/+(" + "|".join(p.strip("/").replace(".", "[.]") for p in RESERVED_MOUNT_PATHS) + ")(/.*)?$"

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Cloud Storage bucket names: 3-63 characters (up to 222 with dots) of lowercase letters, digits,
# '-', '_' and '.', starting and ending with a letter or digit.
BUCKET = re.compile(r"^[a-z0-9][-_.a-z0-9]{1,220}[a-z0-9]$")
CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True)
class FileCache:
    capacity: str  # a quantity: the CSI driver's fileCacheCapacity
    medium: str  # of the pod's CACHE_VOLUME: "" or Memory
    parallel_downloads: bool


@dataclass(frozen=True)
class Volume:
    name: str
    mount_path: str
    read_only: bool
    mount_on: tuple[str, ...]  # "head", "worker"
    source: str  # one of SOURCES
    bucket: str | None = None
    mount_options: tuple[str, ...] = ()
    claim_name: str | None = None
    size_limit: str | None = None
    medium: str = ""
    file_cache: FileCache | None = None  # gcs only


def _problem_path(v: str) -> str | None:
    if not v.startswith("/"):
        return "must be an absolute path"
    if len(v) > 1024:
        return "must be at most 1024 characters"
    if ".." in v.split("/"):
        return "must not contain '..'"
    if posixpath.normpath(v) == "/":
        return "must not be /"
    normal = "/" + posixpath.normpath(v).lstrip("/")  # normpath keeps a leading //
    for reserved, why in RESERVED_MOUNT_PATHS.items():
        if normal == reserved or normal.startswith(reserved + "/"):
            return f"must not be {reserved} or under it: {why}"
    return None


def _check_name(v: str) -> str | None:
    if len(v) > 63 or not DNS1123_LABEL.fullmatch(v):
        return "must be a DNS-1123 label (at most 63 lowercase letters, digits and '-')"
    if v in RESERVED_VOLUME_NAMES:
        return f"must not be {v}: {RESERVED_VOLUME_NAMES[v]}"
    return None


def check_bucket(v: str) -> str | None:
    if not BUCKET.fullmatch(v) or (len(v) > 63 and "." not in v):
        return "must be a Cloud Storage bucket name (3-63 characters of a-z, 0-9, '-', '_', '.'), without gs://"
    return None


def parse_volumes(r, spec: Mapping) -> tuple[Volume, ...]:
    """spec.volumes; ``r`` is the spec parser's reader."""
    items = r.value(spec, "volumes", "spec.volumes", list, default=[])
    if len(items) > MAX_VOLUMES:
        r.error("spec.volumes", f"{len(items)} volumes", f"must have at most {MAX_VOLUMES} volumes")
        return ()
    volumes = []
    names: set[str] = set()
    paths: dict[tuple[str, str], str] = {}
    for i, item in enumerate(items):
        path = f"spec.volumes[{i}]"
        if not isinstance(item, Mapping):
            r.error(path, item, "must be an object with name, mountPath and one of gcs, pvc, emptyDir")
            continue
        for unknown in sorted(set(map(str, item)) - VOLUME_FIELDS):
            r.error(f"{path}.{unknown}", item[unknown], f"is not a known field; known: {', '.join(sorted(VOLUME_FIELDS))}")
        name = r.value(item, "name", f"{path}.name", str, required=True, check=_check_name)
        mount_path = r.value(item, "mountPath", f"{path}.mountPath", str, required=True, check=_problem_path)
        read_only = r.value(item, "readOnly", f"{path}.readOnly", bool, default=False)
        mount_on = r.value(item, "mountOn", f"{path}.mountOn", list, default=list(ROLES))
        bad_roles = [x for x in mount_on if x not in ROLES]
        if bad_roles or not mount_on or len(set(mount_on)) != len(mount_on):
            r.error(f"{path}.mountOn", mount_on, "must list head and/or worker, each at most once")
            mount_on = []
        given = [s for s in SOURCES if item.get(s) is not None]
        if len(given) != 1:
            r.error(path, ", ".join(given) or None, f"must have exactly one of {', '.join(SOURCES)}")
        if name is not None:
            if name in names:
                r.error(f"{path}.name", name, "must be unique within spec.volumes")
            names.add(name)
        if mount_path is not None:
            normal = posixpath.normpath(mount_path)
            for role in mount_on:
                if (role, normal) in paths:
                    r.error(f"{path}.mountPath", mount_path, f"must differ from the mountPath of volume {paths[(role, normal)]} in the {role} container")
                paths[(role, normal)] = name or str(i)
        if len(given) != 1 or name is None or mount_path is None or not mount_on:
            continue
        source = given[0]
        block = r.mapping(item, source, f"{path}.{source}", {"gcs": GCS_FIELDS, "pvc": PVC_FIELDS, "emptyDir": EMPTY_DIR_FIELDS}[source])
        fields: dict[str, Any] = {}
        if source == "gcs":
            fields["bucket"] = r.value(block, "bucket", f"{path}.gcs.bucket", str, required=True, check=check_bucket)
            options = r.value(block, "mountOptions", f"{path}.gcs.mountOptions", list, default=[])
            if len(options) > MAX_MOUNT_OPTIONS:
                r.error(f"{path}.gcs.mountOptions", f"{len(options)} options", f"must have at most {MAX_MOUNT_OPTIONS} options")
                options = []
            for j, option in enumerate(options):
                # The CSI driver takes them as one comma-separated string.
                if not isinstance(option, str) or not option or "," in option or len(option) > 256:
                    r.error(f"{path}.gcs.mountOptions[{j}]", option, "must be a non-empty string without commas, such as implicit-dirs")
            fields["mount_options"] = tuple(o for o in options if isinstance(o, str))
            fields["file_cache"] = _parse_file_cache(r, block, f"{path}.gcs.fileCache")
        elif source == "pvc":
            fields["claim_name"] = r.value(block, "claimName", f"{path}.pvc.claimName", str, required=True,
                                           check=lambda v: None if len(v) <= 253 and CLAIM_NAME.fullmatch(v) else "must be a PersistentVolumeClaim name (a DNS subdomain)")
        else:
            size = r.value(block, "sizeLimit", f"{path}.emptyDir.sizeLimit", (str, int), check=quantity)
            fields["size_limit"] = None if size is None else str(size)
            fields["medium"] = r.value(block, "medium", f"{path}.emptyDir.medium", str, default="", check=_medium_problem)
            if read_only:
                r.error(f"{path}.readOnly", read_only, "must not be true for an emptyDir: nothing could ever write to it")
        volumes.append(Volume(name=name, mount_path=mount_path, read_only=read_only,
                              mount_on=tuple(x for x in ROLES if x in mount_on), source=source, **fields))
    check_file_caches(r, tuple(volumes))
    return tuple(volumes)


def _medium_problem(v: str) -> str | None:
    """An emptyDir's medium: the scratch volume's and the file cache's."""
    return None if v in EMPTY_DIR_MEDIA else "must be \"\" (the node's disk) or Memory"


def _parse_file_cache(r, gcs: Mapping, path: str) -> FileCache | None:
    block = r.mapping(gcs, "fileCache", path, FILE_CACHE_FIELDS)
    if not isinstance(gcs.get("fileCache"), Mapping):
        return None

    def positive(v) -> str | None:
        if problem := quantity(v):
            return problem
        return "must be greater than zero (leave fileCache out for no cache)" if ZERO_QUANTITY.fullmatch(str(v)) else None

    capacity = r.value(block, "capacity", f"{path}.capacity", (str, int), required=True, check=positive)
    medium = r.value(block, "medium", f"{path}.medium", str, default="", check=_medium_problem)
    parallel = r.value(block, "parallelDownloads", f"{path}.parallelDownloads", bool, default=True)
    if capacity is None or medium is None or parallel is None:
        return None
    return FileCache(capacity=str(capacity), medium=medium, parallel_downloads=parallel)


def check_file_caches(r, volumes: tuple[Volume, ...]) -> None:
    """A pod has one cache volume: the cached gcs volumes it mounts must agree on its medium."""
    for role in ROLES:
        media = sorted({v.file_cache.medium for v in volumes if v.file_cache and role in v.mount_on})
        if len(media) > 1:
            r.error("spec.volumes", media, f"gcs.fileCache.medium must be the same for every gcs volume with a fileCache "
                    f"mounted on the {role}: a pod has one file cache volume ({CACHE_VOLUME})")
            return


# What of a pod lands on its node's disk with a size the spec gives: the cache volume (the capacities
# of the pod's cached buckets) and each emptyDir with a sizeLimit, unless medium Memory (RAM, counted
# as the pod's memory). The kubelet counts them in the pod's ephemeral storage and evicts the pod when
# one outgrows its sizeLimit or the pod its containers' limits, but the scheduler places a pod by its
# containers' ephemeral-storage requests alone, never by a sizeLimit: without a request, a TPU host
# whose cache will hold 200Gi may land on a node with 47 GB allocatable (GKE's 100 GB boot disk) and
# lose its slice when the cache fills. An emptyDir without a sizeLimit has no size to reserve.
#
# The Ray container therefore requests the volumes plus DISK_HEADROOM, without a limit. Headroom:
# under disk pressure the kubelet evicts first the pods whose usage exceeds their request, and a
# request of the volumes alone is exceeded by the first line of log once they are full. What the
# container writes itself beside the volumes: Ray's session logs under /tmp/ray, which Ray 2.60
# rotates per file at 512 MiB with 5 backups (ray._common.ray_constants LOGGING_ROTATE_BYTES,
# LOGGING_ROTATE_BACKUP_COUNT: up to 3 GiB for each busy file, and a host under load has several:
# the raylet's, the Serve replica's and the engine workers' out and err), and ~/.cache (vLLM's
# assets and compiled graphs, torch's and huggingface_hub's caches when no cacheVolume holds them),
# with the runtime's rotated stdout log and the writable layer. 10Gi holds two full rotated log
# files and 4Gi of caches; the 1Gi it replaces (0.2.0) was below one. It costs a tenth of GKE's
# default 100 GB boot disk, next to volumes of tens of Gi. A checkpoint downloaded from the Hub
# into the container (model.source a repo id without model.cacheVolume) is not counted: its size
# is unknown here; the docs say to set ephemeralStorage or use a volume. No limit:
# a limit would evict the slice at a number the operator guessed (the container's own writes above
# it, or, as the kubelet sums the containers' limits into a pod-level one, the pod's emptyDirs
# above it), while each volume is bounded already by its own sizeLimit (the cache by its capacity).
# A pod with nothing of known size on the disk gets no request, as before. A set ephemeralStorage
# that held the volumes plus 0.2.0's 1Gi is refused for a new generation only (status/rendering.py
# keeps the child of a generation an earlier operator accepted running, RefusedByThisVersion).
DISK_HEADROOM = "10Gi"


@dataclass(frozen=True)
class NodeDisk:
    """The volumes of one role's pod that land on the node's disk: (what, quantity) each."""

    parts: tuple[tuple[str, str], ...] = ()

    @property
    def total(self) -> Decimal:
        return sum((quantity_value(q) for _, q in self.parts), Decimal(0))

    def text(self) -> str:
        return ", ".join(f"{what} {q}" for what, q in self.parts)


# The file cache's volume (CACHE_VOLUME) is sized above the caches' fileCacheCapacity: gcsfuse keeps
# the files it caches within the capacity by their sizes, while the kubelet measures the emptyDir by
# the space it takes (each file rounded up to whole blocks, the directories, a file still being
# downloaded in parallel chunks), and an emptyDir over its sizeLimit evicts the pod, i.e. the whole
# slice of a multi-host replica; the CSI driver asks for the volume to be larger than the capacity.
# The margin: 5% of the capacity (rounded up to a whole Mi), at least 1Gi. The 5% scales with the
# number of cached files a large cache holds; the 1Gi floor covers a small cache of many files.
FILE_CACHE_MARGIN_PERCENT = 5
FILE_CACHE_MARGIN_MIN = "1Gi"


def file_cache_volume_size(capacities: tuple[str, ...]) -> Decimal:
    """The sizeLimit of the pod's CACHE_VOLUME for the fileCacheCapacity of each of its cached gcs
    volumes: their sum plus the margin above (FILE_CACHE_MARGIN_PERCENT, FILE_CACHE_MARGIN_MIN)."""
    total = sum((quantity_value(c) for c in capacities), Decimal(0))
    mi = 2**20
    margin = math.ceil(total * FILE_CACHE_MARGIN_PERCENT / (100 * mi)) * mi
    return total + max(margin, quantity_value(FILE_CACHE_MARGIN_MIN))


def has_sidecar(volumes: tuple[Volume, ...], role: str) -> bool:
    """Whether ``role``'s pod mounts a gcs volume, and so gets GKE's Cloud Storage FUSE sidecar."""
    return any(v.source == "gcs" and role in v.mount_on for v in volumes)


def node_disk(volumes: tuple[Volume, ...], role: str) -> NodeDisk:
    """What of ``role``'s pod lands on the node's disk, in spec.volumes order."""
    parts = []
    cached = [v for v in volumes if role in v.mount_on and v.file_cache and v.file_cache.medium == ""]
    for v in volumes:
        if role not in v.mount_on:
            continue
        if cached and v is cached[0]:
            capacities = tuple(c.file_cache.capacity for c in cached)
            parts.append((f"{CACHE_VOLUME} ({', '.join(f'{c.name} gcs.fileCache.capacity {c.file_cache.capacity}' for c in cached)}"
                           f" + {FILE_CACHE_MARGIN_PERCENT}%, at least {FILE_CACHE_MARGIN_MIN})",
                           bytes_quantity(file_cache_volume_size(capacities))))
        elif v.source == "emptyDir" and v.size_limit and v.medium == "":
            parts.append((f"{v.name} emptyDir.sizeLimit", v.size_limit))
    return NodeDisk(tuple(parts))


def needed_disk(disk: NodeDisk) -> Decimal:
    """The least ephemeral-storage limit a pod with these volumes can have: they fill up, and the
    container's own logs and writable layer come on top (DISK_HEADROOM)."""
    return disk.total + quantity_value(DISK_HEADROOM)


def ephemeral_storage_problem(given: str | None, disk: NodeDisk, role: str) -> str | None:
    """Why spec.<role>.ephemeralStorage cannot hold the pod's volumes on the node's disk, if it cannot.
    It is the Ray container's limit too, and the kubelet evicts a pod whose usage (its emptyDirs with
    its containers' writes) passes its containers' limits: the volumes alone, full, plus a log line
    would pass a limit of exactly their size."""
    if given is None or not disk.parts or quantity_value(given) >= needed_disk(disk):
        return None
    return (f"must be at least {bytes_quantity(needed_disk(disk))}: the {role} pod's volumes on the node's disk "
            f"(spec.volumes: {disk.text()}) plus {DISK_HEADROOM} for the container's own logs, ~/.cache and writable layer; "
            "they count as the pod's ephemeral storage, which is requested and limited to this value; raise it, "
            f"or leave it out for a request of the volumes plus {DISK_HEADROOM} and no limit")


# GKE's Cloud Storage FUSE sidecar is sized by pod annotations; the CSI driver's webhook fills in what
# they leave out from its flags. The driver's own webhook deployment has passed 0 (no limit) for the
# sidecar's CPU, memory and ephemeral-storage limits since 2024, and Google's RayService TPU sample
# sets gke-gcsfuse/cpu-limit, memory-limit and ephemeral-storage-limit to "0": the operator sets what
# the sample sets, those three at "0" on every pod that mounts a gcs volume unless spec.gcsFuseSidecar
# gives one, so that a GKE whose webhook still has the older defaults (a 5Gi disk limit) sizes the
# sidecar the same. Why no limit: the kubelet makes the sum of the limits the pod's containers have
# the pod's limit, against which it counts the pod's emptyDirs and every container's writes, so with
# no limit on the Ray container a sidecar's 5Gi would be the whole pod's (a file cache or scratch
# past 5Gi would evict the slice); and a CPU or memory limit throttles or kills gcsfuse while it reads
# a model at many streams, failing the replica that waits on it.
SIDECAR_DISK_LIMIT = SIDECAR_ANNOTATIONS["ephemeralStorageLimit"]
SIDECAR_NO_LIMITS = {SIDECAR_ANNOTATIONS[k]: "0" for k in ("cpuLimit", "memoryLimit", "ephemeralStorageLimit")}
# The sidecar's own ephemeral-storage request when no annotation gives it one (the webhook's
# --sidecar-ephemeral-storage-request default): the scheduler adds it to the pod's.
SIDECAR_DISK_REQUEST_DEFAULT = "5Gi"


def sidecar_disk_request(volumes: tuple[Volume, ...], sidecar: Mapping[str, str], role: str) -> str | None:
    """The ephemeral-storage the role's GCS FUSE sidecar requests as the driver's webhook sets it from
    the pod's annotations (SIDECAR_NO_LIMITS under spec.gcsFuseSidecar): the request annotation when
    given; else a non-zero limit annotation (the webhook makes the request equal to it); else, a limit
    of "0" or none, the webhook's default request. None when the pod has no sidecar or requests nothing."""
    if not has_sidecar(volumes, role):
        return None
    annotations = {**SIDECAR_NO_LIMITS, **sidecar}
    request = annotations.get(SIDECAR_ANNOTATIONS["ephemeralStorageRequest"])
    if request is None:
        limit = annotations[SIDECAR_DISK_LIMIT]
        request = limit if quantity_value(limit) != 0 else SIDECAR_DISK_REQUEST_DEFAULT
    return None if quantity_value(request) == 0 else request


def sidecar_limit_problem(sidecar: Mapping[str, str], given: str | None, disk: NodeDisk, role: str) -> str | None:
    """Why spec.gcsFuseSidecar.ephemeralStorageLimit would evict the ``role`` pod, if it would: with
    spec.<role>.ephemeralStorage unset it is the pod's whole limit, its volumes on the disk counted."""
    limit = sidecar.get(SIDECAR_DISK_LIMIT)
    if limit is None or given is not None or not disk.parts or quantity_value(limit) == 0 or quantity_value(limit) >= needed_disk(disk):
        return None
    return (f"must be \"0\" (none) or at least {bytes_quantity(needed_disk(disk))} while spec.{role}.ephemeralStorage is unset: "
            f"the kubelet takes the containers' limits as the {role} pod's, and the Ray container has none, so this "
            f"one limits the whole pod, its volumes on the node's disk included (spec.volumes: {disk.text()})")


def parse_sidecar(r, spec: Mapping, volumes: tuple[Volume, ...]) -> dict[str, str]:
    """spec.gcsFuseSidecar -> the pod annotations GKE reads ({annotation: quantity})."""
    block = r.mapping(spec, "gcsFuseSidecar", "spec.gcsFuseSidecar", set(SIDECAR_ANNOTATIONS))
    if block and not any(v.source == "gcs" for v in volumes):
        r.error("spec.gcsFuseSidecar", None, "must not be set without a gcs volume in spec.volumes: there is no sidecar to size")
    annotations = {}
    for key, annotation in SIDECAR_ANNOTATIONS.items():
        value = r.value(block, key, f"spec.gcsFuseSidecar.{key}", (str, int), check=quantity)
        if value is not None:
            annotations[annotation] = str(value)
    return annotations
