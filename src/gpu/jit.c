/* jit.c — NVRTC compiles and the on-disk cache of their images (see jit.h). */
#include "gpu/jit.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t moex_fnv64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- NVRTC, loaded on first use ------------------------------------------------------------ */

/* The few entry points used, with NVRTC's signatures (nvrtcResult is an int enum, 0 = success;
 * nvrtcProgram a pointer). */
typedef struct nvrtc_api {
    int (*version)(int *, int *);
    const char *(*error_string)(int);
    int (*create)(void **, const char *, const char *, int, const char *const *, const char *const *);
    int (*destroy)(void **);
    int (*compile)(void *, int, const char *const *);
    int (*log_size)(void *, size_t *);
    int (*log)(void *, char *);
    int (*cubin_size)(void *, size_t *);
    int (*cubin)(void *, char *);
    int major, minor;
} nvrtc_api;

static pthread_mutex_t nvrtc_lock = PTHREAD_MUTEX_INITIALIZER;
static nvrtc_api nvrtc;
static int nvrtc_loaded;

/* Load NVRTC into nvrtc (once it worked, for good); 0 and why on failure (retried next call). */
static int load_nvrtc(char *why, size_t n) {
    pthread_mutex_lock(&nvrtc_lock);
    if (nvrtc_loaded) {
        pthread_mutex_unlock(&nvrtc_lock);
        return 1;
    }
    const char *forced = getenv("MOEX_NVRTC_LIBRARY");
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    void *lib = NULL;
    char err[512] = "";
    if (forced && *forced) {
        lib = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!lib) snprintf(err, sizeof err, "%s (MOEX_NVRTC_LIBRARY): %s", forced, dlerror());
    } else {
        for (int i = 0; i < 3 && !lib; i++) {
            lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
            if (!lib && i == 0) snprintf(err, sizeof err, "%s", dlerror());
        }
    }
    nvrtc_api a;
    memset(&a, 0, sizeof a);
    if (lib) {
        /* through a void * object: ISO C has no conversion between object and function pointers */
#define SYM(field, name)                                                                                             \
    do {                                                                                                             \
        void *s_ = dlsym(lib, name);                                                                                 \
        memcpy(&a.field, &s_, sizeof s_);                                                                           \
        if (!s_ && !*err) snprintf(err, sizeof err, "the library has no %s", name);                                 \
    } while (0)
        SYM(version, "nvrtcVersion");
        SYM(error_string, "nvrtcGetErrorString");
        SYM(create, "nvrtcCreateProgram");
        SYM(destroy, "nvrtcDestroyProgram");
        SYM(compile, "nvrtcCompileProgram");
        SYM(log_size, "nvrtcGetProgramLogSize");
        SYM(log, "nvrtcGetProgramLog");
        SYM(cubin_size, "nvrtcGetCUBINSize");
        SYM(cubin, "nvrtcGetCUBIN");
#undef SYM
        if (!*err && a.version(&a.major, &a.minor) != 0) snprintf(err, sizeof err, "nvrtcVersion failed");
    }
    if (!lib || *err) {
        if (lib) dlclose(lib);
        pthread_mutex_unlock(&nvrtc_lock);
        snprintf(why, n, "NVRTC, the CUDA runtime compiler (libnvrtc), cannot be loaded: %s. The kernels compiled at "
                 "run time (deepgemm) need it: install the CUDA toolkit's NVRTC, or use grouped_mm or batched_mm, "
                 "which need no NVRTC", err);
        return 0;
    }
    nvrtc = a; /* the library stays loaded for the process */
    nvrtc_loaded = 1;
    pthread_mutex_unlock(&nvrtc_lock);
    return 1;
}

int moex_jit_nvrtc_available(int *major, int *minor, char *why, size_t n) {
    char tmp[1];
    if (!load_nvrtc(why ? why : tmp, why ? n : sizeof tmp)) return 0;
    if (major) *major = nvrtc.major;
    if (minor) *minor = nvrtc.minor;
    return 1;
}

/* ---- the cache ---------------------------------------------------------------------------- */

