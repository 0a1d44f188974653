#!/bin/bash
# Installs what hora needs on Debian 12 (idempotent; run as root or with sudo available).
# Used by tests/run.sh and examples/mnist/demo.sh. Set HORA_SKIP_INSTALL=1 to skip.
set -euo pipefail
[ "${HORA_SKIP_INSTALL:-0}" = 1 ] && exit 0
PKGS=(build-essential cmake pkg-config git libopenmpi-dev openmpi-bin libpmix-dev libhwloc-dev hwloc
      libjansson-dev libopenblas-dev zlib1g-dev slurm-wlm munge dataset-fashion-mnist
      clang libclang-rt-14-dev python3 python3-dev python3-pip python3-venv
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user iproute2)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The policy file's path is a parameter only for tests/install/test_install_deps.sh.
POLICY=${HORA_POLICY_RC_D:-/usr/sbin/policy-rc.d}
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  # Keep package scripts from starting system daemons (munge, slurm) during install. A file this
  # script adds goes when it exits, whether apt-get succeeded or not (left behind, it would keep
  # every service of the machine from starting); one that was there (a container's) stays.
  if [ ! -e "$POLICY" ]; then
    trap '$SUDO rm -f "$POLICY"' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod +x "$POLICY"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
exit 0
