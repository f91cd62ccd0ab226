"""tputorch run | render | validate | topologies | crd, and the user commands of submit.py"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from typing import Sequence


from ..api import crd, identity, network, service, spec, topology
from ..api.groups import describe
from .. import render
from ..api.network import Peer
from ..render.network import NetworkPolicyConfig
from ..render.output import to_yaml
from . import submit
from .yamlfile import YAMLFileError, read_documents


def _parse_all(path: str, max_pods: int = spec.MAX_PODS_DEFAULT) -> tuple[list[spec.JobSpec | spec.ServiceSpec], list[str]]:
    """Every TPUTorchJob and TPUTorchService in a file, parsed, or every problem found."""
    jobs, problems = [], []
    try:
        docs = read_documents(path)
    except YAMLFileError as err:
        return [], [str(err)]
    except OSError as err:
        return [], [f"{path}: {err}"]
    for i, doc in enumerate(docs):
        where = f"{path}" + (f" (document {i + 1})" if len(docs) > 1 else "")
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or doc["kind"] not in crd.BUILDERS:
            kinds = " or ".join(crd.BUILDERS)
            problems.append(f"{where}: kind must be {kinds}, got {doc.get('kind') if isinstance(doc, dict) else type(doc).__name__!r}")
            continue
        try:
            parsed = spec.parse_any(doc, max_pods=max_pods)
            render.render_any(parsed)  # the child must fit what Kubernetes stores, as the operator checks
            jobs.append(parsed)
            if warning := identity.missing_identity(doc.get("spec") or {}):
                print(f"warning: {where}: {warning}", file=sys.stderr)
        except spec.InvalidSpec as err:
            problems.extend(f"{where}: {e}" for e in err.errors)
    return jobs, problems


def cmd_render(args) -> int:
    jobs, problems = _parse_all(args.file, args.max_pods_per_job)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    sys.stdout.write("---\n".join(to_yaml(render.render_any(job)) for job in jobs))
    return 0


def cmd_validate(args) -> int:
    jobs, problems = _parse_all(args.file, args.max_pods_per_job)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    for job in jobs:
        s = job.slice
        shape = f"{s.generation.name} {s.topology}, {s.hosts} host(s) x {s.chips_per_host} chips"
        if isinstance(job, spec.ServiceSpec):
            print(f"{job.name}: valid TPUTorchService; model {job.model_name}, {job.min_replicas}-{job.max_replicas} "
                  f"replica(s) of a {shape}, tensor parallel {job.tensor_parallel_size} x pipeline parallel "
                  f"{job.pipeline_parallel_size}")
        else:
            groups = "".join(f"; group {describe(g)}" for g in job.groups)
            print(f"{job.name}: valid; {shape}, {job.workers} worker(s) x {job.chips_per_worker} chip(s){groups}")
    return 0


def topology_rows(accelerator: str | None) -> list[dict]:
    # Every row trains: the table holds only slices Ray Train can reserve. Which serve, the service
    # parser's own predicate says.
    return [
        {
            "accelerator": s.generation.name,
            "gkeAccelerator": s.generation.gke_accelerator,
            "topology": s.topology,
            "chips": s.chips,
            "hosts": s.hosts,
            "chipsPerHost": s.chips_per_host,
            "machineType": s.machine_type,
            "podType": s.ray_pod_type,
            "workers": s.workers(1),
            "trains": True,
            "serves": service.serving_problem(s) is None,
        }
        for s in topology.all_slices(accelerator)
    ]


def cmd_topologies(args) -> int:
    try:
        rows = topology_rows(args.accelerator)
    except topology.TopologyError as err:
        print(f"--accelerator: {err.value!r} {err.message}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    headers = ["ACCELERATOR", "TOPOLOGY", "CHIPS", "HOSTS", "CHIPS/HOST", "MACHINE TYPE", "POD TYPE", "WORKERS (1 chip each)",
               "TRAINS", "SERVES"]
    keys = ["accelerator", "topology", "chips", "hosts", "chipsPerHost", "machineType", "podType", "workers", "trains", "serves"]
    cell = {True: "yes", False: "no"}
    table = [headers] + [[cell.get(r[k], str(r[k])) if isinstance(r[k], bool) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_doctor(args) -> int:
    from . import client, doctor
    from .doctor import cluster, network, read

    specs = None
    if args.storage_path is not None:
        from .doctor.smoke import storage_path_problem

        problem = ("--storage-path: only with --smoke (the probe object is written from the smoke's Ray job)"
                   if not args.smoke else storage_path_problem(args.storage_path))
        if problem:
            print(problem, file=sys.stderr)
            return 2
    if args.for_file:
        specs, problems = _parse_all(args.for_file)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 2
    try:
        api = client.connect(context=args.context, namespace=args.namespace, kubeconfig=args.kubeconfig)
    except client.ConnectError as err:
        print(err, file=sys.stderr)
        return 2
    if specs:
        # an object without metadata.namespace (parsed as "default") goes to the context's namespace
        specs = [dataclasses.replace(s, namespace=api.namespace) if s.namespace == "default" else s for s in specs]
    facts = read.read_facts(api.api_client, api.namespace, specs, timeout=args.timeout)
    results = doctor.run_checks(facts)
    if args.smoke:
        from .doctor import smoke

        deployments = facts["operator_deployments"]
        operator_args = cluster.operator_args(deployments[0]) if isinstance(deployments, list) and deployments else []
        try:
            if args.smoke_policy_mode == "none":
                operator_args = ["--no-network-policy"]
            elif args.smoke_policy_mode:
                operator_args = ["--network-policy-mode", args.smoke_policy_mode]
                operator_args += [a for p in args.smoke_policy_peer for a in ("--network-policy-peer", p)]
            policy = network.policy_config(operator_args)
        except ValueError as err:
            print(f"--smoke-policy-peer: {err}", file=sys.stderr)
            return 2
        say = (lambda text: print(text, file=sys.stderr)) if args.output == "json" else print
        try:
            results += smoke.run(api.api_client, api.namespace, args.smoke_image or smoke.DEFAULT_IMAGE, policy, args.smoke_timeout,
                                 args.service_account, say=say, storage_path=args.storage_path)
        except KeyboardInterrupt:
            print("interrupted: the smoke probe's objects are deleted", file=sys.stderr)
            return 130
    where = {"server": api.api_client.configuration.host, "namespace": api.namespace,
             "user": facts.get("user")}
    if args.output == "json":
        sys.stdout.write(doctor.format_json(results, where))
    else:
        sys.stdout.write(doctor.format_text(
            results, f"cluster {where['server']}, namespace {where['namespace']}, as {where['user'] or '?'}"))
    return doctor.exit_code(results)


def cmd_crd(args) -> int:
    sys.stdout.write(crd.crd_yaml(args.kind))
    return 0


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("namespace", "name"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        return json.dumps(entry)


def _setup_logging(fmt: str, verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter() if fmt == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    # kopf logs every handler step at INFO; ours says what was decided.
    logging.getLogger("kopf").setLevel(logging.DEBUG if verbose else logging.WARNING)


def _peer(text: str) -> Peer:
    """CIDR or NAMESPACE[:KEY=VALUE,...] -> Peer."""
    try:
        return network.parse_peer_text(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _endpoint(text: str) -> tuple[str, int, str]:
    """http://HOST:PORT/PATH -> (host, port, path)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise argparse.ArgumentTypeError(f"{text!r} must be http://HOST:PORT/PATH")
    return parts.hostname, port, parts.path or "/"


