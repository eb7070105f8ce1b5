/* test_tokenizer.c — moex's tokenizer.json (moex/tokenizer.h) against the `tokenizers` library:
 * the fixtures of tests/fixtures/tokenizers (written by make_tokenizer_fixtures.py: GPT-2, Qwen,
 * Llama-3 and GPT-OSS (o200k) byte-level layouts, Llama-2 and Mistral SentencePiece-style ones) give the same ids with
 * and without the post-processor's special tokens and the same decoded text on every line of
 * corpus.json (code, whitespace runs, digits, contractions, CJK, Arabic, emoji with ZWJ,
 * combining accents, special tokens inside text, empty and long strings); streaming decode
 * gives the same text in whole characters; byte-level round trips; malformed files fail naming
 * the key. A build without the tokenizer must say so. */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h" /* moex_read_file */
#include "moex.h"

#define DIR MOEX_FIXTURES "/tokenizers"
static const char *const FIXTURES[] = {"bytelevel-qwen", "bytelevel-gpt2", "bytelevel-llama3", "bytelevel-o200k",
                                       "spm-llama2", "spm-mistral"};
#define N_FIXTURES ((int)(sizeof FIXTURES / sizeof FIXTURES[0]))

static int have_tokenizer(void) {
    moex_tokenizer *t = NULL;
    moex_status st = moex_tokenizer_load(DIR "/bytelevel-gpt2", &t);
    moex_tokenizer_free(t);
    return st == MOEX_OK;
}

static cJSON *read_json(const char *path) {
    char *text;
    size_t len;
    int missing;
    assert_int_equal(moex_read_file(path, (size_t)1 << 26, &text, &len, &missing), MOEX_OK);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    return j;
}

static void expect_ids(const char *fixture, const char *text, const int32_t *ids, int64_t n, const cJSON *want,
                       const char *what) {
    int ok = cJSON_GetArraySize(want) == n;
    for (int64_t i = 0; ok && i < n; i++) ok = cJSON_GetArrayItem(want, (int)i)->valueint == ids[i];
    if (!ok) {
        fprintf(stderr, "%s: %s of \"%.60s\": %lld ids, tokenizers has %d\n", fixture, what, text, (long long)n,
                cJSON_GetArraySize(want));
        fail();
    }
}

/* The concatenation of streamed pieces of ids: each piece whole UTF-8, all of them the decode. */
static void check_stream(const moex_tokenizer *t, const int32_t *ids, int64_t n, const char *want) {
    moex_detok_stream *s = NULL;
    assert_int_equal(moex_detok_stream_new(t, 0, &s), MOEX_OK);
    char *all = calloc(strlen(want) * 2 + 64, 1);
    size_t at = 0;
    for (int64_t i = 0; i <= n; i++) {
        const char *p;
        size_t len;
        assert_int_equal(i < n ? moex_detok_stream_push(s, ids[i], &p, &len) : moex_detok_stream_finish(s, &p, &len),
                         MOEX_OK);
        for (size_t k = 0; k < len;) { /* whole characters only */
            const unsigned char c = (unsigned char)p[k];
            const size_t l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
            assert_true(k + l <= len);
            k += l;
        }
        assert_true(at + len < strlen(want) * 2 + 64);
        memcpy(all + at, p, len);
        at += len;
    }
    all[at] = 0;
    assert_string_equal(all, want);
    free(all);
    moex_detok_stream_free(s);
}

