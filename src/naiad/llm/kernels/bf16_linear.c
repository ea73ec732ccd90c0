/*
 * bf16 linear layers for the CPU: y[r, n] = sum_k x[r, k] * w[n, k] + bias[n], x, w, bias and y
 * in bfloat16, summed in float32 and rounded once (as oneDNN's bf16 linear does).
 *
 * Why not oneDNN: a decode step multiplies one to a few rows by each weight matrix, and there
 * oneDNN's prepacked bf16 GEMV read the weights at 16-22 GB/s on a machine that reads 31 GB/s
 * (torch.sum); this kernel reads them at 25-36 GB/s (1-4 rows, 0.50-0.95x oneDNN's time), and is
 * level with it from 16 to 512 rows (0.85-1.26x, ~450 GFLOP/s from 128 rows: this machine's peak)
 * on the 123M Llama's shapes, measured side by side (docs/benchmarks.md).
 *
 * Weight layout (kernels.bf16_panels, chosen at load so that the inner loop streams through memory,
 * as q8_linear.c's): panels of 16 output channels, `[panels, in_pad / 2, 16, 2]`, i.e. for each pair
 * of inputs, the 16 channels' two weights. One 64-byte load then feeds AVX512-BF16's `vdpbf16ps`,
 * which multiplies 16 pairs by one broadcast pair of x and adds each pair's sum into one of 16
 * float32 lanes: one lane per output channel, no horizontal sums. `in_pad` is `in` rounded up to
 * even (a zero weight fills it).
 *
 * Rows are taken four at a time against two panels (eight sums in registers, each weight load used
 * four times, each broadcast of x twice). One row alone is taken against four panels: four streams
 * of weights (two panels were +9 % a step at one stream in the engine against one panel in two
 * chains, and four a further +3 %; docs/benchmarks.md). An odd last panel runs alone, its sums in
 * two chains (even and odd pairs).
 * Pairs of panels are split over the caller's thread count, run on torch's OpenMP team
 * (thread_pool.c). Each output is computed by one thread in a fixed order, and panels pair the same
 * way whatever the split: the thread count changes nothing.
 *
 * Needs AVX512-BF16, checked at run time (bf16_linear_supported); without it the Python side keeps
 * oneDNN's linear.
 */
#include "common.h"
#include "thread_pool.h"

#include <stdlib.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_BF16_BUILD 1
#else
#define HAVE_BF16_BUILD 0
#endif

#define PANEL 16
#define ROW_TILE 4
#define MAX_THREADS 64

/* 1 when this build has the AVX512-BF16 path and the CPU runs it. */
int bf16_linear_supported(void) {
#if HAVE_BF16_BUILD && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

#if HAVE_BF16_BUILD
typedef struct {
    const uint16_t *x;    /* [rows, in_pad] */
    const uint16_t *w;    /* [panels, in_pad / 2, 16, 2] */
    const uint16_t *bias; /* [out] or NULL */
    uint16_t *y;          /* [rows, out] */
    int64_t rows, pairs, out, first, last; /* pairs = in_pad / 2; panels [first, last) */
} job_t;

/* Rows [r0, r0 + nr) of panel p's 16 outputs, from the float32 sums `sum`. */
static inline __attribute__((always_inline)) void store(const job_t *job, int64_t p, int64_t r, __m512 sum) {
    const int64_t n0 = p * PANEL;
    const int valid = job->out - n0 < PANEL ? (int)(job->out - n0) : PANEL;
    const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    if (job->bias) {
        const __m256i b = _mm256_maskz_loadu_epi16(mask, job->bias + n0);
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
    /* vcvtneps2bf16: round to nearest even, as torch rounds */
    _mm256_mask_storeu_epi16(job->y + r * job->out + n0, mask, (__m256i)_mm512_cvtneps_pbh(sum));
}

/* Rows [r0, r0 + nr) against panels p and p + 1; nr is a constant after inlining. */
static inline __attribute__((always_inline)) void two_panels(const job_t *job, int64_t p, int64_t r0, const int nr) {
    const uint16_t *w0 = job->w + p * job->pairs * PANEL * 2, *w1 = w0 + job->pairs * PANEL * 2;
    const int32_t *x[ROW_TILE]; /* a pair of bf16 inputs read as one 32-bit lane */
    __m512 a[ROW_TILE], b[ROW_TILE];
    for (int r = 0; r < nr; r++) {
        x[r] = (const int32_t *)(job->x + (r0 + r) * job->pairs * 2);
        a[r] = _mm512_setzero_ps(), b[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < job->pairs; k++) {
        const __m512bh wa = (__m512bh)_mm512_loadu_si512(w0 + k * PANEL * 2);
        const __m512bh wb = (__m512bh)_mm512_loadu_si512(w1 + k * PANEL * 2);
        for (int r = 0; r < nr; r++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[r][k]);
            a[r] = _mm512_dpbf16_ps(a[r], xv, wa);
            b[r] = _mm512_dpbf16_ps(b[r], xv, wb);
        }
    }
    for (int r = 0; r < nr; r++) store(job, p, r0 + r, a[r]), store(job, p + 1, r0 + r, b[r]);
}

/* Rows [r0, r0 + nr) against panel p alone, in two chains of sums (even and odd pairs). */
static inline __attribute__((always_inline)) void one_panel(const job_t *job, int64_t p, int64_t r0, const int nr) {
    const uint16_t *w = job->w + p * job->pairs * PANEL * 2;
    const int32_t *x[ROW_TILE];
    __m512 a[ROW_TILE], b[ROW_TILE];
    for (int r = 0; r < nr; r++) {
        x[r] = (const int32_t *)(job->x + (r0 + r) * job->pairs * 2);
        a[r] = _mm512_setzero_ps(), b[r] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 1 < job->pairs; k += 2) {
        const __m512bh wa = (__m512bh)_mm512_loadu_si512(w + k * PANEL * 2);
        const __m512bh wb = (__m512bh)_mm512_loadu_si512(w + (k + 1) * PANEL * 2);
        for (int r = 0; r < nr; r++) {
            a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_set1_epi32(x[r][k]), wa);
            b[r] = _mm512_dpbf16_ps(b[r], (__m512bh)_mm512_set1_epi32(x[r][k + 1]), wb);
        }
    }
    if (k < job->pairs) {
        const __m512bh wa = (__m512bh)_mm512_loadu_si512(w + k * PANEL * 2);
        for (int r = 0; r < nr; r++) a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)_mm512_set1_epi32(x[r][k]), wa);
    }
    for (int r = 0; r < nr; r++) store(job, p, r0 + r, _mm512_add_ps(a[r], b[r]));
}

