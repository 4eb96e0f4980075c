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


def report(args):
    import argparse
    import datetime

    p = argparse.ArgumentParser(prog="service.py report")
    for name in ("client", "offset", "t0", "off", "pods", "eps", "console", "node", "peer", "way", "prestop", "row"):
        p.add_argument("--" + name, required=True)
    a = p.parse_args(args)
    t0 = secs(a.t0)
    off = secs(a.off, t0)
    offset = float(a.offset)
    midnight = datetime.datetime.combine(datetime.date.today(), datetime.time()).timestamp()

    # The client's requests, on this machine's clock, relative to the power-off command.
    reqs = []
    for line in open(a.client):
        start, end, ok, what = line.split(" ", 3)
        s = float(start) + offset - midnight
        e = float(end) + offset - midnight
        if s < t0 - 43200:
            s, e = s + 86400, e + 86400
        reqs.append((s - t0, e - t0, ok == "1", what.strip()))
    before = [r for r in reqs if r[0] < 0]
    after = [r for r in reqs if r[0] >= 0]
    failed = [r for r in after if not r[2]]
    # The longest stretch after the command without a good answer: between good answers' ends.
    good_ends = sorted(r[1] for r in after if r[2])
    marks = [0.0] + good_ends + ([after[-1][1]] if after else [])
    gap, gap_at = 0.0, 0.0
    for x, y in zip(marks, marks[1:]):
        if y - x > gap:
            gap, gap_at = y - x, x
    errors = {}
    for r in failed:
        errors[r[3]] = errors.get(r[3], 0) + 1
    first_fail = f"{failed[0][0]:.1f}" if failed else "-"
    last_fail = f"{failed[-1][0]:.1f}" if failed else "-"

    # Phases from the watches (pods: name|node|deletionTimestamp|phase|ready).
    evicted, ready_on_peer, seen_ready = None, [], set()
    for t, rest in stamped(a.pods, t0):
        f = rest.split("|")
        if len(f) < 5 or t < t0:
            continue
        name, node, deleting, phase, ready = f[:5]
        if node == a.node and (deleting or phase in ("Failed", "Succeeded")) and evicted is None:
            evicted = t - t0
        if node == a.peer and ready == "True" and name not in seen_ready:
            seen_ready.add(name)
            ready_on_peer.append(t - t0)
    endpoints, last = [], None
    for t, rest in stamped(a.eps, t0):
        if t >= t0 and rest != last:
            endpoints.append(f"{t - t0:.1f}s {rest}")
        last = rest
    stops = [(t - t0, rest) for t, rest in stamped(a.console, t0) if "nodeward-test: pod" in rest and t >= t0]
    sigterm = [t for t, rest in stops if rest.rstrip().endswith("SIGTERM")]
    exits = [t for t, rest in stops if rest.rstrip().endswith("exits")]

    def fmt(x):
        return "-" if x is None else f"{x:.1f}"

    base_failed = sum(1 for r in before if not r[2])
    print(f"  requests: {len(after)} sent after the power-off command, {len(failed)} failed "
          f"(first at {first_fail} s, last at {last_fail} s: {', '.join(f'{k} {v}' for k, v in sorted(errors.items())) or 'none'}); "
          f"longest gap without a good answer {gap:.2f} s (from {gap_at:.1f} s); "
          f"before the command: {len(before)} sent, {base_failed} failed")
    print(f"  phases (s after the command): pods on {a.node} leaving {fmt(evicted)}; "
          f"SIGTERM {', '.join(fmt(x) for x in sigterm) or 'never seen'}; "
          f"exited {', '.join(fmt(x) for x in exits) or 'never seen'}; "
          f"replacements Ready on {a.peer} {', '.join(fmt(x) for x in ready_on_peer) or 'none'}; "
          f"ready endpoints (a: on {a.node}, b: elsewhere) {', '.join(endpoints) or 'unchanged'}; {a.node} off {off - t0:.1f}")
    with open(a.row, "a") as f:
        f.write("\t".join([a.way, a.prestop, str(len(after)), str(len(failed)), f"{gap:.2f}", fmt(evicted),
                           fmt(ready_on_peer[-1] if ready_on_peer else None), f"{off - t0:.1f}", str(base_failed)]) + "\n")


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
