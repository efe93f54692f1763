/* A static FP8 E4M3 linear for x86 CPUs with AVX512-BF16, in one call.
 *
 * y[m, n] = bf16(scale[n] * sum_k q(x[m, k]) * w[n, k]), where q is vLLM's static input
 * quantization (times the scale's reciprocal in float32, clamped to +-448, rounded to the
 * nearest E4M3 value, ties to even) and w the layer's E4M3 weight. Every E4M3 value is exact
 * in BF16 and every product of two is exact in float32, so VDPBF16PS (BF16 pairs multiplied,
 * summed into float32) over the E4M3 values is the FP8 GEMM with float32 accumulation; the
 * scales are applied to the float32 sums and the result rounded to BF16 once, as a GPU's FP8
 * GEMM writes it. The weight stays BF16-sized (a float32 GEMM reads twice the bytes) and the
 * input is quantized inside the call (no separate pass over it).
 *
 * Built and loaded by cpu_fp8_native.py, which packs the weight (eq_pack_layout) and checks
 * this library against torch once a process before using it.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#define COLUMNS 64 /* the packed weight's tile: 4 vectors of 16 columns */
#define ROWS 6     /* input rows a tile is multiplied with at once */

/* The packed weight's layout, for the packer: [N / COLUMNS][K / 2][COLUMNS][2] BF16 values
 * (N and K padded with zeros), each 32-bit lane a pair of consecutive k. */
int eq_columns(void) { return COLUMNS; }

/* 16 float32 inputs quantized as vLLM quantizes a static FP8 input, as BF16 bits in the low
 * half of each lane. */
static inline __m512i quantize16(__m512 f, __m512 inverse) {
    const __m512 high = _mm512_set1_ps(448.0f), low = _mm512_set1_ps(-448.0f);
    f = _mm512_mul_ps(f, inverse);
    f = _mm512_min_ps(high, _mm512_max_ps(low, f)); /* a NaN (second operand) passes */
    __m512i bits = _mm512_castps_si512(f);
    __m512i sign = _mm512_and_si512(bits, _mm512_set1_epi32((int)0x80000000u));
    __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    /* normal E4M3 (2^-6 and up): 3 mantissa bits, ties to even */
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(magnitude, 20), _mm512_set1_epi32(1));
    __m512i normal = _mm512_and_si512(
        _mm512_add_epi32(magnitude, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFFF))),
        _mm512_set1_epi32((int)0xFFF00000u));
    /* subnormal E4M3 (below 2^-6): multiples of 2^-9, ties to even */
    __m512 subnormal = _mm512_roundscale_ps(
        _mm512_castsi512_ps(magnitude), (9 << 4) | _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __mmask16 small = _mm512_cmplt_epi32_mask(magnitude, _mm512_set1_epi32(0x3C800000));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
    __m512i rounded = _mm512_mask_mov_epi32(normal, small, _mm512_castps_si512(subnormal));
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC00000));
    return _mm512_srli_epi32(_mm512_or_si512(rounded, sign), 16); /* exact: 4 significant bits */
}

/* One row of k BF16 inputs quantized into BF16 values, padded with zeros to 2 * pairs. */
static void quantize_row(const uint16_t *x, int k, float inverse, uint16_t *q, int pairs) {
    const __m512 scale = _mm512_set1_ps(inverse);
    int i = 0;
    for (; i + 16 <= k; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        __m512i r = quantize16(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), scale);
        _mm256_storeu_si256((__m256i *)(q + i), _mm512_cvtepi32_epi16(r));
    }
    if (i < k) {
        __mmask16 m = (__mmask16)((1u << (k - i)) - 1);
        __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + i));
        __m512i r = quantize16(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), scale);
        _mm256_mask_storeu_epi16(q + i, m, _mm512_cvtepi32_epi16(r));
    }
    for (int j = k; j < 2 * pairs; j++) q[j] = 0;
}

