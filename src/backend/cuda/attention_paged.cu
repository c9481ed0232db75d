/* Paged KV caches on the GPU (backend.h ds_kv_pages, the batched engine):
 * attention over keys found through a page table, and the step's K/V rows
 * stored through it.
 *
 * The table reaches the device as it is (the sequences' page lists,
 * concatenated), through one of PT_SLOTS pinned staging buffers and an async
 * copy on the stream; a slot is refilled only once its last copy has run
 * (its event), and a call whose table a slot already holds uploads nothing,
 * so the layers of one forward share one copy. The rows' list starts and
 * positions ride in the launches' parameters, as positions always do.
 * Inside a step region (a CUDA graph) host arrays cannot be read, so paged
 * calls are refused there, naming the op.
 *
 * Rows are grouped into runs of one sequence (the same list start and key
 * limit) at consecutive positions. A run of DS_CU_PREFILL_ROWS rows or more
 * (a prefill chunk) takes the tiled kernel (every such run of the call in
 * one launch), every other row the staged
 * kernel (attention_staged.cu: the chunk kernel's arithmetic, its keys
 * copied into shared memory a stage at a time; the chunk kernel itself
 * where the staged one does not fit), exactly as a contiguous call of that
 * run's rows would; the kernels read a paged key where the contiguous ones
 * read row j and change nothing else. So a row's bits do not depend on the other sequences of the
 * call, on where its pages lie in the pool, or on the cache being paged at
 * all: paged == contiguous, bit for bit, for the same rows
 * (test_cuda_attention checks all three). A row's key limit (row_keys)
 * becomes its launch's n_keys, which is all n_keys does in both kernels;
 * rows that causality cuts below their limits share one launch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define PT_SLOTS 4 /* tables held at once: a forward's, a drafter's, ... */

struct ds_cu_page_tables {
    struct {
        int32_t *h, *d;  /* pinned staging, device copy */
        int64_t cap, n;  /* entries allocated, entries held */
        cudaEvent_t ev;  /* the last copy from h has run (NULL: none made) */
    } s[PT_SLOTS];
    int next;
};

void ds_cu_page_tables_free(ds_cuda_backend *cb) {
    struct ds_cu_page_tables *pt = cb->page_tables;
    if (!pt) return;
    for (int i = 0; i < PT_SLOTS; i++) {
        if (pt->s[i].ev) cudaEventSynchronize(pt->s[i].ev), cudaEventDestroy(pt->s[i].ev);
        if (pt->s[i].h) cudaFreeHost(pt->s[i].h);
        if (pt->s[i].d) cudaFree(pt->s[i].d);
    }
    free(pt);
    cb->page_tables = NULL;
}

/* The device copy of table[0..n): a slot that holds it, or the next slot
 * refilled. NULL with a recorded failure. */
static const int32_t *table_on_device(ds_cuda_backend *cb, const int32_t *table, int64_t n) {
    const char *op = "attention";
    if (!cb->page_tables && !(cb->page_tables = (struct ds_cu_page_tables *)calloc(1, sizeof *cb->page_tables))) {
        ds_cu_fail(cb, op, "out of memory for the page tables");
        return NULL;
    }
    struct ds_cu_page_tables *pt = cb->page_tables;
    for (int i = 0; i < PT_SLOTS; i++) /* the staging buffer holds what its device copy holds (or will, in order) */
        if (pt->s[i].n >= n && !memcmp(pt->s[i].h, table, (size_t)n * sizeof *table)) return pt->s[i].d;
    const int i = pt->next;
    pt->next = (i + 1) % PT_SLOTS;
    auto *sl = &pt->s[i];
    if (sl->ev && !ds_cu_ok(cb, op, cudaEventSynchronize(sl->ev))) return NULL;
    if (!sl->ev && !ds_cu_ok(cb, op, cudaEventCreateWithFlags(&sl->ev, cudaEventDisableTiming))) {
        sl->ev = NULL;
        return NULL;
    }
    sl->n = 0;
    if (sl->cap < n) {
        const int64_t cap = n < 1024 ? 1024 : n + n / 4;
        if (sl->h) cudaFreeHost(sl->h);
        if (sl->d) cudaFree(sl->d); /* waits for the kernels that may still read it */
        sl->h = sl->d = NULL;
        sl->cap = 0;
        if (!ds_cu_ok(cb, op, cudaMallocHost(&sl->h, (size_t)cap * sizeof(int32_t))) ||
            !ds_cu_ok(cb, op, cudaMalloc(&sl->d, (size_t)cap * sizeof(int32_t)))) {
            if (sl->h) cudaFreeHost(sl->h);
            sl->h = sl->d = NULL;
            return NULL;
        }
        sl->cap = cap;
    }
    memcpy(sl->h, table, (size_t)n * sizeof *table);
    if (!ds_cu_ok(cb, op, cudaMemcpyAsync(sl->d, sl->h, (size_t)n * sizeof *table, cudaMemcpyHostToDevice,
                                          cb->stream)) ||
        !ds_cu_ok(cb, op, cudaEventRecord(sl->ev, cb->stream)))
        return NULL;
    sl->n = n;
    return sl->d;
}

