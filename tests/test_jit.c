/*
 * test_jit.c — kernels compiled at run time (src/gpu/jit.c): NVRTC not loadable (the message
 * names it and the backends that need none), a compile into the cache and the cache hit after
 * it, every kind of bad cache entry rebuilt and replaced (flipped byte, truncated, another key,
 * not an entry, empty, a valid checksum over a non-CUDA image, a directory in its place), keys
 * that differ by option, source and architecture target, headers given in memory (found by
 * #include, part of the key), compile errors with NVRTC's log, a
 * cache that cannot be written, no cache, the default directory's precedence, bad arguments.
 *
 * Needs NVRTC (the CUDA toolkit's libnvrtc), not a GPU: the tests after the first skip, saying
 * why, where it cannot be loaded.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpu/jit.h"
#include "testutil.h"

static const char *PROBE = "extern \"C\" __global__ void moex_jit_probe(float *y, const float *x, int n) {\n"
                           "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                           "    if (i < n) y[i] = 2.0f * x[i] + 1.0f;\n"
                           "}\n";
/* wgmma.fence exists only for the architecture-specific target sm_90a */
static const char *HOPPER = "extern \"C\" __global__ void moex_jit_fence(void) { asm volatile(\"wgmma.fence.sync.aligned;\"); }\n";

