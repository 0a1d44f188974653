#!/bin/bash
# Prepares, on a Debian 12 development machine with network access, everything that
# tests/gpu/device-check.sh needs on a bare GPU machine beyond the working tree: the CPU-side
# libraries hora builds and runs with (Open MPI with PMIx, hwloc, jansson, OpenBLAS, zlib
# headers) as Debian .deb files, the Python wheels of cffi (the GPU machine's Python has PyTorch
# and NumPy but not cffi), and a copy of the real MNIST digits for the CNN benchmark. The folder
# it fills (default .debs/, ignored by git) is what a device run carries with the working tree.
#
#   bash tests/gpu/device-prepare.sh [DEST]
#
# It then checks the closure: every shared library that an ELF file in the packages needs must be
# in the packages or in BASE_SONAMES (what any glibc Linux with a C/C++ toolchain has); a missing
# one is listed and the script exits 1, so a package left out is found here, not on the GPU
# machine. Prints the folder's size: it must stay well under the device tool's 64 MiB limit.
# Environment: HORA_DEVICE_PYVER (Python version of the GPU machine's python3, default 3.12),
# HORA_MNIST_DIR (IDX files to copy; default ../shared/data/mnist-digits-10k beside the checkout).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.debs}
PYVER=${HORA_DEVICE_PYVER:-3.12}
MNIST=${HORA_MNIST_DIR:-../shared/data/mnist-digits-10k}

# Debian 12 package names. Runtime libraries of Open MPI 4.1 and its transports (Open MPI loads
# them at MPI_Init even on one node), the -dev packages for headers and unversioned .so links, and
# the libraries the example links. Compilers are not carried: the GPU machine has gcc for nvcc.
PKGS=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2 libpmix-dev
      libevent-core-2.1-7 libevent-pthreads-2.1-7 libhwloc15 libhwloc-dev
      libfabric1 libibverbs1 ibverbs-providers librdmacm1 libucx0 libpsm2-2 libpsm-infinipath1
      libnl-3-200 libnl-route-3-200 libnuma1 libmunge2 libltdl7 libgfortran5 libquadmath0
      libjansson4 libjansson-dev libopenblas0 libopenblas0-pthread libopenblas-dev
      libopenblas-pthread-dev zlib1g-dev pkgconf pkgconf-bin libpkgconf3)
# Sonames every target machine provides itself (glibc, the GCC runtime a C/C++ toolchain brings,
# zlib, udev). Anything else an ELF file needs must come from PKGS.
BASE_SONAMES='^(libc|libm|libdl|libpthread|librt|libutil|libresolv|ld-linux-x86-64|libgcc_s|libstdc\+\+|libatomic|libz|libudev|libcrypt|libuuid)\.so'

command -v apt-get >/dev/null || { echo "device-prepare: needs Debian's apt-get"; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/deb" "$DEST/whl"
(cd "$DEST/deb" && apt-get download "${PKGS[@]}" >/dev/null) || {
  echo "device-prepare: apt-get download failed (run 'apt-get update' once, check the network)"
  exit 1
}

# cffi for the GPU machine's Python (no network there): binary wheels only.
PY=$(command -v python3)
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "device-prepare: python3 has no pip: cannot fetch the cffi wheels"; exit 1
fi
# Also for this machine's python3, so that the dry run (tests/gpu/CMakeLists.txt) installs them.
for v in "$PYVER" "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$v" \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" cffi pycparser
done

if [ -d "$MNIST" ]; then
  mkdir -p "$DEST/mnist"
  cp "$MNIST"/*-idx?-ubyte.gz "$DEST/mnist/"
else
  echo "device-prepare: no MNIST digits at $MNIST: the CNN benchmark will be skipped there"
fi

# Closure check: unpack into a scratch prefix as device-check.sh does (all of it, as if the GPU
# machine had none of these libraries), list the NEEDED sonames of every ELF file.
. tests/gpu/device-deps.sh
scratch=$(mktemp -d "${TMPDIR:-/tmp}/hora-device-prepare.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
HORA_DEVICE_KEEP_ALL=1 hora_device_unpack "$DEST" "$scratch"
have=$(find "$scratch" \( -type f -o -type l \) -name 'lib*.so*' -printf '%f\n' | sort -u)
missing=$(find "$scratch" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec sh -c \
  'readelf -d "$1" 2>/dev/null | sed -n "s/.*(NEEDED).*\[\(.*\)\]/\1/p"' _ {} \; | sort -u |
  while read -r so; do
    printf '%s\n' "$have" | grep -qxF "$so" && continue
    printf '%s\n' "$so" | grep -qE "$BASE_SONAMES" && continue
    printf '%s\n' "$so"
  done)
if [ -n "$missing" ]; then
  echo "device-prepare: shared libraries needed but not carried (add their packages to PKGS):"
  printf '  %s\n' $missing
  exit 1
fi
size=$(du -sb "$DEST" | cut -f1)
echo "device-prepare: $DEST holds $(ls "$DEST"/deb | wc -l) packages, $(ls "$DEST"/whl | wc -l) wheels," \
     "$((size / 1024 / 1024)) MiB ($size bytes); carry it with the device run: carry=[\"$DEST\"]"
