/* Test-only fault switches (see fault.h): one process-wide setting. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fault.h"

fsc_fault fsc_fault_active = FSC_FAULT_NONE;
static int ckpt_kill_point;

void fsc_fault_ckpt_point(int k) {
    if (fsc_fault_active != FSC_FAULT_CKPT_KILL || k != ckpt_kill_point) return;
    raise(SIGKILL);
    _exit(137); /* not reached */
}

bool fsc_fault_fires(fsc_fault f) {
    static unsigned calls;
    return fsc_fault_is(f) && calls++ % 2 == 0;
}

bool fsc_fault_set(const char *name) {
    static const struct {
        const char *name;
        fsc_fault fault;
    } names[] = {{"drop-grad", FSC_FAULT_DROP_GRAD},
                 {"reduce-twice", FSC_FAULT_REDUCE_TWICE},
                 {"shard-offset", FSC_FAULT_SHARD_OFFSET},
                 {"io-write", FSC_FAULT_IO_WRITE},
                 {"cp-skip-block", FSC_FAULT_CP_SKIP_BLOCK}};
    fsc_fault_active = FSC_FAULT_NONE;
    if (!name || !*name) return true;
    if (strncmp(name, "ckpt-kill:", 10) == 0) {
        char *end;
        long k = strtol(name + 10, &end, 10);
        if (end == name + 10 || *end || k < 1 || k > FSC_CKPT_POINTS) return false;
        ckpt_kill_point = (int)k;
        return fsc_fault_active = FSC_FAULT_CKPT_KILL, true;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) return fsc_fault_active = names[i].fault, true;
    return false;
}
