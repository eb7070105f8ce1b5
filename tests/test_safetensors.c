/*
 * test_safetensors.c — the safetensors parser and the checkpoint reader:
 * valid single and sharded checkpoints, tensors used in place from the
 * mapping, every malformed-file case with its message, a >4 GiB sparse shard.
 *
 * Files are written from C (st_image() below builds a file image from a
 * header and a data section) into a fresh directory under $TMPDIR.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moex.h"
#include "model/safetensors.h"
#include "testutil.h"

/* ------------------------------------------------------------------------ */
/* writing test files                                                        */
/* ------------------------------------------------------------------------ */

/* A file image in memory. */
typedef struct image {
    uint8_t *buf;
    size_t size;
} image;

/* [u64 len][header padded with spaces to a multiple of 8][data_len bytes of
 * a known pattern: byte i of the data section = (i * 7 + 3) & 255]. */
static image st_image(const char *header, size_t data_len) {
    size_t h = strlen(header), hp = (h + 7) / 8 * 8;
    image im;
    im.size = 8 + hp + data_len;
    im.buf = malloc(im.size ? im.size : 1);
    assert_non_null(im.buf);
    for (int i = 0; i < 8; i++) im.buf[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(im.buf + 8, header, h);
    memset(im.buf + 8 + h, ' ', hp - h);
    for (size_t i = 0; i < data_len; i++) im.buf[8 + hp + i] = (uint8_t)((i * 7 + 3) & 255);
    return im;
}

/* Overwrite the 8-byte header length of an image. */
static void set_len(image *im, uint64_t len) {
    for (int i = 0; i < 8; i++) im->buf[i] = (uint8_t)(len >> (8 * i));
}

/* Write bytes to dir/name. */
static void write_file(const char *dir, const char *name, const void *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n) assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* Write a safetensors file dir/name from a header and a data length. */
static void write_st(const char *dir, const char *name, const char *header, size_t data_len) {
    image im = st_image(header, data_len);
    write_file(dir, name, im.buf, im.size);
    free(im.buf);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* A fresh empty directory under $TMPDIR (or /tmp). */
static void make_dir(char *out, size_t n) {
    const char *tmp = getenv("TMPDIR");
    snprintf(out, n, "%s/moex_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(out));
}

/* Remove a directory and everything in it. */
static void remove_dir(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------ */

/* Sizes, names, parse round trip, the moex dtype mapping and its error. */
static void test_dtypes(void **state) {
    (void)state;
    static const struct { const char *name; size_t size; } want[] = {
        {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"U16", 2}, {"I16", 2},
        {"F16", 2}, {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8}, {"I64", 8}, {"F64", 8}};
    assert_int_equal(sizeof want / sizeof want[0], MOEX_ST_DTYPE_COUNT);
    for (int i = 0; i < MOEX_ST_DTYPE_COUNT; i++) {
        moex_st_dtype d = (moex_st_dtype)99;
        if (moex_st_dtype_parse(want[i].name, &d) != MOEX_OK) PROBLEM("parse(%s) failed", want[i].name);
        if (moex_st_dtype_size(d) != want[i].size) PROBLEM("size(%s) = %zu", want[i].name, moex_st_dtype_size(d));
        if (strcmp(moex_st_dtype_name(d), want[i].name) != 0) PROBLEM("name(%d) = %s", i, moex_st_dtype_name(d));
    }
    assert_int_equal(moex_st_dtype_size((moex_st_dtype)-1), 0);
    assert_string_equal(moex_st_dtype_name(MOEX_ST_DTYPE_COUNT), "invalid");
    moex_st_dtype d = MOEX_ST_U8;
    assert_int_equal(moex_st_dtype_parse("bf16", &d), MOEX_ERR_FORMAT); /* case-sensitive, as the format */
    assert_int_equal(d, MOEX_ST_U8);
    if (!contains(moex_last_error(), "\"bf16\"") || !contains(moex_last_error(), "BF16"))
        PROBLEM("message: %s", moex_last_error());

    static const struct { moex_st_dtype st; moex_dtype m; } map[] = {
        {MOEX_ST_F32, MOEX_F32}, {MOEX_ST_F16, MOEX_F16}, {MOEX_ST_BF16, MOEX_BF16}, {MOEX_ST_F8_E4M3, MOEX_E4M3},
        {MOEX_ST_F8_E8M0, MOEX_UE8M0}, {MOEX_ST_I32, MOEX_I32}, {MOEX_ST_I64, MOEX_I64}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        moex_dtype m = (moex_dtype)77;
        if (moex_st_dtype_to_moex(map[i].st, &m) != MOEX_OK || m != map[i].m)
            PROBLEM("to_moex(%s) -> %d", moex_st_dtype_name(map[i].st), (int)m);
    }
    moex_st_dtype none[] = {MOEX_ST_U8, MOEX_ST_I8, MOEX_ST_BOOL, MOEX_ST_F64, MOEX_ST_F8_E5M2, MOEX_ST_U16};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        moex_dtype m = (moex_dtype)77;
        if (moex_st_dtype_to_moex(none[i], &m) != MOEX_ERR_UNSUPPORTED || m != (moex_dtype)77)
            PROBLEM("to_moex(%s) should fail", moex_st_dtype_name(none[i]));
        else if (!contains(moex_last_error(), moex_st_dtype_name(none[i])))
            PROBLEM("message does not name %s: %s", moex_st_dtype_name(none[i]), moex_last_error());
    }
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* parsing file images                                                       */
/* ------------------------------------------------------------------------ */

/* Every kept dtype, a scalar, an empty tensor, metadata, gaps, key order. */
static void test_parse_valid(void **state) {
    (void)state;
    const char *h =
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
        "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
        "\"w.bf16\":{\"shape\":[4],\"dtype\":\"BF16\",\"data_offsets\":[24,32]},"
        "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[32,36]},"
        "\"q.e4m3\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[36,40]},"
        "\"q.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[1],\"data_offsets\":[40,41]},"
        "\"u8\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[41,44]},"
        "\"i8\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[44,48]},"
        "\"ids\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[48,56]},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[56,56]},"
        "\"gap\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[64,72],\"extra\":1}}";
    image im = st_image(h, 80);
    moex_st_file f;
    assert_int_equal(moex_safetensors_parse(im.buf, im.size, "valid.st", &f), MOEX_OK);
    assert_int_equal(f.n_tensors, 10);
    assert_int_equal(f.header_len % 8, 0);
    assert_int_equal(f.data_start, 8 + f.header_len);
    assert_string_equal(f.tensors[0].name, "w.f32");
    assert_int_equal(f.tensors[0].dtype, MOEX_ST_F32);
    assert_int_equal(f.tensors[0].ndim, 2);
    assert_int_equal(f.tensors[0].shape[0], 2);
    assert_int_equal(f.tensors[0].shape[1], 3);
    assert_int_equal(f.tensors[0].shape[2], 0);
    assert_int_equal(f.tensors[0].offset, f.data_start);
    assert_int_equal(f.tensors[0].nbytes, 24);
    assert_string_equal(f.tensors[1].name, "w.bf16");
    assert_int_equal(f.tensors[1].offset, f.data_start + 24);
    assert_int_equal(f.tensors[2].ndim, 8);
    assert_int_equal(f.tensors[3].dtype, MOEX_ST_F8_E4M3);
    assert_int_equal(f.tensors[4].dtype, MOEX_ST_F8_E8M0);
    assert_int_equal(f.tensors[5].dtype, MOEX_ST_U8);
    assert_int_equal(f.tensors[6].dtype, MOEX_ST_I8);
    assert_int_equal(f.tensors[7].ndim, 0);
    assert_int_equal(f.tensors[7].nbytes, 8);
    assert_int_equal(f.tensors[8].nbytes, 0);
    assert_int_equal(f.tensors[9].offset, f.data_start + 64);
    assert_int_equal(f.n_metadata, 2);
    assert_string_equal(moex_st_file_metadata(&f, "format"), "pt");
    assert_string_equal(moex_st_file_metadata(&f, "note"), "x");
    assert_null(moex_st_file_metadata(&f, "absent"));
    moex_st_file_free(&f);
    assert_int_equal(f.n_tensors, 0);
    moex_st_file_free(NULL);

    /* an empty header object and a null __metadata__ are valid */
    free(im.buf);
    im = st_image("{}", 0);
    assert_int_equal(moex_safetensors_parse(im.buf, im.size, "empty.st", &f), MOEX_OK);
    assert_int_equal(f.n_tensors, 0);
    moex_st_file_free(&f);
    free(im.buf);
    im = st_image("{\"__metadata__\":null}", 0);
    assert_int_equal(moex_safetensors_parse(im.buf, im.size, "null-meta.st", &f), MOEX_OK);
    moex_st_file_free(&f);
    free(im.buf);
}

/* One malformed case: header text (or NULL with a raw image), data length, expected message pieces. */
typedef struct bad_case {
    const char *label;
    const char *header;
    size_t data_len;
    const char *need1, *need2;
} bad_case;

/* Parse im, expect MOEX_ERR_FORMAT, a message naming the file and need1/need2, and *out untouched. */
static void expect_bad(const char *label, const image *im, const char *need1, const char *need2) {
    moex_st_file f;
    memset(&f, 0xA5, sizeof f);
    moex_st_file before = f;
    moex_status st = moex_safetensors_parse(im->buf, im->size, "bad.safetensors", &f);
    const char *msg = moex_last_error();
    if (!msg) msg = "";
    if (st != MOEX_ERR_FORMAT) {
        PROBLEM("%s: status %d (%s), expected MOEX_ERR_FORMAT", label, (int)st, msg);
        if (st == MOEX_OK) moex_st_file_free(&f);
        return;
    }
    if (memcmp(&f, &before, sizeof f) != 0) PROBLEM("%s: output written on error", label);
    if (!contains(msg, "bad.safetensors")) PROBLEM("%s: message does not name the file: %s", label, msg);
    if ((need1 && !contains(msg, need1)) || (need2 && !contains(msg, need2)))
        PROBLEM("%s: message lacks %s: %s", label, needs_text(need1, need2), msg);
}

/* Every malformed header the parser must reject, each with its message. */
static void test_parse_bad_headers(void **state) {
    (void)state;
    static const bad_case cases[] = {
        {"not JSON", "{\"a\": {\"dtype\": \"F32\", ", 16, "not valid JSON", NULL},
        {"not JSON at all", "hello world", 16, "not valid JSON", NULL},
        {"JSON array", "[1, 2]", 0, "expected a JSON object", NULL},
        {"trailing bytes", "{} {}", 0, "after the JSON header", NULL},
        {"control byte", "{\"a\x01\":1}", 0, "UTF-8", NULL},
        {"bad UTF-8", "{\"a\xC3\x28\":1}", 0, "UTF-8", NULL},
        {"overlong UTF-8", "{\"a\xC0\xAF\":1}", 0, "UTF-8", NULL},
        {"tensor not an object", "{\"t\": 5}", 0, "\"t\"", "expected an object"},
        {"unknown dtype", "{\"w\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "unknown dtype \"F12\""},
        {"lower-case dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "unknown dtype \"f32\""},
        {"dtype not a string", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "dtype is a number"},
        {"no dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "\"w\"", "no \"dtype\""},
        {"no shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "\"w\"", "no \"shape\""},
        {"no data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "\"w\"", "no \"data_offsets\""},
        {"dtype twice", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
         "\"w\"", "\"dtype\" twice"},
        {"negative dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "shape[1] = -3 is negative"},
        {"fractional dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "shape[0] = 1.5 is not an integer"},
        {"string dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "shape[0] is a string"},
        {"shape not array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "shape is a number"},
        {"rank 9", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "9 dimensions"},
        {"huge dim", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "\"w\"",
         "too large"},
        {"shape overflows", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
         4, "\"w\"", "overflows"},
        {"bytes overflow", "{\"w\":{\"dtype\":\"F64\",\"shape\":[9007199254740992,256],\"data_offsets\":[0,8]}}",
         8, "\"w\"", "overflows"},
        {"begin > end", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 16, "\"w\"",
         "begin > end"},
        {"offsets past EOF", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "\"w\"",
         "past the end"},
        {"offset past EOF far", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4294967296,4294967300]}}",
         8, "\"w\"", "[4294967296, 4294967300]"},
        {"negative offset", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[-4,0]}}", 8, "\"w\"",
         "data_offsets[0] = -4 is negative"},
        {"fractional offset", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4.5]}}", 8, "\"w\"",
         "not an integer"},
        {"offsets of one", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4]}}", 8, "\"w\"",
         "[begin, end]"},
        {"offsets of three", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4,8]}}", 8, "\"w\"",
         "[begin, end]"},
        {"offsets an object", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":{}}}", 8, "\"w\"",
         "an object"},
        {"header lies: range too small",
         "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, "\"w\"", "[2, 3]"},
        {"header lies: range too large", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
         "\"w\"", "= 8 bytes"},
        {"wrong dtype for the range", "{\"w\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
         "\"w\"", "F16"},
        {"overlapping ranges",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
         16, "overlap", "\"b\""},
        {"same range twice",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
         "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         16, "overlap", "\"a\""},
        {"duplicate names",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
         8, "\"a\"", "twice"},
        {"metadata value not a string", "{\"__metadata__\":{\"format\":1}}", 0, "__metadata__", "\"format\""},
        {"metadata not an object", "{\"__metadata__\":[]}", 0, "__metadata__", "an array"},
        {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__", "twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        image im = st_image(cases[i].header, cases[i].data_len);
        expect_bad(cases[i].label, &im, cases[i].need1, cases[i].need2);
        free(im.buf);
    }
    end_problems();
}

