# Sourced by device-prepare.sh and device-check.sh: unpacks the carried Debian packages into a
# prefix and exports what makes them usable there. Plain `dpkg -x` (no maintainer scripts, no
# dpkg database), so it works on a machine that is not Debian and on a read-only system.

# hora_device_unpack DEST PREFIX: every DEST/deb/*.deb into PREFIX, then the links that Debian's
# maintainer scripts would have made (update-alternatives: mpicc, mpirun, PSM's library), without hwloc's
# optional plugins (they need X11, OpenCL, libxml2). Unless HORA_DEVICE_KEEP_ALL=1, a library
# whose soname the machine already has (ldconfig -p) is removed from PREFIX, so that the
# machine's own, usually newer, copy is used by everything (PyTorch included) and ours never
# shadows it through LD_LIBRARY_PATH.
hora_device_unpack() {
  local dest=$1 prefix=$2 f lib so
  mkdir -p "$prefix"
  for f in "$dest"/deb/*.deb; do dpkg -x "$f" "$prefix"; done
  lib=$prefix/usr/lib/x86_64-linux-gnu
  [ -e "$prefix/usr/lib/libpsm1/libpsm_infinipath.so.1.16" ] &&
    ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$lib/libpsm_infinipath.so.1"
  for f in "$prefix"/usr/bin/*.openmpi; do
    [ -e "$f" ] && ln -sf "$(basename "$f")" "${f%.openmpi}"
  done
  rm -rf "$lib/hwloc"
  mkdir -p "$lib/pkgconfig"
  [ -e "$lib/openblas-pthread/pkgconfig/openblas.pc" ] &&
    ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$lib/pkgconfig/openblas.pc"
  if [ "${HORA_DEVICE_KEEP_ALL:-0}" != 1 ] && command -v ldconfig >/dev/null; then
    for f in "$lib"/lib*.so.* "$prefix"/lib/x86_64-linux-gnu/lib*.so.*; do
      [ -e "$f" ] || continue
      so=$(basename "$f")
      case "$so" in libmpi*|libopen-*|libpmix*|libmca_*|libompitrace*|liboshmem*) continue ;; esac
      if ldconfig -p | grep -qF " $so "; then rm -f "$f"; fi
    done
  fi
  # (Each lookup below may fail, the target gone or readelf absent as on the GPU machines: the
  # callers run under set -e -o pipefail, so each ends in `|| true`.)
  # Development links (libz.so -> libz.so.1.2.13) whose target is not in PREFIX (never carried,
  # or removed above) point at the machine's own copy of that soname instead.
  for f in "$lib"/lib*.so; do
    [ -L "$f" ] && [ ! -e "$f" ] || continue
    so=$(readelf -d "$(readlink -f "$f")" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p' || true)
    [ -n "$so" ] || so=$(basename "$f").$(readlink "$f" | sed -n 's/.*\.so\.\([0-9]*\).*/\1/p' || true)
    so=$(ldconfig -p | awk -v s="$so" '$1 == s && /x86-64/ {print $NF}' | head -1 || true)
    [ -n "$so" ] && ln -sf "$so" "$f"
  done
  return 0
}

# hora_device_env PREFIX: PATH, libraries, pkg-config and Open MPI's relocation (OPAL_PREFIX;
# Debian configured Open MPI with prefix /usr, so every path it computes moves under PREFIX/usr).
# PMIx finds its plugins through PMIX_MCA_mca_base_component_path.
hora_device_env() {
  local p=$1
  export OPAL_PREFIX=$p/usr
  export PMIX_MCA_mca_base_component_path=$p/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export PATH=$p/usr/bin:$PATH
  export LD_LIBRARY_PATH=$p/usr/lib/x86_64-linux-gnu/openmpi/lib:$p/usr/lib/x86_64-linux-gnu:$p/usr/lib/x86_64-linux-gnu/openblas-pthread:$p/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Only the carried .pc files, with their /usr paths moved under PREFIX (pkgconf's sysroot).
  export PKG_CONFIG_LIBDIR=$p/usr/lib/x86_64-linux-gnu/pkgconfig:$p/usr/share/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=$p
  export CMAKE_PREFIX_PATH=$p/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
}
