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
 * as q8_linear.c's): panels of 16 output channels, each holding, for each pair of inputs, the 16
 * channels' two weights (64 bytes). One 64-byte load then feeds AVX512-BF16's `vdpbf16ps`, which
 * multiplies 16 pairs by one broadcast pair of x and adds each pair's sum into one of 16 float32
 * lanes: one lane per output channel, no horizontal sums. `in_pad` is `in` rounded up to even (a
 * zero weight fills it). The panels are stored in groups of four (the last group may be smaller),
 * interleaved pair by pair: group g is `[in_pad / 2, its panels, 16, 2]`, so the tile below that
 * takes a group's four panels reads one sequential stream of memory. Four streams, one per panel
 * (the layout before), read 0.84x as fast on this machine's huge pages while its memory streamed
 * fast (40.7 against 47.5-48.5 GB/s), 0.96-0.99x while it streamed at ~33 GB/s (a decode step's
 * linears, same process, alternating; docs/benchmarks.md).
 *
 * Rows are taken four at a time against a group's four panels (sixteen sums in registers, each
 * weight load used four times, each broadcast of x four times); a smaller last group runs two
 * panels at a time, and an odd last panel alone, its sums in two chains (even and odd pairs). Every
 * other output's sum is one chain over the pairs in order, so the tile shapes change no bit.
 * The tiles (a group against up to four rows) are shared by the caller's thread count, run on
 * torch's OpenMP team (thread_pool.c): each thread streams through its own contiguous run, then
 * takes the others' last tiles, so that a thread held up by another process costs about a tile,
 * not a share (a decode step's linears at one row, same process: -2 to +8 % alone, -8 to +18 %
 * beside a busy process, no difference in the bare engine; served at one stream, where the HTTP
 * server's process wakes on one of the cores every token, 93 -> 110 tokens/s, medians of four
 * rounds, with paged_attention.c's slice prefetch in the same step; docs/benchmarks.md). Each
 * output is computed by one thread in a fixed order, whichever thread that is: neither the thread
 * count nor the sharing changes a bit.
 *
 * Needs AVX-512 (F, BW, VL), checked at run time (bf16_linear_supported): with its BF16 extension
 * each pair is one `vdpbf16ps`, without it two FMAs on the pair split into float32 (dot_pair
 * below; a machine without AVX-512 keeps oneDNN's linear). On an Ice Lake Xeon without AVX512-BF16
 * oneDNN's path made a 123M Llama's decode step ~30 ms at one stream (docs/benchmarks.md).
 */
#include "common.h"
#include "thread_pool.h"

#include <stdlib.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_AVX512_BUILD 1
#if defined(__AVX512BF16__)
#define NATIVE_BF16 1
#else
#define NATIVE_BF16 0
#endif
#else
#define HAVE_AVX512_BUILD 0
#endif

#define PANEL 16
#define ROW_TILE 4
#define GROUP 4 /* panels per group */
#define MAX_THREADS 64

/* 1 when this build has an AVX-512 path and the CPU runs it. */
int bf16_linear_supported(void) {
#if HAVE_AVX512_BUILD && defined(__x86_64__)
    __builtin_cpu_init();
    return (!NATIVE_BF16 || __builtin_cpu_supports("avx512bf16")) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

#if HAVE_AVX512_BUILD
#if NATIVE_BF16
/* x as the kernel reads it: a pair of bf16 inputs as one 32-bit lane. */
typedef int32_t x_t;
#define X_PER_PAIR 1

/* acc + x.odd * w.odd + x.even * w.even in each 32-bit lane, for pair k of row x: `vdpbf16ps`. */
static inline __attribute__((always_inline)) __m512 dot_pair(__m512 acc, const x_t *x, int64_t k, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(x[k]), (__m512bh)w);
}

/* float32 to bf16, rounded to nearest even: `vcvtneps2bf16`. */
static inline __attribute__((always_inline)) __m256i to_bf16(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
#else
/* x as the kernel reads it without AVX512-BF16: each input as float32 (converted once per call). */
typedef float x_t;
#define X_PER_PAIR 2

/* The same on AVX-512 without its BF16 extension (Ice Lake, Cascade Lake, Skylake servers): a bf16
 * is the top half of a float32, so the weights' pair is split by a mask and a shift into two float32
 * vectors and summed by two FMAs, each with its input broadcast from memory, the odd element first
 * as vdpbf16ps's definition orders them. The product of two bf16 is exact in float32, so each FMA
 * rounds once, as each step of vdpbf16ps does; only denormals differ (vdpbf16ps flushes them to
 * zero). A weight is split once for all the rows (the compiler shares it). */
static inline __attribute__((always_inline)) __m512 dot_pair(__m512 acc, const x_t *x, int64_t k, __m512i w) {
    acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xffff0000u))),
                          _mm512_set1_ps(x[2 * k + 1]), acc);
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_set1_ps(x[2 * k]), acc);
}

/* float32 to bf16 as common.h's f32_to_bf16 (nearest, ties to even; a NaN stays a NaN), in
 * integers: -ffast-math may assume a float compare never meets a NaN. */
