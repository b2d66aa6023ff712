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
/* AVX-512 and AVX2 copies, one chosen at load time by what the CPU has (no -march=native: a cached
 * library may be read by another machine sharing the home directory). On a 2-core Xeon the
 * AVX-512 copy took 0.27 ns an entry for all five statistics against 0.45 for AVX2's. */
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

#define EXPONENTS 256
/* Independent partial sums, one per lane: a vector loop with a single accumulator waits on each
 * add before the next (4 cycles); 16 lanes keep two AVX-512 (four AVX2) accumulators in flight. */
#define LANES 16
/* Entries per block whose counts (non-zero entries, exponents) are kept in 32-bit integers,
 * cheaper to add in vectors than 64-bit ones, and added to the totals after each block: a count
 * never reaches 2^32. */
#define BLOCK (1 << 24)

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

static inline uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Each kernel is written once for both dtypes: TYPE the entries, BITS their unsigned integer of
 * the same size, SIGN its sign bit, FROM_BITS the value of some bits. */

/* The five statistics of x[0..n), in r. The lanes' sums are added in a fixed order, so a tensor's
 * statistics do not depend on which thread or share reads it. */
#define ALL(name, TYPE, BITS, SIGN, FROM_BITS)                                                     \
    CLONES static void name(const void *p, int64_t n, double *r) {                                 \
        const TYPE *x = p;                                                                         \
        const BITS *bits = p;                                                                      \
        double sq[LANES] = {0}, l1[LANES] = {0}, s[LANES] = {0};                                   \
        BITS top[LANES] = {0};                                                                     \
        int64_t nz = 0, i = 0;                                                                     \
        for (int64_t block = 0; block < n; block += BLOCK) {                                       \
            int64_t stop = block + BLOCK < n ? block + BLOCK : n;                                  \
            uint32_t count[LANES] = {0};                                                           \
            for (; i + LANES <= stop; i += LANES) {                                                \
                _Pragma("omp simd") for (int j = 0; j < LANES; j++) {                              \
                    double v = (double)x[i + j];                                                   \
                    BITS a = bits[i + j] & ~(BITS)SIGN;                                            \
                    sq[j] += v * v, l1[j] += fabs(v), s[j] += v;                                   \
                    top[j] = a > top[j] ? a : top[j];                                              \
                    count[j] += a != 0;                                                            \
                }                                                                                  \
            }                                                                                      \
            for (int j = 0; j < LANES; j++) nz += count[j];                                        \
        }                                                                                          \
        for (int j = 0; i < n; i++, j++) { /* the last n % LANES entries, one to a lane */         \
            double v = (double)x[i];                                                               \
            BITS a = bits[i] & ~(BITS)SIGN;                                                        \
            sq[j] += v * v, l1[j] += fabs(v), s[j] += v, top[j] = a > top[j] ? a : top[j];         \
            nz += a != 0;                                                                          \
        }                                                                                          \
        double tsq = 0, tl1 = 0, ts = 0;                                                           \
        BITS ttop = 0;                                                                             \
        for (int j = 0; j < LANES; j++) {                                                          \
            tsq += sq[j], tl1 += l1[j], ts += s[j];                                                \
            ttop = top[j] > ttop ? top[j] : ttop;                                                  \
        }                                                                                          \
        r[0] = sqrt(tsq), r[1] = tl1, r[2] = (double)FROM_BITS(ttop), r[3] = (double)nz, r[4] = ts; \
    }

/* The sum of squares alone (a weight's norm). */
#define SUMSQ(name, TYPE)                                                                          \
    CLONES static double name(const void *p, int64_t n) {                                          \
        const TYPE *x = p;                                                                         \
        double sq[LANES] = {0}, total = 0;                                                         \
        int64_t i = 0;                                                                             \
        for (; i + LANES <= n; i += LANES) {                                                       \
            _Pragma("omp simd") for (int j = 0; j < LANES; j++) {                                  \
                double v = (double)x[i + j];                                                       \
                sq[j] += v * v;                                                                    \
            }                                                                                      \
        }                                                                                          \
        for (int j = 0; i < n; i++, j++) sq[j] += (double)x[i] * (double)x[i];                     \
        for (int j = 0; j < LANES; j++) total += sq[j];                                            \
        return total;                                                                              \
    }

/* The counts of the float32 biased exponents of x[0..n) (of the float32 each entry rounds to),
 * added into counts[256]. Four tables, so that consecutive entries of one exponent (most of them)
 * do not each wait on the last one's store; summed at the end. */
#define EXPONENT_COUNTS(name, TYPE)                                                                \
    static void name(const void *p, int64_t n, int64_t *counts) {                                  \
        const TYPE *x = p;                                                                         \
        uint32_t tables[4][EXPONENTS];                                                             \
        memset(tables, 0, sizeof tables);                                                          \
        for (int64_t block = 0; block < n; block += BLOCK) { /* a table counts < 2^32 */           \
            int64_t stop = block + BLOCK < n ? block + BLOCK : n, i = block;                       \
            for (; i + 4 <= stop; i += 4)                                                          \
                for (int j = 0; j < 4; j++) tables[j][(float_bits((float)x[i + j]) >> 23) & 255]++; \
            for (; i < stop; i++) tables[0][(float_bits((float)x[i]) >> 23) & 255]++;              \
            for (int e = 0; e < EXPONENTS; e++) {                                                  \
                counts[e] += (int64_t)tables[0][e] + tables[1][e] + tables[2][e] + tables[3][e];    \
                tables[0][e] = tables[1][e] = tables[2][e] = tables[3][e] = 0;                     \
            }                                                                                      \
        }                                                                                          \
    }

ALL(f32_all, float, uint32_t, 0x80000000u, bits_float)
ALL(f64_all, double, uint64_t, 0x8000000000000000ull, bits_double)
SUMSQ(f32_sumsq, float)
SUMSQ(f64_sumsq, double)
EXPONENT_COUNTS(f32_exponents, float)
EXPONENT_COUNTS(f64_exponents, double)

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

/* g.g, g.a and a.a of two tensors of n entries, in out[0..2]: a backward's increment g and the
 * gradient a it is about to be added to (the noise probe's hook). Their sum's squared norm is
 * a.a + 2 g.a + g.g, with no second pass over it; the pass leaves both in cache for the add. */
#define DOTS(name, type)                                                                          \
    CLONES void name(const void *pg, const void *pa, int64_t n, double *out) {                    \
        const type *g = pg, *a = pa;                                                              \
        double gg[LANES] = {0}, ga[LANES] = {0}, aa[LANES] = {0};                                 \
        int64_t i = 0;                                                                            \
        for (; i + LANES <= n; i += LANES) {                                                      \
            _Pragma("omp simd") for (int j = 0; j < LANES; j++) {                                 \
                double x = (double)g[i + j], y = (double)a[i + j];                                \
                gg[j] += x * x, ga[j] += x * y, aa[j] += y * y;                                   \
            }                                                                                     \
        }                                                                                         \
        for (int j = 0; i < n; i++, j++) {                                                        \
            double x = (double)g[i], y = (double)a[i];                                            \
            gg[j] += x * x, ga[j] += x * y, aa[j] += y * y;                                       \
        }                                                                                         \
        out[0] = out[1] = out[2] = 0;                                                             \
        for (int j = 0; j < LANES; j++) out[0] += gg[j], out[1] += ga[j], out[2] += aa[j];        \
    }

DOTS(gw_dots_f32, float)
DOTS(gw_dots_f64, double)
