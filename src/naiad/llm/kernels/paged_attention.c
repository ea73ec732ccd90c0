/* Decode attention over a paged KV cache, for the CPU.
 *
 * One query token per row attends to its row's whole context, read straight from the cache
 * through the row's block table: no gather into a padded copy, no mask, no per-(row, head)
 * small GEMM. Scores and the weighted sum of values are accumulated in float32 whatever the
 * storage type (float32, bfloat16 or float16), with a two-pass softmax (max, then exp-sum).
 *
 * Layouts (all contiguous):
 *   q, out        [rows, heads, head_dim]
 *   k/v cache     [num_blocks, block_size, kv_heads, head_dim]
 *   block_tables  [rows, max_blocks] int64 (entries past a row's context are not read)
 *   context_lens  [rows] int64
 * heads is a multiple of kv_heads (grouped-query attention: head h reads kv head h / group).
 * window > 0 is a sliding window (Mistral): the query, at position ctx - 1, sees only the last
 * `window` tokens, itself included; 0 is full attention.
 *
 * Built by naiad/llm/kernels/__init__.py with `gcc -O3 -march=native -ffast-math -pthread` and
 * called through ctypes (which lets go of the GIL); see there for why a plain C library rather
 * than a torch extension. The work runs on torch's OpenMP team (thread_pool.c), split by rows, or
 * by heads as well when there are fewer rows than threads: at one stream the second thread would
 * otherwise wait through every layer's attention (SmolLM2: 30 calls of ~20 us a step). Each head's
 * scores and sums are computed the same way whichever thread has it: the split changes nothing.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "thread_pool.h"

/* dot(q, k) with k in storage type `dtype`; written per type so that gcc vectorises each loop. */
static inline float dot(int dtype, const float *q, const void *k, int64_t d) {
    float acc = 0.0f;
    if (dtype == DTYPE_F32) {
        const float *kk = (const float *)k;
        for (int64_t i = 0; i < d; i++) acc += q[i] * kk[i];
    } else if (dtype == DTYPE_BF16) {
        const uint16_t *kk = (const uint16_t *)k;
        for (int64_t i = 0; i < d; i++) acc += q[i] * bf16_to_f32(kk[i]);
    } else {
        const _Float16 *kk = (const _Float16 *)k;
        for (int64_t i = 0; i < d; i++) acc += q[i] * (float)kk[i];
    }
    return acc;
}

/* acc += w * v with v in storage type `dtype`. */
static inline void axpy(int dtype, float w, const void *v, float *acc, int64_t d) {
    if (dtype == DTYPE_F32) {
        const float *vv = (const float *)v;
        for (int64_t i = 0; i < d; i++) acc[i] += w * vv[i];
    } else if (dtype == DTYPE_BF16) {
        const uint16_t *vv = (const uint16_t *)v;
        for (int64_t i = 0; i < d; i++) acc[i] += w * bf16_to_f32(vv[i]);
    } else {
        const _Float16 *vv = (const _Float16 *)v;
        for (int64_t i = 0; i < d; i++) acc[i] += w * (float)vv[i];
    }
}

/* The arguments of one call, and the rows [row_begin, row_end) and query heads
 * [head_begin, head_end) of them one job computes. */
typedef struct {
    int dtype;
    const void *q, *k_cache, *v_cache;
    const int64_t *block_tables, *context_lens;
    void *out;
    int64_t heads, kv_heads, head_dim, block_size, max_blocks, window;
    float scale;
    int64_t row_begin, row_end, head_begin, head_end;
    int status;
} job_t;

/* Rows one after the other; within a row, every head at once, so that each cached token's
 * K (then V) record, all kv heads side by side, is read once and contiguously. Looping over
 * heads outside the positions instead re-read every record once per head, which at 64 rows
 * (40 MB of K/V per layer) came from memory each time: 3x slower per row than at 1 row. */
