/*
 * CPU kernels for DeMo compression: exact per-chunk top-k (alone, or fused with a factored
 * forward DCT so the coefficients never leave cache), sparse inverse DCT, the fixed-point
 * accumulation of many peers' coefficients, and the wire's Rice-coded indices and 2-bit value codes
 * read in one pass each.
 *
 * Optional: `templar.compress.native` falls back to the torch implementations when this module
 * was not built (no C compiler at install time) and on GPUs. Both paths return identical
 * aggregation accumulators and, from the same coefficients, identical selections; tests compare
 * them. The fused forward DCT rounds differently from torch's GEMMs (float32 sums in another
 * order), which may swap a near-tied k-th and (k+1)-th coefficient: compression is local to one
 * miner, so nothing downstream depends on those last bits.
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

#include "kernels/kernels.h"

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

static PyObject *py_compress(PyObject *self, PyObject *args) {
    Py_ssize_t src, rows, cols, h, w, fh, fw, k, out_idx, out_val;
    int threads, status;
    if (!PyArg_ParseTuple(args, "nnnnnnnnnni", &src, &rows, &cols, &h, &w, &fh, &fw, &k, &out_idx, &out_val, &threads))
        return NULL;
    Py_BEGIN_ALLOW_THREADS status = compress_chunks((const float *)src, rows, cols, h, w, (const float *)fh,
                                                    (const float *)fw, k, (int64_t *)out_idx, (float *)out_val,
                                                    threads);
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

static PyObject *py_rice_indices(PyObject *self, PyObject *args) {
    Py_ssize_t lo, lo_len, hi, hi_len, n_chunks, k, chunk_numel, out, gaps;
    int b, status;
    if (!PyArg_ParseTuple(args, "nnnninnnnn", &lo, &lo_len, &hi, &hi_len, &b, &n_chunks, &k, &chunk_numel, &out,
                          &gaps))
        return NULL;
    Py_BEGIN_ALLOW_THREADS status = rice_decode_indices((const uint8_t *)lo, lo_len, (const uint8_t *)hi, hi_len, b,
                                                        n_chunks, k, chunk_numel, (int64_t *)out, (int64_t *)gaps);
    Py_END_ALLOW_THREADS return PyBool_FromLong(status == 0);
}

static PyObject *py_q2_levels(PyObject *self, PyObject *args) {
    Py_ssize_t q, q_len, n_chunks, k, levels, signal;
    int status;
    if (!PyArg_ParseTuple(args, "nnnnnn", &q, &q_len, &n_chunks, &k, &levels, &signal)) return NULL;
    Py_BEGIN_ALLOW_THREADS status = q2_decode_levels((const uint8_t *)q, q_len, n_chunks, k, (int8_t *)levels,
                                                     (uint8_t *)signal);
    Py_END_ALLOW_THREADS return PyBool_FromLong(status == 0);
}

static PyMethodDef methods[] = {
    {"select", py_select, METH_VARARGS, "Exact per-chunk top-k of a padded coefficient matrix."},
    {"compress", py_compress, METH_VARARGS, "Chunked forward DCT and per-chunk top-k, fused."},
    {"decode", py_decode, METH_VARARGS, "Sparse inverse DCT of k coefficients per chunk."},
    {"accumulate", py_accumulate, METH_VARARGS, "Fixed-point sum of peers' coefficients."},
    {"rice_indices", py_rice_indices, METH_VARARGS, "A payload's Rice-coded chunk indices, well-formed or refused."},
    {"q2_levels", py_q2_levels, METH_VARARGS, "rice-q2's 2-bit value codes as levels, well-formed or refused."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "DeMo compression kernels", -1, methods,
                                     NULL, NULL, NULL, NULL};

/* Bumped whenever a signature above changes, so a stale build is ignored instead of miscalled. */
#define TEMPLAR_NATIVE_ABI 3

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
