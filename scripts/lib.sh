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
