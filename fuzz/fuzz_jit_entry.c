/*
 * fuzz_jit_entry.c — libFuzzer target for moex_jit_entry_check(), the check of a cache entry of
 * the run-time compiled kernels (src/gpu/jit.c) before its image is used.
 *
 * Each input is checked against a fixed key and against the key its own header claims (so that
 * the checks after the key's are reached). An accepted entry must hold exactly its key and an
 * image that lies inside the input, is at least an ELF header long and starts with the ELF magic.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/jit.h"

static const char JIT_FIXED_KEY[] = "moex fuzz key\narch sm_90a\n";

static void jit_entry_try(const uint8_t *data, size_t size, const char *key) {
    size_t off = 0, n = 0;
    if (moex_jit_entry_check(data, size, key, &off, &n) != NULL) return;
    if (off != 32 + strlen(key) || n < 64 || off + n != size) abort();
    if (data[off] != 0x7f || memcmp(data + off + 1, "ELF", 3) != 0) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    jit_entry_try(data, size, JIT_FIXED_KEY);
    if (size >= 32) { /* the key the header's length claims, taken from the input itself */
        uint32_t len;
        memcpy(&len, data + 8, 4);
        if (len <= size - 32 && len < 4096) {
            char key[4096];
            memcpy(key, data + 32, len);
            key[len] = 0;
            if (strlen(key) == len) jit_entry_try(data, size, key);
        }
    }
    return 0;
}
