#!/usr/bin/env python3
"""The side-by-side scaler bench's moving parts (issue 45), driven by scripts/peers-karpenter.

  peers.py machines            nodeward's `exec` provider on the test control plane: one JSON
                               request on stdin (list, create, delete), machines are kwok Nodes of
                               the instance type and zone in the group's labels
  peers.py run KUBECONFIG ...  one scaler, one workload: create the pending pods, time them to
                               Running, count the nodes and capacity bought, delete the pods, time
                               the empty nodes away; prints one JSON result line
  peers.py table FILE          the results, side by side
  peers.py count FILE          how many pods a workload file makes (and a failure if it is wrong)

A workload is `plain` or `mix` with a number of pods, or `file:PATH`: a YAML file of your own,
each document either a Pod (created once) or `{count: N, pod: POD}` (created N times, the name
suffixed -0 … -N-1). The Pods are created in the bench's namespace with the label `peers: bench`
added; a container without requests asks for nothing. tests/peers/workloads/ holds examples.

Standard library and PyYAML only. The API server is reached with the kubeconfig's inline client
certificate (scripts/control-plane writes them so); kubectl would cost a process per request.
"""

import base64
import concurrent.futures
import http.client
import json
import os
import random
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

GROUP_LABEL = "nodeward.io/node-group"
KARPENTER_LABEL = "karpenter.sh/nodepool"
TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
NAMESPACE = "peers"
# Karpenter's kwok instance types subtract this kube-reserved from capacity; nodeward's kwok
# machines do the same, so equal shapes have equal allocatable.
RESERVED_CPU_MILLI = 100
RESERVED_MEMORY = 10 << 20


def die(msg):
    print(f"peers.py: {msg}", file=sys.stderr)
    sys.exit(1)


class Api:
    """A minimal client for one kubeconfig with inline client certificate and CA."""

    def __init__(self, kubeconfig):
        try:
            with open(kubeconfig) as f:
                cfg = yaml.safe_load(f)
            cluster = cfg["clusters"][0]["cluster"]
            user = cfg["users"][0]["user"]
            self.server = cluster["server"].rstrip("/")
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            cert = base64.b64decode(user["client-certificate-data"])
            key = base64.b64decode(user["client-key-data"])
        except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError) as e:
            die(f"{kubeconfig}: expected a kubeconfig with inline certificate-authority-data, "
                f"client-certificate-data and client-key-data ({e!r})")
        self.ctx = ssl.create_default_context(cadata=ca)
        # ssl loads a client certificate from files only: a private temporary file, removed at once.
        with tempfile.NamedTemporaryFile("wb", suffix=".pem") as pem:
            os.chmod(pem.name, 0o600)
            pem.write(cert + b"\n" + key)
            pem.flush()
            self.ctx.load_cert_chain(pem.name)

    def call(self, method, path, body=None, ok=(200, 201, 202), timeout=60):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for attempt in range(5):
            try:
                with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                    return json.loads(r.read() or b"null")
            except urllib.error.HTTPError as e:
                if e.code in (404, 409, 504) and e.code in ok:
                    return None
                if e.code in (429, 500, 503) and attempt < 4:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                die(f"{method} {path}: HTTP {e.code}: {e.read()[:300]!r}")
            except (OSError, http.client.HTTPException) as e:
                if attempt < 4:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                die(f"{method} {path}: {e}")
        return None


# --- nodeward's exec provider: machines are kwok Nodes -----------------------------------------


def node_labels(user_data):
    """The labels kubelet registers with, from the rendered cloud-init (`node-labels: "k=v,..."`)."""
    lines = [line.strip() for line in user_data.splitlines()]
    for i, line in enumerate(lines):
        csv = None
        if line.startswith('node-labels: "') and line.endswith('"'):
            csv = line[len('node-labels: "'):-1]
        elif line == "- name: node-labels" and i + 1 < len(lines):
            nxt = lines[i + 1]
            if nxt.startswith('value: "') and nxt.endswith('"'):
                csv = nxt[len('value: "'):-1]
        if csv is not None:
            return dict(kv.split("=", 1) for kv in csv.split(",") if "=" in kv)
    return {}


