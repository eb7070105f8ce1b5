/*
 * test_hostile_checkpoint.c — checkpoints a hostile or careless writer could make,
 * built from the transformers-written fixtures:
 *   - per-expert or fused experts with one matrix in another dtype: refused, naming it;
 *   - a layer's two norms in different dtypes: each read in its own (same logits as
 *     the same values stored in one dtype);
 *   - config keys transformers honours and moex does not implement (hidden_act, rope
 *     types, partial_rotary_factor, sliding windows, mrope_section, olmoe's clip_qkv and
 *     a head_dim its q_norm cannot span, glm4_moe's groups that do not divide the experts and
 *     a rotary part of fewer than 2 values, deepseek_v3's latent sizes against its tensors):
 *     refused at load by
 *     name; a sliding window that cannot bind loads and matches transformers;
 *   - the absent keys: transformers' defaults of the family;
 *   - num_hidden_layers past 65536: refused by the config; far beyond the checkpoint within
 *     that: refused before any allocation;
 *   - config.json or generation_config.json a FIFO: refused at once;
 *   - the checkpoint shrunk or rewritten after load: the next generate fails naming it;
 *   - an index naming many distinct missing shards: refused in linear time;
 *   - out of memory inside cJSON: MOEX_ERR_OUT_OF_MEMORY, never "not valid JSON";
 *   - max_tokens < max_batch: refused at load.
 * Each case writes a variant of a fixture into a temporary folder and removes it.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moex.h"
#include "model/config.h"
#include "core/json.h"
#include "model/safetensors.h"
#include "testutil.h"
#include "backend_list.h"

/* ---- files ---------------------------------------------------------------- */

static char *slurp(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    buf[n] = 0;
    fclose(fp);
    if (len) *len = (size_t)n;
    return buf;
}

static void spit(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* A new empty temporary folder. */
static char *temp_dir(void) {
    static char dirs[16][256];
    static int next;
    char *d = dirs[next++ % 16];
    const char *tmp = getenv("TMPDIR");
    snprintf(d, 256, "%s/moex_hostile_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(d));
    return d;
}

static void remove_dir(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- safetensors rewriting ------------------------------------------------ */

/* What to do with each tensor: BF16 stores it as bf16 (its f32 values rounded); ROUND keeps
 * F32 but rounds the values to bf16 (the same numbers as BF16, in the other dtype). */
typedef enum { KEEP, BF16, ROUND, NANS } edit; /* NANS: every value NaN */
typedef edit (*edit_fn)(const char *name);

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* dst/model.safetensors: src's F32 tensors, each edited by fn; the header rewritten to match. */
static void rewrite_safetensors(const char *src_dir, const char *dst_dir, edit_fn fn) {
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    size_t size;
    uint8_t *buf = (uint8_t *)slurp(path, &size);
    moex_st_file f;
    assert_int_equal(moex_safetensors_parse(buf, size, path, &f), MOEX_OK);
    cJSON *hdr = cJSON_CreateObject();
    uint8_t *data = malloc(size);
    size_t at = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const moex_st_tensor *t = &f.tensors[i];
        const edit e = t->dtype == MOEX_ST_F32 ? fn(t->name) : KEEP;
        const uint8_t *src = buf + t->offset;
        const size_t n = (size_t)t->nbytes / 4;
        size_t bytes = (size_t)t->nbytes;
        if (e == BF16) {
            for (size_t k = 0; k < n; k++) {
                float v;
                memcpy(&v, src + 4 * k, 4);
                uint16_t h = to_bf16(v);
                memcpy(data + at + 2 * k, &h, 2);
            }
            bytes = 2 * n;
        } else if (e == ROUND || e == NANS) {
            for (size_t k = 0; k < n; k++) {
                float v;
                memcpy(&v, src + 4 * k, 4);
                v = e == NANS ? NAN : from_bf16(to_bf16(v));
                memcpy(data + at + 4 * k, &v, 4);
            }
        } else {
            memcpy(data + at, src, bytes);
        }
        cJSON *o = cJSON_AddObjectToObject(hdr, t->name);
        cJSON_AddStringToObject(o, "dtype", e == BF16 ? "BF16" : moex_st_dtype_name(t->dtype));
        cJSON *shape = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *off = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)at));
        cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(at + bytes)));
        at += (bytes + 7) & ~(size_t)7; /* keep every tensor 8-byte aligned */
    }
    char *text = cJSON_PrintUnformatted(hdr);
    size_t hlen = strlen(text), padded = (hlen + 7) & ~(size_t)7;
    uint8_t *out = calloc(1, 8 + padded + at);
    uint64_t n64 = padded;
    memcpy(out, &n64, 8);
    memset(out + 8, ' ', padded);
    memcpy(out + 8, text, hlen);
    memcpy(out + 8 + padded, data, at);
    snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    spit(path, out, 8 + padded + at);
    free(out);
    free(text);
    cJSON_Delete(hdr);
    free(data);
    moex_st_file_free(&f);
    free(buf);
}

