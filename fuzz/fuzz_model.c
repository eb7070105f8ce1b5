/*
 * fuzz_model.c — libFuzzer target for moex_model_load() and moex_generate()
 * with a fuzzed config.json and the real weights of a tiny fixture.
 *
 * Input: one control byte, an optional page byte, then the bytes of config.json.
 *   bits 0-2  the fixture (MDL_FIXTURES[] below, 0-7): its model.safetensors and
 *             generation_config.json are used as they are; a second byte of 1-8
 *             (never the start of a JSON text) picks fixture 7 + that byte
 *             instead, and the config starts after it
 *   bit  3    compute in bf16 instead of f32
 *   bits 4-5  the experts option: "eager", "batched_mm", {"": "eager"}, NULL
 *   bit  6    dequantize = 1
 *   bit  7    quantize = "fp8"
 * The seeds' control bytes are '0'..'7' (f32, default backend, as stored), so
 * a seed reads as a digit followed by the JSON.
 *
 * Once per process a private directory is made (under /dev/shm if it exists,
 * else /tmp) with one sub-directory per fixture holding symlinks to the
 * fixture's weights and generation config; each input rewrites config.json
 * there and loads that directory with small options (max_batch 1, max_seq 16,
 * max_tokens 16, one thread). The directory is removed at exit, and one left
 * behind by a process that crashed is removed by the next one.
 *
 * A model that loads must give consistent facts, a parseable experts map and,
 * from the prompt {1, 2, 3}, exactly two greedy tokens within the vocabulary
 * (ignore_eos); a broken promise aborts, which libFuzzer reports as a crash.
 * A load or generate that fails is fine: the fuzzer looks for memory errors,
 * undefined behaviour, leaks and huge allocations on the way.
 *
 * The fixtures are found in $MOEX_FIXTURES, else in the compile-time
 * MOEX_FIXTURES, else in ../tests/fixtures next to this file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moex.h"

/* The fixtures an input can pick: control byte & 7, or 7 + its page byte.
 * Keep the order: the corpus' control and page bytes refer to it. */
enum { MDL_SLOTS = 16 };
static const char *const MDL_FIXTURES[MDL_SLOTS] = {
    "qwen3_moe",       "qwen2_moe",     "mixtral",       "qwen3_vl_moe",
    "qwen3_moe-fp8",   "qwen3_moe-fused", "qwen2_moe-fused", "qwen3_vl_moe-per_expert",
    "deepseek_v3",     "deepseek_v3-fp8", "deepseek_v3-q_proj", "deepseek_v3-yarn",
    "gpt_oss",         "gpt_oss-mxfp4", "olmoe",         "glm4_moe",
};
static const char *const MDL_EXPERTS[4] = {"eager", "batched_mm", "{\"\": \"eager\"}", NULL};

static char mdl_root[PATH_MAX];  /* the private directory; "" until made, or when removed */
static int mdl_ready;            /* 1: ready; -1: could not be set up */
static int mdl_verbose;          /* $MOEX_FUZZ_VERBOSE: say how each input ended */

/* Remove a directory made by mdl_setup() (only the files it puts there). */
static void mdl_remove_dir(const char *root) {
    static const char *const files[] = {"config.json", "model.safetensors", "generation_config.json"};
    char p[2 * PATH_MAX];
    for (int i = 0; i < MDL_SLOTS; i++) {
        for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
            snprintf(p, sizeof p, "%s/%d/%s", root, i, files[k]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/%d", root, i);
        rmdir(p);
    }
    rmdir(root);
}

/* atexit: remove this process' directory. */
static void mdl_cleanup(void) {
    if (mdl_root[0]) mdl_remove_dir(mdl_root);
    mdl_root[0] = 0;
}

/* Remove the directories that earlier processes (now gone) left in base: a
 * crash ends the process without running atexit. Only this target's names
 * (moex-fuzz-model-<pid>-XXXXXX) and files are touched. */
static void mdl_remove_stale(const char *base) {
    DIR *d = opendir(base);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        char tail[16];
        if (sscanf(e->d_name, "moex-fuzz-model-%ld-%15s", &pid, tail) != 2 || pid <= 0 || strlen(tail) != 6) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char old[PATH_MAX + 256];
        snprintf(old, sizeof old, "%s/%s", base, e->d_name);
        mdl_remove_dir(old);
    }
    closedir(d);
}

