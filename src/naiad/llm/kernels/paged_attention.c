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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "thread_pool.h"

/* Element i of a cached K or V vector of storage type `dtype`, as float32. */
static inline __attribute__((always_inline)) float cached(int dtype, const void *v, int64_t i) {
    if (dtype == DTYPE_F32) return ((const float *)v)[i];
    if (dtype == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)v)[i]);
    return (float)((const _Float16 *)v)[i];
}

/* One head's score for one cached key: its query (float32, scaled) dotted with the key. */
static inline __attribute__((always_inline)) float key_dot(int dtype, int64_t head_dim, const float *q, const void *k) {
    float dot = 0.0f;
    for (int64_t i = 0; i < head_dim; i++) dot += q[i] * cached(dtype, k, i);
    return dot;
}

/* One head's running sum of values: sum += w * v. */
static inline __attribute__((always_inline)) void add_value(int dtype, int64_t head_dim, float *sum, float w,
                                                            const void *v) {
    for (int64_t i = 0; i < head_dim; i++) sum[i] += w * cached(dtype, v, i);
}

/* Asks for one token's slice of a record (the job's kv heads' part of it, every line of it and no
 * more) that the loop reads a block later: a block lies wherever the block table says, which no
 * hardware prefetcher can guess. The loops below ask for one such slice per token they compute,
 * so that a steady few lines are in flight behind the work. Asking for a whole block at once (384
 * lines at 12 heads) held the core until the memory took the requests, and then computed with
 * nothing in flight: the reads and the arithmetic added up instead of overlapping (16 rows x 256
 * tokens over 12 layers took 7.2-8.3 ms from memory, 3.0-3.2 ms from cache; asked for token by
 * token, 4.2-5.6 ms; docs/benchmarks.md, 2026-12-06 06:00). Only the job's slice: where one row's
 * heads are split over the threads, asking for whole records made each thread bring in the
 * other's half as well. */