/* Header length 0, huge, past the end; files shorter than 8 bytes; truncated data. */
static void test_parse_bad_lengths(void **state) {
    (void)state;
    const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    image im = st_image(h, 16);
    set_len(&im, 0);
    expect_bad("header length 0", &im, "header length is 0", NULL);
    set_len(&im, ((uint64_t)100 << 20) + 1);
    expect_bad("header length over 100 MiB", &im, "104857601", "limit");
    set_len(&im, UINT64_MAX);
    expect_bad("header length 2^64-1", &im, "18446744073709551615", "limit");
    set_len(&im, im.size - 7);
    expect_bad("header length past the end", &im, "runs past the end", NULL);
    free(im.buf);

    for (size_t n = 0; n < 8; n++) {
        uint8_t tiny[8] = {8, 0, 0, 0, 0, 0, 0, 0};
        image t = {tiny, n};
        expect_bad("shorter than 8 bytes", &t, "too short", "truncated");
    }

    /* a valid file cut anywhere fails cleanly, with a message; cut nowhere it parses */
    im = st_image(h, 16);
    for (size_t n = 0; n <= im.size; n++) {
        moex_st_file f;
        moex_status st = moex_safetensors_parse(im.buf, n, "cut.st", &f);
        if (n == im.size) {
            if (st != MOEX_OK) PROBLEM("the whole file fails: %s", moex_last_error());
            else moex_st_file_free(&f);
        } else if (st != MOEX_ERR_FORMAT || !contains(moex_last_error(), "cut.st")) {
            PROBLEM("cut at %zu: status %d: %s", n, (int)st, moex_last_error());
            if (st == MOEX_OK) moex_st_file_free(&f);
        }
    }
    /* the truncation through the data section names the tensor and says so */
    assert_int_equal(moex_safetensors_parse(im.buf, im.size - 1, "cut.st", &(moex_st_file){0}), MOEX_ERR_FORMAT);
    if (!contains(moex_last_error(), "\"w\"") || !contains(moex_last_error(), "truncated"))
        PROBLEM("message: %s", moex_last_error());
    free(im.buf);

    /* the file ends right after a trailing comma of the header (its length a multiple of 8,
     * so no padding follows): cJSON 1.7.15 without the fix for CVE-2023-53154 reads one byte
     * past the given length, here past the end of the buffer (found by fuzz_safetensors) */
    char hc[128];
    const char *body = "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}";
    size_t bl = strlen(body);
    size_t pad = (8 - (bl + 1) % 8) % 8;
    snprintf(hc, sizeof hc, "%s%*s,", body, (int)pad, "");
    assert_int_equal(strlen(hc) % 8, 0);
    im = st_image(hc, 0);
    assert_int_equal(im.buf[im.size - 1], ',');
    expect_bad("trailing comma at the end of the file", &im, "not valid JSON", NULL);
    free(im.buf);

    /* NULL arguments */
    moex_st_file f;
    assert_int_equal(moex_safetensors_parse(NULL, 16, "x", &f), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_safetensors_parse((const uint8_t *)"12345678", 8, "x", NULL), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_safetensors_parse(NULL, 0, NULL, &f), MOEX_ERR_FORMAT);
    end_problems();
}

