"""status/storage_access.py: a Cloud Storage 403 in what the pods wrote, as each client writes it
(issue 55), and the StorageIdentity=False (StorageAccessDenied) condition it becomes on a job and a
service, naming the principal, the bucket and the role the runbook grants."""

import copy

import pytest

from tputorch import status
from tputorch.api import identity, spec
from tputorch.render.service import rayservice_spec_hash
from tputorch.status import storage_access

from ..jobs import body
from ..services import service_body
from .test_status import T0, cond, rayjob
from .test_status_service import rayservice

DEFAULT_SA = ("principal://iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/"
              "acme-ml.svc.id.goog/subject/ns/team-a/sa/default")
JSON_API = ("{who} does not have {perm} access to the Google Cloud Storage {what}. Permission '{perm}' denied on "
            "resource (or it may not exist).")

# pyarrow's GcsFileSystem (Ray Train's checkpoint upload) raises google-cloud-cpp's status as an OSError.
PYARROW = (
    "(RayTrainWorker pid=2211, ip=10.8.0.14) Checkpoint successfully created at: Checkpoint(filesystem=local, path=/tmp/ckpt)\n"
    "(RayTrainWorker pid=2211, ip=10.8.0.14)   File \"pyarrow/_fs.pyx\", line 887, in pyarrow._fs.FileSystem.open_output_stream\n"
    "(RayTrainWorker pid=2211, ip=10.8.0.14)   File \"pyarrow/error.pxi\", line 92, in pyarrow.lib.check_status\n"
    "(RayTrainWorker pid=2211, ip=10.8.0.14) OSError: google::cloud::Status(PERMISSION_DENIED: Permanent error, with a "
    "last message of " + JSON_API.format(who=DEFAULT_SA, perm="storage.objects.create", what="object")
    + " error_info={reason=forbidden, domain=global, metadata={gcloud-cpp.retry.function=CreateResumableUpload, "
    "gcloud-cpp.retry.reason=permanent-error, http_status_code=403}})\n")
# google-cloud-storage (Python), e.g. a weights download Job: the request's URL names the bucket.
FORBIDDEN = ("google.api_core.exceptions.Forbidden: 403 GET https://storage.googleapis.com/storage/v1/b/team-models"
             "?projection=noAcl&prettyPrint=false: " + JSON_API.format(
                 who="principal://iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/"
                     "acme-ml.svc.id.goog/subject/ns/team-a/sa/ray-tpu", perm="storage.buckets.get", what="bucket"))
# Newer JSON API messages name the resource.
ANONYMOUS = ("Anonymous caller does not have storage.objects.get access to the Google Cloud Storage object. Permission "
             "'storage.objects.get' denied on resource '//storage.googleapis.com/projects/_/buckets/team-ckpt/objects/"
             "code/app.zip' (or it may not exist).")
# gcsfuse in the GCS FUSE sidecar's log, and the CSI driver's FailedMount Event on the pod.
GCSFUSE = ("E1201 07:46:18.467745 CreateFile: permission denied, CreateChildFile: error in closing writer : "
           "googleapi: Error 403: Access denied., forbidden")
FAILED_MOUNT = ("MountVolume.SetUp failed for volume \"gcs-fuse-csi-ephemeral\" : rpc error: code = PermissionDenied "
                "desc = the sidecar container failed with error: mountWithArgs: mountWithStorageHandle: fs.NewServer: "
                "create file system: SetUpBucket: Error in iterating through objects: googleapi: Error 403: "
                + JSON_API.format(who=DEFAULT_SA, perm="storage.objects.list", what="bucket") + ", forbidden")


