/*
 * fuzz_experts_map.c — libFuzzer target for the experts map (model/experts_map.h):
 * moex_experts_map_apply(), _to_json(), _get(), _for_decode() and _run_decode().
 *
 * Input: one control byte, then the spec (a backend name or a JSON map), used
 * as a NUL-terminated string (it ends at its first NUL byte).
 *   bit  0    at_load
 *   bits 1-3  the sub-config names the map is made with (MAP_SETS below)
 *   bits 4-5  the map's state before the spec: all eager, all
 *             deepgemm_megamoe, a mixed map (applied at load; it fails, leaving
 *             the map as made, on a set without text_config and
 *             vision_config), or as made (all grouped_mm)
 *   bits 6-7  the status the decode step returns in moex_experts_map_run_decode()
 * So the printable control bytes read: '0' + 2 * set + at_load is the map as
 * made ('0'..'9' sets 0-4, ':'..'?' sets 5-7); '@'..'O' start all eager,
 * 'P'..'_' all deepgemm_megamoe, '`'..'o' mixed; e.g. '4' is text_config and
 * vision_config at run time, 'U' the same at load from deepgemm_megamoe.
 *
 * Checked on every input:
 *   - a failed apply leaves the map's bytes as they were;
 *   - a successful one keeps the keys, names a registered backend
 *     (moex_backend_lookup) in every entry, switches nothing to or from
 *     deepgemm_megamoe at run time, and gives the map that the rules of
 *     experts_map.h give (recomputed here from cJSON's reading of the spec);
 *     a spec those rules accept is accepted;
 *   - moex_experts_map_to_json() parses back with cJSON as an object with the
 *     same keys and values in order, fits a buffer of exactly its size and
 *     fails on one byte less; applying it to a fresh map gives the same map;
 *   - _get() finds every key; _for_decode() copies the map and moves only
 *     grouped_mm to batched_mm, only on cuda with the switch on;
 *     _run_decode() runs the step on that map and restores the map whatever
 *     the step returns.
 *   - text after the JSON object ({"": "eager"} x) is refused, and sub-config
 *     names that JSON must escape come back escaped.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/experts_map.h"

#define MAP_LOAD_ONLY "deepgemm_megamoe"
/* A registered backend whose name has the most characters a name may have (63). */
#define MAP_LONG_BACKEND "fuzz_backend_named_with_the_longest_name_the_registry_allows_63"

/* The sub-config names a map is made with (control bits 1-3). Set 5 holds
 * names that JSON must escape; set 4 has 8 sub-configs, one of 47 characters. */
static const char *const MAP_SET_1[] = {"text_config"};
static const char *const MAP_SET_2[] = {"text_config", "vision_config"};
static const char *const MAP_SET_3[] = {"text_config", "vision_config", "audio_config"};
static const char *const MAP_SET_4[] = {"text_config",    "vision_config", "audio_config",
                                        "speech_config",  "thinker_config", "talker_config",
                                        "code2wav_config", "a_sub_config_name_of_forty_seven_characters_xyz"};
static const char *const MAP_SET_5[] = {"text\"config", "back\\slash", "tab\tand\nnewline"};
static const char *const MAP_SET_6[] = {"vision_config", "text_config"};
static const char *const MAP_SET_7[] = {"t\xc3\xa9xt_config", "x"};
static const struct {
    const char *const *names;
    int n;
} MAP_SETS[8] = {
    {NULL, 0},      {MAP_SET_1, 1}, {MAP_SET_2, 2}, {MAP_SET_3, 3},
    {MAP_SET_4, 8}, {MAP_SET_5, 3}, {MAP_SET_6, 2}, {MAP_SET_7, 2},
};
/* The map's state before the spec (control bits 4-5), applied at load. */
static const char *const MAP_START[4] = {
    "eager",
    MAP_LOAD_ONLY,
    "{\"\": \"batched_mm\", \"text_config\": \"" MAP_LOAD_ONLY "\", \"vision_config\": \"" MAP_LONG_BACKEND "\"}",
    NULL,
};
static const moex_status MAP_STEP_STATUS[4] = {MOEX_OK, MOEX_ERR_DEVICE, MOEX_ERR_INVALID_ARGUMENT, MOEX_ERR_INTERNAL};

