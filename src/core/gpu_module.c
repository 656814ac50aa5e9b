/* gpu_module.c - finds and loads libckv_cuda.so once (see gpu_module.h). */
#define _GNU_SOURCE
#include "core/gpu_module.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const ckv_gpu_module *table;
static char why[1024];

int ckv_gpu_module_built(void) {
#ifdef CKV_HAVE_GPU_MODULE
    return 1;
#else
    return 0;
#endif
}

static void *try_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h && access(path, F_OK) == 0) /* there but not loadable: say why (a missing CUDA library, ...) */
        snprintf(why, sizeof why, "%s does not load: %s", path, dlerror());
    return h;
}

static void load(void) {
    if (!ckv_gpu_module_built()) {
        snprintf(why, sizeof why, "this build of ckv has no CUDA support (configure with -DCKV_CUDA=ON where nvcc is installed)");
        return;
    }
    void *h = NULL;
    const char *env = getenv("CKV_GPU_MODULE");
    char tried[900] = "";
    if (env && env[0]) {
        h = try_open(env);
        snprintf(tried, sizeof tried, "%s", env);
    } else {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n > 0) {
            exe[n] = '\0';
            char *slash = strrchr(exe, '/');
            if (slash) *slash = '\0';
            static const char *const dirs[] = {"", "/../lib/ckv", "/../lib", "/.."};
            for (size_t i = 0; !h && i < sizeof dirs / sizeof dirs[0]; i++) {
                char path[PATH_MAX + 64];
                snprintf(path, sizeof path, "%s%s/%s", exe, dirs[i], CKV_GPU_MODULE_FILE);
                h = try_open(path);
                if (i == 0) snprintf(tried, sizeof tried, "%s", path);
            }
        }
    }
    if (!h) {
        if (why[0]) return;
        if (env && env[0])
            snprintf(why, sizeof why, "the CUDA module was not found at CKV_GPU_MODULE=%s", env);
        else
            snprintf(why, sizeof why, "the CUDA module %s was not found beside the ckv binary (%s) nor in ../lib/ckv, ../lib "
                     "or .. from there (CKV_GPU_MODULE names another path)", CKV_GPU_MODULE_FILE, tried[0] ? tried : "?");
        return;
    }
    const ckv_gpu_module *(*entry)(void) = (const ckv_gpu_module *(*)(void))dlsym(h, CKV_GPU_MODULE_ENTRY);
    const ckv_gpu_module *t = entry ? entry() : NULL;
    if (!t || t->abi != CKV_GPU_MODULE_ABI) {
        snprintf(why, sizeof why, "the CUDA module %s is not this build's (%s)", tried,
                 !t ? "no entry table" : "another interface version");
        dlclose(h);
        return;
    }
    table = t; /* kept loaded for the life of the process */
}

ckv_status ckv_gpu_module_get(const ckv_gpu_module **out) {
    pthread_once(&once, load);
    *out = table;
    if (!table) return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s", why);
    return CKV_STATUS_OK;
}
