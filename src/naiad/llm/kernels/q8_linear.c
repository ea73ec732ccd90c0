/*
 * 8-bit linear layers: y[r, n] = sum_k x[r, k] * w[n, k] + bias[n].
 *
 * The weights are int8 with a float16 scale per block of 32 inputs: quantized at load
 * (`quantization: "int8"`) or read from a GGUF file (Q8_0, Q4_0; Q4_1 adds a float16 minimum per
 * block). Each row of `x` is quantized here, per block of 32 inputs, to 15-bit integers
 * (|v| <= 16383) with a float32 scale. Each block's integer dot products are summed exactly in
 * int32 and then scaled into a float32 sum. Why 15 bits: int8 activations (llama.cpp's Q8_0)
 * flip a 135M model's close greedy choices, because a few channels carry values 10-50x the
 * others and set their blocks' step; 15 bits make the activations' rounding negligible.
 *
 * Outlier columns: a layer may hand up to a few input columns (chosen at load from the inputs'
 * magnitudes, see quantization.py) whose weights stay float16 ([panels, ncols, 16]) and are zero
 * in the int8 blocks; their inputs are taken out of x before it is quantized and multiplied in
 * float. Those columns carry the largest inputs, so their weights' rounding mattered most.
 *
 * Weight layout, chosen at load (see quantization.py's `pack`) so that the inner loop streams
 * through memory: panels of 16 output channels, `[panels, in_pad / 4, 16, 4]`, i.e. for each
 * group of 4 inputs, 4 bytes per channel of the panel. One 64-byte load then feeds AVX512-VNNI's
 * `vpdpbusd`, which multiplies 64 unsigned by 64 signed bytes and adds each group of 4 into one
 * of 16 int32 lanes: one lane per output channel, no horizontal sums. `vpdpbusd` wants one
 * operand unsigned: the weights are stored as w + 128 (uint8), and the 128 * sum(x) that adds
 * is taken off each block's sum. Its other operand is a byte: the 15-bit activations are split
 * as v = 256 * hi + lo (hi in -64..64, lo in -128..127), two `vpdpbusd` per weight load, summed
 * as 256 * hi's + lo's: the same integers as the portable loop's v * (w + 128).
 * `in_pad` is `in` rounded up to 32 (zero weights and zero activations fill it).
 *
 * Scales: float16 `[panels, in_pad / 32, 16]`; with a minimum (GGUF's Q4_1, w = d * q + m with q
 * in 0..15), float16 `[panels, in_pad / 32, 2, 16]`, the 16 d then the 16 m. The weights then
 * hold q - 8 (centred values keep the products' sums small), so w = d * (q - 8) + (m + 8 d),
 * and the second term adds (m + 8 d) * the block's float sum of x. Outlier columns are not used
 * with minimums (a zero weight there would be m, not 0).
 *
 * Without AVX512-VNNI (checked at run time, or turned off by the caller), a portable C loop
 * computes the same integer sums. Output panels are shared by the caller's thread count, run
 * by the kernels' shared pool of threads (thread_pool.c): a decode step makes some hundred of
 * these calls of 10-100 us each, and starting or waking a thread per call costs about as much.
 * Each thread takes its own contiguous run of panels, then the others' last ones (as
 * bf16_linear.c's tiles), so a thread held up by another process costs about a panel. Each output
 * is computed by one thread in a fixed order: neither the thread count nor the sharing changes
 * anything.
 */
#include "common.h"
#include "thread_pool.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(Q8_AVX512_STANDINS) /* tests only: the VNNI path on plain-C stand-ins of its intrinsics */
#include Q8_AVX512_STANDINS
#define HAVE_VNNI_BUILD 1
#elif defined(__AVX512VNNI__) && defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_VNNI_BUILD 1
#else
#define HAVE_VNNI_BUILD 0
#endif

#define QBLOCK 32
#define PANEL 16
#define ROW_TILE 4
#define MAX_THREADS 64
#define QMAX 16383 /* the activations' largest magnitude: 15 bits, so that 256 * hi + lo fits two bytes */
#define MAX_COLUMNS 64

enum { SCALE_BLOCK_F16 = 0, SCALE_BLOCK_F16_MIN = 1 };

/* 1 when this build has the VNNI path and the CPU runs it. */
int q8_has_vnni(void) {
#if defined(Q8_AVX512_STANDINS)
    return 1;
#elif HAVE_VNNI_BUILD && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
#else
    return 0;
#endif
}

