/* runtime.cu — the CUDA runtime under libmoex: device queries, memory,
 * copies, the per-slot streams, the context status word and graphs. Every
 * CUDA error becomes MOEX_ERR_DEVICE (or MOEX_ERR_OUT_OF_MEMORY) with CUDA's
 * own message. */
#include "core/gpu_runtime.h"
#include "gpu/cuda_check.h"


#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>

extern "C" moex_status moex_cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return MOEX_OK;
    cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    moex_status st = err == cudaErrorMemoryAllocation ? MOEX_ERR_OUT_OF_MEMORY : MOEX_ERR_DEVICE;
    return moex_fail(st, "%s: CUDA error %d (%s): %s", what, (int)err, cudaGetErrorName(err), cudaGetErrorString(err));
}

/* Make `device` current on this thread; fail naming it. */
extern "C" moex_status moex_cuda_use(int device) {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) return moex_cuda_status(err, "cudaGetDeviceCount");
    if (device < 0 || device >= count)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda device %d does not exist (%d visible)", device, count);
    return moex_cuda_status(cudaSetDevice(device), "cudaSetDevice");
}

extern "C" moex_status moex_cuda_device_query(int index, moex_device_info *info) {
    snprintf(info->name, sizeof info->name, "cuda:%d", index);
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        snprintf(info->reason, sizeof info->reason, "no usable CUDA device: %s", cudaGetErrorString(err));
        return MOEX_OK;
    }
    info->cuda_devices = count;
    if (index < 0 || index >= count) {
        snprintf(info->reason, sizeof info->reason, "cuda device %d does not exist (%d visible)", index, count);
        return MOEX_OK;
    }
    cudaDeviceProp p;
    if ((err = cudaGetDeviceProperties(&p, index)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(info->reason, sizeof info->reason, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
        return MOEX_OK;
    }
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    snprintf(info->name, sizeof info->name, "cuda:%d (%.60s, sm_%d%d, %d SMs)", index, p.name, p.major, p.minor,
             p.multiProcessorCount);
    if (p.major < 7) {
        snprintf(info->reason, sizeof info->reason, "%.60s has compute capability %d.%d; moex needs 7.0 or newer", p.name,
                 p.major, p.minor);
        return MOEX_OK;
    }
    info->available = 1;
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_alloc(int device, size_t bytes, void **ptr) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return moex_fail(err == cudaErrorMemoryAllocation ? MOEX_ERR_OUT_OF_MEMORY : MOEX_ERR_DEVICE,
                         "cudaMalloc of %zu bytes on cuda:%d failed (%s); %zu of %zu bytes free", bytes, device,
                         cudaGetErrorString(err), free_b, total_b);
    }
    *ptr = p;
    return MOEX_OK;
}

extern "C" void moex_cuda_free(int device, void *ptr) {
    if (moex_cuda_use(device) == MOEX_OK) cudaFree(ptr);
}

/* Waits for the legacy default stream: cudaMemset and cudaMemcpy run there, asynchronously to the
 * host in some cases, and the library's streams are non-blocking, so nothing else orders them
 * before a kernel that reads what they wrote. */
static moex_status legacy_sync(const char *what) {
    return moex_cuda_status(cudaStreamSynchronize(cudaStreamLegacy), what);
}

