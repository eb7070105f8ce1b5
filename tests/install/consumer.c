/* consumer.c — a program built against the installed libmoex (tests/install/check_install.sh):
 * one include per audience, and a call from each, so a header missing from the install or
 * a symbol missing from the library fails the build or the run. */
#include <moex/base.h>
#include <moex/experts.h>
#include <moex/backend.h>
#include <moex/model.h>
#include <moex.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    if (strcmp(moex_version(), MOEX_VERSION_STRING) != 0) {
        fprintf(stderr, "library %s, header %s\n", moex_version(), MOEX_VERSION_STRING);
        return 1;
    }
    moex_experts_desc d;
    if (moex_experts_desc_init(&d) != MOEX_OK) return 1;            /* experts.h */
    if (moex_backend_lookup("grouped_mm") != MOEX_OK) return 1;      /* backend.h */
    moex_model *m = NULL;
    if (moex_model_load("/nonexistent-moex-model", NULL, &m) == MOEX_OK) return 1; /* model.h */
    printf("moex %s: %d backends; a missing model says: %s\n", moex_version(), moex_backend_count(), moex_last_error());
    return 0;
}
