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
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  # Keep package scripts from starting system daemons (munge, slurm) during install.
  policy_added=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    policy_added=1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # (an if, not `[ ] &&`: that line's status 1 would be this script's where the file existed)
  if [ $policy_added = 1 ]; then $SUDO rm -f /usr/sbin/policy-rc.d; fi
fi
