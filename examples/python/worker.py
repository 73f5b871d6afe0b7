#!/usr/bin/env python3
"""An example fencegate worker in Python, using only the standard library.

It takes the lease on a resource (waiting for it if another worker holds
it), resumes from the last checkpoint, and writes one step at a time to a
service through fencegate's write gate with the lease's Fencing-Token. A
keep-alive thread renews the lease every TTL/3. After each write the worker
saves its progress with a checkpoint (which also renews the lease), and when
every step is written it releases the lease as finished.

Loss is decided locally and conservatively: the lease counts as lost at the
first refused renewal, or when no renewal was confirmed by the local
deadline, which is the time the last confirmed request was *sent* (by the
monotonic clock) plus the TTL, minus a margin. The server's timestamps are
never used. Once lost, the worker writes nothing more and exits 76; a write
that was already on its way is refused by the gate (409 stale-token), which
is what actually fences it.

Usage:
    worker.py [--api URL] [--gate URL] [--resource job:ID] [--path /jobs/{id}]
              [--owner O] [--ttl SECONDS] [--interval SECONDS] [--steps N]

FENCEGATE_API_URL and FENCEGATE_API_TOKEN are read from the environment,
and GATE_URL (as the shell example does) for the default of --gate.
Each write is PUT <gate><path>, where {id} in --path is the resource's part
after its first ':' (job:43 writes /jobs/43): the gate of the README's quick
start (rule "PUT,PATCH,DELETE /jobs/{id} fence job:{id}") fences it on the
resource itself. Fencing-Resource is sent too, for a gate without rules.
The worker prints one JSON line per event on stdout; a refused write prints
the problem's code. Exit status: 0 done, 75 not acquired within the wait,
76 lease lost, 1 other errors.
"""

import argparse
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

EXIT_NOT_ACQUIRED = 75
EXIT_LOST = 76


def emit(**fields):
    fields["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(fields), flush=True)


class Refused(Exception):
    """The server answered with a problem (4xx/5xx)."""

    def __init__(self, status, problem):
        super().__init__("%d %s" % (status, problem.get("code", "")))
        self.status = status
        self.code = problem.get("code", "")
        self.problem = problem


class Lease:
    """A lease on one resource, kept alive by a background thread."""

    def __init__(self, api, resource, owner, ttl, token=None, margin=None):
        self.api = api.rstrip("/")
        self.resource = resource
        self.owner = owner
        self.ttl = ttl
        self.margin = margin if margin is not None else ttl / 10
        self.api_token = os.environ.get("FENCEGATE_API_TOKEN", "")
        self.token = None
        self._lock = threading.Lock()
        self._deadline = 0.0  # monotonic; guarded by _lock
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    # -- the lease API ---------------------------------------------------
    def _call(self, method, suffix, body=None, timeout=None):
        url = "%s/v1/leases/%s%s" % (self.api, urllib.parse.quote(self.resource, safe=""), suffix)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_token:
            req.add_header("Authorization", "Bearer " + self.api_token)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.ttl) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                problem = json.load(e)
            except ValueError:
                problem = {}
            raise Refused(e.code, problem) from None

    def acquire(self, wait):
        """Takes the lease, waiting up to wait seconds (at most 60)."""
        sent = time.monotonic()
        lease = self._call("POST", "/acquire", {"owner": self.owner, "ttl_seconds": self.ttl,
                                                "wait_seconds": wait}, timeout=wait + self.ttl)
        if time.monotonic() - sent > self.ttl / 3:
            # The server waited: acquire again as the same owner (which
            # extends the lease, same token) so the deadline is recent.
            sent = time.monotonic()
            lease = self._call("POST", "/acquire", {"owner": self.owner, "ttl_seconds": self.ttl})
        self.token = lease["token"]
        self._confirm(sent)
        self._thread = threading.Thread(target=self._keep_alive, daemon=True)
        self._thread.start()
        return lease

    def _confirm(self, sent):
        with self._lock:
            self._deadline = max(self._deadline, sent + self.ttl - self.margin)

    def held(self):
        """True while the lease is certainly held, by the local clock."""
        with self._lock:
            return not self._lost.is_set() and time.monotonic() < self._deadline

    def lose(self, why):
        """Marks the lease lost (once, whichever thread notices first)."""
        with self._lock:
            if self._lost.is_set():
                return
            self._lost.set()
        emit(event="lost", owner=self.owner, token=self.token, why=why)

    def _keep_alive(self):
        next_renew = time.monotonic() + self.ttl / 3
        while not self._stop.is_set():
            with self._lock:
                deadline = self._deadline
            now = time.monotonic()
            if now >= deadline:
                self.lose("no renewal confirmed before the local deadline")
                return
            if self._stop.wait(max(0.0, min(next_renew, deadline) - now)):
                return
            if time.monotonic() < next_renew:
                continue
            sent = time.monotonic()
            try:
                # Bound the call by the deadline: past it, nothing counts.
                self._call("POST", "/renew", {"owner": self.owner, "token": self.token},
                           timeout=max(0.1, deadline - sent))
            except Refused as e:
                if 400 <= e.status < 500 and e.status not in (408, 429):
                    self.lose("renewal refused: " + e.code)
                    return
                next_renew = time.monotonic() + min(1.0, self.ttl / 15)
                continue
            except OSError:  # no answer: retry until the deadline
                next_renew = time.monotonic() + min(1.0, self.ttl / 15)
                continue
            self._confirm(sent)
            next_renew = sent + self.ttl / 3

    def checkpoint(self, state):
        """Saves progress state; it also renews the lease."""
        sent = time.monotonic()
        try:
            self._call("PUT", "/checkpoint", {"owner": self.owner, "token": self.token, "state": state})
        except Refused as e:
            if e.code == "lease-lost":
                self.lose("checkpoint refused")
            raise
        self._confirm(sent)

    def read_checkpoint(self):
        try:
            return self._call("GET", "/checkpoint")
        except Refused as e:
            if e.code == "no-checkpoint":
                return None
            raise

    def release(self, finished):
        """Stops renewing (first, so nothing is sent on the lease after)
        and releases it; finished tells the next holder the work is done."""
        self._stop.set()
        self._lost.set()  # from here on the worker must not write
        if self._thread:
            self._thread.join()
        return self._call("POST", "/release", {"owner": self.owner, "token": self.token,
                                               "finished": finished})["released"]


