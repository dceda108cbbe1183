/* Decode attention over a paged KV cache (coa.rollout.kernel): one query token per row, grouped-query heads.
 *
 * q      T [S, Hk, R, D]          the R query heads that share KV head h, for each row s
 * k, v   T [N, Hk, BS, D]         the block pools of one layer (T = bfloat16 as uint16, or float32)
 * table  int32 [S, nb]            row s's blocks, in position order
 * lens   int32 [S]                row s attends to its positions 0 .. lens[s]-1
 * out    float32 [S, Hk, R, D]
 * scratch float32 [threads, R * max_len + (2 * R + 1) * D]
 *
 * Each (row, KV head) is one task computed by one thread in a fixed order (scores, softmax, values), so a
 * row's result does not depend on the batch or the thread count. Only a row's own positions are read.
 * Scores and sums are float32. With AVX-512 (and AVX512_BF16 for bf16) and D = 64, hand-written vector
 * paths; elsewhere plain loops the compiler vectorises.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

static inline float from_bf16(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = ((uint32_t)x) << 16;
    return c.f;
}
static inline float from_f32(float x) { return x; }

#if defined(__AVX512F__)
/* exp of 16 floats <= 0 (scores minus their max): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p the degree-6
 * Taylor polynomial (relative error < 2e-7); below -87 it is 0. Written out because libm's vector expf is
 * only reached through -ffast-math, which this library must not be built with (see kernel.py). */
static inline __m512 exp512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  /* ln2 split in two for exactness */
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_maskz_mov_ps(~under, _mm512_scalef_ps(p, n));
}
#endif

/* softmax of each of R score rows of length n (stride ld), in place; returns 1 / sum per row in norm */
static void softmax_rows(float *sc, long ld, int R, int n, float *norm) {
    for (int r = 0; r < R; r++) {
        float *sr = sc + (long)r * ld, m = -3.0e38f, total = 0.f;
        int j = 0;
#if defined(__AVX512F__)
        __m512 vm = _mm512_set1_ps(m);
        for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(sr + j));
        m = _mm512_reduce_max_ps(vm);
#endif
        for (; j < n; j++) m = sr[j] > m ? sr[j] : m;
        j = 0;
#if defined(__AVX512F__)
        __m512 vt = _mm512_setzero_ps();
        vm = _mm512_set1_ps(m);
        for (; j + 16 <= n; j += 16) {
            __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sr + j), vm));
            _mm512_storeu_ps(sr + j, e);
            vt = _mm512_add_ps(vt, e);
        }
        total = _mm512_reduce_add_ps(vt);
#endif
        for (; j < n; j++) { float e = expf(sr[j] - m); sr[j] = e; total += e; }
        norm[r] = total > 0.f ? 1.f / total : 0.f;
    }
}

#define GENERIC(NAME, T, CONV)                                                                                 \
static void NAME(const T *qq, const T *kb, const T *vb, const int32_t *blocks, int n, int R, int D, int BS,    \
                 long block, long head_off, float scale, float *sc, long ld, float *row, float *acc,           \
                 float *qf, float *o) {                                                                        \
    float norm[64];                                                                                            \
    for (long i = 0; i < (long)R * D; i++) qf[i] = CONV(qq[i]);                                                \
    for (int j = 0; j < n; j++) {                                                                              \
        const T *kr = kb + blocks[j / BS] * block + head_off + (long)(j % BS) * D;                             \
        for (int d = 0; d < D; d++) row[d] = CONV(kr[d]);                                                      \
        for (int r = 0; r < R; r++) {                                                                          \
            const float *qr = qf + (long)r * D;                                                                \
            float dot = 0.f;                                                                                   \
            for (int d = 0; d < D; d++) dot += qr[d] * row[d];                                                 \
            sc[(long)r * ld + j] = dot * scale;                                                                \
        }                                                                                                      \
    }                                                                                                          \
    softmax_rows(sc, ld, R, n, norm);                                                                          \
    memset(acc, 0, sizeof(float) * R * D);                                                                     \
    for (int j = 0; j < n; j++) {                                                                              \
        const T *vr = vb + blocks[j / BS] * block + head_off + (long)(j % BS) * D;                             \
        for (int d = 0; d < D; d++) row[d] = CONV(vr[d]);                                                      \
        for (int r = 0; r < R; r++) {                                                                          \
            const float p = sc[(long)r * ld + j];                                                              \
            float *ar = acc + (long)r * D;                                                                     \
            for (int d = 0; d < D; d++) ar[d] += p * row[d];                                                   \
        }                                                                                                      \
    }                                                                                                          \
    for (int r = 0; r < R; r++)                                                                                \
        for (int d = 0; d < D; d++) o[(long)r * D + d] = acc[(long)r * D + d] * norm[r];                       \
}
GENERIC(generic_bf16, uint16_t, from_bf16)
GENERIC(generic_f32, float, from_f32)

#if defined(__AVX512F__)
/* the next block of this head (blocks are scattered in the pool: without it each block starts with a miss) */
static inline void prefetch_rows(const void *p, long bytes) {
    for (long i = 0; i < bytes; i += 64) __builtin_prefetch((const char *)p + i, 0, 3);
}

