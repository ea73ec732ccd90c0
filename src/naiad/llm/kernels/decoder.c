/*
 * A whole decode step's decoder layers in one call, for the CPU (the engine's `"gguf"`, `"int8"`
 * and `"auto"` quantized Llama models, and bf16 models where bf16_linear.c runs, on one rank).
 *
 * In eager torch each layer is a dozen Python-level calls (modules, views, the kernels' ctypes
 * wrappers): for SmolLM2's 30 narrow layers that Python took about as long as the weights' reading
 * at one stream. This function runs the same kernels in the same order, on the same data, with
 * no Python between them, so its results are bit for bit those of the layer-by-layer forward
 * (models/llama.py's DecoderLayer; tests/llm/test_fused_decode.py checks the equality):
 *
 *   h, residual = rms_norm(x + residual)           (the first layer: residual = x, h = rms_norm(x))
 *   q | k | v  = linear(h, qkv)                    (q8_linear, or bf16_linear for a bf16 model)
 *   q, k      = rotary(q, k)                        (in place in the qkv rows)
 *   cache[slot] = k, v                              (the rows' new tokens' K/V)
 *   a         = paged_decode_attention(q)
 *   h, residual = rms_norm(linear(a, o) + residual)
 *   x         = linear(silu_mul(linear(h, gate_up)), down)
 *
 * Every row is a decode row: one new token per sequence, at position context_len - 1.
 * decode_tokens starts from the rows' token ids and positions (the embedding and rotary rows looked
 * up here), and decode_head ends a greedy step: the final norm, the LM head and each row's argmax.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* The kernels this file strings together (their own files say what each computes). */
int rms_norm(int dtype, const void *x, const void *residual, void *residual_out, const void *weight, void *out,
             int64_t rows, int64_t dim, float eps);
int rotary(int dtype, void *q, void *k, const void *cos, const void *sin, int64_t tokens, int64_t q_heads,
           int64_t k_heads, int64_t head_dim, int64_t q_stride, int64_t k_stride);
int silu_mul(int dtype, const void *gate_up, void *out, int64_t rows, int64_t inter);
int q8_linear(int dtype, const void *x, const uint8_t *w, const void *scales, int scale_kind, const float *bias,
              const int64_t *cols, const void *wcol, int64_t ncols, void *y, int64_t rows, int64_t in, int64_t in_pad,
              int64_t out, int64_t num_threads, int use_vnni);
int bf16_linear(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t rows, int64_t in,
                int64_t out, int64_t num_threads);
int paged_decode_attention(int dtype, const void *q, const void *k_cache, const void *v_cache,
                           const int64_t *block_tables, const int64_t *context_lens, void *out, int64_t rows,
                           int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks,
                           int64_t window, float scale, int64_t num_threads);

enum { LINEAR_Q8 = 0, LINEAR_BF16 = 1 };

/* One linear layer: 8-bit as q8_linear takes it (quantization.py's _PackedLinear), or bf16 panels
 * as bf16_linear takes them (cpu_linear.py's PanelLinear; only `packed`, `bias`, `in` and `out`
 * are used then, the bias in bf16). */
typedef struct {
    const void *packed;
    const void *scales;
    const void *bias;       /* NULL: none; float32 for q8, bf16 for bf16 */
    const int64_t *columns; /* the outlier columns, NULL when ncols is 0 */
    const void *column_weights;
    int64_t ncols, in, in_pad, out, scale_kind, kind;
} linear_t;

/* One decoder layer: its two norms' weights (in the activations' dtype) and four linears. */
typedef struct {
    const void *input_norm, *post_norm;
    void *k_cache, *v_cache; /* [num_blocks, block_size, kv_heads, head_dim] */
    linear_t qkv, o, gate_up, down;
} decoder_layer_t;

typedef struct {
    int64_t rows, hidden, heads, kv_heads, head_dim, inter, block_size, max_blocks, window, threads;
    float scale, eps;
    int dtype, vnni;
} decode_shape_t;

static int linear(const decode_shape_t *s, const linear_t *l, const void *x, void *y) {
    if (l->kind == LINEAR_BF16)
        return bf16_linear(x, l->packed, l->bias, y, s->rows, l->in, l->out, s->threads);
    return q8_linear(s->dtype, x, l->packed, l->scales, (int)l->scale_kind, l->bias, l->columns, l->column_weights,
                     l->ncols, y, s->rows, l->in, l->in_pad, l->out, s->threads, s->vnni);
}

