/* file.c — opening regular files only, and reading a whole small one (configs, checkpoint indexes). */
#include "core/internal.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

moex_status moex_open_regular(const char *path, int *fd, struct stat *sb, int *missing) {
    if (missing) *missing = 0;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (reads of a regular file ignore it) */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0) {
        if (missing) *missing = errno == ENOENT;
        return moex_fail(MOEX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    if (fstat(f, sb) != 0) {
        int e = errno;
        close(f);
        return moex_fail(MOEX_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb->st_mode)) {
        close(f);
        return moex_fail(MOEX_ERR_IO, "%s: not a regular file", path);
    }
    *fd = f;
    return MOEX_OK;
}

moex_status moex_read_file(const char *path, size_t limit, char **buf, size_t *len, int *missing) {
    int fd;
    struct stat sb;
    moex_status st0 = moex_open_regular(path, &fd, &sb, missing);
    if (st0) return st0;
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        int e = errno;
        close(fd);
        return moex_fail(MOEX_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    moex_status st = MOEX_OK;
    while (b) {
        if (n == cap) {
            if (cap >= limit) {
                st = moex_fail(MOEX_ERR_FORMAT, "%s: larger than the limit of %zu bytes", path, limit);
                break;
            }
            cap = cap * 2 < limit ? cap * 2 : limit;
            char *nb = realloc(b, cap + 1);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
        size_t got = fread(b + n, 1, cap - n, fp);
        n += got;
        if (got == 0) {
            if (ferror(fp)) st = moex_fail(MOEX_ERR_IO, "%s: read error", path);
            break;
        }
    }
    fclose(fp);
    if (!b) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory reading the file", path);
    if (st != MOEX_OK) {
        free(b);
        return st;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return MOEX_OK;
}
