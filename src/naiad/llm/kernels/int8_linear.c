/*
 * INT8 weight-only linear layers: y[r, n] = scale[n] * sum_k x[r, k] * w[n, k] + bias[n], with
 * `w` int8 (per-output-channel scales, quantized at load) and `x` / `y` in the model's dtype.
 *
 * A decode step multiplies a few rows by every weight once: the time goes to reading the
 * weights, so reading them as int8 (a quarter of fp32, half of bf16) is what makes it faster.
 * Each weight row is widened to float once per call and used for every input row; gcc
 * vectorises the widening and the dot products (-O3 -march=native). The output features are
 * split over the caller's thread count (own threads rather than OpenMP, as in
 * paged_attention.c). Prefill-sized inputs go to torch instead (see quantization.py).
 */
#include "common.h"

#include <pthread.h>
#include <stdlib.h>

#define MAX_THREADS 64

typedef struct {
    const float *x; /* [rows, in] as float32 */
    const int8_t *w;
    const float *scale, *bias;
    float *y; /* [rows, out] as float32 */
    int64_t rows, in, out, first, last;
    int status;
} int8_job_t;

static void *int8_rows(void *arg) {
    int8_job_t *job = (int8_job_t *)arg;
    const int64_t in = job->in, rows = job->rows, out = job->out;
    float *wf = malloc((size_t)in * sizeof(float));
    if (!wf) {
        job->status = -1;
        return NULL;
    }
    for (int64_t n = job->first; n < job->last; n++) {
        const int8_t *wrow = job->w + n * in;
        for (int64_t k = 0; k < in; k++) wf[k] = (float)wrow[k];
        const float s = job->scale[n], b = job->bias ? job->bias[n] : 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = job->x + r * in;
            float acc = 0.0f;
            for (int64_t k = 0; k < in; k++) acc += xr[k] * wf[k];
            job->y[r * out + n] = acc * s + b;
        }
    }
    free(wf);
    return NULL;
}

int int8_linear(int dtype, const void *x, const int8_t *w, const float *scale, const float *bias, void *y,
                int64_t rows, int64_t in, int64_t out, int64_t num_threads) {
    float *xf = malloc((size_t)(rows * in) * sizeof(float));
    float *yf = malloc((size_t)(rows * out) * sizeof(float));
    if (!xf || !yf) {
        free(xf), free(yf);
        return -1;
    }
    load_f32(dtype, x, xf, rows * in);
    if (num_threads < 1) num_threads = 1;
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    if (num_threads > out) num_threads = out;
    int8_job_t jobs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    const int64_t per = (out + num_threads - 1) / num_threads;
    for (int64_t t = 0; t < num_threads; t++) {
        const int64_t first = t * per, last = first + per < out ? first + per : out;
        jobs[t] = (int8_job_t){xf, w, scale, bias, yf, rows, in, out, first, last, 0};
        if (t > 0) started[t] = pthread_create(&threads[t], NULL, int8_rows, &jobs[t]) == 0;
    }
    for (int64_t t = 1; t < num_threads; t++)
        if (!started[t]) int8_rows(&jobs[t]); /* no thread to be had: do its share here */
    int8_rows(&jobs[0]);
    int status = jobs[0].status;
    for (int64_t t = 1; t < num_threads; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        if (jobs[t].status != 0) status = jobs[t].status;
    }
    if (status == 0) store_f32(dtype, yf, y, rows * out);
    free(xf), free(yf);
    return status;
}
