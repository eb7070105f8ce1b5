/* config.c — config.json / generation_config.json through cJSON (see config.h). */
#include "model/config.h"
#include "core/internal.h"

#include "core/json.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Largest config file read. */
#define MAX_CONFIG_BYTES ((size_t)64 << 20)
/* Upper bound of sizes and token ids: they must fit int32 arithmetic downstream. */
#define INT_MAXV ((int64_t)INT32_MAX)
/* The most layers a config may declare: far above any model's (a few hundred), low enough that what
 * the parse sizes by it (gpt_oss's per-layer window flags) stays small for a hostile file. */
#define MAX_LAYERS ((int64_t)65536)

/* Where a value is looked up: an object, the file name and the key path
 * prefix ("" or "text_config.") used in messages. */
typedef struct jobj {
    const cJSON *o;
    const char *what;
    const char *pfx;
} jobj;

typedef enum family { FAM_OTHER, FAM_QWEN2_MOE, FAM_QWEN3_MOE, FAM_MIXTRAL, FAM_QWEN3_VL_MOE, FAM_OLMOE, FAM_GLM4_MOE, FAM_DEEPSEEK_V3, FAM_GPT_OSS } family;

/* What an absent key means: the defaults of transformers' config class of each family
 * (Qwen2MoeConfig, Qwen3MoeConfig, MixtralConfig, Qwen3VLMoeTextConfig, OlmoeConfig, Glm4MoeConfig, DeepseekV3Config, GptOssConfig).
 * kv_heads 0 means
 * num_attention_heads. */
typedef struct family_defaults {
    int64_t kv_heads, experts, top_k, intermediate, moe_intermediate, shared_intermediate;
    double theta;
    int64_t bos, eos; /* -1: none */
} family_defaults;

static const family_defaults DEFAULTS[] = {
    [FAM_OTHER] = {0, 0, 0, 0, 0, 0, 10000.0, -1, -1},
    [FAM_QWEN2_MOE] = {16, 60, 4, 5632, 1408, 5632, 10000.0, -1, -1},
    [FAM_QWEN3_MOE] = {4, 128, 8, 6144, 768, 0, 10000.0, -1, -1},
    [FAM_MIXTRAL] = {8, 8, 2, 14336, 0, 0, 1000000.0, 1, 2},
    [FAM_QWEN3_VL_MOE] = {16, 60, 4, 5632, 1408, 0, 500000.0, -1, -1},
    [FAM_OLMOE] = {0, 64, 8, 2048, 0, 0, 10000.0, -1, 50279},
    [FAM_GLM4_MOE] = {8, 128, 8, 10944, 1408, 0, 10000.0, -1, -1},
    [FAM_DEEPSEEK_V3] = {128, 256, 8, 18432, 2048, 0, 10000.0, 0, 1},
    [FAM_GPT_OSS] = {8, 128, 4, 2880, 0, 0, 150000.0, -1, -1},
};

/* ---- typed getters ------------------------------------------------------ */

/* "a string", "an array", ... for messages. */
static const char *json_kind(const cJSON *v) {
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

/* The value of `key` in j.o (the last one if repeated, as Python's json does);
 * NULL if absent or null. */
static const cJSON *jget(jobj j, const char *key) {
    const cJSON *found = NULL;
    if (!j.o) return NULL;
    for (const cJSON *e = j.o->child; e; e = e->next)
        if (e->string && strcmp(e->string, key) == 0) found = e;
    return found && !cJSON_IsNull(found) ? found : NULL;
}

/* Wrong-type error for key. */
static moex_status type_error(jobj j, const char *key, const cJSON *v, const char *expected) {
    return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s is %s, expected %s", j.what, j.pfx, key, json_kind(v), expected);
}

/* v (named key) as an integer in [lo, hi]. */
static moex_status int_value(jobj j, const char *key, const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return type_error(j, key, v, "an integer");
    double d = v->valuedouble;
    if (isnan(d) || d != floor(d))
        return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s = %.17g is not an integer", j.what, j.pfx, key, d);
    if (d < (double)lo || d > (double)hi)
        return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s = %.17g is outside [%lld, %lld]", j.what, j.pfx, key, d,
                         (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return MOEX_OK;
}

/* Optional integer key in [lo, hi]: *out set and *found = 1 when present. */
static moex_status get_int(jobj j, const char *key, int64_t lo, int64_t hi, int64_t *out, int *found) {
    const cJSON *v = jget(j, key);
    if (found) *found = v != NULL;
    return v ? int_value(j, key, v, lo, hi, out) : MOEX_OK;
}

/* Optional finite number key, > 0 when positive is set. */
static moex_status get_num(jobj j, const char *key, int positive, double *out, int *found) {
    const cJSON *v = jget(j, key);
    if (found) *found = v != NULL;
    if (!v) return MOEX_OK;
    if (!cJSON_IsNumber(v)) return type_error(j, key, v, "a number");
    double d = v->valuedouble;
    if (!isfinite(d) || (positive && !(d > 0)))
        return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s = %.17g is not a %s number", j.what, j.pfx, key, d,
                         positive ? "positive finite" : "finite");
    *out = d;
    return MOEX_OK;
}

/* Optional boolean key. */
static moex_status get_bool(jobj j, const char *key, int *out, int *found) {
    const cJSON *v = jget(j, key);
    if (found) *found = v != NULL;
    if (!v) return MOEX_OK;
    if (!cJSON_IsBool(v)) return type_error(j, key, v, "true or false");
    *out = cJSON_IsTrue(v);
    return MOEX_OK;
}

/* Optional string key copied into buf[n]; longer strings are an error. */
static moex_status get_str(jobj j, const char *key, char *buf, size_t n, int *found) {
    const cJSON *v = jget(j, key);
    if (found) *found = v != NULL;
    if (!v) return MOEX_OK;
    if (!cJSON_IsString(v)) return type_error(j, key, v, "a string");
    size_t len = strlen(v->valuestring);
    if (len >= n)
        return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s is %zu characters long, at most %zu are accepted", j.what,
                         j.pfx, key, len, n - 1);
    memcpy(buf, v->valuestring, len + 1);
    return MOEX_OK;
}