int moex_jit_cache_dir(char *buf, size_t n) {
    const char *own = getenv("MOEX_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int w = -1;
    if (own && *own)
        w = snprintf(buf, n, "%s/jit", own);
    else if (xdg && *xdg)
        w = snprintf(buf, n, "%s/moex/jit", xdg);
    else if (home && *home)
        w = snprintf(buf, n, "%s/.cache/moex/jit", home);
    if (w < 0 || (size_t)w >= n) {
        if (n) buf[0] = 0;
        return 0;
    }
    return 1;
}

/* mkdir -p path (mode 0755); 0 and errno on failure. */
static int make_dirs(const char *path) {
    char p[4096];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof p) {
        errno = ENAMETOOLONG;
        return 0;
    }
    memcpy(p, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        const char c = p[i];
        p[i] = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return 0;
        p[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    if (!S_ISDIR(sb.st_mode)) {
        errno = ENOTDIR;
        return 0;
    }
    return 1;
}

/* An entry: ENTRY_MAGIC, the key's length, 0, the image's length and FNV-1a 64, then the key
 * text, then the image. */
#define ENTRY_MAGIC "MOEXJIT1"
typedef struct entry_header {
    char magic[8];
    uint32_t key_len, reserved;
    uint64_t image_size, image_fnv;
} entry_header;
#define ENTRY_MAX ((size_t)64 << 20) /* a kernel's CUBIN is well under a MiB: a larger file is not an entry */

/* 1 if p[0..n) is a 64-bit ELF image for CUDA (e_machine 190). */
static int is_cuda_elf(const unsigned char *p, size_t n) {
    if (n < 64 || p[0] != 0x7f || p[1] != 'E' || p[2] != 'L' || p[3] != 'F' || p[4] != 2) return 0;
    const unsigned machine = (unsigned)p[18] | (unsigned)p[19] << 8;
    return machine == 190;
}

const char *moex_jit_entry_check(const void *buf, size_t n, const char *key, size_t *image_off, size_t *image_size) {
    const unsigned char *p = (const unsigned char *)buf;
    const size_t key_len = strlen(key);
    entry_header h;
    if (n < sizeof h) return "truncated";
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, ENTRY_MAGIC, 8) != 0) return "not a moex cache entry";
    if (h.key_len != key_len || h.image_size == 0 || h.image_size > n || n - sizeof h - key_len != h.image_size)
        return key_len + sizeof h > n ? "truncated" : "its lengths do not match";
    if (memcmp(p + sizeof h, key, key_len) != 0) return "made for another key";
    const unsigned char *img = p + sizeof h + key_len;
    if (moex_fnv64(MOEX_FNV64_START, img, (size_t)h.image_size) != h.image_fnv) return "its checksum does not match";
    if (!is_cuda_elf(img, (size_t)h.image_size)) return "not a CUDA ELF image";
    *image_off = sizeof h + key_len;
    *image_size = (size_t)h.image_size;
    return NULL;
}

/* The image of the entry at path if it is valid for key, else 0 and why in note. */
static int read_entry(const char *path, const char *key, moex_jit_image *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno != ENOENT) snprintf(out->note, sizeof out->note, "cache entry unreadable (%s): rebuilt", strerror(errno));
        return 0;
    }
    struct stat sb;
    unsigned char *buf = NULL;
    const char *bad = NULL;
    size_t n = 0, off = 0, size = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) bad = "not a regular file";
    else if (sb.st_size <= 0 || (uint64_t)sb.st_size > ENTRY_MAX) bad = sb.st_size <= 0 ? "empty" : "too large";
    else if (!(buf = (unsigned char *)malloc(n = (size_t)sb.st_size))) bad = "out of memory reading it";
    else if (read(fd, buf, n) != (ssize_t)n) bad = "truncated";
    else bad = moex_jit_entry_check(buf, n, key, &off, &size);
    close(fd);
    if (bad) {
        free(buf);
        snprintf(out->note, sizeof out->note, "cache entry %s: rebuilt", bad);
        return 0;
    }
    memmove(buf, buf + off, size); /* the image alone, at the start of its buffer */
    out->data = buf;
    out->size = size;
    return 1;
}

/* Write the entry (a temporary file renamed into place, so readers see all or nothing); on
 * failure a note, not an error. */
