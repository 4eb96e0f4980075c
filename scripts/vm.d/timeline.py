#!/usr/bin/env python3
"""Where a shutdown's time went, from the guest console and the emulator's eviction records.

    timeline.py T0 CONSOLE NAMESPACE EVICTIONS_JSON REQUESTS_JSON

T0 is the host's clock (seconds since the epoch) when `systemctl poweroff` was sent; CONSOLE holds
the console lines of that shutdown as `scripts/vm` stamps them ("HH:MM:SS.mmm text", host clock;
with the guest journal forwarded to the console, the agent's messages too); EVICTIONS_JSON and
REQUESTS_JSON are kube-emulator's eviction and request logs since just before T0. Prints one line
per milestone that occurred, in order: seconds after T0, then what happened. A milestone that did
not occur (no agent, no drain unit) is left out.
"""

import datetime
import json
import re
import sys

# (label, pattern): the first console line after T0 matching the pattern.
MILESTONES = [
    ("agent: logind announced the shutdown", r"nodeward\[\d+\]: .*shutdown announced"),
    ("agent: drain ended, lock released", r"nodeward\[\d+\]: .*shutdown drain ended"),
    # The shutdown's first stop; the agent stops nodeward-drain.service itself, earlier.
    ("systemd: stopping units", r"(Stopping|Stopped|Removed slice) (?!nodeward-drain)"),
    ("nodeward-drain.service: stopping", r"Stopping nodeward-drain"),
    ("nodeward-drain.service: decided", r"nodeward\[\d+\]: .*(already handled this shutdown|applying the \[shutdown\] policy)"),
    ("nodeward-drain.service: stopped", r"Stopped nodeward-drain"),
    ("nodeward.service: stopped", r"Stopped nodeward\.service"),
    ("kubectl-drain.service: stopping", r"Stopping kubectl-drain"),
    ("kubectl-drain.service: stopped", r"Stopped kubectl-drain"),
    ("kubelet stand-in: stopping", r"kubelet stand-in: stopping"),
    ("kubelet stand-in: stopped", r"kubelet stand-in: stopped"),
    ("systemd-shutdown: final kill and unmount", r"systemd-shutdown\[1\]: Syncing"),
    ("kernel: power down", r"reboot: Power down"),
]

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def main():
    t0 = float(sys.argv[1])
    namespace = sys.argv[3]
    start = datetime.datetime.fromtimestamp(t0, datetime.timezone.utc)
    events = []

    def host_time(hms):
        """A console stamp (host clock, time of day in UTC) as seconds after T0."""
        t = datetime.datetime.combine(
            start.date(), datetime.time.fromisoformat(hms), datetime.timezone.utc
        )
        if t < start - datetime.timedelta(hours=12):
            t += datetime.timedelta(days=1)
        return (t - start).total_seconds()

    seen = set()
    with open(sys.argv[2], errors="replace") as console:
        for line in console:
            stamp, _, text = ANSI.sub("", line.rstrip("\n")).partition(" ")
            try:
                at = host_time(stamp)
            except ValueError:
                continue
            for label, pattern in MILESTONES:
                if label not in seen and re.search(pattern, text):
                    seen.add(label)
                    events.append((at, label))

    try:
        with open(sys.argv[4]) as f:
            evictions = [e for e in json.load(f) if e.get("namespace") == namespace]
    except (OSError, ValueError):
        evictions = []
    stamp = lambda e: (
        datetime.datetime.fromisoformat(e["at"].replace("Z", "+00:00")) - start
    ).total_seconds()
    if evictions:
        events.append((min(map(stamp, evictions)), "API: first eviction request"))
        approved = [e for e in evictions if "evicted" in e.get("outcome", "")]
        if approved:
            events.append((max(map(stamp, approved)), "API: last pod evicted"))

    try:
        with open(sys.argv[5]) as f:
            requests = json.load(f).get("entries", [])
    except (OSError, ValueError):
        requests = []
    # (label, verb, resource): the first request the emulator received of each.
    for label, verb, resource in [
        ("API: node read (get)", "get", "nodes"),
        ("API: node cordoned (patch)", "patch", "nodes"),
        ("API: pods of the node listed", "list", "pods"),
        ("API: first Event posted", "create", "events"),
    ]:
        times = [
            stamp(r)
            for r in requests
            if r.get("verb") == verb
            and r.get("resource") == resource
            and (resource != "pods" or not r.get("namespace"))
        ]
        if times:
            events.append((min(times), label))

    for at, label in sorted(events):
        print(f"{at:6.1f}s {label}")


if __name__ == "__main__":
    main()
