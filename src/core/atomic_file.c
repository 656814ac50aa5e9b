/* atomic_file.c - temporary + fsync + rename + directory fsync (see atomic_file.h). */
#define _POSIX_C_SOURCE 200809L
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a non-regular file is, for the message. */
static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISLNK(m)) return "a symbolic link";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

/* 0 with *exists set when the target may be replaced; else an error. */
static ckv_status check_target(const char *path, const char *what, int *exists, mode_t *mode) {
    struct stat sb;
    *exists = 0;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return CKV_STATUS_OK;
        return ckv_error(CKV_STATUS_ERR_IO, "%s%s%s: %s", what, what[0] ? ": " : "", path, strerror(errno));
    }
    if (!S_ISREG(sb.st_mode))
        return ckv_error(CKV_STATUS_ERR_IO, "%s%s%s is %s; ckv writes only regular files, refusing to replace it", what,
                         what[0] ? ": " : "", path, file_kind(sb.st_mode));
    *exists = 1;
    *mode = sb.st_mode & 07777;
    return CKV_STATUS_OK;
}

ckv_status ckv_atomic_file_check(const char *path, const char *what) {
    int exists;
    mode_t mode;
    if (!what) what = "";
    if (!path || !path[0]) return ckv_error(CKV_STATUS_ERR_ARG, "%s%sempty output path", what, what[0] ? ": " : "");
    return check_target(path, what, &exists, &mode);
}

ckv_status ckv_atomic_file_open(ckv_atomic_file *a, const char *path, const char *what) {
    static atomic_uint counter;
    memset(a, 0, sizeof *a);
    if (!what) what = "";
    if (!path || !path[0]) return ckv_error(CKV_STATUS_ERR_ARG, "%s%sempty output path", what, what[0] ? ": " : "");
    int exists;
    mode_t mode = 0;
    CKV_TRY(check_target(path, what, &exists, &mode));
    size_t n = strlen(path) + 48;
    a->path = strdup(path);
    a->tmp = malloc(n);
    if (!a->path || !a->tmp) {
        ckv_atomic_file_abort(a);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    }
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) { /* a stale temporary of a killed run: next name */
        snprintf(a->tmp, n, "%s.tmp%ld.%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
        fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        ckv_status e = ckv_error(CKV_STATUS_ERR_IO, "%s%scannot create a temporary beside %s: %s", what,
                                 what[0] ? ": " : "", path, strerror(errno));
        free(a->tmp);
        a->tmp = NULL; /* nothing to remove */
        ckv_atomic_file_abort(a);
        return e;
    }
    if (exists) (void)fchmod(fd, mode); /* keep the replaced file's permissions; failing that is harmless */
    a->f = fdopen(fd, "wb");
    if (!a->f) {
        ckv_status e = ckv_error(CKV_STATUS_ERR_IO, "%s: %s", a->tmp, strerror(errno));
        close(fd);
        ckv_atomic_file_abort(a);
        return e;
    }
    return CKV_STATUS_OK;
}

void ckv_atomic_file_abort(ckv_atomic_file *a) {
    if (!a) return;
    if (a->f) fclose(a->f);
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    memset(a, 0, sizeof *a);
}

/* Syncs the directory holding path, so the rename survives a crash. */
static ckv_status sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    ckv_status st = CKV_STATUS_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != EBADF))
        st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot sync its directory: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return st;
}

ckv_status ckv_atomic_file_commit(ckv_atomic_file *a) {
    if (!a || !a->f) return ckv_error(CKV_STATUS_ERR_ARG, "atomic file: not open");
    ckv_status st = CKV_STATUS_OK;
    if (fflush(a->f) != 0 || ferror(a->f))
        st = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed: %s", a->path, strerror(errno));
    else if (fsync(fileno(a->f)) != 0 && errno != EINVAL)
        st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot sync: %s", a->path, strerror(errno));
    if (fclose(a->f) != 0 && st == CKV_STATUS_OK) st = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed: %s", a->path, strerror(errno));
    a->f = NULL;
    int exists;
    mode_t mode;
    if (st == CKV_STATUS_OK) st = check_target(a->path, "", &exists, &mode); /* replaced meanwhile? */
    if (st == CKV_STATUS_OK && rename(a->tmp, a->path) != 0)
        st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot move the new file into place: %s", a->path, strerror(errno));
    if (st == CKV_STATUS_OK) {
        free(a->tmp);
        a->tmp = NULL; /* renamed: nothing to remove */
        st = sync_dir(a->path);
    }
    ckv_atomic_file_abort(a);
    return st;
}

ckv_status ckv_write_file_atomic(const char *path, const void *data, size_t len, const char *what) {
    ckv_atomic_file a;
    CKV_TRY(ckv_atomic_file_open(&a, path, what));
    if (len && fwrite(data, 1, len, a.f) != len) {
        ckv_status e = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        ckv_atomic_file_abort(&a);
        return e;
    }
    return ckv_atomic_file_commit(&a);
}