static void test_fixtures_match_tokenizers(void **state) {
    (void)state;
    if (!have_tokenizer()) skip();
    for (int f = 0; f < N_FIXTURES; f++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", DIR, FIXTURES[f]);
        moex_tokenizer *t = NULL;
        assert_int_equal(moex_tokenizer_load(path, &t), MOEX_OK);
        assert_true(moex_tokenizer_vocab_size(t) > 256);
        snprintf(path, sizeof path, "%s/%s/expected.json", DIR, FIXTURES[f]);
        cJSON *exp = read_json(path);
        const cJSON *cases = cJSON_GetObjectItem(exp, "cases"), *c;
        int n_cases = 0;
        cJSON_ArrayForEach(c, cases) {
            const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
            int32_t *ids;
            int64_t n;
            assert_int_equal(moex_tokenizer_encode(t, text, strlen(text), 1, &ids, &n), MOEX_OK);
            expect_ids(FIXTURES[f], text, ids, n, cJSON_GetObjectItem(c, "ids"), "ids");
            char *dec;
            size_t len;
            assert_int_equal(moex_tokenizer_decode(t, ids, n, 0, &dec, &len), MOEX_OK);
            const char *want = cJSON_GetObjectItem(c, "decoded")->valuestring;
            if (strcmp(dec, want)) fprintf(stderr, "%s: decode of \"%.60s\": \"%.60s\"\n", FIXTURES[f], text, dec);
            assert_string_equal(dec, want);
            assert_int_equal(len, strlen(want));
            check_stream(t, ids, n, want);
            moex_tokenizer_buffer_free(dec);
            moex_tokenizer_buffer_free(ids);
            assert_int_equal(moex_tokenizer_encode(t, text, strlen(text), 0, &ids, &n), MOEX_OK);
            expect_ids(FIXTURES[f], text, ids, n, cJSON_GetObjectItem(c, "ids_no_special"), "ids without specials");
            moex_tokenizer_buffer_free(ids);
            n_cases++;
        }
        assert_true(n_cases >= 30);
        cJSON_Delete(exp);
        moex_tokenizer_free(t);
    }
}

/* GPT-2's layout has no normalizer: decode(encode(s)) == s for every line, and for raw bytes
 * that are not UTF-8 the ids exist and decode gives U+FFFD for them. */
static void test_bytelevel_round_trip(void **state) {
    (void)state;
    if (!have_tokenizer()) skip();
    moex_tokenizer *t = NULL;
    assert_int_equal(moex_tokenizer_load(DIR "/bytelevel-gpt2/tokenizer.json", &t), MOEX_OK);
    cJSON *corpus = read_json(DIR "/corpus.json");
    const cJSON *c;
    cJSON_ArrayForEach(c, corpus) {
        int32_t *ids;
        int64_t n;
        char *dec;
        size_t len;
        assert_int_equal(moex_tokenizer_encode(t, c->valuestring, strlen(c->valuestring), 0, &ids, &n), MOEX_OK);
        assert_int_equal(moex_tokenizer_decode(t, ids, n, 0, &dec, &len), MOEX_OK);
        assert_string_equal(dec, c->valuestring);
        moex_tokenizer_buffer_free(ids);
        moex_tokenizer_buffer_free(dec);
    }
    cJSON_Delete(corpus);
    const char raw[] = "ok \xff\xfe \xe6\x97 end\x80"; /* invalid and truncated UTF-8 */
    int32_t *ids;
    int64_t n;
    char *dec;
    size_t len;
    assert_int_equal(moex_tokenizer_encode(t, raw, sizeof raw - 1, 0, &ids, &n), MOEX_OK);
    assert_true(n > 0);
    assert_int_equal(moex_tokenizer_decode(t, ids, n, 0, &dec, &len), MOEX_OK);
    assert_string_equal(dec, "ok \xEF\xBF\xBD\xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD end\xEF\xBF\xBD");
    moex_tokenizer_buffer_free(ids);
    moex_tokenizer_buffer_free(dec);
    /* an id outside the vocabulary is an error naming it; a stream keeps going after it */
    const int32_t bad_ids[] = {1, 1 << 29};
    assert_int_equal(moex_tokenizer_decode(t, bad_ids, 2, 0, &dec, &len), MOEX_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(moex_last_error(), "ids[1] = 536870912"));
    moex_detok_stream *s = NULL;
    const char *p;
    assert_int_equal(moex_detok_stream_new(t, 0, &s), MOEX_OK);
    assert_int_equal(moex_detok_stream_push(s, -5, &p, &len), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_detok_stream_push(s, 40, &p, &len), MOEX_OK);
    moex_detok_stream_free(s);
    moex_tokenizer_free(t);
}

/* A new temporary directory (dir: a mkdtemp template) and its tokenizer.json path. */
static void temp_tokenizer_path(char *dir, char *path, size_t n) {
    assert_non_null(mkdtemp(dir));
    snprintf(path, n, "%s/tokenizer.json", dir);
}

/* base with its member key set to a copy of value, written to path and loaded. */
static moex_tokenizer *load_with(cJSON *base, const char *key, const cJSON *value, const char *path) {
    cJSON_DeleteItemFromObject(base, key);
    cJSON_AddItemToObject(base, key, cJSON_Duplicate(value, 1));
    char *json = cJSON_PrintUnformatted(base);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    free(json);
    moex_tokenizer *t = NULL;
    assert_int_equal(moex_tokenizer_load(path, &t), MOEX_OK);
    return t;
}

