/* SIGINT/SIGTERM stop fsc-train between steps, never inside one. The
 * signal may reach only some ranks (a scheduler, a kill of one pid), so
 * the ranks agree once per step with a max-reduction of what each saw:
 * every rank then stops after the same step, saves the same checkpoint and
 * exits alike. */
#define _POSIX_C_SOURCE 200809L /* sigaction */
#include <signal.h>
#include <string.h>

#include "train_run.h"

static volatile sig_atomic_t received;

static void on_signal(int sig) {
    if (received) { /* asked twice: stop now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    received = sig;
}

void train_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART; /* file and socket calls carry on; the loop looks between steps */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int train_signals_agree(int *sig) {
    int32_t s = received;
    int rc = FSC_OK;
    if (fsc_dist_size() > 1)
        rc = fsc_group_allreduce(fsc_group_world(), &s, 1, FSC_DTYPE_I32, FSC_REDUCE_MAX);
    *sig = rc ? 0 : (int)s;
    return rc;
}