/* Random corruptions of a valid image never crash and never pass an
 * inconsistent file (deterministic LCG; a small in-test fuzzer). */
static void test_parse_corruptions(void **state) {
    (void)state;
    const char *h =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
    image im = st_image(h, 24);
    uint64_t s = 12345;
    int ok = 0;
    for (int it = 0; it < 4000; it++) {
        uint8_t *copy = malloc(im.size);
        assert_non_null(copy);
        memcpy(copy, im.buf, im.size);
        int flips = 1 + it % 3;
        for (int k = 0; k < flips; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)((s >> 33) % im.size);
            copy[at] = (uint8_t)(s >> 13);
        }
        moex_st_file f;
        if (moex_safetensors_parse(copy, im.size, "fuzz", &f) == MOEX_OK) {
            ok++;
            for (size_t t = 0; t < f.n_tensors; t++)
                if (f.tensors[t].offset + f.tensors[t].nbytes > im.size)
                    PROBLEM("iteration %d: tensor %zu runs past the file", it, t);
            moex_st_file_free(&f);
        }
        free(copy);
    }
    print_message("corruptions: %d of 4000 still parsed (flips in data or spaces)\n", ok);
    free(im.buf);
    end_problems();
}

/* ------------------------------------------------------------------------ */
/* checkpoints                                                               */
/* ------------------------------------------------------------------------ */

