/* Step regions as CUDA graphs (backend.h ds_step / region_begin).
 *
 * A region's per-step values (ids, positions, the key count) are uploaded
 * with one host->device copy into d_step before anything of the region
 * runs; inside the region every op reads them from there (ds_cu_step_ptr),
 * and the attentions size their grids by a bucket of the key count
 * (ds_cu_att_bucket) instead of the live count. The work of one key
 * (model key + ids / positions / outputs counts + bucket) is then the same
 * launches with the same arguments whatever the step's values, so it is:
 *   1st time  run op by op from d_step (a warm-up: scratch buffers grow to
 *             this shape's size, kernels get their attributes set);
 *   2nd time  recorded by stream capture (programmatic dependent launches
 *             become programmatic edges), instantiated and launched;
 *   then      replayed: one copy of the step values, one graph launch.
 * Outputs (argmax results, walked tokens) are left in d_step's out array
 * and come back with one device->host copy at region_end, or, when the
 * step asks to keep them (ds_step.keep_out), are copied on the device to
 * the carry after the step (DS_CU_CARRY), from where the next region that
 * takes them (ds_step.n_ids_prev) copies them into its ids right after its
 * own upload: a greedy DSpark round (the drafter's walk, then the verify)
 * moves one array of ints to the host, at the verify's end.
 *
 * A recording holds device pointers: any allocation, release or scratch
 * growth bumps cb->gen and a recording from an older generation is made
 * again (scratch replaced while recording is kept alive until the next
 * wait, and that recording is used once). DS_CUDA_GRAPHS=0 runs every
 * region op by op with host values, as without regions (A/B). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/head_bound.h"

struct ds_cu_graph {
    ds_region_key key;
    int n_ids, n_pos, n_out, att_ny;
    bool warm;            /* ran once op by op */
    cudaGraphExec_t exec; /* NULL until recorded */
    uint64_t gen;         /* generation the recording is valid for */
};


/* The outputs' pinned staging, after the slots. */
static int32_t *h_out(ds_cuda_backend *cb) { return cb->h_step + DS_CU_STEP_SLOTS * DS_CU_STEP_INTS; }

void ds_cu_graphs_init(ds_cuda_backend *cb) {
    /* Per-op timing and the ring timeline are per call: they need the calls. */
    cb->graphs_on = cb->cfg.graphs && !cb->cfg.profile && !cb->cfg.ring_trace[0];
    if (!cb->graphs_on) return;
    const size_t host = (size_t)(DS_CU_STEP_SLOTS * DS_CU_STEP_INTS + DS_CU_STEP_MAX) * sizeof(int32_t);
    if (cudaMallocHost(&cb->h_step, host) != cudaSuccess ||
        cudaMalloc(&cb->d_step, (DS_CU_STEP_INTS + DS_CU_STEP_MAX) * sizeof(int32_t)) != cudaSuccess) {
        /* Without the buffers the regions run op by op. */
        if (cb->h_step) cudaFreeHost(cb->h_step);
        cb->h_step = NULL;
        cb->d_step = NULL;
        cb->graphs_on = false;
        cudaGetLastError();
    }
    cb->stats.enabled = cb->graphs_on;
}

void ds_cu_retired_free(ds_cuda_backend *cb) {
    if (cb->reg.capturing) return;
    for (int i = 0; i < cb->n_retired; i++) cudaFree(cb->retired[i]);
    cb->n_retired = 0;
}

void ds_cu_graphs_free(ds_cuda_backend *cb) {
    for (int i = 0; i < cb->n_graphs; i++)
        if (cb->graphs[i].exec) cudaGraphExecDestroy(cb->graphs[i].exec);
    free(cb->graphs);
    cb->graphs = NULL;
    cb->n_graphs = cb->cap_graphs = 0;
    ds_cu_retired_free(cb);
    if (cb->d_step) cudaFree(cb->d_step);
    if (cb->h_step) cudaFreeHost(cb->h_step);
    for (int i = 0; i < DS_CU_STEP_SLOTS; i++)
        if (cb->step_ev[i]) cudaEventDestroy(cb->step_ev[i]);
    cb->d_step = NULL;
    cb->h_step = NULL;
}

