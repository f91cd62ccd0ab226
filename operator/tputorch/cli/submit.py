"""`tputorch submit` and `tputorch serve`: build the object from flags (or a file), validate it
locally, create it, then follow it until it ends (exit 0 / 1 / 2 / 130).

Building objects from flags is pure (`job_from_flags`, `service_from_flags`); `follow` runs the
watch and driver-log threads and hands what they see to a renderer (display.py) on the main thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import queue
import re
import secrets
import shlex
import sys
import threading
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from . import client, display
from ..api import crd, identity, spec
from ..api.common import DEFAULTS
from .. import render
from ..render.output import to_yaml
from .display import FAILED, INTERRUPTED, INVALID, OK
from .yamlfile import YAMLFileError, read_documents

SERVICE_API_VERSION = f"{crd.GROUP}/{crd.VERSION}"
# Ray fetches these working_dir URIs itself (on the head); a local path would have to be uploaded.
REMOTE_WORKING_DIR = re.compile(r"^(gs|s3|https?|file)://\S+$")
# Once the job has ended: wait for the driver log's end, but no longer than LOG_QUIET_SECONDS after
# its last line (a follow that never ends, as KWOK's fake kubelet serves it) nor LOG_GRACE_SECONDS.
LOG_QUIET_SECONDS = 2.0
LOG_GRACE_SECONDS = 15.0


@dataclasses.dataclass(frozen=True)
class FlagError:
    flag: str
    value: Any
    message: str

    def __str__(self) -> str:
        shown = "" if self.value is None else f"{self.value!r} "
        return f"{self.flag}: {shown}{self.message}"


class InvalidFlags(ValueError):
    def __init__(self, errors: list):
        self.errors = errors
        super().__init__("; ".join(map(str, errors)))


# ---------------------------------------------------------------- building objects (pure)

def split_tpu(value: str) -> tuple[str, str]:
    """`v6e-4x4` -> (`v6e`, `4x4`); GKE's label values work too: `tpu-v6e-slice-4x4`."""
    accelerator, _, topo = (value or "").rpartition("-")
    if not accelerator or not re.fullmatch(r"\d+(x\d+)+", topo):
        raise InvalidFlags([FlagError("--tpu", value, "must be ACCELERATOR-TOPOLOGY, e.g. v6e-4x4 or v5p-2x2x2 "
                                                       "(`tputorch topologies` lists every slice)")])
    return accelerator, topo


def _env_list(pairs: list[str] | None, errors: list) -> list[dict]:
    env = []
    for pair in pairs or []:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            errors.append(FlagError("--env", pair, "must be NAME=VALUE"))
            continue
        env.append({"name": name, "value": value})
    return env


def working_dir_problem(value: str, is_dir: bool) -> str | None:
    if REMOTE_WORKING_DIR.match(value):
        return None
    where = "a local directory" if is_dir else "not a URI"
    return (f"is {where}: the Ray job is submitted from inside the cluster (KubeRay's submitter pod), which "
            "cannot read this machine's disk. Upload it as a zip and pass its URI (gs://, s3://, https://), "
            "or bake it into the image (COPY it in the Dockerfile and use a path in the entrypoint)")