/* 1 if p lies in a read-only private mapping of the file `path` (from /proc/self/maps). */
static int in_file_mapping(const void *p, const char *path) {
    FILE *fp = fopen("/proc/self/maps", "r");
    if (!fp) return -1;
    char line[1024], real[PATH_MAX];
    if (!realpath(path, real)) snprintf(real, sizeof real, "%s", path);
    int found = 0;
    while (fgets(line, sizeof line, fp)) {
        unsigned long lo, hi;
        char perms[8];
        int off = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) < 3 || !off) continue;
        char *name = line + off;
        name[strcspn(name, "\n")] = 0;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi && strcmp(name, real) == 0 && strcmp(perms, "r--p") == 0)
            found = 1;
    }
    fclose(fp);
    return found;
}

static const char *single_header =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.layers.0.mlp.experts.gate_up_proj\":{\"dtype\":\"BF16\",\"shape\":[2,4,3],\"data_offsets\":[0,48]},"
    "\"model.embed_tokens.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[48,72]},"
    "\"model.layers.0.mlp.experts.down_proj\":{\"dtype\":\"F16\",\"shape\":[2,3,2],\"data_offsets\":[72,96]},"
    "\"model.layers.0.mlp.experts.scale\":{\"dtype\":\"F8_E8M0\",\"shape\":[2],\"data_offsets\":[96,98]},"
    "\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[100,104]}}";