/* Every Split behaviour, with and without invert, on eight patterns (zero-width ones too):
 * tests/fixtures/tokenizers/split-cases.json gives each pre-tokenizer (over bytelevel-gpt2's
 * model) and the ids tokenizers 0.23 gives on 24 texts. */
static void test_split_behaviors(void **state) {
    (void)state;
    if (!have_tokenizer()) skip();
    cJSON *cases = read_json(DIR "/split-cases.json"), *base = read_json(DIR "/bytelevel-gpt2/tokenizer.json");
    const cJSON *texts = cJSON_GetObjectItem(cases, "texts"), *c;
    char dir[] = "/tmp/moex-split-XXXXXX", path[64];
    temp_tokenizer_path(dir, path, sizeof path);
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "cases")) {
        moex_tokenizer *t = load_with(base, "pre_tokenizer", cJSON_GetObjectItem(c, "pre_tokenizer"), path);
        for (int i = 0; i < cJSON_GetArraySize(texts); i++) {
            const char *text = cJSON_GetArrayItem(texts, i)->valuestring;
            int32_t *ids;
            int64_t k;
            assert_int_equal(moex_tokenizer_encode(t, text, strlen(text), 0, &ids, &k), MOEX_OK);
            expect_ids("split-cases", text, ids, k, cJSON_GetArrayItem(cJSON_GetObjectItem(c, "ids"), i), "ids");
            moex_tokenizer_buffer_free(ids);
        }
        moex_tokenizer_free(t);
        n++;
    }
    assert_int_equal(n, 80);
    unlink(path);
    rmdir(dir);
    cJSON_Delete(cases);
    cJSON_Delete(base);
}

/* Decoder chains whose effects reach across tokens (Metaspace, and Fuse before Metaspace or a
 * Strip's start or stop): tests/fixtures/tokenizers/decoder-cases.json gives each chain and the
 * text tokenizers 0.23 decodes from 11 id lists; the whole decode and the streamed pieces must
 * give it. */
static void test_decoder_chains(void **state) {
    (void)state;
    if (!have_tokenizer()) skip();
    cJSON *cases = read_json(DIR "/decoder-cases.json");
    cJSON *base = cJSON_Duplicate(cJSON_GetObjectItem(cases, "base"), 1);
    const cJSON *idss = cJSON_GetObjectItem(cases, "ids"), *c;
    char dir[] = "/tmp/moex-dec-XXXXXX", path[64];
    temp_tokenizer_path(dir, path, sizeof path);
    int n = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(cases, "cases")) {
        moex_tokenizer *t = load_with(base, "decoder", cJSON_GetObjectItem(c, "decoder"), path);
        for (int i = 0; i < cJSON_GetArraySize(idss); i++) {
            const cJSON *l = cJSON_GetArrayItem(idss, i);
            int32_t ids[16];
            const int k = cJSON_GetArraySize(l);
            assert_true(k <= 16);
            for (int j = 0; j < k; j++) ids[j] = cJSON_GetArrayItem(l, j)->valueint;
            const char *want = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "decoded"), i)->valuestring;
            char *text;
            size_t len;
            assert_int_equal(moex_tokenizer_decode(t, ids, k, 0, &text, &len), MOEX_OK);
            if (strcmp(text, want)) fprintf(stderr, "decoder case %d, ids %d: '%s', want '%s'\n", n, i, text, want);
            assert_string_equal(text, want);
            moex_tokenizer_buffer_free(text);
            check_stream(t, ids, k, want);
        }
        moex_tokenizer_free(t);
        n++;
    }
    assert_int_equal(n, 8);
    unlink(path);
    rmdir(dir);
    cJSON_Delete(base);
    cJSON_Delete(cases);
}