def cmd_run(args) -> int:
    import kopf

    from ..controller import handlers

    _setup_logging(args.log_format, args.verbose)
    cfg = handlers.CONFIG
    cfg.metrics_port, cfg.metrics_host = args.metrics_port, args.metrics_host
    cfg.readiness = args.readiness
    cfg.namespaces = args.namespace or None
    cfg.leader_election, cfg.lease_name, cfg.lease_namespace = args.leader_elect, args.lease_name, args.lease_namespace
    cfg.reconcile_workers = args.workers
    if args.status_interval is not None:
        cfg.status_interval = args.status_interval
    cfg.progress_interval = args.progress_interval
    cfg.ray_token_key_file = args.ray_token_key_file
    cfg.ray_token_previous_key_file = args.ray_token_previous_key_file
    cfg.max_pods_per_job = args.max_pods_per_job
    cfg.network_policy = NetworkPolicyConfig(
        args.network_policy_mode, tuple(args.network_policy_peer or ()),
        tuple(args.network_policy_metrics_peer or ())) if args.network_policy else None
    # kopf runs the process only; without peering: replicas are coordinated by the Lease.
    kopf.run(clusterwide=not args.namespace, namespaces=args.namespace or [], standalone=True,
             liveness_endpoint=args.liveness)
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of at least 1")
    return value


