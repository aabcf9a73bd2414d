/* A reward that misbehaves on purpose, for the isolation tests: from optimizer step `from_step` on,
 * score() does `behaviour`: segfault, abort, exit, hang, garbage (prints binary noise to stdout and
 * stderr, then scores), fail (returns an error), or fine. Before that step it scores like the
 * length reward would: 1.0 per row, and logs "misbehaving/calls". */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

typedef struct {
    char behaviour[16];
    int64_t from_step;
} misbehaving;

static grove_status create(const grove_config* config, void** instance, grove_error_sink* err) {
    misbehaving* m = (misbehaving*)calloc(1, sizeof(misbehaving));
    (void)err;
    strncpy(m->behaviour, grove_config_string(config, "behaviour", "fine"), sizeof m->behaviour - 1);
    m->from_step = grove_config_int(config, "from_step", 0);
    *instance = m;
    return GROVE_OK;
}

static void destroy(void* instance) { free(instance); }

static grove_status score(void* instance, const grove_reward_batch* batch, grove_reward_output* out, grove_error_sink* err) {
    const misbehaving* m = (const misbehaving*)instance;
    uint32_t i;
    if (batch->step >= m->from_step) {
        if (!strcmp(m->behaviour, "segfault")) raise(SIGSEGV);
        if (!strcmp(m->behaviour, "abort")) abort();
        if (!strcmp(m->behaviour, "exit")) exit(7);
        if (!strcmp(m->behaviour, "hang"))
            for (;;) pause();
        if (!strcmp(m->behaviour, "fail")) return grove_fail(err, GROVE_ERROR_INTERNAL, NULL, "the judge is unreachable");
        if (!strcmp(m->behaviour, "garbage")) {
            static const unsigned char noise[] = {0x47, 0x52, 0x56, 0x57, 0xff, 0x00, 0x13, 0x37, 0x0a};
            fwrite(noise, 1, sizeof noise, stdout);
            fflush(stdout);
            (void)!write(1, noise, sizeof noise);
            fwrite(noise, 1, sizeof noise, stderr);
        }
    }
    for (i = 0; i < batch->count; ++i) out->scores[i] = 1.0f;
    out->log_metric(out, "misbehaving/calls", 1.0);
    return GROVE_OK;
}

static const grove_reward_api api = {sizeof(grove_reward_api), score};
static const grove_config_key keys[] = {
    {sizeof(grove_config_key), "behaviour", GROVE_VALUE_STRING, 0, "\"fine\"", "segfault|abort|exit|hang|garbage|fail|fine"},
    {sizeof(grove_config_key), "from_step", GROVE_VALUE_INT, 0, "0", "the first step that misbehaves"}};
static const grove_plugin_descriptor d = {sizeof(grove_plugin_descriptor),
                                          GROVE_PLUGIN_KIND_REWARD,
                                          "misbehaving",
                                          "1.0.0",
                                          "a reward that crashes, hangs or prints noise on purpose",
                                          0,
                                          keys,
                                          2,
                                          NULL,
                                          0,
                                          create,
                                          destroy,
                                          &api,
                                          NULL,
                                          NULL};
ONE_PLUGIN_LIBRARY(d, GROVE_ABI_MAJOR, GROVE_ABI_MINOR)
