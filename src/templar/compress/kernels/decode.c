/* Sparse inverse DCT of k coefficients per chunk (see ../_native.c for the contract shared by every kernel). */
#include "kernels.h"

/* dst[h][w] (row stride `stride`) = or -= D_h^T[:, present] @ z[present, :]: a 4 x 16
 * register-blocked micro-kernel (eight 8-lane accumulators), for h % 4 == 0 and w % 16 == 0. */
VECTOR_CLONES
static void expand_rows_4x16(const float *restrict dh, int64_t h, const int64_t *restrict present, int64_t np,
                             const float *restrict z, int64_t w, float *restrict dst, int64_t stride, int subtract) {
    const f32x8 zero = {0};
    for (int64_t a0 = 0; a0 < h; a0 += 4) {
        for (int64_t b0 = 0; b0 < w; b0 += 16) {
            /* eight named accumulators: an array here gets zeroed through memory (rep stos) */
            f32x8 c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero, c31 = zero;
            for (int64_t p = 0; p < np; p++) {
                const f32x8 lo = load8(z + p * w + b0), hi = load8(z + p * w + b0 + 8);
                const float *d = dh + present[p] * h + a0;
                c00 += d[0] * lo, c01 += d[0] * hi;
                c10 += d[1] * lo, c11 += d[1] * hi;
                c20 += d[2] * lo, c21 += d[2] * hi;
                c30 += d[3] * lo, c31 += d[3] * hi;
            }
            const f32x8 acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
            for (int q = 0; q < 4; q++) {
                float *row = dst + (a0 + q) * stride + b0;
                f32x8 lo = acc[q][0], hi = acc[q][1];
                if (subtract) {
                    lo = load8(row) - lo;
                    hi = load8(row + 8) - hi;
                }
                memcpy(row, &lo, sizeof lo);
                memcpy(row + 8, &hi, sizeof hi);
            }
        }
    }
}

#ifdef HAVE_AVX512_KERNEL
int cpu_has_avx512; /* set once when the module loads */
typedef float f32x16 __attribute__((vector_size(64)));

static inline f32x16 load16(const float *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The same product with 4 x 32 blocks of 16-lane accumulators: half the loads per lane, which is
 * what bounds the 8-lane kernel. Chosen at run time where the CPU has AVX-512; w % 32 == 0. */
__attribute__((target("arch=x86-64-v4"))) static void expand_rows_4x32(const float *restrict dh, int64_t h,
                                                                       const int64_t *restrict present, int64_t np,
                                                                       const float *restrict z, int64_t w,
                                                                       float *restrict dst, int64_t stride,
                                                                       int subtract) {
    const f32x16 zero = {0};
    for (int64_t a0 = 0; a0 < h; a0 += 4) {
        for (int64_t b0 = 0; b0 < w; b0 += 32) {
            f32x16 c00 = zero, c01 = zero, c10 = zero, c11 = zero, c20 = zero, c21 = zero, c30 = zero, c31 = zero;
            for (int64_t p = 0; p < np; p++) {
                const f32x16 lo = load16(z + p * w + b0), hi = load16(z + p * w + b0 + 16);
                const float *d = dh + present[p] * h + a0;
                c00 += d[0] * lo, c01 += d[0] * hi;
                c10 += d[1] * lo, c11 += d[1] * hi;
                c20 += d[2] * lo, c21 += d[2] * hi;
                c30 += d[3] * lo, c31 += d[3] * hi;
            }
            const f32x16 acc[4][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}};
            for (int q = 0; q < 4; q++) {
                float *row = dst + (a0 + q) * stride + b0;
                f32x16 lo = acc[q][0], hi = acc[q][1];
                if (subtract) {
                    lo = load16(row) - lo;
                    hi = load16(row + 16) - hi;
                }
                memcpy(row, &lo, sizeof lo);
                memcpy(row + 16, &hi, sizeof hi);
            }
        }
    }
}
#endif