def quantity_bytes(q):
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, mult in units.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * mult
    return int(q)


def quantity_milli(q):
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def instance_type(name):
    path = os.environ.get("PEERS_INSTANCE_TYPES")
    if not path:
        die("PEERS_INSTANCE_TYPES is not set (tests/peers/instance-types.json)")
    with open(path) as f:
        for t in json.load(f):
            if t["name"] == name:
                return t["resources"]
    die(f"{path}: no instance type {name!r}: a group's {TYPE_LABEL} label must name one")


def machine_node(hostname, labels):
    res = instance_type(labels.get(TYPE_LABEL, ""))
    cpu, mem = quantity_milli(res["cpu"]), quantity_bytes(res["memory"])
    capacity = {"cpu": res["cpu"], "memory": res["memory"], "pods": res["pods"]}
    allocatable = {
        "cpu": f"{cpu - RESERVED_CPU_MILLI}m",
        "memory": str(mem - RESERVED_MEMORY),
        "pods": res["pods"],
    }
    base = {
        "kubernetes.io/hostname": hostname,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": hostname,
            "labels": {**base, **labels},
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "status": {"capacity": capacity, "allocatable": allocatable},
    }


def machines():
    """The exec provider's three commands, on the kubeconfig in PEERS_KUBECONFIG.

    The create request's user data holds a bootstrap token: only its node labels are read, and
    nothing of it is written anywhere. The Node registers without the startup taint (no agent
    runs on a kwok node to report its gates), as Karpenter's kwok nodes come up without theirs."""
    req = json.load(sys.stdin)
    api = Api(os.environ.get("PEERS_KUBECONFIG") or die("PEERS_KUBECONFIG is not set"))
    action = req.get("action")
    if action == "list":
        nodes = api.call("GET", f"/api/v1/nodes?labelSelector={GROUP_LABEL}")["items"]
        out = [
            {
                "id": n["metadata"]["name"],
                "hostname": n["metadata"]["name"],
                "group": n["metadata"]["labels"][GROUP_LABEL],
                "created_at": n["metadata"]["creationTimestamp"],
            }
            for n in nodes
        ]
    elif action == "create":
        user_data = base64.b64decode(req["user_data"]).decode()
        node = machine_node(req["hostname"], node_labels(user_data))
        created = api.call("POST", "/api/v1/nodes", node)
        out = {"id": req["hostname"], "created_at": created["metadata"]["creationTimestamp"]}
    elif action == "delete":
        api.call("DELETE", f"/api/v1/nodes/{req['id']}", ok=(200, 202, 404))
        out = {}
    else:
        die(f"unknown action {action!r} (expected list, create or delete)")
    json.dump(out, sys.stdout)


# --- workloads ----------------------------------------------------------------------------------

# 500 plain pods of 3 shapes.
PLAIN_SHAPES = [("small", "250m", "512Mi"), ("medium", "1", "2Gi"), ("large", "2", "4Gi")]
# Karpenter's benchmark mix (its makeDiversePods, written anew): requests drawn from these.
MIX_CPU = ["100m", "250m", "500m", "1000m", "1500m"]
MIX_MEMORY = ["100Mi", "256Mi", "512Mi", "1024Mi", "2048Mi", "4096Mi"]
MIX_VALUES = list("abcdefg")


def pod(name, labels, cpu, memory, affinity=None, spread=None):
    spec = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "pause",
            "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": cpu, "memory": memory}},
        }],
    }
    if affinity:
        spec["affinity"] = affinity
    if spread:
        spec["topologySpreadConstraints"] = spread
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"peers": "bench", **labels}}, "spec": spec}