/* Integer under any of the alias keys (NULL-terminated list); two present
 * with different values is an error naming both. */
static moex_status get_int_alias(jobj j, const char *const *keys, int64_t lo, int64_t hi, int64_t *out,
                                 int *found) {
    const char *first = NULL;
    int64_t val = 0;
    for (int i = 0; keys[i]; i++) {
        int64_t v;
        int f;
        moex_status st = get_int(j, keys[i], lo, hi, &v, &f);
        if (st != MOEX_OK) return st;
        if (!f) continue;
        if (first && v != val)
            return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s = %lld and %s%s = %lld disagree", j.what, j.pfx, first,
                             (long long)val, j.pfx, keys[i], (long long)v);
        if (!first) first = keys[i], val = v;
    }
    if (found) *found = first != NULL;
    if (first) *out = val;
    return MOEX_OK;
}

/* Required integer key in [lo, hi]. */
static moex_status need_int(jobj j, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    int f;
    moex_status st = get_int(j, key, lo, hi, out, &f);
    if (st == MOEX_OK && !f)
        return moex_fail(MOEX_ERR_FORMAT, "%s: required key %s%s is missing", j.what, j.pfx, key);
    return st;
}

/* An object-valued key (absent/null -> *out NULL); other types are an error. */
static moex_status get_obj(jobj j, const char *key, const cJSON **out) {
    const cJSON *v = jget(j, key);
    if (v && !cJSON_IsObject(v)) return type_error(j, key, v, "an object");
    *out = v;
    return MOEX_OK;
}

/* Token ids: an integer or a list of integers (eos), into ids[max]. */
static moex_status token_list(jobj j, const char *key, const cJSON *v, int64_t *ids, int *n) {
    if (cJSON_IsArray(v)) {
        int cnt = cJSON_GetArraySize(v), k = 0;
        if (cnt > MOEX_CONFIG_MAX_EOS)
            return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s lists %d ids, at most %d are accepted", j.what, j.pfx, key,
                             cnt, MOEX_CONFIG_MAX_EOS);
        for (const cJSON *e = v->child; e; e = e->next, k++) {
            char name[96];
            snprintf(name, sizeof name, "%s[%d]", key, k);
            moex_status st = int_value(j, name, e, 0, INT_MAXV, &ids[k]);
            if (st != MOEX_OK) return st;
        }
        *n = k;
        return MOEX_OK;
    }
    if (!cJSON_IsNumber(v)) return type_error(j, key, v, "an integer or a list of integers");
    *n = 1;
    return int_value(j, key, v, 0, INT_MAXV, &ids[0]);
}

/* eos_token_id / bos_token_id / pad_token_id from j into c where present. */
static moex_status special_tokens(jobj j, moex_config *c) {
    const cJSON *v = jget(j, "eos_token_id");
    if (v) {
        int64_t ids[MOEX_CONFIG_MAX_EOS];
        int n = 0;
        moex_status st = token_list(j, "eos_token_id", v, ids, &n);
        if (st != MOEX_OK) return st;
        memcpy(c->eos_token_ids, ids, sizeof ids);
        c->n_eos = n;
    }
    moex_status st = get_int(j, "bos_token_id", 0, INT_MAXV, &c->bos_token_id, NULL);
    if (st == MOEX_OK) st = get_int(j, "pad_token_id", 0, INT_MAXV, &c->pad_token_id, NULL);
    return st;
}

/* ---- sections ----------------------------------------------------------- */

/* model_type -> family. */
static family family_of(const char *model_type) {
    if (strcmp(model_type, "qwen2_moe") == 0) return FAM_QWEN2_MOE;
    if (strcmp(model_type, "qwen3_moe") == 0) return FAM_QWEN3_MOE;
    if (strcmp(model_type, "mixtral") == 0) return FAM_MIXTRAL;
    if (strcmp(model_type, "qwen3_vl_moe") == 0) return FAM_QWEN3_VL_MOE;
    if (strcmp(model_type, "olmoe") == 0) return FAM_OLMOE;
    if (strcmp(model_type, "glm4_moe") == 0) return FAM_GLM4_MOE;
    if (strcmp(model_type, "deepseek_v3") == 0) return FAM_DEEPSEEK_V3;
    if (strcmp(model_type, "gpt_oss") == 0) return FAM_GPT_OSS;
    return FAM_OTHER;
}