/* The fixtures directory, as an absolute path, into out. */
static int mdl_fixtures_dir(char *out, size_t n) {
    char want[PATH_MAX];
    const char *env = getenv("MOEX_FIXTURES");
    if (env && *env) {
        snprintf(want, sizeof want, "%s", env);
    } else {
#ifdef MOEX_FIXTURES
        snprintf(want, sizeof want, "%s", MOEX_FIXTURES);
#else
        const char *slash = strrchr(__FILE__, '/');
        if (slash) snprintf(want, sizeof want, "%.*s/../tests/fixtures", (int)(slash - __FILE__), __FILE__);
        else snprintf(want, sizeof want, "../tests/fixtures");
#endif
    }
    char real[PATH_MAX];
    if (!realpath(want, real)) {
        fprintf(stderr, "fuzz_model: fixtures directory %s not found (set MOEX_FIXTURES)\n", want);
        return -1;
    }
    snprintf(out, n, "%s", real);
    return 0;
}

/* Make the private directory and the symlinks, once. */
static int mdl_setup(void) {
    if (mdl_ready) return mdl_ready;
    mdl_ready = -1;
    const char *v = getenv("MOEX_FUZZ_VERBOSE");
    mdl_verbose = v && *v && *v != '0';
    char fixtures[PATH_MAX];
    if (mdl_fixtures_dir(fixtures, sizeof fixtures)) return -1;
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) && access("/dev/shm", W_OK) == 0
                           ? "/dev/shm" : "/tmp";
    mdl_remove_stale(base);
    snprintf(mdl_root, sizeof mdl_root, "%s/moex-fuzz-model-%ld-XXXXXX", base, (long)getpid());
    if (!mkdtemp(mdl_root)) {
        perror("fuzz_model: mkdtemp");
        mdl_root[0] = 0;
        return -1;
    }
    atexit(mdl_cleanup);
    char dir[PATH_MAX + 16], from[PATH_MAX + 128], to[PATH_MAX + 128];
    for (int i = 0; i < MDL_SLOTS; i++) {
        snprintf(dir, sizeof dir, "%s/%d", mdl_root, i);
        if (mkdir(dir, 0700) != 0) {
            perror("fuzz_model: mkdir");
            return mdl_ready = -1;
        }
        static const char *const links[] = {"model.safetensors", "generation_config.json"};
        for (int k = 0; k < 2; k++) {
            snprintf(from, sizeof from, "%s/%s/%s", fixtures, MDL_FIXTURES[i], links[k]);
            snprintf(to, sizeof to, "%s/%s", dir, links[k]);
            if (access(from, R_OK) != 0) {
                if (k == 0) {
                    fprintf(stderr, "fuzz_model: %s not found\n", from);
                    return mdl_ready = -1;
                }
                continue; /* generation_config.json is optional */
            }
            if (symlink(from, to) != 0) {
                perror("fuzz_model: symlink");
                return mdl_ready = -1;
            }
        }
    }
    return mdl_ready = 1;
}

/* Write config.json of fixture slot i; 0 on success. */
static int mdl_write_config(int i, const uint8_t *data, size_t size) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%d/config.json", mdl_root, i);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    close(fd);
    return done == size ? 0 : -1;
}