static moex_jit_source probe(const char *text, int arch_specific) {
    moex_jit_source s;
    memset(&s, 0, sizeof s);
    s.name = "probe";
    s.text = text;
    s.cc = 90;
    s.arch_specific = arch_specific;
    return s;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag, (void)f;
    return remove(p);
}
static void remove_dir(const char *dir) { nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

static void temp_dir(char *out, size_t n) {
    const char *t = getenv("TMPDIR");
    snprintf(out, n, "%s/moex-jit-XXXXXX", t && *t ? t : "/tmp");
    assert_non_null(mkdtemp(out));
}

/* Entries (files) in dir, temporary files included. */
static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static int nvrtc_ok(void) {
    char why[512];
    if (moex_jit_nvrtc_available(NULL, NULL, why, sizeof why)) return 1;
    print_message("NVRTC not loadable here (%s): skipped\n", why);
    return 0;
}

/* Runs first, before NVRTC is loaded for good. */
static void test_nvrtc_missing(void **state) {
    (void)state;
    char dir[256];
    temp_dir(dir, sizeof dir);
    setenv("MOEX_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1);
    moex_jit_source s = probe(PROBE, 1);
    moex_jit_image img;
    assert_int_equal(moex_jit_build(&s, dir, &img), MOEX_ERR_UNSUPPORTED);
    const char *m = moex_last_error();
    if (!contains(m, "NVRTC") || !contains(m, "/nonexistent/libnvrtc.so.13") || !contains(m, "grouped_mm") ||
        !contains(m, "batched_mm") || !contains(m, "probe"))
        PROBLEM("message: %s", m);
    if (img.data || img.size || img.path[0]) PROBLEM("an image or path after the failure");
    if (count_files(dir) != 0) PROBLEM("%d files written", count_files(dir));
    char why[512];
    if (moex_jit_nvrtc_available(NULL, NULL, why, sizeof why) || !contains(why, "NVRTC")) PROBLEM("available: %s", why);
    unsetenv("MOEX_NVRTC_LIBRARY");
    remove_dir(dir);
    end_problems();
}

static void test_compile_then_cache(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    moex_jit_source s = probe(PROBE, 1);
    moex_jit_image a, b;
    assert_int_equal(moex_jit_build(&s, dir, &a), MOEX_OK);
    assert_non_null(a.data);
    const unsigned char *p = (const unsigned char *)a.data;
    if (a.size < 64 || p[0] != 0x7f || p[1] != 'E' || p[2] != 'L' || p[3] != 'F') PROBLEM("not an ELF image");
    if (a.from_cache || a.compile_ms <= 0) PROBLEM("from_cache %d, compile %.3f ms", a.from_cache, a.compile_ms);
    if (strncmp(a.path, dir, strlen(dir)) != 0 || !contains(a.path, "/probe-") || !contains(a.path, ".cubin"))
        PROBLEM("path %s", a.path);
    if (a.note[0]) PROBLEM("note: %s", a.note);
    if (count_files(dir) != 1) PROBLEM("%d files in the cache", count_files(dir));
    assert_int_equal(moex_jit_build(&s, dir, &b), MOEX_OK);
    if (!b.from_cache || b.compile_ms != 0 || b.size != a.size || memcmp(a.data, b.data, a.size) != 0 ||
        strcmp(a.path, b.path) != 0)
        PROBLEM("second build: from_cache %d, %zu bytes against %zu", b.from_cache, b.size, a.size);
    moex_jit_image_free(&a);
    moex_jit_image_free(&b);
    if (a.data || a.size) PROBLEM("image_free left data");
    moex_jit_image_free(NULL);
    remove_dir(dir);
    end_problems();
}

/* Bytes of the file at path into a malloc'd buffer (size in *n). */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
    *n = b ? fread(b, 1, (size_t)len, f) : 0;
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static uint64_t fnv(const unsigned char *p, size_t n) { return moex_fnv64(MOEX_FNV64_START, p, n); }

static void test_bad_entries_rebuilt(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    moex_jit_source s = probe(PROBE, 1);
    moex_jit_image a;
    assert_int_equal(moex_jit_build(&s, dir, &a), MOEX_OK);
    size_t n = 0;
    unsigned char *good = slurp(a.path, &n);
    assert_non_null(good);
    assert_true(n > 32 + a.size);
    const size_t key_len = n - 32 - a.size;
    static const char *const KINDS[] = {"a flipped image byte", "truncated", "another key", "not an entry", "empty",
                                        "a checksum over a non-CUDA image"};
    for (int k = 0; k < 6; k++) {
        unsigned char *bad = malloc(n);
        memcpy(bad, good, n);
        size_t len = n;
        if (k == 0) bad[n - 7] ^= 0x40;
        if (k == 1) len = n - 10;
        if (k == 2) bad[32 + key_len / 2] ^= 0x01;
        if (k == 3) memcpy(bad, "NOTMOEX!", 8);
        if (k == 4) len = 0;
        if (k == 5) { /* a consistent entry whose image is not CUDA's: e_machine 62 (x86-64) */
            bad[32 + key_len + 18] = 62;
            bad[32 + key_len + 19] = 0;
            const uint64_t h = fnv(bad + 32 + key_len, a.size);
            memcpy(bad + 24, &h, 8);
        }
        spit(a.path, bad, len);
        free(bad);
        moex_jit_image r, again;
        assert_int_equal(moex_jit_build(&s, dir, &r), MOEX_OK);
        if (r.from_cache || !contains(r.note, "rebuilt") || r.size != a.size || memcmp(r.data, a.data, a.size) != 0)
            PROBLEM("%s: from_cache %d, note \"%s\"", KINDS[k], r.from_cache, r.note);
        assert_int_equal(moex_jit_build(&s, dir, &again), MOEX_OK);
        if (!again.from_cache) PROBLEM("%s: the rebuilt entry was not written back (%s)", KINDS[k], again.note);
        if (count_files(dir) != 1) PROBLEM("%s: %d files in the cache", KINDS[k], count_files(dir));
        moex_jit_image_free(&r);
        moex_jit_image_free(&again);
    }
    /* a directory where the entry should be: compiled, and not cached (nothing renames over it) */
    assert_int_equal(remove(a.path), 0);
    assert_int_equal(mkdir(a.path, 0755), 0);
    moex_jit_image r;
    assert_int_equal(moex_jit_build(&s, dir, &r), MOEX_OK);
    if (r.from_cache || !contains(r.note, "not written") || r.path[0] || r.size != a.size)
        PROBLEM("directory in place: from_cache %d, note \"%s\", path \"%s\"", r.from_cache, r.note, r.path);
    if (count_files(dir) != 1) PROBLEM("directory in place: %d files (a temporary left?)", count_files(dir));
    moex_jit_image_free(&r);
    free(good);
    moex_jit_image_free(&a);
    remove_dir(dir);
    end_problems();
}

static void test_keys(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    const char *opt[] = {"-DMOEX_PROBE_SCALE=3"};
    moex_jit_source s = probe(PROBE, 1), o = s, t = s, g = s;
    o.options = opt, o.n_options = 1;
    t.text = "extern \"C\" __global__ void moex_jit_probe2(int *y) { *y = 7; }\n";
    g.arch_specific = 0; /* sm_90 against sm_90a */
    moex_jit_image i1, i2, i3, i4;
    assert_int_equal(moex_jit_build(&s, dir, &i1), MOEX_OK);
    assert_int_equal(moex_jit_build(&o, dir, &i2), MOEX_OK);
    assert_int_equal(moex_jit_build(&t, dir, &i3), MOEX_OK);
    assert_int_equal(moex_jit_build(&g, dir, &i4), MOEX_OK);
    if (i2.from_cache || i3.from_cache || i4.from_cache) PROBLEM("a different key hit the cache");
    if (!strcmp(i1.path, i2.path) || !strcmp(i1.path, i3.path) || !strcmp(i1.path, i4.path) || !strcmp(i2.path, i3.path))
        PROBLEM("two keys share an entry: %s %s %s %s", i1.path, i2.path, i3.path, i4.path);
    if (count_files(dir) != 4) PROBLEM("%d files for 4 keys", count_files(dir));
    moex_jit_image_free(&i2);
    assert_int_equal(moex_jit_build(&o, dir, &i2), MOEX_OK);
    if (!i2.from_cache) PROBLEM("options: not found again");
    moex_jit_image_free(&i1);
    moex_jit_image_free(&i2);
    moex_jit_image_free(&i3);
    moex_jit_image_free(&i4);
    remove_dir(dir);
    end_problems();
}

/* Headers given in memory: found by #include, and part of the key. */
static void test_headers(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    const char *names[] = {"probe/consts.h"}, *three[] = {"#define PROBE_C 3.0f\n"}, *four[] = {"#define PROBE_C 4.0f\n"};
    moex_jit_source s = probe("#include \"probe/consts.h\"\nextern \"C\" __global__ void k(float *y) { y[0] = PROBE_C; }\n", 1);
    s.header_names = names, s.header_texts = three, s.n_headers = 1;
    moex_jit_image a, b, c;
    assert_int_equal(moex_jit_build(&s, dir, &a), MOEX_OK);
    s.header_texts = four;
    assert_int_equal(moex_jit_build(&s, dir, &b), MOEX_OK);
    if (b.from_cache || !strcmp(a.path, b.path)) PROBLEM("a changed header did not change the key: %s", b.path);
    s.header_texts = three;
    assert_int_equal(moex_jit_build(&s, dir, &c), MOEX_OK);
    if (!c.from_cache || strcmp(a.path, c.path)) PROBLEM("the same header: not found again");
    /* many headers with long texts: the key's length bound (ASan checks it) */
    enum { MANY = 40 };
    char many_names[MANY][32], *many_texts[MANY];
    const char *mn[MANY], *mt[MANY];
    for (int i = 0; i < MANY; i++) {
        snprintf(many_names[i], sizeof many_names[i], "probe/h%02d.h", i);
        many_texts[i] = malloc(100000);
        memset(many_texts[i], ' ', 99999);
        many_texts[i][99999] = 0;
        memcpy(many_texts[i], "#define PROBE_C 5.0f\n", 21);
        mn[i] = many_names[i], mt[i] = many_texts[i];
    }
    moex_jit_source m = probe("#include \"probe/h07.h\"\nextern \"C\" __global__ void k(float *y) { y[0] = PROBE_C; }\n", 1);
    m.header_names = mn, m.header_texts = mt, m.n_headers = MANY;
    moex_jit_image e;
    assert_int_equal(moex_jit_build(&m, dir, &e), MOEX_OK);
    moex_jit_image_free(&e);
    for (int i = 0; i < MANY; i++) free(many_texts[i]);
    s.n_headers = 0; /* not given: NVRTC cannot find it */
    moex_jit_image d;
    assert_int_equal(moex_jit_build(&s, dir, &d), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "probe/consts.h")) PROBLEM("missing header: %s", moex_last_error());
    s.n_headers = 1, s.header_texts = NULL;
    assert_int_equal(moex_jit_build(&s, dir, &d), MOEX_ERR_INVALID_ARGUMENT);
    moex_jit_image_free(&a), moex_jit_image_free(&b), moex_jit_image_free(&c);
    remove_dir(dir);
    end_problems();
}

static void test_compile_errors(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256];
    temp_dir(dir, sizeof dir);
    moex_jit_source s = probe(HOPPER, 0); /* wgmma on plain sm_90: ptxas refuses it */
    moex_jit_image img;
    assert_int_not_equal(moex_jit_build(&s, dir, &img), MOEX_OK);
    const char *m = moex_last_error();
    if (!contains(m, "probe") || !contains(m, "sm_90") || !contains(m, "NVRTC")) PROBLEM("sm_90 wgmma: %s", m);
    if (img.data || img.path[0] || count_files(dir) != 0) PROBLEM("sm_90 wgmma: an image or a cache entry after failing");
    s.arch_specific = 1;
    assert_int_equal(moex_jit_build(&s, dir, &img), MOEX_OK);
    moex_jit_image_free(&img);
    s = probe("extern \"C\" __global__ void broken(float *y) { y[0] = undeclared_thing; }\n", 1);
    assert_int_equal(moex_jit_build(&s, dir, &img), MOEX_ERR_INVALID_ARGUMENT);
    m = moex_last_error();
    if (!contains(m, "could not compile probe for sm_90a") || !contains(m, "undeclared_thing")) PROBLEM("syntax: %s", m);
    if (count_files(dir) != 1) PROBLEM("%d files after a failed compile", count_files(dir));
    remove_dir(dir);
    end_problems();
}