static int map_dummy_supports(const moex_experts_desc *d, const moex_device_info *dev, char *why, size_t n, void *u) {
    (void)d, (void)dev, (void)why, (void)n, (void)u;
    return 1;
}
static moex_status map_dummy_forward(const moex_forward_args *a, void *u) {
    (void)a, (void)u;
    return MOEX_ERR_UNSUPPORTED;
}

/* Register MAP_LONG_BACKEND once. */
static void map_setup(void) {
    static int done;
    if (done) return;
    done = 1;
    moex_backend b;
    memset(&b, 0, sizeof b);
    b.name = MAP_LONG_BACKEND;
    b.summary = "a backend of the experts-map fuzz target (never runs)";
    b.supports = map_dummy_supports;
    b.forward = map_dummy_forward;
    moex_status st = moex_register_backend(&b);
    if (st != MOEX_OK && st != MOEX_ERR_EXISTS) abort();
}

static int map_find(const moex_experts_map *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return i;
    return -1;
}

/* 1 if a and b hold the same entries (the bytes after each string's NUL may differ:
 * a name overwritten by a shorter one keeps the old tail). */
static int map_same(const moex_experts_map *a, const moex_experts_map *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->keys[i], b->keys[i]) != 0 || strcmp(a->names[i], b->names[i]) != 0) return 0;
    return 1;
}

static int map_terminated(const moex_experts_map *m) {
    if (m->n < 1 || m->n > MOEX_MAP_MAX_ENTRIES) return 0;
    for (int i = 0; i < m->n; i++)
        if (!memchr(m->keys[i], 0, MOEX_MAP_KEY_LEN) || !memchr(m->names[i], 0, MOEX_MAP_NAME_LEN)) return 0;
    return 1;
}

/* May entry i of m move to name under the rules (registered; at run time not
 * to or from the load-time-only backend)? */
static int map_name_ok(const moex_experts_map *m, int i, const char *name, int at_load) {
    if (moex_backend_lookup(name) != MOEX_OK) return 0;
    if (strlen(name) >= MOEX_MAP_NAME_LEN) return 0;
    if (!at_load && strcmp(m->names[i], name) != 0 &&
        (!strcmp(name, MAP_LOAD_ONLY) || !strcmp(m->names[i], MAP_LOAD_ONLY)))
        return 0;
    return 1;
}

/* What applying spec to *before gives under the rules of experts_map.h, into
 * *want: 1 valid, 0 invalid (also for text other than JSON whitespace after
 * the object), -1 unsure (duplicate keys, where the rules do not say which
 * entry is checked against which). */
