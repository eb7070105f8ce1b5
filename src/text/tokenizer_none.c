/* tokenizer_none.c — the tokenizer API in a build without PCRE2 and utf8proc (CMakeLists.txt
 * compiles this file instead of the others of src/text): every call says so. */
#include "core/internal.h"
#include "moex/tokenizer.h"
#include <stdlib.h>

static moex_status none(const char *fn) {
    return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: this build of moex has no tokenizer (PCRE2 and utf8proc were not found "
                     "when it was built: apt-get install libpcre2-dev libutf8proc-dev, then rebuild)", fn);
}

moex_status moex_tokenizer_load(const char *path, moex_tokenizer **out) {
    (void)path;
    if (out) *out = NULL;
    return none("moex_tokenizer_load");
}
void moex_tokenizer_free(moex_tokenizer *t) { (void)t; }
int64_t moex_tokenizer_vocab_size(const moex_tokenizer *t) { return (void)t, 0; }
const char *moex_tokenizer_token(const moex_tokenizer *t, int32_t id) { return (void)t, (void)id, NULL; }
int moex_tokenizer_is_special(const moex_tokenizer *t, int32_t id) { return (void)t, (void)id, 0; }
moex_status moex_tokenizer_encode(const moex_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, int64_t *n) {
    (void)t, (void)text, (void)len, (void)add_special, (void)ids, (void)n;
    return none("moex_tokenizer_encode");
}
moex_status moex_tokenizer_decode(const moex_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                                  char **text, size_t *len) {
    (void)t, (void)ids, (void)n, (void)skip_special, (void)text, (void)len;
    return none("moex_tokenizer_decode");
}
void moex_tokenizer_buffer_free(void *p) { free(p); }
moex_status moex_detok_stream_new(const moex_tokenizer *t, int skip_special, moex_detok_stream **out) {
    (void)t, (void)skip_special;
    if (out) *out = NULL;
    return none("moex_detok_stream_new");
}
moex_status moex_detok_stream_push(moex_detok_stream *s, int32_t id, const char **text, size_t *len) {
    (void)s, (void)id, (void)text, (void)len;
    return none("moex_detok_stream_push");
}
moex_status moex_detok_stream_finish(moex_detok_stream *s, const char **text, size_t *len) {
    (void)s, (void)text, (void)len;
    return none("moex_detok_stream_finish");
}
void moex_detok_stream_free(moex_detok_stream *s) { (void)s; }