def default_name(prefix: str) -> str:
    """prefix-xxxxx, like generateName, but known before creation (local validation needs it)."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    return f"{prefix}-{''.join(secrets.choice(alphabet) for _ in range(5))}"


# Which part of the spec each flag fills: a flag that could not be read hides the spec's own
# error about the same part (it would only repeat it).
FLAG_FIELDS = {"--tpu": "spec.tpu", "--image": "spec.image", "command": "spec.entrypoint",
               "--entrypoint": "spec.entrypoint", "--env": "spec.env", "--working-dir": "spec.runtimeEnv"}


def job_from_flags(a: argparse.Namespace, namespace: str) -> tuple[dict, list[FlagError]]:
    """The TPUTorchJob that `tputorch submit`'s flags describe, and the flags that could not be read."""
    errors: list = []
    argv = list(a.argv or [])
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if argv and a.entrypoint:
        errors.append(FlagError("--entrypoint", a.entrypoint, "must not be given together with a command after --"))
    entrypoint = a.entrypoint or (shlex.join(argv) if argv else None)
    if not entrypoint:
        errors.append(FlagError("command", None, "is required: tputorch submit ... -- python train.py ARGS"))
    accelerator = topo = None
    if not a.tpu:
        errors.append(FlagError("--tpu", None, "is required (or -f FILE), e.g. --tpu v6e-4x4"))
    else:
        try:
            accelerator, topo = split_tpu(a.tpu)
        except InvalidFlags as err:
            errors.extend(err.errors)
    if not a.image:
        errors.append(FlagError("--image", None, "is required (or -f FILE)"))
    env = _env_list(a.env, errors)
    body_spec: dict = {}
    if accelerator:
        body_spec["tpu"] = {"accelerator": accelerator, "topology": topo}
        if a.chips_per_worker is not None:
            body_spec["tpu"]["chipsPerWorker"] = a.chips_per_worker
        if a.spot:
            body_spec["tpu"]["spot"] = True
        if a.reservation:
            body_spec["tpu"]["reservation"] = a.reservation
    body_spec.update({k: v for k, v in (("image", a.image), ("entrypoint", entrypoint), ("rayVersion", a.ray_version),
                                        ("serviceAccountName", a.service_account), ("env", env)) if v})
    if a.working_dir:
        problem = working_dir_problem(a.working_dir, os.path.isdir(a.working_dir))
        if problem:
            errors.append(FlagError("--working-dir", a.working_dir, problem))
        body_spec["runtimeEnv"] = {"working_dir": a.working_dir}
    prefix = re.sub(r"[^a-z0-9-]", "", (accelerator or "").lower()).lstrip("-0123456789") or "job"
    body = {"apiVersion": crd.API_VERSION, "kind": crd.KIND,
            "metadata": {"name": a.name or default_name(prefix), "namespace": namespace}, "spec": body_spec}
    return body, errors


def validate_job(body: dict, flag_errors: list | None = None) -> spec.JobSpec:
    return validate(body, flag_errors)


def job_from_file(path: str, name: str | None, namespace: str | None) -> dict:
    """The one TPUTorchJob in a YAML file ('-' for stdin); --name / --namespace override its metadata."""
    try:
        docs = read_documents(path)
    except (OSError, YAMLFileError) as err:
        raise InvalidFlags([FlagError("-f", path, f"cannot be read: {err}")]) from err
    if len(docs) != 1 or not isinstance(docs[0], dict) or docs[0].get("kind") != crd.KIND:
        kinds = [d.get("kind") if isinstance(d, dict) else type(d).__name__ for d in docs]
        raise InvalidFlags([FlagError("-f", path, f"must hold exactly one {crd.KIND}; it holds {kinds}")])
    body = docs[0]
    meta = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else {}
    if name:
        meta["name"] = name
    if namespace:
        meta["namespace"] = namespace
    return body


SERVICE_FLAG_FIELDS = {"--tpu": "spec.tpu", "--image": "spec.image", "--model": "spec.model",
                       "--hf-token-secret": "spec.model.hfTokenSecret", "--engine-arg": "spec.engine.args"}


def _engine_args(pairs: list[str] | None, errors: list) -> dict:
    """--engine-arg KEY=VALUE, each VALUE read as a YAML value (true, 8192, hermes, {"level": 3}),
    as it would be written under spec.engine.args; the operator's parser checks the names."""
    args: dict = {}
    for pair in pairs or []:
        key, eq, text = pair.partition("=")
        if not eq or not key:
            errors.append(FlagError("--engine-arg", pair, "must be KEY=VALUE, a vLLM engine argument in snake_case, "
                                                          "e.g. tool_call_parser=hermes"))
            continue
        if key in args:
            errors.append(FlagError("--engine-arg", pair, f"gives {key} a second time"))
            continue
        try:
            args[key] = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as err:
            errors.append(FlagError("--engine-arg", pair, f"has a VALUE that is not a YAML value: {err}"))
    return args


