/* The hf engine's CPU kernels (coa.rollout.kernel): decode attention over a paged KV cache, and the fused
 * decode layer's elementwise work (coa.rollout.fused). T is bfloat16 (as uint16) or float32.
 *
 * paged_attention_T   one query token per row over the row's own cached positions
 *   q      T [S, Hk, R, D]        the R query heads that share KV head h, for each row s
 *   k, v   T [N, Hk, BS, D]       the block pools of one layer
 *   table  int32 [S, nb]          row s's blocks, in position order
 *   lens   int32 [S]              row s attends to its positions 0 .. lens[s]-1
 *   out    float32 [S, Hk, R, D]
 * decode_attention_T  the same after RoPE on the new token's q and k and the write of its k and v into the
 *   pools: qkv T [S, (Hk*R + 2*Hk) * D] (the fused projection: q heads, k heads, v heads), cos/sin float32
 *   [S, D/2] (rotate-half RoPE at each row's position), pos int32 [S] (the new token's position: it is written
 *   there and the row attends to 0 .. pos); out T [S, Hk*R*D].
 * rope_write_T        RoPE and the cache write for N new tokens of any rows: qkv T [N, (Hk*R + 2*Hk) * D],
 *   cos/sin float32 [N, D/2], dest_block/dest_offset int64 [N] (where token t's key and value go); q T [N, Hk*R*D]
 *   receives the rotated queries (the attention over the rows' blocks is the caller's)
 * add_rms_norm_T      x += y (when y is given), h = x / rms(x) * w, per row of H
 * silu_mul_T          out = silu(gu[:, :I]) * gu[:, I:]
 *
 * scratch float32 [threads, SCRATCH(R, D, max_len)] for the attention kernels (kernel.py's _scratch): every
 * buffer whose size depends on R or D lives there, so no shape the caller admits overruns a fixed array (the
 * AVX-512 paths' register arrays hold R <= 16 and D = 64: FAST_* checks both).
 * Each (row, KV head) is one task computed by one thread in a fixed order (scores, softmax, values), so a
 * row's result does not depend on the batch or the thread count. Only a row's own positions are read.
 * Scores and sums are float32. With AVX-512 (and AVX512_BF16 for bf16), D = 64 and BS = 16, hand-written
 * vector paths; elsewhere plain loops the compiler vectorises.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* one thread's scratch, in floats: attend's R score rows (stride ld), a key or value row, q in float32, the
 * accumulators and 1/sum per row; then decode_attention's output and its rotated q (T, at most a float each) */
#define SCRATCH_ATTEND(R, D, ld) ((long)(R) * (ld) + (long)(2 * (R) + 1) * (D) + (R))
#define SCRATCH(R, D, ld) (SCRATCH_ATTEND(R, D, ld) + 2L * (R) * (D))