/* Every top-level "*_config" object key except the quantization ones. */
static moex_status list_sub_configs(jobj root, moex_config *c) {
    for (const cJSON *e = root.o->child; e; e = e->next) {
        size_t len = strlen(e->string);
        if (len <= 7 || strcmp(e->string + len - 7, "_config") != 0 || !cJSON_IsObject(e)) continue;
        if (strcmp(e->string, "quantization_config") == 0 || strcmp(e->string, "compression_config") == 0) continue;
        if (moex_config_has_sub_config(c, e->string)) continue; /* a repeated key */
        if (len >= MOEX_CONFIG_NAME_LEN)
            return moex_fail(MOEX_ERR_FORMAT, "%s: sub-config name \"%.80s...\" is longer than %d characters",
                             root.what, e->string, MOEX_CONFIG_NAME_LEN - 1);
        if (c->n_sub_configs == MOEX_CONFIG_MAX_SUB)
            return moex_fail(MOEX_ERR_FORMAT, "%s: more than %d sub-configs (at \"%s\")", root.what,
                             MOEX_CONFIG_MAX_SUB, e->string);
        memcpy(c->sub_configs[c->n_sub_configs++], e->string, len + 1);
    }
    return MOEX_OK;
}

/* Rope parameters from the rope object r (rope_parameters or rope_scaling, may be NULL) and text t. */
static moex_status parse_rope(jobj t, const char *rkey, const cJSON *r, family fam, moex_config *c) {
    moex_rope_config *rp = &c->rope;
    char pfx[96];
    snprintf(pfx, sizeof pfx, "%s%s.", t.pfx, rkey ? rkey : "");
    jobj j = {r, t.what, pfx};
    /* transformers 5 may nest per layer type: {"full_attention": {...}, "sliding_attention": {...}} */
    if (r && !jget(j, "rope_type") && !jget(j, "type") && !jget(j, "rope_theta")) {
        const cJSON *full = jget(j, "full_attention");
        if (cJSON_IsObject(full)) {
            snprintf(pfx, sizeof pfx, "%s%s.full_attention.", t.pfx, rkey);
            j.o = full;
        }
    }
    int f = 0;
    moex_status st = get_str(j, "rope_type", rp->type, sizeof rp->type, &f);
    if (st == MOEX_OK && !f) st = get_str(j, "type", rp->type, sizeof rp->type, &f);
    if (st == MOEX_OK && !f) strcpy(rp->type, "default");
    rp->theta = DEFAULTS[fam].theta;
    snprintf(rp->source, sizeof rp->source, "%s", rkey ? rkey : "none");
    int have_theta = 0;
    if (st == MOEX_OK) st = get_num(j, "rope_theta", 1, &rp->theta, &have_theta);
    if (st == MOEX_OK && !have_theta) st = get_num(t, "rope_theta", 1, &rp->theta, NULL);
    rp->partial_rotary_factor = fam == FAM_GLM4_MOE ? 0.5 : 1.0; /* Glm4MoeConfig's default */
    if (st == MOEX_OK) st = get_num(t, "partial_rotary_factor", 1, &rp->partial_rotary_factor, NULL);
    struct { const char *key; double *dst; } nums[] = {
        {"factor", &rp->factor},
        {"original_max_position_embeddings", &rp->original_max_position_embeddings},
        {"attention_factor", &rp->attention_factor},
        {"beta_fast", &rp->beta_fast},
        {"beta_slow", &rp->beta_slow},
        {"low_freq_factor", &rp->low_freq_factor},
        {"high_freq_factor", &rp->high_freq_factor},
        {"partial_rotary_factor", &rp->partial_rotary_factor},
        {"mscale", &rp->mscale},
        {"mscale_all_dim", &rp->mscale_all_dim},
    };
    for (size_t i = 0; i < sizeof nums / sizeof nums[0] && st == MOEX_OK; i++)
        st = get_num(j, nums[i].key, 0, nums[i].dst, NULL);
    rp->truncate = 1;
    if (st == MOEX_OK) st = get_bool(j, "truncate", &rp->truncate, NULL);
    if (st == MOEX_OK) st = get_bool(j, "mrope_interleaved", &rp->mrope_interleaved, NULL);
    const cJSON *ms = st == MOEX_OK ? jget(j, "mrope_section") : NULL;
    if (ms) {
        if (!cJSON_IsArray(ms)) return type_error(j, "mrope_section", ms, "a list of integers");
        int n = cJSON_GetArraySize(ms), k = 0;
        if (n > MOEX_CONFIG_MAX_MROPE)
            return moex_fail(MOEX_ERR_FORMAT, "%s: %smrope_section has %d entries, at most %d", j.what, j.pfx, n,
                             MOEX_CONFIG_MAX_MROPE);
        for (const cJSON *e = ms->child; e && st == MOEX_OK; e = e->next, k++) {
            char name[32];
            snprintf(name, sizeof name, "mrope_section[%d]", k);
            st = int_value(j, name, e, 0, INT_MAXV, &rp->mrope_section[k]);
        }
        rp->n_mrope_section = k;
    }
    return st;
}

