#!/usr/bin/python3
"""A ReplicaSet stand-in for the benchmark (scripts/vm-scenarios bench), against kube-emulator.

    replacements.py API_URL NAMESPACE NODE READY_AFTER_SECONDS

kube-emulator runs no workload controllers, so a pod evicted from a draining node is simply gone:
a PodDisruptionBudget then never pushes back. A real ReplicaSet replaces the pod on another node,
and the budget allows the next disruption only once that replacement is Ready. This does the
same for every pod of NAMESPACE deleted from NODE: it creates a replacement at once (same labels
and owner, bound to no node, so not Ready) and marks it Ready READY_AFTER_SECONDS later (the
emulator's admin path PUT /emulator/pods/NS/NAME/ready). Runs until killed; loopback only.
"""
import itertools
import json
import sys
import threading
import time
import urllib.request

base, ns, node, delay = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3], float(sys.argv[4])
seq = itertools.count(1)


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def ready(name):
    try:
        call("PUT", f"/emulator/pods/{ns}/{name}/ready", {"ready": True})
    except Exception as e:  # the namespace may be gone at the end of a run
        print(f"replacements: cannot mark {name} Ready: {e}", file=sys.stderr, flush=True)


def replace(pod):
    meta = pod["metadata"]
    app = meta.get("labels", {}).get("app", "pod")
    name = f"{app}-r{next(seq)}"
    new = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": meta.get("labels", {}),
                     "ownerReferences": meta.get("ownerReferences", [])},
        "spec": {"terminationGracePeriodSeconds": pod["spec"].get("terminationGracePeriodSeconds", 0),
                 "containers": pod["spec"]["containers"]},
    }
    call("POST", f"/api/v1/namespaces/{ns}/pods", new)
    threading.Timer(delay, ready, (name,)).start()


def main():
    rv = call("GET", f"/api/v1/namespaces/{ns}/pods")["metadata"]["resourceVersion"]
    url = f"{base}/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion={rv}"
    with urllib.request.urlopen(url) as stream:
        for line in stream:
            if not line.strip():
                continue
            ev = json.loads(line)
            pod = ev.get("object", {})
            if ev.get("type") == "DELETED" and pod.get("spec", {}).get("nodeName") == node:
                replace(pod)


if __name__ == "__main__":
    while True:
        try:
            main()
        except Exception as e:
            print(f"replacements: watch ended ({e}); again", file=sys.stderr, flush=True)
            time.sleep(0.2)
