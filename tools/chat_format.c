/* chat_format.c — the chat formats of `moex generate --chat`, written per family: one user
 * turn and the opening of the assistant's turn (no system prompt), as the families' own chat
 * templates render a single user message with add_generation_prompt. */
#include "chat_format.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct chat_format {
    const char *family, *before, *after;
} chat_format;

static const chat_format FORMATS[] = {
    {"qwen2_moe", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"},       /* ChatML */
    {"qwen3_moe", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3_vl_moe", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"},
    {"mixtral", "[INST] ", " [/INST]"},                                                   /* <s> from the tokenizer's template */
    {"deepseek_v3", "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>",
     "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"},
    {"gpt_oss", "<|start|>user<|message|>", "<|end|><|start|>assistant"},                /* harmony */
};

char *chat_wrap(const char *model_type, const char *text, const char **why) {
    for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++) {
        const chat_format *f = &FORMATS[i];
        if (strcmp(f->family, model_type)) continue;
        const size_t n = strlen(f->before) + strlen(text) + strlen(f->after) + 1;
        char *s = malloc(n);
        if (!s) {
            *why = "out of memory";
            return NULL;
        }
        snprintf(s, n, "%s%s%s", f->before, text, f->after);
        return s;
    }
    *why = "no chat format is written for this family (moex has them for qwen2_moe, qwen3_moe, qwen3_vl_moe, "
           "mixtral, deepseek_v3 and gpt_oss); give the formatted prompt with --prompt";
    return NULL;
}

int chat_model_type(const char *dir, char *out, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "moex generate: --chat: cannot read %s\n", path);
        return 1;
    }
    char *buf = malloc(1 << 20);
    size_t len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return 1;
    buf[len] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    int rc = !cJSON_IsString(t);
    if (rc) fprintf(stderr, "moex generate: --chat: %s has no model_type\n", path);
    else snprintf(out, n, "%s", t->valuestring);
    cJSON_Delete(j);
    return rc;
}