/* Single file: lookups, name order, contents, in-place pointers, views, errors of lookups. */
static void test_checkpoint_single(void **state) {
    (void)state;
    char dir[256];
    make_dir(dir, sizeof dir);
    write_st(dir, "model.safetensors", single_header, 104);
    moex_checkpoint *c = NULL;
    assert_int_equal(moex_checkpoint_open(dir, &c), MOEX_OK);
    assert_int_equal(moex_checkpoint_count(c), 5);
    assert_int_equal(moex_checkpoint_shard_count(c), 1);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_string_equal(moex_checkpoint_shard_path(c, 0), path);
    assert_null(moex_checkpoint_shard_path(c, 1));
    assert_null(moex_checkpoint_shard_path(c, -1));
    const moex_st_file *sf = moex_checkpoint_shard_file(c, 0);
    assert_non_null(sf);
    assert_string_equal(moex_st_file_metadata(sf, "format"), "pt");

    for (size_t i = 1; i < moex_checkpoint_count(c); i++)
        if (strcmp(moex_checkpoint_at(c, i - 1)->name, moex_checkpoint_at(c, i)->name) >= 0)
            PROBLEM("at(%zu) and at(%zu) are not in name order", i - 1, i);
    assert_null(moex_checkpoint_at(c, 5));

    const moex_ckpt_tensor *t = moex_checkpoint_find(c, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, MOEX_ST_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 2);
    assert_int_equal(t->nbytes, 24);
    assert_int_equal(t->shard, 0);
    /* the bytes are those written at data offset 48 */
    for (size_t i = 0; i < 24; i++)
        if (((const uint8_t *)t->data)[i] != (uint8_t)(((48 + i) * 7 + 3) & 255)) PROBLEM("byte %zu differs", i);
    /* in place: the pointer is inside the read-only mapping of the file, and all
     * tensors share one base = data - file offset, page-aligned (the mmap base) */
    int in_map = in_file_mapping(t->data, path);
    if (in_map == 0) PROBLEM("data pointer %p is not in a r--p mapping of %s", t->data, path);
    uintptr_t base = (uintptr_t)t->data - (uintptr_t)(sf->data_start + 48);
    assert_int_equal(base % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    for (size_t i = 0; i < moex_checkpoint_count(c); i++) {
        const moex_ckpt_tensor *u = moex_checkpoint_at(c, i);
        for (size_t k = 0; k < sf->n_tensors; k++)
            if (strcmp(sf->tensors[k].name, u->name) == 0 && (uintptr_t)u->data != base + sf->tensors[k].offset)
                PROBLEM("%s is not at base + offset", u->name);
    }
    /* a view in place */
    moex_tensor v;
    assert_int_equal(moex_ckpt_tensor_view(t, &v), MOEX_OK);
    assert_ptr_equal(v.data, t->data);
    assert_int_equal(v.dtype, MOEX_F32);
    assert_int_equal(v.ndim, 2);
    assert_int_equal(v.strides[0], 2);
    const moex_ckpt_tensor *g = moex_checkpoint_find(c, "model.layers.0.mlp.experts.gate_up_proj");
    assert_non_null(g);
    assert_int_equal(moex_ckpt_tensor_view(g, &v), MOEX_OK);
    assert_int_equal(v.dtype, MOEX_BF16);
    assert_int_equal(v.ndim, 3);
    const moex_ckpt_tensor *sc = moex_checkpoint_find(c, "model.layers.0.mlp.experts.scale");
    assert_int_equal(moex_ckpt_tensor_view(sc, &v), MOEX_OK);
    assert_int_equal(v.dtype, MOEX_UE8M0);
    const moex_ckpt_tensor *nw = moex_checkpoint_find(c, "model.norm.weight");
    assert_int_equal(moex_ckpt_tensor_view(nw, &v), MOEX_OK); /* rank 0 -> [1] */
    assert_int_equal(v.ndim, 1);
    assert_int_equal(v.shape[0], 1);

    /* lookups that miss */
    assert_null(moex_checkpoint_find(c, "model.absent"));
    assert_null(moex_checkpoint_find(c, ""));
    assert_null(moex_checkpoint_find(c, NULL));
    assert_null(moex_checkpoint_find(NULL, "x"));
    const moex_ckpt_tensor *out = (const moex_ckpt_tensor *)0x1;
    assert_int_equal(moex_checkpoint_get(c, "model.absent", &out), MOEX_ERR_NOT_FOUND);
    assert_ptr_equal(out, (const moex_ckpt_tensor *)0x1);
    if (!contains(moex_last_error(), "\"model.absent\"")) PROBLEM("message: %s", moex_last_error());
    assert_int_equal(moex_checkpoint_get(c, "model.norm.weight", &out), MOEX_OK);
    assert_ptr_equal(out, nw);
    moex_checkpoint_close(c);
    moex_checkpoint_close(NULL);
    assert_int_equal(moex_checkpoint_count(NULL), 0);

    /* a .safetensors path opens too */
    assert_int_equal(moex_checkpoint_open(path, &c), MOEX_OK);
    assert_int_equal(moex_checkpoint_count(c), 5);
    moex_checkpoint_close(c);
    remove_dir(dir);
    end_problems();
}

/* Views refused: unaligned data, a dtype without a moex dtype, rank > 4. */
static void test_checkpoint_views(void **state) {
    (void)state;
    char dir[256];
    make_dir(dir, sizeof dir);
    write_st(dir, "model.safetensors",
             "{\"odd\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[1,9]},"
             "\"u8\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"r5\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[12,16]}}",
             16);
    moex_checkpoint *c;
    assert_int_equal(moex_checkpoint_open(dir, &c), MOEX_OK);
    moex_tensor v;
    memset(&v, 0x5A, sizeof v);
    moex_tensor before = v;
    assert_int_equal(moex_ckpt_tensor_view(moex_checkpoint_find(c, "odd"), &v), MOEX_ERR_UNSUPPORTED);
    if (!contains(moex_last_error(), "\"odd\"") || !contains(moex_last_error(), "aligned"))
        PROBLEM("message: %s", moex_last_error());
    assert_int_equal(moex_ckpt_tensor_view(moex_checkpoint_find(c, "u8"), &v), MOEX_ERR_UNSUPPORTED);
    if (!contains(moex_last_error(), "U8")) PROBLEM("message: %s", moex_last_error());
    assert_int_equal(moex_ckpt_tensor_view(moex_checkpoint_find(c, "r5"), &v), MOEX_ERR_UNSUPPORTED);
    if (!contains(moex_last_error(), "rank 5")) PROBLEM("message: %s", moex_last_error());
    assert_memory_equal(&v, &before, sizeof v);
    assert_int_equal(moex_ckpt_tensor_view(NULL, &v), MOEX_ERR_INVALID_ARGUMENT);
    moex_checkpoint_close(c);
    remove_dir(dir);
    end_problems();
}