/* Row i's key limit: n_keys, or its sequence's key count when smaller. */
static int key_limit(const ds_attn_params *p, int64_t i) {
    const int32_t *rk = p->pages->row_keys;
    return rk && rk[i] < p->n_keys ? rk[i] : p->n_keys;
}

/* Row i's keys [lo, hi) (the kernels' rule). */
static void row_keys_range(const ds_attn_params *p, int64_t i, int *lo, int *hi) {
    int a = 0, b = key_limit(p, i);
    if (p->causal) {
        const int pos = p->q_pos[i];
        if (pos + 1 < b) b = pos + 1;
        if (p->window > 0 && pos - p->window + 1 > a) a = pos - p->window + 1;
    }
    *lo = a;
    *hi = b;
}

/* Whether rows i and j read one sequence's keys the same way. */
static bool same_run(const ds_attn_params *p, int64_t i, int64_t j) {
    return p->pages->row_table[i] == p->pages->row_table[j] && key_limit(p, i) == key_limit(p, j);
}

/* Whether causality alone ends row i's keys (its position is below its key limit): then any n_keys from its
 * limit up gives it the same keys, so rows of many sequences can share a launch. */
static bool causal_cut(const ds_attn_params *p, int64_t i) { return p->causal && p->q_pos[i] < key_limit(p, i); }

/* Rows [r0, r1) on the chunk kernel: one launch for a run of rows that causality cuts (a batched step's decode
 * and verify rows, whatever their sequences: n_keys the run's largest limit, each row's keys still [lo, pos]),
 * else one per run with the same key limit. (A launch per sequence cost 256 launches a layer at 256 in flight.) */
static void chunk_rows(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                       const ds_attn_params *p, const int32_t *tab, int64_t r0, int64_t r1) {
    if (r1 <= r0) return;
    /* Verify blocks and drafter blocks (rows in groups of one sequence): every group's keys copied once, all
     * sequences and key limits in one launch (attention_blocks.cu). */
    int32_t *keys = (int32_t *)malloc((size_t)(r1 - r0) * sizeof *keys);
    if (!keys) {
        ds_cu_fail(cb, "attention", "out of memory for %lld rows' key limits", (long long)(r1 - r0));
        return;
    }
    for (int64_t i = r0; i < r1; i++) keys[i - r0] = key_limit(p, i);
    ds_attn_params pb = *p;
    pb.pages = NULL;
    pb.q_pos = p->q_pos + r0;
    const ds_cu_pages pgb = {tab, p->pages->page_rows, p->pages->row_table + r0};
    const bool blocks =
        ds_cu_attention_blocks(cb, ds_rows(out, r0, r1 - r0), ds_rows(q, r0, r1 - r0), k, v, &pb, &pgb, keys);
    free(keys);
    if (blocks) return;
    for (int64_t a = r0; a < r1 && !cb->err;) {
        int64_t b = a + 1;
        int n_keys = key_limit(p, a);
        if (causal_cut(p, a))
            for (; b < r1 && causal_cut(p, b); b++) n_keys = key_limit(p, b) > n_keys ? key_limit(p, b) : n_keys;
        else
            while (b < r1 && !causal_cut(p, b) && key_limit(p, b) == key_limit(p, a)) b++;
        ds_attn_params pr = *p;
        pr.pages = NULL;
        pr.q_pos = p->q_pos + a;
        pr.n_keys = n_keys;
        const ds_cu_pages pg = {tab, p->pages->page_rows, p->pages->row_table + a};
        ds_cu_attention_rows(cb, ds_rows(out, a, b - a), ds_rows(q, a, b - a), k, v, &pr, &pg);
        a = b;
    }
}

