/* libFuzzer harness: a --prompt-file (JSON Lines) through
 * ds_prompt_file_read, what `dspark generate --prompt-file` calls. Input:
 * the whole file. Each prompt it accepts must be what its kind promises
 * (ids: at least one, each >= 0; text; messages with a role and content);
 * messages are then rendered by every chat template family, as generate
 * renders them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_file.h"
#include "io/prompt_file.h"

static void broken(const ds_prompt *p, const char *why) {
    fprintf(stderr, "fuzz_prompt_file: accepted line %d: %s\n", p->line, why);
    abort();
}

static void use(const ds_prompt *p) {
    switch (p->kind) {
    case DS_PROMPT_IDS:
        if (!p->ids || p->n_ids == 0) broken(p, "ids prompt without ids");
        for (size_t i = 0; i < p->n_ids; i++)
            if (p->ids[i] < 0) broken(p, "a negative id");
        break;
    case DS_PROMPT_TEXT:
        if (!p->text) broken(p, "text prompt without text");
        break;
    case DS_PROMPT_MESSAGES:
        if (!p->messages || p->n_messages == 0) broken(p, "messages prompt without messages");
        for (size_t i = 0; i < p->n_messages; i++)
            if (!p->messages[i].role || !p->messages[i].content) broken(p, "a message without role or content");
        for (ds_chat_family f = DS_CHAT_CHATML_QWEN3; f <= DS_CHAT_GEMMA4; f++) {
            char *text = NULL;
            ds_error *e = ds_chat_render(f, p->messages, p->n_messages, true, &text);
            if (!e && !text) broken(p, "a render without text");
            ds_fuzz_consume(e);
            free(text);
        }
        break;
    default:
        broken(p, "an unknown kind");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ds_fuzz_file("prompts.jsonl", data, size);
    ds_prompt_list list = {0};
    ds_error *e = ds_prompt_file_read(path, &list);
    if (e) {
        ds_fuzz_consume(e);
    } else {
        for (size_t i = 0; i < list.n; i++) use(&list.items[i]);
    }
    ds_prompt_list_free(&list);
    return 0;
}
