/* The element-wise parts of a decoder layer, each fused into one pass for the CPU.
 *
 * In eager torch a layer's norms, rotary embedding and gated activation are some 30 small
 * ops, each a dispatch and a fresh tensor; at one sequence they cost about as much as the
 * matrix products. Each function here does one of them in a single pass over its rows,
 * computing in float32 and rounding to the storage type wherever the torch reference rounds
 * (`round_to`), so that bf16 results match the reference's.
 */
#include <math.h>
#include <stdlib.h>

#include "common.h"

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
 * previous token's (they may sit inside a fused qkv row), likewise k. */
int rotary(int dtype, void *q, void *k, const void *cos, const void *sin, int64_t tokens, int64_t q_heads,
           int64_t k_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride) {
    const int64_t elem = elem_size(dtype), half = head_dim / 2;
    float *c = malloc((size_t)head_dim * sizeof(float));
    float *s = malloc((size_t)head_dim * sizeof(float));
    float *x = malloc((size_t)head_dim * sizeof(float));
    float *y = malloc((size_t)head_dim * sizeof(float));
    if (!c || !s || !x || !y) {
        free(c), free(s), free(x), free(y);
        return -1;
    }
    for (int64_t t = 0; t < tokens; t++) {
        load_f32(dtype, (const char *)cos + t * head_dim * elem, c, head_dim);
        load_f32(dtype, (const char *)sin + t * head_dim * elem, s, head_dim);
        for (int64_t which = 0; which < 2; which++) {
            char *base = which == 0 ? (char *)q + t * q_stride * elem : (char *)k + t * k_stride * elem;
            const int64_t heads = which == 0 ? q_heads : k_heads;
            for (int64_t h = 0; h < heads; h++) {
                char *head = base + h * head_dim * elem;
                load_f32(dtype, head, x, head_dim);
                for (int64_t i = 0; i < half; i++) {
                    y[i] = round_to(dtype, round_to(dtype, x[i] * c[i]) + round_to(dtype, -x[i + half] * s[i]));
                    y[i + half] = round_to(dtype, round_to(dtype, x[i + half] * c[i + half]) +
                                                      round_to(dtype, x[i] * s[i + half]));
                }
                store_f32(dtype, y, head, head_dim);
            }
        }
    }
    free(c), free(s), free(x), free(y);
    return 0;
}

/* out[r] = silu(gate[r]) * up[r], where gate_up[r] = [gate | up] of `inter` elements each. */
int silu_mul(int dtype, const void *gate_up, void *out, int64_t rows, int64_t inter) {
    const int64_t elem = elem_size(dtype);
    float *g = malloc((size_t)inter * sizeof(float));
    float *u = malloc((size_t)inter * sizeof(float));
    if (!g || !u) {
        free(g), free(u);
        return -1;
    }
    for (int64_t row = 0; row < rows; row++) {
        const char *src = (const char *)gate_up + row * 2 * inter * elem;
        load_f32(dtype, src, g, inter);
        load_f32(dtype, src + inter * elem, u, inter);
        for (int64_t i = 0; i < inter; i++) g[i] = round_to(dtype, g[i] / (1.0f + expf(-g[i]))) * u[i];
        store_f32(dtype, g, (char *)out + row * inter * elem, inter);
    }
    free(g), free(u);
    return 0;
}