typedef struct {
    const int16_t *xq;   /* [rows, in_pad]: the activations, |v| <= QMAX (the portable path) */
    const int8_t *xhi;   /* [rows, in_pad]: v = 256 * hi + lo (the VNNI path) */
    const int8_t *xlo;
    const float *xs;     /* [rows, blocks] */
    const int32_t *xsum; /* [rows, blocks]: 128 * the sum of each block's v */
    const float *xfsum;  /* [rows, blocks]: the sum of each block's x */
    const float *xcol;   /* [rows, ncols]: the outlier columns' inputs */
    const uint8_t *w;
    const _Float16 *scales;
    const _Float16 *wcol; /* [panels, ncols, 16] */
    const float *bias;
    float *y; /* [rows, out] */
    int64_t rows, in_pad, out, ncols;
    tile_run_t *runs; /* the panels, shared by the call's jobs (thread_pool.h) */
    int me, jobs, scale_kind, vnni;
} q8_job_t;

/* One block's weight scales (ws) and, for Q4_1, what each unit of the block's float sum of x adds (wm). */
static void block_scales(const q8_job_t *job, int64_t p, int64_t b, float ws[PANEL], float wm[PANEL]) {
    const int64_t blocks = job->in_pad / QBLOCK;
    if (job->scale_kind == SCALE_BLOCK_F16_MIN) {
        const _Float16 *s = job->scales + (p * blocks + b) * 2 * PANEL;
        for (int c = 0; c < PANEL; c++) ws[c] = (float)s[c], wm[c] = (float)s[PANEL + c] + 8.0f * ws[c];
    } else {
        const _Float16 *s = job->scales + (p * blocks + b) * PANEL;
        for (int c = 0; c < PANEL; c++) ws[c] = (float)s[c], wm[c] = 0.0f;
    }
}

/* Rows [r0, r0 + nr) of one panel, portable: the same integer sums as the VNNI path. */
static void panel_portable(const q8_job_t *job, int64_t p, int64_t r0, int64_t nr) {
    const int64_t blocks = job->in_pad / QBLOCK;
    const uint8_t *wp = job->w + p * job->in_pad * PANEL;
    float facc[ROW_TILE][PANEL] = {{0}};
    for (int64_t b = 0; b < blocks; b++) {
        float ws[PANEL], wm[PANEL];
        block_scales(job, p, b, ws, wm);
        const uint8_t *wb = wp + b * QBLOCK * PANEL;
        for (int64_t r = 0; r < nr; r++) {
            const int16_t *xb = job->xq + (r0 + r) * job->in_pad + b * QBLOCK;
            int32_t acc[PANEL] = {0};
            for (int s = 0; s < QBLOCK / 4; s++)
                for (int c = 0; c < PANEL; c++)
                    for (int j = 0; j < 4; j++) acc[c] += (int32_t)wb[(s * PANEL + c) * 4 + j] * xb[s * 4 + j];
            const int64_t at = (r0 + r) * blocks + b;
            const float xs = job->xs[at];
            for (int c = 0; c < PANEL; c++)
                facc[r][c] += (float)(acc[c] - job->xsum[at]) * (ws[c] * xs) + wm[c] * job->xfsum[at];
        }
    }
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t t = 0; t < job->ncols; t++) {
            const _Float16 *wc = job->wcol + (p * job->ncols + t) * PANEL;
            const float xc = job->xcol[(r0 + r) * job->ncols + t];
            for (int c = 0; c < PANEL; c++) facc[r][c] += (float)wc[c] * xc;
        }
        for (int c = 0; c < PANEL; c++) {
            const int64_t n = p * PANEL + c;
            if (n >= job->out) break;
            job->y[(r0 + r) * job->out + n] = facc[r][c] + (job->bias ? job->bias[n] : 0.0f);
        }
    }
}