static void test_cache_not_usable(void **state) {
    (void)state;
    if (!nvrtc_ok()) skip();
    char dir[256], sub[512];
    temp_dir(dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/a-file", dir);
    spit(sub, (const unsigned char *)"x", 1);
    snprintf(sub, sizeof sub, "%s/a-file/jit", dir);
    moex_jit_source s = probe(PROBE, 1);
    moex_jit_image img;
    assert_int_equal(moex_jit_build(&s, sub, &img), MOEX_OK); /* compiled all the same */
    if (!img.data || img.from_cache || img.path[0] || !contains(img.note, "unusable"))
        PROBLEM("under a file: path \"%s\", note \"%s\"", img.path, img.note);
    moex_jit_image_free(&img);
    char longname[4100];
    memset(longname, 'd', sizeof longname - 1);
    longname[0] = '/', longname[sizeof longname - 1] = 0;
    assert_int_equal(moex_jit_build(&s, longname, &img), MOEX_OK); /* a name too long for a path */
    if (!img.data || img.path[0] || !contains(img.note, "too long")) PROBLEM("long name: note \"%s\"", img.note);
    moex_jit_image_free(&img);
    assert_int_equal(moex_jit_build(&s, "", &img), MOEX_OK); /* "": no cache */
    if (!img.data || img.from_cache || img.path[0] || img.note[0]) PROBLEM("no cache: path \"%s\"", img.path);
    moex_jit_image_free(&img);
    if (count_files(dir) != 1) PROBLEM("%d files", count_files(dir));
    remove_dir(dir);
    end_problems();
}

static void restore(const char *name, const char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
}

static void test_default_dir(void **state) {
    (void)state;
    char *own = getenv("MOEX_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    own = own ? strdup(own) : NULL, xdg = xdg ? strdup(xdg) : NULL, home = home ? strdup(home) : NULL;
    char buf[512];
    setenv("MOEX_CACHE_DIR", "/m", 1), setenv("XDG_CACHE_HOME", "/x", 1), setenv("HOME", "/h", 1);
    if (!moex_jit_cache_dir(buf, sizeof buf) || strcmp(buf, "/m/jit")) PROBLEM("MOEX_CACHE_DIR: %s", buf);
    unsetenv("MOEX_CACHE_DIR");
    if (!moex_jit_cache_dir(buf, sizeof buf) || strcmp(buf, "/x/moex/jit")) PROBLEM("XDG_CACHE_HOME: %s", buf);
    unsetenv("XDG_CACHE_HOME");
    if (!moex_jit_cache_dir(buf, sizeof buf) || strcmp(buf, "/h/.cache/moex/jit")) PROBLEM("HOME: %s", buf);
    unsetenv("HOME");
    if (moex_jit_cache_dir(buf, sizeof buf) || buf[0]) PROBLEM("none set: \"%s\"", buf);
    setenv("HOME", "/a-rather-long-home-directory-name", 1);
    if (moex_jit_cache_dir(buf, 10) || buf[0]) PROBLEM("too long for the buffer: \"%s\"", buf);
    if (nvrtc_ok()) { /* NULL: the default directory */
        char dir[256];
        temp_dir(dir, sizeof dir);
        setenv("MOEX_CACHE_DIR", dir, 1);
        moex_jit_source s = probe(PROBE, 1);
        moex_jit_image img;
        assert_int_equal(moex_jit_build(&s, NULL, &img), MOEX_OK);
        snprintf(buf, sizeof buf, "%s/jit/probe-", dir);
        if (strncmp(img.path, buf, strlen(buf)) != 0) PROBLEM("default entry at %s", img.path);
        moex_jit_image_free(&img);
        remove_dir(dir);
    }
    restore("MOEX_CACHE_DIR", own), restore("XDG_CACHE_HOME", xdg), restore("HOME", home);
    free(own), free(xdg), free(home);
    end_problems();
}

static void test_bad_arguments(void **state) {
    (void)state;
    moex_jit_source s = probe(PROBE, 1);
    moex_jit_image img;
    assert_int_equal(moex_jit_build(&s, "", NULL), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_jit_build(NULL, "", &img), MOEX_ERR_INVALID_ARGUMENT);
    s.name = "../escape";
    assert_int_equal(moex_jit_build(&s, "", &img), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "\"../escape\"")) PROBLEM("name: %s", moex_last_error());
    s.name = "probe", s.cc = 3;
    assert_int_equal(moex_jit_build(&s, "", &img), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "0.3")) PROBLEM("cc: %s", moex_last_error());
    s.cc = 90, s.n_options = 1;
    assert_int_equal(moex_jit_build(&s, "", &img), MOEX_ERR_INVALID_ARGUMENT);
    const char *nul[] = {NULL};
    s.options = nul;
    assert_int_equal(moex_jit_build(&s, "", &img), MOEX_ERR_INVALID_ARGUMENT);
    if (!contains(moex_last_error(), "option 0")) PROBLEM("option: %s", moex_last_error());
    if (img.data || img.size) PROBLEM("an image after bad arguments");
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvrtc_missing), cmocka_unit_test(test_compile_then_cache),
        cmocka_unit_test(test_bad_entries_rebuilt), cmocka_unit_test(test_keys), cmocka_unit_test(test_headers),
        cmocka_unit_test(test_compile_errors), cmocka_unit_test(test_cache_not_usable),
        cmocka_unit_test(test_default_dir), cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
