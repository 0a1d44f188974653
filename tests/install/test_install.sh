#!/bin/bash
# cmake --install into a fresh prefix, then build a program outside the tree against it twice:
# through the exported CMake package (find_package(hora), hora::hora) and through pkg-config
# (hora.pc), and run both under mpirun -np 2. Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
for f in include/hora.h include/hora/config.h include/hora/version.h; do
  [ -f "$work/prefix/$f" ] || { echo "FAIL: $f not installed"; exit 1; }
done
libdir=$(ls -d "$work"/prefix/lib*/ | head -1)
for f in libhora.so cmake/hora/horaConfig.cmake cmake/hora/horaConfigVersion.cmake pkgconfig/hora.pc; do
  [ -e "$libdir/$f" ] || { echo "FAIL: $libdir$f not installed"; exit 1; }
done
# Only hora_* symbols are exported.
bad=$(nm -D --defined-only "$libdir/libhora.so" | awk '$2 ~ /[TDB]/ {print $3}' | grep -v '^hora_' | grep -v '^_' || true)
[ -z "$bad" ] || { echo "FAIL: libhora.so exports non-hora symbols: $bad"; exit 1; }

run() { mpirun --oversubscribe --bind-to none -np 2 "$@"; }
# 1. CMake package.
cmake -S "$src/tests/install/consumer" -B "$work/cm" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/cm" >/dev/null
out=$(LD_LIBRARY_PATH="$libdir" run "$work/cm/consumer")
echo "cmake package: $out"
[ "$out" = "consumer ok 2 3" ] || { echo "FAIL: consumer built with find_package(hora) printed '$out'"; exit 1; }
# 2. pkg-config.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
# shellcheck disable=SC2046
cc -o "$work/pc-consumer" "$src/tests/install/consumer/consumer.c" $(pkg-config --cflags --libs hora)
out=$(LD_LIBRARY_PATH="$libdir" run "$work/pc-consumer")
echo "pkg-config: $out"
[ "$out" = "consumer ok 2 3" ] || { echo "FAIL: consumer built with pkg-config printed '$out'"; exit 1; }
echo "test_install: passed"