static void write_entry(const char *dir, const char *path, const char *key, moex_jit_image *img) {
    if (!make_dirs(dir)) {
        snprintf(img->note, sizeof img->note, "cache directory %.180s unusable (%s): not cached", dir, strerror(errno));
        img->path[0] = 0;
        return;
    }
    char tmp[4200];
    static unsigned counter;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int ok = fd >= 0;
    if (ok) {
        entry_header h;
        memset(&h, 0, sizeof h);
        memcpy(h.magic, ENTRY_MAGIC, 8);
        h.key_len = (uint32_t)strlen(key);
        h.image_size = img->size;
        h.image_fnv = moex_fnv64(MOEX_FNV64_START, img->data, img->size);
        ok = write(fd, &h, sizeof h) == (ssize_t)sizeof h && write(fd, key, h.key_len) == (ssize_t)h.key_len &&
             write(fd, img->data, img->size) == (ssize_t)img->size;
        ok = close(fd) == 0 && ok;
    }
    const int e = errno;
    if (ok && rename(tmp, path) == 0) return;
    if (fd >= 0) unlink(tmp);
    snprintf(img->note, sizeof img->note, "cache entry not written (%s)", strerror(ok ? errno : e));
    img->path[0] = 0;
}

/* ---- compiling ---------------------------------------------------------------------------- */

static int name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++) {
        const char c = s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return n > 0 && n <= 64;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Compile with NVRTC into out->data. */
static moex_status compile(const moex_jit_source *src, const char *arch, moex_jit_image *out) {
    const int n_opt = src->n_options + 1;
    const char **opts = (const char **)malloc(sizeof *opts * (size_t)n_opt);
    if (!opts) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "jit: out of memory compiling %s", src->name);
    char arch_opt[48];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    opts[0] = arch_opt;
    for (int i = 0; i < src->n_options; i++) opts[i + 1] = src->options[i];
    void *prog = NULL;
    const double t0 = now_ms();
    int r = nvrtc.create(&prog, src->text, src->name, src->n_headers, src->header_texts, src->header_names);
    if (r != 0) {
        free(opts);
        return moex_fail(MOEX_ERR_INTERNAL, "jit: nvrtcCreateProgram for %s failed: %s", src->name, nvrtc.error_string(r));
    }
    r = nvrtc.compile(prog, n_opt, opts);
    free(opts);
    moex_status st = MOEX_OK;
    if (r != 0) {
        size_t ln = 0;
        char *log = NULL;
        if (nvrtc.log_size(prog, &ln) == 0 && ln > 0 && (log = (char *)malloc(ln + 1)) && nvrtc.log(prog, log) == 0)
            log[ln] = 0;
        st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: NVRTC %d.%d could not compile %s for %s (%s): %.1500s", nvrtc.major,
                       nvrtc.minor, src->name, arch, nvrtc.error_string(r), log ? log : "(no log)");
        free(log);
    } else {
        size_t n = 0;
        if (nvrtc.cubin_size(prog, &n) != 0 || n == 0)
            st = moex_fail(MOEX_ERR_INTERNAL, "jit: NVRTC gave no CUBIN for %s (%s)", src->name, arch);
        else if (!(out->data = malloc(n)))
            st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "jit: out of memory for the %zu-byte image of %s", n, src->name);
        else if (nvrtc.cubin(prog, (char *)out->data) != 0) {
            free(out->data);
            out->data = NULL;
            st = moex_fail(MOEX_ERR_INTERNAL, "jit: nvrtcGetCUBIN for %s failed", src->name);
        } else {
            out->size = n;
            size_t ln = 0;
            if (nvrtc.log_size(prog, &ln) == 0 && ln > 1 && (out->log = (char *)malloc(ln + 1))) {
                if (nvrtc.log(prog, out->log) == 0) {
                    out->log[ln] = 0;
                } else {
                    free(out->log);
                    out->log = NULL;
                }
            }
        }
    }
    nvrtc.destroy(&prog);
    out->compile_ms = now_ms() - t0;
    return st;
}

