/* json.h — cJSON through moex's allocation hooks (internal).
 *
 * cJSON answers NULL both for text that is not JSON and for an allocation that
 * failed. moex installs its own allocator into cJSON (cJSON_InitHooks, once, for the
 * process: it calls malloc and free, so other users of cJSON in the program see no
 * difference) that records a failed allocation, so that a parse can tell the two
 * apart: out of memory is MOEX_ERR_OUT_OF_MEMORY, not "not valid JSON".
 */
#ifndef MOEX_CORE_JSON_H
#define MOEX_CORE_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* Parse text[0 .. len) (text[len] must be readable and NUL) as one JSON value.
 * *end: where parsing stopped (the error's position on failure). On NULL, *oom is 1
 * when an allocation failed and 0 when the text is not valid JSON. */
cJSON *moex_json_parse(const char *text, size_t len, const char **end, int *oom);

/* Make moex's cJSON allocator ready (done by moex_json_parse; for code that builds JSON). */
void moex_json_init(void);

/* Tests: make the n-th allocation through cJSON on this thread from now fail
 * (n = 0: the next one); n < 0 turns it off. */
void moex_json_fail_allocation(long n);

#endif