/* dst/config.json (and generation_config.json): src's, with edits applied to the parsed
 * config: set(key, value-JSON) pairs, where the key may be "text_config.x"; value NULL deletes. */
static void write_config(const char *src_dir, const char *dst_dir, const char *const *kv) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    char *text = slurp(path, NULL);
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    for (int i = 0; kv && kv[i]; i += 2) {
        cJSON *obj = root;
        const char *key = kv[i], *dot = strchr(key, '.');
        char head[64];
        if (dot) {
            snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
            obj = cJSON_GetObjectItemCaseSensitive(root, head);
            assert_non_null(obj);
            key = dot + 1;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
        if (kv[i + 1]) {
            cJSON *v = cJSON_Parse(kv[i + 1]);
            assert_non_null(v);
            cJSON_AddItemToObject(obj, key, v);
        }
    }
    char *out = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/config.json", dst_dir);
    spit(path, out, strlen(out));
    free(out);
    cJSON_Delete(root);
    free(text);
    snprintf(path, sizeof path, "%s/generation_config.json", src_dir);
    if (access(path, F_OK) == 0) {
        size_t n;
        char *g = slurp(path, &n);
        snprintf(path, sizeof path, "%s/generation_config.json", dst_dir);
        spit(path, g, n);
        free(g);
    }
}

/* A variant of fixture `family`: its weights linked (or rewritten by fn), its config edited by kv. */
static char *variant(const char *family, edit_fn fn, const char *const *kv) {
    char src[400], path[600];
    snprintf(src, sizeof src, "%s/%s", MOEX_FIXTURES, family);
    char *dir = temp_dir();
    if (fn) {
        rewrite_safetensors(src, dir, fn);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        char target[600];
        snprintf(target, sizeof target, "%s/model.safetensors", src);
        assert_int_equal(symlink(target, path), 0);
    }
    write_config(src, dir, kv);
    return dir;
}

/* ---- loading and generating ------------------------------------------------ */

static moex_model_options small_options(void) {
    moex_model_options o = moex_model_default_options();
    o.max_batch = 1;
    o.max_seq = 32;
    o.max_tokens = 16;
    o.num_threads = 1;
    return o;
}

/* Load dir expecting status want with need1 and need2 in the message; *out stays NULL. */
static void load_bad(const char *label, const char *dir, const moex_model_options *o, moex_status want,
                     const char *need1, const char *need2) {
    moex_model *m = NULL;
    moex_status st = moex_model_load(dir, o, &m);
    const char *msg = moex_last_error();
    if (st != want) PROBLEM("%s: status %d (%s), want %d; message: %s", label, st, moex_status_str(st), want, msg);
    if ((need1 && !contains(msg, need1)) || (need2 && !contains(msg, need2)))
        PROBLEM("%s: message lacks %s: %s", label, needs_text(need1, need2), msg);
    if (m) PROBLEM("%s: a model came back with an error", label);
    moex_model_free(m);
}

/* The greedy tokens and the last prompt logits of a 4-token generation from dir. */
typedef struct run_out {
    int32_t ids[4];
    float *logits;
    int64_t vocab;
} run_out;

static moex_status run(const char *dir, const moex_model_options *o, run_out *r) {
    static const int32_t prompt[] = {3, 17, 42, 7, 99, 5};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {6};
    moex_model *m = NULL;
    moex_status st = moex_model_load(dir, o, &m);
    if (st) return st;
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 4;
    go.ignore_eos = 1;
    go.want_logits = 1;
    moex_generation *g = NULL;
    st = moex_generate(m, 1, p, len, &go, &g);
    if (!st) {
        memcpy(r->ids, g->new_ids[0], sizeof r->ids);
        r->vocab = g->vocab;
        r->logits = malloc(sizeof(float) * (size_t)g->vocab);
        memcpy(r->logits, g->last_prompt_logits[0], sizeof(float) * (size_t)g->vocab);
    }
    moex_generation_free(g);
    moex_model_free(m);
    return st;
}

