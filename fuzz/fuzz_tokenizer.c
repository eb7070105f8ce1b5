/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer (moex/tokenizer.h): its loader and its
 * encoder and decoder.
 *
 * The first byte of an input is a control byte, the rest is the data:
 *   bit 0 = 0: the data up to its first NUL is a tokenizer.json (written to a temporary file and
 *              loaded), the rest the text to encode with it;
 *   bit 0 = 1: the data is text for one of the committed fixtures (tests/fixtures/tokenizers,
 *              chosen by bits 2-4);
 *   bit 1:     add the post-processor's special tokens.
 * A tokenizer that loads must encode any bytes; the ids must lie in its vocabulary, decode,
 * and stream-decode (one id at a time) to the same text. A file that does not load must say
 * why. Anything else aborts.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moex.h"

#ifndef MOEX_FIXTURES
#define MOEX_FIXTURES "tests/fixtures"
#endif

static const char *const TOK_FIXTURES[] = {"bytelevel-qwen", "bytelevel-gpt2", "bytelevel-llama3", "spm-llama2",
                                           "spm-mistral"};

/* The fixture tokenizers, loaded once (NULL where this build has no tokenizer). */
static moex_tokenizer *tok_fixture(int i) {
    static moex_tokenizer *t[5];
    static int tried[5];
    if (!tried[i]) {
        char path[512];
        const char *env = getenv("MOEX_FIXTURES");
        snprintf(path, sizeof path, "%s/tokenizers/%s", env && *env ? env : MOEX_FIXTURES, TOK_FIXTURES[i]);
        tried[i] = 1;
        if (moex_tokenizer_load(path, &t[i]) != MOEX_OK) t[i] = NULL;
    }
    return t[i];
}

/* One directory for the loaded files, made once and removed at exit. */
static char tok_dir[64];
static void tok_rmdir(void) { rmdir(tok_dir); }
static const char *tok_tmpdir(void) {
    if (!tok_dir[0]) {
        snprintf(tok_dir, sizeof tok_dir, "/tmp/moex-fuzz-tok-XXXXXX");
        if (!mkdtemp(tok_dir)) abort();
        atexit(tok_rmdir);
    }
    return tok_dir;
}

static void tok_check(const moex_tokenizer *t, const uint8_t *text, size_t n, int special) {
    int32_t *ids = NULL;
    int64_t k = 0;
    const moex_status st = moex_tokenizer_encode(t, (const char *)text, n, special, &ids, &k);
    if (st != MOEX_OK) {
        /* only a character outside a vocabulary without unk_token or byte fallback may fail */
        if (st != MOEX_ERR_INVALID_ARGUMENT || !moex_last_error()[0]) abort();
        return;
    }
    const int64_t V = moex_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < k; i++)
        if (ids[i] < 0 || ids[i] >= V || !moex_tokenizer_token(t, ids[i])) abort();
    char *dec = NULL;
    size_t len = 0;
    if (moex_tokenizer_decode(t, ids, k, 0, &dec, &len) != MOEX_OK || strlen(dec) > len) abort();
    moex_detok_stream *s = NULL;
    if (moex_detok_stream_new(t, 0, &s) != MOEX_OK) abort();
    char *all = malloc(len + 1);
    size_t at = 0;
    for (int64_t i = 0; i <= k && all; i++) {
        const char *p;
        size_t m;
        if ((i < k ? moex_detok_stream_push(s, ids[i], &p, &m) : moex_detok_stream_finish(s, &p, &m)) != MOEX_OK) abort();
        if (at + m > len || memcmp(dec + at, p, m)) abort(); /* the pieces add up to the decode */
        at += m;
    }
    if (all && at != len) abort();
    free(all);
    moex_detok_stream_free(s);
    moex_tokenizer_buffer_free(dec);
    moex_tokenizer_buffer_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t ctl = data[0];
    data++, size--;
    const int special = (ctl >> 1) & 1;
    if (ctl & 1) {
        const moex_tokenizer *t = tok_fixture(((ctl >> 2) & 7) % 5);
        if (t) tok_check(t, data, size, special);
        return 0;
    }
    const uint8_t *nul = memchr(data, 0, size);
    const size_t json_len = nul ? (size_t)(nul - data) : size;
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_tmpdir());
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (json_len && fwrite(data, 1, json_len, f) != json_len) abort();
    fclose(f);
    moex_tokenizer *t = NULL;
    const moex_status st = moex_tokenizer_load(path, &t);
    unlink(path);
    if (st != MOEX_OK) {
        if (t || !moex_last_error()[0]) abort(); /* a refusal leaves nothing and says why */
        return 0;
    }
    if (nul) tok_check(t, nul + 1, size - json_len - 1, special);
    moex_tokenizer_free(t);
    return 0;
}