@pytest.mark.parametrize("text,principal,bucket,permission", [
    (PYARROW, DEFAULT_SA, None, "storage.objects.create"),
    (FORBIDDEN, FORBIDDEN.split(": ")[2].split(" ")[0], "team-models", "storage.buckets.get"),
    (ANONYMOUS, "anonymous", "team-ckpt", "storage.objects.get"),
    (GCSFUSE, None, None, None),
    (FAILED_MOUNT, DEFAULT_SA, None, "storage.objects.list"),
])
def test_each_clients_403_is_found_with_what_it_names(text, principal, bucket, permission):
    found = storage_access.find("step 1 loss 2.5\n" + text + "\n(RayTrainWorker pid=2211) retrying\n")
    assert found is not None
    assert (found.principal, found.bucket, found.permission) == (principal, bucket, permission)
    assert len(found.excerpt) <= storage_access.MAX_EXCERPT + 3


def test_the_bucket_is_read_from_the_lines_before_when_the_403_line_has_none():
    log = "Uploading checkpoint to gs://team-ckpt/runs/demo/checkpoint_000001\n" + PYARROW
    assert storage_access.find(log).bucket == "team-ckpt"


@pytest.mark.parametrize("text", [
    "huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access gated repo for url https://huggingface.co/x",
    "grpc._channel._InactiveRpcError: status = StatusCode.PERMISSION_DENIED details = \"not allowed\"",
    "HTTPError: 403 Forbidden: http://demo-head-svc:8265/api/jobs/",
    "(RayTrainWorker pid=7) tputorch progress {\"step\": 3}\n",
    "", None, 42,
])
def test_a_403_that_is_not_cloud_storages_is_none(text):
    assert storage_access.find(text) is None


def test_the_text_is_not_trusted():
    odd = "<script>x</script>@evil does not have storage.objects.get access to the Google Cloud Storage object."
    assert storage_access.find(odd).principal is None  # not a principal's shape: the pod's own is named
    coloured = "\x1b[31mOSError: google::cloud::Status(PERMISSION_DENIED: Permanent error)\x1b[0m\x00"
    assert storage_access.find(coloured).excerpt == "OSError: google::cloud::Status(PERMISSION_DENIED: Permanent error)"
    flood = "x" * (storage_access.MAX_TEXT * 2)
    assert storage_access.find(flood + "\n" + GCSFUSE) is not None
    assert storage_access.find(GCSFUSE + "\n" + flood) is None  # only the tail is read
    long_line = ("y" * 5000) + " " + FORBIDDEN
    assert len(storage_access.find(long_line).excerpt) <= storage_access.MAX_EXCERPT + 3


@pytest.mark.parametrize("permission,roles", [
    ("storage.objects.create", (identity.OBJECT_ROLE,)),
    ("storage.objects.get", (identity.OBJECT_ROLE,)),
    ("storage.buckets.get", (identity.BUCKET_ROLE,)),
    (None, (identity.OBJECT_ROLE, identity.BUCKET_ROLE)),
])
def test_the_role_is_the_one_the_runbook_grants_for_that_permission(permission, roles):
    assert storage_access.role_for(permission) == roles


def test_the_message_names_the_principal_the_bucket_and_the_runbooks_binding():
    said = storage_access.message(storage_access.find(PYARROW), "the driver's log", "team-a", None, ("team-ckpt",))
    assert said.startswith(f"Cloud Storage refused {DEFAULT_SA} storage.objects.create on gs://team-ckpt (the driver's log: ")
    assert "the pods run as ServiceAccount team-a/default" in said
    assert (f"gcloud storage buckets add-iam-policy-binding gs://team-ckpt --member={identity.principal('team-a', 'default')} "
            f"--role={identity.OBJECT_ROLE}") in said and identity.RUNBOOK_STEP in said
    # No principal in the text (gcsfuse's "Access denied."): the pod's own, as GKE names it.
    said = storage_access.message(storage_access.find(GCSFUSE), "a pod's event", "team-a", "ray-tpu", ("b1", "b2"))
    assert said.startswith(f"Cloud Storage refused {identity.principal('team-a', 'ray-tpu')} access to one of gs://b1, gs://b2")
    assert identity.OBJECT_ROLE in said and identity.BUCKET_ROLE in said
    # A Google service account refused: not the pod's Workload Identity principal, and said so.
    node_sa = FORBIDDEN.replace(FORBIDDEN.split(": ")[2].split(" ")[0], "123456789012-compute@developer.gserviceaccount.com")
    said = storage_access.message(storage_access.find(node_sa), "the driver's log", "team-a", "ray-tpu", ())
    assert said.startswith("Cloud Storage refused 123456789012-compute@developer.gserviceaccount.com (a Google service account")
    assert "--workload-metadata=GKE_METADATA" in said and "storage.buckets.get on gs://team-models" in said


