# Shared helpers for scripts/*. Sourced, not run.

step() { printf '\n==> %s\n' "$*"; }
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
