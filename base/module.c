/* Run-time module lookup (base/module.h). */
#include "base/module.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The directory of the running binary (/proc/self/exe), without a trailing slash: the tree
 * can be moved as a whole, so nothing is looked up by an installed prefix. */
static bool tsr__exe_dir(char *dir, size_t cap) {
    ssize_t n = readlink("/proc/self/exe", dir, cap - 1);
    if (n <= 0) return false;
    dir[n] = 0;
    char *slash = strrchr(dir, '/');
    if (!slash) return false;
    *slash = 0;
    return true;
}

bool tsr_module_find(const char *file, char *path, size_t cap, char *looked, size_t lcap) {
    char exe[PATH_MAX];
    const char *env = getenv("TSR_MODULE_DIR");
    char dirs[4][PATH_MAX + 16];
    int nd = 0;
    if (env && *env) snprintf(dirs[nd++], sizeof dirs[0], "%s", env);
    if (tsr__exe_dir(exe, sizeof exe)) {
        snprintf(dirs[nd++], sizeof dirs[0], "%s", exe);
        snprintf(dirs[nd++], sizeof dirs[0], "%s/../lib/tessera", exe);
        snprintf(dirs[nd++], sizeof dirs[0], "%s/..", exe);
    }
    size_t at = 0;
    looked[0] = 0;
    for (int i = 0; i < nd; i++) {
        int w = snprintf(path, cap, "%s/%s", dirs[i], file);
        if (w > 0 && (size_t)w < cap && access(path, F_OK) == 0) return true;
        if (at < lcap)
            at += (size_t)snprintf(looked + at, lcap - at, "%s%s", i ? ", " : "", dirs[i]);
    }
    return false;
}