/* A tokenizer.json written from text into a temporary directory, loaded: its status and message. */
static moex_status load_text(const char *json, char *msg, size_t n) {
    char dir[] = "/tmp/moex-tok-XXXXXX", path[64];
    temp_tokenizer_path(dir, path, sizeof path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    moex_tokenizer *t = NULL;
    moex_status st = moex_tokenizer_load(dir, &t);
    snprintf(msg, n, "%s", st ? moex_last_error() : "");
    if (st == MOEX_OK) assert_non_null(t);
    else assert_null(t);
    moex_tokenizer_free(t);
    unlink(path);
    rmdir(dir);
    return st;
}

#define MINI_VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

static void test_malformed_files(void **state) {
    (void)state;
    if (!have_tokenizer()) skip();
    static const struct {
        const char *json, *needle;
        moex_status want;
    } CASES[] = {
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [\"a b\"]", "not valid JSON", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"WordPiece\", " MINI_VOCAB "}}", "model.type = WordPiece", MOEX_ERR_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [\"a c\"]}}", "model.merges[0]", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [\"a  b\"]}}", "model.merges[0]", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [7]}}", "model.merges[0]", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", "model.vocab", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", "two different tokens",
         MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
         "\"pattern\": {\"Regex\": \"(unclosed\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
         "pre_tokenizer.pattern.Regex: PCRE2 rejects", MOEX_ERR_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
         "\"pretokenizers\": [{\"type\": \"Whitespace\"}]}}", "pre_tokenizer.pretokenizers[0].type = Whitespace",
         MOEX_ERR_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"normalizer\": {\"type\": \"NFKC\"}}",
         "normalizer.type = NFKC", MOEX_ERR_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"added_tokens\": [{\"id\": 3, \"content\": "
         "\"<x>\", \"single_word\": true}]}", "added_tokens[0].single_word", MOEX_ERR_UNSUPPORTED},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [], \"unk_token\": \"<unk>\"}}", "model.unk_token",
         MOEX_ERR_FORMAT},
        {"[1, 2]", "(the top level)", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1000000000}, \"merges\": []}}", "more than 2^20 ids unused",
         MOEX_ERR_FORMAT},
        /* refused after their pattern was read: what they allocated is freed (LeakSanitizer) */
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"decoder\": {\"type\": \"Replace\", "
         "\"pattern\": {\"String\": \"\"}, \"content\": \"x\"}}", "decoder.pattern.String: an empty pattern", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"normalizer\": {\"type\": \"Sequence\", "
         "\"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\"}, \"content\": \"x\"}]}}",
         "normalizer.normalizers[0].pattern.String", MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", "
         "\"pattern\": {\"String\": \"\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
         "pre_tokenizer.pattern.String: an empty pattern", MOEX_ERR_FORMAT},
        /* a template's special token whose id is a gap of a sparse vocabulary (found by fuzz_tokenizer) */
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": []}, \"added_tokens\": [{\"id\": 4, "
         "\"content\": \"<s>\", \"special\": true}], \"post_processor\": {\"type\": \"TemplateProcessing\", "
         "\"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}], \"special_tokens\": "
         "{\"<s>\": {\"id\": \"<s>\", \"ids\": [3]}}}}", "ids: id 3, which no token of the vocabulary has",
         MOEX_ERR_FORMAT},
        {"{\"model\": {\"type\": \"BPE\", " MINI_VOCAB ", \"merges\": [[\"a\", \"b\"]]}}", "", MOEX_OK},
    };
    for (size_t i = 0; i < sizeof CASES / sizeof CASES[0]; i++) {
        char msg[512];
        const moex_status st = load_text(CASES[i].json, msg, sizeof msg);
        if (st != CASES[i].want || !strstr(msg, CASES[i].needle))
            fprintf(stderr, "case %zu: status %d, message: %s\n", i, (int)st, msg);
        assert_int_equal(st, CASES[i].want);
        assert_non_null(strstr(msg, CASES[i].needle));
    }
    moex_tokenizer *t = NULL;
    assert_int_equal(moex_tokenizer_load(DIR "/no-such-dir", &t), MOEX_ERR_IO);
    assert_int_equal(moex_tokenizer_load(NULL, &t), MOEX_ERR_INVALID_ARGUMENT);
}

static void test_without_tokenizer(void **state) {
    (void)state;
    if (have_tokenizer()) skip();
    moex_tokenizer *t = NULL;
    assert_int_equal(moex_tokenizer_load(DIR "/bytelevel-gpt2", &t), MOEX_ERR_UNSUPPORTED);
    assert_non_null(strstr(moex_last_error(), "no tokenizer"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_match_tokenizers),
        cmocka_unit_test(test_bytelevel_round_trip),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_decoder_chains),
        cmocka_unit_test(test_malformed_files),
        cmocka_unit_test(test_without_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