#if HAVE_VNNI_BUILD
/* Rows [r0, r0 + nr) of one panel with vpdpbusd; nr is a constant after inlining. */
static inline __attribute__((always_inline)) void panel_vnni_rows(const q8_job_t *job, int64_t p, int64_t r0,
                                                                  const int nr) {
    const int64_t blocks = job->in_pad / QBLOCK;
    const uint8_t *wp = job->w + p * job->in_pad * PANEL;
    __m512 facc[ROW_TILE];
    for (int r = 0; r < nr; r++) facc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *wb = wp + b * QBLOCK * PANEL;
        __m512i hi[ROW_TILE], lo[ROW_TILE];
        for (int r = 0; r < nr; r++) hi[r] = _mm512_setzero_si512(), lo[r] = _mm512_setzero_si512();
        for (int s = 0; s < QBLOCK / 4; s++) {
            const __m512i w = _mm512_loadu_si512((const void *)(wb + s * PANEL * 4));
            for (int r = 0; r < nr; r++) {
                const int64_t at = (r0 + r) * job->in_pad + b * QBLOCK + s * 4;
                int32_t four_hi, four_lo;
                memcpy(&four_hi, job->xhi + at, sizeof four_hi);
                memcpy(&four_lo, job->xlo + at, sizeof four_lo);
                hi[r] = _mm512_dpbusd_epi32(hi[r], w, _mm512_set1_epi32(four_hi));
                lo[r] = _mm512_dpbusd_epi32(lo[r], w, _mm512_set1_epi32(four_lo));
            }
        }
        __m512 ws, wm = _mm512_setzero_ps();
        const uint16_t *sp = (const uint16_t *)job->scales;
        if (job->scale_kind == SCALE_BLOCK_F16_MIN) {
            ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + (p * blocks + b) * 2 * PANEL)));
            wm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + (p * blocks + b) * 2 * PANEL + PANEL)));
            wm = _mm512_fmadd_ps(ws, _mm512_set1_ps(8.0f), wm);
        } else {
            ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + (p * blocks + b) * PANEL)));
        }
        for (int r = 0; r < nr; r++) {
            const int64_t at = (r0 + r) * blocks + b;
            const __m512i v = _mm512_add_epi32(_mm512_slli_epi32(hi[r], 8), lo[r]);
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(v, _mm512_set1_epi32(job->xsum[at])));
            facc[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(ws, _mm512_set1_ps(job->xs[at])), facc[r]);
            if (job->scale_kind == SCALE_BLOCK_F16_MIN)
                facc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(job->xfsum[at]), facc[r]);
        }
    }
    for (int64_t t = 0; t < job->ncols; t++) {
        const __m512 wc = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(job->wcol + (p * job->ncols + t) * PANEL)));
        for (int r = 0; r < nr; r++)
            facc[r] = _mm512_fmadd_ps(wc, _mm512_set1_ps(job->xcol[(r0 + r) * job->ncols + t]), facc[r]);
    }
    const int64_t n0 = p * PANEL;
    const int valid = job->out - n0 < PANEL ? (int)(job->out - n0) : PANEL;
    const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    const __m512 bias = job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < nr; r++)
        _mm512_mask_storeu_ps(job->y + (r0 + r) * job->out + n0, mask, _mm512_add_ps(facc[r], bias));
}

static void panel_vnni(const q8_job_t *job, int64_t p, int64_t r0, int64_t nr) {
    switch (nr) {
    case 1: panel_vnni_rows(job, p, r0, 1); break;
    case 2: panel_vnni_rows(job, p, r0, 2); break;
    case 3: panel_vnni_rows(job, p, r0, 3); break;
    default: panel_vnni_rows(job, p, r0, 4); break;
    }
}
#endif

static void *q8_panels(void *arg) {
    const q8_job_t *job = (const q8_job_t *)arg;
    for (int64_t p; (p = tiles_next(job->runs, job->jobs, job->me)) >= 0;) {
        for (int64_t r0 = 0; r0 < job->rows; r0 += ROW_TILE) {
            const int64_t nr = job->rows - r0 < ROW_TILE ? job->rows - r0 : ROW_TILE;
#if HAVE_VNNI_BUILD
            if (job->vnni) {
                panel_vnni(job, p, r0, nr);
                continue;
            }
#endif
            panel_portable(job, p, r0, nr);
        }
    }
    return NULL;
}

typedef struct {
    int16_t *xq;
    int8_t *xhi, *xlo;
    float *xs, *xfsum, *xcol, *buf;
    int32_t *xsum;
} q8_rows_t;

/* Each row of x (storage type `dtype`, [rows, in]) per block of 32 as integers |v| <= QMAX, zero
 * past `in`, the outlier columns `cols` taken out into `xcol` first (and zero in the blocks). */
