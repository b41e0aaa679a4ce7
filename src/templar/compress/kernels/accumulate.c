/* Fixed-point accumulation of many peers' coefficients (see ../_native.c for the contract shared by every kernel). */
#include "kernels.h"

/*
 * round_half_even(v * scale) as int64, exactly like torch.round(v.double() * scale).long():
 * the product is rounded to double first (contraction into an FMA is switched off here, since
 * that would skip this rounding), then rounded to an integer, ties to even, by adding and removing
 * 2^52 (the IEEE default rounding mode does the work; doubles of magnitude >= 2^52 are integers).
 * Not libm's nearbyint: without SSE4.1 that is a function call per term.
 */
__attribute__((noinline, optimize("fp-contract=off"))) static int64_t fixed_point(float v, double scale) {
    const double big = 4503599627370496.0; /* 2^52 */
    double x = (double)v * scale;
    if (fabs(x) < big) {
        const double t = copysign(big, x);
        x = (x + t) - t;
    }
    return (int64_t)x;
}

/*
 * coef[padded rows, cols] = float32(sum over peers of round_half_even(v * scale_p)) in int64,
 * chunk by chunk. Integer addition is associative, so the result does not depend on peer order,
 * and it equals the torch path (same double products, same rounding, same int64 -> float32
 * conversion). Only the positions some peer sent are converted; the rest of the chunk is zeroed.
 */
int accumulate_bands(int64_t peers, const int64_t *idx_ptrs, const int64_t *val_ptrs, const double *scales,
                            int64_t k, int64_t h, int64_t w, int64_t cols, int64_t bands, float *coef, int threads) {
    const int64_t grid_c = cols / w, cn = h * w;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
    int64_t *acc = calloc((size_t)cn, sizeof(int64_t));            /* all zero between chunks */
    int64_t *touched = malloc(sizeof(int64_t) * (size_t)(peers * k)); /* one entry per term at most */
    int32_t *row_of = row_table(h, w);
    failed = !acc || !touched || !row_of;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < bands; r++) {
        if (failed) continue;
        for (int64_t c = 0; c < grid_c; c++) {
            const int64_t chunk = r * grid_c + c;
            int64_t nt = 0;
            for (int64_t p = 0; p < peers; p++) {
                const int64_t *pi = (const int64_t *)(intptr_t)idx_ptrs[p] + chunk * k;
                const float *pv = (const float *)(intptr_t)val_ptrs[p] + chunk * k;
                const double scale = scales[p];
                for (int64_t m = 0; m < k; m++) {
                    const int64_t q = pi[m];
                    if (q < 0 || q >= cn) continue;
                    const int64_t term = fixed_point(pv[m], scale);
                    if (acc[q] == 0 && term != 0) touched[nt++] = q; /* may repeat after a cancellation */
                    acc[q] += term;
                }
            }
            float *dst = coef + r * h * cols + c * w;
            for (int64_t i = 0; i < h; i++) memset(dst + i * cols, 0, sizeof(float) * (size_t)w);
            for (int64_t t = 0; t < nt; t++) {
                const int64_t q = touched[t];
                dst[row_of[q] * (cols - w) + q] = (float)acc[q];
            }
            for (int64_t t = 0; t < nt; t++) acc[touched[t]] = 0;
        }
    }
    free(acc);
    free(touched);
    free(row_of);
    }
    return failed ? -1 : 0;
}
