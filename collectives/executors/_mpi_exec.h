/* C for the compiled MPI executor (_mpi_exec.pyx): the MPI family it was built against, the
   float16 / bfloat16 reductions, and numpy's data pointer. Cython cannot express these: it has
   no 16-bit float type, no SIMD intrinsics and no preprocessor. */
#ifndef COLLECTIVES_MPI_EXEC_H
#define COLLECTIVES_MPI_EXEC_H

#include <Python.h>
#include <mpi.h>
#include <stdint.h>
#include <string.h>

/* Which MPI's mpi.h this was built with: an extension built for one refuses the other. */
#if defined(OPEN_MPI)
#define COLLECTIVES_MPI_FAMILY "Open MPI"
#elif defined(MPICH_VERSION) || defined(MPICH)
#define COLLECTIVES_MPI_FAMILY "MPICH"
#else
#define COLLECTIVES_MPI_FAMILY "unknown"
#endif

/* float16 / bfloat16 reductions, in C because Cython has no 16-bit float type. Both widen to
   float32 exactly, combine, and round once to nearest even: numpy's (float16) and ml_dtypes'
   (bfloat16) own recipe, so the bits match the numpy twin. A NaN operand wins as it does there:
   float16 returns b's NaN if b is one, else a's, quieted (| 0x200); bfloat16 keeps only the sign
   of that NaN (sign | 0x7fc0). MIN/MAX return an operand's bits unchanged (float16 gives a on
   ties, bfloat16 b, as numpy and ml_dtypes do). float16 uses AVX-512 (16 lanes) or F16C (8)
   where the CPU has them, checked at run time so the build needs no -march; a scalar bit-exact
   converter elsewhere. bfloat16 is integer work that GCC vectorises; AVX2 and AVX-512 copies of
   the loops are picked at run time. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <cpuid.h>
#define COLL_X86 1
#else
#define COLL_X86 0
#endif

enum { COLL_SUM = 0, COLL_PRODUCT = 2, COLL_MIN = 3, COLL_MAX = 4 };

static inline float coll_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t coll_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* float16 -> float32, exact. NaN payload moves to the top of the float32 mantissa. */
static inline float coll_h2f(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return coll_u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) return coll_u2f(sign | coll_f2u((float)man * 0x1p-24f));
    return coll_u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

/* float32 -> float16, round to nearest even; NaN keeps sign and top payload, made quiet
   (what F16C's vcvtps2ph does). */
static inline uint16_t coll_f2h(float f) {
    uint32_t x = coll_f2u(f), sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x47800000u)              /* >= 65536 (rounds to inf), inf, NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x < 0x38800000u)               /* below 2^-14: subnormal half or zero. Adding 0.5
                                          (ulp 2^-24, the half's subnormal ulp) makes the
                                          float adder round at the right bit. */
        return (uint16_t)(sign | (coll_f2u(coll_u2f(x) + 0.5f) - 0x3f000000u));
    /* rebias the exponent (-112 << 23), add just under half an ulp plus the lowest kept
       bit: round to nearest even; a carry into the exponent is correct (up to inf) */
    x += 0xc8000fffu + ((x >> 13) & 1u);
    return (uint16_t)(sign | (x >> 13));
}

static inline uint16_t coll_f16_one(int op, uint16_t p, uint16_t q) {
    float x = coll_h2f(p), y = coll_h2f(q);
    uint16_t r;
    if (op == COLL_SUM || op == COLL_PRODUCT) {
        r = coll_f2h(op == COLL_SUM ? x + y : x * y);
        if (x != x) r = p | 0x200u;
        if (y != y) r = q | 0x200u;
        return r;
    }
    if (op == COLL_MIN) return (x <= y || x != x) ? p : q;
    return (x >= y || x != x) ? p : q;
}

static void coll_f16_scalar(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                            Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) d[i] = coll_f16_one(op, a[i], b[i]);
}

#if COLL_X86
__attribute__((target("avx,f16c")))
static inline __m128i coll_pick(__m128i mask, __m128i yes, __m128i no) {
    return _mm_or_si128(_mm_and_si128(mask, yes), _mm_andnot_si128(mask, no));
}