/* The rope section: rope_scaling (non-empty) wins over rope_parameters, as in transformers 5. */
static moex_status rope_section(jobj t, family fam, moex_config *c) {
    const cJSON *rs, *rp;
    moex_status st = get_obj(t, "rope_scaling", &rs);
    if (st == MOEX_OK) st = get_obj(t, "rope_parameters", &rp);
    if (st != MOEX_OK) return st;
    if (rs && rs->child) return parse_rope(t, "rope_scaling", rs, fam, c);
    if (rp) return parse_rope(t, "rope_parameters", rp, fam, c);
    return parse_rope(t, NULL, NULL, fam, c);
}

/* mlp_only_layers: a list of layer indices in [0, num_hidden_layers). */
static moex_status mlp_only(jobj t, moex_config *c) {
    const cJSON *v = jget(t, "mlp_only_layers");
    if (!v) return MOEX_OK;
    if (!cJSON_IsArray(v)) return type_error(t, "mlp_only_layers", v, "a list of integers");
    int n = cJSON_GetArraySize(v), k = 0;
    if (n == 0) return MOEX_OK;
    c->mlp_only_layers = malloc((size_t)n * sizeof *c->mlp_only_layers);
    if (!c->mlp_only_layers) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", t.what);
    for (const cJSON *e = v->child; e; e = e->next, k++) {
        char name[48];
        snprintf(name, sizeof name, "mlp_only_layers[%d]", k);
        moex_status st = int_value(t, name, e, 0, c->num_hidden_layers - 1, &c->mlp_only_layers[k]);
        if (st != MOEX_OK) return st;
        c->n_mlp_only_layers = k + 1;
    }
    return MOEX_OK;
}

/* quantization_config: presence and the fields the quantized-experts work reads. */
static moex_status quantization(jobj root, moex_config *c) {
    const cJSON *q;
    moex_status st = get_obj(root, "quantization_config", &q);
    if (st != MOEX_OK || !q) return st;
    c->has_quantization_config = 1;
    jobj j = {q, root.what, "quantization_config."};
    st = get_str(j, "quant_method", c->quant_method, sizeof c->quant_method, NULL);
    if (st == MOEX_OK) st = get_str(j, "activation_scheme", c->activation_scheme, sizeof c->activation_scheme, NULL);
    if (st == MOEX_OK) st = get_str(j, "fmt", c->fmt, sizeof c->fmt, NULL);
    if (st == MOEX_OK) st = get_str(j, "scale_fmt", c->scale_fmt, sizeof c->scale_fmt, NULL);
    if (st != MOEX_OK) return st;
    const cJSON *b = jget(j, "weight_block_size");
    if (b) {
        if (!cJSON_IsArray(b) || cJSON_GetArraySize(b) != 2)
            return type_error(j, "weight_block_size", b, "a list of two integers");
        for (int k = 0; k < 2 && st == MOEX_OK; k++) {
            char name[32];
            snprintf(name, sizeof name, "weight_block_size[%d]", k);
            st = int_value(j, name, cJSON_GetArrayItem(b, k), 1, INT_MAXV, &c->weight_block_size[k]);
        }
        if (st != MOEX_OK) return st;
        c->has_weight_block_size = 1;
    }
    const cJSON *m = jget(j, "modules_to_not_convert");
    if (!m) return MOEX_OK;
    if (!cJSON_IsArray(m)) return type_error(j, "modules_to_not_convert", m, "a list of strings");
    int n = cJSON_GetArraySize(m), k = 0;
    if (n == 0) return MOEX_OK;
    c->modules_to_not_convert = calloc((size_t)n, sizeof(char *));
    if (!c->modules_to_not_convert) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", root.what);
    for (const cJSON *e = m->child; e; e = e->next, k++) {
        if (!cJSON_IsString(e)) {
            char name[48];
            snprintf(name, sizeof name, "modules_to_not_convert[%d]", k);
            return type_error(j, name, e, "a string");
        }
        size_t len = strlen(e->valuestring) + 1;
        char *s = malloc(len);
        if (!s) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory", root.what);
        memcpy(s, e->valuestring, len);
        c->modules_to_not_convert[c->n_modules_to_not_convert++] = s;
    }
    return MOEX_OK;
}

/* Which layers attend through a sliding window, as transformers derives it:
 *   qwen2_moe    window = sliding_window (default 4096) if use_sliding_window else 0; the layers
 *                from layer_types, or (when absent) the even layers below max_window_layers
 *                (default 28) when use_sliding_window
 *   qwen3_moe    every layer, window sliding_window, when use_sliding_window
 *   mixtral      every layer when sliding_window is not null
 *   qwen3_vl_moe none (its text config clears sliding_window)
 * Needs num_hidden_layers. */
