#define _POSIX_C_SOURCE 200809L
/* test_memory.c — a checkpoint of more than 1 GB, loaded in its own dtype (bf16),
 * is used in place from the mapping: anonymous resident memory (RssAnon) grows by
 * at most 0.2x the file size over the load plus one forward. Writes the
 * checkpoint (qwen3_moe layout, random bf16 weights; the experts' tensors as holes
 * of a sparse file) to a temporary folder and removes it afterwards. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "moex.h"

enum { H = 1024, I = 512, E = 64, K = 4, LAYERS = 6, V = 1000, HEADS = 8, KV = 2, D = 128 };

typedef struct entry {
    char name[96];
    int64_t shape[3];
    int ndim;
} entry;

static int64_t count(const entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= e->shape[i];
    return n;
}

static int add(entry *list, int n, const char *name, int ndim, int64_t a, int64_t b, int64_t c) {
    entry *e = &list[n];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->ndim = ndim;
    e->shape[0] = a, e->shape[1] = b, e->shape[2] = c;
    return n + 1;
}

// dir/model.safetensors with every tensor of a qwen3_moe model of the sizes above; returns bytes written.
static int64_t write_checkpoint(const char *dir) {
    static entry list[16 + LAYERS * 16];
    int n = 0;
    char name[96];
    n = add(list, n, "model.embed_tokens.weight", 2, V, H, 0);
    n = add(list, n, "model.norm.weight", 1, H, 0, 0);
    n = add(list, n, "lm_head.weight", 2, V, H, 0);
    for (int L = 0; L < LAYERS; L++) {
        const char *parts[][2] = {{"input_layernorm", "n"}, {"post_attention_layernorm", "n"}, {"self_attn.q_proj", "q"},
                                  {"self_attn.k_proj", "k"}, {"self_attn.v_proj", "k"},   {"self_attn.o_proj", "o"},
                                  {"self_attn.q_norm", "d"}, {"self_attn.k_norm", "d"},   {"mlp.gate", "r"}};
        for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", L, parts[p][0]);
            char kind = parts[p][1][0];
            if (kind == 'n') n = add(list, n, name, 1, H, 0, 0);
            if (kind == 'd') n = add(list, n, name, 1, D, 0, 0);
            if (kind == 'q') n = add(list, n, name, 2, HEADS * D, H, 0);
            if (kind == 'k') n = add(list, n, name, 2, KV * D, H, 0);
            if (kind == 'o') n = add(list, n, name, 2, H, HEADS * D, 0);
            if (kind == 'r') n = add(list, n, name, 2, E, H, 0);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.gate_up_proj", L);
        n = add(list, n, name, 3, E, 2 * I, H);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.down_proj", L);
        n = add(list, n, name, 3, E, H, I);
    }
    size_t cap = 64 * 1024, len = 0;
    char *header = malloc(cap);
    int64_t offset = 0;
    len += (size_t)snprintf(header + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        int64_t bytes = 2 * count(&list[i]);
        len += (size_t)snprintf(header + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[", i ? "," : "", list[i].name);
        for (int d = 0; d < list[i].ndim; d++) len += (size_t)snprintf(header + len, cap - len, d ? ",%lld" : "%lld", (long long)list[i].shape[d]);
        len += (size_t)snprintf(header + len, cap - len, "],\"data_offsets\":[%lld,%lld]}", (long long)offset, (long long)(offset + bytes));
        offset += bytes;
    }
    len += (size_t)snprintf(header + len, cap - len, "}");
    while (len % 8) header[len++] = ' ';
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, len, f);
    enum { CHUNK = 1 << 20 };
    uint16_t *buf = malloc(CHUNK * sizeof(uint16_t));
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < CHUNK; i++) { /* small random bf16 values, sign and mantissa random */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        buf[i] = (uint16_t)(0x3C00u | (s & 0x807Fu)); /* |x| in [2^-7, 2^-6) */
    }
    // Every tensor but the experts gets data; the experts (almost all of the bytes) are
    // left as holes of a sparse file: they read back as zeros, from the page cache like
    // any mapped file, and the test needs little disk.
    for (int i = 0; i < n; i++) {
        int64_t count_i = count(&list[i]);
        if (strstr(list[i].name, ".experts.")) {
            assert_int_equal(fseeko(f, (off_t)(2 * count_i), SEEK_CUR), 0);
            continue;
        }
        for (int64_t left = count_i; left > 0; left -= CHUNK)
            assert_int_equal(fwrite(buf, 2, (size_t)(left < CHUNK ? left : CHUNK), f), (size_t)(left < CHUNK ? left : CHUNK));
    }
    assert_int_equal(fflush(f), 0);
    assert_int_equal(ftruncate(fileno(f), (off_t)(8 + len + offset)), 0);
    assert_int_equal(fclose(f), 0);
    free(buf);
    free(header);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"model_type\": \"qwen3_moe\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
            " \"moe_intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
            " \"num_key_value_heads\": %d, \"head_dim\": %d, \"num_experts\": %d, \"num_experts_per_tok\": %d,"
            " \"norm_topk_prob\": true, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
            " \"max_position_embeddings\": 512, \"tie_word_embeddings\": false, \"eos_token_id\": 2}\n",
            V, H, 4 * I, I, LAYERS, HEADS, KV, D, E, K);
    fclose(f);
    return (int64_t)(8 + len) + offset;
}

static long rss_anon_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static void test_large_checkpoint_in_place(void **state) {
    (void)state;
    char dir[] = "/tmp/moex_memory_XXXXXX";
    assert_non_null(mkdtemp(dir));
    int64_t bytes = write_checkpoint(dir);
    assert_true(bytes > ((int64_t)1 << 30));
    long before = rss_anon_kb();
    moex_model_options mo = moex_model_default_options();
    mo.max_batch = 1;
    mo.max_seq = 64;
    mo.max_tokens = 64;
    mo.num_threads = 2;
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(dir, &mo, &m), MOEX_OK);
    static const int32_t prompt[] = {5, 6, 7, 8, 9, 10, 11, 12};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {8};
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 2;
    go.ignore_eos = 1;
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_OK);
    long after = rss_anon_kb();
    double grown = (double)(after - before) * 1024.0;
    print_message("checkpoint %.2f GB; RssAnon grew by %.1f MB = %.4f x the file size\n", (double)bytes / 1e9,
                  grown / 1e6, grown / (double)bytes);
    assert_true(grown <= 0.2 * (double)bytes);
    moex_generation_free(g);
    moex_model_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_large_checkpoint_in_place)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
