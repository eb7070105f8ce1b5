/*
 * test_fuzz_corpus.c — replays every file of the committed fuzz corpus
 * (fuzz/corpus/{safetensors,config,model,experts_map,tokenizer,jit_entry}) through
 * the fuzz targets with their own invariant checks, so that CI re-checks the
 * corpus under the sanitizers without clang or libFuzzer:
 *   - fuzz_safetensors, fuzz_config, fuzz_experts_map and fuzz_jit_entry
 *     (cheap) get every file of every corpus;
 *   - fuzz_model (a model load and a generation per file) and fuzz_tokenizer
 *     (a tokenizer.json load or a fixture's, an encode and decodes) get their
 *     own corpus only.
 *
 * The corpus is found next to this source file (../fuzz/corpus), or in
 * $MOEX_FUZZ_CORPUS; the model target's fixtures in $MOEX_FIXTURES or the
 * compile-time MOEX_FIXTURES that every test program gets.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testutil.h"

/* The fuzz targets, compiled in under distinct names. */
#define LLVMFuzzerTestOneInput fuzz_safetensors_one
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_config_one
#include "../fuzz/fuzz_config.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_experts_map_one
#include "../fuzz/fuzz_experts_map.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_model_one
#include "../fuzz/fuzz_model.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_tokenizer_one
#include "../fuzz/fuzz_tokenizer.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_jit_entry_one
#include "../fuzz/fuzz_jit_entry.c"
#undef LLVMFuzzerTestOneInput

/* The corpus root: $MOEX_FUZZ_CORPUS, else <dir of this file>/../fuzz/corpus. */
static void corpus_root(char *out, size_t n) {
    const char *env = getenv("MOEX_FUZZ_CORPUS");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return;
    }
    const char *slash = strrchr(__FILE__, '/');
    int len = slash ? (int)(slash - __FILE__) : 1;
    snprintf(out, n, "%.*s/../fuzz/corpus", len, slash ? __FILE__ : ".");
}

/* Read a whole file (malloc'd; NULL on failure). */
static uint8_t *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, fp);
        n += got;
        if (got == 0) break;
    }
    fclose(fp);
    *len = n;
    return buf ? buf : malloc(1);
}

/* Every regular file of root/sub through the cheap targets, and through the
 * model target when with_model (the tokenizer target when with_model is 2); returns the count. */
static int replay_dir(const char *root, const char *sub, int with_model) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    DIR *d = opendir(dir);
    if (!d) fail_msg("fuzz corpus %s not found (set MOEX_FUZZ_CORPUS)", dir);
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        size_t len = 0;
        uint8_t *buf = slurp(path, &len);
        if (!buf) {
            PROBLEM("cannot read %s", path);
            continue;
        }
        fuzz_safetensors_one(buf, len); /* aborts on a broken invariant */
        fuzz_config_one(buf, len);
        fuzz_experts_map_one(buf, len);
        fuzz_jit_entry_one(buf, len);
        if (with_model == 1) fuzz_model_one(buf, len);
        if (with_model == 2) fuzz_tokenizer_one(buf, len);
        free(buf);
        count++;
    }
    closedir(d);
    return count;
}

/* The whole corpus: every directory, every target. */
static void test_replay_corpus(void **state) {
    (void)state;
    char root[1024];
    corpus_root(root, sizeof root);
    int a = replay_dir(root, "safetensors", 0);
    int b = replay_dir(root, "config", 0);
    int c = replay_dir(root, "experts_map", 0);
    int d = replay_dir(root, "model", 1);
    int e = replay_dir(root, "tokenizer", 2);
    int f = replay_dir(root, "jit_entry", 0);
    print_message("replayed %d safetensors, %d config, %d experts_map, %d model, %d tokenizer and %d jit_entry inputs "
                  "from %s\n", a, b, c, d, e, f, root);
    if (a < 5 || b < 5 || c < 5 || d < 5 || e < 5 || f < 5)
        PROBLEM("the corpus looks empty: %d, %d, %d, %d, %d and %d files", a, b, c, d, e, f);
    if (mdl_ready != 1) PROBLEM("the model target could not set up its fixtures (see above; set MOEX_FIXTURES)");
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_corpus),
    };
    return cmocka_run_group_tests_name("fuzz_corpus", tests, NULL, NULL);
}