static moex_status sliding(jobj t, family fam, moex_config *c) {
    int use = 0, f_win = 0, f_types = 0;
    int64_t win = fam == FAM_QWEN2_MOE || fam == FAM_QWEN3_MOE ? 4096 : 0, max_window = 28;
    moex_status st = get_bool(t, "use_sliding_window", &use, NULL);
    if (st == MOEX_OK) st = get_int(t, "sliding_window", INT64_MIN / 2, INT_MAXV, &win, &f_win);
    if (st == MOEX_OK) st = get_int(t, "max_window_layers", INT64_MIN / 2, INT_MAXV, &max_window, NULL);
    if (st != MOEX_OK) return st;
    const cJSON *types = fam == FAM_QWEN2_MOE || fam == FAM_GPT_OSS ? jget(t, "layer_types") : NULL;
    c->first_sliding_layer = -1;
    if (fam == FAM_GPT_OSS) { /* GptOssConfig: window 128, layer_types even layers sliding by default */
        if (!f_win) win = 128;
        c->layer_sliding = calloc((size_t)c->num_hidden_layers, 1);
        if (!c->layer_sliding) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for layer_types", t.what);
        if (!types)
            for (int64_t i = 0; i < c->num_hidden_layers; i += 2) {
                c->layer_sliding[i] = 1;
                if (c->n_sliding_layers++ == 0) c->first_sliding_layer = i;
            }
    }
    if (types) {
        if (!cJSON_IsArray(types)) return type_error(t, "layer_types", types, "a list of strings");
        int n = cJSON_GetArraySize(types), k = 0;
        if (n != c->num_hidden_layers)
            return moex_fail(MOEX_ERR_FORMAT, "%s: %slayer_types has %d entries, num_hidden_layers is %lld", t.what,
                             t.pfx, n, (long long)c->num_hidden_layers);
        for (const cJSON *e = types->child; e; e = e->next, k++) {
            int sl = cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0;
            if (!sl && !(cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0)) {
                char name[48];
                snprintf(name, sizeof name, "layer_types[%d]", k);
                if (!cJSON_IsString(e)) return type_error(t, name, e, "\"full_attention\" or \"sliding_attention\"");
                return moex_fail(MOEX_ERR_FORMAT, "%s: %s%s = \"%.40s\" is not \"full_attention\" or "
                                 "\"sliding_attention\"", t.what, t.pfx, name, e->valuestring);
            }
            if (sl && c->n_sliding_layers++ == 0) c->first_sliding_layer = k;
            if (sl && c->layer_sliding) c->layer_sliding[k] = 1;
        }
        f_types = 1;
    }
    switch (fam) {
    case FAM_QWEN2_MOE:
        if (!f_types && use)
            for (int64_t i = 0; i < c->num_hidden_layers; i += 2)
                if (i < max_window && c->n_sliding_layers++ == 0) c->first_sliding_layer = i;
        win = use ? win : 0;
        break;
    case FAM_QWEN3_MOE:
    case FAM_MIXTRAL:
        if ((fam == FAM_QWEN3_MOE && use) || (fam == FAM_MIXTRAL && f_win)) {
            c->n_sliding_layers = (int)(c->num_hidden_layers < INT32_MAX ? c->num_hidden_layers : INT32_MAX);
            c->first_sliding_layer = 0;
        }
        break;
    default: break;
    }
    c->sliding_window = c->n_sliding_layers ? (win > 0 ? win : -1) : 0;
    snprintf(c->sliding_source, sizeof c->sliding_source, "%s%s", t.pfx,
             fam == FAM_MIXTRAL ? "sliding_window" : f_types || fam == FAM_GPT_OSS ? "layer_types" : "use_sliding_window");
    return MOEX_OK;
}

