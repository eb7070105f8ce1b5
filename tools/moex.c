/* moex — command-line tool: generate, info, demo, tokenize, bench, backends, version. */
#define _POSIX_C_SOURCE 200809L

#include "bench.h"
#include "cli.h"
#include "model_cmds.h"
#include "text_cmds.h"
#include "moex.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: moex COMMAND [options]\n"
            "commands:\n"
            "  generate   MODEL_DIR (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3) [...] [--chat]\n"
            "             --max-new-tokens N\n"
            "             [--experts NAME|JSON] [--device cpu|cuda[:N[,M...]]] [--dtype f32|bf16]\n"
            "             [--temperature T [--top-k K] [--top-p P] [--seed S]] [--threads N] [--ignore-eos]\n"
            "             [--warmup N] [--json [--logits]] [--quantize fp8|fp8-ue8m0|fp4 | --dequantize]\n"
            "             [--no-decode-switch] [--cuda-graph] (these two with --device cuda)\n"
            "             [--ep N | --ep-mpi] (expert-parallel ranks, each with its share of the experts: N in\n"
            "             this process, or one a process under an MPI launcher)\n"
            "  info       MODEL_DIR [--experts NAME|JSON] [--device cpu|cuda]: the model and the backends that can run it\n"
            "  demo       [MODEL_DIR]: generate with the bundled tiny model through every backend available here\n"
            "  tokenize   DIR (TEXT | --file F | --decode IDS) [--json] [--no-special]: tokenizer.json ids and text\n"
            "  bench      time the experts backends on a named layer shape (moex bench --help)\n"
            "  backends   list the experts backends and whether they can run here\n"
            "  version    print the version\n");
}

/* ------------------------------------------------------------------ stdout */

static int stdout_errno; /* the first write error on stdout, 0 if none */

int cli_stdout_flush(void) {
    if (stdout_errno) return stdout_errno;
    if (ferror(stdout)) { /* a write of the last piece failed: errno is still its (nothing since has failed) */
        stdout_errno = errno ? errno : EIO;
        return stdout_errno;
    }
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    stdout_errno = errno ? errno : EIO;
    return stdout_errno;
}

/* The last flush and the close of stdout: a failure of either, or of any write before,
 * is reported and makes a successful command exit 1. */
static int finish(int rc) {
    int e = cli_stdout_flush();
    errno = 0;
    if (fclose(stdout) != 0 && !e) e = errno ? errno : EIO;
    if (e) {
        fprintf(stderr, "moex: writing the output: %s\n", strerror(e));
        if (rc == 0) rc = 1;
    }
    return rc;
}

/* A closed fd 0, 1 or 2 is held by /dev/null opened read-only, so that no file the
 * command opens lands on it (a write to stdout still fails: EBADF, reported at exit). */
static void hold_standard_fds(void) {
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int got = open("/dev/null", O_RDONLY);
        if (got >= 0 && got != fd) close(got); /* not the lowest free fd: leave it */
    }
}

/* ------------------------------------------------------------------ numbers */

cli_num cli_parse_u64(const char *s, uint64_t max, uint64_t *out) {
    if (*s == '\0') return CLI_NUM_INVALID;
    uint64_t v = 0;
    int over = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') return CLI_NUM_INVALID;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) over = 1;
        else v = v * 10 + d;
    }
    if (over || v > max) return CLI_NUM_RANGE;
    *out = v;
    return CLI_NUM_OK;
}

cli_num cli_parse_float(const char *s, float *out) {
    if (*s == '\0' || isspace((unsigned char)*s)) return CLI_NUM_INVALID;
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (end == s || *end) return CLI_NUM_INVALID;
    if (errno == ERANGE) return CLI_NUM_RANGE;
    if (!isfinite(v)) return CLI_NUM_NONFINITE;
    *out = v;
    return CLI_NUM_OK;
}

/* ------------------------------------------------------------------ commands */

static int list_backends(void) {
    moex_device cpu = {MOEX_DEVICE_CPU, 0}, cuda = {MOEX_DEVICE_CUDA, 0};
    for (int i = 0; i < moex_backend_count(); i++) {
        const char *name = moex_backend_name(i);
        char why[512];
        printf("%-18s %s\n", name, moex_backend_summary(name));
        if (moex_backend_supports(name, NULL, cpu, why, sizeof why) == MOEX_OK) printf("%-18s   cpu: yes\n", "");
        else printf("%-18s   cpu: no: %s\n", "", why);
        if (moex_backend_supports(name, NULL, cuda, why, sizeof why) == MOEX_OK) printf("%-18s   cuda: yes\n", "");
        else printf("%-18s   cuda: no: %s\n", "", why);
    }
    return 0;
}

/* A command without arguments: anything after it is refused. */
static int no_arguments(int argc, char **argv) {
    if (argc <= 2) return 0;
    fprintf(stderr, "moex %s: %s \"%s\" is not taken by this command (it takes no arguments)\n", argv[1],
            argv[2][0] == '-' ? "option" : "argument", argv[2]);
    return 2;
}

static int run(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "bench") == 0) return moex_cli_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0) return moex_cli_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "info") == 0) return moex_cli_info(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0) return moex_cli_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "demo") == 0) return moex_cli_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "backends") == 0) return no_arguments(argc, argv) ? 2 : list_backends();
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        if (no_arguments(argc, argv)) return 2;
        printf("moex %s\n", moex_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        if (no_arguments(argc, argv)) return 2;
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "moex: unknown command \"%s\"\n", cmd);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    hold_standard_fds();
    return finish(run(argc, argv));
}
