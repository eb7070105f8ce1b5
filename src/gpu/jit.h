/* jit.h — GPU kernels compiled at run time with NVRTC and kept in a cache on disk.
 *
 * A kernel specialised for one shape (sizes, tiles, format as constants of its source) is
 * compiled the first time a forward needs it, for the GPU's architecture, into a CUBIN. The
 * CUBIN is written to the cache directory under a name derived from everything that decides its
 * bytes (moex's version, NVRTC's version, the architecture, the options and the source), so a
 * later process finds it there instead of compiling again. A cache entry is never trusted: it is
 * used only if its header names exactly the key asked for, its length and checksum match and it
 * is a CUDA ELF image; anything else (a truncated, corrupt, stale or foreign file) is rebuilt and
 * replaced. A cache that cannot be written costs the compile only, not an error.
 *
 * NVRTC is loaded when first needed (dlopen), so the library runs without it: only the kernels
 * compiled at run time need it, and a missing NVRTC is a clear error naming what works without.
 * Host code only; no GPU is needed to compile. Loading the image onto a device is the caller's.
 */
#ifndef MOEX_GPU_JIT_H
#define MOEX_GPU_JIT_H

#include "core/internal.h"
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What to compile. */
typedef struct moex_jit_source {
    const char *name;                /* [A-Za-z0-9_-]+, at most 64 characters: messages and the entry's file name */
    const char *text;                /* CUDA C++ source (NUL-terminated) */
    const char *const *options;      /* NVRTC options besides the architecture (may be NULL if n_options is 0) */
    int n_options;
    int cc;                          /* compute capability x 10, e.g. 90 */
    int arch_specific;               /* 1: the architecture-specific target (sm_90a: wgmma, setmaxnreg) */
    const char *const *header_names; /* headers given to NVRTC in memory: #include "name" finds text */
    const char *const *header_texts;
    int n_headers;
} moex_jit_source;

/* A compiled kernel image. */
typedef struct moex_jit_image {
    void *data;           /* the CUBIN, malloc'd (moex_jit_image_free) */
    size_t size;
    int from_cache;       /* 1: read from the cache; 0: compiled by this call */
    double compile_ms;    /* the compile's wall time (0 when from the cache) */
    char path[4096];      /* the cache entry read or written, or "" when the cache was not used */
    char note[256];       /* why an entry was not used or not written, or "" */
    char *log;            /* NVRTC's log of a compile that printed one (e.g. with --ptxas-options=-v), malloc'd; else NULL */
} moex_jit_image;

/* The image of src: from the cache directory if a valid entry is there, else compiled with NVRTC
 * and written there. cache_dir NULL: moex_jit_cache_dir's default; "": no cache. On failure *out holds no data
 * and the message names the source, the architecture and NVRTC's log (compile errors),
 * or NVRTC and the backends that need none (NVRTC not loadable). */
moex_status moex_jit_build(const moex_jit_source *src, const char *cache_dir, moex_jit_image *out);
/* The same, compiling whatever the cache holds and replacing its entry (an image that passed
 * the checks but did not load on the device). */
moex_status moex_jit_rebuild(const moex_jit_source *src, const char *cache_dir, moex_jit_image *out);
void moex_jit_image_free(moex_jit_image *img);

/* The cache directory: $MOEX_CACHE_DIR/jit if set, else $XDG_CACHE_HOME/moex/jit, else
 * $HOME/.cache/moex/jit. 0 and "" if none of them is set (the cache is then not used). */
int moex_jit_cache_dir(char *buf, size_t n);

/* 1 if NVRTC can be loaded (its version in *major, *minor), else 0 and the reason in why. The
 * library is $MOEX_NVRTC_LIBRARY if set, else libnvrtc.so.13, .so.12 or .so. */
int moex_jit_nvrtc_available(int *major, int *minor, char *why, size_t n);

/* Whether buf[0..n) is a valid cache entry for key (the text moex_jit_build derives from a
 * source): NULL and the image's place in buf if so, else why not. Reads nothing outside buf. */
const char *moex_jit_entry_check(const void *buf, size_t n, const char *key, size_t *image_off, size_t *image_size);

/* FNV-1a 64 of n bytes continued from h (start: MOEX_FNV64_START). */
#define MOEX_FNV64_START 0xcbf29ce484222325ull
uint64_t moex_fnv64(uint64_t h, const void *p, size_t n);

#ifdef __cplusplus
}
#endif

#endif
