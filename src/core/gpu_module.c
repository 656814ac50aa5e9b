/* gpu_module.c - finds and loads libckv_cuda.so once and looks its entry points up by name (see
 * gpu_module.h). It calls none of them. */
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
static void *module;       /* the dlopen handle, kept for the life of the process */
static void *module_base;  /* where the module is mapped (dladdr's dli_fbase of its ABI symbol) */
static char module_path[900];
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
    int (*abi)(void) = (int (*)(void))dlsym(h, CKV_GPU_MODULE_ABI_SYMBOL);
    Dl_info info;
    if (!abi || abi() != CKV_GPU_MODULE_ABI || !dladdr((void *)abi, &info)) {
        snprintf(why, sizeof why, "the CUDA module %s is not this build's (%s)", tried,
                 !abi ? "no " CKV_GPU_MODULE_ABI_SYMBOL : "another interface version");
        dlclose(h);
        return;
    }
    module_base = info.dli_fbase;
    snprintf(module_path, sizeof module_path, "%s", info.dli_fname ? info.dli_fname : tried);
    module = h;
}

ckv_status ckv_gpu_module_load(void) {
    pthread_once(&once, load);
    if (!module) return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s", why);
    return CKV_STATUS_OK;
}

ckv_status ckv_gpu_module_symbol(const char *name, ckv_gpu_module_fn *out) {
    *out = NULL;
    CKV_TRY(ckv_gpu_module_load());
    void *sym = dlsym(module, name);
    Dl_info info;
    /* the module's own definition only: never a function of the binary that a lookup could reach */
    if (!sym || !dladdr(sym, &info) || info.dli_fbase != module_base)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "the CUDA module %s defines no %s", module_path, name);
    *out = (ckv_gpu_module_fn)sym;
    return CKV_STATUS_OK;
}
