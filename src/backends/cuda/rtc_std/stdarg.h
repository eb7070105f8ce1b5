/* stdarg.h for NVRTC (gemm_rtc.c embeds it): NVRTC declares va_list itself. */
#pragma once
