/* Shared declarations of the DeMo compression kernels (see ../_native.c for the contract). */
#ifndef TEMPLAR_KERNELS_H
#define TEMPLAR_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* One extension module: nothing here is visible outside it. */
#pragma GCC visibility push(hidden)

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define HAVE_AVX512_KERNEL 1
#else
#define VECTOR_CLONES
#endif

typedef float f32x8 __attribute__((vector_size(32)));

static inline f32x8 load8(const float *p) {
    f32x8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* |v| as the sign-cleared IEEE bit pattern: for non-negative floats it orders like the value,
 * and NaN ranks above +inf, exactly like the torch path's int32 keys. */
static inline uint32_t magnitude_key(uint32_t bits) { return bits & 0x7FFFFFFFu; }

/* Row of every within-chunk index (q / w), so hot loops need no integer division (malloc'ed). */
int32_t *row_table(int64_t h, int64_t w);

/* Per-thread scratch of the top-k search over one band of `cols` columns. */
typedef struct {
    uint32_t *segmax, *rmax;
    uint64_t *cand;
    int32_t *row_of;
} select_scratch;

int select_scratch_init(select_scratch *ws, int64_t h, int64_t w, int64_t cols);
void select_scratch_free(select_scratch *ws);
void select_band(const float *coef, int64_t cols, int64_t h, int64_t w, int64_t k, select_scratch *ws,
    int64_t *out_idx, float *out_val);
int select_bands(const float *coef, int64_t cols, int64_t h, int64_t w, int64_t k, int64_t bands,
    int64_t *out_idx, float *out_val, int threads);
int compress_chunks(const float *src, int64_t rows, int64_t cols, int64_t h, int64_t w, const float *fh,
    const float *fw, int64_t k, int64_t *out_idx, float *out_val, int threads);
int decode_bands(const int64_t *idx, const float *val, int64_t k, const float *dh, const float *dw, int64_t h,
    int64_t w, int64_t rows, int64_t cols, float *out, int64_t out_stride, int subtract,
    int threads);
int accumulate_bands(int64_t peers, const int64_t *idx_ptrs, const int64_t *val_ptrs, const double *scales,
    int64_t k, int64_t h, int64_t w, int64_t cols, int64_t bands, float *coef, int threads);
int rice_decode_indices(const uint8_t *lo, int64_t lo_len, const uint8_t *hi, int64_t hi_len, int b,
    int64_t n_chunks, int64_t k, int64_t chunk_numel, int64_t *out, int64_t *gaps);
int q2_decode_levels(const uint8_t *q, int64_t q_len, int64_t n_chunks, int64_t k, int8_t *levels,
    uint8_t *signal);

#ifdef HAVE_AVX512_KERNEL
extern int cpu_has_avx512; /* set once by the module init */
#endif

#pragma GCC visibility pop
#endif