/* D = 64: a key or value row is 4 float32 vectors (or 2 bf16 vectors). */
static inline void load_row64_bf16(const uint16_t *p, __m512 *x) {
    for (int i = 0; i < 4; i++) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(p + 16 * i));
        x[i] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
}
static inline void load_row64_f32(const float *p, __m512 *x) {
    for (int i = 0; i < 4; i++) x[i] = _mm512_loadu_ps(p + 16 * i);
}

#define AVX512_64(NAME, T, LOAD, CONV)                                                                         \
static void NAME(const T *qq, const T *kb, const T *vb, const int32_t *blocks, int n, int R, int BS,           \
                 long block, long head_off, float scale, float *sc, long ld, float *o) {                       \
    float norm[64];                                                                                            \
    __m512 q[16][4];                                                                                           \
    for (int r = 0; r < R; r++) LOAD(qq + (long)r * 64, q[r]);                                                 \
    for (int j0 = 0; j0 < n; j0 += BS) {                                                                       \
        const T *kblk = kb + blocks[j0 / BS] * block + head_off;                                              \
        const int m = n - j0 < BS ? n - j0 : BS;                                                               \
        if (j0 + BS < n) prefetch_rows(kb + blocks[j0 / BS + 1] * block + head_off, BS * 64 * (long)sizeof(T)); \
        for (int j = 0; j < m; j++) {                                                                          \
            __m512 x[4];                                                                                       \
            LOAD(kblk + (long)j * 64, x);                                                                      \
            for (int r = 0; r < R; r++) {                                                                      \
                __m512 a = _mm512_mul_ps(q[r][0], x[0]);                                                       \
                a = _mm512_fmadd_ps(q[r][1], x[1], a);                                                         \
                a = _mm512_fmadd_ps(q[r][2], x[2], a);                                                         \
                a = _mm512_fmadd_ps(q[r][3], x[3], a);                                                         \
                sc[(long)r * ld + j0 + j] = _mm512_reduce_add_ps(a) * scale;                                   \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    softmax_rows(sc, ld, R, n, norm);                                                                          \
    __m512 acc[16][4];                                                                                         \
    for (int r = 0; r < R; r++) for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();                  \
    for (int j0 = 0; j0 < n; j0 += BS) {                                                                       \
        const T *vblk = vb + blocks[j0 / BS] * block + head_off;                                              \
        const int m = n - j0 < BS ? n - j0 : BS;                                                               \
        if (j0 + BS < n) prefetch_rows(vb + blocks[j0 / BS + 1] * block + head_off, BS * 64 * (long)sizeof(T)); \
        for (int j = 0; j < m; j++) {                                                                          \
            __m512 x[4];                                                                                       \
            LOAD(vblk + (long)j * 64, x);                                                                      \
            for (int r = 0; r < R; r++) {                                                                      \
                const __m512 p = _mm512_set1_ps(sc[(long)r * ld + j0 + j]);                                   \
                for (int i = 0; i < 4; i++) acc[r][i] = _mm512_fmadd_ps(p, x[i], acc[r][i]);                  \
            }                                                                                                  \
        }                                                                                                      \
    }                                                                                                          \
    for (int r = 0; r < R; r++) {                                                                              \
        const __m512 z = _mm512_set1_ps(norm[r]);                                                              \
        for (int i = 0; i < 4; i++) _mm512_storeu_ps(o + (long)r * 64 + 16 * i, _mm512_mul_ps(acc[r][i], z)); \
    }                                                                                                          \
}
AVX512_64(avx512_64_bf16, uint16_t, load_row64_bf16, from_bf16)
AVX512_64(avx512_64_f32, float, load_row64_f32, from_f32)
#endif

#define ENTRY(NAME, T, GENERIC_FN, FAST_FN)                                                                    \
void NAME(const T *q, const T *k, const T *v, const int32_t *table, int nb, const int32_t *lens, int S,        \
          int Hk, int R, int D, int BS, int max_len, float scale, float *out, float *scratch, int threads) {   \
    const long block = (long)Hk * BS * D, head = (long)BS * D, per = (long)R * max_len + (long)(2 * R + 1) * D; \
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1)")                                      \
    for (long task = 0; task < (long)S * Hk; task++) {                                                         \
        const int s = (int)(task / Hk), h = (int)(task % Hk);                                                  \
        float *sc = scratch + (long)omp_get_thread_num() * per;                                                \
        float *row = sc + (long)R * max_len, *qf = row + D, *acc = qf + (long)R * D;                          \
        const T *qq = q + task * R * D;                                                                        \
        const int32_t *blocks = table + (long)s * nb;                                                          \
        float *o = out + task * R * D;                                                                         \
        FAST_FN                                                                                                \
        GENERIC_FN(qq, k, v, blocks, lens[s], R, D, BS, block, h * head, scale, sc, max_len, row, acc, qf, o); \
    }                                                                                                          \
}

#if defined(__AVX512F__)
#define FAST(F) if (D == 64 && R <= 16) { F(qq, k, v, blocks, lens[s], R, BS, block, h * head, scale, sc, max_len, o); continue; }
#else
#define FAST(F)
#endif
ENTRY(paged_attention_bf16, uint16_t, generic_bf16, FAST(avx512_64_bf16))
ENTRY(paged_attention_f32, float, generic_f32, FAST(avx512_64_f32))
