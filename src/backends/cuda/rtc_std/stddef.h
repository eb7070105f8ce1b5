/* stddef.h for NVRTC (gemm_rtc.c embeds it): what moex's headers use of the C header, which
 * NVRTC does not have. Not on any include path of the normal build. */
#pragma once
typedef decltype(sizeof(0)) size_t;
typedef decltype((char *)0 - (char *)0) ptrdiff_t;
#ifndef NULL
#define NULL 0
#endif