static inline float from_bf16(uint16_t x) {
    union { uint32_t u; float f; } c;
    c.u = ((uint32_t)x) << 16;
    return c.f;
}
static inline uint16_t to_bf16(float f) {  /* round to nearest even, as torch */
    union { uint32_t u; float f; } c;
    c.f = f;
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40u);  /* NaN stays NaN */
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}
static inline float from_f32(float x) { return x; }
static inline float to_f32(float x) { return x; }

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
                 float *qf, float *norm, float *o) {                                                           \
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
/* a block of this head ahead of the one being read (blocks are scattered in the pool: without it each block
 * starts with a miss); issued a line or two at a time so the prefetches do not queue behind each other */
static inline void prefetch_line(const void *p, long offset) { __builtin_prefetch((const char *)p + offset, 0, 3); }

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

/* the values pass of the D = 64 path: o[r] = sum_j p[r, j] v_j * norm[r] */
#define VALUES64(T, LOAD)                                                                                      \
    __m512 acc[16][4];                                                                                         \
    for (int r = 0; r < R; r++) for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();                  \
    for (int j0 = 0; j0 < n; j0 += BS) {                                                                       \
        const T *vblk = vb + blocks[j0 / BS] * block + head_off;                                              \
        const T *next = j0 + BS < n ? vb + blocks[j0 / BS + 1] * block + head_off : 0;                         \
        const int m = n - j0 < BS ? n - j0 : BS;                                                               \
        for (int j = 0; j < m; j++) {                                                                          \
            if (next) for (long l = 0; l < (long)sizeof(T); l++) prefetch_line(next, ((long)j * sizeof(T) + l) * 64); \
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
    }

#define AVX512_64(NAME, T, LOAD)                                                                               \
static void NAME(const T *qq, const T *kb, const T *vb, const int32_t *blocks, int n, int R, int BS,           \
                 long block, long head_off, float scale, float *sc, long ld, float *norm, float *o) {          \
    __m512 q[16][4];                                                                                           \
    for (int r = 0; r < R; r++) LOAD(qq + (long)r * 64, q[r]);                                                 \
    for (int j0 = 0; j0 < n; j0 += BS) {                                                                       \
        const T *kblk = kb + blocks[j0 / BS] * block + head_off;                                              \
        const T *next = j0 + BS < n ? kb + blocks[j0 / BS + 1] * block + head_off : 0;                         \
        const int m = n - j0 < BS ? n - j0 : BS;                                                               \
        for (int j = 0; j < m; j++) {                                                                          \
            if (next) for (long l = 0; l < (long)sizeof(T); l++) prefetch_line(next, ((long)j * sizeof(T) + l) * 64); \
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
    VALUES64(T, LOAD)                                                                                          \
}
AVX512_64(avx512_64_f32, float, load_row64_f32)
#if !defined(__AVX512BF16__)
AVX512_64(avx512_64_bf16, uint16_t, load_row64_bf16)
#endif
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
/* 16 vectors -> one vector whose lane PERM16[j] is the sum of v[j]'s 16 lanes (four rounds of pairwise
 * permute-and-add: 15 adds instead of 16 horizontal reductions) */
static inline __m512 hsum16(__m512 *v) {
    const __m512i a0 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i a1 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i b0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i b1 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i c0 = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i c1 = _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m512i d0 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i d1 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++)
        w[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[2 * i], a0, v[2 * i + 1]),
                             _mm512_permutex2var_ps(v[2 * i], a1, v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        x[i] = _mm512_add_ps(_mm512_permutex2var_ps(w[2 * i], b0, w[2 * i + 1]),
                             _mm512_permutex2var_ps(w[2 * i], b1, w[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        y[i] = _mm512_add_ps(_mm512_permutex2var_ps(x[2 * i], c0, x[2 * i + 1]),
                             _mm512_permutex2var_ps(x[2 * i], c1, x[2 * i + 1]));
    return _mm512_add_ps(_mm512_permutex2var_ps(y[0], d0, y[1]), _mm512_permutex2var_ps(y[0], d1, y[1]));
}
/* the key order of hsum16's lanes, undone by one permute: lane l of the result holds key ORDER16[l] */
static const int32_t ORDER16[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* bf16, D = 64: scores by AVX512_BF16 dot products of bf16 pairs (q and k as stored, no conversion), 16 keys of
 * a block reduced together; values as the f32 path. BS must be 16 (the caller checks). */
static void avx512_64_bf16(const uint16_t *qq, const uint16_t *kb, const uint16_t *vb, const int32_t *blocks,
                           int n, int R, int BS, long block, long head_off, float scale, float *sc, long ld,
                           float *norm, float *o) {
    __m512bh q[16][2];
    for (int r = 0; r < R; r++) {
        q[r][0] = (__m512bh)_mm512_loadu_si512(qq + (long)r * 64);
        q[r][1] = (__m512bh)_mm512_loadu_si512(qq + (long)r * 64 + 32);
    }
    const __m512i order = _mm512_loadu_si512(ORDER16);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int j0 = 0; j0 < n; j0 += 16) {
        const uint16_t *kblk = kb + blocks[j0 / 16] * block + head_off;
        const uint16_t *next = j0 + 16 < n ? kb + blocks[j0 / 16 + 1] * block + head_off : 0;
        const int m = n - j0 < 16 ? n - j0 : 16;
        if (next) for (int l = 0; l < 32; l++) prefetch_line(next, 64L * l);
        for (int r = 0; r < R; r++) {
            __m512 a[16];
            int j = 0;
            for (; j < m; j++) {
                __m512bh k0 = (__m512bh)_mm512_loadu_si512(kblk + (long)j * 64);
                __m512bh k1 = (__m512bh)_mm512_loadu_si512(kblk + (long)j * 64 + 32);
                a[j] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), q[r][0], k0), q[r][1], k1);
            }
            for (; j < 16; j++) a[j] = _mm512_setzero_ps();
            __m512 s = _mm512_mul_ps(_mm512_permutexvar_ps(order, hsum16(a)), vscale);
            _mm512_mask_storeu_ps(sc + (long)r * ld + j0, (__mmask16)((1u << m) - 1), s);
        }
    }
    softmax_rows(sc, ld, R, n, norm);
    VALUES64(uint16_t, load_row64_bf16)
}
#define BF16_FAST_BS(BS) ((BS) == 16)
#elif defined(__AVX512F__)
#define BF16_FAST_BS(BS) 1
#endif

/* one (row, KV head) task of attention: the fast path where it applies, else the plain loops */
#if defined(__AVX512F__)
#define FAST_bf16 if (D == 64 && R <= 16 && BF16_FAST_BS(BS)) { avx512_64_bf16(qq, k, v, blocks, n, R, BS, block, head_off, scale, sc, ld, norm, o); return; }
#define FAST_f32 if (D == 64 && R <= 16) { avx512_64_f32(qq, k, v, blocks, n, R, BS, block, head_off, scale, sc, ld, norm, o); return; }
#else
#define FAST_bf16
#define FAST_f32
#endif
#define ATTEND(T, SUFFIX)                                                                                      \
static void attend_##SUFFIX(const T *qq, const T *k, const T *v, const int32_t *blocks, int n, int R, int D,   \
                            int BS, long block, long head_off, float scale, float *sc, long ld, float *o) {     \
    float *row = sc + (long)R * ld, *qf = row + D, *acc = qf + (long)R * D, *norm = acc + (long)R * D;         \
    FAST_##SUFFIX                                                                                              \
    generic_##SUFFIX(qq, k, v, blocks, n, R, D, BS, block, head_off, scale, sc, ld, row, acc, qf, norm, o);     \
}
ATTEND(uint16_t, bf16)
ATTEND(float, f32)

#define ENTRY(T, SUFFIX)                                                                                       \
void paged_attention_##SUFFIX(const T *q, const T *k, const T *v, const int32_t *table, int nb,                \
                              const int32_t *lens, int S, int Hk, int R, int D, int BS, int max_len,           \
                              float scale, float *out, float *scratch, int threads) {                          \
    const long block = (long)Hk * BS * D, head = (long)BS * D;                                                 \
    const long per = SCRATCH(R, D, max_len);                                                                   \
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1)")                                      \
    for (long task = 0; task < (long)S * Hk; task++) {                                                         \
        const int s = (int)(task / Hk), h = (int)(task % Hk);                                                  \
        float *sc = scratch + (long)omp_get_thread_num() * per;                                                \
        attend_##SUFFIX(q + task * R * D, k, v, table + (long)s * nb, lens[s], R, D, BS, block, h * head,      \
                        scale, sc, max_len, out + task * R * D);                                               \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void decode_attention_##SUFFIX(const T *qkv, const float *cosv, const float *sinv, T *k, T *v,                 \
                               const int32_t *table, int nb, const int32_t *pos, int S, int Hk, int R, int D,  \
                               int BS, int max_len, float scale, T *out, float *scratch, int threads) {        \
    const long block = (long)Hk * BS * D, head = (long)BS * D, width = (long)(Hk * R + 2 * Hk) * D;            \
    const long per = SCRATCH(R, D, max_len);                                                                   \
    const int half = D / 2;                                                                                    \
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1)")                                      \
    for (long task = 0; task < (long)S * Hk; task++) {                                                         \
        const int s = (int)(task / Hk), h = (int)(task % Hk), p = pos[s];                                      \
        float *sc = scratch + (long)omp_get_thread_num() * per;                                                \
        float *o = sc + SCRATCH_ATTEND(R, D, max_len);                                                         \
        T *qr = (T *)(o + (long)R * D);                                                                        \
        const T *src = qkv + s * width;                                                                        \
        const float *c = cosv + (long)s * half, *sn = sinv + (long)s * half;                                   \
        const int32_t *blocks = table + (long)s * nb;                                                          \
        T *kd = k + blocks[p / BS] * block + h * head + (long)(p % BS) * D;                                    \
        T *vd = v + blocks[p / BS] * block + h * head + (long)(p % BS) * D;                                    \
        for (int r = 0; r <= R; r++) {  /* the R query heads, then the key head: rotate-half RoPE */           \
            const T *x = r < R ? src + (long)(h * R + r) * D : src + (long)(Hk * R + h) * D;                   \
            T *y = r < R ? qr + (long)r * D : kd;                                                              \
            for (int i = 0; i < half; i++) {                                                                   \
                const float a = from_##SUFFIX(x[i]), b = from_##SUFFIX(x[i + half]);                           \
                y[i] = to_##SUFFIX(a * c[i] - b * sn[i]);                                                      \
                y[i + half] = to_##SUFFIX(b * c[i] + a * sn[i]);                                               \
            }                                                                                                  \
        }                                                                                                      \
        memcpy(vd, src + (long)(Hk * R + Hk + h) * D, sizeof(T) * D);                                          \
        attend_##SUFFIX(qr, k, v, blocks, p + 1, R, D, BS, block, h * head, scale, sc, max_len, o);            \
        T *dst = out + (long)s * Hk * R * D + (long)h * R * D;                                                 \
        for (long i = 0; i < (long)R * D; i++) dst[i] = to_##SUFFIX(o[i]);                                     \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void rope_write_##SUFFIX(const T *qkv, const float *cosv, const float *sinv, T *k, T *v, const int64_t *dest_block,\
                         const int64_t *dest_offset, int N, int Hk, int R, int D, int BS, T *q, int threads) {  \
    const long block = (long)Hk * BS * D, head = (long)BS * D, width = (long)(Hk * R + 2 * Hk) * D;            \
    const int half = D / 2;                                                                                    \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                          \
    for (int t = 0; t < N; t++) {                                                                              \
        const T *src = qkv + t * width;                                                                        \
        const float *c = cosv + (long)t * half, *sn = sinv + (long)t * half;                                   \
        T *kbase = k + dest_block[t] * block + dest_offset[t] * D, *vbase = v + dest_block[t] * block + dest_offset[t] * D; \
        for (int hh = 0; hh < Hk * R + Hk; hh++) {  /* the query heads, then the key heads */                  \
            const T *x = src + (long)hh * D;                                                                   \
            T *y = hh < Hk * R ? q + (long)t * Hk * R * D + (long)hh * D : kbase + (hh - Hk * R) * head;       \
            for (int i = 0; i < half; i++) {                                                                   \
                const float a = from_##SUFFIX(x[i]), b = from_##SUFFIX(x[i + half]);                           \
                y[i] = to_##SUFFIX(a * c[i] - b * sn[i]);                                                      \
                y[i + half] = to_##SUFFIX(b * c[i] + a * sn[i]);                                               \
            }                                                                                                  \
        }                                                                                                      \
        for (int h = 0; h < Hk; h++) memcpy(vbase + h * head, src + (long)(Hk * R + Hk + h) * D, sizeof(T) * D); \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void add_rms_norm_##SUFFIX(T *x, const T *y, const T *w, float eps, T *h, int S, int H, int threads) {         \
    _Pragma("omp parallel for num_threads(threads) schedule(static)")                                          \
    for (int s = 0; s < S; s++) {                                                                              \
        T *xs = x + (long)s * H, *hs = h + (long)s * H;                                                        \
        float total = 0.f;                                                                                     \
        if (y) {                                                                                               \
            const T *ys = y + (long)s * H;                                                                     \
            for (int i = 0; i < H; i++) xs[i] = to_##SUFFIX(from_##SUFFIX(xs[i]) + from_##SUFFIX(ys[i]));       \
        }                                                                                                      \
        for (int i = 0; i < H; i++) { const float a = from_##SUFFIX(xs[i]); total += a * a; }                  \
        const float inv = 1.f / sqrtf(total / H + eps);                                                        \
        for (int i = 0; i < H; i++) hs[i] = to_##SUFFIX(from_##SUFFIX(xs[i]) * inv * from_##SUFFIX(w[i]));     \
    }                                                                                                          \
}
ENTRY(uint16_t, bf16)
ENTRY(float, f32)

/* out = silu(gu[:, :I]) * gu[:, I:] (AVX-512 only: the plain C path would call scalar expf per element;
 * elsewhere the engine uses torch for it). Returns 0 where not built. */
#if defined(__AVX512F__)
static inline __m512 silu512(__m512 g) {  /* g / (1 + exp(-g)), exp of a non-positive argument only */
    const __m512 one = _mm512_set1_ps(1.f);
    __m512 e = exp512(_mm512_min_ps(g, _mm512_sub_ps(_mm512_setzero_ps(), g)));  /* exp(-|g|) */
    __mmask16 pos = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_GE_OQ);
    /* sigmoid(g) = 1 / (1 + e) for g >= 0, e / (1 + e) for g < 0 */
    __m512 sig = _mm512_div_ps(_mm512_mask_blend_ps(pos, e, one), _mm512_add_ps(one, e));
    return _mm512_mul_ps(g, sig);
}
static inline __m512 load16_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline void store16_bf16(uint16_t *p, __m512 x) {
    uint16_t tmp[16];
    float f[16];
    _mm512_storeu_ps(f, x);
    for (int i = 0; i < 16; i++) tmp[i] = to_bf16(f[i]);
    memcpy(p, tmp, sizeof(tmp));
}
int silu_mul_bf16(const uint16_t *gu, uint16_t *out, int S, int I, int threads) {
    if (I % 16) return 0;
    _Pragma("omp parallel for num_threads(threads) schedule(static)")
    for (int s = 0; s < S; s++)
        for (int i = 0; i < I; i += 16) {
            const uint16_t *g = gu + (long)s * 2 * I + i;
            store16_bf16(out + (long)s * I + i, _mm512_mul_ps(silu512(load16_bf16(g)), load16_bf16(g + I)));
        }
    return 1;
}
int silu_mul_f32(const float *gu, float *out, int S, int I, int threads) {
    if (I % 16) return 0;
    _Pragma("omp parallel for num_threads(threads) schedule(static)")
    for (int s = 0; s < S; s++)
        for (int i = 0; i < I; i += 16) {
            const float *g = gu + (long)s * 2 * I + i;
            _mm512_storeu_ps(out + (long)s * I + i, _mm512_mul_ps(silu512(_mm512_loadu_ps(g)), _mm512_loadu_ps(g + I)));
        }
    return 1;
}
#else
int silu_mul_bf16(const uint16_t *gu, uint16_t *out, int S, int I, int threads) { return 0; }
int silu_mul_f32(const float *gu, float *out, int S, int I, int threads) { return 0; }
#endif
