#include "prompt_ids.h"

#include <stdlib.h>
#include <string.h>

ds_error *cli_prompt_ids(ds_engine *eng, const ds_prompt *p, int32_t **ids, size_t *n) {
    switch (p->kind) {
    case DS_PROMPT_IDS:
        *n = p->n_ids;
        if (!(*ids = malloc((*n ? *n : 1) * sizeof **ids))) return ds_errorf("out of memory");
        memcpy(*ids, p->ids, *n * sizeof **ids);
        return NULL;
    case DS_PROMPT_MESSAGES: return ds_engine_chat_encode(eng, p->messages, p->n_messages, ids, n);
    case DS_PROMPT_TEXT: break;
    }
    const ds_tokenizer *tok = ds_engine_tokenizer(eng);
    if (!tok) return ds_errorf("a text prompt needs a tokenizer: give --tokenizer PATH or input_ids");
    return ds_tokenizer_encode(tok, p->text, strlen(p->text), false, ids, n);
}
