/* Every statistic of many CPU tensors in one pass over each (gradwidget/collect/_cpu_fused.py
 * compiles this once per machine and calls it through ctypes).
 *
 * PyTorch's eager CPU kernels read a gradient once per statistic (|g|, its L2 and L1 norms, its
 * largest and smallest bits, the sum, again for the weight norm): six passes and a dozen dispatches a
 * tensor. Here one loop keeps all five in registers. Sums are accumulated in double (no float32
 * overflow or underflow of a norm, whatever the entries); max |x| and the non-zero count are taken
 * over |x|'s bits as integers, ordered as the values are (a NaN's bits are above Inf's, so a NaN is
 * the largest, as amax has it; -0.0 is zero).
 *
 * rows is (5, n) row-major: L2 norm, L1 norm, max |x|, non-zero count, sum. Tensors 0..n_full-1
 * get all five, the rest (weights) only the L2 norm; the first n_hist also get the counts of their
 * float32 biased exponents (0..255) in counts, (n_hist, 256).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
/* an AVX2 copy chosen at load time where the CPU has it (no -march=native: a cached library may be
 * read by another machine sharing the home directory) */
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

#define EXPONENTS 256

static inline float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline double bits_double(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

CLONES static void f32_all(const void *p, int64_t n, double *r) {
    const float *x = p;
    const uint32_t *bits = p;
    double sq = 0, l1 = 0, s = 0;
    uint32_t top = 0;
    int64_t nz = 0;
#pragma omp simd reduction(+ : sq, l1, s, nz) reduction(max : top)
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i];
        uint32_t a = bits[i] & 0x7fffffffu;
        sq += v * v;
        l1 += fabs(v);
        s += v;
        top = a > top ? a : top;
        nz += a != 0;
    }
    r[0] = sqrt(sq), r[1] = l1, r[2] = (double)bits_float(top), r[3] = (double)nz, r[4] = s;
}

CLONES static double f32_sumsq(const void *p, int64_t n) {
    const float *x = p;
    double sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i];
        sq += v * v;
    }
    return sq;
}

static void f32_exponents(const void *p, int64_t n, int64_t *counts) {
    const uint32_t *bits = p;
    for (int64_t i = 0; i < n; i++) counts[(bits[i] >> 23) & 255]++;
}

CLONES static void f64_all(const void *p, int64_t n, double *r) {
    const double *x = p;
    const uint64_t *bits = p;
    double sq = 0, l1 = 0, s = 0;
    uint64_t top = 0;
    int64_t nz = 0;
#pragma omp simd reduction(+ : sq, l1, s, nz) reduction(max : top)
    for (int64_t i = 0; i < n; i++) {
        double v = x[i];
        uint64_t a = bits[i] & 0x7fffffffffffffffull;
        sq += v * v;
        l1 += fabs(v);
        s += v;
        top = a > top ? a : top;
        nz += a != 0;
    }
    r[0] = sqrt(sq), r[1] = l1, r[2] = bits_double(top), r[3] = (double)nz, r[4] = s;
}

CLONES static double f64_sumsq(const void *p, int64_t n) {
    const double *x = p;
    double sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < n; i++) sq += x[i] * x[i];
    return sq;
}

static void f64_exponents(const void *p, int64_t n, int64_t *counts) {
    const double *x = p;
    for (int64_t i = 0; i < n; i++) {  /* the exponent of the float32 the entry rounds to */
        float f = (float)x[i];
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        counts[(u >> 23) & 255]++;
    }
}

/* The kernels of one dtype: all five statistics, the sum of squares alone, the exponent counts. */
struct kernels {
    void (*all)(const void *, int64_t, double *);
    double (*sumsq)(const void *, int64_t);
    void (*exponents)(const void *, int64_t, int64_t *);
};

static void rows_of(const struct kernels *k, int64_t n, const int64_t *ptrs, const int64_t *numels, int64_t n_full,
                    int64_t n_hist, double *rows, int64_t *counts) {
    for (int64_t t = 0; t < n; t++) {
        const void *x = (const void *)(intptr_t)ptrs[t];
        double r[5] = {0, 0, 0, 0, 0};
        if (t < n_full)
            k->all(x, numels[t], r);
        else
            r[0] = sqrt(k->sumsq(x, numels[t]));
        for (int j = 0; j < 5; j++) rows[j * n + t] = r[j];
        if (t < n_hist) {
            memset(counts + t * EXPONENTS, 0, EXPONENTS * sizeof(int64_t));
            k->exponents(x, numels[t], counts + t * EXPONENTS);
        }
    }
}

static const struct kernels F32 = {f32_all, f32_sumsq, f32_exponents};
static const struct kernels F64 = {f64_all, f64_sumsq, f64_exponents};

void gw_rows_f32(int64_t n, const int64_t *ptrs, const int64_t *numels, int64_t n_full, int64_t n_hist,
                 double *rows, int64_t *counts) {
    rows_of(&F32, n, ptrs, numels, n_full, n_hist, rows, counts);
}

void gw_rows_f64(int64_t n, const int64_t *ptrs, const int64_t *numels, int64_t n_full, int64_t n_hist,
                 double *rows, int64_t *counts) {
    rows_of(&F64, n, ptrs, numels, n_full, n_hist, rows, counts);
}
