/* Ranks only the candidates that can matter: a partial selection (quickselect)
 * for top-k, then a sort of the head for top-p, which reaches past 256
 * ranked ids only when the mass is spread thin. */
#include "sample/top_kp.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    float p;
    int32_t id;
} cand;

/* Descending probability; equal probabilities keep the lower id first. */
static int cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p < y->p ? 1 : -1;
    return x->id > y->id ? 1 : -1;
}

/* Moves the m highest-ranked candidates (cand_desc order) to c[0..m), in
 * no particular order: quickselect with a median-of-three pivot. */
static void select_top(cand *c, int n, int m) {
    int lo = 0, hi = n - 1;
    while (lo < hi && m > lo && m <= hi) {
        int mid = lo + (hi - lo) / 2;
        /* median of three to c[hi] as the pivot */
        if (cand_desc(&c[mid], &c[lo]) < 0) { cand t = c[mid]; c[mid] = c[lo]; c[lo] = t; }
        if (cand_desc(&c[hi], &c[lo]) < 0) { cand t = c[hi]; c[hi] = c[lo]; c[lo] = t; }
        if (cand_desc(&c[mid], &c[hi]) < 0) { cand t = c[mid]; c[mid] = c[hi]; c[hi] = t; }
        cand pivot = c[hi];
        int store = lo;
        for (int i = lo; i < hi; i++)
            if (cand_desc(&c[i], &pivot) < 0) {
                cand t = c[i]; c[i] = c[store]; c[store] = t;
                store++;
            }
        cand t = c[store]; c[store] = c[hi]; c[hi] = t;
        /* c[lo..store) rank above the pivot, c[store] is the pivot */
        if (store == m || store == m - 1) return;
        if (store > m) hi = store - 1;
        else lo = store + 1;
    }
}

void ds_top_kp(float *probs, int V, const ds_sampling *s) {
    bool use_k = s->top_k > 0 && s->top_k < V, use_p = s->top_p > 0 && s->top_p < 1.0f;
    if (!use_k && !use_p) return;
    /* Keep the top-k, then the smallest prefix (in rank order) whose mass
     * reaches top_p of what is kept (always at least one token), renormalise.
     * Only the candidates that can matter are ranked: a partial selection,
     * then a sort of its head. */
    cand *c = malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) c[i] = (cand){probs[i], i};
    int keep = use_k ? s->top_k : V;
    if (keep < V) select_top(c, V, keep);
    double kept_mass = 0;
    for (int i = 0; i < keep; i++) kept_mass += c[i].p;
    if (use_p) {
        int head = keep < 256 ? keep : 256;
        select_top(c, keep, head);
        qsort(c, (size_t)head, sizeof *c, cand_desc);
        double cum = 0, target = s->top_p * kept_mass;
        int n = 0;
        while (n < keep) {
            if (n == head) { /* rare: the mass is spread thin; rank everything kept */
                qsort(c + head, (size_t)(keep - head), sizeof *c, cand_desc);
                head = keep;
            }
            cum += c[n].p;
            n++;
            if (cum >= target) break;
        }
        keep = n;
        kept_mass = cum;
    }
    for (int i = 0; i < V; i++) probs[i] = 0;
    for (int i = 0; i < keep; i++) probs[c[i].id] = (float)(c[i].p / kept_mass);
    free(c);
}
