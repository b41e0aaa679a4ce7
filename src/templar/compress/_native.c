/*
 * CPU kernels for DeMo compression: exact per-chunk top-k, sparse inverse DCT, and the
 * fixed-point accumulation of many peers' coefficients.
 *
 * Optional: `templar.compress.native` falls back to the torch implementations when this module
 * was not built (no C compiler at install time) and on GPUs. Both paths return identical
 * selections and identical aggregation accumulators; tests compare them.
 *
 * The Python wrapper validates every shape, dtype, contiguity and device before calling in, and
 * passes raw pointers. Indices that reach `decode` and `accumulate` come from payloads that the
 * wire format has already range-checked; the kernels still skip out-of-range indices rather
 * than write out of bounds. Calls release the GIL and split the chunk bands over OpenMP threads:
 * loaded after torch, the extension shares torch's libgomp (same soname) and so its thread pool,
 * instead of competing with torch's spinning workers. Bands are independent, so results do not
 * depend on the thread count.
 *
 * Matrix layout (see dct.py): a parameter is a padded [rows, cols] float32 matrix cut into
 * h x w chunks; chunk (r, c) covers rows r*h.. and columns c*w..; a within-chunk index is i*w + j.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define HAVE_AVX512_KERNEL 1
#else
#define VECTOR_CLONES
#endif

/* |v| as the sign-cleared IEEE bit pattern: for non-negative floats it orders like the value,
 * and NaN ranks above +inf, exactly like the torch path's int32 keys. */
static inline uint32_t magnitude_key(uint32_t bits) { return bits & 0x7FFFFFFFu; }

/* Row of every within-chunk index (q / w), so hot loops need no integer division. */
static int32_t *row_table(int64_t h, int64_t w) {
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)(h * w));
    if (rows)
        for (int64_t q = 0; q < h * w; q++) rows[q] = (int32_t)(q / w);
    return rows;
}

/* ------------------------------------------------------------------------------------------ */
/* top-k                                                                                       */

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

/*
 * For every chunk of the first `bands` chunk rows: the k largest |v|, ties towards the lower
 * index, indices ascending. A chunk's k-th largest row maximum `thr` is a lower bound of its k-th
 * largest |v| (k rows each hold a value >= thr), so every member of the top-k is >= thr; only
 * segments whose maximum reaches thr are scanned. Candidates carry the key
 * (|v| bits << shift) | (cn - 1 - index), unique per chunk, so the k-th largest key is exact.
 */
static int select_bands(const float *coef, int64_t cols, int64_t h, int64_t w, int64_t k, int64_t bands,
                        int64_t *out_idx, float *out_val, int threads) {
    const int64_t grid_c = cols / w, cn = h * w;
    const int64_t seg = (w % 16 == 0) ? 16 : w, segs_row = w / seg, segs_line = cols / seg;
    int shift = 1;
    while (((int64_t)1 << shift) < cn) shift++;
    const uint64_t low = ((uint64_t)1 << shift) - 1;
    const uint32_t *keys = (const uint32_t *)coef;
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
    uint32_t *segmax = malloc(sizeof(uint32_t) * (size_t)(h * segs_line + h));
    uint64_t *cand = malloc(sizeof(uint64_t) * (size_t)(2 * cn));
    int32_t *row_of = row_table(h, w);
    failed = !segmax || !cand || !row_of;
    uint32_t *rmax = failed ? NULL : segmax + h * segs_line;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < bands; r++) {
        if (failed) continue;
        const uint32_t *band = keys + r * h * cols;
        segment_maxima(band, h * cols, seg, segmax);
        for (int64_t c = 0; c < grid_c; c++) {
            for (int64_t a = 0; a < h; a++) {
                const uint32_t *sm = segmax + a * segs_line + c * segs_row;
                uint32_t m = 0;
                for (int64_t s = 0; s < segs_row; s++) m = sm[s] > m ? sm[s] : m;
                rmax[a] = m;
            }
            const uint32_t thr = h > k ? kth_largest_small(rmax, h, k) : 0;
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
            const int64_t chunk = r * grid_c + c;
            const float *origin_value = coef + r * h * cols + c * w;
            int64_t j = 0;
            for (int64_t m = 0; m < nc && j < k; m++) {
                if (cand[m] < cut) continue;
                int64_t index = (int64_t)(low - (cand[m] & low)), i = row_of[index];
                out_idx[chunk * k + j] = index;
                out_val[chunk * k + j] = origin_value[i * cols + (index - i * w)];
                j++;
            }
        }
    }
    free(segmax);
    free(cand);
    free(row_of);
    }
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* sparse inverse DCT                                                                          */