/* Sizes, heads and the MoE fields of the text parameters t. */
static moex_status text_sizes(jobj t, family fam, moex_config *c) {
    static const char *const experts[] = {"num_experts", "num_local_experts", "n_routed_experts", NULL};
    static const char *const topk[] = {"num_experts_per_tok", "experts_per_token", NULL};
    const family_defaults *fd = &DEFAULTS[fam];
    c->intermediate_size = fd->intermediate;
    c->moe_intermediate_size = fd->moe_intermediate;
    c->shared_expert_intermediate_size = fd->shared_intermediate;
    c->num_experts = fd->experts;
    c->num_experts_per_tok = fd->top_k;
    moex_status st = need_int(t, "vocab_size", 1, INT_MAXV, &c->vocab_size);
    if (st == MOEX_OK) st = need_int(t, "hidden_size", 1, INT_MAXV, &c->hidden_size);
    if (st == MOEX_OK) st = need_int(t, "num_hidden_layers", 1, MAX_LAYERS, &c->num_hidden_layers);
    if (st == MOEX_OK) st = need_int(t, "num_attention_heads", 1, INT_MAXV, &c->num_attention_heads);
    if (st == MOEX_OK) st = get_int(t, "intermediate_size", 0, INT_MAXV, &c->intermediate_size, NULL);
    if (st == MOEX_OK) st = get_int(t, "moe_intermediate_size", 0, INT_MAXV, &c->moe_intermediate_size, NULL);
    if (st == MOEX_OK)
        st = get_int(t, "shared_expert_intermediate_size", 0, INT_MAXV, &c->shared_expert_intermediate_size, NULL);
    if (st == MOEX_OK) st = get_int(t, "max_position_embeddings", 0, INT_MAXV, &c->max_position_embeddings, NULL);
    int f_kv = 0, f_hd = 0;
    if (st == MOEX_OK) st = get_int(t, "num_key_value_heads", 1, INT_MAXV, &c->num_key_value_heads, &f_kv);
    if (st == MOEX_OK) st = get_int(t, "head_dim", 1, INT_MAXV, &c->head_dim, &f_hd);
    if (st == MOEX_OK) st = get_int_alias(t, experts, 0, INT_MAXV, &c->num_experts, NULL);
    if (st == MOEX_OK) st = get_int_alias(t, topk, 0, INT_MAXV, &c->num_experts_per_tok, NULL);
    if (st == MOEX_OK) st = get_int(t, "decoder_sparse_step", 1, INT_MAXV, &c->decoder_sparse_step, NULL);
    if (st != MOEX_OK) return st;
    if (!f_kv) c->num_key_value_heads = fd->kv_heads ? fd->kv_heads : c->num_attention_heads;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return moex_fail(MOEX_ERR_FORMAT, "%s: %snum_key_value_heads = %lld%s does not divide num_attention_heads = %lld",
                         t.what, t.pfx, (long long)c->num_key_value_heads,
                         f_kv ? "" : " (absent: the family's default)", (long long)c->num_attention_heads);
    if (!f_hd && fam != FAM_DEEPSEEK_V3) { /* deepseek_v3's head_dim is its qk_rope_head_dim (mla_sizes) */
        if (c->hidden_size % c->num_attention_heads != 0)
            return moex_fail(MOEX_ERR_FORMAT,
                             "%s: %shead_dim is absent and hidden_size = %lld is not a multiple of "
                             "num_attention_heads = %lld",
                             t.what, t.pfx, (long long)c->hidden_size, (long long)c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts)
        return moex_fail(MOEX_ERR_FORMAT, "%s: %snum_experts_per_tok = %lld exceeds the %lld experts", t.what, t.pfx,
                         (long long)c->num_experts_per_tok, (long long)c->num_experts);
    /* norm_topk_prob: mixtral and qwen3_vl_moe always renormalise; the Qwen configs default to false */
    int norm = fam == FAM_GLM4_MOE || fam == FAM_DEEPSEEK_V3; /* their config classes default to true */
    st = get_bool(t, "norm_topk_prob", &norm, NULL);
    c->norm_topk_prob = (fam == FAM_MIXTRAL || fam == FAM_QWEN3_VL_MOE) ? 1 : norm;
    return st;
}

/* DeepSeek-V3's latent attention sizes (DeepseekV3Config's defaults); q_lora_rank null means
 * no q compression (q_proj), absent the default 1536. The rotary head is qk_rope_head_dim wide,
 * which DeepseekV3Config makes head_dim whatever the file says. */
static moex_status mla_sizes(jobj t, moex_config *c) {
    c->q_lora_rank = 1536, c->kv_lora_rank = 512, c->qk_rope_head_dim = 64, c->qk_nope_head_dim = 128;
    c->v_head_dim = 128, c->rope_interleave = 1;
    moex_status st = get_int(t, "q_lora_rank", 1, INT_MAXV, &c->q_lora_rank, NULL);
    for (const cJSON *e = t.o ? t.o->child : NULL; st == MOEX_OK && e; e = e->next)
        if (e->string && !strcmp(e->string, "q_lora_rank") && cJSON_IsNull(e)) c->q_lora_rank = 0;
    if (st == MOEX_OK) st = get_int(t, "kv_lora_rank", 1, INT_MAXV, &c->kv_lora_rank, NULL);
    if (st == MOEX_OK) st = get_int(t, "qk_rope_head_dim", 2, INT_MAXV, &c->qk_rope_head_dim, NULL);
    if (st == MOEX_OK) st = get_int(t, "qk_nope_head_dim", 0, INT_MAXV, &c->qk_nope_head_dim, NULL);
    if (st == MOEX_OK) st = get_int(t, "v_head_dim", 1, INT_MAXV, &c->v_head_dim, NULL);
    if (st == MOEX_OK) st = get_bool(t, "rope_interleave", &c->rope_interleave, NULL);
    if (st != MOEX_OK) return st;
    if (c->qk_rope_head_dim % 2)
        return moex_fail(MOEX_ERR_FORMAT, "%s: %sqk_rope_head_dim = %lld must be even (rotated in pairs)", t.what, t.pfx,
                         (long long)c->qk_rope_head_dim);
    c->head_dim = c->qk_rope_head_dim;
    return MOEX_OK;
}

/* The rest of the text parameters: norms, activation, biases, tying, rope, tokens, router. */
static moex_status text_rest(jobj root, jobj t, family fam, moex_config *c) {
    c->rms_norm_eps = fam == FAM_MIXTRAL || fam == FAM_OLMOE || fam == FAM_GLM4_MOE || fam == FAM_GPT_OSS ? 1e-5 : 1e-6;
    moex_status st = get_num(t, "rms_norm_eps", 1, &c->rms_norm_eps, NULL);
    strcpy(c->hidden_act, "silu");
    if (st == MOEX_OK) st = get_str(t, "hidden_act", c->hidden_act, sizeof c->hidden_act, NULL);
    int f = 0;
    /* the attention biases as each family's attention reads them: Qwen2Moe's q/k/v from qkv_bias
     * (o never), the Qwen3 families' q/k/v/o from attention_bias, Mixtral's none */
    c->attention_bias = fam == FAM_QWEN2_MOE || fam == FAM_OTHER;
    if (st == MOEX_OK && fam == FAM_QWEN2_MOE) st = get_bool(t, "qkv_bias", &c->attention_bias, NULL);
    if (st == MOEX_OK && (fam == FAM_QWEN3_MOE || fam == FAM_QWEN3_VL_MOE || fam == FAM_OLMOE || fam == FAM_GLM4_MOE ||
                          fam == FAM_DEEPSEEK_V3))
        st = get_bool(t, "attention_bias", &c->attention_bias, NULL); /* glm4_moe: q/k/v only */
    if (st == MOEX_OK && fam == FAM_GLM4_MOE) st = get_bool(t, "use_qk_norm", &c->use_qk_norm, NULL);
    if (fam == FAM_GPT_OSS) { /* GptOssConfig: biases on q/k/v/o, the clamped swiglu */
        c->attention_bias = c->o_proj_bias = 1;
        c->swiglu_alpha = 1.702, c->swiglu_limit = 7.0;
        if (st == MOEX_OK) st = get_bool(t, "attention_bias", &c->attention_bias, NULL);
        c->o_proj_bias = c->attention_bias;
        if (st == MOEX_OK) st = get_num(t, "swiglu_alpha", 1, &c->swiglu_alpha, NULL);
        if (st == MOEX_OK) st = get_num(t, "swiglu_limit", 1, &c->swiglu_limit, NULL);
    }
    c->o_proj_bias = (fam == FAM_QWEN3_MOE || fam == FAM_QWEN3_VL_MOE || fam == FAM_OLMOE || fam == FAM_DEEPSEEK_V3 ||
                     fam == FAM_GPT_OSS) &&
                     c->attention_bias;
    /* olmoe clamps q, k and v to [-clip_qkv, clip_qkv] when the key is a number */
    if (st == MOEX_OK && fam == FAM_OLMOE) st = get_num(t, "clip_qkv", 1, &c->clip_qkv, &c->has_clip_qkv);
    if (st == MOEX_OK) st = sliding(t, fam, c);
    if (st == MOEX_OK) st = get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, &f);
    if (st == MOEX_OK && !f && t.o != root.o) st = get_bool(t, "tie_word_embeddings", &c->tie_word_embeddings, NULL);
    if (st == MOEX_OK) st = rope_section(t, fam, c);
    if (st == MOEX_OK) st = mlp_only(t, c);
    /* tokens: the family's defaults, the top level, then the text config over it */
    c->bos_token_id = DEFAULTS[fam].bos;
    if (DEFAULTS[fam].eos >= 0) c->n_eos = 1, c->eos_token_ids[0] = DEFAULTS[fam].eos;
    if (st == MOEX_OK && t.o != root.o) st = special_tokens(root, c);
    if (st == MOEX_OK) st = special_tokens(t, c);
    c->routed_scaling_factor = 1.0;
    if (fam == FAM_GLM4_MOE) c->n_group = c->topk_group = c->n_shared_experts = c->first_k_dense_replace = 1;
    if (fam == FAM_DEEPSEEK_V3) {
        c->n_group = 8, c->topk_group = 4, c->n_shared_experts = 1, c->first_k_dense_replace = 3;
        c->routed_scaling_factor = 2.5;
    }
    if (st == MOEX_OK) st = get_int(t, "n_group", 0, INT_MAXV, &c->n_group, NULL);
    if (st == MOEX_OK) st = get_int(t, "topk_group", 0, INT_MAXV, &c->topk_group, NULL);
    if (st == MOEX_OK) st = get_int(t, "n_shared_experts", 0, INT_MAXV, &c->n_shared_experts, NULL);
    if (st == MOEX_OK) st = get_int(t, "first_k_dense_replace", 0, INT_MAXV, &c->first_k_dense_replace, NULL);
    if (st == MOEX_OK) st = get_num(t, "routed_scaling_factor", 1, &c->routed_scaling_factor, NULL);
    if (st == MOEX_OK) st = get_str(t, "scoring_func", c->scoring_func, sizeof c->scoring_func, NULL);
    if (st == MOEX_OK && fam == FAM_DEEPSEEK_V3) st = mla_sizes(t, c);
    return st;
}