/* ---- dtypes that travel with each tensor ------------------------------------- */

static edit expert0_up(const char *n) { return strcmp(n, "model.layers.0.mlp.experts.0.up_proj.weight") ? KEEP : BF16; }

static edit gates_1_to_7(const char *n) {
    int e;
    char tail[64];
    if (sscanf(n, "model.layers.0.mlp.experts.%d.%63s", &e, tail) == 2 && e >= 1 && !strcmp(tail, "gate_proj.weight"))
        return BF16;
    return KEEP;
}

static edit fused_down(const char *n) { return strcmp(n, "model.layers.1.mlp.experts.down_proj") ? KEEP : BF16; }

/* One experts matrix in another dtype than the rest of its layer: refused by name, on every
 * backend (before: read as f32 past its end, or wrong tokens). */
static void test_experts_matrix_dtype(void **state) {
    (void)state;
    moex_model_options o = small_options();
    const backend_list backends = cpu_backends(); /* every registered backend that takes the CPU */
    assert_true(backends.n > 0);
    char *dir = variant("qwen3_moe", expert0_up, NULL);
    for (int b = 0; b < backends.n; b++) {
        o.experts = backends.name[b];
        load_bad("expert 0 up_proj bf16", dir, &o, MOEX_ERR_FORMAT, "model.layers.0.mlp.experts.0.up_proj.weight",
                 "BF16");
    }
    o.dtype = MOEX_BF16; /* bf16 compute converts every weight, but the layer is refused all the same */
    load_bad("expert 0 up_proj bf16, bf16 compute", dir, &o, MOEX_ERR_FORMAT, "experts.0.up_proj.weight", "F32");
    remove_dir(dir);
    o = small_options();
    dir = variant("qwen3_moe", gates_1_to_7, NULL);
    load_bad("gates of experts 1-7 bf16", dir, &o, MOEX_ERR_FORMAT, "model.layers.0.mlp.experts.1.gate_proj.weight",
             "model.layers.0.mlp.experts.0.gate_proj.weight");
    remove_dir(dir);
    dir = variant("qwen3_moe-fused", fused_down, NULL);
    load_bad("fused down_proj bf16", dir, &o, MOEX_ERR_FORMAT, "model.layers.1.mlp.experts.down_proj",
             "model.layers.1.mlp.experts.gate_up_proj");
    remove_dir(dir);
    end_problems();
}

static edit post_norm_bf16(const char *n) { return strstr(n, "post_attention_layernorm") ? BF16 : KEEP; }
static edit post_norm_round(const char *n) { return strstr(n, "post_attention_layernorm") ? ROUND : KEEP; }

/* input_layernorm F32 and post_attention_layernorm BF16 in every layer: each read in its own
 * dtype, so the logits equal those of the same (bf16-rounded) values stored as F32
 * (before: one dtype field served both, and one norm was read in the other's dtype). */
static void test_norm_dtypes(void **state) {
    (void)state;
    moex_model_options o = small_options();
    char *mixed = variant("qwen3_moe", post_norm_bf16, NULL), *same = variant("qwen3_moe", post_norm_round, NULL);
    run_out a = {0}, b = {0};
    assert_int_equal(run(mixed, &o, &a), MOEX_OK);
    assert_int_equal(run(same, &o, &b), MOEX_OK);
    assert_memory_equal(a.ids, b.ids, sizeof a.ids);
    for (int64_t v = 0; v < a.vocab; v++)
        if (a.logits[v] != b.logits[v]) {
            PROBLEM("logit %lld: %g with bf16 norms, %g with the same values in f32", (long long)v, (double)a.logits[v],
                    (double)b.logits[v]);
            break;
        }
    free(a.logits);
    free(b.logits);
    remove_dir(mixed);
    remove_dir(same);
    end_problems();
}

/* ---- config keys -------------------------------------------------------------- */

typedef struct key_case {
    const char *label, *family;
    const char *kv[7];
    int64_t max_seq;
    moex_status want;
    const char *need1, *need2;
} key_case;

