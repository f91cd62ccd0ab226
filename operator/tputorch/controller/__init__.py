"""The operator process, I/O: informers, the per-key work queue, the reconcile, leader election, the API
adapter (kube), the two kinds' wiring, the kopf start/stop handlers and the metrics."""
