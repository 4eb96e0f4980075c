#!/usr/bin/env python3
"""The service bench's two halves (scripts/real-node-scenarios service).

  service.py client IP PORT RATE TIMEOUT STOPFILE OUT
      In a node (the guest's python3): a steady stream of HTTP GETs to IP:PORT, RATE a second, each
      on its own connection (so that kube-proxy picks an endpoint for each) and given TIMEOUT
      seconds, until STOPFILE exists; then OUT gets one line per request:
      `start end ok what` (guest epoch seconds; ok 1 or 0; what: the status line or the error).

  service.py watch OUT NODE_A KUBECTL_ARGS...
      On this machine: runs `kubectl KUBECTL_ARGS` (a `get -w -o json` of pods or EndpointSlices)
      again whenever it ends, until SIGTERM, and writes to OUT one line per object it prints,
      stamped with this machine's HH:MM:SS.mmm: for a pod `name|node|deletionTimestamp|phase|ready`,
      for an EndpointSlice `a=N b=M`, its ready endpoints on NODE_A and elsewhere.

  service.py report --client FILE --offset S --t0 HH:MM:SS.mmm --off HH:MM:SS.mmm --pods FILE
                    --eps FILE --console FILE --node A --peer B --way W --prestop yes|no --row FILE
      On this machine: the client's record (its clock moved by S seconds onto this machine's),
      the pods' and the EndpointSlice's watch logs and node A's console (each line stamped with
      this machine's HH:MM:SS.mmm), from the power-off command at T0 to A off at OFF; prints the
      run's figures and phases and appends one tab-separated row to FILE.

  service.py table FILE
      The rows of FILE as a table.
"""
import sys
import threading
import time


def client(ip, port, rate, timeout, stopfile, out):
    import os
    import socket

    rate, timeout, port = float(rate), float(timeout), int(port)
    results = []
    lock = threading.Lock()

    def one():
        start = time.time()
        ok, what = 0, ""
        try:
            with socket.create_connection((ip, port), timeout=timeout) as conn:
                conn.settimeout(max(0.05, timeout - (time.time() - start)))
                conn.sendall(b"GET / HTTP/1.0\r\nHost: service\r\n\r\n")
                data = b""
                while b"\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                line = data.split(b"\r\n", 1)[0].decode(errors="replace")
                ok = 1 if " 200 " in line + " " else 0
                what = line.replace(" ", "_") or "empty-reply"
        except Exception as e:  # a failure is the figure, whatever it was
            what = type(e).__name__
        with lock:
            results.append((start, time.time(), ok, what))

    threads = []
    step = 1.0 / rate
    due = time.time()
    while not os.path.exists(stopfile):
        t = threading.Thread(target=one, daemon=True)
        t.start()
        threads.append(t)
        threads = [t for t in threads if t.is_alive()]
        due += step
        time.sleep(max(0.0, due - time.time()))
    deadline = time.time() + timeout + 1
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    with lock, open(out + ".tmp", "w") as f:
        for start, end, ok, what in sorted(results):
            f.write(f"{start:.3f} {end:.3f} {ok} {what}\n")
    os.rename(out + ".tmp", out)


def summary(obj, node_a):
    if obj.get("kind") == "EndpointSlice":
        ready = [e.get("nodeName", "") for e in obj.get("endpoints") or [] if (e.get("conditions") or {}).get("ready")]
        a = sum(1 for n in ready if n == node_a)
        return f"a={a} b={len(ready) - a}"
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {})
    ready = next((c.get("status", "") for c in status.get("conditions") or [] if c.get("type") == "Ready"), "")
    return "|".join([meta.get("name", ""), spec.get("nodeName", ""), meta.get("deletionTimestamp", ""),
                     status.get("phase", ""), ready])