/* Check what a loaded model promises, then generate from it. */
static void mdl_check(moex_model *m) {
    moex_model_info info;
    if (moex_model_get_info(m, &info) != MOEX_OK) abort();
    if (info.hidden < 1 || info.vocab < 1 || info.num_layers < 1) abort();
    if (info.num_moe_layers < 0 || info.num_moe_layers > info.num_layers) abort();
    if (info.num_moe_layers > 0 && (info.top_k < 1 || info.top_k > info.num_experts)) abort();
    if (!memchr(info.model_type, 0, sizeof info.model_type)) abort();
    for (int64_t i = 0; i < info.num_moe_layers; i++)
        if (!moex_model_experts_layer(m, i)) abort();
    if (moex_model_experts_layer(m, info.num_moe_layers)) abort();

    /* the experts map: "" and every sub-config, in order, each on a backend */
    char map[4096];
    if (moex_model_get_experts(m, map, sizeof map) != MOEX_OK) abort();
    { /* it parses, whatever the sub-config names hold */
        cJSON *j = cJSON_ParseWithOpts(map, NULL, 1);
        if (!cJSON_IsObject(j) || cJSON_GetArraySize(j) != 1 + info.num_sub_configs) abort();
        int i = -1;
        const cJSON *e;
        cJSON_ArrayForEach(e, j) {
            if (strcmp(e->string, i < 0 ? "" : info.sub_configs[i]) != 0) abort();
            if (!cJSON_IsString(e) || moex_backend_lookup(e->valuestring) != MOEX_OK) abort();
            i++;
        }
        cJSON_Delete(j);
    }

    static const int32_t prompt[3] = {1, 2, 3};
    const int32_t *const prompts[1] = {prompt};
    const int64_t lens[1] = {3};
    moex_generate_options o = moex_generate_default_options();
    o.max_new_tokens = 2;
    o.ignore_eos = 1;
    o.want_logits = 1;
    moex_generation *g = NULL;
    if (info.vocab <= 3) return; /* the prompt would be out of range */
    if (moex_generate(m, 1, prompts, lens, &o, &g) != MOEX_OK) {
        if (g) abort(); /* nothing is returned on failure */
        if (mdl_verbose) fprintf(stderr, "fuzz_model: generate failed: %s\n", moex_last_error());
        return;
    }
    if (mdl_verbose)
        fprintf(stderr, "fuzz_model: %s loaded, generated %d %d\n", info.model_type, (int)g->new_ids[0][0],
                (int)g->new_ids[0][g->num_new[0] > 1]);
    if (!g || g->n != 1 || g->vocab != info.vocab || g->num_new[0] != 2) abort();
    for (int64_t t = 0; t < g->num_new[0]; t++)
        if (g->new_ids[0][t] < 0 || g->new_ids[0][t] >= info.vocab) abort();
    if (!g->last_prompt_logits || !g->last_prompt_logits[0]) abort();
    volatile float sink = 0; /* every logit is read: the sanitizers see a short buffer */
    for (int64_t v = 0; v < g->vocab; v++) sink += g->last_prompt_logits[0][v];
    (void)sink;
    moex_generation_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || mdl_setup() != 1) return 0;
    const uint8_t ctl = data[0];
    const int paged = size >= 2 && data[1] >= 1 && data[1] <= MDL_SLOTS - 8;
    const int slot = paged ? 7 + data[1] : ctl & 7;
    if (mdl_write_config(slot, data + 1 + paged, size - 1 - (size_t)paged) != 0) return 0;
    moex_model_options mo = moex_model_default_options();
    mo.dtype = (ctl & 8) ? MOEX_BF16 : MOEX_F32;
    mo.experts = MDL_EXPERTS[(ctl >> 4) & 3];
    mo.dequantize = (ctl >> 6) & 1;
    mo.quantize = (ctl & 0x80) ? "fp8" : NULL;
    mo.num_threads = 1;
    mo.max_batch = 1;
    mo.max_seq = 16;
    mo.max_tokens = 16;
    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/%d", mdl_root, slot);
    moex_model *m = NULL;
    if (moex_model_load(dir, &mo, &m) != MOEX_OK) {
        if (m) abort(); /* nothing is returned on failure */
        if (mdl_verbose) fprintf(stderr, "fuzz_model: %s: load failed: %s\n", MDL_FIXTURES[slot], moex_last_error());
        return 0;
    }
    if (!m) abort();
    mdl_check(m);
    moex_model_free(m);
    return 0;
}
