/*
 * test_deepgemm_needs.c — what deepgemm asks of a device and a layer before it runs (SPEC R5,
 * src/backends/planned.c), on described devices, so that every rule is checked on any machine:
 * the CPU, a CUDA device that cannot be used, compute capability 8.0, FP4 experts on SM90
 * (refused, naming grouped_mm and batched_mm) and on SM100, FP8 with static activation scales,
 * NVRTC that cannot be loaded and the CUDA headers not found (each named, with the backends that
 * need neither).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/planned.h"
#include "gpu/jit.h"
#include "testutil.h"

static moex_device_info gpu(int major, int minor) {
    moex_device_info d;
    memset(&d, 0, sizeof d);
    d.device.kind = MOEX_DEVICE_CUDA;
    d.available = d.cuda_built = 1;
    d.cuda_devices = 1;
    d.cc_major = major, d.cc_minor = minor;
    snprintf(d.name, sizeof d.name, "cuda:0 (a described GPU, sm_%d%d)", major, minor);
    return d;
}

static moex_experts_desc layer_of(moex_dtype wdt, int scheme) {
    moex_experts_desc l;
    memset(&l, 0, sizeof l);
    l.gate_up.dtype = l.down.dtype = wdt;
    l.activation_scheme = scheme;
    return l;
}

/* Runs first: NVRTC not loaded yet in this process. */
static void test_nvrtc_missing(void **state) {
    (void)state;
    char why[1024] = "";
    setenv("MOEX_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1);
    moex_device_info h200 = gpu(9, 0);
    moex_experts_desc bf16 = layer_of(MOEX_BF16, MOEX_ACT_SCHEME_DYNAMIC);
    if (moex_deepgemm_needs(&bf16, &h200, why, sizeof why) || !contains(why, "NVRTC") || !contains(why, "grouped_mm") ||
        !contains(why, "batched_mm") || !contains(why, "first forward"))
        PROBLEM("NVRTC missing: \"%s\"", why);
    unsetenv("MOEX_NVRTC_LIBRARY");
    end_problems();
}

static void test_device_and_layer_rules(void **state) {
    (void)state;
    char why[1024];
    moex_device_info cpu;
    memset(&cpu, 0, sizeof cpu);
    cpu.device.kind = MOEX_DEVICE_CPU;
    cpu.available = 1;
    moex_experts_desc bf16 = layer_of(MOEX_BF16, MOEX_ACT_SCHEME_DYNAMIC), fp4 = layer_of(MOEX_E2M1X2, 0);
    moex_experts_desc fp8s = layer_of(MOEX_E4M3, MOEX_ACT_SCHEME_STATIC), fp8d = layer_of(MOEX_E4M3, 0);
    if (moex_deepgemm_needs(&bf16, &cpu, why, sizeof why) || !contains(why, "CPU") || !contains(why, "9.0"))
        PROBLEM("CPU: \"%s\"", why);
    moex_device_info gone = gpu(9, 0);
    gone.available = 0;
    snprintf(gone.reason, sizeof gone.reason, "no CUDA device is visible");
    if (moex_deepgemm_needs(&bf16, &gone, why, sizeof why) || !contains(why, "no CUDA device is visible"))
        PROBLEM("unavailable: \"%s\"", why);
    moex_device_info a100 = gpu(8, 0), h200 = gpu(9, 0), b200 = gpu(10, 0);
    if (moex_deepgemm_needs(&bf16, &a100, why, sizeof why) || !contains(why, "8.0") || !contains(why, "grouped_mm"))
        PROBLEM("sm_80: \"%s\"", why);
    if (moex_deepgemm_needs(&fp4, &h200, why, sizeof why) || !contains(why, "FP4") || !contains(why, "SM100") ||
        !contains(why, "grouped_mm") || !contains(why, "batched_mm") || !contains(why, "9.0"))
        PROBLEM("FP4 on sm_90: \"%s\"", why);
    if (moex_deepgemm_needs(&fp8s, &h200, why, sizeof why) || !contains(why, "static")) PROBLEM("static: \"%s\"", why);
    char w[512];
    if (moex_jit_nvrtc_available(NULL, NULL, w, sizeof w)) { /* past every rule: the device may run it */
        char *saved = getenv("MOEX_CUDA_INCLUDE_DIR");
        saved = saved ? strdup(saved) : NULL;
        setenv("MOEX_CUDA_INCLUDE_DIR", "/nonexistent/include", 1); /* the toolkit's headers not found */
        if (moex_deepgemm_needs(&bf16, &h200, why, sizeof why) || !contains(why, "cuda_bf16.h") ||
            !contains(why, "/nonexistent/include") || !contains(why, "grouped_mm"))
            PROBLEM("no CUDA headers: \"%s\"", why);
        if (saved) setenv("MOEX_CUDA_INCLUDE_DIR", saved, 1);
        else unsetenv("MOEX_CUDA_INCLUDE_DIR");
        free(saved);
        why[0] = 0;
        if (!moex_deepgemm_needs(&bf16, &h200, why, sizeof why)) PROBLEM("bf16 on sm_90 refused: \"%s\"", why);
        if (!moex_deepgemm_needs(&fp8d, &h200, why, sizeof why)) PROBLEM("dynamic FP8 on sm_90 refused: \"%s\"", why);
        if (!moex_deepgemm_needs(&fp4, &b200, why, sizeof why)) PROBLEM("FP4 on sm_100 refused: \"%s\"", why);
        if (!moex_deepgemm_needs(NULL, &h200, why, sizeof why)) PROBLEM("no layer, sm_90 refused: \"%s\"", why);
    } else {
        print_message("NVRTC not loadable here (%s): the accepting cases are not checked\n", w);
    }
    end_problems();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nvrtc_missing),
        cmocka_unit_test(test_device_and_layer_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