void ds_cu_attention_paged(ds_cuda_backend *cb, ds_tensor out, ds_tensor q, ds_tensor k, ds_tensor v,
                           const ds_attn_params *p) {
    const char *op = "attention";
    const ds_kv_pages *pg = p->pages;
    const int64_t M = q.rows;
    if (M <= 0 || p->n_heads <= 0) return;
    if (cb->reg.active) {
        ds_cu_fail(cb, op, "paged KV caches inside a step region (the page tables are host arrays)");
        return;
    }
    if (pg->page_rows <= 0 || !pg->row_table || !p->q_pos) {
        ds_cu_fail(cb, op, "paged call without page_rows (%d), row_table or q_pos", pg->page_rows);
        return;
    }
    if (p->ring_size > 0) {
        ds_cu_fail(cb, op, "a paged cache is not a ring (ring_size %d)", p->ring_size);
        return;
    }
    if (k.rows > INT32_MAX || v.rows > INT32_MAX) {
        ds_cu_fail(cb, op, "a paged cache of %lld rows (int32 rows at most)", (long long)k.rows);
        return;
    }
    /* The table entries the rows read: [0, n). */
    const int pr = pg->page_rows;
    int64_t n = 0;
    for (int64_t i = 0; i < M; i++) {
        int lo, hi;
        row_keys_range(p, i, &lo, &hi);
        if (hi <= lo) continue;
        if (pg->row_table[i] < 0) {
            ds_cu_fail(cb, op, "row %lld: its page list starts at %d", (long long)i, pg->row_table[i]);
            return;
        }
        const int64_t e = (int64_t)pg->row_table[i] + (hi - 1) / pr + 1;
        if (e > n) n = e;
    }
    const int tab_pages = (int)((k.rows < v.rows ? k.rows : v.rows) / pr);
    if (n > 0 && !pg->table) {
        ds_cu_fail(cb, op, "paged call without a table");
        return;
    }
    for (int64_t t = 0; t < n; t++)
        if (pg->table[t] < 0 || pg->table[t] >= tab_pages) {
            ds_cu_fail(cb, op, "page table entry %lld is page %d of a pool of %d", (long long)t, pg->table[t],
                       tab_pages);
            return;
        }
    const int32_t *tab = n > 0 ? table_on_device(cb, pg->table, n) : NULL;
    if (n > 0 && !tab) return;
    /* Runs of DS_CU_PREFILL_ROWS rows or more on the tiled kernel, all in one launch; the rows between them on
     * the chunk kernel. */
    ds_cu_prefill_run *runs = NULL;
    int n_runs = 0, cap = 0;
    for (int64_t a = 0; a < M && !cb->err;) {
        int64_t b = a + 1;
        while (b < M && same_run(p, a, b) && p->q_pos[b] == p->q_pos[a] + (b - a)) b++;
        if (b - a >= DS_CU_PREFILL_ROWS && b - a <= INT32_MAX) {
            if (n_runs == cap) {
                cap = cap ? 2 * cap : 16;
                ds_cu_prefill_run *g = (ds_cu_prefill_run *)realloc(runs, (size_t)cap * sizeof *g);
                if (!g) {
                    free(runs);
                    ds_cu_fail(cb, op, "out of memory for %d prefill runs", cap);
                    return;
                }
                runs = g;
            }
            runs[n_runs++] = (ds_cu_prefill_run){a, (int)(b - a), p->q_pos[a], key_limit(p, a), pg->row_table[a]};
        }
        a = b;
    }
    /* (cfg.invariant: the tiled kernel refuses, and every row takes the chunk kernel) */
    if (n_runs == 0 || !ds_cu_attention_prefill_runs(cb, out, q, k, v, p, runs, n_runs, tab, pr)) n_runs = 0;
    int64_t c0 = 0; /* rows [c0, next run) wait for the chunk kernel */
    for (int r = 0; r < n_runs && !cb->err; r++) {
        chunk_rows(cb, out, q, k, v, p, tab, c0, runs[r].row0);
        c0 = runs[r].row0 + runs[r].rows;
    }
    free(runs);
    if (!cb->err) chunk_rows(cb, out, q, k, v, p, tab, c0, M);
}

/* ---- the paged K/V store ------------------------------------------------ */

typedef struct {
    int64_t row[DS_CU_ROWS]; /* the cache row of each launched row */
} store_rows;

/* Row i of k and of v (blockIdx.y 0 and 1) to cache row dst.row[i]: a copy, the bits the row copies of
 * ds_store_rows_paged leave; into bf16 / f16 caches (cdt, model/kv_cache.h) each value rounded as the copy op
 * rounds it (ds_cu_to16). */
