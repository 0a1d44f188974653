/* CRC32C against the standard check vectors (RFC 3720 B.4 and the "123456789" check value),
 * hardware vs table implementations on odd lengths and offsets, and incremental use. */
#include "core/crc32c.h"
#include "hora_test.h"

int main(void) {
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
  return hora_test_finish("test_crc32c");
}
