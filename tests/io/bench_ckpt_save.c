/* Checkpoint saves, one writer against every rank through MPI-IO (run by
 * hand under mpiexec; timing never lives in a test):
 *   mpiexec -n 2 bench_ckpt_save [ddp|fsdp] [repeats]
 * The medium GPT of fsc-bench (L8 C512 H8 T256 V8192) takes one AdamW step,
 * then the two paths save alternately (FSC_PARALLEL_IO=0, then 1), each
 * `repeats` times. Per save it prints the wall time (the slowest rank's) and
 * each rank's peak extra memory: the allocator's peak over all tags during
 * the save minus what the rank held before it, beside the rank's shard of
 * the saved state (parameters plus optimizer state it holds). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsc/gpt.h"
#include "fsc/trainer.h"

enum { T = 256, B = 1 };

static int gpt_loss(fsc_module *m, const fsc_ctx *ctx, const fsc_micro_batch *mb, void *user,
                    float *loss) {
    (void)user;
    int32_t x[B * T], y[B * T];
    for (int i = 0; i < B * T; i++)
        x[i] = (int32_t)((mb->sample0 * 131 + i * 7) % 8192), y[i] = (x[i] + 1) % 8192;
    return fsc_gpt_train_micro(m, ctx, x, y, mb->rows, T, -1, mb->norm, loss);
}

int main(int argc, char **argv) {
    if (fsc_dist_init(&argc, &argv, NULL)) return 1;
    const char *strategy = argc > 1 ? argv[1] : "fsdp";
    int repeats = argc > 2 ? atoi(argv[2]) : 3;
    const int rank = fsc_dist_rank(), world = fsc_dist_size();
    fsc_gpt_config g = {.vocab = 8192, .seq = T, .layers = 8, .d_model = 512, .heads = 8};
    fsc_module *m = fsc_gpt_new(&g);
    fsc_trainer_config cfg = {
        .strategy = {.name = strategy, .seed = 1},
        .optim = {.kind = FSC_OPTIM_ADAMW, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.95},
        .batch = B,
        .targets_per_sample = T,
        .loss = gpt_loss};
    fsc_trainer *t = fsc_trainer_new(m, &cfg);
    fsc_step_result r;
    if (!t || fsc_trainer_step(t, &r)) {
        fprintf(stderr, "rank %d: %s\n", rank, fsc_last_error());
        return 1;
    }
    char dir[64] = "/tmp/fsc_ckpt_bench_XXXXXX";
    int32_t buf[16] = {0};
    if (rank == 0 && mkdtemp(dir)) memcpy(buf, dir, sizeof dir);
    fsc_group_broadcast(fsc_group_world(), buf, 16, FSC_DTYPE_I32, 0);
    memcpy(dir, buf, sizeof dir);
    /* this rank's share of the state: what its tags hold beside the activations */
    const double held = (double)(fsc_mem_current(FSC_MEM_PARAMS) + fsc_mem_current(FSC_MEM_OPTIM));
    const double params = (double)fsc_gpt_num_params(&g);
    const double shard = strcmp(strategy, "fsdp") ? 3 * 4 * params : held;
    if (rank == 0)
        printf("%s, %d ranks, %.1f M parameters; weights %.1f MiB, optimizer state %.1f MiB; "
               "this rank's shard %.1f MiB\n",
               strategy, world, params / 1e6, 4 * params / 1048576, 8 * params / 1048576,
               shard / 1048576);
    for (int i = 0; i < 2 * repeats; i++) {
        const bool par = i % 2;
        setenv("FSC_PARALLEL_IO", par ? "1" : "0", 1);
        char ck[128];
        snprintf(ck, sizeof ck, "%s/%d", dir, i);
        fsc_group_barrier(fsc_group_world());
        fsc_mem_reset_peaks();
        const double before = (double)fsc_mem_current_total(), t0 = fsc_now();
        int rc = fsc_trainer_save_checkpoint(t, ck, 0, NULL, NULL);
        int64_t us = (int64_t)((fsc_now() - t0) * 1e6);
        int64_t extra = (int64_t)((double)fsc_mem_peak_total() - before), all_extra[64] = {0};
        fsc_group_allreduce(fsc_group_world(), &us, 1, FSC_DTYPE_I64, FSC_REDUCE_MAX);
        if (world <= 64)
            fsc_group_allgather(fsc_group_world(), &extra, all_extra, 1, FSC_DTYPE_I64);
        const double dt = (double)us * 1e-6;
        if (rc) fprintf(stderr, "rank %d: %s\n", rank, fsc_last_error());
        if (rank == 0) {
            printf("%-10s %6.3f s   peak extra MiB per rank:", par ? "parallel" : "one-writer", dt);
            for (int q = 0; q < world && q < 64; q++)
                printf(" %.1f", (double)all_extra[q] / 1048576);
            printf("   (shard + 16 MiB = %.1f)\n", (shard + 16 * 1048576.0) / 1048576);
        }
    }
    if (rank == 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", dir);
    }
    fsc_trainer_free(t);
    fsc_module_free(m);
    return fsc_dist_finalize() ? 1 : 0;
}
