/* tokenizer_internal.h — the parts of a loaded tokenizer.json (moex/tokenizer.h) as the
 * loader (tokenizer_load.c), the encoder (tokenizer_encode.c) and the decoder
 * (tokenizer_decode.c) share them. */
#ifndef MOEX_TEXT_TOKENIZER_INTERNAL_H
#define MOEX_TEXT_TOKENIZER_INTERNAL_H

#include "core/internal.h"
#include "moex/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* A growable byte string. */
typedef struct tk_buf {
    char *p;
    size_t n, cap;
} tk_buf;

int tk_buf_put(tk_buf *b, const void *s, size_t n); /* 0 on out of memory */
int tk_buf_putc(tk_buf *b, char c);

/* Growable ids. */
typedef struct tk_ids {
    int32_t *p;
    int64_t n, cap;
} tk_ids;

int tk_ids_put(tk_ids *v, int32_t id);

/* Open-addressing map from byte strings to token ids: slots hold ids (-1: empty); the keys
 * are the tokenizer's token strings. */
typedef struct tk_strmap {
    int32_t *slot;
    uint32_t mask;
} tk_strmap;

uint64_t tk_hash(const void *s, size_t n);

/* A merge: (left, right) -> its rank and the merged token. */
typedef struct tk_merge {
    uint64_t key; /* (left << 32) | right, or UINT64_MAX: empty */
    int32_t rank, id;
} tk_merge;

typedef enum tk_norm_kind { TK_NFC, TK_PREPEND, TK_REPLACE } tk_norm_kind;
typedef struct tk_norm {
    tk_norm_kind kind;
    char *a, *b; /* PREPEND: a; REPLACE: pattern a -> content b */
} tk_norm;

typedef enum tk_pre_kind { TK_BYTELEVEL, TK_SPLIT, TK_METASPACE } tk_pre_kind;
typedef enum tk_split_behavior {
    TK_ISOLATED, TK_REMOVED, TK_MERGED_WITH_PREVIOUS, TK_MERGED_WITH_NEXT, TK_CONTIGUOUS
} tk_split_behavior;
typedef struct tk_pre {
    tk_pre_kind kind;
    int add_prefix_space, use_regex;      /* BYTELEVEL */
    pcre2_code *re;                       /* SPLIT (regex) and BYTELEVEL with use_regex */
    char *literal;                        /* SPLIT with a string pattern */
    tk_split_behavior behavior;           /* SPLIT */
    int invert;                           /* SPLIT: the matches are the pieces, the rest the delimiters */
    char replacement[8];                  /* METASPACE: its character (UTF-8) */
    int prepend;                          /* METASPACE: 0 never, 1 first, 2 always */
    int split;                            /* METASPACE */
} tk_pre;

typedef enum tk_dec_kind { TK_D_BYTELEVEL, TK_D_BYTEFALLBACK, TK_D_FUSE, TK_D_STRIP, TK_D_METASPACE, TK_D_REPLACE } tk_dec_kind;
typedef struct tk_dec {
    tk_dec_kind kind;
    char content[8];   /* STRIP: the character; METASPACE: the replacement */
    int start, stop;   /* STRIP */
    int prepend;       /* METASPACE: 0 never (keep a leading space) */
    char *a, *b;       /* REPLACE */
} tk_dec;

typedef struct tk_added {
    int32_t id;
    char *content;
    size_t len;
    int special, lstrip, rstrip;
} tk_added;

#define TK_MAX_STEPS 16

struct moex_tokenizer {
    /* the vocabulary: token id -> its string (NULL: no such id); string -> id */
    char **tok;
    uint32_t *tok_len;
    int64_t n_tok;
    tk_strmap map;
    /* BPE */
    tk_merge *merges;
    uint32_t merge_mask;
    int byte_fallback, ignore_merges, fuse_unk;
    int32_t unk_id;         /* -1: none */
    int32_t byte_tok[256];  /* byte_fallback: the id of <0xXX>, -1 when absent */
    /* the steps */
    tk_norm norm[TK_MAX_STEPS];
    int n_norm;
    tk_pre pre[TK_MAX_STEPS];
    int n_pre;
    tk_dec dec[TK_MAX_STEPS];
    int n_dec;
    int stream_whole; /* a Strip with stop after a Fuse: a stream decodes all its ids each time */
    int byte_level; /* a ByteLevel pre-tokenizer: pieces are mapped to the byte alphabet */
    /* the byte alphabet (GPT-2's): byte b -> its character's UTF-8 (byte_len[b] bytes), and the
     * byte a character of code point cp < 324 stands for (-1: none) */
    char byte_utf8[256][2];
    uint8_t byte_len[256];
    int16_t cp_byte[324];
    /* added tokens, and the post-processor's template for a single sequence: ids, with -2
     * standing for the sequence (none: the sequence alone) */
    tk_added *added;
    int n_added;
    uint8_t *special; /* [n_tok] 1: special added token */
    uint8_t added_first[256]; /* 1: an added token starts with this byte */
    int32_t tmpl[32];
    int n_tmpl;
    char path[600];
};


/* UTF-8: the length of the character starting with lead byte c (1 for an invalid lead). */
int tk_utf8_len(uint8_t c);
/* The code point of the valid character at s (n bytes available), its length in *len, or
 * -1 (and *len 1) for an invalid one. */
int32_t tk_utf8_decode(const uint8_t *s, size_t n, int *len);

/* Token id of a string, or -1. */
int32_t tk_lookup(const moex_tokenizer *t, const char *s, size_t n);

/* The raw bytes of ids[0 .. n) through the decoders (no UTF-8 repair) into out. used (NULL for a
 * whole decode, else TK_MAX_STEPS counters, updated): how much of each decoder's effect on the
 * sequence's first token the ids before these (earlier windows of a stream) used up, so that a
 * window gives what the whole decode gives there (tokenizer_decode.c, step). */
moex_status tk_decode_raw(const moex_tokenizer *t, const int32_t *ids, int64_t n, int skip_special, int *used,
                          tk_buf *out);
/* out = in with every invalid UTF-8 sequence replaced by U+FFFD. */
int tk_utf8_repair(const char *in, size_t n, tk_buf *out);

#endif