/* Append to the key k (capacity n, length *w); 0 if it did not fit. */
static int key_put(char *k, size_t n, size_t *w, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int key_put(char *k, size_t n, size_t *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int r = vsnprintf(k + *w, n - *w, fmt, ap);
    va_end(ap);
    if (r < 0 || (size_t)r >= n - *w) return 0;
    *w += (size_t)r;
    return 1;
}

/* The key: everything that decides the image's bytes (NULL: out of memory). */
static char *make_key(const moex_jit_source *src, const char *arch) {
    const size_t text_len = strlen(src->text);
    /* "header NAME LEN bytes fnv64 HASH": NAME plus at most 60 characters; the rest under 256 */
    size_t n = 256;
    for (int i = 0; i < src->n_options; i++) n += strlen(src->options[i]) + 2;
    for (int i = 0; i < src->n_headers; i++) n += strlen(src->header_names[i]) + 64;
    char *k = (char *)malloc(n);
    if (!k) return NULL;
    size_t w = 0;
    int ok = key_put(k, n, &w, "moex %s\nnvrtc %d.%d\narch %s\noptions", MOEX_VERSION_STRING, nvrtc.major, nvrtc.minor, arch);
    for (int i = 0; ok && i < src->n_options; i++) ok = key_put(k, n, &w, "\n %s", src->options[i]);
    for (int i = 0; ok && i < src->n_headers; i++) {
        const size_t len = strlen(src->header_texts[i]);
        ok = key_put(k, n, &w, "\nheader %s %zu bytes fnv64 %016llx", src->header_names[i], len,
                     (unsigned long long)moex_fnv64(MOEX_FNV64_START, src->header_texts[i], len));
    }
    if (ok)
        ok = key_put(k, n, &w, "\nsource %zu bytes fnv64 %016llx\n", text_len,
                     (unsigned long long)moex_fnv64(MOEX_FNV64_START, src->text, text_len));
    if (!ok) { /* the sizes above are bounds: not reached */
        free(k);
        return NULL;
    }
    return k;
}

/* moex_jit_build, or with fresh: compile whatever the cache holds and replace its entry. */
static moex_status build(const moex_jit_source *src, const char *cache_dir, moex_jit_image *out, int fresh) {
    if (!out) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: out is NULL");
    memset(out, 0, sizeof *out);
    if (!src || !src->text || !src->name)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: a source needs a name and a text");
    if (!name_ok(src->name))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: source name \"%.80s\" must be 1-64 of [A-Za-z0-9_-]", src->name);
    if (src->cc < 50 || src->cc > 199)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: %s: compute capability %d.%d is outside 5.0 .. 19.9", src->name,
                         src->cc / 10, src->cc % 10);
    if (src->n_options < 0 || (src->n_options > 0 && !src->options))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: %s: %d options but no option list", src->name, src->n_options);
    for (int i = 0; i < src->n_options; i++)
        if (!src->options[i]) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: %s: option %d is NULL", src->name, i);
    if (src->n_headers < 0 || (src->n_headers > 0 && (!src->header_names || !src->header_texts)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: %s: %d headers but no header list", src->name, src->n_headers);
    for (int i = 0; i < src->n_headers; i++)
        if (!src->header_names[i] || !src->header_texts[i])
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "jit: %s: header %d has no name or text", src->name, i);
    char why[768];
    if (!load_nvrtc(why, sizeof why)) return moex_fail(MOEX_ERR_UNSUPPORTED, "jit: %s: %s", src->name, why);
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d%s", src->cc, src->arch_specific ? "a" : "");
    char *key = make_key(src, arch);
    if (!key) return moex_fail(MOEX_ERR_OUT_OF_MEMORY, "jit: out of memory for the key of %s", src->name);
    char dir[3900];
    int have_dir = 0;
    if (cache_dir && *cache_dir) have_dir = snprintf(dir, sizeof dir, "%s", cache_dir) < (int)sizeof dir;
    else if (!cache_dir) have_dir = moex_jit_cache_dir(dir, sizeof dir);
    if (!have_dir && cache_dir && *cache_dir)
        snprintf(out->note, sizeof out->note, "cache directory name too long: not cached");
    if (have_dir)
        snprintf(out->path, sizeof out->path, "%s/%s-%016llx.cubin", dir, src->name,
                 (unsigned long long)moex_fnv64(MOEX_FNV64_START, key, strlen(key)));
    if (have_dir && !fresh && read_entry(out->path, key, out)) {
        out->from_cache = 1;
        free(key);
        return MOEX_OK;
    }
    moex_status st = compile(src, arch, out);
    if (!st && have_dir) write_entry(dir, out->path, key, out);
    if (st) {
        out->path[0] = 0;
    }
    free(key);
    return st;
}

moex_status moex_jit_build(const moex_jit_source *src, const char *cache_dir, moex_jit_image *out) {
    return build(src, cache_dir, out, 0);
}

moex_status moex_jit_rebuild(const moex_jit_source *src, const char *cache_dir, moex_jit_image *out) {
    return build(src, cache_dir, out, 1);
}

void moex_jit_image_free(moex_jit_image *img) {
    if (!img) return;
    free(img->data);
    free(img->log);
    img->data = NULL;
    img->log = NULL;
    img->size = 0;
}