/* Keys transformers honours and moex does not implement: refused at load, by name. */
static void test_unsupported_keys(void **state) {
    (void)state;
    static const key_case cases[] = {
        {"hidden_act gelu", "qwen3_moe", {"hidden_act", "\"gelu\""}, 0, MOEX_ERR_UNSUPPORTED, "hidden_act", "gelu"},
        {"hidden_act relu, text_config", "qwen3_vl_moe", {"text_config.hidden_act", "\"relu\""}, 0,
         MOEX_ERR_UNSUPPORTED, "text_config.hidden_act", "relu"},
        {"rope linear", "qwen3_moe", {"rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 2.0, "
                                      "\"rope_theta\": 1000000.0}"}, 0, MOEX_ERR_UNSUPPORTED, "rope_parameters", "linear"},
        {"rope yarn (rope_scaling)", "mixtral", {"rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, "
                                                 "\"original_max_position_embeddings\": 64}"}, 0,
         MOEX_ERR_UNSUPPORTED, "rope_scaling", "yarn"},
        {"rope dynamic", "qwen2_moe", {"rope_parameters", "{\"rope_type\": \"dynamic\", \"factor\": 2.0}"}, 0,
         MOEX_ERR_UNSUPPORTED, "rope_parameters", "dynamic"},
        {"rope bogus type", "qwen3_moe", {"rope_parameters", "{\"rope_type\": \"bogus\"}"}, 0, MOEX_ERR_UNSUPPORTED,
         "rope type", "bogus"},
        {"rope linear factor 0", "qwen3_moe", {"rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 0}"}, 0,
         MOEX_ERR_UNSUPPORTED, "linear", NULL},
        {"rope linear factor -3", "qwen3_moe", {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -3}"}, 0,
         MOEX_ERR_UNSUPPORTED, "linear", NULL},
        {"partial_rotary_factor", "qwen3_moe", {"partial_rotary_factor", "0.5"}, 0, MOEX_ERR_UNSUPPORTED,
         "partial_rotary_factor", "0.5"},
        {"mixtral sliding_window", "mixtral", {"sliding_window", "8"}, 32, MOEX_ERR_UNSUPPORTED, "sliding_window",
         "max_seq = 32"},
        {"mixtral sliding_window 0", "mixtral", {"sliding_window", "0"}, 32, MOEX_ERR_UNSUPPORTED, "sliding_window",
         "no usable"},
        {"qwen2_moe use_sliding_window", "qwen2_moe",
         {"use_sliding_window", "true", "sliding_window", "16", "layer_types", NULL}, 32, MOEX_ERR_UNSUPPORTED,
         "use_sliding_window", "first: 0"},
        {"qwen2_moe layer_types", "qwen2_moe",
         {"use_sliding_window", "true", "sliding_window", "4",
          "layer_types", "[\"full_attention\", \"sliding_attention\", \"full_attention\"]"},
         32, MOEX_ERR_UNSUPPORTED, "layer_types", "first: 1"},
        {"qwen3_moe use_sliding_window", "qwen3_moe", {"use_sliding_window", "true", "sliding_window", "20"}, 32,
         MOEX_ERR_UNSUPPORTED, "use_sliding_window", "20"},
        {"qwen2_moe layer_types bad", "qwen2_moe", {"layer_types", "[\"full_attention\", \"local\", \"full_attention\"]"},
         0, MOEX_ERR_FORMAT, "layer_types[1]", "local"},
        {"vl mrope_section sum", "qwen3_vl_moe",
         {"text_config.rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 5000000.0, "
                                         "\"mrope_section\": [4, 2, 1], \"mrope_interleaved\": true}"},
         0, MOEX_ERR_FORMAT, "mrope_section", "head_dim / 2 = 8"},
        {"vl mrope_section count", "qwen3_vl_moe",
         {"text_config.rope_parameters", "{\"rope_type\": \"default\", \"mrope_section\": [6, 2]}"}, 0,
         MOEX_ERR_FORMAT, "mrope_section has 2 entries", NULL},
        {"num_experts_per_tok 0", "qwen3_moe", {"num_experts_per_tok", "0"}, 0, MOEX_ERR_FORMAT,
         "num_experts_per_tok = 0", "config.json"},
        {"num_hidden_layers 2^31-1", "qwen3_moe", {"num_hidden_layers", "2147483647"}, 0, MOEX_ERR_FORMAT,
         "num_hidden_layers = 2147483647", "outside [1, 65536]"},
        {"num_hidden_layers 65536", "qwen3_moe", {"num_hidden_layers", "65536"}, 0, MOEX_ERR_NOT_FOUND,
         "num_hidden_layers = 65536", "model.layers.65535.input_layernorm.weight"},
        {"olmoe clip_qkv", "olmoe", {"clip_qkv", "8.0"}, 0, MOEX_ERR_UNSUPPORTED, "clip_qkv = 8", NULL},
        {"olmoe clip_qkv string", "olmoe", {"clip_qkv", "\"8\""}, 0, MOEX_ERR_FORMAT, "clip_qkv", NULL},
        {"olmoe head_dim", "olmoe", {"head_dim", "8"}, 0, MOEX_ERR_FORMAT, "head_dim = 8", "hidden_size = 64"},
        {"glm4_moe n_group 3", "glm4_moe", {"n_group", "3"}, 0, MOEX_ERR_FORMAT, "n_group = 3", "n_routed_experts = 8"},
        {"glm4_moe topk_group 3", "glm4_moe", {"topk_group", "3"}, 0, MOEX_ERR_FORMAT, "topk_group = 3", NULL},
        {"glm4_moe partial rotary 0.1", "glm4_moe",
         {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.1}"}, 0,
         MOEX_ERR_FORMAT, "partial_rotary_factor = 0.1", "rotates 1 values"},
        {"deepseek_v3 kv heads 2", "deepseek_v3", {"num_key_value_heads", "2"}, 0, MOEX_ERR_FORMAT,
         "num_key_value_heads = 2", "each of the 4 heads"},
        {"deepseek_v3 kv_lora_rank absent", "deepseek_v3", {"kv_lora_rank", NULL}, 0, MOEX_ERR_FORMAT,
         "kv_a_proj_with_mqa", "expected [520, 64]"},
        {"deepseek_v3 v_head_dim 40", "deepseek_v3", {"v_head_dim", "40"}, 0, MOEX_ERR_UNSUPPORTED, "v_head_dim = 40",
         NULL},
        {"deepseek_v3 odd rope", "deepseek_v3", {"qk_rope_head_dim", "7"}, 0, MOEX_ERR_FORMAT, "qk_rope_head_dim = 7",
         NULL},
        {"deepseek_v3 no q_lora", "deepseek_v3", {"q_lora_rank", "null"}, 0, MOEX_ERR_NOT_FOUND, "q_proj", NULL},
        {"deepseek_v3 yarn mscale 0.707", "deepseek_v3-yarn",
         {"rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, "
                             "\"original_max_position_embeddings\": 64, \"mscale\": 0.707, \"mscale_all_dim\": 1.0}"},
         0, MOEX_ERR_UNSUPPORTED, "attention factor of 0.9", "mscale = mscale_all_dim"},
        {"deepseek_v3 yarn without original", "deepseek_v3-yarn",
         {"rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0}"}, 0,
         MOEX_ERR_FORMAT, "yarn rope", "original_max_position_embeddings = 0"},
        {"gpt_oss sliding_window 0", "gpt_oss", {"sliding_window", "0"}, 0, MOEX_ERR_UNSUPPORTED, "sliding-window",
         "no usable sliding_window"},
        {"gpt_oss layer_types bad", "gpt_oss", {"layer_types", "[\"sliding_attention\", \"local\", \"full_attention\"]"},
         0, MOEX_ERR_FORMAT, "layer_types[1]", "local"},
        {"gpt_oss layer_types short", "gpt_oss", {"layer_types", "[\"sliding_attention\"]"}, 0, MOEX_ERR_FORMAT,
         "layer_types has 1 entries", NULL},
        {"mxfp4 on qwen3_moe", "qwen3_moe", {"quantization_config", "{\"quant_method\": \"mxfp4\"}"}, 0,
         MOEX_ERR_UNSUPPORTED, "\"mxfp4\" is read for gpt_oss checkpoints only", "qwen3_moe"},
        {"gpt_oss mxfp4 without blocks", "gpt_oss", {"quantization_config", "{\"quant_method\": \"mxfp4\"}"}, 0,
         MOEX_ERR_NOT_FOUND, "gate_up_proj_blocks", NULL},
        {"olmoe no experts", "olmoe", {"num_experts", "0", "num_experts_per_tok", "0"}, 0, MOEX_ERR_FORMAT,
         "num_experts = 0", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const key_case *k = &cases[i];
        char *dir = variant(k->family, NULL, k->kv);
        moex_model_options o = small_options();
        if (k->max_seq) o.max_seq = k->max_seq;
        load_bad(k->label, dir, &o, k->want, k->need1, k->need2);
        remove_dir(dir);
    }
    end_problems();
}

/* Reads the fixture's expected tokens (transformers' greedy continuation of prompt 0). */
static void expected_tokens(const char *family, int32_t out[4]) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/expected.json", MOEX_FIXTURES, family);
    char *text = slurp(path, NULL);
    cJSON *root = cJSON_Parse(text);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "new_ids"), 0);
    assert_non_null(c);
    for (int j = 0; j < 4; j++) out[j] = (int32_t)cJSON_GetArrayItem(c, j)->valuedouble;
    cJSON_Delete(root);
    free(text);
}

