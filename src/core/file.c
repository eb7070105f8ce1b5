/* file.c — reading a whole small file (configs, checkpoint indexes). */
#include "core/internal.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

moex_status moex_read_file(const char *path, size_t limit, char **buf, size_t *len, int *missing) {
    if (missing) *missing = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (missing) *missing = errno == ENOENT;
        return moex_fail(MOEX_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
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
