"""What `tputorch submit/serve/wait` show and which exit code they return.

`view()` turns a TPUTorchJob or TPUTorchService object into a View (pure); the renderers print
Views, driver-log lines and notices: `PlainRenderer` (one line per change, for pipes and CI),
`JsonRenderer` (one JSON object per line) and `RichRenderer` (a live panel on a terminal). rich is
imported only by RichRenderer, so nothing else (the operator least of all) loads it.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TextIO

from ..api.status_schema import GOODPUT_PARTS
from ..status.applied import NEVER_APPLIED

# Exit codes of the user commands.
OK, FAILED, INVALID, INTERRUPTED = 0, 1, 2, 130

JOB_KIND, SERVICE_KIND = "TPUTorchJob", "TPUTorchService"
# Waiting reasons worth a person's attention (the others say only "not yet").
_QUIET_WAITING = {"Creating", "WaitingForHosts", "Valid", "JobFinished", "AllHostsReady"}


@dataclass(frozen=True)
class View:
    kind: str
    name: str
    namespace: str
    phase: str  # "" until the operator has written a status
    hosts: int | None
    ready_hosts: int | None
    waiting: str | None  # why it is not running yet: the scheduler's message, a missing KubeRay, ...
    ray_status: str | None  # the Ray job's status (KubeRay's jobStatus)
    message: str
    endpoint: str | None
    reason: str | None  # the failure's reason (KubeRay's, or ValidationFailed)
    attempt: int = 1  # a job's current attempt (status.attempts)
    progress: str = ""  # what the training script last reported (status.progress), for a person
    not_applied: str | None = None  # a service's edit that KubeRay will never apply: why (SpecApplied)

    def to_json(self) -> dict:
        """camelCase, as the Kubernetes objects it comes from."""
        return {"kind": self.kind, "name": self.name, "namespace": self.namespace, "phase": self.phase,
                "hosts": self.hosts, "readyHosts": self.ready_hosts, "waiting": self.waiting,
                "rayJobStatus": self.ray_status, "message": self.message, "endpoint": self.endpoint,
                "reason": self.reason, "attempt": self.attempt, "progress": self.progress,
                "notApplied": self.not_applied}

    @property
    def hosts_text(self) -> str:
        return f"{self.ready_hosts or 0}/{self.hosts} TPU hosts" if self.hosts else ""


def _conditions(status: dict) -> dict[str, dict]:
    return {c.get("type"): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def _waiting(status: dict) -> str | None:
    conds = _conditions(status)
    for ctype in ("RayJobCreated", "RayServiceCreated", "Admitted", "SliceReady"):  # Admitted: Kueue's queue
        cond = conds.get(ctype) or {}
        if cond.get("status") == "False" and cond.get("reason") not in _QUIET_WAITING:
            return cond.get("message") or cond.get("reason")
    return None


def _not_applied(status: dict) -> str | None:
    """SpecApplied False for a reason after which the service serves its old spec for ever
    (upgradeStrategy None, a tolerations edit on KubeRay 1.6): its message."""
    cond = _conditions(status).get("SpecApplied") or {}
    if cond.get("status") == "False" and cond.get("reason") in NEVER_APPLIED:
        return cond.get("message") or cond.get("reason")
    return None


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def progress_text(status: dict, metrics_shown: int = 4) -> str:
    """status.progress for a person: 'step 1200, epoch 3, loss 0.4127, lr 0.0001'."""
    p = status.get("progress")
    if not isinstance(p, dict):
        return ""
    parts = [f"{k} {p[k]}" for k in ("step", "epoch") if isinstance(p.get(k), int)]
    metrics = p.get("metrics") if isinstance(p.get("metrics"), dict) else {}
    parts += [f"{k} {_number(v)}" for k, v in list(metrics.items())[:metrics_shown] if isinstance(v, (int, float))]
    return ", ".join(parts)


def duration(seconds: float) -> str:
    """'1h02m', '5m07s', '12.3s'."""
    whole = int(seconds)
    if whole >= 3600:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{seconds:.1f}s"


GOODPUT_ATTEMPTS_SHOWN = 3  # the latest attempts beside the job's column


def goodput_summary(status: dict) -> str:
    """status.goodput in a line: '47.4% productive of 31m40s (as of ...)' ('' without one)."""
    g = status.get("goodput")
    if not isinstance(g, dict) or not isinstance(g.get("wallClockSeconds"), (int, float)):
        return ""
    as_of = f" (as of {g['asOf']})" if g.get("asOf") else ""
    return f"{100 * (g.get('productiveFraction') or 0):.1f}% productive of {duration(g['wallClockSeconds'])}{as_of}"


def goodput_table(status: dict) -> tuple[list[str], list[list[str]]]:
    """The ledger's parts (rows) for the job and its latest attempts (columns), each with its share
    of the job's wall-clock; the parts no column has are left out."""
    g = status.get("goodput") or {}
    attempts = [a for a in g.get("attempts") or [] if isinstance(a, dict)][-GOODPUT_ATTEMPTS_SHOWN:]
    columns = [g.get("seconds") or {}] + [a.get("seconds") or {} for a in attempts]
    wall = g.get("wallClockSeconds") or 0
    headers = ["PART", "JOB", "%"] + [f"ATTEMPT {a.get('attempt', '?')}" for a in attempts]
    body = []
    for part in GOODPUT_PARTS:
        values = [c.get(part) or 0 for c in columns]
        if not any(values):
            continue
        share = f"{100 * values[0] / wall:.1f}" if wall else ""
        body.append([part, duration(values[0]), share] + [duration(v) for v in values[1:]])
    return headers, body