/* Where a key cannot change the result it loads, with transformers' tokens: a sliding window
 * at least max_seq long, a qwen2_moe window without use_sliding_window, the default rope type
 * spelled out with unused fields, the keys of the qwen3_vl_moe text config transformers drops. */
static void test_keys_that_cannot_bind(void **state) {
    (void)state;
    static const struct {
        const char *family, *kv[7];
    } ok[] = {
        {"mixtral", {"sliding_window", "32"}},
        {"qwen2_moe", {"sliding_window", "4", "use_sliding_window", "false"}},
        {"qwen3_moe", {"sliding_window", "4", "use_sliding_window", "false", "hidden_act", "\"swish\""}},
        {"qwen3_moe", {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0, \"factor\": 8.0}"}},
        {"qwen3_vl_moe", {"text_config.sliding_window", "4", "text_config.use_sliding_window", "true"}},
        {"qwen3_moe", {"rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 1000000.0, "
                                          "\"mrope_section\": [1, 1]}"}},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char *dir = variant(ok[i].family, NULL, ok[i].kv);
        moex_model_options o = small_options();
        run_out r = {0};
        int32_t want[4];
        expected_tokens(ok[i].family, want);
        moex_status st = run(dir, &o, &r);
        if (st) PROBLEM("%s case %zu: %s", ok[i].family, i, moex_last_error());
        else if (memcmp(r.ids, want, sizeof want))
            PROBLEM("%s case %zu: tokens %d %d %d %d, transformers %d %d %d %d", ok[i].family, i, r.ids[0], r.ids[1],
                    r.ids[2], r.ids[3], want[0], want[1], want[2], want[3]);
        free(r.logits);
        remove_dir(dir);
    }
    end_problems();
}

