/* CRC32C against the standard check vectors (RFC 3720 B.4 and the "123456789" check value),
 * hardware vs table implementations on odd lengths and offsets, and incremental use.
 * HORA_TEST_EXPECT_CRC_HW=1|0 also asserts which implementation hora__crc32c uses (set by
 * tests/unit/cross_arch.sh, which runs this test on AArch64 under qemu). */
#include "core/crc32c.h"
#include "hora_test.h"

int main(void) {
  const char *want_hw = getenv("HORA_TEST_EXPECT_CRC_HW");
  if (want_hw) EXPECT(hora__crc32c_hw() == atoi(want_hw), "hardware CRC32C: %d, want %s", hora__crc32c_hw(), want_hw);
  EXPECT(hora__crc32c(0, "123456789", 9) == 0xE3069283u, "check value %08x", hora__crc32c(0, "123456789", 9));
  EXPECT(hora__crc32c_sw(0, "123456789", 9) == 0xE3069283u, "sw check value");
  unsigned char buf[32];
  memset(buf, 0, 32);
  EXPECT(hora__crc32c(0, buf, 32) == 0x8A9136AAu, "32 zeros: %08x", hora__crc32c(0, buf, 32));
  memset(buf, 0xff, 32);
  EXPECT(hora__crc32c(0, buf, 32) == 0x62A8AB43u, "32 0xff: %08x", hora__crc32c(0, buf, 32));
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)i;
  EXPECT(hora__crc32c(0, buf, 32) == 0x46DD794Eu, "0..31: %08x", hora__crc32c(0, buf, 32));
  for (int i = 0; i < 32; i++) buf[i] = (unsigned char)(31 - i);
  EXPECT(hora__crc32c(0, buf, 32) == 0x113FDB5Cu, "31..0: %08x", hora__crc32c(0, buf, 32));
  /* hardware == software for every length and alignment; incremental == one shot */
  unsigned char big[300];
  for (int i = 0; i < 300; i++) big[i] = (unsigned char)(i * 7 + 3);
  for (int off = 0; off < 9; off++)
    for (int len = 0; len < 280; len += 13) {
      uint32_t a = hora__crc32c(0, big + off, (size_t)len), b = hora__crc32c_sw(0, big + off, (size_t)len);
      EXPECT(a == b, "off %d len %d: %08x vs %08x", off, len, a, b);
      uint32_t inc = hora__crc32c(hora__crc32c(0, big + off, (size_t)len / 3), big + off + len / 3,
                                  (size_t)(len - len / 3));
      EXPECT(inc == a, "incremental off %d len %d", off, len);
    }
  /* lengths around the interleaved paths (3 x 256 and 3 x 8192 byte blocks) and their tails */
  size_t bn = 80000;
  unsigned char *huge = malloc(bn);
  EXPECT(huge != NULL, "malloc");
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < bn; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    huge[i] = (unsigned char)s;
  }
  static const size_t lens[] = {767, 768, 769, 1535, 1536, 2311, 24575, 24576, 24577, 24576 + 768,
                                49152, 49152 + 2 * 768 + 5, 3 * 8192 * 2 + 3 * 256 * 3 + 60};
  for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
    for (size_t off = 0; off < 4; off++) {
      uint32_t a = hora__crc32c(0, huge + off, lens[k]), b = hora__crc32c_sw(0, huge + off, lens[k]);
      EXPECT(a == b, "interleaved off %zu len %zu: %08x vs %08x", off, lens[k], a, b);
      uint32_t inc = hora__crc32c(hora__crc32c(0xdeadbeefu, huge + off, 1000), huge + off + 1000, lens[k] - 500);
      uint32_t inc_sw = hora__crc32c_sw(hora__crc32c_sw(0xdeadbeefu, huge + off, 1000), huge + off + 1000, lens[k] - 500);
      EXPECT(inc == inc_sw, "interleaved incremental off %zu len %zu", off, lens[k]);
    }
  /* three buffers at once == one at a time, for unequal and odd lengths and offsets */
  static const size_t l3[][3] = {{0, 0, 0}, {785, 785, 785}, {7, 800, 13}, {4096, 9, 70000}, {1, 2, 3},
                                 {24577, 24576, 24575}};
  for (size_t k = 0; k < sizeof l3 / sizeof l3[0]; k++) {
    const void *ps[3] = {huge + 1, huge + 2 * k + 3, huge + 7};
    uint32_t got[3];
    hora__crc32c_x3(ps, l3[k], got);
    for (int i = 0; i < 3; i++) {
      uint32_t want = hora__crc32c_sw(0, ps[i], l3[k][i]);
      EXPECT(got[i] == want, "x3 case %zu buffer %d (len %zu): %08x vs %08x", k, i, l3[k][i], got[i], want);
    }
  }
  free(huge);
  return hora_test_finish("test_crc32c");
}
