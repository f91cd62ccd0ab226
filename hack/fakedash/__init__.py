"""A stand-in Ray dashboard for the local cluster (pure standard library).

Parts, each usable alone: state (what is remembered), jobs_api (Ray's Jobs API), serve_api (Ray
Serve's REST API), forwarder (real Ray backends and the reaper), submitters (the submitter pods:
signaller and runner), kube (the API server client), control (the control API), server (HTTP
routing and `main`). Run it with `python hack/fake_dashboard.py` or `python -m fakedash` from hack/.

The KubeRay operator runs out of cluster with HTTP_PROXY pointing here, so its dashboard calls
(`http://<raycluster>-head-svc.<ns>.svc.cluster.local:8265/api/...`) arrive as proxy-form
requests (absolute URL in the request line). Loopback traffic (the API server) is not proxied:
Go never proxies loopback hosts and NO_PROXY lists them too.

One dashboard per RayCluster, as in a real cluster: every piece of state (Ray jobs, Serve
applications) is kept per (namespace, RayCluster), the RayCluster being the first label of the
head service's host name. A RayJob run again under the same name gets a new RayCluster, so it never
sees the old run's jobs (nor their stop). The same API is also reachable directly (origin form) at
`/_ray/<ns>/<raycluster>/api/...`: that is the address the submitter runner gives the Ray CLI.

Token auth (auth.py): a RayCluster with `spec.authOptions.mode: token` (KubeRay 1.6) has a token in
its Secret; every call to it but Ray's public paths needs it (`Authorization` or
`X-Ray-Authorization: Bearer <token>`, or the dashboard cookie), else 401/403 exactly as a Ray 2.60
head answers (recorded/auth.json). Without API server access nothing is checked.

Ray dashboard API served (what KubeRay's dashboard client and RayService controller use, read in v1.5
and v1.6):
  GET    /api/jobs/                 job infos of that RayCluster
  GET    /api/jobs/<id>             job info; an unknown id is created with the default status
                                    (in K8sJobMode without a real backend nobody really submits)
  POST   /api/jobs/                 submit ({"submission_id": ...}) -> {"job_id", "submission_id"}
  POST   /api/jobs/<id>/stop        -> {"stopped": bool}
  DELETE /api/jobs/<id>             -> {"deleted": bool}
  GET    /api/jobs/<id>/logs        -> {"logs": "..."}
  GET    /api/v0/logs/file?submission_id=<id>&lines=<n>   the last n lines of that job's driver
                                    log (text/plain), as Ray 2.60's state API answers it
                                    (recorded/driver-log.json; an unknown id: Ray's error)
  GET    /api/authentication_mode   {"authentication_mode": "token" | "disabled"} (public)
  PUT    /api/serve/applications/   Serve config (ServeDeploySchema JSON), kept per RayCluster
  GET    /api/serve/applications/   ServeDetails: each application DEPLOYING (deployments UPDATING)
                                    until --serve-ready-after seconds after its config was put,
                                    then RUNNING (HEALTHY); see serve_details()
  GET    <head pod IP>:8000/-/healthz   the Serve proxy's health check KubeRay makes before it labels
                                    the head pod `ray.io/serve=true` (needs API server access to map
                                    the pod IP to its RayCluster): 200 once its applications run

Real Ray backends: a namespace (or one RayCluster) can be given a real Ray dashboard URL on
127.0.0.1 (`PUT /_control/backends/<ns>[/<raycluster>]`). Its dashboard calls are then forwarded
there unchanged (websockets too: `ray job logs --follow`) with that head's own token (given with the
backend) in place of the caller's, except that a job submission gets the
RayCluster's head container env as runtime_env env_vars under its own (on GKE the driver runs in
the head container with that env; here one real head serves many RayClusters). Such a cluster's
submitter pods are run for real by the submitter runner (see Runner) and, when its RayCluster is
deleted (suspend, job end), its unfinished Ray jobs are stopped, as the head pod's death would.
Its Ray pods are Ready only while the readiness probe KubeRay wrote passes against the Ray node that
stands for each (the prober, prober.py).

Control API (any request whose path starts with /_control/, sent directly, not through the proxy):
  GET    /_control/healthz
  GET    /_control/jobs                          every job
  GET    /_control/jobs/<ns>/<rayjob>            the newest job of that RayJob (404 if none)
  PUT    /_control/jobs/<ns>/<rayjob>            {"status": "SUCCEEDED", "message": "...",
                                                  "submitter_exit_code": 0}   (POST works too);
                                                 applies to the newest job of that RayJob, or, if
                                                 it has none yet, to its first one
  DELETE /_control/jobs/<ns>/<rayjob>
  PUT    /_control/jobs/<ns>/<rayjob>/log        {"lines": ["..."], "append": true}: what the newest
                                                 job's driver printed (/api/v0/logs/file serves it)
  GET    /_control/clusters                      every RayCluster's jobs and Serve state
  GET    /_control/serve/<ns>/<name>             Serve state of RayCluster <name>, or of the newest
                                                 RayCluster of RayService <name>
  PUT    /_control/serve/<ns>/<name>             {"status": "DEPLOY_FAILED", "message": "..."}:
                                                 every application of it reports that status
                                                 ({"status": null} back to the timed behaviour)
  GET    /_control/requests[?namespace=&rayjob=&cluster=]   dashboard requests seen, oldest first
  PUT    /_control/default                       {"status": "PENDING", "serve_ready_after": 2.0}
  GET|PUT|DELETE /_control/backends/<ns>[/<raycluster>]    {"url": "http://127.0.0.1:8265"}; optional
                                                 "token" (the real head's auth token), "serve_url",
                                                 "serve_variant", "serve_env" (the LLM replica's
                                                 extra env, cpu_serving.py), "probe_period" (s)
  GET    /_control/backends
  GET    /_control/submitters[?namespace=]       submitter pods the runner ran (pid, exit code, log)
  GET    /_control/submitters/<ns>/<pod>/log     what that pod's command printed (text)
  POST   /_control/reset                         forget everything (backends and runs too)

When a job is put in a terminal state (SUCCEEDED, FAILED, STOPPED) and the server was given API
server access (--kube-server/--kube-token-file/--kube-ca), it annotates the pods of the submitter
Job (same name as the RayJob) with `tputorch.local/fake-exit-code: "<code>"` (default 0); the KWOK
stage in hack/kwok-pod-stages.yaml then finishes them, as `ray job submit` would exit once the Ray
job ends. KubeRay only marks a K8sJobMode RayJob Complete/Failed once the submitter has finished.
"""