/* Absent keys take the defaults of transformers' config class of the family. */
static void test_family_defaults(void **state) {
    (void)state;
    const char *json =
        "{\"model_type\": \"mixtral\", \"vocab_size\": 32, \"hidden_size\": 64, \"num_hidden_layers\": 1, "
        "\"num_attention_heads\": 16}";
    moex_config c;
    assert_int_equal(moex_config_parse(json, strlen(json), &c), MOEX_OK);
    assert_int_equal(c.num_key_value_heads, 8);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_int_equal(c.intermediate_size, 14336);
    assert_true(c.rope.theta == 1e6);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.n_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_true(c.rms_norm_eps == 1e-5);
    moex_config_free(&c);
    /* the fixture without num_experts_per_tok, num_local_experts and num_key_value_heads: the defaults
     * (2, 8, 8) do not fit its 4 experts and 2 kv heads, and the load says which tensor disagrees */
    const char *kv[] = {"num_experts_per_tok", NULL, "num_local_experts", NULL, NULL};
    char *dir = variant("mixtral", NULL, kv);
    moex_model_options o = small_options();
    load_bad("mixtral default experts", dir, &o, MOEX_ERR_FORMAT, "block_sparse_moe.gate.weight", "[8, 64]");
    remove_dir(dir);
    end_problems();
}

/* ---- files that are not what they seem ------------------------------------------ */

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_hostile_checkpoint: timed out\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(1);
}

/* A FIFO as config.json or generation_config.json: refused at once, naming it. */
static void test_fifo_config(void **state) {
    (void)state;
    signal(SIGALRM, on_alarm);
    const char *names[] = {"config.json", "generation_config.json"};
    for (int i = 0; i < 2; i++) {
        char *dir = variant("qwen3_moe", NULL, NULL);
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
        assert_int_equal(mkfifo(path, 0600), 0);
        moex_model_options o = small_options();
        alarm(20);
        load_bad(names[i], dir, &o, MOEX_ERR_IO, names[i], "not a regular file");
        alarm(0);
        remove_dir(dir);
    }
    end_problems();
}

