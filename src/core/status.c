/* status.c — status strings and the thread-local last-error message. */
#include "core/internal.h"
#include <stdio.h>

static _Thread_local char last_error[1024];

const char *moex_version(void) { return MOEX_VERSION_STRING; }

const char *moex_status_str(moex_status status) {
    switch (status) {
    case MOEX_OK: return "ok";
    case MOEX_ERR_INVALID_ARGUMENT: return "invalid argument";
    case MOEX_ERR_OUT_OF_MEMORY: return "out of memory";
    case MOEX_ERR_NOT_FOUND: return "not found";
    case MOEX_ERR_UNSUPPORTED: return "unsupported";
    case MOEX_ERR_WORKSPACE: return "workspace too small";
    case MOEX_ERR_NOT_PREPARED: return "not prepared";
    case MOEX_ERR_DEVICE: return "device error";
    case MOEX_ERR_IO: return "i/o error";
    case MOEX_ERR_FORMAT: return "malformed file";
    case MOEX_ERR_EXISTS: return "already exists";
    case MOEX_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *moex_last_error(void) { return last_error; }

/* Messages recorded on this thread so far: a caller that notes the count before a call can tell
 * whether the call set a message of its own. */
static _Thread_local uint64_t messages;

static void record(const char *fmt, va_list ap) {
    char buf[sizeof last_error]; /* the arguments may point into last_error */
    vsnprintf(buf, sizeof buf, fmt, ap);
    memcpy(last_error, buf, strlen(buf) + 1);
    messages++;
}

moex_status moex_fail(moex_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(fmt, ap);
    va_end(ap);
    return status;
}

moex_status moex_backend_fail(moex_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(fmt ? fmt : "(no message)", ap);
    va_end(ap);
    return status;
}

uint64_t moex_error_mark(void) { return messages; }