# ---------------------------------------------------------------- the condition on a job and a service

def test_a_job_whose_ray_job_failed_on_a_403_says_who_was_refused_where():
    job = spec.parse(body(checkpoint={"storagePath": "gs://team-ckpt/runs"}))
    failed = rayjob("failed")
    failed["status"] = {**failed["status"], "message": "Job entrypoint command failed with exit code 1, last available "
                        "logs (truncated to 20,000 chars):\n" + PYARROW}
    st = status.derive(job, 1, failed, [], {}, T0)
    found = cond(st, "StorageIdentity")
    assert (found["status"], found["reason"]) == ("False", "StorageAccessDenied")
    assert DEFAULT_SA in found["message"] and "gs://team-ckpt" in found["message"] and identity.OBJECT_ROLE in found["message"]
    assert "the Ray job's message" in found["message"]
    assert ("Warning", "StorageAccessDenied") in [(e.type, e.reason) for e in status.events({}, st)]
    assert [c["type"] for c in st["conditions"]].count("StorageIdentity") == 1  # instead of DefaultServiceAccount
    plain = cond(status.derive(job, 1, rayjob("failed"), [], {}, T0), "StorageIdentity")
    assert plain["reason"] == "DefaultServiceAccount"  # another failure: the warning as before


def test_a_403_the_driver_log_showed_is_the_jobs_condition_while_it_runs():
    job = spec.parse(body(serviceAccountName="ray-tpu", checkpoint={"storagePath": "gs://team-ckpt/runs"}))
    assert cond(status.derive(job, 1, rayjob("running"), [], {}, T0), "StorageIdentity") is None
    st = status.derive(job, 1, rayjob("running"), [], {}, T0, log_denial=storage_access.find(FORBIDDEN))
    found = cond(st, "StorageIdentity")
    assert found["reason"] == "StorageAccessDenied" and "the driver's log" in found["message"]
    assert "storage.buckets.get on gs://team-models" in found["message"] and identity.BUCKET_ROLE in found["message"]
    assert st["phase"] == "Running"  # said, not acted on: Ray Train decides whether the run goes on


def test_a_service_whose_serve_application_failed_on_a_403_says_so():
    svc = spec.parse_service(service_body(model={"source": "gs://team-models/qwen3"}, serviceAccountName="ray-tpu"))
    rs = rayservice("deploy-failed", svc)
    rs["status"] = copy.deepcopy(rs["status"])
    app = rs["status"]["activeServiceStatus"]["applicationStatuses"]["llm"]
    app["message"] = "The deployment failed to start 3 times in a row: " + FORBIDDEN
    st = status.derive_service(svc, 3, rs, [], {}, T0, desired_hash=rayservice_spec_hash(svc))
    found = cond(st, "StorageIdentity")
    assert (found["status"], found["reason"]) == ("False", "StorageAccessDenied")
    assert "sa/ray-tpu storage.buckets.get on gs://team-models" in found["message"]
    assert "the Serve application's message" in found["message"]


@pytest.mark.parametrize("line", [
    "x" * storage_access.MAX_TEXT,
    "y" * (storage_access.MAX_TEXT - 100) + " does not have storage.objects.get access to",
    "code = PermissionDenied desc = " * 8000,
    ("a" * 300 + " ") * 800,
])
def test_a_hostile_line_costs_no_backtracking_over_all_of_it(line):
    """The tail is read every interval for every running job: one long line must stay cheap (it once
    took seconds, the principal's pattern backtracking at each of its characters)."""
    import time

    started = time.perf_counter()
    storage_access.find(line)
    assert time.perf_counter() - started < 1.0  # 0.02 s measured; 5 s before
