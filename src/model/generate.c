/* generate.c — batched generation: prefill the prompts together (in steps of at
 * most max_tokens tokens), then one token per unfinished prompt per step, greedy or sampled, stopping at the
 * checkpoint's end-of-sequence ids. Decode steps run under the decode-step
 * switch of the backend map (SPEC R3). */
#include "model/model_internal.h"
#include "experts/ep_group.h"
#include <math.h>
#include <stdlib.h>
#include <time.h>

moex_generate_options moex_generate_default_options(void) {
    moex_generate_options o;
    memset(&o, 0, sizeof o);
    o.max_new_tokens = 16;
    o.top_p = 1.0f;
    return o;
}

void moex_generation_free(moex_generation *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        if (g->new_ids) free(g->new_ids[i]);
        if (g->last_prompt_logits) free(g->last_prompt_logits[i]);
    }
    free(g->new_ids);
    free(g->last_prompt_logits);
    free(g->num_new);
    free(g);
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct gen_state {
    moex_model *m;
    const moex_generate_options *o;
    moex_generation *g;
    moex_sampling sampling;
    moex_rng rng;
    float *logits;        /* [n, V] */
    int32_t *last;        /* [n] the token each prompt feeds next */
    int64_t *past;        /* [n] */
    int *done;            /* [n] */
    int64_t *tokens;      /* [n] greedy tokens chosen by the step */
    int64_t decode_steps; /* decode steps run so far */
} gen_state;

static int is_eos(const moex_config *c, int64_t tok) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == tok) return 1;
    return 0;
}

// Record tok as prompt i's next token; mark it finished at an end-of-sequence id or its last token.
static void accept(gen_state *s, int64_t i, int64_t tok) {
    s->g->new_ids[i][s->g->num_new[i]++] = (int32_t)tok;
    s->last[i] = (int32_t)tok;
    if (s->o->on_token) s->o->on_token(s->o->user, (int)i, (int32_t)tok);
    if ((!s->o->ignore_eos && is_eos(&s->m->cfg, tok)) || s->g->num_new[i] >= s->o->max_new_tokens) s->done[i] = 1;
}

// An expert-parallel model's agreement before a step (moex_generate): every rank gives its status
// and whether it has a step to run; *go: some rank has. A failure anywhere fails every rank: with
// its own status, or a message naming the first rank that failed. Without a group: *go = have,
// and mine as given.
static moex_status ep_agree(moex_model *m, moex_status mine, int have, int *go) {
    moex_ep_group *g = m->opt.ep_group;
    *go = have;
    if (!g) return mine;
    const int R = moex_ep_group_size(g), me = moex_ep_group_rank(g);
    int64_t said[2] = {(int64_t)mine, have}, all[2 * MOEX_EP_MAX_RANKS];
    moex_status st = moex_ep_all_gather(g, said, sizeof said, all);
    if (mine || st) return mine ? mine : st;
    int any = 0;
    for (int r = 0; r < R; r++) {
        if (all[2 * r] != MOEX_OK && r != me)
            return moex_fail((moex_status)all[2 * r], "expert parallelism: rank %d of %d failed (%s), so every rank stops",
                             r, R, moex_status_str((moex_status)all[2 * r]));
        any |= all[2 * r + 1] != 0;
    }
    *go = any;
    return MOEX_OK;
}

// A step that failed: an expert-parallel rank still tells the others at their next agreement.
static moex_status step_failed(moex_model *m, moex_status st) {
    int go;
    if (m->opt.ep_group) ep_agree(m, st, 0, &go);
    return st;
}

// Choose each active prompt's next token from its logits row; mark finished ones.
static moex_status pick(gen_state *s, const int64_t *rows, int64_t nrows) {
    const int64_t V = s->m->cfg.vocab_size;
    for (int64_t r = 0; r < nrows; r++) {
        int64_t tok;
        const float *lg = s->logits + r * V;
        moex_status st = s->o->temperature > 0 ? moex_sample(lg, V, &s->sampling, &s->rng, &tok)
                                               : moex_sample_greedy(lg, V, &tok);
        if (st) return st;
        accept(s, rows[r], tok);
    }
    return MOEX_OK;
}

