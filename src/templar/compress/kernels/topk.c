/* Exact per-chunk top-k of DCT coefficients (see ../_native.c for the contract shared by every kernel). */
#include "kernels.h"

int32_t *row_table(int64_t h, int64_t w) {
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)(h * w));
    if (rows)
        for (int64_t q = 0; q < h * w; q++) rows[q] = (int32_t)(q / w);
    return rows;
}

/* k-th largest (1-based) of a[0..n), reordering a (Hoare quickselect). */
static uint64_t kth_largest(uint64_t *a, int64_t n, int64_t k) {
    int64_t target = n - k, lo = 0, hi = n - 1;
    while (lo < hi) {
        uint64_t pivot = a[(lo + hi) >> 1];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                uint64_t t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (target <= j)
            hi = j;
        else if (target >= i)
            lo = i;
        else
            break;
    }
    return a[target];
}

/* k-th largest of a small array by counting: O(n^2) compares but branch-free and vectorised. */
VECTOR_CLONES
static uint32_t kth_largest_small(const uint32_t *restrict a, int64_t n, int64_t k) {
    uint32_t best = 0xFFFFFFFFu;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x = a[i], greater = 0;
        for (int64_t j = 0; j < n; j++) greater += a[j] > x;
        if ((int64_t)greater < k && x < best) best = x;
    }
    return best;
}

/* Max key of every `seg`-wide segment of n keys (n % seg == 0). */
VECTOR_CLONES
static void segment_maxima(const uint32_t *restrict src, int64_t n, int64_t seg, uint32_t *restrict out) {
    if (seg == 16) { /* the common case, a constant trip count the compiler unrolls */
        for (int64_t s = 0; s < n / 16; s++) {
            uint32_t m = 0;
            for (int b = 0; b < 16; b++) {
                uint32_t v = magnitude_key(src[s * 16 + b]);
                m = v > m ? v : m;
            }
            out[s] = m;
        }
        return;
    }
    for (int64_t s = 0; s < n / seg; s++) {
        uint32_t m = 0;
        for (int64_t b = 0; b < seg; b++) {
            uint32_t v = magnitude_key(src[s * seg + b]);
            m = v > m ? v : m;
        }
        out[s] = m;
    }
}

int select_scratch_init(select_scratch *ws, int64_t h, int64_t w, int64_t cols) {
    const int64_t seg = (w % 16 == 0) ? 16 : w;
    ws->segmax = malloc(sizeof(uint32_t) * (size_t)(h * (cols / seg) + h));
    ws->cand = malloc(sizeof(uint64_t) * (size_t)(2 * h * w));
    ws->row_of = row_table(h, w);
    ws->rmax = ws->segmax ? ws->segmax + h * (cols / seg) : NULL;
    return ws->segmax && ws->cand && ws->row_of ? 0 : -1;
}

void select_scratch_free(select_scratch *ws) {
    free(ws->segmax);
    free(ws->cand);
    free(ws->row_of);
}

/*
 * For every chunk of one band (h rows of `cols` coefficients): the k largest |v|, ties towards
 * the lower index, indices ascending, written from `out_idx`/`out_val` on (k per chunk). A chunk's
 * k-th largest row maximum `thr` (its k-th largest segment maximum when k >= h) is a lower bound
 * of its k-th largest |v| (k rows, or segments, each hold a value >= thr), so every member of the
 * top-k is >= thr; only segments whose maximum reaches thr are scanned. Candidates carry the key (|v| bits << shift) | (cn - 1 - index), unique per chunk,
 * so the k-th largest key is exact.
 */
void select_band(const float *coef, int64_t cols, int64_t h, int64_t w, int64_t k, select_scratch *ws,
                        int64_t *out_idx, float *out_val) {
    const int64_t grid_c = cols / w, cn = h * w;
    const int64_t seg = (w % 16 == 0) ? 16 : w, segs_row = w / seg, segs_line = cols / seg;
    int shift = 1;
    while (((int64_t)1 << shift) < cn) shift++;
    const uint64_t low = ((uint64_t)1 << shift) - 1;
    const uint32_t *band = (const uint32_t *)coef;
    uint32_t *segmax = ws->segmax, *rmax = ws->rmax;
    uint64_t *cand = ws->cand;
    segment_maxima(band, h * cols, seg, segmax);
    for (int64_t c = 0; c < grid_c; c++) {
        for (int64_t a = 0; a < h; a++) {
            const uint32_t *sm = segmax + a * segs_line + c * segs_row;
            uint32_t m = 0;
            for (int64_t s = 0; s < segs_row; s++) m = sm[s] > m ? sm[s] : m;
            rmax[a] = m;
        }
        uint32_t thr = 0;
        if (h > k) {
            thr = kth_largest_small(rmax, h, k);
        } else if (h * segs_row > k) {
            /* k >= h rows: no k-th row maximum, but the k-th largest segment maximum bounds the
             * same way (k segments each hold a value >= it); without it every value of the chunk
             * would be a candidate (measured: top-64 of 64 x 64 chunks ran 6x slower than top-32) */
            int64_t ns = 0;
            for (int64_t a = 0; a < h; a++) {
                const uint32_t *sm = segmax + a * segs_line + c * segs_row;
                for (int64_t s = 0; s < segs_row; s++) cand[ns++] = sm[s];
            }
            thr = (uint32_t)kth_largest(cand, ns, k);
        }
        int64_t nc = 0;
        for (int64_t a = 0; a < h; a++) {
            if (rmax[a] < thr) continue;
            const uint32_t *sm = segmax + a * segs_line + c * segs_row;
            for (int64_t s = 0; s < segs_row; s++) {
                if (sm[s] < thr) continue;
                const uint32_t *values = band + a * cols + c * w + s * seg;
                const uint64_t origin = low - (uint64_t)(a * w + s * seg);
                for (int64_t b = 0; b < seg; b++) {
                    uint32_t key = magnitude_key(values[b]);
                    if (key >= thr) cand[nc++] = ((uint64_t)key << shift) | (origin - (uint64_t)b);
                }
            }
        }
        uint64_t cut = 0; /* candidates arrive in ascending index order: keep those >= cut */
        if (nc > k) {
            memcpy(cand + nc, cand, sizeof(uint64_t) * (size_t)nc);
            cut = kth_largest(cand + nc, nc, k);
        }
        const float *origin_value = coef + c * w;
        int64_t j = 0;
        for (int64_t m = 0; m < nc && j < k; m++) {
            if (cand[m] < cut) continue;
            int64_t index = (int64_t)(low - (cand[m] & low)), i = ws->row_of[index];
            out_idx[c * k + j] = index;
            out_val[c * k + j] = origin_value[i * cols + (index - i * w)];
            j++;
        }
    }
}

/* Top-k of every chunk of the first `bands` chunk rows of a padded coefficient matrix. */
int select_bands(const float *coef, int64_t cols, int64_t h, int64_t w, int64_t k, int64_t bands,
                        int64_t *out_idx, float *out_val, int threads) {
    const int64_t grid_c = cols / w;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
    select_scratch ws;
    failed = select_scratch_init(&ws, h, w, cols) != 0;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < bands; r++) {
        if (failed) continue;
        select_band(coef + r * h * cols, cols, h, w, k, &ws, out_idx + r * grid_c * k, out_val + r * grid_c * k);
    }
    select_scratch_free(&ws);
    }
    return failed ? -1 : 0;
}