/* Key chunks (of 256 keys, attention.cu) an attention's grid spans in a
 * region of n_keys keys: the live count rounded up to a power of two, so a
 * recording serves every n_keys of its bucket (blocks past a row's keys
 * exit at once; which blocks compute, and in what order partials merge,
 * depend on the row's key range alone, never on the grid). */
static int att_bucket(int n_keys) {
    const int chunks = n_keys > 0 ? (n_keys - 1) / 256 + 1 : 1;
    int b = 1;
    while (b < chunks) b *= 2;
    return b;
}

static bool same_key(const ds_cu_graph *g, const ds_region_key *k, const ds_step *s, int ny) {
    return g->key.kind == k->kind && g->key.rows == k->rows && g->key.variant == k->variant &&
           g->key.owner == k->owner && g->n_ids == s->n_ids && g->n_pos == s->n_pos && g->n_out == s->n_out &&
           g->att_ny == ny;
}

static ds_cu_graph *find_or_add(ds_cuda_backend *cb, const ds_region_key *k, const ds_step *s, int ny) {
    for (int i = 0; i < cb->n_graphs; i++)
        if (same_key(&cb->graphs[i], k, s, ny)) return &cb->graphs[i];
    if (cb->n_graphs == cb->cap_graphs) {
        int cap = cb->cap_graphs ? 2 * cb->cap_graphs : 64;
        ds_cu_graph *g = (ds_cu_graph *)realloc(cb->graphs, (size_t)cap * sizeof *g);
        if (!g) return NULL;
        cb->graphs = g;
        cb->cap_graphs = cap;
    }
    ds_cu_graph *g = &cb->graphs[cb->n_graphs++];
    memset(g, 0, sizeof *g);
    g->key = *k;
    g->n_ids = s->n_ids;
    g->n_pos = s->n_pos;
    g->n_out = s->n_out;
    g->att_ny = ny;
    return g;
}

/* The kept outputs a step's ids take (ds_step.n_ids_prev), valid? */
static bool carry_fits(ds_cuda_backend *cb, const ds_step *step) {
    if (step->n_ids_prev <= 0) return true;
    if (step->n_ids_prev <= cb->carry_n && step->ids_prev_at >= 0 &&
        step->ids_prev_at + step->n_ids_prev <= step->n_ids)
        return true;
    ds_cu_fail(cb, "region", "ids %d..%d from kept outputs, but %d are kept and the step has %d ids",
               step->ids_prev_at, step->ids_prev_at + step->n_ids_prev, cb->carry_n, step->n_ids);
    return false;
}

/* The region runs op by op with host values: the kept outputs its ids take
 * come to the host first (a copy the host waits for). */
static bool run_eager(ds_cuda_backend *cb, ds_step *step) {
    cb->stats.eager++;
    cb->reg.active = false;
    if (step->n_ids_prev > 0 && !cb->err && carry_fits(cb, step)) {
        cb->stats.d2h++;
        if (ds_cu_ok(cb, "region", cudaMemcpyAsync(step->ids + step->ids_prev_at, cb->d_step + DS_CU_CARRY,
                                                    (size_t)step->n_ids_prev * sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, cb->stream)))
            ds_cu_ok(cb, "region", cudaStreamSynchronize(cb->stream));
    }
    return true;
}