static inline __attribute__((always_inline)) __m256i to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    rounded = _mm512_mask_or_epi32(rounded, nan, bits, _mm512_set1_epi32(0x00400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}
#endif

typedef struct {
    const x_t *x;         /* [rows, pairs * X_PER_PAIR] */
    const uint16_t *w;    /* groups of four panels, each group [in_pad / 2, its panels, 16, 2] */
    const uint16_t *bias; /* [out] or NULL */
    uint16_t *y;          /* [rows, out] */
    int64_t rows, pairs, out, panel_count; /* pairs = in_pad / 2 */
    tile_run_t *runs;                      /* the tiles, shared by the call's jobs (thread_pool.h) */
    int me, jobs;
} job_t;

/* Where panel p's pair k lies: its group's start, then k times the group's width, then p's place. */
typedef struct {
    const uint16_t *w;
    int64_t k_stride; /* uint16 per pair of the group: its panels times 32 */
} panel_t;

static inline panel_t panel_at(const job_t *job, int64_t p) {
    const int64_t first = p / GROUP * GROUP; /* the group's first panel */
    const int64_t size = job->panel_count - first < GROUP ? job->panel_count - first : GROUP;
    return (panel_t){job->w + first * job->pairs * PANEL * 2 + (p - first) * PANEL * 2, size * PANEL * 2};
}

/* Rows [r0, r0 + nr) of panel p's 16 outputs, from the float32 sums `sum`. */
static inline __attribute__((always_inline)) void store(const job_t *job, int64_t p, int64_t r, __m512 sum) {
    const int64_t n0 = p * PANEL;
    const int valid = job->out - n0 < PANEL ? (int)(job->out - n0) : PANEL;
    const __mmask16 mask = (__mmask16)((1u << valid) - 1u);
    if (job->bias) {
        const __m256i b = _mm256_maskz_loadu_epi16(mask, job->bias + n0);
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
    }
    _mm256_mask_storeu_epi16(job->y + r * job->out + n0, mask, to_bf16(sum)); /* nearest even, as torch */
}

/* Rows [r0, r0 + nr) against a whole group, panels p to p + 3 (p a multiple of four), its pairs one
 * sequential stream; nr is a constant after inlining. */
static inline __attribute__((always_inline)) void four_panels(const job_t *job, int64_t p, int64_t r0, const int nr) {
    const uint16_t *w = panel_at(job, p).w;
    const x_t *x[ROW_TILE];
    __m512 a[ROW_TILE][GROUP];
    for (int r = 0; r < nr; r++) {
        x[r] = job->x + (r0 + r) * job->pairs * X_PER_PAIR;
        for (int j = 0; j < GROUP; j++) a[r][j] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < job->pairs; k++, w += GROUP * PANEL * 2) {
        const __m512i w0 = _mm512_loadu_si512(w), w1 = _mm512_loadu_si512(w + 32);
        const __m512i w2 = _mm512_loadu_si512(w + 64), w3 = _mm512_loadu_si512(w + 96);
        for (int r = 0; r < nr; r++) {
            a[r][0] = dot_pair(a[r][0], x[r], k, w0);
            a[r][1] = dot_pair(a[r][1], x[r], k, w1);
            a[r][2] = dot_pair(a[r][2], x[r], k, w2);
            a[r][3] = dot_pair(a[r][3], x[r], k, w3);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < GROUP; j++) store(job, p + j, r0 + r, a[r][j]);
}

/* Rows [r0, r0 + nr) against panels p and p + 1 of the last, smaller group. */
static inline __attribute__((always_inline)) void two_panels(const job_t *job, int64_t p, int64_t r0, const int nr) {
    const panel_t at = panel_at(job, p);
    const x_t *x[ROW_TILE];
    __m512 a[ROW_TILE], b[ROW_TILE];
    for (int r = 0; r < nr; r++) {
        x[r] = job->x + (r0 + r) * job->pairs * X_PER_PAIR;
        a[r] = _mm512_setzero_ps(), b[r] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < job->pairs; k++) {
        const __m512i wa = _mm512_loadu_si512(at.w + k * at.k_stride);
        const __m512i wb = _mm512_loadu_si512(at.w + k * at.k_stride + PANEL * 2);
        for (int r = 0; r < nr; r++) {
            a[r] = dot_pair(a[r], x[r], k, wa);
            b[r] = dot_pair(b[r], x[r], k, wb);
        }
    }
    for (int r = 0; r < nr; r++) store(job, p, r0 + r, a[r]), store(job, p + 1, r0 + r, b[r]);
}

/* Rows [r0, r0 + nr) against an odd last panel p alone, in two chains of sums (even and odd pairs). */
static inline __attribute__((always_inline)) void one_panel(const job_t *job, int64_t p, int64_t r0, const int nr) {
    const panel_t at = panel_at(job, p);
    const x_t *x[ROW_TILE];
    __m512 a[ROW_TILE], b[ROW_TILE];
    for (int r = 0; r < nr; r++) {
        x[r] = job->x + (r0 + r) * job->pairs * X_PER_PAIR;
        a[r] = _mm512_setzero_ps(), b[r] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 1 < job->pairs; k += 2) {
        const __m512i wa = _mm512_loadu_si512(at.w + k * at.k_stride);
        const __m512i wb = _mm512_loadu_si512(at.w + (k + 1) * at.k_stride);
        for (int r = 0; r < nr; r++) {
            a[r] = dot_pair(a[r], x[r], k, wa);
            b[r] = dot_pair(b[r], x[r], k + 1, wb);
        }
    }
    if (k < job->pairs) {
        const __m512i wa = _mm512_loadu_si512(at.w + k * at.k_stride);
        for (int r = 0; r < nr; r++) a[r] = dot_pair(a[r], x[r], k, wa);
    }
    for (int r = 0; r < nr; r++) store(job, p, r0 + r, _mm512_add_ps(a[r], b[r]));
}

#define BY_ROWS(fn, job, p, r0, nr)                                                                                  \
    switch (nr) {                                                                                                    \
    case 1: fn(job, p, r0, 1); break;                                                                                \
    case 2: fn(job, p, r0, 2); break;                                                                                \
    case 3: fn(job, p, r0, 3); break;                                                                                \
    default: fn(job, p, r0, 4); break;                                                                               \
    }

/* The job's tiles: tile t is group t / row_tiles against row tile t % row_tiles (a thread keeps a
 * group's weights in cache over its row tiles). */
static void *panels(void *arg) {
    const job_t *job = (const job_t *)arg;
    const int64_t row_tiles = (job->rows + ROW_TILE - 1) / ROW_TILE;
    for (int64_t t; (t = tiles_next(job->runs, job->jobs, job->me)) >= 0;) {
        const int64_t p0 = t / row_tiles * GROUP, r0 = t % row_tiles * ROW_TILE;
        const int64_t nr = job->rows - r0 < ROW_TILE ? job->rows - r0 : ROW_TILE;
        const int64_t end = p0 + GROUP < job->panel_count ? p0 + GROUP : job->panel_count;
        if (end - p0 == GROUP) {
            BY_ROWS(four_panels, job, p0, r0, nr)
            continue;
        }
        int64_t p = p0;
        for (; p + 1 < end; p += 2) BY_ROWS(two_panels, job, p, r0, nr)
        if (p < end) BY_ROWS(one_panel, job, p, r0, nr)
    }
    return NULL;
}
#endif

/* y = x w^T + bias (bias NULL: none) for x [rows, in], w in the panel layout above, y [rows, out];
 * returns 0, -1 when out of memory, -3 where this build or CPU lacks AVX-512. */
int bf16_linear(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t rows, int64_t in,
                int64_t out, int64_t num_threads) {
#if HAVE_AVX512_BUILD
    if (!bf16_linear_supported()) return -3;
    if (rows == 0) return 0; /* nothing to write (and malloc(0) below may return NULL) */
    const int64_t in_pad = in + (in & 1), panel_count = (out + PANEL - 1) / PANEL;
#if NATIVE_BF16
    uint16_t *padded = NULL;
    if (in_pad != in) { /* an odd width: each row gets the zero its last pair needs */
        padded = calloc((size_t)(rows * in_pad), sizeof(uint16_t));
        if (!padded) return -1;
        for (int64_t r = 0; r < rows; r++) memcpy(padded + r * in_pad, x + r * in, (size_t)in * sizeof(uint16_t));
    }
    const x_t *xs = (const x_t *)(padded ? padded : x);
#else
    /* each input as float32 once, rather than once per panel it meets (an odd width's last pair
     * gets a zero) */
    float *padded = malloc((size_t)(rows * in_pad) * sizeof(float));
    if (!padded) return -1;
    for (int64_t r = 0; r < rows; r++) {
        load_f32(DTYPE_BF16, x + r * in, padded + r * in_pad, in);
        if (in_pad != in) padded[r * in_pad + in] = 0.0f;
    }
    const x_t *xs = padded;
#endif
    if (num_threads < 1) num_threads = 1;
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    /* the tiles (a group against up to four rows), in contiguous runs per thread */
    const int64_t units = (panel_count + GROUP - 1) / GROUP * ((rows + ROW_TILE - 1) / ROW_TILE);
    if (num_threads > units) num_threads = units;
    job_t jobs[MAX_THREADS];
    tile_run_t runs[MAX_THREADS];
    tiles_split(runs, (int)num_threads, units);
    for (int64_t t = 0; t < num_threads; t++)
        jobs[t] = (job_t){xs, w, bias, y, rows, in_pad / 2, out, panel_count, runs, (int)t, (int)num_threads};
    pool_run(panels, jobs, sizeof jobs[0], (int)num_threads);
    free(padded);
    return 0;
#else
    (void)x, (void)w, (void)bias, (void)y, (void)rows, (void)in, (void)out, (void)num_threads;
    return -3;
#endif
}