/* One body per op (the op test stays out of the loop). */
#define COLL_F16_LOOP(BODY)                                                            \
    for (; i + 8 <= n; i += 8) {                                                       \
        __m128i p = _mm_loadu_si128((const __m128i*)(a + i));                          \
        __m128i q = _mm_loadu_si128((const __m128i*)(b + i));                          \
        __m256 x = _mm256_cvtph_ps(p), y = _mm256_cvtph_ps(q);                         \
        __m128i r;                                                                     \
        BODY                                                                           \
        _mm_storeu_si128((__m128i*)(d + i), r);                                        \
    }
#define COLL_F16_ARITH(OP)                                                             \
    r = _mm256_cvtps_ph(OP(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);      \
    __m128i pn = _mm_cmpgt_epi16(_mm_and_si128(p, absmask), inf);                      \
    __m128i qn = _mm_cmpgt_epi16(_mm_and_si128(q, absmask), inf);                      \
    if (!_mm_testz_si128(_mm_or_si128(pn, qn), _mm_or_si128(pn, qn))) {               \
        r = coll_pick(pn, _mm_or_si128(p, quiet), r);                                  \
        r = coll_pick(qn, _mm_or_si128(q, quiet), r);                                  \
    }
#define COLL_F16_SELECT(PRED)                                                          \
    __m256i m = _mm256_castps_si256(_mm256_or_ps(_mm256_cmp_ps(x, y, PRED),            \
                                                 _mm256_cmp_ps(x, x, _CMP_UNORD_Q)));  \
    r = coll_pick(_mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extractf128_si256(m, 1)), p, q);

__attribute__((target("avx,f16c")))
static void coll_f16_f16c(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                          Py_ssize_t n) {
    const __m128i absmask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    const __m128i quiet = _mm_set1_epi16(0x200);
    Py_ssize_t i = 0;
    switch (op) {
    case COLL_SUM: COLL_F16_LOOP(COLL_F16_ARITH(_mm256_add_ps)) break;
    case COLL_PRODUCT: COLL_F16_LOOP(COLL_F16_ARITH(_mm256_mul_ps)) break;
    case COLL_MIN: COLL_F16_LOOP(COLL_F16_SELECT(_CMP_LE_OQ)) break;
    case COLL_MAX: COLL_F16_LOOP(COLL_F16_SELECT(_CMP_GE_OQ)) break;
    default: return;
    }
    coll_f16_scalar(op, d + i, a + i, b + i, n - i);
}

/* AVX-512 (F, BW, VL): 16 lanes, and NaN lanes come as bit masks */
#define COLL_F16_LOOP16(BODY)                                                          \
    for (; i + 16 <= n; i += 16) {                                                     \
        __m256i p = _mm256_loadu_si256((const __m256i*)(a + i));                       \
        __m256i q = _mm256_loadu_si256((const __m256i*)(b + i));                       \
        __m512 x = _mm512_cvtph_ps(p), y = _mm512_cvtph_ps(q);                         \
        __m256i r;                                                                     \
        BODY                                                                           \
        _mm256_storeu_si256((__m256i*)(d + i), r);                                     \
    }
#define COLL_F16_ARITH16(OP)                                                           \
    r = _mm512_cvtps_ph(OP(x, y), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);      \
    __mmask16 xn = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);                             \
    __mmask16 yn = _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q);                             \
    if (xn | yn) {                                                                     \
        r = _mm256_mask_blend_epi16(xn, r, _mm256_or_si256(p, quiet));                 \
        r = _mm256_mask_blend_epi16(yn, r, _mm256_or_si256(q, quiet));                 \
    }
#define COLL_F16_SELECT16(PRED)                                                        \
    __mmask16 take_a = _mm512_cmp_ps_mask(x, y, PRED) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); \
    r = _mm256_mask_blend_epi16(take_a, q, p);

#define COLL_AVX512 "avx512f,avx512bw,avx512vl,avx2,f16c"
__attribute__((target(COLL_AVX512)))
static void coll_f16_avx512(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                            Py_ssize_t n) {
    const __m256i quiet = _mm256_set1_epi16(0x200);
    Py_ssize_t i = 0;
    switch (op) {
    case COLL_SUM: COLL_F16_LOOP16(COLL_F16_ARITH16(_mm512_add_ps)) break;
    case COLL_PRODUCT: COLL_F16_LOOP16(COLL_F16_ARITH16(_mm512_mul_ps)) break;
    case COLL_MIN: COLL_F16_LOOP16(COLL_F16_SELECT16(_CMP_LE_OQ)) break;
    case COLL_MAX: COLL_F16_LOOP16(COLL_F16_SELECT16(_CMP_GE_OQ)) break;
    default: return;
    }
    coll_f16_scalar(op, d + i, a + i, b + i, n - i);
}

