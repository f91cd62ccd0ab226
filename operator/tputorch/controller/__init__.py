"""The operator process, I/O: informers, the per-key work queue, the reconcile, leader election, the API
adapter (kube), the two kinds' wiring, the kopf start/stop handlers and the metrics.

A TPUTorchService from ``kubectl apply`` to Ready (each step in this package unless a path says):
 1. handlers.start (kopf's startup) -> start_controller -> build: the Controller and one Informer
    per kind it reads. Each informer's threads (informer.Informer._run, over rest.RestSource) keep
    a slim copy of every object (stores.py) and hand each change to the event loop.
 2. The new object reaches reconcile.Controller.parent_changed, which queues its key
    (workqueue.WorkQueue.add). A worker (Controller.work: the workers start once the stores are
    listed and, with leader election, this replica leads; handlers.sync_then_run) takes it:
    reconcile_fenced -> reconcile -> reconcile_service, every decision made from the stores.
 3. reconcile_service: specs.Specs.parse (api/service.py parse_service), specs.Specs.child
    renders the RayService once per spec version (render/service.py rayservice); then
    child.ChildStep.ensure_rayservice creates it through
    kube.Kube, stamped with its rendering (render/stamp.py), its NetworkPolicy made beside it
    (extras.ExtraChildren.ensure).
 4. It derives the status (status/service.py derive_service: Pending, KubeRay has said nothing
    yet) and writes it: writes.StatusWrites.write -> Kube.patch_status, with the Events of what
    changed (events.py).
 5. KubeRay makes the RayCluster and its pods. Each change of the RayService (child_changed) or of
    a pod labelled with the service's name (pod_changed) queues the key again, and
    reconcile_service runs again: an edit of the spec goes to the live RayService (child.py; an
    operator upgrade alone changes nothing there: render/stamp.py child_patch), its
    RayClusters get the worker bounds (clusters.py), Kueue's admission is read (admission.py) and
    the status derived anew: Deploying while the slice and Serve come up; Ready once KubeRay's
    Ready condition holds, the Serve application and its LLM deployment are healthy and the
    RayService runs the current spec (status/service.py service_phase).
"""
