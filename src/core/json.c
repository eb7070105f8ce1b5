/* json.c — cJSON with moex's allocation hooks (see json.h). */
#include "core/json.h"
#include <pthread.h>
#include <stdlib.h>

static _Thread_local int alloc_failed;    /* an allocation failed since the last parse began */
static _Thread_local long fail_countdown = -1; /* tests: allocations left before one fails */

static void *json_malloc(size_t bytes) {
    if (fail_countdown >= 0 && fail_countdown-- == 0) {
        alloc_failed = 1;
        return NULL;
    }
    void *p = malloc(bytes);
    if (!p) alloc_failed = 1;
    return p;
}

static void install_hooks(void) {
    cJSON_Hooks hooks = {json_malloc, free};
    cJSON_InitHooks(&hooks);
}

void moex_json_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_hooks);
}

void moex_json_fail_allocation(long n) { fail_countdown = n < 0 ? -1 : n; }

cJSON *moex_json_parse(const char *text, size_t len, const char **end, int *oom) {
    moex_json_init();
    alloc_failed = 0;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, end, 0);
    *oom = !root && alloc_failed;
    return root;
}