/* Parse JSON text (trailing whitespace allowed) into a new tree; the root must be an object. */
static moex_status parse_json(const char *json, size_t len, const char *what, cJSON **out) {
    if (!json && len) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%s: json is NULL", what);
    /* cJSON is given a NUL-terminated copy: cJSON 1.7.15 without Debian's fix for
     * CVE-2023-53154 reads one byte past the given length after a trailing comma. */
    char *text = malloc(len + 1);
    if (!text) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu bytes", what, len);
    if (len) memcpy(text, json, len);
    text[len] = '\0';
    const char *end = NULL;
    int oom = 0;
    cJSON *root = moex_json_parse(text, len, &end, &oom);
    if (!root) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        free(text);
        if (oom) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "%s: out of memory parsing %zu bytes of JSON", what, len);
        return moex_fail(MOEX_ERR_FORMAT, "%s: not valid JSON (error near byte %zu of %zu)", what, at, len);
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            size_t at = (size_t)(p - text);
            cJSON_Delete(root);
            free(text);
            return moex_fail(MOEX_ERR_FORMAT, "%s: unexpected text after the JSON value, at byte %zu", what, at);
        }
    free(text);
    if (!cJSON_IsObject(root)) {
        moex_status st = moex_fail(MOEX_ERR_FORMAT, "%s: the file is %s, expected a JSON object", what,
                                   json_kind(root));
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return MOEX_OK;
}

