/* experts_map.c — the per-sub-config backend map of a model (see experts_map.h). */
#include "model/experts_map.h"
#include "experts/dispatch.h"
#include "core/json.h"
#include <stdio.h>

static const char *const LOAD_ONLY = "deepgemm_megamoe";

moex_status moex_experts_map_init(moex_experts_map *m, const char *const *subconfigs, int n_subconfigs) {
    if (!m || (n_subconfigs > 0 && !subconfigs))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_map_init: null argument");
    if (n_subconfigs < 0 || n_subconfigs > MOEX_MAP_MAX_ENTRIES - 1)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%d sub-configs; at most %d are supported", n_subconfigs,
                         MOEX_MAP_MAX_ENTRIES - 1);
    moex_experts_map v;
    memset(&v, 0, sizeof v);
    v.n = 1 + n_subconfigs;
    for (int i = 0; i < v.n; i++) {
        const char *key = i ? subconfigs[i - 1] : "";
        if (!key) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sub-config name %d is NULL", i - 1);
        if (strlen(key) >= MOEX_MAP_KEY_LEN)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sub-config name \"%.60s...\" is longer than %d characters", key,
                             MOEX_MAP_KEY_LEN - 1);
        snprintf(v.keys[i], MOEX_MAP_KEY_LEN, "%s", key);
        snprintf(v.names[i], MOEX_MAP_NAME_LEN, "grouped_mm");
    }
    *m = v;
    return MOEX_OK;
}

static int find_key(const moex_experts_map *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return i;
    return -1;
}

const char *moex_experts_map_get(const moex_experts_map *m, const char *key) {
    int i = m && key ? find_key(m, key) : -1;
    return i < 0 ? NULL : m->names[i];
}

static moex_status unknown_key(const moex_experts_map *m, const char *key) {
    char valid[512];
    size_t len = 0;
    valid[0] = 0;
    for (int i = 0; i < m->n && len < sizeof valid; i++)
        len += (size_t)snprintf(valid + len, sizeof valid - len, "%s\"%s\"", i ? ", " : "", m->keys[i]);
    return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "unknown experts map key \"%.60s\"; valid keys: %s", key, valid);
}

// Check a backend name and the load-time-only rule for entry i.
static moex_status check_name(const moex_experts_map *m, int i, const char *name, int at_load) {
    if (moex_backend_lookup(name) != MOEX_OK) return moex_registry_not_found(name);
    if (!at_load && strcmp(m->names[i], name) != 0 && (!strcmp(name, LOAD_ONLY) || !strcmp(m->names[i], LOAD_ONLY)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "switching \"%s\" from %s to %s at run time is not possible: %s is chosen at load time; "
                         "reload the model",
                         m->keys[i], m->names[i], name, LOAD_ONLY);
    return MOEX_OK;
}

moex_status moex_experts_map_apply(moex_experts_map *m, const char *spec, int at_load) {
    if (!m || !spec) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_map_apply: null argument");
    moex_experts_map v = *m;
    const char *s = spec;
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    if (*s != '{') { /* one name for every entry */
        for (int i = 0; i < v.n; i++) {
            moex_status st = check_name(&v, i, spec, at_load);
            if (st) return st;
        }
        if (strlen(spec) >= MOEX_MAP_NAME_LEN) return moex_registry_not_found(spec);
        for (int i = 0; i < v.n; i++) snprintf(v.names[i], MOEX_MAP_NAME_LEN, "%s", spec);
        *m = v;
        return MOEX_OK;
    }
    const char *end = NULL;
    int oom = 0;
    cJSON *root = moex_json_parse(spec, strlen(spec), &end, &oom);
    if (!root && oom) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "out of memory parsing the experts map");
    while (root && end && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (root && end && *end) {
        cJSON_Delete(root);
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "experts map: unexpected text after the JSON object, at byte %zu: "
                         "%.40s", (size_t)(end - spec), end);
    }
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "experts map is not a JSON object of sub-config -> backend, e.g. {\"\": \"grouped_mm\", "
                         "\"text_config\": \"eager\"}: %.80s",
                         spec);
    }
    moex_status st = MOEX_OK;
    int named[MOEX_MAP_MAX_ENTRIES] = {0};
    const cJSON *global = NULL, *item;
    cJSON_ArrayForEach(item, root) { /* named entries first; "" fills the rest */
        if (!cJSON_IsString(item)) {
            st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "experts map value of \"%.60s\" is not a string", item->string);
            break;
        }
        if (item->string[0] == 0) {
            global = item;
            continue;
        }
        int i = find_key(&v, item->string);
        if (i <= 0) {
            st = unknown_key(&v, item->string);
            break;
        }
        if ((st = check_name(&v, i, item->valuestring, at_load))) break;
        snprintf(v.names[i], MOEX_MAP_NAME_LEN, "%s", item->valuestring);
        named[i] = 1;
    }
    for (int i = 0; !st && global && i < v.n; i++) {
        if (named[i]) continue;
        if ((st = check_name(&v, i, global->valuestring, at_load))) break;
        snprintf(v.names[i], MOEX_MAP_NAME_LEN, "%s", global->valuestring);
    }
    cJSON_Delete(root);
    if (st) return st;
    *m = v;
    return MOEX_OK;
}

// s as the body of a JSON string (quotes, backslashes and control characters escaped) at
// out + len when it fits in size; returns the new length either way.
static size_t json_string(char *out, size_t size, size_t len, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        int n;
        if (*p == '"' || *p == '\\') n = snprintf(esc, sizeof esc, "\\%c", *p);
        else if (*p < 0x20) n = snprintf(esc, sizeof esc, "\\u%04x", *p);
        else esc[0] = (char)*p, esc[1] = 0, n = 1;
        if (len + (size_t)n < size) memcpy(out + len, esc, (size_t)n);
        len += (size_t)n;
    }
    return len;
}

moex_status moex_experts_map_to_json(const moex_experts_map *m, char *buf, size_t size) {
    if (!m || !buf || size == 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_experts_map_to_json: null argument");
    size_t len = 0;
    for (int pass = 0; pass < 2; pass++) { /* the length first, so that nothing is written when it does not fit */
        char *out = pass ? buf : NULL;
        const size_t room = pass ? size : 0;
        len = 0;
        for (int i = 0; i < m->n; i++) {
            const char *open = i ? ", \"" : "{\"";
            if (out) memcpy(out + len, open, strlen(open));
            len = json_string(out, room, len + strlen(open), m->keys[i]);
            if (out) memcpy(out + len, "\": \"", 4);
            len = json_string(out, room, len + 4, m->names[i]);
            if (out) out[len] = '"';
            len++;
        }
        if (out) memcpy(out + len, "}", 2);
        len += 2; /* "}" and the NUL */
        if (!pass && len > size)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "experts map needs %zu bytes, buffer has %zu", len, size);
    }
    return MOEX_OK;
}

void moex_experts_map_for_decode(const moex_experts_map *m, moex_device_kind device, int enabled, moex_experts_map *out) {
    *out = *m;
    if (!enabled) return;
    for (int i = 0; i < out->n; i++) /* the dispatch table says which backend decodes for each */
        snprintf(out->names[i], MOEX_MAP_NAME_LEN, "%s", moex_dispatch_decode_backend(m->names[i], device));
}

moex_status moex_experts_map_run_decode(moex_experts_map *m, moex_device_kind device, int enabled,
                                        moex_status (*step)(void *user), void *user) {
    moex_experts_map saved = *m;
    moex_experts_map_for_decode(&saved, device, enabled, m);
    moex_status st = step(user);
    *m = saved; /* restored on every path, error or not */
    return st;
}