__global__ void paged_store_kernel(const float *k, int64_t ks, const float *v, int64_t vs, float *kc, int64_t kcs,
                                   float *vc, int64_t vcs, int kcols, int vcols, store_rows dst, int cdt) {
    ds_cu_grid_wait();
    const int i = blockIdx.x;
    const bool val = blockIdx.y == 1;
    const float *src = val ? v + i * vs : k + i * ks;
    const int n = val ? vcols : kcols;
    if (cdt != DS_F32) {
        uint16_t *d16 = val ? (uint16_t *)(void *)vc + dst.row[i] * vcs : (uint16_t *)(void *)kc + dst.row[i] * kcs;
        for (int c = threadIdx.x; c < n; c += blockDim.x) d16[c] = ds_cu_to16(src[c], cdt == DS_F16);
        return;
    }
    float *d = val ? vc + dst.row[i] * vcs : kc + dst.row[i] * kcs;
    for (int c = threadIdx.x; c < n; c += blockDim.x) d[c] = src[c];
}

/* k's and v's rows to k_cache / v_cache through the pages, at positions pos. */
static void store_paged(ds_cuda_backend *cb, ds_tensor k, ds_tensor v, ds_tensor kc, ds_tensor vc, const int32_t *pos,
                        const ds_kv_pages *pg) {
    const char *op = "qk_norm_rope_attention";
    if (k.rows != v.rows || k.cols != kc.cols || v.cols != vc.cols || k.dtype != DS_F32 || v.dtype != DS_F32 ||
        !ds_cu_kv_dtype_ok(kc.dtype) || vc.dtype != kc.dtype) {
        ds_cu_fail(cb, op,
                   "K/V rows [%lld, %lld] / [%lld, %lld] do not match their caches' [%lld] / [%lld] (fp32 rows; "
                   "caches of one dtype, fp32 / bf16 / f16)",
                   (long long)k.rows, (long long)k.cols, (long long)v.rows, (long long)v.cols, (long long)kc.cols,
                   (long long)vc.cols);
        return;
    }
    if (pg->page_rows <= 0 || !pg->table || !pg->row_table) {
        ds_cu_fail(cb, op, "paged store without page_rows (%d), table or row_table", pg->page_rows);
        return;
    }
    const int64_t rows = kc.rows < vc.rows ? kc.rows : vc.rows;
    for (int64_t r0 = 0; r0 < k.rows; r0 += DS_CU_ROWS) {
        const int n = (int)(k.rows - r0 < DS_CU_ROWS ? k.rows - r0 : DS_CU_ROWS);
        store_rows dst;
        for (int i = 0; i < n; i++) {
            const int64_t r = r0 + i;
            if (pos[r] < 0 || pg->row_table[r] < 0 || (dst.row[i] = ds_kv_page_row(pg, r, pos[r])) < 0 ||
                dst.row[i] >= rows) {
                ds_cu_fail(cb, op, "row %lld at position %d: cache row outside the pool of %lld rows", (long long)r,
                           pos[r], (long long)rows);
                return;
            }
        }
        ds_cu_launch(paged_store_kernel, dim3((unsigned)n, 2), 128, cb->stream, (const float *)k.data + r0 * k.stride,
                     k.stride, (const float *)v.data + r0 * v.stride, v.stride, (float *)kc.data, kc.stride,
                     (float *)vc.data, vc.stride, (int)k.cols, (int)v.cols, dst, (int)kc.dtype);
        if (!ds_cu_launched(cb, op)) return;
    }
}

void ds_cu_qk_norm_rope_attention_paged(ds_backend *be, ds_tensor out, ds_tensor q, ds_tensor qw, ds_tensor k,
                                        ds_tensor kw, ds_tensor v, ds_tensor k_cache, ds_tensor v_cache, int head_dim,
                                        float eps, const float *inv_freq, const ds_attn_params *p) {
    ds_cuda_backend *cb = ds_cu(be);
    if (cb->reg.active) {
        ds_cu_fail(cb, "qk_norm_rope_attention",
                   "paged KV caches inside a step region (the page tables are host arrays)");
        return;
    }
    if (k.rows <= 0) return;
    /* ds_qk_norm_rope_store's sequence with the row copies as one launch. */
    if (q.rows > 0) ds_qk_norm_rope(be, q, qw, k, kw, head_dim, eps, p->q_pos, inv_freq);
    else ds_rmsnorm_rope(be, k, kw, head_dim, eps, p->q_pos, inv_freq);
    store_paged(cb, k, v, k_cache, v_cache, p->q_pos, p->pages);
    if (!cb->err) be->ops->attention(be, out, q, k_cache, v_cache, p);
}