static int coll_has_avx512(void) {
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                && __builtin_cpu_supports("avx512vl");
    }
    return known;
}

static int coll_has_f16c(void) {
    static int known = -1;
    if (known < 0) {
        unsigned int eax, ebx, ecx, edx;
        /* AVX with OS support (the builtin checks XGETBV) and the F16C cpuid bit */
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx)
                && (ecx & (1u << 29));
    }
    return known;
}
#endif

/* -1: the best the CPU has; 0: portable C; 1: at most F16C / AVX2 (tests force each) */
static int coll_f16_path = -1;

static void coll_reduce_f16(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                            Py_ssize_t n) {
#if COLL_X86
    if (coll_f16_path < 0 && coll_has_avx512()) { coll_f16_avx512(op, d, a, b, n); return; }
    if (coll_f16_path != 0 && coll_has_f16c()) { coll_f16_f16c(op, d, a, b, n); return; }
#endif
    coll_f16_scalar(op, d, a, b, n);
}

static inline uint16_t coll_f2bf(float f) {
    uint32_t u = coll_f2u(f);
    uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? nan : rounded);
}

/* branch-free per element so that GCC vectorises the loops */
#define COLL_BF16_LOOPS(SUFFIX, ATTR)                                                  \
ATTR static void coll_bf16_##SUFFIX(int op, uint16_t* d, const uint16_t* a,          \
                                    const uint16_t* b, Py_ssize_t n) {                 \
    Py_ssize_t i;                                                                      \
    if (op == COLL_SUM || op == COLL_PRODUCT) {                                        \
        for (i = 0; i < n; i++) {                                                      \
            uint16_t p = a[i], q = b[i];                                               \
            float x = coll_u2f((uint32_t)p << 16), y = coll_u2f((uint32_t)q << 16);    \
            uint16_t r = coll_f2bf(op == COLL_SUM ? x + y : x * y);                    \
            r = x != x ? (uint16_t)((p & 0x8000u) | 0x7fc0u) : r;                      \
            d[i] = y != y ? (uint16_t)((q & 0x8000u) | 0x7fc0u) : r;                   \
        }                                                                              \
    } else if (op == COLL_MIN) {                                                       \
        for (i = 0; i < n; i++) {                                                      \
            uint16_t p = a[i], q = b[i];                                               \
            float x = coll_u2f((uint32_t)p << 16), y = coll_u2f((uint32_t)q << 16);    \
            d[i] = (x < y || x != x) ? p : q;                                          \
        }                                                                              \
    } else if (op == COLL_MAX) {                                                       \
        for (i = 0; i < n; i++) {                                                      \
            uint16_t p = a[i], q = b[i];                                               \
            float x = coll_u2f((uint32_t)p << 16), y = coll_u2f((uint32_t)q << 16);    \
            d[i] = (x > y || x != x) ? p : q;                                          \
        }                                                                              \
    }                                                                                  \
}
COLL_BF16_LOOPS(generic, )
#if COLL_X86
COLL_BF16_LOOPS(avx2, __attribute__((target("avx2"))))
COLL_BF16_LOOPS(avx512, __attribute__((target(COLL_AVX512))))
#endif

static void coll_reduce_bf16(int op, uint16_t* d, const uint16_t* a, const uint16_t* b,
                             Py_ssize_t n) {
#if COLL_X86
    if (coll_f16_path < 0 && coll_has_avx512()) {
        coll_bf16_avx512(op, d, a, b, n);
        return;
    }
    if (coll_f16_path != 0 && __builtin_cpu_supports("avx2")) {
        coll_bf16_avx2(op, d, a, b, n);
        return;
    }
#endif
    coll_bf16_generic(op, d, a, b, n);
}

/* numpy's PyArrayObject_fields starts with the object header, then ``char *data`` */
static inline char* coll_ndarray_data(PyObject* array) {
    return *(char**)((char*)array + sizeof(PyObject));
}

#endif  /* COLLECTIVES_MPI_EXEC_H */
