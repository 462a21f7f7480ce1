/*
 * Fused nearest-row kernel for lac.client.nearest (loaded with ctypes; no Python API).
 *
 * For each query q it computes, over every vocabulary row j, the float32 score
 *     s_j = n_j + sum_k q_k a_jk        (a = -2 v, n_j = ||v_j||^2 in float32)
 * and keeps, per query and per lane (row j mod 16), the smallest score, its row and the
 * smallest score of any other row in that lane.  Nothing is materialised: scores live in
 * registers, so the work is the GEMM arithmetic alone.  The Python side reduces the lanes
 * and re-ranks ambiguous queries exactly in float64; the rounding analysis there covers
 * any summation order, with or without fused multiply-add, so both vectorised paths give the
 * same answers: AVX-512 (a panel row is one 16-lane register; 12 queries per micro-kernel, about
 * twice the AVX2 path's arithmetic per cycle) where the CPU has it, else AVX2 + FMA.  Elsewhere
 * lac_nearest_scan returns -1 and the BLAS path runs instead.
 *
 * Layouts (all C-contiguous float32 unless stated):
 *   panels  [npanels][dim][16]  vocabulary rows 16 at a time, transposed (padding rows: 0)
 *   norms   [npanels * 16]      squared norms (padding rows: +inf, so they never win)
 *   queries [nmicro][dim][6]    queries 6 at a time, transposed (padding queries: anything)
 *   best, second [nmicro * 6][16] float32, idx [nmicro * 6][16] int32: per-lane state,
 *                               initialised by the caller (+inf, +inf, 0)
 */
#include <stdint.h>

#define LANES 16
#define MR 6

#if defined(__x86_64__) && defined(__GNUC__) && !defined(LAC_NO_SIMD)
#define HAVE_X86_SIMD 1
#endif

#ifdef HAVE_X86_SIMD
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline void update8(float *best, float *second, int32_t *idx, __m256 s, __m256i rows)
{
    __m256 b = _mm256_loadu_ps(best);
    __m256 lt = _mm256_cmp_ps(s, b, _CMP_LT_OQ);  /* strict: on a tie the earlier row stays */
    _mm256_storeu_ps(second, _mm256_min_ps(_mm256_loadu_ps(second), _mm256_max_ps(b, s)));
    _mm256_storeu_ps(best, _mm256_min_ps(s, b));
    __m256 old = _mm256_loadu_ps((const float *)idx);
    _mm256_storeu_ps((float *)idx, _mm256_blendv_ps(old, _mm256_castsi256_ps(rows), lt));
}

AVX2 static void run_avx2(const float *panels, const float *norms, int64_t p0, int64_t p1,
                          const float *queries, int64_t nmicro, int dim,
                          float *best, float *second, int32_t *idx)
{
    const __m256i lane_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lane_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t m = 0; m < nmicro; m++) {
        const float *q = queries + m * (int64_t)dim * MR;
        float *bm = best + m * MR * LANES, *sm = second + m * MR * LANES;
        int32_t *im = idx + m * MR * LANES;
        for (int64_t p = p0; p < p1; p++) {
            const float *a = panels + p * (int64_t)dim * LANES;
            __m256 n0 = _mm256_loadu_ps(norms + p * LANES), n1 = _mm256_loadu_ps(norms + p * LANES + 8);
            __m256 c00 = n0, c01 = n1, c10 = n0, c11 = n1, c20 = n0, c21 = n1;
            __m256 c30 = n0, c31 = n1, c40 = n0, c41 = n1, c50 = n0, c51 = n1;
            const float *qk = q;
            for (int k = 0; k < dim; k++, a += LANES, qk += MR) {
                __m256 a0 = _mm256_loadu_ps(a), a1 = _mm256_loadu_ps(a + 8);
                __m256 x;
                x = _mm256_broadcast_ss(qk + 0); c00 = _mm256_fmadd_ps(x, a0, c00); c01 = _mm256_fmadd_ps(x, a1, c01);
                x = _mm256_broadcast_ss(qk + 1); c10 = _mm256_fmadd_ps(x, a0, c10); c11 = _mm256_fmadd_ps(x, a1, c11);
                x = _mm256_broadcast_ss(qk + 2); c20 = _mm256_fmadd_ps(x, a0, c20); c21 = _mm256_fmadd_ps(x, a1, c21);
                x = _mm256_broadcast_ss(qk + 3); c30 = _mm256_fmadd_ps(x, a0, c30); c31 = _mm256_fmadd_ps(x, a1, c31);
                x = _mm256_broadcast_ss(qk + 4); c40 = _mm256_fmadd_ps(x, a0, c40); c41 = _mm256_fmadd_ps(x, a1, c41);
                x = _mm256_broadcast_ss(qk + 5); c50 = _mm256_fmadd_ps(x, a0, c50); c51 = _mm256_fmadd_ps(x, a1, c51);
            }
            __m256i base = _mm256_set1_epi32((int32_t)(p * LANES));
            __m256i r0 = _mm256_add_epi32(base, lane_lo), r1 = _mm256_add_epi32(base, lane_hi);
#define UPDATE_POINT(i, lo, hi)                                                  \
            update8(bm + (i) * LANES, sm + (i) * LANES, im + (i) * LANES, lo, r0); \
            update8(bm + (i) * LANES + 8, sm + (i) * LANES + 8, im + (i) * LANES + 8, hi, r1)
            UPDATE_POINT(0, c00, c01);
            UPDATE_POINT(1, c10, c11);
            UPDATE_POINT(2, c20, c21);
            UPDATE_POINT(3, c30, c31);
            UPDATE_POINT(4, c40, c41);
            UPDATE_POINT(5, c50, c51);
#undef UPDATE_POINT
        }
    }
}