def _add_max_pods(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-pods-per-job", type=_positive_int, metavar="N",
                   default=_positive_int(os.environ.get(spec.MAX_PODS_ENV, str(spec.MAX_PODS_DEFAULT))),
                   help=f"the most pods one TPUTorchJob (head, submitter, slice, groups) or TPUTorchService (at "
                        f"spec.replicas.max) may make; default ${spec.MAX_PODS_ENV} or {spec.MAX_PODS_DEFAULT}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tputorch", description="Distributed PyTorch on one GKE TPU slice, through KubeRay.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the operator")
    run.add_argument("-n", "--namespace", action="append", help="watch this namespace (repeatable; kopf glob patterns allowed); default: all namespaces")
    run.add_argument("--all-namespaces", action="store_true", help="watch every namespace (the default when no --namespace is given)")
    run.add_argument("--liveness", metavar="URL", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--readiness", metavar="URL", type=_endpoint, default=None,
                     help="serve readiness, e.g. http://0.0.0.0:8081/readyz: 503 naming each store never listed "
                          "(the kinds, their children, pods), 200 otherwise (missing optional stores named)")
    run.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port (/metrics)")
    run.add_argument("--metrics-host", default="0.0.0.0", help="address for the metrics endpoint")
    run.add_argument("--leader-elect", action="store_true",
                     help="elect a leader through a coordination.k8s.io Lease: only the leader reconciles (run 2+ replicas)")
    run.add_argument("--lease-name", default="tputorch-operator", help="name of the Lease (with --leader-elect)")
    run.add_argument("--lease-namespace", default=None,
                     help="namespace of the Lease; default: the pod's own (POD_NAMESPACE or its service account's)")
    run.add_argument("--workers", type=int, default=16, help="objects reconciled at once (default 16)")
    run.add_argument("--status-interval", type=float, default=None, metavar="SECONDS",
                     help="at most one progress-only status write per object per SECONDS (host counts, messages); "
                          "phase changes are written at once; 0 writes every change (default 2)")
    run.add_argument("--progress-interval", type=float, default=30.0, metavar="SECONDS",
                     help="read a running job's training progress (tputorch.train.report) from its Ray dashboard "
                          "at most once per SECONDS; 0: never (default 30)")
    run.add_argument("--ray-token-key-file", metavar="PATH", default=os.environ.get("TPUTORCH_RAY_TOKEN_KEY_FILE"),
                     help="the key (at least 32 bytes) every Ray cluster's auth token is derived from; every replica "
                          "needs the same one (the chart mounts it); default $TPUTORCH_RAY_TOKEN_KEY_FILE, else a "
                          "key of this process only")
    run.add_argument("--ray-token-previous-key-file", metavar="PATH",
                     default=os.environ.get("TPUTORCH_RAY_TOKEN_PREVIOUS_KEY_FILE"),
                     help="the key before the last rotation: its tokens are tried where a Ray cluster refuses the "
                          "current key's (clusters made before the rotation); new tokens come from the current "
                          "key; a path with no file is no previous key")
    run.add_argument("--network-policy", action=argparse.BooleanOptionalAction, default=True,
                     help="give every Ray cluster a NetworkPolicy: its own pods reach every port, the dashboard "
                          "per --network-policy-mode, the peers below theirs (default on)")
    run.add_argument("--network-policy-mode", choices=network.POLICY_MODES, default="open",
                     help="open: the dashboard port (8265) from any source, Ray token auth guarding it (where GKE's "
                          "hosted KubeRay calls from is not documented); strict: only from --network-policy-peer "
                          "(default open)")
    peer_form = "CIDR|NAMESPACE[:KEY=VALUE,...]"
    run.add_argument("--network-policy-peer", action="append", type=_peer, metavar=peer_form,
                     help="KubeRay's and the operator's pods (by namespace, '*' for every one, and labels) or "
                          "address range: admitted to the dashboard in strict mode and to a service's Serve port "
                          "(repeatable)")
    run.add_argument("--network-policy-metrics-peer", action="append", type=_peer, metavar=peer_form,
                     help="metric scrapers admitted to Ray's metrics port (8080), e.g. gmp-system for Google Cloud "
                          "Managed Service for Prometheus (repeatable)")
    _add_max_pods(run)
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("-v", "--verbose", action="store_true")
    run.set_defaults(func=cmd_run)

    for name, func, text in (("render", cmd_render, "print the RayJob / RayService the operator would create"),
                             ("validate", cmd_validate, "validate TPUTorchJob and TPUTorchService file(s)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("file", help="YAML file with TPUTorchJobs and/or TPUTorchServices ('-' for stdin)")
        _add_max_pods(p)
        p.set_defaults(func=func)

    topo = sub.add_parser("topologies", help="list every supported TPU slice")
    topo.add_argument("--accelerator", help="only this generation (v4, v5e, v5p, v6e, tpu7x or a GKE label value)")
    topo.add_argument("-o", "--output", choices=["table", "json"], default="table")
    topo.set_defaults(func=cmd_topologies)

    crd_cmd = sub.add_parser("crd", help="print the CRDs (TPUTorchJob and TPUTorchService)")
    crd_cmd.add_argument("--kind", choices=list(crd.BUILDERS), help="only this kind's CRD")
    crd_cmd.set_defaults(func=cmd_crd)
    doc = sub.add_parser("doctor", help="check that the cluster can run jobs and services (read-only; exit 0/1)",
                         description="Read-only checks of the cluster of the kubeconfig context: one line each, "
                                     "ok, failed (with the fix and a doc link), warning (!) or unknown (?). "
                                     "Exit code: 0 when nothing failed, 1 otherwise, 2 bad usage.")
    doc.add_argument("--for", dest="for_file", metavar="FILE",
                     help="also say which TPU node pool each job and service of FILE would land on, or why none fits, "
                          "and whether the ServiceAccount each names exists in its namespace")
    doc.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                     help="how long each check may wait for the API server (default 10)")
    doc.add_argument("--smoke", action="store_true",
                     help="also run a CPU-only Ray job made as the operator makes one (token auth, its NetworkPolicy, "
                          "KubeRay's submitter) and wait for KubeRay to see it succeed; deletes what it made")
    doc.add_argument("--smoke-image", default=None, metavar="IMAGE",
                     help="the probe's Ray image (default rayproject/ray of the operator's default Ray version, "
                          "pulled from Docker Hub, which a private cluster without Cloud NAT cannot reach: "
                          "give a Ray image of that version from your own registry, such as your training image)")
    doc.add_argument("--smoke-timeout", type=float, default=300.0, metavar="SECONDS",
                     help="how long the probe may take (default 300: a head's image pull)")
    doc.add_argument("--smoke-policy-mode", choices=["open", "strict", "none"], default=None,
                     help="the probe's NetworkPolicy mode, as the operator's --network-policy-mode (none: no policy); "
                          "default: what the operator's Deployment runs with")
    doc.add_argument("--smoke-policy-peer", action="append", default=[], metavar="CIDR|NAMESPACE[:KEY=VALUE,...]",
                     help="with --smoke-policy-mode: as the operator's --network-policy-peer (repeatable)")
    doc.add_argument("--service-account", help="the probe's Ray pods' ServiceAccount")
    doc.add_argument("--storage-path", metavar="URI",
                     help="with --smoke: the checkpoint storage to probe (gs://BUCKET/PATH, as spec.checkpoint.storagePath): "
                          "the probe's Ray job writes, reads back and removes one object there with the pods' "
                          "ServiceAccount, through Ray Train's filesystem layer")
    doc.add_argument("-o", "--output", choices=["text", "json"], default="text")
    submit.add_connection_flags(doc)
    doc.set_defaults(func=cmd_doctor)
    submit.register(sub)  # submit, serve, get, describe, logs, delete, wait, upgrade-plan, rerender
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "all_namespaces", False) and args.namespace:
        print("--all-namespaces and --namespace exclude each other", file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
