/* Forward DCT fused with the per-chunk top-k (see ../_native.c for the contract shared by every kernel). */
#include "kernels.h"

/* out rows m*os (L floats each) = sum_j a[m*K + j] * v[j*L ..], m < M: a 4 x 16 register-blocked
 * product where it fits, a plain loop for the remaining rows or odd widths. */
VECTOR_CLONES
static void small_gemm(const float *restrict a, int64_t M, int64_t K, const float *restrict v, int64_t L,
                       float *restrict out, int64_t os) {
    const f32x8 zero = {0};
    int64_t m0 = 0;
    if (L % 16 == 0) {
        for (; m0 + 4 <= M; m0 += 4) {
            const float *r0 = a + m0 * K, *r1 = r0 + K, *r2 = r1 + K, *r3 = r2 + K;
            for (int64_t b0 = 0; b0 < L; b0 += 16) {
                f32x8 c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero, c31 = zero;
                for (int64_t j = 0; j < K; j++) {
                    const f32x8 lo = load8(v + j * L + b0), hi = load8(v + j * L + b0 + 8);
                    c00 += r0[j] * lo, c01 += r0[j] * hi;
                    c10 += r1[j] * lo, c11 += r1[j] * hi;
                    c20 += r2[j] * lo, c21 += r2[j] * hi;
                    c30 += r3[j] * lo, c31 += r3[j] * hi;
                }
                const f32x8 acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
                for (int q = 0; q < 4; q++) {
                    memcpy(out + (m0 + q) * os + b0, &acc[q][0], sizeof acc[q][0]);
                    memcpy(out + (m0 + q) * os + b0 + 8, &acc[q][1], sizeof acc[q][1]);
                }
            }
        }
    }
    for (; m0 < M; m0++) {
        float *o = out + m0 * os;
        for (int64_t b = 0; b < L; b++) o[b] = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            const float s = a[m0 * K + j];
            const float *src = v + j * L;
            for (int64_t b = 0; b < L; b++) o[b] += s * src[b];
        }
    }
}

/*
 * y = D_n @ x for n rows of L floats (x row stride xs, y row stride ys; x is only read). The
 * DCT-II basis rows 2m are symmetric and rows 2m+1 antisymmetric about the centre, so each level
 * adds and subtracts mirrored rows: the odd outputs are one dense (n/2)^2 product with the
 * differences, the even outputs the same transform, at half size, of the sums. ~n^2/3
 * multiply-adds instead of n^2 (1368 instead of 4096 for n = 64). `f` holds every level's odd-row matrix, then the last dense one
 * (`native.py` builds it in float64 from the closed form).
 */
static void dct_rows(const float *f, int64_t n, int64_t L, const float *x, int64_t xs, float *y, int64_t ys,
                     float *ubuf, float *restrict vbuf) {
    int64_t scale = 1, cs = xs;
    const float *cur = x;
    while (n % 2 == 0 && n > 2) {
        const int64_t half = n / 2;
        for (int64_t i = 0; i < half; i++) { /* row i is read before it is overwritten with its sum */
            const float *p = cur + i * cs, *q = cur + (n - 1 - i) * cs;
            float *u = ubuf + i * L, *restrict v = vbuf + i * L;
            for (int64_t b = 0; b < L; b++) {
                const float s = p[b], t = q[b];
                u[b] = s + t;
                v[b] = s - t;
            }
        }
        small_gemm(f, half, half, vbuf, L, y + scale * ys, 2 * scale * ys);
        f += half * half;
        n = half;
        scale *= 2;
        cur = ubuf;
        cs = L;
    }
    if (cs != L) { /* no level ran (odd n): gather x's rows densely */
        for (int64_t i = 0; i < n; i++) memcpy(ubuf + i * L, cur + i * cs, sizeof(float) * (size_t)L);
        cur = ubuf;
    }
    small_gemm(f, n, n, cur, L, y, scale * ys);
}

typedef int32_t i32x8 __attribute__((vector_size(32)));
#define SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (i32x8){__VA_ARGS__})

