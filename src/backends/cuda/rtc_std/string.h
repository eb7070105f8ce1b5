/* string.h for NVRTC (gemm_rtc.c embeds it): declarations the host-only inline functions of
 * moex's headers name (never compiled for the device). */
#pragma once
#include <stddef.h>
extern "C" {
int memcmp(const void *, const void *, size_t);
size_t strlen(const char *);
int strcmp(const char *, const char *);
}
