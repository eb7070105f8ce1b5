/*
 * backend_list.h — the experts backends a test runs, taken from the registry rather than
 * from a list of names: every registered backend whose supports() accepts the device (and,
 * asked per case, the layer). A backend that refuses (MOEX_ERR_UNSUPPORTED, e.g. the planned
 * GPU-only ones on the CPU) is left out; a new built-in is picked up with no test edited.
 * Header-only (static definitions); plain C, usable with or without cmocka.
 */
#ifndef MOEX_TEST_BACKEND_LIST_H
#define MOEX_TEST_BACKEND_LIST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moex.h"

#define BACKEND_LIST_MAX 64

/* Names of registered backends (pointers into the registry, valid for the process). */
typedef struct backend_list {
    int n;
    const char *name[BACKEND_LIST_MAX];
} backend_list;

/* name, layer (NULL: the device alone), device -> 1 if the backend runs it; 0 if it refuses
 * (MOEX_ERR_UNSUPPORTED). Any other answer (not found, an internal error) is a bug of the test
 * or the library: printed and counted as a refusal, so the caller's own checks notice. */
static inline int backend_takes(const char *name, const moex_layer *layer, moex_device device) {
    char why[512];
    moex_status st = moex_backend_supports(name, layer, device, why, sizeof why);
    if (st == MOEX_OK) return 1;
    if (st != MOEX_ERR_UNSUPPORTED)
        fprintf(stderr, "backend_takes(%s): %s: %s\n", name ? name : "(null)", moex_status_str(st), moex_last_error());
    return 0;
}

/* -> the registered backends whose supports() accepts device (layer NULL), in registry order */
static inline backend_list backends_on(moex_device device) {
    backend_list l;
    memset(&l, 0, sizeof l);
    const int n = moex_backend_count();
    for (int i = 0; i < n && l.n < BACKEND_LIST_MAX; i++) {
        const char *name = moex_backend_name(i);
        if (name && backend_takes(name, NULL, device)) l.name[l.n++] = name;
    }
    return l;
}

/* -> backends_on the CPU */
static inline backend_list cpu_backends(void) {
    moex_device cpu = {MOEX_DEVICE_CPU, 0};
    return backends_on(cpu);
}

/* 1 if name is in l */
static inline int backend_listed(const backend_list *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (strcmp(l->name[i], name) == 0) return 1;
    return 0;
}

#endif