/* rows (at most ROWS) quantized inputs times one packed tile of COLUMNS columns. */
static inline __attribute__((always_inline)) void tile(
    const int rows, const uint32_t *q, int pairs, const __m512i *w, const float *scale,
    uint16_t *y, long ldy, int valid) {
    __m512 sum[ROWS][4];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) sum[r][j] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; p++, w += 4) {
        __m512bh w0 = (__m512bh)_mm512_load_si512(w + 0);
        __m512bh w1 = (__m512bh)_mm512_load_si512(w + 1);
        __m512bh w2 = (__m512bh)_mm512_load_si512(w + 2);
        __m512bh w3 = (__m512bh)_mm512_load_si512(w + 3);
        for (int r = 0; r < rows; r++) {
            __m512bh xr = (__m512bh)_mm512_set1_epi32((int)q[(long)r * pairs + p]);
            sum[r][0] = _mm512_dpbf16_ps(sum[r][0], xr, w0);
            sum[r][1] = _mm512_dpbf16_ps(sum[r][1], xr, w1);
            sum[r][2] = _mm512_dpbf16_ps(sum[r][2], xr, w2);
            sum[r][3] = _mm512_dpbf16_ps(sum[r][3], xr, w3);
        }
    }
    for (int j = 0; j < 4 && valid > 16 * j; j++) {
        int left = valid - 16 * j;
        __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512 s = _mm512_maskz_loadu_ps(m, scale + 16 * j);
        for (int r = 0; r < rows; r++) {
            __m256bh out = _mm512_cvtneps_pbh(_mm512_mul_ps(sum[r][j], s)); /* ties to even */
            _mm256_mask_storeu_epi16(y + (long)r * ldy + 16 * j, m, (__m256i)out);
        }
    }
}

static void tile_rows(int rows, const uint32_t *q, int pairs, const __m512i *w,
                      const float *scale, uint16_t *y, long ldy, int valid) {
    switch (rows) { /* each case its own unrolled copy: the sums stay in registers */
    case 1: tile(1, q, pairs, w, scale, y, ldy, valid); break;
    case 2: tile(2, q, pairs, w, scale, y, ldy, valid); break;
    case 3: tile(3, q, pairs, w, scale, y, ldy, valid); break;
    case 4: tile(4, q, pairs, w, scale, y, ldy, valid); break;
    case 5: tile(5, q, pairs, w, scale, y, ldy, valid); break;
    default: tile(ROWS, q, pairs, w, scale, y, ldy, valid); break;
    }
}

/* q: m x k BF16 inputs (row stride ldx) quantized into BF16 values, row stride k rounded up
 * to even (the checks read this). */
int eq_quantize(const uint16_t *x, long ldx, int m, int k, float inverse, uint16_t *q) {
    int pairs = (k + 1) / 2;
    for (int r = 0; r < m; r++)
        quantize_row(x + (long)r * ldx, k, inverse, q + (long)r * 2 * pairs, pairs);
    return 0;
}

/* y (m x n BF16, row stride ldy) = the static FP8 linear of x (m x k BF16, row stride ldx).
 * Returns 0, or 1 when the scratch buffer cannot be had. */
int eq_fp8_static_linear(const uint16_t *x, long ldx, int m, int k, float inverse,
                         const void *packed, const float *scale, int n, uint16_t *y, long ldy) {
    if (m <= 0 || n <= 0) return 0;
    int pairs = (k + 1) / 2;
    int tiles = (n + COLUMNS - 1) / COLUMNS;
    size_t bytes = ((size_t)m * pairs * 4 + 63) / 64 * 64;
    uint32_t *q = (uint32_t *)aligned_alloc(64, bytes);
    if (!q) return 1;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int r = 0; r < m; r++)
            quantize_row(x + (long)r * ldx, k, inverse, (uint16_t *)(q + (long)r * pairs), pairs);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles; t++) {
            const __m512i *w = (const __m512i *)packed + (long)t * pairs * 4;
            int valid = n - t * COLUMNS < COLUMNS ? n - t * COLUMNS : COLUMNS;
            for (int r = 0; r < m; r += ROWS)
                tile_rows(m - r < ROWS ? m - r : ROWS, q + (long)r * pairs, pairs, w,
                          scale + t * COLUMNS, y + (long)r * ldy + t * COLUMNS, ldy, valid);
        }
    }
    free(q);
    return 0;
}