def service_from_flags(a: argparse.Namespace, namespace: str) -> tuple[dict, list[FlagError]]:
    """The TPUTorchService that `tputorch serve`'s flags describe, and the flags that could not be read."""
    errors: list = []
    body_spec: dict = {}
    try:
        accelerator, topo = split_tpu(a.tpu)
        body_spec["tpu"] = {"accelerator": accelerator, "topology": topo}
    except InvalidFlags as err:
        errors.extend(err.errors)
    body_spec["image"] = a.image
    if a.service_account:
        body_spec["serviceAccountName"] = a.service_account
    model: dict = {"source": a.model}
    if a.served_model_name:
        model["name"] = a.served_model_name
    if a.hf_token_secret:
        secret, colon, key = a.hf_token_secret.partition(":")
        if not (secret and colon and key):
            errors.append(FlagError("--hf-token-secret", a.hf_token_secret, "must be SECRET:KEY, the Secret and its key holding the token"))
        else:
            model["hfTokenSecret"] = {"name": secret, "key": key}
    body_spec["model"] = model
    engine = {k: v for k, v in (("tensorParallelSize", a.tp), ("enableExpertParallel", a.expert_parallel or None),
                                ("maxModelLen", a.max_model_len), ("args", _engine_args(a.engine_arg, errors)))
              if v is not None and v != {}}
    if engine:
        body_spec["engine"] = engine
    if a.lora_path:
        body_spec["lora"] = {"path": a.lora_path}
    replicas = {k: v for k, v in (("min", a.min_replicas), ("max", a.max_replicas)) if v is not None}
    if replicas:
        body_spec["replicas"] = replicas
    worker = {k: v for k, v in (("cpu", a.worker_cpu), ("memory", a.worker_memory),
                                ("ephemeralStorage", a.worker_ephemeral_storage)) if v is not None}
    if worker:
        body_spec["worker"] = worker
    body = {"apiVersion": crd.API_VERSION, "kind": crd.SERVICE_KIND,
            "metadata": {"name": a.name or default_name("serve"), "namespace": namespace}, "spec": body_spec}
    return body, errors


def validate(body: dict, flag_errors: list | None = None, parse=spec.parse, flag_fields=FLAG_FIELDS):
    """The kind's own parser (spec.parse / spec.parse_service); InvalidFlags lists the unreadable
    flags and every spec error they do not cover."""
    flag_errors = flag_errors or []
    covered = tuple(flag_fields[e.flag] for e in flag_errors if e.flag in flag_fields)
    try:
        parsed = parse(body)
    except spec.InvalidSpec as err:
        raise InvalidFlags(flag_errors + [e for e in err.errors if not e.path.startswith(covered or ("\0",))]) from err
    if flag_errors:
        raise InvalidFlags(flag_errors)
    return parsed


def warn_identity(body: dict) -> None:
    """Said before the object is created: a spec that reaches Cloud Storage as the namespace's
    default ServiceAccount (api/identity.py; a warning, since that account may be bound on purpose)."""
    if warning := identity.missing_identity(body.get("spec") or {}):
        print(f"warning: {warning}", file=sys.stderr)


# ---------------------------------------------------------------- following (threads + renderer)

def _pump_status(api: client.Api, kind: client.Kind, name: str, namespace: str, q: queue.Queue,
                 stop: threading.Event) -> None:
    try:
        for obj in api.watch_object(kind, name, namespace, stop):
            q.put(("status", obj))
    except Exception as err:  # handed to the main thread, which says what happened
        q.put(("error", err))


def _pump_log(api: client.Api, rayjob: str, namespace: str, q: queue.Queue, stop: threading.Event,
              job_done: threading.Event) -> None:
    """The driver log: each submitter pod's log once it has started, followed to its end.

    A pod whose log cannot be read yet is retried; once the job has ended it is given up on.
    Sends ("log_end", None) when nothing more will come.
    """
    finished: set[str] = set()
    shown: dict[str, int] = {}
    told = False
    try:
        while not stop.is_set():
            last_look = job_done.is_set()
            pods = [p for p in api.submitter_pods(rayjob, namespace)
                    if p.metadata.name not in finished and (p.status.phase or "Pending") != "Pending"]
            if not pods:
                if last_look:
                    break
                stop.wait(1.0)
                continue
            pod = pods[0]
            pod_name = pod.metadata.name
            try:
                count = 0
                for line in api.pod_log(pod_name, namespace, follow=not last_look):
                    count += 1
                    if count > shown.get(pod_name, 0):  # after a reconnect, skip what was shown
                        shown[pod_name] = count
                        q.put(("log", line))
                    if stop.is_set():
                        return
                phase = api.core.read_namespaced_pod(pod_name, namespace).status.phase
                if phase in ("Succeeded", "Failed") or last_look:
                    finished.add(pod_name)
            except ApiException as err:
                if last_look:
                    finished.add(pod_name)
                if not told:
                    q.put(("notice", f"driver log of pod {pod_name} not readable yet: {client.api_error_message(err)}"))
                    told = True
                stop.wait(2.0)
    except Exception as err:
        q.put(("notice", f"driver log stopped: {err}"))
    finally:
        q.put(("log_end", None))