/* Runs `n_layers` layers over x + residual (x alone when `first`: residual is then written);
 * on return x holds the last MLP's output and residual the stream before it (their sum is the
 * last layer's output, as DecoderLayer returns it). cos and sin are [rows, head_dim]; slots,
 * block_tables [rows, max_blocks] and context_lens as attention.py's AttentionMetadata has them.
 * Returns 0, -1 without scratch memory, or a kernel's error status. */
int decode_layers(const decode_shape_t *s, const decoder_layer_t *layers, int64_t n_layers, void *x, void *residual,
                  int first, const void *cos, const void *sin, const int64_t *slots, const int64_t *block_tables,
                  const int64_t *context_lens) {
    const int64_t elem = elem_size(s->dtype), rows = s->rows;
    const int64_t q_size = s->heads * s->head_dim, kv_size = s->kv_heads * s->head_dim;
    const int64_t qkv_size = q_size + 2 * kv_size;
    char *h = malloc((size_t)(rows * s->hidden * elem));
    char *qkv = malloc((size_t)(rows * qkv_size * elem));
    char *q = malloc((size_t)(rows * q_size * elem));
    char *attn = malloc((size_t)(rows * q_size * elem));
    char *gate_up = malloc((size_t)(rows * 2 * s->inter * elem));
    char *act = malloc((size_t)(rows * s->inter * elem));
    int status = (h && qkv && q && attn && gate_up && act) ? 0 : -1;
    for (int64_t i = 0; i < n_layers && status == 0; i++) {
        const decoder_layer_t *layer = &layers[i];
        if (i == 0 && first) {
            memcpy(residual, x, (size_t)(rows * s->hidden * elem));
            status = rms_norm(s->dtype, x, NULL, NULL, layer->input_norm, h, rows, s->hidden, s->eps);
        } else {
            status = rms_norm(s->dtype, x, residual, residual, layer->input_norm, h, rows, s->hidden, s->eps);
        }
        if (status == 0) status = linear(s, &layer->qkv, h, qkv);
        if (status == 0)
            status = rotary(s->dtype, qkv, qkv + q_size * elem, cos, sin, rows, s->heads, s->kv_heads, s->head_dim,
                            qkv_size, qkv_size);
        if (status != 0) break;
        for (int64_t r = 0; r < rows; r++) {
            const char *row = qkv + r * qkv_size * elem;
            memcpy(q + r * q_size * elem, row, (size_t)(q_size * elem));
            memcpy((char *)layer->k_cache + slots[r] * kv_size * elem, row + q_size * elem, (size_t)(kv_size * elem));
            memcpy((char *)layer->v_cache + slots[r] * kv_size * elem, row + (q_size + kv_size) * elem,
                   (size_t)(kv_size * elem));
        }
        status = paged_decode_attention(s->dtype, q, layer->k_cache, layer->v_cache, block_tables, context_lens, attn,
                                        rows, s->heads, s->kv_heads, s->head_dim, s->block_size, s->max_blocks,
                                        s->window, s->scale, s->threads);
        if (status == 0) status = linear(s, &layer->o, attn, x);
        if (status == 0) status = rms_norm(s->dtype, x, residual, residual, layer->post_norm, h, rows, s->hidden, s->eps);
        if (status == 0) status = linear(s, &layer->gate_up, h, gate_up);
        if (status == 0) status = silu_mul(s->dtype, gate_up, act, rows, s->inter);
        if (status == 0) status = linear(s, &layer->down, act, x);
    }
    free(h), free(qkv), free(q), free(attn), free(gate_up), free(act);
    return status;
}

/* Whether a logit's bits are a NaN (the library is built with -ffast-math, under which isnan()
 * may be assumed false). */
static inline int is_nan_bits(int dtype, const void *logits, int64_t i) {
    if (dtype == DTYPE_F32) {
        uint32_t bits;
        memcpy(&bits, (const float *)logits + i, sizeof bits);
        return (bits & 0x7fffffffu) > 0x7f800000u;
    }
    const uint16_t bits = ((const uint16_t *)logits)[i];
    return dtype == DTYPE_BF16 ? (bits & 0x7fffu) > 0x7f80u : (bits & 0x7fffu) > 0x7c00u;
}

static inline float logit_at(int dtype, const void *logits, int64_t i) {
    if (dtype == DTYPE_F32) return ((const float *)logits)[i];
    if (dtype == DTYPE_BF16) return bf16_to_f32(((const uint16_t *)logits)[i]);
    return (float)((const _Float16 *)logits)[i];
}

