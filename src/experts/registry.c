/* registry.c — backends by name: the built-ins (the dispatch table's), registered at first use,
 * and the user's own. Append-only; readers see a published count without locking. */
#include "experts/dispatch.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#define MAX_BACKENDS 64
#define MAX_NAME 63

typedef struct {
    moex_backend backend; /* name and summary point into the strings below */
    char name[MAX_NAME + 1];
    char summary[160];
} entry;

static entry entries[MAX_BACKENDS];
static atomic_int entry_count;
static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static int valid_name(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n > MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    return 1;
}

/* Caller holds write_lock. */
static moex_status add_locked(const moex_backend *b) {
    int n = atomic_load(&entry_count);
    for (int i = 0; i < n; i++)
        if (strcmp(entries[i].name, b->name) == 0)
            return moex_fail(MOEX_ERR_EXISTS, "a backend named \"%s\" is already registered", b->name);
    if (n == MAX_BACKENDS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "the registry is full (%d backends)", MAX_BACKENDS);
    entry *e = &entries[n];
    e->backend = *b;
    snprintf(e->name, sizeof e->name, "%s", b->name);
    snprintf(e->summary, sizeof e->summary, "%s", b->summary ? b->summary : "");
    e->backend.name = e->name;
    e->backend.summary = e->summary;
    atomic_store(&entry_count, n + 1); /* publish after the entry is complete */
    return MOEX_OK;
}

static void register_builtins(void) {
    int n;
    const moex_backend *builtins = moex_builtin_backends(&n); /* the dispatch table's (src/backends/table.c) */
    pthread_mutex_lock(&write_lock);
    for (int i = 0; i < n; i++) add_locked(&builtins[i]);
    pthread_mutex_unlock(&write_lock);
}

static int count(void) {
    pthread_once(&builtins_once, register_builtins);
    return atomic_load(&entry_count);
}

moex_status moex_register_backend(const moex_backend *backend) {
    if (!backend) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_register_backend: backend is NULL");
    if (!backend->name) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_register_backend: name is NULL");
    if (!valid_name(backend->name))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "backend name \"%.80s\" is invalid: use 1 to %d characters of a-z, 0-9 and _",
                         backend->name, MAX_NAME);
    if (!backend->supports || !backend->forward)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "backend \"%s\": %s is required", backend->name,
                         backend->supports ? "forward" : "supports");
    count();
    pthread_mutex_lock(&write_lock);
    moex_status st = add_locked(backend);
    pthread_mutex_unlock(&write_lock);
    return st;
}

int moex_backend_count(void) { return count(); }

const char *moex_backend_name(int i) {
    if (i < 0 || i >= count()) return NULL;
    return entries[i].name;
}

const moex_backend *moex_registry_find(const char *name, int *index) {
    if (!name) return NULL;
    int n = count();
    for (int i = 0; i < n; i++) {
        if (strcmp(entries[i].name, name) == 0) {
            if (index) *index = i;
            return &entries[i].backend;
        }
    }
    return NULL;
}

const moex_backend *moex_registry_at(int index) { return &entries[index].backend; }

moex_status moex_registry_not_found(const char *name) {
    char list[1024];
    size_t len = 0;
    int n = count();
    list[0] = 0;
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s\"%s\"", i ? ", " : "", entries[i].name);
    return moex_fail(MOEX_ERR_NOT_FOUND, "unknown experts backend \"%.80s\"; valid names: %s", name ? name : "(null)",
                     list);
}

const char *moex_backend_summary(const char *name) {
    const moex_backend *b = moex_registry_find(name, NULL);
    return b ? b->summary : NULL;
}

moex_status moex_backend_lookup(const char *name) {
    return moex_registry_find(name, NULL) ? MOEX_OK : moex_registry_not_found(name);
}

/* ---- calling a backend's functions ---------------------------------------------------- */

/* What b's function fn returned, checked: see experts_internal.h. mark: moex_error_mark() before the call. */
static moex_status checked(const moex_backend *b, const char *fn, moex_status st, uint64_t mark) {
    const int v = (int)st;
    if (v == MOEX_OK) return MOEX_OK;
    const int said = moex_error_mark() != mark;
    if (v < 0 || v > MOEX_ERR_INTERNAL)
        return said ? moex_fail(MOEX_ERR_INTERNAL, "backend \"%s\" returned %d, which is not a moex_status (from %s; "
                                "its message: %s)", b->name, v, fn, moex_last_error())
                    : moex_fail(MOEX_ERR_INTERNAL, "backend \"%s\" returned %d, which is not a moex_status (from %s)",
                                b->name, v, fn);
    if (!said)
        return moex_fail(st, "backend \"%s\": %s failed with status %d and no message (%s)", b->name, fn, v,
                         moex_status_str(st));
    return st;
}

moex_status moex_backend_call_supports(const moex_backend *b, const moex_experts_desc *layer,
                                       const moex_device_info *dev, char *why, size_t why_size) {
    why[0] = 0;
    const uint64_t mark = moex_error_mark();
    const int ok = b->supports(layer, dev, why, why_size, b->user);
    why[why_size - 1] = 0; /* whatever the backend wrote, a string */
    if (ok == 1) return MOEX_OK;
    if (ok != 0) {
        moex_fail(MOEX_ERR_INTERNAL, "backend \"%s\": supports returned %d, which is neither 1 (supported) nor 0 "
                  "(not supported)", b->name, ok);
        snprintf(why, why_size, "%s", moex_last_error());
        return MOEX_ERR_INTERNAL;
    }
    if (!why[0]) {
        if (moex_error_mark() != mark) snprintf(why, why_size, "%s", moex_last_error()); /* said with moex_backend_fail */
        else snprintf(why, why_size, "backend \"%s\" gave no reason", b->name);
    }
    return MOEX_ERR_UNSUPPORTED;
}

moex_status moex_backend_call_prepare(const moex_backend *b, moex_context *ctx, const moex_experts_desc *layer,
                                      void **state) {
    const uint64_t mark = moex_error_mark();
    return checked(b, "prepare", b->prepare(ctx, layer, state, b->user), mark);
}

moex_status moex_backend_call_forward(const moex_backend *b, const moex_forward_args *args) {
    const uint64_t mark = moex_error_mark();
    return checked(b, "forward", b->forward(args, b->user), mark);
}

moex_status moex_backend_supports(const char *name, const moex_layer *layer, moex_device device, char *why,
                                  size_t why_size) {
    const moex_backend *b = moex_registry_find(name, NULL);
    if (!b) {
        moex_status st = moex_registry_not_found(name);
        if (why && why_size) snprintf(why, why_size, "%s", moex_last_error());
        return st;
    }
    moex_device_info info;
    moex_status st = moex_device_query(device, &info);
    if (st) return st;
    char reason[512];
    st = moex_backend_call_supports(b, layer ? &layer->desc : NULL, &info, reason, sizeof reason);
    if (why && why_size) snprintf(why, why_size, "%s", st ? reason : "");
    if (st == MOEX_ERR_UNSUPPORTED) return moex_fail(MOEX_ERR_UNSUPPORTED, "%s: %s", name, reason);
    return st;
}