def watch(out, node_a, *kubectl):
    import datetime
    import json
    import signal
    import subprocess

    child = None

    def stop(*_):
        if child is not None:
            child.kill()
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    decoder = json.JSONDecoder()
    with open(out, "a") as f:
        while True:
            child = subprocess.Popen(list(kubectl), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            buf = ""
            for line in child.stdout:
                buf += line
                while True:
                    buf = buf.lstrip()
                    try:
                        obj, end = decoder.raw_decode(buf)
                    except ValueError:
                        break
                    buf = buf[end:]
                    now = datetime.datetime.now().strftime("%H:%M:%S.%f")[:-3]
                    f.write(f"{now} {summary(obj, node_a)}\n")
                    f.flush()
            child.wait()
            time.sleep(0.5)  # the API server ended the watch: list and watch again


def secs(clock, ref=None):
    """HH:MM:SS.mmm as seconds of the day; past midnight when ref is half a day later."""
    h, m, s = clock.split(":")
    v = int(h) * 3600 + int(m) * 60 + float(s)
    if ref is not None and v < ref - 43200:
        v += 86400
    return v


def stamped(path, ref):
    """(seconds of the day, rest of the line) of each stamped line."""
    out = []
    for line in open(path, errors="replace"):
        parts = line.rstrip("\n").split(" ", 1)
        if len(parts) == 2 and parts[0].count(":") == 2:
            try:
                out.append((secs(parts[0], ref), parts[1]))
            except ValueError:
                pass
    return out


def stream_figures(reqs):
    """What the client saw, from its requests `(start, end, ok, what)` in seconds after the
    power-off command: those before it and after it, the failures after it by what they were, and
    the longest stretch after it without a good answer (between good answers' ends)."""
    before = [r for r in reqs if r[0] < 0]
    after = [r for r in reqs if r[0] >= 0]
    failed = [r for r in after if not r[2]]
    good_ends = sorted(r[1] for r in after if r[2])
    marks = [0.0] + good_ends + ([after[-1][1]] if after else [])
    gap, gap_at = 0.0, 0.0
    for x, y in zip(marks, marks[1:]):
        if y - x > gap:
            gap, gap_at = y - x, x
    errors = {}
    for r in failed:
        errors[r[3]] = errors.get(r[3], 0) + 1
    return {"before": len(before), "before_failed": sum(1 for r in before if not r[2]),
            "sent": len(after), "failed": [r[0] for r in failed], "errors": errors,
            "gap": gap, "gap_at": gap_at}


def phases(pods, eps, console, node, peer):
    """The run's phases, in seconds after the power-off command, from the watches' and the
    console's lines `(t, text)` at or after it (the endpoints' from before it too, so that a change
    is a change from what was): A's first pod leaving (deleted or ended), each new
    pod Ready on the peer, each change of the ready endpoints, each container's SIGTERM and exit
    on A's console."""
    evicted, ready_on_peer, seen_ready = None, [], set()
    for t, rest in pods:
        f = rest.split("|")
        if len(f) < 5:
            continue
        name, on, deleting, phase, ready = f[:5]
        if on == node and (deleting or phase in ("Failed", "Succeeded")) and evicted is None:
            evicted = t
        if on == peer and ready == "True" and name not in seen_ready:
            seen_ready.add(name)
            ready_on_peer.append(t)
    endpoints = [(t, rest) for (t, rest), (_, prev) in zip(eps, [(None, None)] + eps) if rest != prev and t >= 0]
    stops = [(t, rest.rstrip()) for t, rest in console if "nodeward-test: pod" in rest]
    return {"evicted": evicted, "ready_on_peer": ready_on_peer, "endpoints": endpoints,
            "sigterm": [t for t, rest in stops if rest.endswith("SIGTERM")],
            "exits": [t for t, rest in stops if rest.endswith("exits")]}


def client_requests(path, offset, t0):
    """The client's record as `(start, end, ok, what)`, its clock moved by `offset` onto this
    machine's and made seconds after `t0` (seconds of the day)."""
    import datetime

    midnight = datetime.datetime.combine(datetime.date.today(), datetime.time()).timestamp()
    reqs = []
    for line in open(path):
        start, end, ok, what = line.split(" ", 3)
        s = float(start) + offset - midnight
        e = float(end) + offset - midnight
        if s < t0 - 43200:
            s, e = s + 86400, e + 86400
        reqs.append((s - t0, e - t0, ok == "1", what.strip()))
    return reqs


def after_t0(path, t0):
    return [(t - t0, rest) for t, rest in stamped(path, t0) if t >= t0]


def report(args):
    import argparse

    p = argparse.ArgumentParser(prog="service.py report")
    for name in ("client", "offset", "t0", "off", "pods", "eps", "console", "node", "peer", "way", "prestop", "row"):
        p.add_argument("--" + name, required=True)
    a = p.parse_args(args)
    t0 = secs(a.t0)
    off = secs(a.off, t0) - t0
    c = stream_figures(client_requests(a.client, float(a.offset), t0))
    eps = [(t - t0, rest) for t, rest in stamped(a.eps, t0)]
    ph = phases(after_t0(a.pods, t0), eps, after_t0(a.console, t0), a.node, a.peer)

    def fmt(x):
        return "-" if x is None else f"{x:.1f}"

    def fmts(xs, none):
        return ", ".join(fmt(x) for x in xs) or none

    failed = c["failed"]
    print(f"  requests: {c['sent']} sent after the power-off command, {len(failed)} failed "
          f"(first at {fmt(failed[0]) if failed else '-'} s, last at {fmt(failed[-1]) if failed else '-'} s: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(c['errors'].items())) or 'none'}); "
          f"longest gap without a good answer {c['gap']:.2f} s (from {c['gap_at']:.1f} s); "
          f"before the command: {c['before']} sent, {c['before_failed']} failed")
    print(f"  phases (s after the command): pods on {a.node} leaving {fmt(ph['evicted'])}; "
          f"SIGTERM {fmts(ph['sigterm'], 'never seen')}; exited {fmts(ph['exits'], 'never seen')}; "
          f"replacements Ready on {a.peer} {fmts(ph['ready_on_peer'], 'none')}; "
          f"ready endpoints (a: on {a.node}, b: elsewhere) "
          f"{', '.join(f'{t:.1f}s {e}' for t, e in ph['endpoints']) or 'unchanged'}; {a.node} off {off:.1f}")
    last_ready = ph["ready_on_peer"][-1] if ph["ready_on_peer"] else None
    with open(a.row, "a") as f:
        f.write("\t".join([a.way, a.prestop, str(c["sent"]), str(len(failed)), f"{c['gap']:.2f}",
                           fmt(ph["evicted"]), fmt(last_ready), f"{off:.1f}", str(c["before_failed"])]) + "\n")


def table(path):
    names = {"nodeward": "nodeward", "kubectl": "seed 004 (kubectl drain unit)", "kubelet": "kubelet graceful shutdown"}
    print(f"{'way':<30} | {'preStop':>7} | {'sent':>5} | {'failed':>6} | {'longest gap (s)':>15} | "
          f"{'pods leave (s)':>14} | {'replacements Ready (s)':>22} | {'off (s)':>7} | {'failed before':>13}")
    for line in open(path):
        w, pre, sent, failed, gap, ev, ready, off, base = line.rstrip("\n").split("\t")
        print(f"{names.get(w, w):<30} | {pre:>7} | {sent:>5} | {failed:>6} | {gap:>15} | {ev:>14} | {ready:>22} | {off:>7} | {base:>13}")


if __name__ == "__main__":
    if len(sys.argv) == 8 and sys.argv[1] == "client":
        client(*sys.argv[2:])
    elif len(sys.argv) > 4 and sys.argv[1] == "watch":
        watch(*sys.argv[2:])
    elif len(sys.argv) > 2 and sys.argv[1] == "report":
        report(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)
