"""What `tputorch doctor --smoke --storage-path URI` runs inside its Ray job, on the Ray head, with
the Ray pods' ServiceAccount (and so its Workload Identity), as the training job would write: the
storage path arrives as the job's TPUTORCH_STORAGE_PATH (spec.checkpoint.storagePath), the
filesystem is the one Ray Train makes of a RunConfig's storage_path (Ray Train's own
`get_fs_and_path`, else pyarrow's `FileSystem.from_uri`, which it wraps), and the steps are what
Ray Train does there: create the storage path's directory (on GCS: read the bucket, write its
folder markers), write an object, read it back (a resume), remove it (old checkpoints). The probe
object's name is unique to the run; nothing else is written.

A step that fails prints one line and exits 3:

    tputorch-doctor-storage: could not <step> <uri>: <reason>

Ray puts the tail of a failed entrypoint's output in the job's message and KubeRay copies it to
the RayJob's status, where `smoke.verdict` reads the line. On success it prints
`tputorch-doctor-storage: ok <uri>`.

Standalone (the standard library, and Ray or pyarrow from the job's image at run time): the job's
image need not hold tputorch. `smoke.storage_statement` sends this file's source in the job's
entrypoint, after the Ray probe, in the same Python process (`sys.exit` here ends it).
"""

from __future__ import annotations

import os
import sys
import uuid

MARK = "tputorch-doctor-storage:"
ENV_STORAGE_PATH = "TPUTORCH_STORAGE_PATH"  # tputorch.train.ENV_STORAGE_PATH (a test checks they agree)
FAILED_EXIT = 3


# Where Ray Train resolves a RunConfig's storage_path: Train v2 (Ray's default since RAY_TRAIN_V2_ENABLED
# turned on), then v1; both wrap pyarrow's FileSystem.from_uri (Ray 2.60).
RAY_TRAIN_STORAGE = ("ray.train.v2._internal.execution.storage", "ray.train._internal.storage")


def filesystem(uri: str):
    """(pyarrow filesystem, path in it) of a storage path, as Ray Train resolves a storage_path."""
    import importlib

    for module in RAY_TRAIN_STORAGE:
        try:
            resolve = importlib.import_module(module).get_fs_and_path
        except (ImportError, AttributeError):
            continue
        return resolve(uri)
    from pyarrow.fs import FileSystem  # no Ray Train in the image: what it wraps

    return FileSystem.from_uri(uri)


def probe(uri: str, name: str, resolve=filesystem) -> tuple[str, str, str] | None:
    """None when every step passed, else (the step that failed, what it was done to, why)."""
    payload = f"tputorch doctor storage probe {name}\n".encode()
    step, target = "open", uri
    try:
        fs, base = resolve(uri)
        step = "create the directory"
        fs.create_dir(base, recursive=True)
        path = base.rstrip("/") + "/" + name
        target = uri.rstrip("/") + "/" + name
        step = "write"
        with fs.open_output_stream(path) as out:
            out.write(payload)
        step = "read back"
        with fs.open_input_stream(path) as back:
            got = back.read()
        if got != payload:
            return step, target, f"read {len(got)} bytes, wrote {len(payload)}"
        step = "remove"
        fs.delete_file(path)
    except Exception as err:  # any failure of the storage layer is the answer, named by its step
        return step, target, " ".join(f"{type(err).__name__}: {err}".split())
    return None


def main() -> int:
    uri = os.environ.get(ENV_STORAGE_PATH, "")
    if not uri:
        print(f"{MARK} could not open {ENV_STORAGE_PATH}: it is not set", flush=True)
        return FAILED_EXIT
    failed = probe(uri, f".tputorch-doctor-probe-{uuid.uuid4().hex[:12]}")
    if failed:
        step, target, reason = failed
        print(f"{MARK} could not {step} {target}: {reason}", flush=True)
        return FAILED_EXIT
    print(f"{MARK} ok {uri}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
