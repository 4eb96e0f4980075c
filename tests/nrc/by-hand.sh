#!/usr/bin/env bash
# The shipped NodeReadinessRule against the real node-readiness-controller (NRC), by hand.
#
# NRC's Go module is not served by the module proxy, so CI cannot build it; this is how it was
# run for docs/src/readiness.md (NRC v0.5.0-14, its dependencies from the proxy):
#   1. its source, e.g. through the search tool's fetch, exported to NRC_SRC;
#      (cd "$NRC_SRC" && go build -o bin/manager ./cmd)
#   2. scripts/control-plane up DIR
#   3. KUBECTL=... tests/nrc/by-hand.sh DIR NRC_SRC
# NRC runs with the admin kubeconfig (its own RBAC is not what is under test). Nodes are plain
# Node objects; the condition is written as nodeward's agent writes it. Prints what NRC did and
# how long it took (polled every 20 ms through kubectl, so a figure includes up to one poll).
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 CONTROL_PLANE_DIR NRC_SRC" >&2; exit 2; }
here="$(cd "$(dirname "$0")/../.." && pwd)"
kc_file="$1/admin.kubeconfig"
nrc="$2"
[[ -f "${kc_file}" ]] || { echo "no ${kc_file}: is the control plane up?" >&2; exit 1; }
[[ -x "${nrc}/bin/manager" ]] || { echo "no ${nrc}/bin/manager: build it (see the header)" >&2; exit 1; }
crd="${nrc}/config/crd/bases/readiness.node.x-k8s.io_nodereadinessrules.yaml"
taint=readiness.k8s.io/nodeward
legacy=node.nodeward.io/not-ready
k() { "${KUBECTL:-kubectl}" --kubeconfig "${kc_file}" "$@"; }
ms() { date +%s%3N; }
node() { # NAME LABELS-JSON TAINTS-JSON
  printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"%s","labels":%s},"spec":{"taints":%s}}' \
    "$1" "$2" "$3" | k apply -f - >/dev/null
}
condition() { # NODE STATUS REASON MESSAGE
  local now
  now="$(date -u +%FT%TZ)"
  k patch node "$1" --subresource=status --type=strategic -p "{\"status\":{\"conditions\":[{\"type\":\"nodeward.io/Ready\",\"status\":\"$2\",\"reason\":\"$3\",\"message\":\"$4\",\"lastHeartbeatTime\":\"${now}\",\"lastTransitionTime\":\"${now}\"}]}}" >/dev/null
}
has() { [[ -n "$(k get node "$1" -o jsonpath="{.spec.taints[?(@.key==\"$2\")].key}")" ]]; }
wait_taint() { # NODE KEY present|absent: prints the milliseconds it took, or "never" (10 s)
  local t0 i
  t0="$(ms)"
  for i in $(seq 500); do
    if has "$1" "$2"; then [[ "$3" == present ]] && { echo "$(( $(ms) - t0 ))"; return; }
    else [[ "$3" == absent ]] && { echo "$(( $(ms) - t0 ))"; return; }; fi
    sleep 0.02
  done
  echo "never (${i} polls)"
}
state() { if has "$1" "$2"; then echo present; else echo absent; fi; }

k apply -f "${crd}" >/dev/null
k wait --for=condition=Established crd/nodereadinessrules.readiness.node.x-k8s.io --timeout=30s >/dev/null
echo "== the rule nodeward 0.1 shipped:"
git -C "${here}" show 6119674:packaging/kubernetes/node-readiness-rule.yaml | k apply -f - 2>&1 | sed 's/^/   /' || true
echo "== the shipped rule:"
k apply -f "${here}/packaging/kubernetes/node-readiness-rule.yaml" | sed 's/^/   /'
"${nrc}/bin/manager" --health-probe-bind-address 127.0.0.1:0 --metrics-bind-address 0 --kubeconfig "${kc_file}" >"${nrc}/manager.log" 2>&1 &
manager=$!
cleanup() {
  # The rule carries NRC's finalizer: delete it while NRC runs, or the deletion waits for NRC.
  k delete nodereadinessrule nodeward-ready --timeout=30s >/dev/null 2>&1 || true
  kill "${manager}" 2>/dev/null || true
  k delete node nrc-boot nrc-fresh nrc-other nrc-legacy --ignore-not-found >/dev/null || true
  k delete -f "${crd}" --timeout=30s >/dev/null || true
}
trap cleanup EXIT
group='{"nodeward.io/node-group":"web"}'
node nrc-boot "${group}" "[{\"key\":\"${taint}\",\"effect\":\"NoSchedule\"}]"
sleep 2
echo "registered with the startup taint, no condition yet, 2 s later: taint $(state nrc-boot "${taint}")"
condition nrc-boot False GatesFailing "failing: file /run/flannel/subnet.env: absent"
sleep 1
echo "condition False, 1 s later: taint $(state nrc-boot "${taint}")"
condition nrc-boot True GatesPassed "all 4 readiness gates pass"
echo "condition True -> taint gone in $(wait_taint nrc-boot "${taint}" absent) ms"
condition nrc-boot False GatesFailing "failing: pod kube-flannel/app=flannel"
echo "condition False again -> taint back in $(wait_taint nrc-boot "${taint}" present) ms (continuous)"
condition nrc-boot True GatesPassed "all 4 readiness gates pass"
echo "condition True again -> taint gone in $(wait_taint nrc-boot "${taint}" absent) ms"
node nrc-fresh "${group}" '[]'
echo "selected node, no taint, no condition -> NRC adds the taint in $(wait_taint nrc-fresh "${taint}" present) ms"
node nrc-other '{"example.com/x":"y"}' '[]'
sleep 2
echo "node without the node-group label, 2 s later: taint $(state nrc-other "${taint}")"
node nrc-legacy "${group}" "[{\"key\":\"${legacy}\",\"effect\":\"NoSchedule\"}]"
condition nrc-legacy True GatesPassed "all 4 readiness gates pass"
sleep 2
echo "node registered by nodeward 0.1 (${legacy}), condition True, 2 s later: that taint $(state nrc-legacy "${legacy}")"
