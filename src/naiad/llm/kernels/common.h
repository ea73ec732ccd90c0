/* What naiad's CPU kernels share: the storage types and their conversions to float32. */
#ifndef NAIAD_KERNELS_COMMON_H
#define NAIAD_KERNELS_COMMON_H

#include <stdint.h>
#include <string.h>

enum { DTYPE_F32 = 0, DTYPE_BF16 = 1, DTYPE_F16 = 2 };

static inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = (uint32_t)v << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest, ties to even, as torch does */
    return (uint16_t)(bits >> 16);
}

/* Load `n` elements of storage type `dtype` at `src` into float32 `dst`. */
static inline void load_f32(int dtype, const void *src, float *dst, int64_t n) {
    if (dtype == DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        const _Float16 *s = (const _Float16 *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    }
}

static inline void store_f32(int dtype, const float *src, void *dst, int64_t n) {
    if (dtype == DTYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (dtype == DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = f32_to_bf16(src[i]);
    } else {
        _Float16 *d = (_Float16 *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = (_Float16)src[i];
    }
}

/* `v` rounded to storage type `dtype` and back: what a torch op in that type stores. */
static inline float round_to(int dtype, float v) {
    if (dtype == DTYPE_BF16) return bf16_to_f32(f32_to_bf16(v));
    if (dtype == DTYPE_F16) return (float)(_Float16)v;
    return v;
}

static inline int64_t elem_size(int dtype) { return dtype == DTYPE_F32 ? 4 : 2; }

#endif