static void quantize_rows(int dtype, const void *x, int64_t rows, int64_t in, int64_t in_pad, const int64_t *cols,
                          int64_t ncols, int split, const q8_rows_t *q) {
    const int64_t blocks = in_pad / QBLOCK;
    float *buf = q->buf;
    for (int64_t r = 0; r < rows; r++) {
        load_f32(dtype, (const char *)x + r * in * elem_size(dtype), buf, in);
        for (int64_t k = in; k < in_pad; k++) buf[k] = 0.0f;
        for (int64_t t = 0; t < ncols; t++) q->xcol[r * ncols + t] = buf[cols[t]], buf[cols[t]] = 0.0f;
        for (int64_t b = 0; b < blocks; b++) {
            const float *v = buf + b * QBLOCK;
            float amax = 0.0f, fsum = 0.0f;
            for (int k = 0; k < QBLOCK; k++) amax = fmaxf(amax, fabsf(v[k])), fsum += v[k];
            const float inv = amax > 0.0f ? (float)QMAX / amax : 0.0f;
            int32_t sum = 0;
            int16_t *xq = q->xq + r * in_pad + b * QBLOCK;
            for (int k = 0; k < QBLOCK; k++) {
                long i = lrintf(v[k] * inv);
                xq[k] = (int16_t)(i > QMAX ? QMAX : i < -QMAX ? -QMAX : i);
                sum += xq[k];
            }
            if (split) {
                for (int k = 0; k < QBLOCK; k++) {
                    const int32_t high = (xq[k] + 128) >> 8; /* floor: lo = v - 256 hi in -128..127 */
                    q->xhi[r * in_pad + b * QBLOCK + k] = (int8_t)high;
                    q->xlo[r * in_pad + b * QBLOCK + k] = (int8_t)(xq[k] - 256 * high);
                }
            }
            q->xs[r * blocks + b] = amax / (float)QMAX;
            q->xsum[r * blocks + b] = 128 * sum;
            q->xfsum[r * blocks + b] = fsum;
        }
    }
}

/* y = x w^T + bias; returns 0, -1 when out of memory, -2 for sizes that do not fit. */
int q8_linear(int dtype, const void *x, const uint8_t *w, const void *scales, int scale_kind, const float *bias,
              const int64_t *cols, const void *wcol, int64_t ncols, void *y, int64_t rows, int64_t in, int64_t in_pad,
              int64_t out, int64_t num_threads, int use_vnni) {
    if (in_pad % QBLOCK != 0 || in_pad < in || ncols < 0 || ncols > MAX_COLUMNS) return -2;
    for (int64_t t = 0; t < ncols; t++)
        if (cols[t] < 0 || cols[t] >= in) return -2;
    const int64_t blocks = in_pad / QBLOCK, panels = (out + PANEL - 1) / PANEL;
    const int vnni = use_vnni && q8_has_vnni();
    q8_rows_t q = {
        .xq = malloc((size_t)(rows * in_pad) * sizeof(int16_t)),
        .xhi = malloc((size_t)(rows * in_pad)),
        .xlo = malloc((size_t)(rows * in_pad)),
        .xs = malloc((size_t)(rows * blocks) * sizeof(float)),
        .xfsum = malloc((size_t)(rows * blocks) * sizeof(float)),
        .xcol = malloc((size_t)(rows * ncols + 1) * sizeof(float)),
        .buf = malloc((size_t)in_pad * sizeof(float)),
        .xsum = malloc((size_t)(rows * blocks) * sizeof(int32_t)),
    };
    float *yf = malloc((size_t)(rows * out) * sizeof(float));
    int status = 0;
    if (!q.xq || !q.xhi || !q.xlo || !q.xs || !q.xfsum || !q.xcol || !q.buf || !q.xsum || !yf) {
        status = -1;
        goto done;
    }
    quantize_rows(dtype, x, rows, in, in_pad, cols, ncols, vnni, &q);
    if (num_threads < 1) num_threads = 1;
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    if (num_threads > panels) num_threads = panels;
    q8_job_t jobs[MAX_THREADS];
    tile_run_t runs[MAX_THREADS];
    tiles_split(runs, (int)num_threads, panels);
    for (int64_t t = 0; t < num_threads; t++)
        jobs[t] = (q8_job_t){q.xq, q.xhi, q.xlo, q.xs, q.xsum, q.xfsum, q.xcol, w, (const _Float16 *)scales,
                             (const _Float16 *)wcol, bias, yf, rows, in_pad, out, ncols, runs, (int)t,
                             (int)num_threads, scale_kind, vnni};
    pool_run(q8_panels, jobs, sizeof jobs[0], (int)num_threads);
    store_f32(dtype, yf, y, rows * out);
done:
    free(q.xq), free(q.xhi), free(q.xlo), free(q.xs), free(q.xfsum), free(q.xcol), free(q.buf), free(q.xsum);
    free(yf);
    return status;
}
