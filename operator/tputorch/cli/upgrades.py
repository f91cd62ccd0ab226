"""`tputorch rerender` and `tputorch upgrade-plan`: the user's side of the upgrade rule
(render/stamp.py). A child keeps the rendering it was made with until its parent's spec changes or
the user asks for the new one: `rerender` asks (the parent's tputorch.io/rerender annotation);
`upgrade-plan` lists, before or after an operator upgrade, what this CLI version's rendering would
change on each object's next edit. ``plan_row`` is pure; the commands are the API calls around it.
"""

from __future__ import annotations

import datetime as dt
import json
import sys

from .. import render
from ..render.names import RAYSERVICE_ANNOTATIONS
from ..render.raytoken import ray_token_secret_name, with_ray_token_secret
from ..api.spec import InvalidSpec, parse_any
from ..render import stamp as stamps
from ..status import rendering
from . import client
from .manage import table
from .display import FAILED, OK

NO_CHANGE = "none"
IN_PLACE = "in place"
NEW_CLUSTER = "new RayCluster"
NEXT_ATTEMPT = "next attempt"  # a job's running attempt is never changed; its next one is rendered anew


def plan_row(kind: str, parent: dict, child: dict | None) -> dict:
    """What this CLI's rendering would change on the object's next edit: ``change`` is
    NO_CHANGE, IN_PLACE (a RayService: no field of KubeRay's cluster hash), NEW_CLUSTER (KubeRay
    starts a second RayCluster, a second set of TPU slices until it is ready), NEXT_ATTEMPT (a job),
    "refused: ..." (this CLI's checks refuse the spec) or "no child"; ``fields`` the paths that change."""
    meta = parent.get("metadata") or {}
    row = {"namespace": meta.get("namespace", ""), "name": meta.get("name", ""), "kind": kind,
           "renderedBy": "", "generation": "", "change": "no child", "fields": []}
    if child is None:
        return row
    found = stamps.read(child)
    row["renderedBy"] = found.version if found is not None else stamps.UNKNOWN_VERSION
    row["generation"] = str(found.generation) if found is not None and found.generation is not None else ""
    try:
        fresh = render.render_any(parse_any(parent))
    except InvalidSpec as err:
        row["change"] = "refused: " + "; ".join(str(e) for e in err.errors)
        return row
    service = kind == client.SERVICE.kind
    running = stamps.running_rendering(child, found, RAYSERVICE_ANNOTATIONS if service else ())
    # named at the child's creation, not rendered; a RayService without one gets one with the edit
    # that starts it a new RayCluster
    if service:
        rendering.name_token_secret(child, running, fresh)
    elif token_secret := ray_token_secret_name(child):
        with_ray_token_secret(fresh, token_secret)
    new = stamps.rendering(fresh)
    row["fields"] = rendering.changed_fields(found, running, new)
    if not row["fields"]:
        row["change"] = NO_CHANGE
    elif not service:
        row["change"] = NEXT_ATTEMPT
    else:
        row["change"] = NEW_CLUSTER if rendering.new_cluster(running["spec"], new["spec"]) else IN_PLACE
    return row


# ---------------------------------------------------------------- commands

def _api(a) -> client.Api:
    return client.connect(context=a.context, namespace=a.namespace, kubeconfig=a.kubeconfig)


def cmd_upgrade_plan(a) -> int:
    api = _api(a)
    namespace = None if a.all_namespaces else api.namespace
    rows = []
    for kind in client.KINDS:
        for obj in api.list(kind, namespace):
            meta = obj["metadata"]
            child = api.child(kind, meta["name"], meta["namespace"])
            rows.append(plan_row(kind.kind, obj, child))
    if a.output == "json":
        print(json.dumps({"operatorVersion": stamps.OPERATOR_VERSION, "items": rows}, indent=2))
        return OK
    if not rows:
        print(f"No TPUTorchJobs or TPUTorchServices in {'any namespace' if namespace is None else 'namespace ' + namespace}.",
              file=sys.stderr)
        return OK
    headers = ["NAMESPACE", "NAME", "KIND", "RENDERED BY", "GENERATION", f"ON NEXT EDIT ({stamps.OPERATOR_VERSION})", "FIELDS"]
    print(table(headers, [[r["namespace"], r["name"], r["kind"], r["renderedBy"], r["generation"], r["change"],
                           ", ".join(r["fields"][:3]) + (f" (+{len(r['fields']) - 3})" if len(r["fields"]) > 3 else "")]
                          for r in rows]))
    return OK


def cmd_rerender(a) -> int:
    """Set the rerender annotation of each named service (or every one of the namespace): the
    operator applies its rendering to the RayService once for that value."""
    api = _api(a)
    if bool(a.names) == bool(a.all):
        print("name one or more services, or --all", file=sys.stderr)
        return FAILED
    if a.all:
        targets = [(o["metadata"]["namespace"], o["metadata"]["name"])
                   for o in api.list(client.SERVICE, None if a.all_namespaces else api.namespace)]
    else:
        targets = []
        for name in a.names:
            found = api.find(name, api.namespace)
            if found is None or found[0] is not client.SERVICE:
                print(f"no TPUTorchService {name!r} in namespace {api.namespace}"
                      + ("; a TPUTorchJob's running attempt keeps its rendering, its next attempt gets this "
                         "operator's" if found is not None else ""), file=sys.stderr)
                return FAILED
            targets.append((api.namespace, name))
    value = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for namespace, name in targets:
        api.annotate(client.SERVICE, name, namespace, {stamps.RERENDER_ANNOTATION: value})
        print(f"tputorchservice.tputorch.io/{name} -n {namespace}: the operator's current rendering asked for "
              f"({stamps.RERENDER_ANNOTATION}={value})")
    return OK


def register(sub, add_connection_flags) -> None:
    p = sub.add_parser("upgrade-plan", help="list what this CLI's rendering (its package's release) would change on "
                                            "each job's and service's next edit (a new RayCluster, in place, nothing)")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    add_connection_flags(p)
    p.set_defaults(func=cmd_upgrade_plan)

    r = sub.add_parser("rerender", help="apply the running operator's rendering to services now (their "
                                        f"{stamps.RERENDER_ANNOTATION} annotation), rather than on their next edit")
    r.add_argument("names", nargs="*", metavar="NAME")
    r.add_argument("--all", action="store_true", help="every service of the namespace (with -A: of every namespace)")
    r.add_argument("-A", "--all-namespaces", action="store_true")
    add_connection_flags(r)
    r.set_defaults(func=cmd_rerender)
