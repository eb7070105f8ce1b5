/* moex/tokenizer.h — Hugging Face tokenizer.json in C: text to token ids and back.
 * Included by moex.h; see docs/models.md "Text in, text out" for what is supported.
 */
#ifndef MOEX_TOKENIZER_H
#define MOEX_TOKENIZER_H

#include "moex/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A loaded tokenizer (opaque; read-only once loaded, so threads may share it). */
typedef struct moex_tokenizer moex_tokenizer;

/**
 * Load `path`: a tokenizer.json file, or a directory holding one. Supported: model BPE
 * (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback, unk_token, ignore_merges),
 * normalizers NFC, Prepend, Replace (string patterns) and Sequence, pre-tokenizers ByteLevel,
 * Split (a regex through PCRE2 in UTF and Unicode-property mode, or a string; every behaviour,
 * invert), Metaspace and Sequence, decoders ByteLevel, ByteFallback, Fuse,
 * Strip, Metaspace, Replace and Sequence, post-processors ByteLevel and TemplateProcessing,
 * added tokens (special, lstrip, rstrip). Anything else the file asks for fails the load
 * with MOEX_ERR_UNSUPPORTED naming the key and value; a malformed file fails with
 * MOEX_ERR_FORMAT naming the key. A build without PCRE2 and utf8proc has no tokenizer:
 * MOEX_ERR_UNSUPPORTED.
 */
moex_status moex_tokenizer_load(const char *path, moex_tokenizer **out);

/** Free a tokenizer. NULL is a no-op. */
void moex_tokenizer_free(moex_tokenizer *t);

/** One more than the largest token id (vocabulary and added tokens). */
int64_t moex_tokenizer_vocab_size(const moex_tokenizer *t);

/** The vocabulary string of token `id` as stored (e.g. "Ġthe"), or NULL for an unused id. */
const char *moex_tokenizer_token(const moex_tokenizer *t, int32_t id);

/** 1 if `id` is an added token marked special. */
int moex_tokenizer_is_special(const moex_tokenizer *t, int32_t id);

/**
 * Token ids of text[0 .. len) (UTF-8; invalid bytes are encoded as they are by byte-level
 * models). Added tokens in the text are matched first. add_special = 1 applies the
 * post-processor's template (e.g. a beginning-of-sequence token). *ids (malloc'd, free with
 * moex_tokenizer_buffer_free) holds *n ids.
 */
moex_status moex_tokenizer_encode(const moex_tokenizer *t, const char *text, size_t len, int add_special,
                                  int32_t **ids, int64_t *n);

/**
 * The text of ids[0 .. n): the decoders applied to the tokens' strings; skip_special drops
 * special added tokens. *text (malloc'd, NUL-terminated, free with
 * moex_tokenizer_buffer_free) holds *len bytes; bytes that do not form UTF-8 become U+FFFD.
 */
moex_status moex_tokenizer_decode(const moex_tokenizer *t, const int32_t *ids, int64_t n, int skip_special,
                                  char **text, size_t *len);

/** Free a buffer returned by moex_tokenizer_encode or moex_tokenizer_decode. */
void moex_tokenizer_buffer_free(void *p);

/**
 * Incremental decoding for streaming: push ids one at a time and get the text they
 * complete. A token that ends inside a multi-byte character gives nothing until the
 * character is complete; the text of the tokens pushed so far is the concatenation of
 * every piece returned (equal to moex_tokenizer_decode of all of them).
 */
typedef struct moex_detok_stream moex_detok_stream;

moex_status moex_detok_stream_new(const moex_tokenizer *t, int skip_special, moex_detok_stream **out);
/** The new text after `id`: *text (valid until the next call on s) holds *len bytes, maybe 0. */
moex_status moex_detok_stream_push(moex_detok_stream *s, int32_t id, const char **text, size_t *len);
/** The text still held (an incomplete character at the end, as U+FFFD). */
moex_status moex_detok_stream_finish(moex_detok_stream *s, const char **text, size_t *len);
void moex_detok_stream_free(moex_detok_stream *s);

#ifdef __cplusplus
}
#endif

#endif
