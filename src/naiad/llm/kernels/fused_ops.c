/* The element-wise parts of a decoder layer, each fused into one pass for the CPU.
 *
 * In eager torch a layer's norms, rotary embedding and gated activation are some 30 small
 * ops, each a dispatch and a fresh tensor; at one sequence they cost about as much as the
 * matrix products. Each function here does one of them in a single pass over its rows,
 * computing in float32 and rounding to the storage type wherever the torch reference rounds
 * (`round_to`), so that bf16 results match the reference's. The rotary embedding and the gated
 * activation split a prompt's rows over torch's threads (thread_pool.c); a row's result does not
 * depend on the thread.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"
#include "thread_pool.h"

/* Rows (tokens) per thread below which a call stays on the calling thread: a decode step's few
 * rows take microseconds, less than waking the team would. */
#define ROWS_PER_JOB 16
#define MAX_JOBS 64

static int jobs_for(int64_t rows) {
    int64_t n = rows / ROWS_PER_JOB;
    const int threads = pool_threads();
    if (n > threads) n = threads;
    if (n > MAX_JOBS) n = MAX_JOBS;
    return n < 1 ? 1 : (int)n;
}

/* out = weight * to_dtype(h * rsqrt(mean(h^2) + eps)), h = x as float32 (the reference RMSNorm,
 * which rounds the normalised row before the weight multiplies it). With `residual`, h is
 * first x + residual rounded to the storage type, and that sum goes to `residual_out` (the
 * residual stream of the next sub-layer). Returns 0, or -1 without scratch memory. */
int rms_norm(int dtype, const void *x, const void *residual, void *residual_out, const void *weight, void *out,
             int64_t rows, int64_t dim, float eps) {
    const int64_t elem = elem_size(dtype);
    float *h = malloc((size_t)dim * sizeof(float));
    float *r = malloc((size_t)dim * sizeof(float));
    float *w = malloc((size_t)dim * sizeof(float));
    if (!h || !r || !w) {
        free(h), free(r), free(w);
        return -1;
    }
    load_f32(dtype, weight, w, dim);
    for (int64_t row = 0; row < rows; row++) {
        load_f32(dtype, (const char *)x + row * dim * elem, h, dim);
        if (residual) {
            load_f32(dtype, (const char *)residual + row * dim * elem, r, dim);
            for (int64_t i = 0; i < dim; i++) h[i] = round_to(dtype, h[i] + r[i]);
            store_f32(dtype, h, (char *)residual_out + row * dim * elem, dim);
        }
        float squares = 0.0f;
        for (int64_t i = 0; i < dim; i++) squares += h[i] * h[i];
        const float inv = 1.0f / sqrtf(squares / (float)dim + eps);
        for (int64_t i = 0; i < dim; i++) h[i] = w[i] * round_to(dtype, h[i] * inv);
        store_f32(dtype, h, (char *)out + row * dim * elem, dim);
    }
    free(h), free(r), free(w);
    return 0;
}

/* Rotate q's and k's heads in place by their tokens' angles (the half-split layout):
 * x' = x * cos + rotate_half(x) * sin, rounded as the reference's three ops round.
 * cos and sin are [tokens, head_dim]; a token's q heads start `q_stride` elements after the
 * previous token's (they may sit inside a fused qkv row), likewise k. A prompt's tokens are
 * split over torch's threads (each token's result is the same on any thread). */
typedef struct {
    int dtype, status;
    void *q, *k;
    const void *cos, *sin;
    int64_t first, last, q_heads, k_heads, head_dim, q_stride, k_stride;
} rotary_job_t;

/* One head's rotation, each half in its own loop over restrict pointers and each storage type in
 * its own loops, so that the compiler vectorizes bf16 and float32 (one loop writing y[i] and
 * y[i + half] with the type tested inside did not vectorize: 640 us for 128 tokens of 24 heads). */
#define ROTATE_HALVES(round)                                                                                          \
    do {                                                                                                             \
        for (int64_t i = 0; i < half; i++) y1[i] = round(round(x1[i] * c[i]) + round(-x2[i] * s[i]));                \
        for (int64_t i = 0; i < half; i++)                                                                           \
            y2[i] = round(round(x2[i] * c[half + i]) + round(x1[i] * s[half + i]));                                  \
    } while (0)

static inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }
static inline float round_f16(float v) { return (float)(_Float16)v; }
static inline float round_none(float v) { return v; }

static void rotate_head(int dtype, const float *restrict x1, const float *restrict x2, const float *restrict c,
                        const float *restrict s, float *restrict y1, float *restrict y2, int64_t half) {
    if (dtype == DTYPE_BF16)
        ROTATE_HALVES(round_bf16);
    else if (dtype == DTYPE_F16)
        ROTATE_HALVES(round_f16);
    else
        ROTATE_HALVES(round_none);
}

static void *rotary_tokens(void *arg) {
    rotary_job_t *job = (rotary_job_t *)arg;
    const int dtype = job->dtype;
    const int64_t elem = elem_size(dtype), head_dim = job->head_dim, half = head_dim / 2;
    float *scratch = malloc((size_t)(4 * head_dim) * sizeof(float));
    if (!scratch) {
        job->status = -1;
        return NULL;
    }
    float *c = scratch, *s = c + head_dim, *x = s + head_dim, *y = x + head_dim;
    for (int64_t t = job->first; t < job->last; t++) {
        load_f32(dtype, (const char *)job->cos + t * head_dim * elem, c, head_dim);
        load_f32(dtype, (const char *)job->sin + t * head_dim * elem, s, head_dim);
        for (int64_t which = 0; which < 2; which++) {
            char *base = which == 0 ? (char *)job->q + t * job->q_stride * elem
                                    : (char *)job->k + t * job->k_stride * elem;
            const int64_t heads = which == 0 ? job->q_heads : job->k_heads;
            for (int64_t h = 0; h < heads; h++) {
                char *head = base + h * head_dim * elem;
                load_f32(dtype, head, x, head_dim);
                rotate_head(dtype, x, x + half, c, s, y, y + half, half);
                store_f32(dtype, y, head, head_dim);
            }
        }
    }
    free(scratch);
    return NULL;
}

int rotary(int dtype, void *q, void *k, const void *cos, const void *sin, int64_t tokens, int64_t q_heads,
           int64_t k_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride) {
    rotary_job_t jobs[MAX_JOBS];
    const int n = jobs_for(tokens);
    for (int t = 0; t < n; t++)
        jobs[t] = (rotary_job_t){dtype, 0, q, k, cos, sin, tokens * t / n, tokens * (t + 1) / n,
                                 q_heads, k_heads, head_dim, q_stride, k_stride};
    pool_run(rotary_tokens, jobs, sizeof jobs[0], n);
    for (int t = 0; t < n; t++)
        if (jobs[t].status) return jobs[t].status;
    return 0;
}

/* out[r] = silu(gate[r]) * up[r], where gate_up[r] = [gate | up] of `inter` elements each; a
 * prompt's rows are split over torch's threads. */
typedef struct {
    int dtype, status;
    const void *gate_up;
    void *out;
    int64_t first, last, inter;
} silu_job_t;

static void *silu_rows(void *arg) {
    silu_job_t *job = (silu_job_t *)arg;
    const int dtype = job->dtype;
    const int64_t elem = elem_size(dtype), inter = job->inter;
    float *g = malloc((size_t)(2 * inter) * sizeof(float));
    if (!g) {
        job->status = -1;
        return NULL;
    }
    float *u = g + inter;
    for (int64_t row = job->first; row < job->last; row++) {
        const char *src = (const char *)job->gate_up + row * 2 * inter * elem;
        load_f32(dtype, src, g, inter);
        load_f32(dtype, src + inter * elem, u, inter);
        for (int64_t i = 0; i < inter; i++) g[i] = round_to(dtype, g[i] / (1.0f + expf(-g[i]))) * u[i];
        store_f32(dtype, g, (char *)job->out + row * inter * elem, inter);
    }
    free(g);
    return NULL;
}

int silu_mul(int dtype, const void *gate_up, void *out, int64_t rows, int64_t inter) {
    silu_job_t jobs[MAX_JOBS];
    const int n = jobs_for(rows);
    for (int t = 0; t < n; t++) jobs[t] = (silu_job_t){dtype, 0, gate_up, out, rows * t / n, rows * (t + 1) / n, inter};
    pool_run(silu_rows, jobs, sizeof jobs[0], n);
    for (int t = 0; t < n; t++)
        if (jobs[t].status) return jobs[t].status;
    return 0;
}