/* An index naming 200000 distinct missing shards: the first is reported, in well under
 * the time the quadratic scan took (minutes). */
static void test_index_many_shards(void **state) {
    (void)state;
    char *dir = temp_dir();
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("{\"weight_map\": {", fp);
    const int n = 200000;
    for (int i = 0; i < n; i++) fprintf(fp, "%s\"t%d\": \"shard-%07d.safetensors\"", i ? ", " : "", i, i);
    fputs("}}", fp);
    fclose(fp);
    moex_checkpoint *c = NULL;
    signal(SIGALRM, on_alarm);
    alarm(60);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(moex_checkpoint_open(dir, &c), MOEX_ERR_IO);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    alarm(0);
    assert_true(contains(moex_last_error(), "shard-0000000.safetensors"));
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (s > 10) PROBLEM("200000 distinct shard names took %.1f s", s);
    assert_null(c);
    remove_dir(dir);
    end_problems();
}

/* The checkpoint shrunk, rewritten in place (same size) or replaced by rename after load. */
static void test_file_changed_after_load(void **state) {
    (void)state;
    static const int32_t prompt[] = {3, 17, 42};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {3};
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 2;
    for (int how = 0; how < 3; how++) {
        char *dir = variant("qwen3_moe", NULL, NULL);
        char path[600], copy[600], src[600];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        snprintf(src, sizeof src, "%s/qwen3_moe/model.safetensors", MOEX_FIXTURES);
        unlink(path); /* a private copy to change */
        size_t n;
        char *bytes = slurp(src, &n);
        spit(path, bytes, n);
        moex_model_options o = small_options();
        moex_model *m = NULL;
        assert_int_equal(moex_model_load(dir, &o, &m), MOEX_OK);
        moex_generation *g = NULL;
        assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_OK);
        moex_generation_free(g);
        g = NULL;
        struct timespec pause = {0, 20000000}; /* past the file system's time granularity */
        nanosleep(&pause, NULL);
        if (how == 0) {
            assert_int_equal(truncate(path, (off_t)(n / 2)), 0);
        } else if (how == 1) {
            bytes[n - 1] ^= 0x40; /* the same size, one byte different */
            FILE *fp = fopen(path, "r+b");
            assert_non_null(fp);
            fseek(fp, (long)n - 1, SEEK_SET);
            fputc(bytes[n - 1], fp);
            fclose(fp);
        } else {
            snprintf(copy, sizeof copy, "%s/new.safetensors", dir);
            bytes[n - 1] ^= 0x40;
            spit(copy, bytes, n);
            assert_int_equal(rename(copy, path), 0); /* the model keeps the file it mapped */
        }
        moex_status st = moex_generate(m, 1, p, len, &go, &g);
        if (how < 2) {
            if (st != MOEX_ERR_IO || !contains(moex_last_error(), path) || !contains(moex_last_error(), "reload"))
                PROBLEM("change %d: status %d, message %s", how, st, moex_last_error());
            if (g) PROBLEM("change %d: a generation came back with an error", how);
        } else if (st != MOEX_OK) {
            PROBLEM("replaced by rename: %s", moex_last_error());
        }
        moex_generation_free(g);
        moex_model_free(m);
        free(bytes);
        remove_dir(dir);
    }
    end_problems();
}

/* ---- small ones ---------------------------------------------------------------------- */

/* Out of memory at every allocation cJSON makes while parsing a fixture's config: always
 * MOEX_ERR_OUT_OF_MEMORY with an out-of-memory message, never "not valid JSON". */
