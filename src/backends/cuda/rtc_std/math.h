/* math.h for NVRTC (gemm_rtc.c embeds it): the device's math functions are NVRTC's own. */
#pragma once
