#!/bin/bash
# Runs the tests of hora's architecture-specific single files (CRC32C: x86-64 SSE4.2 or AArch64
# CRC32 instructions, else tables) for AArch64 under qemu-user: built static with the Debian
# cross compiler, run once on an emulated CPU with the CRC32 instructions (`-cpu max`: the
# hardware path must be taken) and compared against the table implementation.
#   tests/unit/cross_arch.sh SOURCE_DIR WORK_DIR
# Exit 77 (skipped) when aarch64-linux-gnu-gcc or qemu-aarch64 is missing (tests/install-deps.sh
# installs both).
set -euo pipefail
src=$1
work=$2
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  echo "cross_arch: aarch64-linux-gnu-gcc or qemu-aarch64 missing: skipped"
  exit 77
fi
mkdir -p "$work"
aarch64-linux-gnu-gcc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -static -pthread \
  -DHORA_TEST_NO_MPI -I"$src/runtime" -I"$src/tests/common" \
  "$src/tests/unit/test_crc32c.c" "$src/runtime/core/crc32c.c" -o "$work/test_crc32c.aarch64"
HORA_TEST_EXPECT_CRC_HW=1 qemu-aarch64 -cpu max "$work/test_crc32c.aarch64"