/* One row against panels p to p + 3: four streams of weights in flight instead of two, so that a
 * core keeps more reads outstanding (a decode step's linears at one row, same process, alternating:
 * faster in 29 of 38 pairs, +3 % median; docs/benchmarks.md). Each output's sum is still one chain
 * over the pairs in order, so the bits are two_panels'. */
static inline __attribute__((always_inline)) void four_panels_one_row(const job_t *job, int64_t p) {
    const int64_t stride = job->pairs * PANEL * 2;
    const uint16_t *w0 = job->w + p * stride, *w1 = w0 + stride, *w2 = w1 + stride, *w3 = w2 + stride;
    const int32_t *x = (const int32_t *)job->x;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < job->pairs; k++) {
        const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[k]);
        a0 = _mm512_dpbf16_ps(a0, xv, (__m512bh)_mm512_loadu_si512(w0 + k * PANEL * 2));
        a1 = _mm512_dpbf16_ps(a1, xv, (__m512bh)_mm512_loadu_si512(w1 + k * PANEL * 2));
        a2 = _mm512_dpbf16_ps(a2, xv, (__m512bh)_mm512_loadu_si512(w2 + k * PANEL * 2));
        a3 = _mm512_dpbf16_ps(a3, xv, (__m512bh)_mm512_loadu_si512(w3 + k * PANEL * 2));
    }
    store(job, p, 0, a0), store(job, p + 1, 0, a1), store(job, p + 2, 0, a2), store(job, p + 3, 0, a3);
}

#define BY_ROWS(fn, job, p, r0, nr)                                                                                  \
    switch (nr) {                                                                                                    \
    case 1: fn(job, p, r0, 1); break;                                                                                \
    case 2: fn(job, p, r0, 2); break;                                                                                \
    case 3: fn(job, p, r0, 3); break;                                                                                \
    default: fn(job, p, r0, 4); break;                                                                               \
    }

static void *panels(void *arg) {
    const job_t *job = (const job_t *)arg;
    int64_t p = job->first;
    if (job->rows == 1) /* a decode step of one sequence: reading the weights is all it does */
        for (; p + 3 < job->last; p += 4) four_panels_one_row(job, p);
    for (; p + 1 < job->last; p += 2)
        for (int64_t r0 = 0; r0 < job->rows; r0 += ROW_TILE) {
            const int64_t nr = job->rows - r0 < ROW_TILE ? job->rows - r0 : ROW_TILE;
            BY_ROWS(two_panels, job, p, r0, nr)
        }
    for (; p < job->last; p++) /* an odd last panel */
        for (int64_t r0 = 0; r0 < job->rows; r0 += ROW_TILE) {
            const int64_t nr = job->rows - r0 < ROW_TILE ? job->rows - r0 : ROW_TILE;
            BY_ROWS(one_panel, job, p, r0, nr)
        }
    return NULL;
}
#endif

/* y = x w^T + bias (bias NULL: none) for x [rows, in], w in the panel layout above, y [rows, out];
 * returns 0, -1 when out of memory, -3 where this build or CPU lacks AVX512-BF16. */
int bf16_linear(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t rows, int64_t in,
                int64_t out, int64_t num_threads) {
#if HAVE_BF16_BUILD
    if (!bf16_linear_supported()) return -3;
    const int64_t in_pad = in + (in & 1), panel_count = (out + PANEL - 1) / PANEL;
    uint16_t *padded = NULL;
    if (in_pad != in) { /* an odd width: each row gets the zero its last pair needs */
        padded = calloc((size_t)(rows * in_pad), sizeof(uint16_t));
        if (!padded) return -1;
        for (int64_t r = 0; r < rows; r++) memcpy(padded + r * in_pad, x + r * in, (size_t)in * sizeof(uint16_t));
        x = padded;
    }
    if (num_threads < 1) num_threads = 1;
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    /* whole pairs of panels per thread where there are enough (the two-panel tiles) */
    const int64_t units = (panel_count + 1) / 2;
    if (num_threads > units) num_threads = units;
    job_t jobs[MAX_THREADS];
    for (int64_t t = 0; t < num_threads; t++) {
        const int64_t first = 2 * (units * t / num_threads), last = 2 * (units * (t + 1) / num_threads);
        jobs[t] = (job_t){x, w, bias, y, rows, in_pad / 2, out, first, last < panel_count ? last : panel_count};
    }
    pool_run(panels, jobs, sizeof jobs[0], (int)num_threads);
    free(padded);
    return 0;
#else
    (void)x, (void)w, (void)bias, (void)y, (void)rows, (void)in, (void)out, (void)num_threads;
    return -3;
#endif
}