def expand_path(template, resource):
    """Fills {id} with the resource's part after its first ':'."""
    _, sep, ident = resource.partition(":")
    return template.replace("{id}", urllib.parse.quote(ident if sep else resource, safe=""))


def problem_code(raw):
    """The code of a problem+json answer, or "" when it is not one."""
    try:
        return json.loads(raw).get("code", "")
    except (ValueError, AttributeError):
        return ""


def write(gate, path, lease, body):
    """PUTs body through the gate with the lease's fencing headers; returns
    the status and, for a refusal, the problem's code."""
    url = gate.rstrip("/") + expand_path(path, lease.resource)
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
    req.add_header("Content-Type", "application/json")
    req.add_header("Fencing-Token", str(lease.token))
    req.add_header("Fencing-Resource", lease.resource)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()
            return resp.status, ""
    except urllib.error.HTTPError as e:
        return e.code, problem_code(e.read())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--api", default=os.environ.get("FENCEGATE_API_URL", "http://127.0.0.1:7070"))
    p.add_argument("--gate", default=os.environ.get("GATE_URL", "http://127.0.0.1:8080"))
    p.add_argument("--resource", default="job:demo")
    p.add_argument("--path", default="/jobs/{id}", help="path of the writes; {id} is the resource after its first ':'")
    p.add_argument("--owner", default="%s:%d" % (socket.gethostname(), os.getpid()))
    p.add_argument("--ttl", type=int, default=30, help="lease TTL in whole seconds")
    p.add_argument("--wait", type=int, default=60, help="seconds to wait for the lease (at most 60)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between writes")
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()

    lease = Lease(args.api, args.resource, args.owner, args.ttl)
    try:
        lease.acquire(args.wait)
    except Refused as e:
        emit(event="not-acquired", owner=args.owner, code=e.code)
        return EXIT_NOT_ACQUIRED if e.code == "lease-held" else 1
    emit(event="lead", owner=lease.owner, token=lease.token)

    cp = lease.read_checkpoint()
    step = cp["state"]["next"] if cp else 0
    while step < args.steps:
        if not lease.held():
            lease.lose("local deadline passed")
            return EXIT_LOST
        try:
            status, code = write(args.gate, args.path, lease, {"owner": lease.owner, "token": lease.token, "step": step})
        except OSError as e:  # no answer: the write may or may not be applied; PUT is idempotent
            emit(event="retry", owner=lease.owner, step=step, error=str(e))
            time.sleep(args.interval)
            continue
        if status == 409:
            emit(event="refused", by="gate", owner=lease.owner, token=lease.token, step=step, status=status, code=code)
            lease.lose("write refused by the gate")
            return EXIT_LOST
        if status // 100 != 2:
            emit(event="error", owner=lease.owner, status=status, code=code, step=step)
            lease.release(False)
            return 1
        emit(event="write", owner=lease.owner, token=lease.token, step=step)
        step += 1
        try:
            lease.checkpoint({"next": step})
        except Refused as e:
            if e.code == "lease-lost":
                return EXIT_LOST
            emit(event="retry", owner=lease.owner, what="checkpoint", code=e.code)
        except OSError as e:
            emit(event="retry", owner=lease.owner, what="checkpoint", error=str(e))
        time.sleep(args.interval)

    released = lease.release(True)
    emit(event="done", owner=lease.owner, token=lease.token, released=released)
    return 0


if __name__ == "__main__":
    sys.exit(main())
