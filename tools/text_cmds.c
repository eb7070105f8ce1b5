/* text_cmds.c — `moex tokenize`: text to token ids and back with a tokenizer.json. */
#define _POSIX_C_SOURCE 200809L

#include "cli.h"
#include "text_cmds.h"
#include "moex.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *USAGE = "usage: moex tokenize DIR (TEXT | --file F | --decode ID,ID,...) [--json] [--no-special] [--time]\n"
                           "       moex tokenize [options] DIR -- TEXT    (a TEXT that starts with \"--\")\n"
                           "  DIR holds tokenizer.json (or is the file). TEXT or the bytes of F become ids (the\n"
                           "  post-processor's special tokens included unless --no-special); --decode turns ids\n"
                           "  into text (special tokens dropped with --no-special). --json prints\n"
                           "  {\"ids\": [...], \"pieces\": [...]} or {\"text\": ...}. --time prints the encode's (or\n"
                           "  decode's) wall time and rate on stderr.\n";

static int usage_error(const char *fmt, const char *a) {
    fprintf(stderr, "moex tokenize: ");
    fprintf(stderr, fmt, a);
    fprintf(stderr, "\n%s", USAGE);
    return 2;
}

/* The bytes of file path (exactly, NULs included). */
static int read_all(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moex tokenize: %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap) break;
        char *g = realloc(b, cap *= 2);
        if (!g) free(b);
        b = g;
    }
    const int err = ferror(f);
    fclose(f);
    if (!b || err) {
        free(b);
        fprintf(stderr, "moex tokenize: %s: %s\n", path, b ? "read error" : "out of memory");
        return 1;
    }
    *out = b, *len = n;
    return 0;
}

/* "1,2,3" -> ids (each in 0 .. 2^31-1). */
static int parse_ids(const char *s, int32_t **ids, int64_t *n) {
    int64_t cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    char *copy = strdup(s);
    int rc = 0;
    for (char *save = NULL, *p = copy ? strtok_r(copy, ",", &save) : NULL; v && p; p = strtok_r(NULL, ",", &save)) {
        uint64_t x;
        if (cli_parse_u64(p, INT32_MAX, &x) != CLI_NUM_OK) {
            rc = usage_error("--decode: \"%s\" is not a token id (0 .. 2147483647)", p);
            break;
        }
        if (k == cap) {
            int32_t *g = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!g) free(v);
            v = g;
            if (!v) break;
        }
        v[k++] = (int32_t)x;
    }
    free(copy);
    if (!rc && (!v || !copy)) {
        fprintf(stderr, "moex tokenize: out of memory\n");
        rc = 1;
    }
    if (!rc && !k) rc = usage_error("--decode: no ids in \"%s\"", s);
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v, *n = k;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    fprintf(stderr, "moex tokenize: %s: %s\n", what, moex_last_error());
    return 1;
}

/* JSON output through cJSON (strings escaped; invalid UTF-8 in a piece is cJSON's to keep as bytes). */
static int print_json(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!s) {
        fprintf(stderr, "moex tokenize: out of memory for the JSON output\n");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

int moex_cli_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *file = NULL, *decode = NULL;
    int json = 0, special = 1, timed = 0, options = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options && !strcmp(a, "--")) options = 0; /* a TEXT that starts with "--" follows */
        else if (!options) {
            if (!dir) dir = a;
            else if (!text) text = a;
            else return usage_error("one TEXT only (\"%s\" is one too many; quote the text)", a);
        } else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--no-special")) special = 0;
        else if (!strcmp(a, "--time")) timed = 1;
        else if (!strcmp(a, "--file") || !strcmp(a, "--decode")) {
            if (i + 1 >= argc) return usage_error("%s needs a value", a);
            *(a[2] == 'f' ? &file : &decode) = argv[++i];
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("%s", USAGE);
            return 0;
        } else if (a[0] == '-' && a[1] == '-') {
            return usage_error("unknown option %s", a);
        } else if (!dir) {
            dir = a;
        } else if (!text) {
            text = a;
        } else {
            return usage_error("one TEXT only (\"%s\" is one too many; quote the text)", a);
        }
    }
    if (!dir) return usage_error("%s", "no DIR");
    if ((text != NULL) + (file != NULL) + (decode != NULL) != 1)
        return usage_error("%s", "give exactly one of TEXT, --file F and --decode IDS");
    moex_tokenizer *t = NULL;
    if (moex_tokenizer_load(dir, &t) != MOEX_OK) return fail("loading the tokenizer");
    int rc = 0;
    if (decode) {
        int32_t *ids = NULL;
        int64_t n = 0;
        char *out = NULL;
        size_t len = 0;
        if (!(rc = parse_ids(decode, &ids, &n))) {
            const double t0 = now_s();
            const moex_status st = moex_tokenizer_decode(t, ids, n, !special, &out, &len);
            if (timed && !st)
                fprintf(stderr, "moex tokenize: decoded %lld ids into %zu bytes in %.6f s\n", (long long)n, len, now_s() - t0);
            if (st != MOEX_OK) {
                rc = fail("decoding");
            } else if (json) {
                cJSON *root = cJSON_CreateObject();
                if (root && !cJSON_AddStringToObject(root, "text", out)) cJSON_Delete(root), root = NULL;
                rc = print_json(root);
            } else {
                fwrite(out, 1, len, stdout);
                printf("\n");
            }
        }
        moex_tokenizer_buffer_free(out);
        free(ids);
    } else {
        char *bytes = NULL;
        size_t len = text ? strlen(text) : 0;
        if (file && (rc = read_all(file, &bytes, &len))) {
            moex_tokenizer_free(t);
            return rc;
        }
        int32_t *ids = NULL;
        int64_t n = 0;
        const double t0 = now_s();
        const moex_status st = moex_tokenizer_encode(t, file ? bytes : text, len, special, &ids, &n);
        const double sec = now_s() - t0;
        if (timed && !st)
            fprintf(stderr, "moex tokenize: encoded %zu bytes into %lld ids in %.6f s (%.2f MB/s)\n", len, (long long)n, sec,
                    sec > 0 ? (double)len / sec / 1e6 : 0.0);
        if (st != MOEX_OK) {
            rc = fail("encoding");
        } else if (json) {
            cJSON *root = cJSON_CreateObject(), *ja = cJSON_AddArrayToObject(root, "ids"),
                  *jp = cJSON_AddArrayToObject(root, "pieces");
            for (int64_t i = 0; ja && jp && i < n; i++) {
                const char *piece = moex_tokenizer_token(t, ids[i]);
                cJSON_AddItemToArray(ja, cJSON_CreateNumber(ids[i]));
                cJSON_AddItemToArray(jp, cJSON_CreateString(piece ? piece : ""));
            }
            rc = print_json(ja && jp ? root : (cJSON_Delete(root), NULL));
        } else {
            for (int64_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", (int)ids[i]);
            printf("\n");
        }
        moex_tokenizer_buffer_free(ids);
        free(bytes);
    }
    moex_tokenizer_free(t);
    if (!rc && cli_stdout_flush()) rc = 1;
    return rc;
}