static void test_json_out_of_memory(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/qwen3_vl_moe/config.json", MOEX_FIXTURES);
    size_t len;
    char *text = slurp(path, &len);
    int failures = 0;
    for (long k = 0;; k++) {
        moex_config c;
        moex_json_fail_allocation(k);
        moex_status st = moex_config_parse(text, len, &c);
        moex_json_fail_allocation(-1);
        if (st == MOEX_OK) {
            moex_config_free(&c);
            break; /* k is past the last allocation */
        }
        failures++;
        if (st != MOEX_ERR_OUT_OF_MEMORY || !contains(moex_last_error(), "out of memory"))
            PROBLEM("allocation %ld failing: status %d, message %s", k, st, moex_last_error());
    }
    if (failures < 10) PROBLEM("only %d allocations were made", failures);
    /* the experts map's parser too */
    moex_model_options o = small_options();
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", &o, &m), MOEX_OK);
    moex_json_fail_allocation(0);
    moex_status st = moex_model_set_experts(m, "{\"\": \"eager\"}");
    moex_json_fail_allocation(-1);
    if (st != MOEX_ERR_OUT_OF_MEMORY) PROBLEM("experts map: status %d, %s", st, moex_last_error());
    moex_model_free(m);
    free(text);
    end_problems();
}

/* An infinite temperature is refused before the prefill (the sampler refused it after). */
static void test_infinite_temperature(void **state) {
    (void)state;
    static const int32_t prompt[] = {3, 17, 42};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {3};
    moex_model_options o = small_options();
    moex_model *m = NULL;
    assert_int_equal(moex_model_load(MOEX_FIXTURES "/qwen3_moe", &o, &m), MOEX_OK);
    moex_generate_options go = moex_generate_default_options();
    go.temperature = INFINITY;
    moex_generation *g = NULL;
    assert_int_equal(moex_generate(m, 1, p, len, &go, &g), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "temperature = inf"));
    assert_null(g);
    moex_model_free(m);
}

static edit nan_final_norm(const char *n) { return strcmp(n, "model.norm.weight") ? KEEP : NANS; }

/* NaN weights make NaN logits: greedy generation fails naming the NaN (it returned token 0), with
 * the prompt's logits asked for (the host picks the first token) and without (the step's argmax). */
static void test_nan_logits(void **state) {
    (void)state;
    char *dir = variant("qwen3_moe", nan_final_norm, NULL);
    moex_model_options o = small_options();
    run_out r = {0};
    moex_status st = run(dir, &o, &r);
    if (st != MOEX_ERR_INVALID_ARGUMENT || !contains(moex_last_error(), "is NaN"))
        PROBLEM("NaN logits: status %d, message %s, first token %d", st, moex_last_error(), r.ids[0]);
    free(r.logits);
    static const int32_t prompt[] = {3, 17, 42};
    const int32_t *p[1] = {prompt};
    int64_t len[1] = {3};
    moex_model *m = NULL;
    moex_generation *g = NULL;
    moex_generate_options go = moex_generate_default_options();
    go.max_new_tokens = 2;
    st = moex_model_load(dir, &o, &m);
    if (!st) st = moex_generate(m, 1, p, len, &go, &g);
    if (st != MOEX_ERR_INVALID_ARGUMENT || !contains(moex_last_error(), "is NaN (prompt 0)") || g)
        PROBLEM("NaN logits, no logits asked for: status %d, message %s", st, moex_last_error());
    moex_generation_free(g);
    moex_model_free(m);
    remove_dir(dir);
    end_problems();
}

/* max_tokens below max_batch: a decode step of max_batch sequences could not run; dequantize on
 * a checkpoint that is not quantized. */
static void test_max_tokens_below_batch(void **state) {
    (void)state;
    moex_model_options o = small_options();
    o.max_batch = 4;
    o.max_tokens = 3;
    load_bad("max_tokens < max_batch", MOEX_FIXTURES "/qwen3_moe", &o, MOEX_ERR_INVALID_ARGUMENT, "max_tokens = 3",
             "max_batch = 4");
    /* an option with nothing to act on is refused, not ignored */
    o = small_options();
    o.dequantize = 1;
    load_bad("dequantize, not quantized", MOEX_FIXTURES "/qwen3_moe", &o, MOEX_ERR_INVALID_ARGUMENT, "dequantize",
             "not quantized");
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_experts_matrix_dtype),
        cmocka_unit_test(test_norm_dtypes),
        cmocka_unit_test(test_unsupported_keys),
        cmocka_unit_test(test_keys_that_cannot_bind),
        cmocka_unit_test(test_family_defaults),
        cmocka_unit_test(test_fifo_config),
        cmocka_unit_test(test_index_many_shards),
        cmocka_unit_test(test_file_changed_after_load),
        cmocka_unit_test(test_json_out_of_memory),
        cmocka_unit_test(test_max_tokens_below_batch),
        cmocka_unit_test(test_nan_logits),
        cmocka_unit_test(test_infinite_temperature),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
