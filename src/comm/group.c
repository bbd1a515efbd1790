/* Process groups: a control communicator, a backend context for data, the
 * sequence counter the watchdog keys on, and per-group statistics.
 *
 * The one idea: a group owns two channels. The control communicator is
 * always MPI and carries only tiny announcements (and the split itself); the
 * data plane is whatever backend the group was made with.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

const char *fsc_coll_kind_name(int kind) {
    static const char *names[] = {"allreduce",      "reduce",   "broadcast", "allgather",
                                  "reduce_scatter", "alltoall", "barrier",   "send",
                                  "recv",           "split"};
    return kind >= 0 && kind <= FSC_KIND_SPLIT ? names[kind] : "?";
}

int fsc_group_create(const char *name, MPI_Comm ctrl, void *be_ctx, fsc_group **out) {
    *out = NULL;
    fsc_group *g = calloc(1, sizeof *g);
    if (!g) return fsc_error(FSC_ERR_NOMEM, "out of memory creating group %s", name);
    snprintf(g->name, sizeof g->name, "%s", name && name[0] ? name : "group");
    MPI_Comm_set_errhandler(ctrl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(ctrl, &g->rank);
    MPI_Comm_size(ctrl, &g->size);
    g->ctrl = ctrl;
    g->be = &fsc_backend_mpi;
    g->be_ctx = be_ctx;
    g->world_ranks = malloc((size_t)g->size * sizeof *g->world_ranks);
    g->last_seq = malloc((size_t)g->size * sizeof *g->last_seq);
    g->last_kind = malloc((size_t)g->size * sizeof *g->last_kind);
    if (!g->world_ranks || !g->last_seq || !g->last_kind) {
        free(g->world_ranks);
        free(g->last_seq);
        free(g->last_kind);
        free(g);
        return fsc_error(FSC_ERR_NOMEM, "out of memory creating group %s", name);
    }
    for (int r = 0; r < g->size; r++) {
        g->last_seq[r] = -1;
        g->last_kind[r] = -1;
    }
    /* world ranks of the members, for messages and fsc_group_world_rank */
    int wr = fsc_dist_rt.rank;
    int rc = MPI_Allgather(&wr, 1, MPI_INT, g->world_ranks, 1, MPI_INT, ctrl);
    if (rc != MPI_SUCCESS) {
        int st = fsc_dist_mpi_error(rc, "MPI_Allgather(world ranks)");
        free(g->world_ranks);
        free(g->last_seq);
        free(g->last_kind);
        free(g);
        return st;
    }
    *out = g;
    return FSC_OK;
}

void fsc_group_destroy(fsc_group *g) {
    if (!g) return;
    /* A group with an operation abandoned after a timeout keeps its
     * communicators: MPI may still deliver into them. */
    if (g->broken != FSC_ERR_TIMEOUT) {
        g->be->free(g->be_ctx);
        MPI_Comm_free(&g->ctrl);
    }
    free(g->world_ranks);
    free(g->last_seq);
    free(g->last_kind);
    free(g);
}

int fsc_group_split(fsc_group *parent, int color, int key, const char *name, fsc_group **out) {
    if (!out) return fsc_error(FSC_ERR_INVALID, "fsc_group_split: out is NULL");
    *out = NULL;
    int rc = fsc_dist_require_init("fsc_group_split");
    if (rc) return rc;
    if (!parent) return fsc_error(FSC_ERR_INVALID, "fsc_group_split: parent group is NULL");
    fsc_coll_args a = {.kind = FSC_KIND_SPLIT, .in = name, .out = out, .root = color, .tag = key};
    rc = fsc_request_run(parent, &a);
    if (rc)
        return fsc_error_context(rc, "fsc_group_split(%s from %s): ", name ? name : "group",
                                 parent->name);
    return FSC_OK;
}

void fsc_group_free(fsc_group *g) {
    if (!g || g == fsc_dist_rt.world) return;
    fsc_group_destroy(g);
}

int fsc_group_rank(const fsc_group *g) {
    return g ? g->rank : -1;
}
int fsc_group_size(const fsc_group *g) {
    return g ? g->size : 0;
}
const char *fsc_group_name(const fsc_group *g) {
    return g ? g->name : "(null)";
}
int64_t fsc_group_seq(const fsc_group *g) {
    return g ? g->seq : -1;
}

int fsc_group_world_rank(const fsc_group *g, int r) {
    if (!g || r < 0 || r >= g->size) return -1;
    return g->world_ranks[r];
}

fsc_group_stats fsc_group_get_stats(const fsc_group *g) {
    fsc_group_stats s;
    memset(&s, 0, sizeof s);
    if (g) s = g->stats;
    return s;
}

void fsc_group_reset_stats(fsc_group *g) {
    if (g) memset(&g->stats, 0, sizeof g->stats);
}