/* Two shards of a sharded checkpoint: tensors spread, index header, every lookup. */
static void write_sharded(const char *dir) {
    write_st(dir, "model-00001-of-00002.safetensors",
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"c.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[8,16]}}",
             16);
    write_st(dir, "model-00002-of-00002.safetensors",
             "{\"b.weight\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
             "\"d.scale_inv\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]}}",
             12);
    const char *index =
        "{\"metadata\":{\"total_size\":34},\"weight_map\":{"
        "\"a.weight\":\"model-00001-of-00002.safetensors\","
        "\"b.weight\":\"model-00002-of-00002.safetensors\","
        "\"c.weight\":\"model-00001-of-00002.safetensors\","
        "\"d.scale_inv\":\"model-00002-of-00002.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", index, strlen(index));
}

/* Sharded checkpoint: every tensor found in its shard, shard paths, in place. */
static void test_checkpoint_sharded(void **state) {
    (void)state;
    char dir[256];
    make_dir(dir, sizeof dir);
    write_sharded(dir);
    moex_checkpoint *c = NULL;
    assert_int_equal(moex_checkpoint_open(dir, &c), MOEX_OK);
    assert_int_equal(moex_checkpoint_count(c), 4);
    assert_int_equal(moex_checkpoint_shard_count(c), 2);
    const char *names[] = {"a.weight", "b.weight", "c.weight", "d.scale_inv"};
    const int shard_file[] = {1, 2, 1, 2};
    for (int i = 0; i < 4; i++) {
        const moex_ckpt_tensor *t = moex_checkpoint_find(c, names[i]);
        if (!t) {
            PROBLEM("%s not found", names[i]);
            continue;
        }
        if (moex_checkpoint_at(c, (size_t)i) != t) PROBLEM("at(%d) is not %s", i, names[i]);
        char want[64];
        snprintf(want, sizeof want, "model-0000%d-of-00002.safetensors", shard_file[i]);
        const char *sp = moex_checkpoint_shard_path(c, t->shard);
        if (!sp || !contains(sp, want)) PROBLEM("%s in shard %s, expected %s", names[i], sp ? sp : "?", want);
        if (sp && in_file_mapping(t->data, sp) == 0) PROBLEM("%s is not in the mapping of %s", names[i], sp);
    }
    const moex_ckpt_tensor *d = moex_checkpoint_find(c, "d.scale_inv");
    assert_non_null(d);
    assert_int_equal(((const uint8_t *)d->data)[0], (uint8_t)((8 * 7 + 3) & 255));
    moex_checkpoint_close(c);

    /* a single model.safetensors wins over an index, as in transformers */
    write_st(dir, "model.safetensors", "{\"only\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    assert_int_equal(moex_checkpoint_open(dir, &c), MOEX_OK);
    assert_int_equal(moex_checkpoint_count(c), 1);
    assert_non_null(moex_checkpoint_find(c, "only"));
    moex_checkpoint_close(c);
    remove_dir(dir);
    end_problems();
}

/* Open dir, expect status st, a message with need1/need2, and *out untouched. */
static void expect_open_fails(const char *label, const char *dir, moex_status want, const char *need1,
                              const char *need2) {
    moex_checkpoint *c = (moex_checkpoint *)0x1;
    moex_status st = moex_checkpoint_open(dir, &c);
    const char *msg = moex_last_error();
    if (!msg) msg = "";
    if (st != want) {
        PROBLEM("%s: status %d, expected %d: %s", label, (int)st, (int)want, msg);
        if (st == MOEX_OK) moex_checkpoint_close(c);
        return;
    }
    if (c != (moex_checkpoint *)0x1) PROBLEM("%s: out written on error", label);
    if ((need1 && !contains(msg, need1)) || (need2 && !contains(msg, need2)))
        PROBLEM("%s: message lacks %s: %s", label, needs_text(need1, need2), msg);
}

/* Missing shard, tensor absent from its shard, wrong shard, duplicates across
 * shards, broken index, bad shard names, a corrupt shard, nothing to open. */
static void test_checkpoint_bad(void **state) {
    (void)state;
    char dir[256], p[512];
    make_dir(dir, sizeof dir);

    expect_open_fails("empty directory", dir, MOEX_ERR_IO, "no model.safetensors", dir);
    snprintf(p, sizeof p, "%s/does-not-exist", dir);
    expect_open_fails("missing directory", p, MOEX_ERR_IO, "does-not-exist", NULL);
    assert_int_equal(moex_checkpoint_open(NULL, &(moex_checkpoint *){0}), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_checkpoint_open(dir, NULL), MOEX_ERR_INVALID_ARGUMENT);

    /* missing shard: named, with the tensor that needs it */
    write_sharded(dir);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(remove(p), 0);
    expect_open_fails("missing shard", dir, MOEX_ERR_IO, "model-00002-of-00002.safetensors", "missing shard");

    /* a tensor listed in the index but absent from its shard */
    write_sharded(dir);
    const char *idx1 =
        "{\"weight_map\":{\"a.weight\":\"model-00001-of-00002.safetensors\","
        "\"ghost\":\"model-00002-of-00002.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx1, strlen(idx1));
    expect_open_fails("tensor absent from its shard", dir, MOEX_ERR_FORMAT, "\"ghost\"",
                      "model-00002-of-00002.safetensors");

    /* listed in the wrong shard */
    const char *idx2 =
        "{\"weight_map\":{\"a.weight\":\"model-00002-of-00002.safetensors\","
        "\"c.weight\":\"model-00001-of-00002.safetensors\"}}";
    write_file(dir, "model.safetensors.index.json", idx2, strlen(idx2));
    expect_open_fails("tensor in another shard", dir, MOEX_ERR_FORMAT, "\"a.weight\"", "but it is in");

    /* the same name in two shards */
    write_sharded(dir);
    write_st(dir, "model-00002-of-00002.safetensors",
             "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    expect_open_fails("duplicate across shards", dir, MOEX_ERR_FORMAT, "\"a.weight\"", "two shards");

    /* a corrupt shard: the message names that shard */
    write_sharded(dir);
    write_st(dir, "model-00002-of-00002.safetensors",
             "{\"b.weight\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,6]}}", 8);
    expect_open_fails("corrupt shard", dir, MOEX_ERR_FORMAT, "model-00002-of-00002.safetensors", "\"b.weight\"");
    /* a truncated shard */
    write_sharded(dir);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 3), 0);
    expect_open_fails("truncated shard", dir, MOEX_ERR_FORMAT, "model-00001-of-00002.safetensors", "truncated");
    assert_int_equal(truncate(p, 5), 0);
    expect_open_fails("5-byte shard", dir, MOEX_ERR_FORMAT, "model-00001-of-00002.safetensors", "5 bytes");
    assert_int_equal(truncate(p, 0), 0);
    expect_open_fails("empty shard", dir, MOEX_ERR_FORMAT, "model-00001-of-00002.safetensors", "0 bytes");

    /* broken index files */
    write_sharded(dir);
    static const struct { const char *text, *need1, *need2; } idx[] = {
        {"{\"weight_map\": {", "index.json", "not valid JSON"},
        {"[]", "index.json", "not a JSON object"},
        {"{\"metadata\":{}}", "index.json", "no \"weight_map\""},
        {"{\"weight_map\":[]}", "index.json", "not an object"},
        {"{\"weight_map\":{}}", "index.json", "empty"},
        {"{\"weight_map\":{\"a.weight\":1}}", "\"a.weight\"", "not a string"},
        {"{\"weight_map\":{\"a.weight\":\"../model-00001-of-00002.safetensors\"}}", "\"a.weight\"", "not a file name"},
        {"{\"weight_map\":{\"a.weight\":\"\"}}", "\"a.weight\"", "not a file name"},
        {"{\"weight_map\":{\"a.weight\":\"..\"}}", "\"a.weight\"", "not a file name"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
        write_file(dir, "model.safetensors.index.json", idx[i].text, strlen(idx[i].text));
        expect_open_fails(idx[i].text, dir, MOEX_ERR_FORMAT, idx[i].need1, idx[i].need2);
    }
    /* a shard that is a directory */
    const char *idx3 = "{\"weight_map\":{\"a.weight\":\"sub\"}}";
    write_file(dir, "model.safetensors.index.json", idx3, strlen(idx3));
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    expect_open_fails("shard is a directory", dir, MOEX_ERR_IO, "sub", "not a regular file");

    /* single file: bad header */
    write_st(dir, "model.safetensors", "{\"x\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    expect_open_fails("single file, unknown dtype", dir, MOEX_ERR_FORMAT, "model.safetensors", "\"Q4\"");
    remove_dir(dir);
    end_problems();
}