/* dst (c x r, row stride ds) = src^T (r x c, row stride ss), by 8 x 8 register tiles; r, c % 8 == 0. */
VECTOR_CLONES
static void transpose8(const float *restrict src, int64_t r, int64_t c, int64_t ss, float *restrict dst, int64_t ds) {
    for (int64_t i0 = 0; i0 < r; i0 += 8)
        for (int64_t j0 = 0; j0 < c; j0 += 8) {
            const float *s = src + i0 * ss + j0;
            const f32x8 r0 = load8(s), r1 = load8(s + ss), r2 = load8(s + 2 * ss), r3 = load8(s + 3 * ss),
                        r4 = load8(s + 4 * ss), r5 = load8(s + 5 * ss), r6 = load8(s + 6 * ss), r7 = load8(s + 7 * ss);
            const f32x8 t0 = SHUFFLE8(r0, r1, 0, 8, 1, 9, 4, 12, 5, 13), t1 = SHUFFLE8(r0, r1, 2, 10, 3, 11, 6, 14, 7, 15),
                        t2 = SHUFFLE8(r2, r3, 0, 8, 1, 9, 4, 12, 5, 13), t3 = SHUFFLE8(r2, r3, 2, 10, 3, 11, 6, 14, 7, 15),
                        t4 = SHUFFLE8(r4, r5, 0, 8, 1, 9, 4, 12, 5, 13), t5 = SHUFFLE8(r4, r5, 2, 10, 3, 11, 6, 14, 7, 15),
                        t6 = SHUFFLE8(r6, r7, 0, 8, 1, 9, 4, 12, 5, 13), t7 = SHUFFLE8(r6, r7, 2, 10, 3, 11, 6, 14, 7, 15);
            const f32x8 u0 = SHUFFLE8(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13), u1 = SHUFFLE8(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15),
                        u2 = SHUFFLE8(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13), u3 = SHUFFLE8(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15),
                        u4 = SHUFFLE8(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13), u5 = SHUFFLE8(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15),
                        u6 = SHUFFLE8(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13), u7 = SHUFFLE8(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
            const f32x8 o[8] = {SHUFFLE8(u0, u4, 0, 1, 2, 3, 8, 9, 10, 11), SHUFFLE8(u1, u5, 0, 1, 2, 3, 8, 9, 10, 11),
                                SHUFFLE8(u2, u6, 0, 1, 2, 3, 8, 9, 10, 11), SHUFFLE8(u3, u7, 0, 1, 2, 3, 8, 9, 10, 11),
                                SHUFFLE8(u0, u4, 4, 5, 6, 7, 12, 13, 14, 15), SHUFFLE8(u1, u5, 4, 5, 6, 7, 12, 13, 14, 15),
                                SHUFFLE8(u2, u6, 4, 5, 6, 7, 12, 13, 14, 15), SHUFFLE8(u3, u7, 4, 5, 6, 7, 12, 13, 14, 15)};
            float *d = dst + j0 * ds + i0;
            for (int q = 0; q < 8; q++) memcpy(d + q * ds, &o[q], sizeof o[q]);
        }
}

/*
 * Compress the [rows, cols] float32 matrix `src` chunk by chunk: the chunk's DCT coefficients
 * (zero-padded past rows/cols) are computed into an L1/L2-resident tile and its top-k is taken
 * there, so the padded coefficient matrix is never written to or read back from memory.
 * h % 8 == 0 and w % 8 == 0 (checked by the caller). Chunks are independent: results do not
 * depend on the thread count.
 */
int compress_chunks(const float *src, int64_t rows, int64_t cols, int64_t h, int64_t w, const float *fh,
                           const float *fw, int64_t k, int64_t *out_idx, float *out_val, int threads) {
    const int64_t grid_r = (rows + h - 1) / h, grid_c = (cols + w - 1) / w, chunks = grid_r * grid_c;
    const int64_t side = h > w ? h : w;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
    select_scratch ws;
    float *tile = malloc(sizeof(float) * (size_t)(2 * h * w + 2 * side * side));
    failed = select_scratch_init(&ws, h, w, w) != 0 || !tile;
    float *a = tile, *b = tile ? tile + h * w : NULL, *ub = b ? b + h * w : NULL, *vb = ub ? ub + side * side : NULL;
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ch++) {
        if (failed) continue;
        const int64_t r0 = (ch / grid_c) * h, q0 = (ch % grid_c) * w;
        const float *in = src + r0 * cols + q0;
        int64_t in_stride = cols;
        if (r0 + h > rows || q0 + w > cols) { /* an edge chunk of a padded plan: copy with zeros */
            for (int64_t i = 0; i < h; i++) {
                const int64_t n = r0 + i >= rows ? 0 : (cols - q0 < w ? cols - q0 : w);
                if (n) memcpy(a + i * w, src + (r0 + i) * cols + q0, sizeof(float) * (size_t)n);
                for (int64_t j = n; j < w; j++) a[i * w + j] = 0.0f;
            }
            in = a;
            in_stride = w;
        }
        dct_rows(fh, h, w, in, in_stride, b, w, ub, vb); /* b [h][w]: along the rows' dimension */
        transpose8(b, h, w, w, a, h);                   /* a [w][h] */
        dct_rows(fw, w, h, a, h, b, h, ub, vb);         /* b [w][h]: the coefficients, transposed */
        transpose8(b, w, h, h, a, w);                   /* a [h][w]: the chunk's coefficients */
        select_band(a, w, h, w, k, &ws, out_idx + ch * k, out_val + ch * k);
    }
    free(tile);
    select_scratch_free(&ws);
    }
    return failed ? -1 : 0;
}
