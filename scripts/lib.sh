# Shared helpers for scripts/*. Sourced, not run.

# No silent exits: under `set -e` a failing command (one inside a command substitution or a
# function included) ends the script; this says which one, where, and with what status.
set -o errtrace
trap 'printf "error: %s:%s: \`%s\` failed (exit %s)\n" "${BASH_SOURCE[0]##*/}" "${LINENO}" "${BASH_COMMAND}" "$?" >&2' ERR

# step NAME: starts a timed step (the previous one's time is printed and kept for step_summary).
_step_name=""
_step_t0=$SECONDS
_step_times=()
_step_done() {
  [ -n "$_step_name" ] || return 0
  local d=$((SECONDS - _step_t0))
  printf '    [%d s] %s\n' "$d" "$_step_name"
  _step_times+=("$(printf '%6d s  %s' "$d" "$_step_name")")
  _step_name=""
}
step() { _step_done; _step_name="$*"; _step_t0=$SECONDS; printf '\n==> %s\n' "$*"; }
# step_summary: every step's time, and the total.
step_summary() {
  _step_done
  printf '\nstep times:\n'
  printf '%s\n' "${_step_times[@]}"
  printf '%6d s  total\n' "$SECONDS"
}
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

_apt_updated=0
# Installs the named Debian packages that are not installed yet; runs apt-get update once.
ensure_apt_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && { echo "already installed: $*"; return 0; }
  command -v apt-get >/dev/null || die "apt-get not found; install by hand: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ $_apt_updated -eq 0 ]; then
    $sudo apt-get update -qq || die "apt-get update failed; cannot install ${missing[*]}"
    _apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    || die "apt-get install ${missing[*]} failed"
}

# Adds rustup components (rustfmt, clippy) if cargo lacks them.
ensure_rust_components() {
  for c in "$@"; do
    case "$c" in
      rustfmt) cargo fmt --version >/dev/null 2>&1 && continue ;;
      clippy) cargo clippy --version >/dev/null 2>&1 && continue ;;
    esac
    rustup component add "$c" || die "cannot add rust component $c (rustup component add $c)"
  done
}

# The Prometheus release whose Go module builds promtool (scripts/monitoring-check) and the server
# that the reboot coordinator's firing-alerts test asks (scripts/reboot-alerts-check).
PROMETHEUS_VERSION=v0.316.0

# prometheus_cmd NAME: prints the path of github.com/prometheus/prometheus/cmd/NAME (promtool,
# prometheus) at PROMETHEUS_VERSION, first building it from the Go module into
# ~/.cache/nodeward/NAME-PROMETHEUS_VERSION/ unless it is there. The build's output goes to stderr.
# Without the `builtinassets` tag the server serves its web UI from disk, which no test reads; its
# API needs nothing more.
prometheus_cmd() {
  local name="$1"
  local bin_dir="${XDG_CACHE_HOME:-${HOME}/.cache}/nodeward/${name}-${PROMETHEUS_VERSION}"
  if [ ! -x "${bin_dir}/${name}" ]; then
    command -v go >/dev/null || die "go not found: install Go 1.26+ (${name} is built from the Prometheus Go module)"
    echo "building ${name} ${PROMETHEUS_VERSION} (cached in ${bin_dir})" >&2
    mkdir -p "${bin_dir}"
    GOBIN="${bin_dir}" go install "github.com/prometheus/prometheus/cmd/${name}@${PROMETHEUS_VERSION}" >&2 \
      || die "cannot build ${name} from github.com/prometheus/prometheus@${PROMETHEUS_VERSION}"
  fi
  printf '%s\n' "${bin_dir}/${name}"
}

# helm_cmd: prints the path of helm HELM_VERSION, first building it from the helm.sh/helm/v3 Go
# module into ~/.cache/nodeward/helm-HELM_VERSION/ unless it is there (cold about 2.5 min on 2
# cores). The ldflags are those of Helm's Makefile: without them its built-in Kubernetes version is
# 1.20, and `helm template`/`lint` refuse the chart's kubeVersion (>=1.30).
HELM_VERSION=v3.22.0
HELM_K8S_MINOR=37
helm_cmd() {
  local bin_dir="${XDG_CACHE_HOME:-${HOME}/.cache}/nodeward/helm-${HELM_VERSION}-k8s1.${HELM_K8S_MINOR}"
  if [ ! -x "${bin_dir}/helm" ]; then
    command -v go >/dev/null || die "go not found: install Go 1.26+ (helm is built from the helm.sh/helm/v3 Go module)"
    echo "building helm ${HELM_VERSION} (cached in ${bin_dir})" >&2
    mkdir -p "${bin_dir}"
    local flags="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
    local pkg
    for pkg in pkg/lint/rules pkg/chartutil; do
      flags+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=${HELM_K8S_MINOR}"
    done
    GOBIN="${bin_dir}" go install -ldflags "${flags}" "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2 \
      || die "cannot build helm from helm.sh/helm/v3@${HELM_VERSION}"
  fi
  printf '%s\n' "${bin_dir}/helm"
}