def term(labels, key):
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key}


def workload_file(path):
    """The pods a workload file asks for, or a failure naming the file, the document and the
    field."""
    try:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except OSError as e:
        die(f"{path}: cannot read the workload file: {e}")
    except yaml.YAMLError as e:
        die(f"{path}: not YAML: {e}")
    pods, names = [], set()
    for i, doc in enumerate(docs, 1):
        where = f"{path}, document {i}"
        if not isinstance(doc, dict):
            die(f"{where}: expected a Pod or {{count: N, pod: POD}}, found {type(doc).__name__}")
        count, template = 1, doc
        if "count" in doc or "pod" in doc:
            count, template = doc.get("count"), doc.get("pod")
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                die(f"{where}: count: expected a whole number of pods, at least 1, found {count!r}")
            if not isinstance(template, dict):
                die(f"{where}: pod: expected a Pod (metadata, spec)")
        elif doc.get("kind", "Pod") != "Pod":
            die(f"{where}: kind: expected Pod, found {doc.get('kind')!r}")
        meta, spec = template.get("metadata"), template.get("spec")
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            die(f"{where}: metadata.name: expected the pod's name")
        if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
            die(f"{where}: spec.containers: expected a list of at least one container")
        for c, ctr in enumerate(spec["containers"]):
            if not isinstance(ctr, dict) or not ctr.get("name") or not ctr.get("image"):
                die(f"{where}: spec.containers[{c}]: expected a name and an image")
        labels = meta.get("labels") or {}
        if not isinstance(labels, dict):
            die(f"{where}: metadata.labels: expected a map of strings")
        spec = {"terminationGracePeriodSeconds": 0, **spec}
        for k in range(count):
            name = meta["name"] if count == 1 else f"{meta['name']}-{k}"
            if name in names:
                die(f"{where}: metadata.name: {name} is made twice")
            names.add(name)
            pods.append({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": name, "labels": {**labels, "peers": "bench"}},
                         "spec": spec})
    if not pods:
        die(f"{path}: no pods: expected at least one document")
    return pods


def workload(kind, n):
    if kind.startswith("file:"):
        return workload_file(kind[len("file:"):])
    rng = random.Random(45)
    pods = []
    if kind == "plain":
        for i in range(n):
            shape, cpu, mem = PLAIN_SHAPES[i % len(PLAIN_SHAPES)]
            pods.append(pod(f"plain-{shape}-{i}", {"shape": shape}, cpu, mem))
        return pods
    if kind != "mix":
        die(f"unknown workload {kind!r} (expected plain, mix or file:PATH)")
    fifth = max(n // 5, 1)
    for i in range(n):
        cpu, mem = rng.choice(MIX_CPU), rng.choice(MIX_MEMORY)
        value, other = rng.choice(MIX_VALUES), rng.choice(MIX_VALUES)
        part = min(i // fifth, 5)
        if part in (1, 2):
            key = ZONE_LABEL if part == 1 else "kubernetes.io/hostname"
            spread = [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule",
                       "labelSelector": {"matchLabels": {"my-label": other}}}]
            pods.append(pod(f"mix-spread-{i}", {"my-label": value}, cpu, mem, spread=spread))
        elif part == 3:
            labels = {"my-affinity": value}
            aff = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term(labels, ZONE_LABEL)]}}
            pods.append(pod(f"mix-affinity-{i}", labels, cpu, mem, affinity=aff))
        elif part == 4:
            labels = {"app": "nginx"}
            aff = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                term(labels, "kubernetes.io/hostname")]}}
            pods.append(pod(f"mix-anti-{i}", labels, cpu, mem, affinity=aff))
        else:
            pods.append(pod(f"mix-plain-{i}", {"my-label": value}, cpu, mem))
    return pods


# --- one run ------------------------------------------------------------------------------------