// The step's argmax tokens s->tokens[r] as prompt rows[r]'s next tokens, r < k; none if a row
// had a NaN logit (marked -1 - its index).
static moex_status accept_greedy(gen_state *s, const int64_t *rows, int64_t k) {
    for (int64_t r = 0; r < k; r++)
        if (s->tokens[r] < 0)
            return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "sample_greedy: logits[%lld] is NaN (prompt %lld)",
                             (long long)(-1 - s->tokens[r]), (long long)rows[r]);
    for (int64_t r = 0; r < k; r++) accept(s, rows[r], s->tokens[r]);
    return MOEX_OK;
}

// One decode step of k sequences. A greedy step brings back only the tokens (the argmax of
// the step's op table: on CUDA the logits stay on the device); with cuda_graph it replays the
// step captured for k sequences.
static moex_status decode_step(gen_state *s, const model_step_seq *seqs, const int64_t *rows, int64_t k) {
    moex_model *m = s->m;
    if (m->inject_decode_error > 0 && ++s->decode_steps == m->inject_decode_error) {
        m->inject_decode_error = 0;
        return moex_fail(MOEX_ERR_DEVICE, "decode step %lld failed on purpose (test hook)", (long long)s->decode_steps);
    }
    const int greedy = !(s->o->temperature > 0);
    moex_status st = model_step(m, seqs, k, s->logits, greedy ? s->tokens : NULL, s->o->cuda_graph);
    if (st || !greedy) return st ? st : pick(s, rows, k);
    return accept_greedy(s, rows, k);
}

// Decode steps until every prompt is done (run under the decode-step switch); an expert-parallel
// rank until every rank's are, running idle steps once its own are.
static moex_status decode_all(void *user) {
    gen_state *s = user;
    const int n = s->g->n;
    model_step_seq seqs[n > 0 ? n : 1];
    int64_t rows[n > 0 ? n : 1];
    for (;;) {
        int64_t k = 0;
        for (int i = 0; i < n; i++) {
            if (s->done[i]) continue;
            seqs[k] = (model_step_seq){i, s->past[i], 1, &s->last[i]};
            rows[k++] = i;
        }
        int go;
        moex_status st = ep_agree(s->m, MOEX_OK, k > 0, &go);
        if (st || !go) return st;
        if (k == 0) {
            if ((st = model_step_idle(s->m))) return step_failed(s->m, st);
            continue;
        }
        st = decode_step(s, seqs, rows, k);
        if (st) return step_failed(s->m, st);
        for (int64_t r = 0; r < k; r++) s->past[rows[r]] += 1;
        s->g->decode_tokens += k;
    }
}

static moex_status check_args(const moex_model *m, int n, const int32_t *const *prompts, const int64_t *lens,
                              const moex_generate_options *o) {
    if (!m || !o || (n > 0 && (!prompts || !lens)))
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_generate: null argument");
    const int least = m->opt.ep_group ? 0 : 1; /* an expert-parallel rank may have no prompts */
    if (n < least || n > m->opt.max_batch)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "%d prompts; the model was loaded for %d to max_batch = %lld", n, least,
                         (long long)m->opt.max_batch);
    if (o->cuda_graph && !m->gpu)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "cuda_graph = %d: graph-captured decode needs a model loaded on cuda",
                         o->cuda_graph);
    if (o->cuda_graph && m->opt.ep_group)
        return moex_fail(MOEX_ERR_UNSUPPORTED, "cuda_graph = %d: an expert-parallel rank's decode step cannot be captured "
                         "(its ranks meet on the host in every MoE layer); generate with cuda_graph = 0", o->cuda_graph);
    if (o->max_new_tokens < 0) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "max_new_tokens = %lld is negative", (long long)o->max_new_tokens);
    if (!(o->temperature >= 0) || !isfinite(o->temperature) || !(o->top_p > 0 && o->top_p <= 1) || o->top_k < 0)
        return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "temperature = %g, top_k = %lld, top_p = %g: need a finite temperature >= 0, top_k >= 0, 0 < top_p <= 1",
                         (double)o->temperature, (long long)o->top_k, (double)o->top_p);
    for (int i = 0; i < n; i++) {
        if (!prompts[i] || lens[i] < 1) return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "prompt %d is empty", i);
        for (int64_t j = 0; j < lens[i] && lens[i] <= m->opt.max_seq; j++) /* (a step checks them too: too late for a group) */
            if (prompts[i][j] < 0 || prompts[i][j] >= m->cfg.vocab_size)
                return moex_fail(MOEX_ERR_INVALID_ARGUMENT, "token %lld of prompt %d is %d, outside [0, %lld)",
                                 (long long)j, i, (int)prompts[i][j], (long long)m->cfg.vocab_size);
        if (lens[i] > m->opt.max_seq || o->max_new_tokens > m->opt.max_seq - lens[i])
            return moex_fail(MOEX_ERR_WORKSPACE, "prompt %d: %lld tokens + %lld new exceed max_seq = %lld", i,
                             (long long)lens[i], (long long)o->max_new_tokens, (long long)m->opt.max_seq);
    }
    return MOEX_OK;
}

