/* A binary min-heap over a caller-owned array, generated per element type so the hot
 * tokenizer merge loops keep typed, inlined comparisons. BEFORE(a, b) (pointers) is true
 * when *a must pop before *b.
 *
 *   TSR_HEAP_DEFINE(tsr__cand_heap, tsr__cand, tsr__cand_before)
 * defines tsr__cand_heap_push(h, &n, c) and tsr__cand_heap_pop(h, &n). */
#ifndef TSR_BASE_HEAP_H
#define TSR_BASE_HEAP_H

#include <stddef.h>

#define TSR_HEAP_DEFINE(NAME, T, BEFORE)                                                \
    static inline void NAME##_push(T *h, size_t *n, T c) {                              \
        size_t i = (*n)++;                                                              \
        while (i > 0) {                                                                 \
            size_t p = (i - 1) / 2;                                                     \
            if (!BEFORE(&c, &h[p])) break;                                              \
            h[i] = h[p];                                                                \
            i = p;                                                                      \
        }                                                                               \
        h[i] = c;                                                                       \
    }                                                                                   \
    static inline T NAME##_pop(T *h, size_t *n) {                                       \
        T top = h[0], last = h[--(*n)];                                                 \
        size_t i = 0;                                                                   \
        for (;;) {                                                                      \
            size_t l = 2 * i + 1, r = l + 1, m = i;                                     \
            const T *best = &last;                                                      \
            if (l < *n && BEFORE(&h[l], best)) m = l, best = &h[l];                     \
            if (r < *n && BEFORE(&h[r], best)) m = r;                                   \
            if (m == i) break;                                                          \
            h[i] = h[m];                                                                \
            i = m;                                                                      \
        }                                                                               \
        if (*n > 0) h[i] = last;                                                        \
        return top;                                                                     \
    }

#endif