def proc_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def scaler_nodes(api, label):
    return api.call("GET", f"/api/v1/nodes?labelSelector={label}")["items"]


def pods_by_phase(api):
    items = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=peers%3Dbench")["items"]
    running = [p for p in items if p.get("status", {}).get("phase") == "Running"]
    return items, running


def scale_up(api, a, pods):
    """Creates the pods (8 at a time, as a controller would) while it watches the scaler's nodes
    from the first pod's creation; returns (seconds to create them, to the first node, to every pod
    Running, the nodes, the pods)."""
    t0 = time.monotonic()
    pool = concurrent.futures.ThreadPoolExecutor(8)
    posts = [pool.submit(api.call, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", p) for p in pods]
    created = None
    first_node = None
    while True:
        now = time.monotonic() - t0
        if created is None and all(f.done() for f in posts):
            created = now
            [f.result() for f in posts]
        nodes = scaler_nodes(api, a.node_label)
        if nodes and first_node is None:
            first_node = now
        items, running = (pods_by_phase(api) if created is not None else ([], []))
        if len(running) >= a.pods:
            break
        if now > a.timeout:
            die(f"{a.scaler}: {len(running)} of {a.pods} pods Running after {a.timeout:.0f} s, "
                f"{len(nodes)} nodes")
        time.sleep(0.25 if created is None else 0.5)
    pool.shutdown()
    return created, first_node, now, nodes, items


def bought(nodes, pods):
    """What the nodes give and the pods ask: CPUs and GiB allocatable, nodes per instance type,
    CPUs requested."""
    types = {}
    for n in nodes:
        t = n["metadata"]["labels"].get(TYPE_LABEL, "?")
        types[t] = types.get(t, 0) + 1
    return {
        "nodes": len(nodes), "types": types,
        "cpu_bought": round(sum(quantity_milli(n["status"]["allocatable"]["cpu"]) for n in nodes) / 1000, 1),
        "memory_bought_gib": round(
            sum(quantity_bytes(n["status"]["allocatable"]["memory"]) for n in nodes) / (1 << 30), 1),
        "cpu_requested": round(sum(
            quantity_milli(c.get("resources", {}).get("requests", {}).get("cpu", "0"))
            for p in pods for c in p["spec"]["containers"]) / 1000, 1),
    }


def spread_zones(nodes, pods):
    """Where the pods with a zone spread run: their count per zone of their node, zones in order
    by the last part of their name ("a 20 / b 20 / c 20"); "–" when no pod has one."""
    zone_of = {n["metadata"]["name"]: n["metadata"]["labels"].get(ZONE_LABEL, "?") for n in nodes}
    counts = {}
    for p in pods:
        spread = p["spec"].get("topologySpreadConstraints") or []
        if not any(c.get("topologyKey") == ZONE_LABEL for c in spread):
            continue
        zone = zone_of.get(p["spec"].get("nodeName"), "?").rsplit("-", 1)[-1]
        counts[zone] = counts.get(zone, 0) + 1
    return " / ".join(f"{z} {counts[z]}" for z in sorted(counts)) or "–"


def delete_pods(api):
    """Deletes the bench's pods. Deleting 2,000 takes kube-apiserver longer than its 60 s request
    timeout (504): asked again until none is left."""
    while pods_by_phase(api)[0]:
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=peers%3Dbench",
                 {"gracePeriodSeconds": 0}, ok=(200, 504), timeout=120)


def wait_nodes_gone(api, a, since):
    while scaler_nodes(api, a.node_label):
        if time.monotonic() - since > a.timeout:
            die(f"{a.scaler}: nodes still there {a.timeout:.0f} s after the pods were deleted")
        time.sleep(0.5)


def run(argv):
    import argparse

    ap = argparse.ArgumentParser(prog="peers.py run")
    ap.add_argument("kubeconfig")
    ap.add_argument("--scaler", required=True, help="its name in the table")
    ap.add_argument("--pid", type=int, required=True, help="the scaler's process")
    ap.add_argument("--node-label", required=True, help="the label its nodes carry")
    ap.add_argument("--workload", required=True, help="plain, mix or file:PATH")
    ap.add_argument("--pods", type=int, help="how many (plain and mix; a file says itself)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--no-scale-down", action="store_true")
    a = ap.parse_args(argv)
    api = Api(a.kubeconfig)
    api.call("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}}, ok=(201, 409))
    if scaler_nodes(api, a.node_label):
        die(f"nodes with {a.node_label} exist before the run: the previous scaler's are not gone")
    if a.workload.startswith("file:"):
        pods = workload_file(a.workload[len("file:"):])
        a.pods = len(pods)
    elif a.workload in ("plain", "mix") and a.pods:
        pods = workload(a.workload, a.pods)
    else:
        die(f"--workload {a.workload!r}: expected plain or mix with --pods N, or file:PATH")
    cpu0 = proc_cpu_seconds(a.pid)
    created, first_node, all_running, nodes, items = scale_up(api, a, pods)
    result = {
        "scaler": a.scaler, "workload": os.path.basename(a.workload.removeprefix("file:")),
        "pods": a.pods,
        "created_s": round(created, 1), "first_node_s": round(first_node or 0, 1),
        "all_running_s": round(all_running, 1),
        **bought(nodes, items),
        "spread_zones": spread_zones(nodes, items),
        "pods_per_node": round(a.pods / max(len(nodes), 1), 1),
        "cpu_s_up": round(proc_cpu_seconds(a.pid) - cpu0, 2),
    }
    print(f"  {a.scaler}: all {a.pods} pods Running {all_running:.1f} s after the first was "
          f"created ({created:.1f} s to create them), first node {first_node or 0:.1f} s, "
          f"{len(nodes)} nodes {result['types']}", file=sys.stderr)

    def whole_run():
        result["cpu_s"] = round(proc_cpu_seconds(a.pid) - cpu0, 2)
        result["peak_rss_mib"] = round(proc_peak_rss_mib(a.pid))

    if a.no_scale_down:
        # The figures first: what follows is cleanup.
        whole_run()
        print(json.dumps(result), flush=True)
        t1 = time.monotonic()
        delete_pods(api)
        for n in scaler_nodes(api, a.node_label):
            api.call("DELETE", f"/api/v1/nodes/{n['metadata']['name']}", ok=(200, 202, 404))
        wait_nodes_gone(api, a, t1)
        return
    t1 = time.monotonic()
    delete_pods(api)
    wait_nodes_gone(api, a, t1)
    result["empty_gone_s"] = round(time.monotonic() - t1, 1)
    print(f"  {a.scaler}: every node gone {result['empty_gone_s']} s after the pods were deleted",
          file=sys.stderr)
    whole_run()
    print(json.dumps(result))


def table(path):
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    if not rows:
        die(f"{path}: no results")
    cols = [("scaler", "scaler"), ("workload", "workload"), ("pods", "pods"),
            ("first_node_s", "first node s"), ("all_running_s", "all Running s"),
            ("nodes", "nodes"), ("spread_zones", "zone-spread pods per zone"),
            ("pods_per_node", "pods/node"),
            ("cpu_requested", "CPU asked"), ("cpu_bought", "CPU bought"),
            ("memory_bought_gib", "GiB bought"), ("empty_gone_s", "empty gone s"),
            ("cpu_s_up", "CPU s, scale-up"), ("cpu_s", "CPU s, whole run"),
            ("peak_rss_mib", "peak RSS MiB")]
    print("| " + " | ".join(h for _, h in cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "–")) for k, _ in cols) + " |")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "machines":
        machines()
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "count":
        print(len(workload_file(sys.argv[2])))
    else:
        die("usage: peers.py machines | run KUBECONFIG ... | table FILE | count FILE")