extern "C" moex_status moex_cuda_memcpy(void *dst, int dst_gpu, const void *src, int src_gpu, size_t bytes) {
    moex_status st = moex_cuda_use(dst_gpu >= 0 ? dst_gpu : src_gpu);
    if (st) return st;
    cudaMemcpyKind kind = dst_gpu >= 0 ? (src_gpu >= 0 ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                                       : cudaMemcpyDeviceToHost;
    st = moex_cuda_status(cudaMemcpy(dst, src, bytes, kind), "moex_memcpy");
    /* cudaMemcpy returns before a device-to-device copy, or the last DMA of one from pageable host
     * memory, has landed, and the legacy stream it runs on does not order the library's
     * non-blocking streams: wait, so that a forward queued next reads the copied bytes */
    if (!st) st = legacy_sync("moex_memcpy");
    return st;
}

/* ---------------------------------------------------------------- streams */

enum { MAX_GPUS = 64, MAX_SLOTS = 64 };
static cudaStream_t streams[MAX_GPUS][MAX_SLOTS];
static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;

extern "C" moex_status moex_cuda_stream(int device, int slot, void **stream) {
    if (device < 0 || device >= MAX_GPUS || slot < 0 || slot >= MAX_SLOTS)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda:%d stream slot %d is outside [0, %d)", device, slot, MAX_SLOTS);
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    pthread_mutex_lock(&streams_lock);
    if (!streams[device][slot])
        st = moex_cuda_status(cudaStreamCreateWithFlags(&streams[device][slot], cudaStreamNonBlocking),
                              "cudaStreamCreate");
    *stream = streams[device][slot];
    pthread_mutex_unlock(&streams_lock);
    return st;
}

extern "C" moex_status moex_cuda_flags_alloc(int device, int **flags) {
    void *p = NULL;
    moex_status st = moex_cuda_alloc(device, sizeof(int), &p);
    if (st) return st;
    if ((st = moex_cuda_status(cudaMemset(p, 0, sizeof(int)), "cudaMemset")) ||
        (st = legacy_sync("clearing the status word"))) {
        cudaFree(p);
        return st;
    }
    *flags = (int *)p;
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_synchronize(int device, void *stream, int *flags) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    if ((st = moex_cuda_status(cudaStreamSynchronize((cudaStream_t)stream), "a queued forward"))) return st;
    int h = 0;
    if ((st = moex_cuda_status(cudaMemcpy(&h, flags, sizeof h, cudaMemcpyDeviceToHost), "reading the status word")))
        return st;
    if (h == 0) return MOEX_OK;
    if ((st = moex_cuda_status(cudaMemset(flags, 0, sizeof h), "clearing the status word")) ||
        (st = legacy_sync("clearing the status word")))
        return st;
    if (h & MOEX_CUDA_FLAG_BAD_ID)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "a forward queued on this context got an id outside [-1, num_experts]; those pairs were "
                         "treated as sentinels and that output is not meaningful");
    if (h & MOEX_CUDA_FLAG_BAD_TOKEN)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "a token id outside [0, vocab_size) reached the embedding on the device; its row was zeroed");
    if (h & MOEX_CUDA_FLAG_BAD_SEQ)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT,
                         "an attention call on the device got a sequence descriptor the KV cache cannot take (seq "
                         "outside the batch or repeated, past beyond the cached length, past + tokens beyond max_seq, "
                         "or token counts not adding up); that sequence was skipped");
    return moex_fail(MOEX_ERR_INTERNAL, "the device reported status bits 0x%x", (unsigned)h);
}

/* ---------------------------------------------------------------- graphs */

extern "C" moex_status moex_cuda_graph_begin(int device, void *stream) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    return moex_cuda_status(cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal),
                            "cudaStreamBeginCapture");
}

extern "C" moex_status moex_cuda_graph_end(int device, void *stream, void **exec) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    cudaGraph_t graph = NULL;
    if ((st = moex_cuda_status(cudaStreamEndCapture((cudaStream_t)stream, &graph), "cudaStreamEndCapture"))) return st;
    cudaGraphExec_t e = NULL;
    st = moex_cuda_status(cudaGraphInstantiate(&e, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    if (st) return st;
    *exec = (void *)e;
    return MOEX_OK;
}

extern "C" moex_status moex_cuda_graph_launch(int device, void *exec, void *stream) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    return moex_cuda_status(cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream), "cudaGraphLaunch");
}

extern "C" void moex_cuda_graph_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}

/* ---------------------------------------------------------------- events */

extern "C" moex_status moex_cuda_event_create(int device, int interprocess, void **event) {
    moex_status st = moex_cuda_use(device);
    if (st) return st;
    cudaEvent_t e = NULL;
    const unsigned flags = cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0);
    if ((st = moex_cuda_status(cudaEventCreateWithFlags(&e, flags), "cudaEventCreate"))) return st;
    *event = e;
    return MOEX_OK;
}

extern "C" void moex_cuda_event_free(int device, void *event) {
    if (event && moex_cuda_use(device) == MOEX_OK) cudaEventDestroy((cudaEvent_t)event);
}

/* One direction: kernels on `from` reach `to`'s memory (already enabled counts as done). */
static moex_status peer_enable(int from, int to) {
    int can = 0;
    moex_status st = moex_cuda_status(cudaDeviceCanAccessPeer(&can, from, to), "cudaDeviceCanAccessPeer");
    if (st) return st;
    if (!can)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "cuda:%d cannot reach the memory of cuda:%d (no peer access between "
                         "them): their contexts cannot be ranks of one expert-parallel group", from, to);
    if ((st = moex_cuda_use(from))) return st;
    const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError(); /* not an error here: clear it */
        return MOEX_OK;
    }
    return moex_cuda_status(e, "cudaDeviceEnablePeerAccess");
}

extern "C" moex_status moex_cuda_peer_access(int a, int b) {
    if (a == b) return MOEX_OK;
    moex_status st = peer_enable(a, b);
    return st ? st : peer_enable(b, a);
}