def follow(api: client.Api, kind: client.Kind, name: str, namespace: str, out, target: str,
           driver_log: bool = True) -> int:
    """Show the object's progress (and a job's driver log) until it reaches `target` or fails."""
    q: queue.Queue = queue.Queue()
    stop, job_done = threading.Event(), threading.Event()
    pumps = [threading.Thread(target=_pump_status, args=(api, kind, name, namespace, q, stop), daemon=True)]
    log_running = driver_log and kind is client.JOB
    if log_running:
        pumps.append(threading.Thread(target=_pump_log, args=(api, name, namespace, q, stop, job_done), daemon=True))
    for t in pumps:
        t.start()
    last: display.View | None = None
    code: int | None = None
    try:
        deadline = grace_end = None
        while True:
            try:
                what, payload = q.get(timeout=0.25 if deadline is None else max(0.0, deadline - client.now()))
            except queue.Empty:
                if deadline is not None and client.now() >= deadline:
                    break
                continue
            if deadline is not None:  # the job has ended: every line moves the quiet deadline
                deadline = min(grace_end, client.now() + LOG_QUIET_SECONDS)
            if what == "status":
                if payload is None:
                    out.notice(f"{kind.kind} {namespace}/{name} was deleted")
                    last = dataclasses.replace(last or display.view(kind.kind, {"metadata": {"name": name, "namespace": namespace}}),
                                               phase="Deleted", reason="Deleted", message="deleted while being followed")
                    code = FAILED
                    break
                last = display.view(kind.kind, payload)
                out.update(last)
                code = display.outcome(last, target)
                if code is not None and deadline is None:
                    job_done.set()
                    if not log_running:
                        break
                    grace_end = client.now() + LOG_GRACE_SECONDS
                    deadline = min(grace_end, client.now() + LOG_QUIET_SECONDS)
            elif what == "log":
                out.log(payload)
            elif what == "notice":
                out.notice(payload)
            elif what == "log_end":
                log_running = False
                if code is not None:
                    break
            elif what == "error":
                raise payload
        out.finish(last, code)
        return code
    except KeyboardInterrupt:
        out.interrupted(kind.kind, name, namespace)
        return INTERRUPTED
    finally:
        stop.set()
        # Give the pumps a moment to leave their API calls: a daemon thread still inside an HTTPS read
        # when the interpreter shuts down can abort the process (seen once: `submit` exited SIGABRT
        # after printing Succeeded). One that is stuck longer is left to die with the process.
        for t in pumps:
            t.join(timeout=2.0)
        out.close()


# ---------------------------------------------------------------- commands

def _print_errors(errors, where: str = "") -> None:
    for e in errors:
        print(f"{where}{e}", file=sys.stderr)


def _connect(a) -> client.Api:
    return client.connect(context=a.context, namespace=a.namespace, kubeconfig=a.kubeconfig)


def _namespace(a, api: client.Api | None) -> str:
    if a.namespace:
        return a.namespace
    if api is not None:
        return api.namespace
    try:  # --dry-run needs no connection, only the context's namespace
        return client.context_namespace(a.context, a.kubeconfig)
    except Exception:
        return "default"