def view(kind: str, obj: dict) -> View:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    phase = status.get("phase") or ""
    failed = _conditions(status).get("Failed") or {}
    return View(
        kind=kind,
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        phase=phase,
        hosts=status.get("hosts"),
        ready_hosts=status.get("readyHosts"),
        waiting=None if phase in ("Succeeded", "Failed", "Ready") else _waiting(status),
        ray_status=status.get("jobStatus"),
        message=status.get("message") or "",
        endpoint=status.get("endpoint"),
        reason=(failed.get("reason") or "Failed") if phase == "Failed" else None,
        attempt=status.get("attempts") if isinstance(status.get("attempts"), int) else 1,
        progress=progress_text(status),
        not_applied=_not_applied(status) if kind == SERVICE_KIND else None,
    )


def outcome(v: View, target: str) -> int | None:
    """The exit code once the object has reached `target` or can no longer reach it; None meanwhile.

    A job ends Succeeded or Failed; a service is waited for until Ready (or Failed). A spec the
    operator refused is INVALID, as a spec refused locally is. A service edit KubeRay will never
    apply is FAILED although the phase stays Ready: the Ready is the old spec's.
    """
    if v.not_applied:
        return FAILED
    if v.phase == target:
        return OK
    if v.phase == "Failed":
        return INVALID if v.reason == "ValidationFailed" else FAILED
    if v.kind == JOB_KIND and v.phase == "Succeeded":  # waiting for something else, e.g. Running
        return FAILED
    return None


def summary(v: View) -> str:
    """One line for a person: phase, hosts, Ray job status, what it waits for."""
    parts = [v.phase or "Submitted"]
    if v.attempt > 1:
        parts.append(f"attempt {v.attempt}")
    if v.phase == "Retrying" and v.message:
        parts.append(v.message)
    if v.hosts_text:
        parts.append(v.hosts_text)
    if v.ray_status:
        parts.append(f"Ray job {v.ray_status}")
    if v.progress:
        parts.append(v.progress)
    if v.endpoint:
        parts.append(f"endpoint {v.endpoint}")
    if v.waiting:
        parts.append(f"waiting: {v.waiting}")
    return "  ".join(parts)


def final_text(v: View, code: int) -> str:
    who = f"{v.kind} {v.namespace}/{v.name}"
    if code == OK and v.kind == SERVICE_KIND:
        return f"{who} is Ready; endpoint: {v.endpoint or '(not reported)'}"
    if code == OK:
        return f"{who} {v.phase}"
    if v.not_applied:
        return f"{who} keeps serving its previous spec ({v.phase}): the last edit is not applied: {v.not_applied}"
    return f"{who} {v.phase or 'ended'} ({v.reason or 'no reason given'}): {v.message}".rstrip(": ")


def interrupted_text(kind: str, name: str, namespace: str) -> str:
    follow = f"tputorch logs -f {name} -n {namespace}" if kind == JOB_KIND else f"tputorch describe {name} -n {namespace}"
    return (f"Interrupted: {kind} {namespace}/{name} keeps running. "
            f"Follow it: {follow}; stop it: tputorch delete {name} -n {namespace}")


def _clock(start: float) -> str:
    s = int(time.monotonic() - start)
    return f"{s // 60:d}:{s % 60:02d}"


