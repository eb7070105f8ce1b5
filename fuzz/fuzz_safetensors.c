/*
 * fuzz_safetensors.c — libFuzzer target for moex_safetensors_parse().
 *
 * Each input is parsed twice: as a whole file image, and as a bare JSON
 * header wrapped in a valid length prefix with a 64-byte data section (so
 * that mutations of the header are not lost to a wrong length). A file that
 * parses must satisfy the parser's promises: every tensor inside the data
 * section, sizes consistent; the bytes of every tensor are read so that the
 * sanitizers see any bad range.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

/* Parse buf[0..size) and check what a successful parse promises. */
static void st_check(const uint8_t *buf, size_t size) {
    moex_st_file f;
    if (moex_safetensors_parse(buf, size, "fuzz", &f) != MOEX_OK) return;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < f.n_tensors; i++) {
        const moex_st_tensor *t = &f.tensors[i];
        if (t->offset < f.data_start || t->offset > size || t->nbytes > size - t->offset) abort();
        if (t->ndim < 0 || t->ndim > MOEX_ST_MAX_DIMS || !t->name) abort();
        uint64_t n = moex_st_dtype_size(t->dtype);
        for (int k = 0; k < t->ndim; k++) n *= (uint64_t)t->shape[k];
        if (n != t->nbytes) abort();
        if (t->nbytes) sink ^= buf[t->offset] ^ buf[t->offset + t->nbytes - 1];
    }
    for (size_t i = 0; i < f.n_metadata; i++)
        if (!f.metadata[2 * i] || !f.metadata[2 * i + 1]) abort();
    (void)sink;
    moex_st_file_free(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* libFuzzer entry point. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    st_check(data, size);
    uint8_t *img = malloc(8 + size + 64);
    if (!img) return 0;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)size >> (8 * i));
    memcpy(img + 8, data, size);
    memset(img + 8 + size, 0, 64);
    st_check(img, 8 + size + 64);
    free(img);
    return 0;
}
