/* The Rice-coded chunk indices and the 2-bit value codes of a payload (`templar.wire.codec`), each
 * decoded in one pass.
 *
 * Each value's gap to the index before it in its chunk (-1 before the first) is `high << b | low`:
 * `low` the b bits at bit i*b of `lo`, `high` the zeros before the i-th set bit of `hi` (both streams
 * little-endian bit order). The numpy reader does the same in about ten passes over arrays of n
 * 64-bit values, holding the GIL between them; a node reads every payload it gathers inside one
 * round, in the gather's worker threads, so this pass releases it.
 *
 * Only the well-formed case is decided here: any anomaly (too few or too many terminators, a last
 * terminator before the last byte, an index past its chunk) returns 1 without a reason, and the
 * caller re-reads the streams with the numpy reader, which names it. So a refusal and its reason are
 * always the numpy reader's. */
#include "kernels.h"

/* Up to 8 bytes of `s` from byte `at`, zero past its end (little-endian). */
static inline uint64_t load_word(const uint8_t *s, int64_t len, int64_t at, int64_t *loaded) {
    uint64_t word = 0;
    int64_t avail = len - at;
    if (avail >= 8) {
        memcpy(&word, s + at, 8);
        *loaded = 8;
        return word;
    }
    for (int64_t i = 0; i < avail; i++) word |= (uint64_t)s[at + i] << (8 * i);
    *loaded = avail > 0 ? avail : 0;
    return word;
}

int rice_decode_indices(const uint8_t *lo, int64_t lo_len, const uint8_t *hi, int64_t hi_len, int b,
                        int64_t n_chunks, int64_t k, int64_t chunk_numel, int64_t *out, int64_t *gaps) {
    if (b < 0 || b > 56 || k <= 0 || n_chunks < 0 || chunk_numel <= 0) return 1;
    const uint64_t mask = b ? ((uint64_t)1 << b) - 1 : 0;
    const int64_t hi_bits = hi_len * 8;
    int64_t pos = 0, i = 0, loaded;
    for (int64_t c = 0; c < n_chunks; c++) {
        int64_t prev = -1;
        for (int64_t j = 0; j < k; j++, i++) {
            const int64_t start = pos;
            for (;;) { /* the next terminator at or after `pos` */
                if (pos >= hi_bits) return 1;
                const int64_t byte = pos >> 3;
                const uint64_t word = load_word(hi, hi_len, byte, &loaded) >> (pos & 7);
                if (word) {
                    pos += __builtin_ctzll(word);
                    break;
                }
                pos = (byte + loaded) * 8;
            }
            const int64_t high = pos - start;
            pos++;
            if (high >= chunk_numel) return 1;
            uint64_t low = 0;
            if (b) {
                const int64_t bit = i * (int64_t)b;
                low = (load_word(lo, lo_len, bit >> 3, &loaded) >> (bit & 7)) & mask;
            }
            const int64_t gap = (int64_t)(((uint64_t)high << b) | low);
            const int64_t index = prev + gap + 1;
            if (index >= chunk_numel) return 1;
            gaps[i] = gap;
            out[i] = prev = index;
        }
    }
    /* the last terminator in the last byte, and no set bit after it */
    if (((pos - 1) >> 3) != hi_len - 1) return 1;
    if (pos & 7 && (hi[hi_len - 1] >> (pos & 7))) return 1;
    return 0;
}

/* `rice-q2`'s value codes: four 2-bit codes a byte, the first value in the low bits; code 0 is level
 * 0, 1 is +1, 3 is -1, and 2 (a negative zero) has no level. Writes the n levels and, per chunk of k,
 * whether any is non-zero. Returns 1 on a code 2 among the n or a non-zero code in the padding after
 * them (the caller's numpy reader then names it), else 0. */
int q2_decode_levels(const uint8_t *q, int64_t q_len, int64_t n_chunks, int64_t k, int8_t *levels,
                     uint8_t *signal) {
    static const int8_t level_of_code[4] = {0, 1, 0, -1};
    const int64_t n = n_chunks * k;
    if (k <= 0 || n_chunks < 0 || q_len != (n + 3) / 4) return 1;
    for (int64_t c = 0; c < n_chunks; c++) {
        uint8_t any = 0;
        for (int64_t j = 0; j < k; j++) {
            const int64_t i = c * k + j;
            const int code = (q[i >> 2] >> (2 * (i & 3))) & 3;
            if (code == 2) return 1;
            levels[i] = level_of_code[code];
            any |= (uint8_t)code;
        }
        signal[c] = any != 0;
    }
    if (n & 3 && (q[q_len - 1] >> (2 * (n & 3)))) return 1;
    return 0;
}