bool ds_cu_region_begin(ds_backend *be, const ds_region_key *key, ds_step *step) {
    ds_cuda_backend *cb = ds_cu(be);
    cb->reg = ds_cu_region{};
    /* Op by op with host values: graphs off, a pending failure, or a shape
     * past what one recording takes (prefill: cuBLAS and by-value chunks). */
    if (!cb->graphs_on || cb->err || key->rows < 1 || key->rows > DS_CU_NARROW_M || step->n_ids < 0 ||
        step->n_pos < 0 || step->n_out < 0 || step->n_ids > DS_CU_STEP_MAX || step->n_pos > DS_CU_STEP_MAX ||
        step->n_out > DS_CU_STEP_MAX || step->n_keys < 1)
        return run_eager(cb, step);
    if (!carry_fits(cb, step)) return true;
    const int ny = att_bucket(step->n_keys);
    ds_cu_graph *g = find_or_add(cb, key, step, ny);
    if (!g) return run_eager(cb, step);
    /* The step's values, one copy from a pinned slot (truly asynchronous),
     * refilled only once its previous copy has run (its event). */
    const int slot = cb->step_slot;
    cb->step_slot = (slot + 1) % DS_CU_STEP_SLOTS;
    if (cb->step_ev[slot]) {
        if (!ds_cu_ok(cb, "region", cudaEventSynchronize(cb->step_ev[slot]))) return run_eager(cb, step);
    } else if (!ds_cu_ok(cb, "region", cudaEventCreateWithFlags(&cb->step_ev[slot], cudaEventDisableTiming))) {
        cb->step_ev[slot] = NULL;
        return run_eager(cb, step);
    }
    int32_t *h = cb->h_step + (size_t)slot * DS_CU_STEP_INTS;
    memset(h, 0, (1 + DS_CU_WALK) * sizeof *h);
    h[0] = step->n_keys;
    if (step->n_ids > 0) h[1] = step->ids[0]; /* the walk's anchor */
    int off = 1 + DS_CU_WALK;
    cb->reg.off_ids = off;
    if (step->n_ids) memcpy(h + off, step->ids, (size_t)step->n_ids * sizeof *h);
    off += step->n_ids;
    cb->reg.off_pos = off;
    if (step->n_pos) memcpy(h + off, step->pos, (size_t)step->n_pos * sizeof *h);
    off += step->n_pos;
    cb->reg.off_out = off;
    if (!ds_cu_ok(cb, "region", cudaMemcpyAsync(cb->d_step, h, (size_t)off * sizeof *h, cudaMemcpyHostToDevice,
                                                 cb->stream)) ||
        !ds_cu_ok(cb, "region", cudaEventRecord(cb->step_ev[slot], cb->stream)))
        return run_eager(cb, step);
    /* The kept outputs over the host's placeholders (before any op, outside any recording). */
    if (step->n_ids_prev > 0 &&
        !ds_cu_ok(cb, "region", cudaMemcpyAsync(cb->d_step + cb->reg.off_ids + step->ids_prev_at,
                                                 cb->d_step + DS_CU_CARRY, (size_t)step->n_ids_prev * sizeof(int32_t),
                                                 cudaMemcpyDeviceToDevice, cb->stream)))
        return run_eager(cb, step);
    cb->reg.active = true;
    cb->reg.step = step;
    cb->reg.att_ny = ny;
    cb->reg.entry = g;
    if (g->exec && g->gen == cb->gen) {
        if (ds_cu_ok(cb, "region replay", cudaGraphLaunch(g->exec, cb->stream))) {
            cb->stats.replays++;
            return false;
        }
        cb->reg.active = false;
        return true; /* failure recorded: run the ops (they will not run either, but the caller's state stays sane) */
    }
    if (g->exec) { /* recorded against buffers since replaced */
        ds_cu_ok(cb, "region", cudaStreamSynchronize(cb->stream));
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    if (!g->warm) { /* op by op, but from d_step (the region stays active) */
        g->warm = true;
        cb->stats.eager++;
        return true;
    }
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(cb->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
        cb->stats.eager++; /* active: from d_step */
        return true;
    }
    if (!ds_cu_ok(cb, "region capture", cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeRelaxed))) {
        cb->reg.active = false;
        return true;
    }
    cb->reg.capturing = true;
    cb->reg.cap_gen = cb->gen;
    return true;
}

