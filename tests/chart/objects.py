#!/usr/bin/env python3
"""Reads rendered Kubernetes objects (YAML streams) for scripts/chart-check.

  objects.py drift RAW... -- RENDERED...   every object of the raw manifests equals the chart's
                                           object of the same kind, namespace and name (Helm's
                                           own labels and the config checksum aside); prints each
                                           difference and exits 1 on any
  objects.py without KIND,... < STREAM     the stream without those kinds (for a server dry-run
                                           where their APIs are absent)
  objects.py names < STREAM                one line per object: kind name namespace
  objects.py rules < STREAM                the PrometheusRule's spec, as a rules file for promtool
  objects.py field KIND NAME PATH < STREAM that object's field at PATH (dots), as JSON
  objects.py values-doc VALUES DOC         every leaf key of VALUES is in DOC's values table and
                                           every key there is in VALUES
"""
import json
import re
import sys

import yaml

# Labels and annotations only the chart puts on objects: Helm's bookkeeping, never a selector.
CHART_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}
CHART_ANNOTATIONS = {"checksum/config"}


def load(stream):
    return [d for d in yaml.safe_load_all(stream) if d]


def key(obj):
    meta = obj.get("metadata", {})
    return (obj.get("kind"), meta.get("namespace", ""), meta.get("name"))


def strip_meta(meta):
    if not meta:
        return meta
    meta = dict(meta)
    for field, drop in (("labels", CHART_LABELS), ("annotations", CHART_ANNOTATIONS)):
        kept = {k: v for k, v in (meta.get(field) or {}).items() if k not in drop}
        if kept:
            meta[field] = kept
        else:
            meta.pop(field, None)
    return meta


def normalize(obj):
    obj = dict(obj)
    obj["metadata"] = strip_meta(obj.get("metadata"))
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        obj["spec"] = dict(obj["spec"])
        obj["spec"]["template"] = dict(template)
        obj["spec"]["template"]["metadata"] = strip_meta(template.get("metadata"))
    return obj


def differences(path, a, b):
    """Paths where a and b differ, as strings."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: only in the chart: {b[k]!r:.200}")
            elif k not in b:
                out.append(f"{path}.{k}: only in the raw manifest: {a[k]!r:.200}")
            else:
                out += differences(f"{path}.{k}", a[k], b[k])
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(f"{path}[{i}]", x, y)]
    if a != b:
        return [f"{path}: raw {a!r:.300} != chart {b!r:.300}"]
    return []


def drift(args):
    sep = args.index("--")
    raw_files, rendered_files = args[:sep], args[sep + 1:]
    chart = {}
    for f in rendered_files:
        with open(f) as fh:
            for o in load(fh):
                chart[key(o)] = normalize(o)
    problems = []
    count = 0
    for f in raw_files:
        with open(f) as fh:
            for o in load(fh):
                count += 1
                k = key(o)
                if k not in chart:
                    problems.append(f"{f}: {k[0]} {k[1]}/{k[2]}: the chart renders no such object")
                    continue
                for d in differences(f"{k[0]}/{k[2]}", normalize(o), chart[k]):
                    problems.append(f"{f}: {d}")
    for p in problems:
        print(p)
    print(f"{count} objects of {len(raw_files)} raw manifests compared with the chart's: "
          f"{len(problems)} differences", file=sys.stderr)
    return 1 if problems or count == 0 else 0


def without(kinds):
    drop = set(kinds.split(","))
    kept = [o for o in load(sys.stdin) if o.get("kind") not in drop]
    yaml.safe_dump_all(kept, sys.stdout, sort_keys=False)
    return 0


def names():
    for o in load(sys.stdin):
        kind, ns, name = key(o)
        print(kind, name, ns or "-")
    return 0


def rules():
    found = [o for o in load(sys.stdin) if o.get("kind") == "PrometheusRule"]
    if len(found) != 1:
        print(f"expected one PrometheusRule, found {len(found)}", file=sys.stderr)
        return 1
    yaml.safe_dump(found[0]["spec"], sys.stdout, sort_keys=False)
    return 0


def field(kind, name, path):
    for o in load(sys.stdin):
        if o.get("kind") == kind and o["metadata"]["name"] == name:
            value = o
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            print(json.dumps(value, sort_keys=True))
            return 0
    print(f"no {kind} {name} in the stream", file=sys.stderr)
    return 1


# Values a user replaces as a whole (Kubernetes objects): documented as one key.
WHOLE = {"podSecurityContext", "securityContext", "resources", "nodeSelector"}


def leaves(prefix, value):
    if isinstance(value, dict) and value and prefix.rsplit(".", 1)[-1] not in WHOLE:
        for k, v in value.items():
            yield from leaves(f"{prefix}.{k}" if prefix else k, v)
    else:
        yield prefix


def values_doc(values_path, doc_path):
    with open(values_path) as fh:
        want = set(leaves("", yaml.safe_load(fh)))
    with open(doc_path) as fh:
        documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", fh.read(), re.M))
    missing = sorted(want - documented)
    extra = sorted(documented - want)
    for k in missing:
        print(f"{doc_path}: values key {k} (in {values_path}) is not in the values table")
    for k in extra:
        print(f"{doc_path}: the values table names {k}, which {values_path} does not have")
    print(f"{len(want)} values keys, {len(documented)} documented", file=sys.stderr)
    return 1 if missing or extra else 0


def main(argv):
    if len(argv) < 1:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "drift":
        return drift(args)
    if cmd == "without":
        return without(args[0])
    if cmd == "names":
        return names()
    if cmd == "rules":
        return rules()
    if cmd == "field":
        return field(*args)
    if cmd == "values-doc":
        return values_doc(*args)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