#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline void update16(float *best, float *second, int32_t *idx, __m512 s, __m512i rows)
{
    __m512 b = _mm512_loadu_ps(best);
    __mmask16 lt = _mm512_cmp_ps_mask(s, b, _CMP_LT_OQ);  /* strict: on a tie the earlier row stays */
    _mm512_storeu_ps(second, _mm512_min_ps(_mm512_loadu_ps(second), _mm512_max_ps(b, s)));
    _mm512_storeu_ps(best, _mm512_min_ps(s, b));
    _mm512_storeu_si512(idx, _mm512_mask_blend_epi32(lt, _mm512_loadu_si512(idx), rows));
}

/* NQ queries (6 or 12: one or two consecutive micro-blocks of the [nmicro][dim][6] layout) against
 * panels [p0, p1); the state of query i is at best/second/idx + i * 16. */
#define AVX512_MICRO(NQ)                                                                              \
AVX512 static void micro512_##NQ(const float *panels, const float *norms, int64_t p0, int64_t p1,       \
                                  const float *q, int dim, float *bm, float *sm, int32_t *im)           \
{                                                                                                     \
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);     \
    for (int64_t p = p0; p < p1; p++) {                                                               \
        const float *a = panels + p * (int64_t)dim * LANES;                                           \
        __m512 n = _mm512_loadu_ps(norms + p * LANES);                                                \
        __m512 c[NQ];                                                                                 \
        for (int i = 0; i < NQ; i++)                                                                  \
            c[i] = n;                                                                                 \
        for (int k = 0; k < dim; k++) {                                                               \
            __m512 av = _mm512_loadu_ps(a + k * LANES);                                               \
            for (int i = 0; i < NQ; i++)                                                              \
                c[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[(i / MR) * dim * MR + k * MR + i % MR]), av, c[i]); \
        }                                                                                             \
        __m512i rows = _mm512_add_epi32(_mm512_set1_epi32((int32_t)(p * LANES)), lanes);              \
        for (int i = 0; i < NQ; i++)                                                                  \
            update16(bm + i * LANES, sm + i * LANES, im + i * LANES, c[i], rows);                     \
    }                                                                                                 \
}
AVX512_MICRO(12)
AVX512_MICRO(6)
#undef AVX512_MICRO

AVX512 static void run_avx512(const float *panels, const float *norms, int64_t p0, int64_t p1,
                              const float *queries, int64_t nmicro, int dim,
                              float *best, float *second, int32_t *idx)
{
    int64_t m = 0;
    for (; m + 2 <= nmicro; m += 2)
        micro512_12(panels, norms, p0, p1, queries + m * (int64_t)dim * MR, dim,
                    best + m * MR * LANES, second + m * MR * LANES, idx + m * MR * LANES);
    if (m < nmicro)
        micro512_6(panels, norms, p0, p1, queries + m * (int64_t)dim * MR, dim,
                   best + m * MR * LANES, second + m * MR * LANES, idx + m * MR * LANES);
}

static int have_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int have_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}
#endif

/* The best vectorised path this CPU and build run: 2 AVX-512, 1 AVX2 + FMA, 0 none. */
int lac_nearest_simd(void)
{
#ifdef HAVE_X86_SIMD
    return have_avx512() ? 2 : have_avx2();
#else
    return 0;
#endif
}

/*
 * Update the per-lane state of nmicro * 6 queries with vocabulary panels [0, npanels),
 * chunk_panels at a time (a chunk stays in the L2 cache while every query passes over it),
 * on path isa (0: the best this CPU runs, 1: AVX2, 2: AVX-512).
 * Returns 0, or -1 if this CPU (or build) does not run that path; the caller then uses BLAS.
 */
int lac_nearest_scan(const float *panels, const float *norms, int64_t npanels, int dim,
                     const float *queries, int64_t nmicro,
                     float *best, float *second, int32_t *idx, int64_t chunk_panels, int isa)
{
    int have = lac_nearest_simd();
    if (isa == 0)
        isa = have;
    if (isa < 1 || isa > have)
        return -1;
#ifdef HAVE_X86_SIMD
    if (chunk_panels < 1)
        chunk_panels = 1;
    for (int64_t p0 = 0; p0 < npanels; p0 += chunk_panels) {
        int64_t p1 = p0 + chunk_panels < npanels ? p0 + chunk_panels : npanels;
        if (isa == 2)
            run_avx512(panels, norms, p0, p1, queries, nmicro, dim, best, second, idx);
        else
            run_avx2(panels, norms, p0, p1, queries, nmicro, dim, best, second, idx);
    }
    return 0;
#else
    (void)panels; (void)norms; (void)npanels; (void)dim; (void)queries; (void)nmicro;
    (void)best; (void)second; (void)idx; (void)chunk_panels;
    return -1;
#endif
}
