/* stdio.h for NVRTC (gemm_rtc.c embeds it): snprintf, which host-only inline functions of moex's
 * headers call (never compiled for the device). */
#pragma once
#include <stddef.h>
extern "C" int snprintf(char *, size_t, const char *, ...);