static inline void prefetch_slice(const char *slice, int64_t slice_bytes) {
    const uintptr_t last = (uintptr_t)(slice + slice_bytes - 1);
    for (uintptr_t line = (uintptr_t)slice & ~(uintptr_t)63; line <= last; line += 64)
        __builtin_prefetch((const void *)line, 0, 2);
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

/* The job's rows, one after the other, a cache block at a time: for each block of the row's
 * context, each token's scores for the job's heads (then, after the softmax, each token's values
 * into the heads' sums). A block's records (all kv heads of `block_size` tokens) are contiguous
 * and read token by token, in order: one stream from memory per block (64 rows of a 123M model:
 * 40 MB of K/V a layer; looping over the whole context once per head was 3x slower there, and
 * head by head within a block, each head walking the tokens, 1.26-1.40x slower at 4-64 rows and
 * 0.90-0.95x the time at one row; docs/benchmarks.md). Each (head, token) score and each head's
 * sum over the tokens are computed the same way whichever job has the head: the split changes no
 * bit. `dtype` and `head_dim` are constants in each specialisation below (always inlined), so gcc
 * unrolls the head_dim loops into vector registers. Block indices are looked up once per block.
 */
static inline __attribute__((always_inline)) void rows(job_t *job, const int dtype, const int64_t head_dim) {
    const int64_t heads = job->heads, block_size = job->block_size;
    const int64_t h0 = job->head_begin, h1 = job->head_end;
    const int64_t elem = dtype == DTYPE_F32 ? 4 : 2;
    const int64_t group = heads / job->kv_heads;
    const int64_t token_stride = job->kv_heads * head_dim; /* elements between slots of the cache */
    const int64_t record_bytes = token_stride * elem; /* one token's K (or V) for every kv head */
    const int64_t slice_offset = h0 / group * head_dim * elem; /* this job's kv heads' part of it */
    const int64_t slice_bytes = ((h1 - 1) / group + 1) * head_dim * elem - slice_offset;
    int64_t max_ctx = 1;
    for (int64_t r = job->row_begin; r < job->row_end; r++)
        max_ctx = job->context_lens[r] > max_ctx ? job->context_lens[r] : max_ctx;
    float *scores = malloc((size_t)(heads * max_ctx) * sizeof(float));
    float *qf = malloc((size_t)(heads * head_dim) * sizeof(float));
    float *acc = malloc((size_t)(heads * head_dim) * sizeof(float));
    if (!scores || !qf || !acc) {
        free(scores), free(qf), free(acc);
        job->status = -1;
        return;
    }
    const char *kc = (const char *)job->k_cache, *vc = (const char *)job->v_cache;
    for (int64_t r = job->row_begin; r < job->row_end; r++) {
        const int64_t ctx = job->context_lens[r];
        const int64_t first = job->window > 0 && ctx > job->window ? ctx - job->window : 0;
        const int64_t span = ctx - first;
        const int64_t *table = job->block_tables + r * job->max_blocks;
        const int64_t last = (ctx - 1) / block_size;
        const char *next_row = NULL; /* the next row's first keys, if this job has it */
        if (r + 1 < job->row_end) {
            const int64_t next_ctx = job->context_lens[r + 1];
            const int64_t next_first = job->window > 0 && next_ctx > job->window ? next_ctx - job->window : 0;
            next_row = kc + table[job->max_blocks + next_first / block_size] * block_size * record_bytes;
        }
        load_f32(dtype, (const char *)job->q + (r * heads + h0) * head_dim * elem, qf + h0 * head_dim,
                 (h1 - h0) * head_dim);
        for (int64_t i = h0 * head_dim; i < h1 * head_dim; i++) qf[i] *= job->scale;
        for (int64_t b = first / block_size; b * block_size < ctx; b++) {
            const int64_t p0 = b * block_size > first ? b * block_size : first;
            const int64_t p1 = (b + 1) * block_size < ctx ? (b + 1) * block_size : ctx;
            const int64_t slot0 = table[b] * block_size - b * block_size; /* + p: position p's slot */
            /* the slices read a block from now: the next block's, after the last the values' first */
            const char *ahead = b < last ? kc + table[b + 1] * block_size * record_bytes
                                         : vc + table[first / block_size] * block_size * record_bytes;
            for (int64_t p = p0; p < p1; p++) { /* token by token: the block's records read in order */
                prefetch_slice(ahead + (p - b * block_size) * record_bytes + slice_offset, slice_bytes);
                for (int64_t h = h0; h < h1; h++)
                    scores[h * span + (p - first)] =
                        key_dot(dtype, head_dim, qf + h * head_dim,
                                kc + ((slot0 + p) * token_stride + (h / group) * head_dim) * elem);
            }
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
        for (int64_t b = first / block_size; b * block_size < ctx; b++) {
            const int64_t p0 = b * block_size > first ? b * block_size : first;
            const int64_t p1 = (b + 1) * block_size < ctx ? (b + 1) * block_size : ctx;
            const int64_t slot0 = table[b] * block_size - b * block_size;
            const char *ahead = b < last ? vc + table[b + 1] * block_size * record_bytes : next_row;
            for (int64_t p = p0; p < p1; p++) {
                if (ahead) prefetch_slice(ahead + (p - b * block_size) * record_bytes + slice_offset, slice_bytes);
                for (int64_t h = h0; h < h1; h++)
                    add_value(dtype, head_dim, acc + h * head_dim, scores[h * span + (p - first)],
                              vc + ((slot0 + p) * token_stride + (h / group) * head_dim) * elem);
            }
        }
        store_f32(dtype, acc + h0 * head_dim, (char *)job->out + (r * heads + h0) * head_dim * elem,
                  (h1 - h0) * head_dim);
    }
    free(scores), free(qf), free(acc);
    job->status = 0;
}

/* One specialisation per storage type, with the usual head sizes as constants. */
#define ROWS_FOR(dtype)                                                                                              \
    static void rows_##dtype(job_t *job) {                                                                           \
        if (job->head_dim == 64)                                                                                     \
            rows(job, dtype, 64);                                                                                    \
        else if (job->head_dim == 128)                                                                               \
            rows(job, dtype, 128);                                                                                   \
        else                                                                                                         \
            rows(job, dtype, job->head_dim);                                                                         \
    }
ROWS_FOR(DTYPE_F32)
ROWS_FOR(DTYPE_BF16)
ROWS_FOR(DTYPE_F16)

static void *decode_rows(void *arg) {
    job_t *job = (job_t *)arg;
    if (job->dtype == DTYPE_F32)
        rows_DTYPE_F32(job);
    else if (job->dtype == DTYPE_BF16)
        rows_DTYPE_BF16(job);
    else
        rows_DTYPE_F16(job);
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