/* A sparse shard larger than 4 GiB with a tensor placed past 4 GiB:
 * 64-bit offsets all the way to the pointer. */
static void test_checkpoint_past_4gib(void **state) {
    (void)state;
    char dir[256], path[512], header[512];
    make_dir(dir, sizeof dir);
    const uint64_t far = ((uint64_t)1 << 32) + 4096; /* data offset of the far tensor */
    snprintf(header, sizeof header,
             "{\"near\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"far\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[%llu,%llu]}}",
             (unsigned long long)far, (unsigned long long)(far + 16));
    image im = st_image(header, 8);
    uint64_t data_start = im.size - 8;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, im.buf, im.size, 0), (ssize_t)im.size);
    const float vals[4] = {1.5f, -2.0f, 3.25f, 1e30f};
    uint64_t end = data_start + far + 16;
    if (ftruncate(fd, (off_t)end) != 0) {
        close(fd);
        free(im.buf);
        remove_dir(dir);
        skip(); /* a file system without sparse files this large */
    }
    assert_int_equal(pwrite(fd, vals, sizeof vals, (off_t)(data_start + far)), (ssize_t)sizeof vals);
    close(fd);
    free(im.buf);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_true((uint64_t)sb.st_size > ((uint64_t)4 << 30));

    moex_checkpoint *c = NULL;
    moex_status st = moex_checkpoint_open(dir, &c);
    if (st != MOEX_OK) PROBLEM("open: %s", moex_last_error());
    if (st == MOEX_OK) {
        const moex_ckpt_tensor *t = moex_checkpoint_find(c, "far");
        const moex_ckpt_tensor *n = moex_checkpoint_find(c, "near");
        assert_non_null(t);
        assert_non_null(n);
        assert_int_equal((uintptr_t)t->data - (uintptr_t)n->data, far);
        assert_memory_equal(t->data, vals, sizeof vals);
        const moex_st_file *f = moex_checkpoint_shard_file(c, 0);
        int seen = 0;
        for (size_t i = 0; i < f->n_tensors; i++)
            if (strcmp(f->tensors[i].name, "far") == 0) {
                seen = 1;
                assert_int_equal(f->tensors[i].offset, data_start + far);
            }
        assert_true(seen);
        moex_tensor v;
        assert_int_equal(moex_ckpt_tensor_view(t, &v), MOEX_OK);
        assert_true(((const float *)v.data)[3] == 1e30f);
        moex_checkpoint_close(c);
    }
    /* the same file cut one byte short of the far tensor fails, naming it */
    assert_int_equal(truncate(path, (off_t)(end - 1)), 0);
    expect_open_fails("past 4 GiB, truncated", dir, MOEX_ERR_FORMAT, "\"far\"", "4294971392");
    remove_dir(dir);
    end_problems();
}

