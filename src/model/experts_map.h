/* experts_map.h — which experts backend each part of a model runs (SPEC R3, R4).
 *
 * A model has an entry "" (the top-level model) and one per sub-config of its
 * checkpoint (text_config, vision_config, ...), whether or not that sub-config
 * has MoE layers. Each entry names a registered backend.
 *   - At load: one name for every entry, or a JSON map; "" sets the top-level
 *     entry and every sub-config the map does not name; a named sub-config wins
 *     over "". Default: grouped_mm.
 *   - At run time: the same, applied to the current map (entries the map does
 *     not reach keep their backend). deepgemm_megamoe is a load-time choice only.
 *   - Decode-step switch: on CUDA, grouped_mm entries run batched_mm during the
 *     decode steps of a generation and are restored when it ends, whatever way.
 */
#ifndef MOEX_MODEL_EXPERTS_MAP_H
#define MOEX_MODEL_EXPERTS_MAP_H

#include "moex.h"
#include "model/config.h"

/* "" and every sub-config a config.json may list, names as long as it keeps them */
#define MOEX_MAP_MAX_ENTRIES (1 + MOEX_CONFIG_MAX_SUB)
#define MOEX_MAP_KEY_LEN MOEX_CONFIG_NAME_LEN
#define MOEX_MAP_NAME_LEN 64

typedef struct moex_experts_map {
    int n;                                        /* entries; [0] is "" */
    char keys[MOEX_MAP_MAX_ENTRIES][MOEX_MAP_KEY_LEN];
    char names[MOEX_MAP_MAX_ENTRIES][MOEX_MAP_NAME_LEN];
} moex_experts_map;

/* A map with "" and the given sub-configs, every entry on grouped_mm. */
moex_status moex_experts_map_init(moex_experts_map *m, const char *const *subconfigs, int n_subconfigs);

/* Apply spec (a backend name, or a JSON object of key -> name) to *m. Unknown
 * keys and names fail with messages listing the valid ones; at_load = 0 also
 * refuses switching to or from deepgemm_megamoe. On failure *m is unchanged. */
moex_status moex_experts_map_apply(moex_experts_map *m, const char *spec, int at_load);

/* The backend of entry key ("" or a sub-config name), or NULL. */
const char *moex_experts_map_get(const moex_experts_map *m, const char *key);

/* The map as a JSON object, e.g. {"": "grouped_mm", "text_config": "eager"}. */
moex_status moex_experts_map_to_json(const moex_experts_map *m, char *buf, size_t size);

/* The map the decode steps use on devices of kind `device`: when enabled, a copy of m with each
 * backend replaced by the one the dispatch table decodes with (on CUDA: grouped_mm by batched_mm);
 * otherwise an unchanged copy. */
void moex_experts_map_for_decode(const moex_experts_map *m, moex_device_kind device, int enabled, moex_experts_map *out);

/* Run step(user) with *m switched for decode (as above), then restore *m,
 * whatever step returns. Returns step's status. */
moex_status moex_experts_map_run_decode(moex_experts_map *m, moex_device_kind device, int enabled,
                                        moex_status (*step)(void *user), void *user);

#endif