class PlainRenderer:
    """A status line each time it changes (with the time since start), log lines as they come."""

    def __init__(self, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> None:
        self.out, self.err = out, err
        self.start = time.monotonic()
        self.last = None

    def _print(self, text: str, stream: TextIO | None = None) -> None:
        stream = stream or self.out
        stream.write(text + "\n")
        stream.flush()

    def created(self, kind: str, name: str, namespace: str) -> None:
        self._print(f"{kind.lower()}.tputorch.io/{name} created in namespace {namespace}")

    def update(self, v: View) -> None:
        line = summary(v)
        if line != self.last:
            self.last = line
            self._print(f"[{_clock(self.start)}] {v.name}: {line}")

    def log(self, line: str) -> None:
        self._print(line)

    def notice(self, text: str) -> None:
        self._print(text, self.err)

    def finish(self, v: View, code: int) -> None:
        self._print(final_text(v, code), self.out if code == OK else self.err)

    def interrupted(self, kind: str, name: str, namespace: str) -> None:
        self._print(interrupted_text(kind, name, namespace), self.err)

    def close(self) -> None:
        pass


class JsonRenderer:
    """One JSON object per line on stdout: created, status, log, notice, finished, interrupted."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.last = None

    def _emit(self, event: str, **fields) -> None:
        self.out.write(json.dumps({"event": event, **fields}) + "\n")
        self.out.flush()

    def created(self, kind: str, name: str, namespace: str) -> None:
        self._emit("created", kind=kind, name=name, namespace=namespace)

    def update(self, v: View) -> None:
        fields = v.to_json()
        if fields != self.last:
            self.last = fields
            self._emit("status", **fields)

    def log(self, line: str) -> None:
        self._emit("log", line=line)

    def notice(self, text: str) -> None:
        self._emit("notice", message=text)

    def finish(self, v: View, code: int) -> None:
        self._emit("finished", **v.to_json(), exitCode=code, summary=final_text(v, code))

    def interrupted(self, kind: str, name: str, namespace: str) -> None:
        self._emit("interrupted", kind=kind, name=name, namespace=namespace, exitCode=INTERRUPTED,
                   message=interrupted_text(kind, name, namespace))

    def close(self) -> None:
        pass


_PHASE_STYLE = {"Succeeded": "bold green", "Ready": "bold green", "Running": "bold cyan", "Failed": "bold red",
                "Pending": "bold yellow", "Retrying": "bold yellow", "Deploying": "bold yellow", "Updating": "bold yellow", "Degraded": "bold red",
                "Recovering": "bold yellow", "Queued": "bold yellow", "Preempted": "bold red"}


class RichRenderer:
    """A live panel at the bottom of the terminal (phase, hosts bar, Ray job, what it waits for);
    the driver log scrolls above it."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        self.console = Console(file=out)
        self.start = time.monotonic()
        self.current: View | None = None
        self.done = False
        self.spinner = Spinner("dots")
        # Started at the first status: a refused create leaves no panel behind.
        self.live = Live(console=self.console, refresh_per_second=4, transient=False, get_renderable=self._panel)

    def _panel(self):
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        v = self.current
        if v is None:
            return Spinner("dots", text=" submitting")
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        title = Text.assemble("" if self.done else self.spinner.render(time.monotonic()), " ", (v.phase or "Submitted", _PHASE_STYLE.get(v.phase, "bold")),
                              f"  {v.kind} {v.namespace}/{v.name}  ", (_clock(self.start), "dim"))
        if v.hosts:
            bar = Table.grid(padding=(0, 1))
            bar.add_row(ProgressBar(total=v.hosts, completed=v.ready_hosts or 0, width=30),
                        Text(f"{v.ready_hosts or 0}/{v.hosts}"))
            grid.add_row("TPU hosts", bar)
        if v.ray_status:
            grid.add_row("Ray job", v.ray_status)
        if v.progress:
            grid.add_row("Progress", v.progress)
        if v.endpoint:
            grid.add_row("Endpoint", v.endpoint)
        if v.waiting:
            grid.add_row(Text("Waiting", style="bold yellow"), Text(v.waiting, style="yellow"))
        return Group(title, grid)

    def created(self, kind: str, name: str, namespace: str) -> None:
        self.console.print(f"[green]✓[/] {kind} [bold]{namespace}/{name}[/] created")

    def update(self, v: View) -> None:
        self.current = v
        if not self.live.is_started:
            self.live.start()
        self.live.refresh()

    def log(self, line: str) -> None:
        self.console.print(line, markup=False, highlight=False, emoji=False)

    def notice(self, text: str) -> None:
        self.console.print(text, style="dim", markup=False, highlight=False)

    def finish(self, v: View, code: int) -> None:
        self.current, self.done = v, True
        self.close()
        style = "bold green" if code == OK else "bold red"
        self.console.print(("✓ " if code == OK else "✗ ") + final_text(v, code), style=style, markup=False, highlight=False)

    def interrupted(self, kind: str, name: str, namespace: str) -> None:
        self.done = True
        self.close()
        self.console.print(interrupted_text(kind, name, namespace), style="yellow", markup=False, highlight=False)

    def close(self) -> None:
        if self.live.is_started:
            self.live.stop()


def renderer(output: str, out: TextIO = sys.stdout, err: TextIO = sys.stderr):
    """JSON when asked, the live panel on a terminal (when rich is installed), plain lines otherwise."""
    if output == "json":
        return JsonRenderer(out)
    if out.isatty():
        try:
            return RichRenderer(out)
        except ImportError:
            err.write("(install tputorch-operator[cli] for the live display)\n")
    return PlainRenderer(out, err)