/* The reference checkpoints written by transformers (tests/fixtures). */
static void test_fixture_checkpoints(void **state) {
    (void)state;
    const char *root = MOEX_FIXTURES; /* defined by the build for every test program */
    const char *fams[] = {"qwen2_moe", "qwen3_moe", "mixtral", "qwen3_vl_moe"};
    int opened = 0;
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s", root, fams[i]);
        struct stat sb;
        if (stat(dir, &sb) != 0) { /* the fixtures are committed: a missing one is a failure */
            PROBLEM("%s: missing", dir);
            continue;
        }
        moex_checkpoint *c;
        if (moex_checkpoint_open(dir, &c) != MOEX_OK) {
            PROBLEM("%s: %s", dir, moex_last_error());
            continue;
        }
        opened++;
        if (moex_checkpoint_count(c) == 0) PROBLEM("%s: no tensors", dir);
        for (size_t k = 0; k < moex_checkpoint_count(c); k++) {
            const moex_ckpt_tensor *t = moex_checkpoint_at(c, k);
            if (moex_checkpoint_find(c, t->name) != t) PROBLEM("%s: find(%s) misses", dir, t->name);
        }
        moex_checkpoint_close(c);
    }
    if (!opened) print_message("no fixture checkpoints found; skipped\n");
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_bad_headers),
        cmocka_unit_test(test_parse_bad_lengths),
        cmocka_unit_test(test_parse_corruptions),
        cmocka_unit_test(test_checkpoint_single),
        cmocka_unit_test(test_checkpoint_views),
        cmocka_unit_test(test_checkpoint_sharded),
        cmocka_unit_test(test_checkpoint_bad),
        cmocka_unit_test(test_checkpoint_past_4gib),
        cmocka_unit_test(test_fixture_checkpoints),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