typedef float f32x8 __attribute__((vector_size(32)));

static inline f32x8 load8(const float *p) {
    f32x8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

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
static int cpu_has_avx512; /* set once when the module loads */
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
static int decode_bands(const int64_t *idx, const float *val, int64_t k, const float *dh, const float *dw, int64_t h,
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

/* ------------------------------------------------------------------------------------------ */
/* aggregation                                                                                 */

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
static int accumulate_bands(int64_t peers, const int64_t *idx_ptrs, const int64_t *val_ptrs, const double *scales,
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

/* ------------------------------------------------------------------------------------------ */
/* Python bindings: pointers and sizes as integers, validated by templar.compress.native.     */

static PyObject *done(int status) {
    if (status != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_select(PyObject *self, PyObject *args) {
    Py_ssize_t coef, cols, h, w, k, bands, out_idx, out_val;
    int threads, status;
    if (!PyArg_ParseTuple(args, "nnnnnnnni", &coef, &cols, &h, &w, &k, &bands, &out_idx, &out_val, &threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS status = select_bands((const float *)coef, cols, h, w, k, bands, (int64_t *)out_idx,
                                                 (float *)out_val, threads);
    Py_END_ALLOW_THREADS return done(status);
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_ssize_t idx, val, k, dh, dw, h, w, rows, cols, out, stride;
    int subtract, threads, status;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnnnpi", &idx, &val, &k, &dh, &dw, &h, &w, &rows, &cols, &out, &stride,
                          &subtract, &threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS status = decode_bands((const int64_t *)idx, (const float *)val, k, (const float *)dh,
                                                 (const float *)dw, h, w, rows, cols, (float *)out, stride, subtract,
                                                 threads);
    Py_END_ALLOW_THREADS return done(status);
}

static PyObject *py_accumulate(PyObject *self, PyObject *args) {
    Py_ssize_t peers, idx_ptrs, val_ptrs, scales, k, h, w, cols, bands, coef;
    int threads, status;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnni", &peers, &idx_ptrs, &val_ptrs, &scales, &k, &h, &w, &cols, &bands, &coef,
                          &threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS status = accumulate_bands(peers, (const int64_t *)idx_ptrs, (const int64_t *)val_ptrs,
                                                     (const double *)scales, k, h, w, cols, bands, (float *)coef,
                                                     threads);
    Py_END_ALLOW_THREADS return done(status);
}

static PyMethodDef methods[] = {
    {"select", py_select, METH_VARARGS, "Exact per-chunk top-k of a padded coefficient matrix."},
    {"decode", py_decode, METH_VARARGS, "Sparse inverse DCT of k coefficients per chunk."},
    {"accumulate", py_accumulate, METH_VARARGS, "Fixed-point sum of peers' coefficients."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "DeMo compression kernels", -1, methods,
                                     NULL, NULL, NULL, NULL};

/* Bumped whenever a signature above changes, so a stale build is ignored instead of miscalled. */
#define TEMPLAR_NATIVE_ABI 1

PyMODINIT_FUNC PyInit__native(void) {
#ifdef HAVE_AVX512_KERNEL
    cpu_has_avx512 = __builtin_cpu_supports("avx512f");
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "ABI", TEMPLAR_NATIVE_ABI) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
