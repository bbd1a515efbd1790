/* What the heartbeat learns of this host (heartbeat.h): the identity that
 * tells which peers share it, this process's addresses, and a local peer's
 * state in /proc. Only Linux's /proc and getifaddrs; no heartbeat state. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "heartbeat.h"

/* The inode number of one of this process's namespaces ("pid:[4026531836]"
 * -> "4026531836"), "" if unknown. */
static void ns_inode(const char *which, char *out, size_t n) {
    char path[32], link[48];
    snprintf(path, sizeof path, "/proc/self/ns/%s", which);
    ssize_t k = readlink(path, link, sizeof link - 1);
    link[k > 0 ? k : 0] = '\0';
    const char *at = strchr(link, '[');
    snprintf(out, n, "%.*s", at ? (int)strcspn(at + 1, "]") : 0, at ? at + 1 : "");
}

void fsc_hb_host_identity(char *out, size_t n) {
    char boot[40] = "", pid[16], net[16];
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    ns_inode("pid", pid, sizeof pid);
    ns_inode("net", net, sizeof net);
    if (!boot[0]) gethostname(boot, sizeof boot - 1);
    snprintf(out, n, "%.36s/%.12s/%.12s", boot, pid, net);
    /* tests: FSC_HEARTBEAT_PROC=0 treats every peer as remote (no /proc, no loopback) */
    bool use_proc = true; /* an invalid value was refused by fsc_dist_init */
    fsc_env_bool("FSC_HEARTBEAT_PROC", &use_proc);
    if (!use_proc) snprintf(out, n, "pid-%d", (int)getpid());
}

int fsc_hb_local_ips(uint32_t *ip, int max) {
    struct ifaddrs *list = NULL;
    int n = 0;
    if (getifaddrs(&list) != 0) return 0;
    for (struct ifaddrs *i = list; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
        uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        if ((ntohl(a) >> 24) == 127) continue;
        ip[n++] = a;
    }
    freeifaddrs(list);
    return n;
}

char fsc_hb_proc_state(int pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : 0;
}