static moex_generation *alloc_generation(int n, int64_t V, int64_t max_new, int want_logits) {
    moex_generation *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->n = n;
    g->vocab = V;
    const size_t rows = (size_t)(n > 0 ? n : 1); /* an expert-parallel rank may have none */
    g->num_new = calloc(rows, sizeof *g->num_new);
    g->new_ids = calloc(rows, sizeof *g->new_ids);
    if (want_logits) g->last_prompt_logits = calloc(rows, sizeof *g->last_prompt_logits);
    int ok = g->num_new && g->new_ids && (!want_logits || g->last_prompt_logits);
    for (int i = 0; ok && i < n; i++) {
        ok = (g->new_ids[i] = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t))) != NULL;
        if (ok && want_logits) ok = (g->last_prompt_logits[i] = malloc((size_t)V * sizeof(float))) != NULL;
    }
    if (!ok) {
        moex_generation_free(g);
        return NULL;
    }
    return g;
}

// Prefill every prompt in one step, pick the first new tokens, then decode.
// Prefill in steps of at most max_tokens tokens: each step takes the next piece of every
// unfinished prompt, in prompt order, until the step is full. A prompt's logits come from
// the step that reaches its end; they land in row i of s->logits, or, with step_tokens (a greedy
// first token whose logits nobody asked for), only their argmax in s->tokens[i] (on CUDA the
// logits then stay on the device).
static moex_status prefill(gen_state *s, int n, const int32_t *const *prompts, const int64_t *lens, float *step_logits,
                           int64_t *step_tokens) {
    moex_model *m = s->m;
    const int64_t V = m->cfg.vocab_size;
    model_step_seq seqs[n > 0 ? n : 1];
    int64_t fed[n > 0 ? n : 1], who[n > 0 ? n : 1];
    memset(fed, 0, sizeof fed);
    for (;;) {
        int64_t k = 0, room = m->opt.max_tokens;
        for (int i = 0; i < n && room > 0; i++) {
            if (fed[i] == lens[i]) continue;
            int64_t take = lens[i] - fed[i] < room ? lens[i] - fed[i] : room;
            seqs[k] = (model_step_seq){i, fed[i], take, prompts[i] + fed[i]};
            who[k++] = i;
            room -= take;
        }
        int go;
        moex_status st = ep_agree(m, MOEX_OK, k > 0, &go);
        if (st || !go) return st;
        if (k == 0) { /* an expert-parallel rank whose prompts are in: the others' pieces go on */
            if ((st = model_step_idle(m))) return step_failed(m, st);
            continue;
        }
        st = model_step(m, seqs, k, step_logits, step_tokens, 0);
        if (st) return step_failed(m, st);
        for (int64_t r = 0; r < k; r++) {
            int64_t i = who[r];
            fed[i] += seqs[r].n_new;
            if (fed[i] < lens[i]) continue;
            if (step_tokens)
                s->tokens[i] = step_tokens[r];
            else
                memcpy(s->logits + i * V, step_logits + r * V, (size_t)V * sizeof(float));
        }
    }
}

// The first new token of each unfinished prompt from the prefill's argmax (s->tokens[i] for
// prompt i, compacted to the unfinished ones). rows: scratch of n.
static moex_status accept_first(gen_state *s, int n, int64_t *rows) {
    int64_t active = 0;
    for (int i = 0; i < n; i++) {
        if (s->done[i]) continue;
        s->tokens[active] = s->tokens[i];
        rows[active++] = i;
    }
    return accept_greedy(s, rows, active);
}