void ds_cu_region_end(ds_backend *be) {
    ds_cuda_backend *cb = ds_cu(be);
    ds_cu_region r = cb->reg;
    if (!r.active) {
        cb->reg = ds_cu_region{};
        return;
    }
    if (r.capturing) {
        cudaGraph_t graph = NULL;
        cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
        cb->reg.capturing = false;
        ds_cu_graph *g = r.entry;
        if (e != cudaSuccess || !graph) {
            /* The recorded work never ran: the step's results are missing. */
            ds_cu_fail(cb, "region capture", "%s (%s); DS_CUDA_GRAPHS=0 runs without graphs", cudaGetErrorString(e),
                       cudaGetErrorName(e));
            cb->graphs_on = false;
            cb->stats.enabled = false;
        } else if (cb->err) {
            cudaGraphDestroy(graph); /* an op failed while recording: its failure is reported */
        } else {
            cudaGraphExec_t exec = NULL;
            e = cudaGraphInstantiate(&exec, graph, 0);
            cudaGraphDestroy(graph);
            if (ds_cu_ok(cb, "region instantiate", e) && ds_cu_ok(cb, "region launch", cudaGraphLaunch(exec, cb->stream))) {
                g->exec = exec;
                /* Scratch replaced while recording is freed at the next wait:
                 * this recording is then stale, and is made again. */
                g->gen = cb->gen == r.cap_gen ? cb->gen : cb->gen - 1;
                cb->stats.captures++;
            } else if (exec) {
                cudaGraphExecDestroy(exec);
            }
        }
    }
    ds_step *st = (ds_step *)r.step; /* the caller's step (region_begin took it non-const) */
    if (st->keep_out && st->n_out > 0 && !cb->err) {
        /* Left on the device for the next region's ids: no copy to the host, no wait. */
        if (ds_cu_ok(cb, "region", cudaMemcpyAsync(cb->d_step + DS_CU_CARRY, cb->d_step + r.off_out,
                                                    (size_t)st->n_out * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                                    cb->stream))) {
            cb->carry_n = st->n_out;
            st->out_kept = true;
        }
    } else if (st->n_out > 0 && !cb->err) {
        cb->stats.d2h++;
        if (ds_cu_ok(cb, "region", cudaMemcpyAsync(h_out(cb), cb->d_step + r.off_out, (size_t)st->n_out * sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, cb->stream)) &&
            ds_cu_ok(cb, "region", cudaStreamSynchronize(cb->stream))) {
            memcpy(st->out, h_out(cb), (size_t)st->n_out * sizeof(int32_t));
            ds_cu_retired_free(cb);
        }
    }
    cb->reg = ds_cu_region{};
}

void ds_cu_region_stats(ds_backend *be, ds_region_stats *out) {
    ds_cuda_backend *cb = ds_cu(be);
    *out = cb->stats;
    out->graphs = 0;
    for (int i = 0; i < cb->n_graphs; i++) out->graphs += cb->graphs[i].exec != NULL;
    ds_cu_boxes_stats(cb, &out->weight_copies, &out->weight_copy_bytes);
    if (cb->head && cb->head->q) { /* the drafter's LM head in int8 (head_bound.cu) */
        out->weight_copies++;
        out->weight_copy_bytes += cb->head->V * cb->head->K + cb->head->V * 3 * (int64_t)sizeof(float);
    }
}

const int32_t *ds_cu_step_ptr(ds_cuda_backend *cb, const char *op, const int32_t *p, int64_t n) {
    if (!cb->reg.active) return NULL;
    const ds_step *s = cb->reg.step;
    if (p >= s->ids && p + n <= s->ids + s->n_ids) return cb->d_step + cb->reg.off_ids + (p - s->ids);
    if (p >= s->pos && p + n <= s->pos + s->n_pos) return cb->d_step + cb->reg.off_pos + (p - s->pos);
    if (p >= s->out && p + n <= s->out + s->n_out) return cb->d_step + cb->reg.off_out + (p - s->out);
    ds_cu_fail(cb, op, "in a step region, %lld per-step values must be read from (or written to) the region's "
               "ds_step arrays (backend.h)", (long long)n);
    return NULL;
}

bool ds_cu_outside_region(ds_cuda_backend *cb, const char *op) {
    if (!cb->reg.active) return true;
    ds_cu_fail(cb, op, "waits for the device or moves host memory inside a step region");
    return false;
}