/* ---- public ------------------------------------------------------------ */

/* Free the lists and zero the struct; NULL is a no-op. */
void moex_config_free(moex_config *cfg) {
    if (!cfg) return;
    free(cfg->mlp_only_layers);
    free(cfg->layer_sliding);
    for (int i = 0; i < cfg->n_modules_to_not_convert; i++) free(cfg->modules_to_not_convert[i]);
    free(cfg->modules_to_not_convert);
    memset(cfg, 0, sizeof *cfg);
}

/* 1 if `name` is one of the config's sub-configs. */
int moex_config_has_sub_config(const moex_config *cfg, const char *name) {
    if (!cfg || !name) return 0;
    for (int i = 0; i < cfg->n_sub_configs; i++)
        if (strcmp(cfg->sub_configs[i], name) == 0) return 1;
    return 0;
}

/* Parse config.json text; see config.h. */
moex_status moex_config_parse(const char *json, size_t len, moex_config *out) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_config_parse: out is NULL");
    cJSON *root;
    moex_status st = parse_json(json, len, "config.json", &root);
    if (st != MOEX_OK) return st;
    moex_config c;
    memset(&c, 0, sizeof c);
    c.bos_token_id = c.pad_token_id = -1;
    c.decoder_sparse_step = 1;
    jobj r = {root, "config.json", ""};
    st = get_str(r, "model_type", c.model_type, sizeof c.model_type, NULL);
    family fam = family_of(c.model_type);
    if (st == MOEX_OK) st = list_sub_configs(r, &c);
    const cJSON *text = NULL;
    if (st == MOEX_OK) st = get_obj(r, "text_config", &text);
    jobj t = text ? (jobj){text, "config.json", "text_config."} : r;
    c.text_from_sub_config = text != NULL;
    if (st == MOEX_OK) st = text_sizes(t, fam, &c);
    if (st == MOEX_OK) st = text_rest(r, t, fam, &c);
    if (st == MOEX_OK) st = quantization(r, &c);
    cJSON_Delete(root);
    if (st != MOEX_OK) {
        moex_config_free(&c);
        return st;
    }
    *out = c;
    return MOEX_OK;
}

/* Apply generation_config.json's special tokens; see config.h. */
moex_status moex_config_apply_generation(const char *json, size_t len, moex_config *cfg) {
    if (!cfg) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_config_apply_generation: cfg is NULL");
    cJSON *root;
    moex_status st = parse_json(json, len, "generation_config.json", &root);
    if (st != MOEX_OK) return st;
    /* work on a copy of the token fields so that cfg is untouched on error */
    moex_config tok;
    memset(&tok, 0, sizeof tok);
    tok.n_eos = cfg->n_eos;
    memcpy(tok.eos_token_ids, cfg->eos_token_ids, sizeof tok.eos_token_ids);
    tok.bos_token_id = cfg->bos_token_id;
    tok.pad_token_id = cfg->pad_token_id;
    st = special_tokens((jobj){root, "generation_config.json", ""}, &tok);
    cJSON_Delete(root);
    if (st != MOEX_OK) return st;
    cfg->n_eos = tok.n_eos;
    memcpy(cfg->eos_token_ids, tok.eos_token_ids, sizeof tok.eos_token_ids);
    cfg->bos_token_id = tok.bos_token_id;
    cfg->pad_token_id = tok.pad_token_id;
    return MOEX_OK;
}


/* Prefix the last error message ("config.json: ...") with the directory. */
static moex_status in_dir(moex_status st, const char *dir) {
    char msg[900];
    snprintf(msg, sizeof msg, "%s", moex_last_error());
    return moex_fail(st, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] != '/' ? "/" : "", msg);
}

/* Read DIR/config.json and DIR/generation_config.json; see config.h. */
moex_status moex_config_load(const char *dir, moex_config *out) {
    if (!dir || !out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_config_load: %s is NULL", dir ? "out" : "dir");
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    if (!path) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_config_load: out of memory");
    const char *sep = dl && dir[dl - 1] != '/' ? "/" : "";
    char *text = NULL;
    size_t len = 0;
    int missing = 0;
    sprintf(path, "%s%sconfig.json", dir, sep);
    moex_status st = moex_read_file(path, MAX_CONFIG_BYTES, &text, &len, &missing);
    moex_config c;
    memset(&c, 0, sizeof c);
    if (st == MOEX_OK) {
        st = moex_config_parse(text, len, &c);
        if (st != MOEX_OK) st = in_dir(st, dir);
        free(text);
        text = NULL;
    }
    if (st == MOEX_OK) {
        sprintf(path, "%s%sgeneration_config.json", dir, sep);
        st = moex_read_file(path, MAX_CONFIG_BYTES, &text, &len, &missing);
        if (st != MOEX_OK && missing) st = MOEX_OK; /* optional file */
        else if (st == MOEX_OK) {
            st = moex_config_apply_generation(text, len, &c);
            if (st != MOEX_OK) st = in_dir(st, dir);
        }
        free(text);
    }
    free(path);
    if (st != MOEX_OK) {
        moex_config_free(&c);
        return st;
    }
    *out = c;
    return MOEX_OK;
}