static void *decode_rows(void *arg) {
    job_t *job = (job_t *)arg;
    const int dtype = job->dtype;
    const int64_t heads = job->heads, head_dim = job->head_dim, block_size = job->block_size;
    const int64_t h0 = job->head_begin, h1 = job->head_end;
    const int64_t elem = dtype == DTYPE_F32 ? 4 : 2;
    const int64_t group = heads / job->kv_heads;
    const int64_t token_stride = job->kv_heads * head_dim; /* elements between slots of the cache */
    int64_t max_ctx = 1;
    for (int64_t r = job->row_begin; r < job->row_end; r++)
        max_ctx = job->context_lens[r] > max_ctx ? job->context_lens[r] : max_ctx;
    float *scores = malloc((size_t)(heads * max_ctx) * sizeof(float));
    float *qf = malloc((size_t)(heads * head_dim) * sizeof(float));
    float *acc = malloc((size_t)(heads * head_dim) * sizeof(float));
    if (!scores || !qf || !acc) {
        free(scores), free(qf), free(acc);
        job->status = -1;
        return NULL;
    }
    const char *kc = (const char *)job->k_cache, *vc = (const char *)job->v_cache;
    for (int64_t r = job->row_begin; r < job->row_end; r++) {
        const int64_t ctx = job->context_lens[r];
        const int64_t first = job->window > 0 && ctx > job->window ? ctx - job->window : 0;
        const int64_t span = ctx - first;
        const int64_t *table = job->block_tables + r * job->max_blocks;
        load_f32(dtype, (const char *)job->q + (r * heads + h0) * head_dim * elem, qf + h0 * head_dim,
                 (h1 - h0) * head_dim);
        for (int64_t i = h0 * head_dim; i < h1 * head_dim; i++) qf[i] *= job->scale;
        for (int64_t p = first; p < ctx; p++) {
            const int64_t slot = table[p / block_size] * block_size + p % block_size;
            const char *record = kc + slot * token_stride * elem;
            for (int64_t h = h0; h < h1; h++)
                scores[h * span + (p - first)] = dot(dtype, qf + h * head_dim, record + (h / group) * head_dim * elem,
                                                     head_dim);
        }
        for (int64_t h = h0; h < h1; h++) {
            float *row_scores = scores + h * span;
            float max_score = -INFINITY;
            for (int64_t i = 0; i < span; i++) max_score = row_scores[i] > max_score ? row_scores[i] : max_score;
            float total = 0.0f;
            for (int64_t i = 0; i < span; i++) {
                row_scores[i] = expf(row_scores[i] - max_score);
                total += row_scores[i];
            }
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            for (int64_t i = 0; i < span; i++) row_scores[i] *= inv;
        }
        memset(acc + h0 * head_dim, 0, (size_t)((h1 - h0) * head_dim) * sizeof(float));
        for (int64_t p = first; p < ctx; p++) {
            const int64_t slot = table[p / block_size] * block_size + p % block_size;
            const char *record = vc + slot * token_stride * elem;
            for (int64_t h = h0; h < h1; h++)
                axpy(dtype, scores[h * span + (p - first)], record + (h / group) * head_dim * elem, acc + h * head_dim,
                     head_dim);
        }
        store_f32(dtype, acc + h0 * head_dim, (char *)job->out + (r * heads + h0) * head_dim * elem,
                  (h1 - h0) * head_dim);
    }
    free(scores), free(qf), free(acc);
    job->status = 0;
    return NULL;
}

#define MAX_THREADS 64

/* Rows are split between `num_threads` threads (this one included); with fewer rows than
 * threads each row's heads are split too. Returns 0, or -1 when scratch memory could not be had
 * (the output is then incomplete). */
int paged_decode_attention(int dtype, const void *q, const void *k_cache, const void *v_cache,
                           const int64_t *block_tables, const int64_t *context_lens, void *out,
                           int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim,
                           int64_t block_size, int64_t max_blocks, int64_t window, float scale,
                           int64_t num_threads) {
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    if (num_threads < 1) num_threads = 1;
    job_t jobs[MAX_THREADS];
    int64_t n_jobs = 0;
    if (rows >= num_threads) {
        for (int64_t t = 0; t < num_threads; t++)
            jobs[n_jobs++] = (job_t){dtype, q, k_cache, v_cache, block_tables, context_lens, out, heads, kv_heads,
                                     head_dim, block_size, max_blocks, window, scale, rows * t / num_threads,
                                     rows * (t + 1) / num_threads, 0, heads, 0};
    } else {
        int64_t parts = num_threads / (rows > 0 ? rows : 1); /* jobs per row */
        if (parts > heads) parts = heads;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t t = 0; t < parts; t++)
                jobs[n_jobs++] = (job_t){dtype, q, k_cache, v_cache, block_tables, context_lens, out, heads, kv_heads,
                                         head_dim, block_size, max_blocks, window, scale, r, r + 1,
                                         heads * t / parts, heads * (t + 1) / parts, 0};
    }
    pool_run(decode_rows, jobs, sizeof jobs[0], (int)n_jobs);
    int status = 0;
    for (int64_t t = 0; t < n_jobs; t++)
        if (jobs[t].status != 0) status = jobs[t].status;
    return status;
}