static int map_expect(const moex_experts_map *before, const char *spec, int at_load, moex_experts_map *want) {
    *want = *before;
    const char *s = spec;
    while (*s == ' ' || *s == '\t' || *s == '\n') s++;
    if (*s != '{') {
        for (int i = 0; i < want->n; i++)
            if (!map_name_ok(before, i, spec, at_load)) return 0;
        for (int i = 0; i < want->n; i++) snprintf(want->names[i], MOEX_MAP_NAME_LEN, "%s", spec);
        return 1;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(spec, &end, 0);
    while (root && end && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
    if (!cJSON_IsObject(root) || (end && *end)) {
        cJSON_Delete(root);
        return 0;
    }
    int result = 1;
    int named[MOEX_MAP_MAX_ENTRIES] = {0};
    const cJSON *global = NULL, *item;
    cJSON_ArrayForEach(item, root) {
        if (!cJSON_IsString(item)) {
            result = 0;
            break;
        }
        if (item->string[0] == 0) {
            global = item;
            continue;
        }
        int i = map_find(want, item->string);
        if (i <= 0) {
            result = 0;
            break;
        }
        if (named[i]) result = -1;
        if (!map_name_ok(want, i, item->valuestring, at_load)) {
            result = 0;
            break;
        }
        snprintf(want->names[i], MOEX_MAP_NAME_LEN, "%s", item->valuestring);
        named[i] = 1;
    }
    for (int i = 0; result && global && i < want->n; i++) {
        if (named[i]) continue;
        if (!map_name_ok(want, i, global->valuestring, at_load)) {
            result = 0;
            break;
        }
        snprintf(want->names[i], MOEX_MAP_NAME_LEN, "%s", global->valuestring);
    }
    cJSON_Delete(root);
    return result;
}

/* to_json, parse back, sizes, round trip through apply. */
static void map_check_json(const moex_experts_map *m, const char *const *subs, int n_subs) {
    char big[4096];
    if (moex_experts_map_to_json(m, big, sizeof big) != MOEX_OK) abort();
    size_t len = strnlen(big, sizeof big);
    if (len == sizeof big) abort();
    /* exactly its size fits; one byte less fails (heap buffers: the sanitizers see a write past the end) */
    char *exact = malloc(len + 1);
    if (!exact) return;
    if (moex_experts_map_to_json(m, exact, len + 1) != MOEX_OK || strcmp(exact, big) != 0) abort();
    free(exact);
    if (len > 0) {
        char *shorter = malloc(len);
        if (!shorter) return;
        if (moex_experts_map_to_json(m, shorter, len) == MOEX_OK) abort();
        free(shorter);
    }
    char one[1];
    if (moex_experts_map_to_json(m, one, 0) == MOEX_OK) abort();

    cJSON *root = cJSON_ParseWithOpts(big, NULL, 1);
    if (!cJSON_IsObject(root) || cJSON_GetArraySize(root) != m->n) abort();
    int i = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        if (!cJSON_IsString(item) || strcmp(item->string, m->keys[i]) != 0 || strcmp(item->valuestring, m->names[i]) != 0)
            abort();
        i++;
    }
    cJSON_Delete(root);

    /* get -> set: the JSON applied at load to a fresh map gives the same map */
    moex_experts_map again;
    if (moex_experts_map_init(&again, subs, n_subs) != MOEX_OK) abort();
    if (moex_experts_map_apply(&again, big, 1) != MOEX_OK || !map_same(&again, m)) abort();
}

static moex_experts_map map_in_step;  /* what the step saw */
static moex_status map_step_status;   /* what the step returns */
static moex_status map_step(void *user) {
    map_in_step = *(const moex_experts_map *)user;
    return map_step_status;
}

/* get, for_decode, run_decode. */
static void map_check_rest(moex_experts_map *m, int step_ctl) {
    for (int i = 0; i < m->n; i++) {
        const char *got = moex_experts_map_get(m, m->keys[i]);
        if (!got || got != m->names[map_find(m, m->keys[i])]) abort();
    }
    if (moex_experts_map_get(m, "no_such_config") || moex_experts_map_get(m, NULL) || moex_experts_map_get(NULL, ""))
        abort();
    const moex_experts_map saved = *m;
    for (int on_cuda = 0; on_cuda < 2; on_cuda++) {
        for (int enabled = 0; enabled < 2; enabled++) {
            moex_experts_map want = saved, out;
            if (on_cuda && enabled)
                for (int i = 0; i < want.n; i++)
                    if (!strcmp(want.names[i], "grouped_mm")) snprintf(want.names[i], MOEX_MAP_NAME_LEN, "batched_mm");
            memset(&out, 0xa5, sizeof out);
            moex_experts_map_for_decode(m, on_cuda, enabled, &out);
            if (!map_terminated(&out) || !map_same(&out, &want) || memcmp(m, &saved, sizeof saved) != 0) abort();
            map_step_status = MAP_STEP_STATUS[(step_ctl + on_cuda + 2 * enabled) & 3];
            memset(&map_in_step, 0, sizeof map_in_step);
            moex_status st = moex_experts_map_run_decode(m, on_cuda, enabled, map_step, m);
            if (st != map_step_status) abort();
            if (!map_same(&map_in_step, &want) || memcmp(m, &saved, sizeof saved) != 0) abort();
        }
    }
}

/* init refuses what it cannot hold and then leaves the map alone. */
static void map_check_init_limits(const moex_experts_map *m, const char *const *subs) {
    moex_experts_map copy = *m;
    char longest[MOEX_MAP_KEY_LEN + 1];
    memset(longest, 'k', MOEX_MAP_KEY_LEN);
    longest[MOEX_MAP_KEY_LEN] = 0; /* one character more than a key may have */
    const char *too_long[1] = {longest};
    const char *too_many[MOEX_MAP_MAX_ENTRIES];
    for (int i = 0; i < MOEX_MAP_MAX_ENTRIES; i++) too_many[i] = "a";
    const char *with_null[2] = {"text_config", NULL};
    if (moex_experts_map_init(&copy, too_long, 1) == MOEX_OK) abort();
    if (moex_experts_map_init(&copy, too_many, MOEX_MAP_MAX_ENTRIES) == MOEX_OK) abort();
    if (moex_experts_map_init(&copy, with_null, 2) == MOEX_OK) abort();
    if (moex_experts_map_init(&copy, subs, -1) == MOEX_OK) abort();
    if (memcmp(&copy, m, sizeof copy) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    map_setup();
    const uint8_t ctl = data[0];
    const int at_load = ctl & 1;
    const int set = (ctl >> 1) & 7;
    char *spec = malloc(size); /* the rest of the input and a NUL */
    if (!spec) return 0;
    memcpy(spec, data + 1, size - 1);
    spec[size - 1] = 0;

    moex_experts_map m;
    if (moex_experts_map_init(&m, MAP_SETS[set].names, MAP_SETS[set].n) != MOEX_OK) abort();
    if (m.n != 1 + MAP_SETS[set].n || !map_terminated(&m)) abort();
    const char *start = MAP_START[(ctl >> 4) & 3];
    if (start) {
        moex_experts_map before = m;
        if (moex_experts_map_apply(&m, start, 1) != MOEX_OK && memcmp(&m, &before, sizeof m) != 0) abort();
    }
    map_check_init_limits(&m, MAP_SETS[set].names);

    const moex_experts_map before = m;
    moex_experts_map want;
    const int expect = map_expect(&before, spec, at_load, &want);
    const moex_status st = moex_experts_map_apply(&m, spec, at_load);
    if (st != MOEX_OK) {
        if (memcmp(&m, &before, sizeof m) != 0) abort(); /* a failure changes nothing */
        if (expect == 1) abort();                        /* a spec the rules accept was refused */
    } else {
        if (!map_terminated(&m) || m.n != before.n) abort();
        for (int i = 0; i < m.n; i++) {
            if (memcmp(m.keys[i], before.keys[i], MOEX_MAP_KEY_LEN) != 0) abort();
            if (moex_backend_lookup(m.names[i]) != MOEX_OK) abort();
            if (!at_load && strcmp(m.names[i], before.names[i]) != 0 &&
                (!strcmp(m.names[i], MAP_LOAD_ONLY) || !strcmp(before.names[i], MAP_LOAD_ONLY)))
                abort();
        }
        if (expect == 0) abort(); /* a spec the rules refuse was accepted */
        if (expect == 1 && !map_same(&m, &want)) abort();
    }
    map_check_json(&m, MAP_SETS[set].names, MAP_SETS[set].n);
    map_check_rest(&m, ctl >> 6);
    free(spec);
    return 0;
}