// The first new token of each unfinished prompt from its last-prompt logits (s->logits, row i),
// which are kept first when asked for. rows: scratch of n.
static moex_status pick_first(gen_state *s, int n, int64_t *rows) {
    const int64_t V = s->m->cfg.vocab_size;
    if (s->o->want_logits)
        for (int i = 0; i < n; i++) memcpy(s->g->last_prompt_logits[i], s->logits + (int64_t)i * V, (size_t)V * sizeof(float));
    int64_t active = 0; /* pick() reads row r for rows[r]: compact the rows of the prompts still going */
    for (int i = 0; i < n; i++) {
        if (s->done[i]) continue;
        if (active != i) memcpy(s->logits + active * V, s->logits + (int64_t)i * V, (size_t)V * sizeof(float));
        rows[active++] = i;
    }
    return pick(s, rows, active);
}

// st: what moex_generate found before (an expert-parallel rank says it to the others first).
static moex_status run(gen_state *s, moex_status st, int n, const int32_t *const *prompts, const int64_t *lens) {
    moex_model *m = s->m;
    const moex_generate_options *o = s->o;
    const int64_t V = m->cfg.vocab_size;
    int64_t rows[n > 0 ? n : 1];
    for (int i = 0; i < n && !st; i++) {
        st = model_kv_reset(m, i);
        s->past[i] = lens[i];
        s->g->prefill_tokens += lens[i];
        s->done[i] = o->max_new_tokens == 0;
    }
    /* a greedy first token without the prompts' logits: the step's argmax only */
    const int argmax_only = !(o->temperature > 0) && !o->want_logits;
    float *step_logits = st ? NULL : malloc((size_t)(n > 0 ? n : 1) * (size_t)V * sizeof(float));
    int64_t *step_tokens = st || !argmax_only ? NULL : malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!st && (!step_logits || (argmax_only && !step_tokens)))
        st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_generate: out of memory");
    int go;
    if ((st = ep_agree(m, st, 1, &go))) { /* every rank ready (or none goes on) */
        free(step_logits);
        free(step_tokens);
        return st;
    }
    double t0 = seconds();
    st = prefill(s, n, prompts, lens, step_logits, step_tokens);
    free(step_logits);
    free(step_tokens);
    if (st) return st;
    if ((st = argmax_only ? accept_first(s, n, rows) : pick_first(s, n, rows))) return step_failed(m, st);
    double t1 = seconds();
    s->g->prefill_seconds = t1 - t0;
    st = moex_experts_map_run_decode(&m->map, m->opt.device.kind, m->opt.decode_switch, decode_all, s);
    s->g->decode_seconds = seconds() - t1;
    return st;
}

moex_status moex_generate(moex_model *m, int n, const int32_t *const *prompts, const int64_t *lens,
                          const moex_generate_options *o, moex_generation **out) {
    moex_status st = check_args(m, n, prompts, lens, o);
    if (!m) return st;
    if (!st && !out) st = moex_fail(MOEX_ERR_INVALID_ARGUMENT, "moex_generate: out is NULL");
    /* on the cpu the weights are read from the checkpoint's mapping: the files must be as loaded
     * (on cuda every weight was copied to the device at load) */
    if (!st && !m->gpu) st = moex_checkpoint_verify(m->ckpt);
    /* an expert-parallel rank goes on to tell the others (run's first agreement) */
    if (st && !m->opt.ep_group) return st;
    const int64_t V = m->cfg.vocab_size;
    const size_t rows = (size_t)(n > 0 ? n : 1);
    const int64_t max_new = !st ? o->max_new_tokens : 0;
    gen_state s = {m, o, alloc_generation(!st ? n : 0, V, max_new, !st && o->want_logits), moex_sampling_default(), {{0}},
                   malloc(rows * (size_t)V * sizeof(float)), malloc(rows * sizeof(int32_t)),
                   calloc(rows, sizeof(int64_t)), calloc(rows, sizeof(int)), calloc(rows, sizeof(int64_t)), 0};
    if (!st && (!s.g || !s.logits || !s.last || !s.past || !s.done || !s.tokens))
        st = moex_fail(MOEX_ERR_OUT_OF_MEMORY, "moex_generate: out of memory");
    if (!st) {
        s.sampling.temperature = o->temperature;
        s.sampling.top_k = o->top_k;
        s.sampling.top_p = o->top_p;
        moex_rng_seed(&s.rng, o->seed);
    }
    if (!st || m->opt.ep_group) st = run(&s, st, st ? 0 : n, prompts, lens);
    free(s.logits);
    free(s.last);
    free(s.past);
    free(s.done);
    free(s.tokens);
    if (st) {
        moex_generation_free(s.g);
        return st;
    }
    *out = s.g;
    return MOEX_OK;
}