/* dst = or -= the tile, with the widest micro-kernel this CPU and chunk width allow. */
static void expand_rows(const float *dh, int64_t h, const int64_t *present, int64_t np, const float *z, int64_t w,
                        float *dst, int64_t stride, int subtract) {
#ifdef HAVE_AVX512_KERNEL
    if (cpu_has_avx512 && w % 32 == 0) {
        expand_rows_4x32(dh, h, present, np, z, w, dst, stride, subtract);
        return;
    }
#endif
    expand_rows_4x16(dh, h, present, np, z, w, dst, stride, subtract);
}

VECTOR_CLONES
static void expand_rows_generic(const float *restrict dh, int64_t h, const int64_t *restrict present, int64_t np,
                                const float *restrict z, int64_t w, float *restrict tile) {
    memset(tile, 0, sizeof(float) * (size_t)(h * w));
    for (int64_t p = 0; p < np; p++)
        for (int64_t a = 0; a < h; a++) {
            const float s = dh[present[p] * h + a];
            for (int64_t b = 0; b < w; b++) tile[a * w + b] += s * z[p * w + b];
        }
}

VECTOR_CLONES
static void add_scaled_row(float *restrict y, const float *restrict x, float s, int64_t n) {
    for (int64_t b = 0; b < n; b++) y[b] += s * x[b];
}

/*
 * out[rows, cols] (row stride out_stride) = or -= the inverse DCT of k coefficients per chunk,
 * cropped to the real rows/cols. Per chunk: Z[p, :] = sum of v * D_w[j, :] over each run of
 * coefficients in the same coefficient row i_p (ascending indices make one run per row), then the
 * tile D_h^T[:, i] @ Z: k*w + runs*h*w multiply-adds instead of a dense 2*h*w*(h+w). Unsorted
 * indices only make more runs (at most k), which still sum to the right answer.
 */
int decode_bands(const int64_t *idx, const float *val, int64_t k, const float *dh, const float *dw, int64_t h,
                        int64_t w, int64_t rows, int64_t cols, float *out, int64_t out_stride, int subtract,
                        int threads) {
    const int64_t grid_c = (cols + w - 1) / w, cn = h * w, bands = (rows + h - 1) / h;
    const int blocked = (h % 4 == 0) && (w % 16 == 0);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
    float *z = malloc(sizeof(float) * (size_t)(k * w + cn)); /* k runs at most, then the tile */
    int64_t *present = malloc(sizeof(int64_t) * (size_t)(k > 0 ? k : 1));
    int32_t *row_of = row_table(h, w);
    failed = !z || !present || !row_of;
    float *tile = failed ? NULL : z + k * w;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < bands; r++) {
        if (failed) continue;
        const int64_t r0 = r * h, nr = rows - r0 < h ? rows - r0 : h;
        for (int64_t c = 0; c < grid_c; c++) {
            const int64_t chunk = r * grid_c + c, c0 = c * w, nw = cols - c0 < w ? cols - c0 : w;
            int64_t np = 0, last = -1;
            for (int64_t m = 0; m < k; m++) {
                const int64_t q = idx[chunk * k + m];
                if (q < 0 || q >= cn) continue;
                const int64_t i = row_of[q], j = q - i * w;
                if (i != last) {
                    present[np] = i;
                    memset(z + np * w, 0, sizeof(float) * (size_t)w);
                    np++;
                    last = i;
                }
                add_scaled_row(z + (np - 1) * w, dw + j * w, val[chunk * k + m], w);
            }
            if (blocked && nr == h && nw == w) {
                expand_rows(dh, h, present, np, z, w, out + r0 * out_stride + c0, out_stride, subtract);
                continue;
            }
            if (blocked)
                expand_rows(dh, h, present, np, z, w, tile, w, 0);
            else
                expand_rows_generic(dh, h, present, np, z, w, tile);
            for (int64_t a = 0; a < nr; a++) {
                float *dst = out + (r0 + a) * out_stride + c0;
                if (subtract)
                    add_scaled_row(dst, tile + a * w, -1.0f, nw);
                else
                    memcpy(dst, tile + a * w, sizeof(float) * (size_t)nw);
            }
        }
    }
    free(z);
    free(present);
    free(row_of);
    }
    return failed ? -1 : 0;
}
