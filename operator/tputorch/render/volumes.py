"""spec.volumes and spec.gcsFuseSidecar in a Ray pod (api/storage.py parses and checks them): the
pod's volumes and its Ray container's mounts, the file cache's volume, GKE's Cloud Storage FUSE
annotations, and the container's ephemeral-storage request and limit."""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..api.quantity import bytes_quantity
from ..api.storage import (
    CACHE_VOLUME, SIDECAR_NO_LIMITS, NodeDisk, Volume, file_cache_volume_size, has_sidecar, needed_disk,
)

# GKE's Cloud Storage FUSE CSI driver, and the pod annotation that makes its webhook inject the
# gke-gcsfuse-sidecar container.
GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
GCS_FUSE_ANNOTATION = "gke-gcsfuse/volumes"
PARALLEL_DOWNLOADS_OPTION = "file-cache:enable-parallel-downloads:true"


def pod_volume(volume: Volume, security_context: Mapping[str, Any]) -> dict:
    """The pod's volume (core/v1 Volume); a gcs volume's files owned by the containers' user."""
    if volume.source == "gcs":
        attributes = {"bucketName": volume.bucket}
        options = fuse_owner_options(security_context, volume.mount_options) + volume.mount_options
        if volume.file_cache:
            # Range reads too: safetensors are read at offsets (each tensor where it lies), and
            # without it a read that does not start at 0 bypasses the cache.
            attributes.update(fileCacheCapacity=volume.file_cache.capacity, fileCacheForRangeRead="true")
            if volume.file_cache.parallel_downloads and not any(o.startswith("file-cache:enable-parallel-downloads")
                                                                for o in options):
                options += (PARALLEL_DOWNLOADS_OPTION,)
        if options:
            attributes["mountOptions"] = ",".join(options)
        return {"name": volume.name, "csi": {"driver": GCS_FUSE_DRIVER, "readOnly": volume.read_only,
                                             "volumeAttributes": attributes}}
    if volume.source == "pvc":
        return {"name": volume.name,
                "persistentVolumeClaim": {"claimName": volume.claim_name, "readOnly": volume.read_only}}
    empty_dir: dict[str, str] = {}
    if volume.medium:
        empty_dir["medium"] = volume.medium
    if volume.size_limit:
        empty_dir["sizeLimit"] = volume.size_limit
    return {"name": volume.name, "emptyDir": empty_dir}


def mount(volume: Volume) -> dict:
    """The container's volumeMount."""
    volume_mount: dict[str, Any] = {"name": volume.name, "mountPath": volume.mount_path}
    if volume.read_only:
        volume_mount["readOnly"] = True
    return volume_mount


# gcsfuse presents every file as owned by the mounting process (root, in GKE's sidecar) with modes
# 0644/0755, so a non-root container can read a bucket but not write to it: the CSI driver's
# troubleshooting guide asks non-root pods for these options. uid/gid are the containers' user and
# group; group-writable modes let another user of that group (another container's) write too.
FUSE_FILE_MODE, FUSE_DIR_MODE = "664", "775"


def fuse_owner_options(security_context: Mapping[str, Any], given: tuple[str, ...]) -> tuple[str, ...]:
    """The uid, gid, file-mode and dir-mode options a gcs volume gets, but those spec mountOptions
    already name (the user's value wins); none when the containers run as root."""
    uid, gid = security_context.get("runAsUser"), security_context.get("runAsGroup")
    if uid in (None, 0):
        return ()
    wanted = {"uid": uid, **({"gid": gid} if gid is not None else {}), "file-mode": FUSE_FILE_MODE, "dir-mode": FUSE_DIR_MODE}
    named = {re.split(r"[=:]", o, maxsplit=1)[0] for o in given}
    return tuple(f"{k}={v}" for k, v in wanted.items() if k not in named)


def cache_volume(volumes: list[Volume]) -> dict | None:
    """The pod's CACHE_VOLUME for the cached gcs volumes among ``volumes`` (one pod's), if any: larger
    than their capacities (storage.file_cache_volume_size says by how much and why)."""
    caches = [v.file_cache for v in volumes if v.file_cache]
    if not caches:
        return None
    size = bytes_quantity(file_cache_volume_size(tuple(c.capacity for c in caches)))
    empty_dir = {"sizeLimit": size, **({"medium": caches[0].medium} if caches[0].medium else {})}
    return {"name": CACHE_VOLUME, "emptyDir": empty_dir}


def ephemeral_storage(given: str | None, disk: NodeDisk) -> tuple[dict[str, str], dict[str, str]]:
    """The Ray container's ephemeral-storage (requests, limits): spec.<role>.ephemeralStorage as both
    when given (ephemeral_storage_problem has checked it holds ``disk``), else a request of ``disk``
    plus DISK_HEADROOM when the pod has anything on the node's disk, and no limit."""
    if given is not None:
        return {"ephemeral-storage": given}, {"ephemeral-storage": given}
    if not disk.parts:
        return {}, {}
    return {"ephemeral-storage": bytes_quantity(needed_disk(disk))}, {}


def sidecar_annotations(sidecar: Mapping[str, str]) -> dict[str, str]:
    """The sidecar's annotations: no CPU, memory or disk limit unless spec.gcsFuseSidecar sets one
    (storage.SIDECAR_NO_LIMITS says why), and what else spec.gcsFuseSidecar sets."""
    return {**SIDECAR_NO_LIMITS, **sidecar}


def pod_storage(volumes: tuple[Volume, ...], sidecar: Mapping[str, str], role: str,
                security_context: Mapping[str, Any]) -> dict:
    """What one role's pod template gets: volumes, its container's mounts, pod annotations."""
    mine = [v for v in volumes if role in v.mount_on]
    annotations: dict[str, str] = {}
    if has_sidecar(volumes, role):
        annotations = {GCS_FUSE_ANNOTATION: "true", **sidecar_annotations(sidecar)}
    pod_volumes = [pod_volume(v, security_context) for v in mine]
    if (cache := cache_volume(mine)) is not None:
        pod_volumes.append(cache)
    return {"volumes": pod_volumes, "mounts": [mount(v) for v in mine], "annotations": annotations}