def cmd_submit(a) -> int:
    if a.file and (a.tpu or a.image or a.entrypoint or a.argv):
        print("-f: must not be combined with --tpu, --image, --entrypoint or a command", file=sys.stderr)
        return INVALID
    try:  # validated before anything else: an invalid job exits 2 whatever the cluster
        body, flag_errors = (job_from_file(a.file, a.name, a.namespace), []) if a.file else job_from_flags(a, a.namespace or "default")
        validate_job(body, flag_errors)
    except InvalidFlags as err:
        _print_errors(err.errors)
        return INVALID
    warn_identity(body)
    try:
        api = None if a.dry_run else _connect(a)
    except client.ConnectError as err:
        print(err, file=sys.stderr)
        return FAILED
    meta = body["metadata"]
    file_namespace = meta.get("namespace") if a.file else None  # kubectl's rule: -n, the file's, the context's
    meta["namespace"] = a.namespace or file_namespace or _namespace(a, api)
    if a.dry_run:
        sys.stdout.write(yaml.safe_dump(body, sort_keys=False) + "---\n" + to_yaml(render.rayjob(validate_job(body))))
        return OK
    return _create_and_follow(api, client.JOB, body, a, target="Succeeded")


def cmd_serve(a) -> int:
    body, flag_errors = service_from_flags(a, a.namespace or "default")
    try:  # validated before anything else, as submit does
        validate(body, flag_errors, spec.parse_service, SERVICE_FLAG_FIELDS)
    except InvalidFlags as err:
        _print_errors(err.errors)
        return INVALID
    warn_identity(body)
    try:
        api = None if a.dry_run else _connect(a)
    except client.ConnectError as err:
        print(err, file=sys.stderr)
        return FAILED
    body["metadata"]["namespace"] = _namespace(a, api)
    if a.dry_run:
        svc = spec.parse_service(body)
        sys.stdout.write(yaml.safe_dump(body, sort_keys=False) + "---\n" + to_yaml(render.rayservice(svc)))
        return OK
    return _create_and_follow(api, client.SERVICE, body, a, target="Ready")


def _create_and_follow(api: client.Api, kind: client.Kind, body: dict, a, target: str) -> int:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    out = display.renderer(a.output)
    try:
        api.create(kind, body, namespace)
    except ApiException as err:
        out.close()
        message = client.api_error_message(err)
        if err.status == 404:
            message = f"the {kind.kind} kind is not installed in this cluster (no {kind.plural}.{crd.GROUP} CRD)"
        print(f"{kind.kind} {namespace}/{name}: not created: {message}", file=sys.stderr)
        # Refused as invalid or as a duplicate: nothing was created, as with local validation.
        return INVALID if err.status in (409, 422) else FAILED
    out.created(kind.kind, name, namespace)
    if a.detach:
        out.close()
        if a.output != "json":
            hint = f"tputorch logs -f {name} -n {namespace}" if kind is client.JOB else f"tputorch get {name} -n {namespace}"
            print(f"follow it: {hint}", file=sys.stderr)
        return OK
    return follow(api, kind, name, namespace, out, target)


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


