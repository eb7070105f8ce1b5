/*
 * fuzz_config.c — libFuzzer target for moex_config_parse() and
 * moex_config_apply_generation().
 *
 * A config that parses must satisfy what config.h promises (counts within
 * their arrays, strings terminated, cross-checks held); the same input is
 * then applied as a generation_config.json to it, and on its own to a
 * default config.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/config.h"

/* Abort unless s is a NUL-terminated string within n bytes. */
static void cfg_terminated(const char *s, size_t n) {
    if (!memchr(s, 0, n)) abort();
}

/* Check the invariants of a parsed config. */
static void cfg_check(const moex_config *c) {
    if (c->n_sub_configs < 0 || c->n_sub_configs > MOEX_CONFIG_MAX_SUB) abort();
    if (c->n_eos < 0 || c->n_eos > MOEX_CONFIG_MAX_EOS) abort();
    if (c->rope.n_mrope_section < 0 || c->rope.n_mrope_section > MOEX_CONFIG_MAX_MROPE) abort();
    if (c->hidden_size < 1 || c->vocab_size < 1 || c->num_hidden_layers < 1 || c->num_attention_heads < 1) abort();
    if (c->num_key_value_heads < 1 || c->num_attention_heads % c->num_key_value_heads) abort();
    if (c->head_dim < 1 || c->decoder_sparse_step < 1) abort();
    if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts) abort();
    for (int i = 0; i < c->n_mlp_only_layers; i++)
        if (c->mlp_only_layers[i] < 0 || c->mlp_only_layers[i] >= c->num_hidden_layers) abort();
    for (int i = 0; i < c->n_modules_to_not_convert; i++) (void)strlen(c->modules_to_not_convert[i]);
    for (int i = 0; i < c->n_sub_configs; i++) cfg_terminated(c->sub_configs[i], sizeof c->sub_configs[i]);
    cfg_terminated(c->model_type, sizeof c->model_type);
    cfg_terminated(c->hidden_act, sizeof c->hidden_act);
    cfg_terminated(c->rope.type, sizeof c->rope.type);
    cfg_terminated(c->quant_method, sizeof c->quant_method);
    if (!(c->rms_norm_eps > 0) || !(c->rope.theta > 0)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data;
    moex_config c;
    if (moex_config_parse(json, size, &c) == MOEX_OK) {
        cfg_check(&c);
        moex_config before = c;
        if (moex_config_apply_generation(json, size, &c) != MOEX_OK && memcmp(&before, &c, sizeof c) != 0) abort();
        cfg_check(&c);
        moex_config_free(&c);
    } else {
        memset(&c, 0, sizeof c);
        c.bos_token_id = c.pad_token_id = -1;
        moex_config before = c;
        if (moex_config_apply_generation(json, size, &c) != MOEX_OK && memcmp(&before, &c, sizeof c) != 0) abort();
        if (c.n_eos < 0 || c.n_eos > MOEX_CONFIG_MAX_EOS) abort();
    }
    return 0;
}