/* The index of the first largest of `n` logits, as torch's max(dim=-1).indices gives it: the first
 * NaN wins, since torch's max propagates NaN. */
static int64_t first_max(int dtype, const void *logits, int64_t n) {
    int64_t best = 0;
    float top = logit_at(dtype, logits, 0);
    if (is_nan_bits(dtype, logits, 0)) return 0;
    for (int64_t i = 1; i < n; i++) {
        const float v = logit_at(dtype, logits, i);
        if (v > top) best = i, top = v;
        else if (is_nan_bits(dtype, logits, i)) return i;
    }
    return best;
}

/* A greedy decode step's head: logits = linear(rms_norm(x + residual), head) for every row, and
 * tokens[r] the first largest of row r's first `vocab` logits. The same kernels, in the same order,
 * as the final norm, the LM head and torch's max in the layer-by-layer forward (bit for bit the
 * same tokens): one call instead of a dozen Python-level ones, each slowed by caches the step's
 * weights had just swept. Returns 0, -1 without scratch memory, or a kernel's error status. */
int decode_head(const decode_shape_t *s, const void *norm, const linear_t *head, const void *x, const void *residual,
                void *logits, int64_t vocab, int64_t *tokens) {
    const int64_t elem = elem_size(s->dtype), rows = s->rows;
    char *h = malloc((size_t)(rows * s->hidden * elem));
    char *summed = malloc((size_t)(rows * s->hidden * elem));
    int status = (h && summed) ? 0 : -1;
    if (status == 0) status = rms_norm(s->dtype, x, residual, summed, norm, h, rows, s->hidden, s->eps);
    if (status == 0) status = linear(s, head, h, logits);
    for (int64_t r = 0; r < rows && status == 0; r++)
        tokens[r] = first_max(s->dtype, (const char *)logits + r * head->out * elem, vocab);
    free(h), free(summed);
    return status;
}

/* A decode step's rows as token ids and positions, for decode_tokens. */
typedef struct {
    const int64_t *tokens;    /* [rows] */
    const void *embedding;    /* [vocab, hidden], in the activations' dtype */
    int64_t vocab;
    const int64_t *positions; /* [rows] */
    const void *cos, *sin;    /* [table_len, head_dim], in the activations' dtype */
    int64_t table_len;
} decode_tokens_t;

/* decode_layers from token ids and positions: each row's embedding and its position's rotary rows
 * are copied here from the tables (rows equal to what the embedding lookup and the rotary module
 * give, so the results are decode_layers' bit for bit), saving the step the Python-level calls
 * that made them. x and residual receive the layers' outputs ([rows, hidden] each). Returns -4
 * when a position lies past the rotary tables (the caller grows them and calls again), -5 for a
 * token id outside the embedding, else as decode_layers. */
int decode_tokens(const decode_shape_t *s, const decoder_layer_t *layers, int64_t n_layers, const decode_tokens_t *in,
                  void *x, void *residual, const int64_t *slots, const int64_t *block_tables,
                  const int64_t *context_lens) {
    const int64_t elem = elem_size(s->dtype), rows = s->rows, hidden = s->hidden, head_dim = s->head_dim;
    for (int64_t r = 0; r < rows; r++) {
        if (in->positions[r] < 0 || in->positions[r] >= in->table_len) return -4;
        if (in->tokens[r] < 0 || in->tokens[r] >= in->vocab) return -5;
    }
    char *cos = malloc((size_t)(rows * head_dim * elem)), *sin = malloc((size_t)(rows * head_dim * elem));
    int status = (cos && sin) ? 0 : -1;
    for (int64_t r = 0; r < rows && status == 0; r++) {
        memcpy((char *)x + r * hidden * elem, (const char *)in->embedding + in->tokens[r] * hidden * elem,
               (size_t)(hidden * elem));
        memcpy(cos + r * head_dim * elem, (const char *)in->cos + in->positions[r] * head_dim * elem,
               (size_t)(head_dim * elem));
        memcpy(sin + r * head_dim * elem, (const char *)in->sin + in->positions[r] * head_dim * elem,
               (size_t)(head_dim * elem));
    }
    if (status == 0)
        status = decode_layers(s, layers, n_layers, x, residual, 1, cos, sin, slots, block_tables, context_lens);
    free(cos), free(sin);
    return status;
}
