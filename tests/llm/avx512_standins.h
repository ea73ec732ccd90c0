/* Plain-C stand-ins for the AVX-512 intrinsics q8_linear.c uses: to run its VNNI path's logic on a CPU without it. */
#include <math.h>
#include <stdint.h>
#include <string.h>
typedef struct { float f[16]; } __m512;
typedef struct { int32_t i[16]; } __m512i;
typedef struct { uint16_t h[16]; } __m256i;
typedef uint16_t __mmask16;
static inline __m512 _mm512_setzero_ps(void) { __m512 r; memset(&r, 0, sizeof r); return r; }
static inline __m512i _mm512_setzero_si512(void) { __m512i r; memset(&r, 0, sizeof r); return r; }
static inline __m512i _mm512_loadu_si512(const void *p) { __m512i r; memcpy(&r, p, 64); return r; }
static inline __m256i _mm256_loadu_si256(const __m256i *p) { __m256i r; memcpy(&r, p, 32); return r; }
static inline __m512i _mm512_set1_epi32(int32_t v) { __m512i r; for (int k = 0; k < 16; k++) r.i[k] = v; return r; }
static inline __m512 _mm512_set1_ps(float v) { __m512 r; for (int k = 0; k < 16; k++) r.f[k] = v; return r; }
static inline __m512i _mm512_dpbusd_epi32(__m512i acc, __m512i a, __m512i b) {
    const uint8_t *u = (const uint8_t *)&a; const int8_t *s = (const int8_t *)&b;
    for (int k = 0; k < 16; k++) for (int j = 0; j < 4; j++) acc.i[k] += (int32_t)u[4 * k + j] * s[4 * k + j];
    return acc;
}
static inline __m512 _mm512_cvtph_ps(__m256i h) {
    __m512 r; for (int k = 0; k < 16; k++) { _Float16 v; memcpy(&v, &h.h[k], 2); r.f[k] = (float)v; } return r;
}
static inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) { for (int k = 0; k < 16; k++) c.f[k] = fmaf(a.f[k], b.f[k], c.f[k]); return c; }
static inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { for (int k = 0; k < 16; k++) a.f[k] *= b.f[k]; return a; }
static inline __m512 _mm512_add_ps(__m512 a, __m512 b) { for (int k = 0; k < 16; k++) a.f[k] += b.f[k]; return a; }
static inline __m512i _mm512_add_epi32(__m512i a, __m512i b) { for (int k = 0; k < 16; k++) a.i[k] += b.i[k]; return a; }
static inline __m512i _mm512_sub_epi32(__m512i a, __m512i b) { for (int k = 0; k < 16; k++) a.i[k] -= b.i[k]; return a; }
static inline __m512i _mm512_slli_epi32(__m512i a, int n) { for (int k = 0; k < 16; k++) a.i[k] = (int32_t)((uint32_t)a.i[k] << n); return a; }
static inline __m512 _mm512_cvtepi32_ps(__m512i a) { __m512 r; for (int k = 0; k < 16; k++) r.f[k] = (float)a.i[k]; return r; }
static inline __m512 _mm512_maskz_loadu_ps(__mmask16 m, const float *p) { __m512 r; for (int k = 0; k < 16; k++) r.f[k] = (m >> k) & 1 ? p[k] : 0.0f; return r; }
static inline void _mm512_mask_storeu_ps(float *p, __mmask16 m, __m512 a) { for (int k = 0; k < 16; k++) if ((m >> k) & 1) p[k] = a.f[k]; }
