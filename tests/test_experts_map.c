/* test_experts_map.c — the per-sub-config backend map (SPEC R3, R4): load-time
 * semantics, run-time set, read back, bad keys and names, the load-time-only
 * backend, and the decode-step switch with its restore on success and on error. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "model/experts_map.h"
#include "testutil.h"

static const char *const VL_SUBS[] = {"text_config", "vision_config"};

static moex_experts_map vl_map(void) {
    moex_experts_map m;
    assert_int_equal(moex_experts_map_init(&m, VL_SUBS, 2), MOEX_OK);
    return m;
}

static void assert_json(const moex_experts_map *m, const char *want) {
    char buf[512];
    assert_int_equal(moex_experts_map_to_json(m, buf, sizeof buf), MOEX_OK);
    assert_string_equal(buf, want);
}

static void test_default_and_name(void **state) {
    (void)state;
    moex_experts_map m = vl_map();
    assert_json(&m, "{\"\": \"grouped_mm\", \"text_config\": \"grouped_mm\", \"vision_config\": \"grouped_mm\"}");
    assert_int_equal(moex_experts_map_apply(&m, "eager", 1), MOEX_OK);
    assert_json(&m, "{\"\": \"eager\", \"text_config\": \"eager\", \"vision_config\": \"eager\"}");
    /* a model without sub-configs has the "" entry alone */
    moex_experts_map plain;
    assert_int_equal(moex_experts_map_init(&plain, NULL, 0), MOEX_OK);
    assert_int_equal(moex_experts_map_apply(&plain, "{\"\": \"batched_mm\"}", 1), MOEX_OK);
    assert_json(&plain, "{\"\": \"batched_mm\"}");
}

static void test_named_wins_over_global(void **state) {
    (void)state;
    moex_experts_map m = vl_map();
    /* the order of keys in the JSON does not matter: a named sub-config wins over "" */
    assert_int_equal(moex_experts_map_apply(&m, "{\"vision_config\": \"eager\", \"\": \"batched_mm\"}", 1), MOEX_OK);
    assert_json(&m, "{\"\": \"batched_mm\", \"text_config\": \"batched_mm\", \"vision_config\": \"eager\"}");
    assert_string_equal(moex_experts_map_get(&m, "vision_config"), "eager");
    assert_string_equal(moex_experts_map_get(&m, ""), "batched_mm");
    assert_null(moex_experts_map_get(&m, "audio_config"));
}

static void test_runtime_map_keeps_unnamed(void **state) {
    (void)state;
    moex_experts_map m = vl_map();
    assert_int_equal(moex_experts_map_apply(&m, "{\"text_config\": \"eager\"}", 0), MOEX_OK);
    assert_json(&m, "{\"\": \"grouped_mm\", \"text_config\": \"eager\", \"vision_config\": \"grouped_mm\"}");
    /* get -> set round trip */
    char buf[512];
    assert_int_equal(moex_experts_map_to_json(&m, buf, sizeof buf), MOEX_OK);
    moex_experts_map again = vl_map();
    assert_int_equal(moex_experts_map_apply(&again, buf, 0), MOEX_OK);
    assert_memory_equal(&again, &m, sizeof m);
}

static void test_bad_keys_and_names(void **state) {
    (void)state;
    moex_experts_map m = vl_map(), before = m;
    assert_int_equal(moex_experts_map_apply(&m, "{\"audio_config\": \"eager\"}", 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "audio_config"));
    assert_true(contains(moex_last_error(), "text_config"));
    assert_true(contains(moex_last_error(), "vision_config"));
    assert_int_equal(moex_experts_map_apply(&m, "{\"text_config\": \"fast_mm\"}", 1), MOEX_ERR_NOT_FOUND);
    assert_true(contains(moex_last_error(), "fast_mm"));
    assert_true(contains(moex_last_error(), "grouped_mm"));
    assert_int_equal(moex_experts_map_apply(&m, "fast_mm", 1), MOEX_ERR_NOT_FOUND);
    assert_int_equal(moex_experts_map_apply(&m, "{\"\": 3}", 1), MOEX_ERR_INVALID_ARGUMENT);
    assert_int_equal(moex_experts_map_apply(&m, "{\"\": \"eager\"", 1), MOEX_ERR_INVALID_ARGUMENT);
    /* a failing map changes nothing, even when a valid entry came before the bad one */
    assert_int_equal(moex_experts_map_apply(&m, "{\"text_config\": \"eager\", \"nope\": \"eager\"}", 1),
                     MOEX_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&m, &before, sizeof m);
}

static void test_megamoe_is_load_time_only(void **state) {
    (void)state;
    moex_experts_map m = vl_map();
    assert_int_equal(moex_experts_map_apply(&m, "deepgemm_megamoe", 0), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "reload"));
    assert_int_equal(moex_experts_map_apply(&m, "deepgemm_megamoe", 1), MOEX_OK);
    assert_int_equal(moex_experts_map_apply(&m, "{\"text_config\": \"grouped_mm\"}", 0), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "load time"));
}