def register(sub) -> None:
    """Add submit, serve, get, describe, logs, delete, wait, upgrade-plan and rerender to the `tputorch` parser."""
    from . import manage, upgrades

    s = sub.add_parser("submit", help="create a TPUTorchJob and follow it to the end (exit 0/1/2/130)",
                       description="Create a TPUTorchJob from flags or -f FILE, validated locally first, then show "
                                   "its progress and driver log until it ends. Exit code: 0 succeeded, 1 failed, "
                                   "2 invalid (nothing created), 130 interrupted (the job keeps running).")
    s.add_argument("-f", "--file", help="a TPUTorchJob YAML file ('-' for stdin) instead of the flags below")
    s.add_argument("--tpu", metavar="ACCEL-TOPOLOGY", help="the slice, e.g. v6e-4x4, v5p-2x2x2 (tputorch topologies)")
    s.add_argument("--image", help="image for the Ray head and TPU hosts")
    s.add_argument("--name", help="job name (default: ACCEL-xxxxx)")
    s.add_argument("--chips-per-worker", type=int, help="chips per Ray Train worker (1, 2, 4 or 8)")
    cap = s.add_mutually_exclusive_group()
    cap.add_argument("--spot", action="store_true", help="Spot capacity")
    cap.add_argument("--reservation", help="a GKE reservation's name")
    s.add_argument("--env", action="append", metavar="NAME=VALUE", help="env var for head and hosts (repeatable)")
    s.add_argument("--working-dir", metavar="URI", help="Ray runtime_env working_dir: a gs://, s3:// or https:// zip")
    s.add_argument("--ray-version", help="Ray version in the image (default 2.60.0)")
    s.add_argument("--service-account", help="service account of the Ray pods")
    s.add_argument("--entrypoint", help="the Ray job's command as one string (instead of -- COMMAND...)")
    s.add_argument("--dry-run", action="store_true", help="print the TPUTorchJob and the RayJob it becomes; create nothing")
    s.add_argument("--detach", action="store_true", help="return once created")
    s.add_argument("-o", "--output", choices=["text", "json"], default="text", help="json: one JSON object per line")
    add_connection_flags(s)
    s.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- the entrypoint, e.g. -- python train.py --epochs 2")
    s.set_defaults(func=cmd_submit)

    v = sub.add_parser("serve", help="create a TPUTorchService and follow it until Ready (exit 0/1/2/130)")
    v.add_argument("--tpu", required=True, metavar="ACCEL-TOPOLOGY", help="the slice, e.g. v6e-4x4")
    v.add_argument("--image", required=True, help="image with Ray Serve LLM and vLLM for TPU")
    v.add_argument("--model", required=True, metavar="SOURCE", help="model source, e.g. a Hugging Face id or gs:// path")
    v.add_argument("--served-model-name", help="the name clients ask for (default: the service's name)")
    v.add_argument("--hf-token-secret", metavar="SECRET:KEY", help="the Secret (and its key) holding a Hugging Face token")
    v.add_argument("--tp", type=int, metavar="N", help="tensor parallel size (default: the slice's chips)")
    v.add_argument("--expert-parallel", action="store_true", help="expert parallelism for a mixture-of-experts model")
    v.add_argument("--max-model-len", type=int, metavar="TOKENS", help="the context length (default: the model's)")
    v.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                   help="another vLLM engine argument (spec.engine.args; repeatable), VALUE read as YAML, "
                        "e.g. tool_call_parser=hermes")
    v.add_argument("--service-account", help="service account of the Ray pods (Workload Identity for buckets)")
    v.add_argument("--worker-cpu", metavar="CPU", help=f"CPU of each TPU host pod (requests = limits; default {DEFAULTS['worker.cpu']})")
    v.add_argument("--worker-memory", metavar="QUANTITY", help=f"memory of each TPU host pod, e.g. 400Gi (default {DEFAULTS['worker.memory']})")
    v.add_argument("--worker-ephemeral-storage", metavar="QUANTITY",
                   help="ephemeral storage of each TPU host pod (request = limit; default: derived from its volumes)")
    v.add_argument("--lora-path", metavar="GS_URI", help="gs://bucket/folder of LoRA adapters, one subfolder each "
                   "(asked for as model <name>:<subfolder>)")
    v.add_argument("--min-replicas", type=int,
                   help="fewest model replicas, one whole slice each (spec.replicas.min; default 1; 0 scales to zero)")
    v.add_argument("--max-replicas", type=int,
                   help="most replicas, which KubeRay's autoscaler adds slice by slice (spec.replicas.max; default: min)")
    v.add_argument("--name", help="service name (default: serve-xxxxx)")
    v.add_argument("--dry-run", action="store_true", help="print the TPUTorchService and the RayService it becomes; create nothing")
    v.add_argument("--detach", action="store_true", help="return once created")
    v.add_argument("-o", "--output", choices=["text", "json"], default="text")
    add_connection_flags(v)
    v.set_defaults(func=cmd_serve)

    manage.register(sub, add_connection_flags)
    upgrades.register(sub, add_connection_flags)
    for parser in (s, v, *(sub.choices[n] for n in ("get", "describe", "logs", "delete", "wait", "upgrade-plan",
                                                      "rerender"))):
        parser.set_defaults(func=_guarded(parser.get_default("func")))


def _guarded(func):
    """API and kubeconfig errors as one line and exit 1, Ctrl-C as 130: never a traceback."""
    def run(a) -> int:
        try:
            return func(a)
        except client.ConnectError as err:
            print(err, file=sys.stderr)
        except ApiException as err:
            print(f"tputorch: {client.api_error_message(err)}", file=sys.stderr)
        except KeyboardInterrupt:  # before anything was followed (e.g. while connecting)
            return INTERRUPTED
        return FAILED
    return run