typedef struct step_log {
    moex_experts_map *map;
    char seen[512];
    moex_status result;
} step_log;

static moex_status record_step(void *user) {
    step_log *log = user;
    moex_experts_map_to_json(log->map, log->seen, sizeof log->seen);
    return log->result;
}

static void test_decode_switch(void **state) {
    (void)state;
    moex_experts_map m = vl_map();
    assert_int_equal(moex_experts_map_apply(&m, "{\"vision_config\": \"eager\"}", 1), MOEX_OK);
    const moex_experts_map before = m;
    step_log log = {&m, "", MOEX_OK};
    /* CUDA: grouped_mm entries decode on batched_mm; others keep theirs */
    assert_int_equal(moex_experts_map_run_decode(&m, MOEX_DEVICE_CUDA, 1, record_step, &log), MOEX_OK);
    assert_string_equal(log.seen,
                        "{\"\": \"batched_mm\", \"text_config\": \"batched_mm\", \"vision_config\": \"eager\"}");
    assert_memory_equal(&m, &before, sizeof m);
    /* restored when the decode step fails too */
    log.result = MOEX_ERR_DEVICE;
    assert_int_equal(moex_experts_map_run_decode(&m, MOEX_DEVICE_CUDA, 1, record_step, &log), MOEX_ERR_DEVICE);
    assert_true(contains(log.seen, "batched_mm"));
    assert_memory_equal(&m, &before, sizeof m);
    /* CPU: no switch; switch turned off: no switch */
    log.result = MOEX_OK;
    assert_int_equal(moex_experts_map_run_decode(&m, MOEX_DEVICE_CPU, 1, record_step, &log), MOEX_OK);
    assert_false(contains(log.seen, "batched_mm"));
    assert_int_equal(moex_experts_map_run_decode(&m, 1, 0, record_step, &log), MOEX_OK);
    assert_false(contains(log.seen, "batched_mm"));
}

/* Text after the JSON object is refused (it was ignored), and sub-config names with quotes,
 * backslashes or control characters come back as valid JSON that parses to the same keys. */
static void test_trailing_text_and_escapes(void **state) {
    (void)state;
    moex_experts_map m = vl_map(), before = m;
    const char *bad[] = {"{\"\": \"eager\"} x", "{\"\": \"eager\"}{}", "{\"\": \"eager\"},"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(moex_experts_map_apply(&m, bad[i], 1), MOEX_ERR_INVALID_ARGUMENT);
        assert_true(contains(moex_last_error(), "unexpected text after the JSON object"));
        assert_memory_equal(&m, &before, sizeof m);
    }
    assert_int_equal(moex_experts_map_apply(&m, "  {\"\": \"eager\"} \n\t", 1), MOEX_OK); /* whitespace is fine */
    const char *const odd[] = {"a\"b_config", "c\\d_config", "e\nf_config"};
    moex_experts_map o;
    assert_int_equal(moex_experts_map_init(&o, odd, 3), MOEX_OK);
    char buf[512];
    assert_int_equal(moex_experts_map_to_json(&o, buf, sizeof buf), MOEX_OK);
    assert_string_equal(buf, "{\"\": \"grouped_mm\", \"a\\\"b_config\": \"grouped_mm\", \"c\\\\d_config\": "
                             "\"grouped_mm\", \"e\\u000af_config\": \"grouped_mm\"}");
    /* it parses back: applying it as a map names the same keys */
    assert_int_equal(moex_experts_map_apply(&o, buf, 0), MOEX_OK);
    /* too small a buffer: refused with the size needed, nothing written */
    char small[40];
    memset(small, 'z', sizeof small);
    assert_int_equal(moex_experts_map_to_json(&o, small, sizeof small), MOEX_ERR_INVALID_ARGUMENT);
    assert_true(contains(moex_last_error(), "needs"));
    for (size_t i = 0; i < sizeof small; i++) assert_int_equal(small[i], 'z');
    assert_int_equal(moex_experts_map_to_json(&o, small, strlen(buf)), MOEX_ERR_INVALID_ARGUMENT); /* no room for NUL */
    char exact[512];
    assert_int_equal(moex_experts_map_to_json(&o, exact, strlen(buf) + 1), MOEX_OK);
    assert_string_equal(exact, buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_and_name),        cmocka_unit_test(test_named_wins_over_global),
        cmocka_unit_test(test_runtime_map_keeps_unnamed), cmocka_unit_test(test_bad_keys_and_names),
        cmocka_unit_test(test_megamoe_is_load_time_only), cmocka_unit_test(test_decode_switch),
        cmocka_unit_test(test_trailing_text_and_escapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
