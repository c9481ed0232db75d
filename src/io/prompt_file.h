/* A prompt file (`dspark generate --prompt-file`): JSON Lines, one object a
 * line, each giving its prompt as exactly what the model will see:
 *   {"input_ids": [...]}            ids used as given (no BOS added)
 *   {"messages": [{"role", "content"}...]}   rendered by a chat template
 *   {"prompt": "..."}               text for the tokenizer
 * checked in that order, so a line carrying ids next to its text (as
 * models/prompts-dev.jsonl does) is generated from its ids. An optional
 * "id" of any JSON type is carried through to the output. Blank lines are
 * skipped. Parsing checks the shape only (ids are integers >= 0); whether they are
 * inside a model's vocabulary is checked by ds_generate, which knows it. */
#ifndef DS_PROMPT_FILE_H
#define DS_PROMPT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "tokenizer/chat_template.h"

struct cJSON;

typedef enum { DS_PROMPT_TEXT, DS_PROMPT_IDS, DS_PROMPT_MESSAGES } ds_prompt_kind;

typedef struct {
    int line;            /* 1-based line in its file (0 for a lone line) */
    ds_prompt_kind kind;
    char *text;          /* DS_PROMPT_TEXT: the "prompt" string */
    int32_t *ids;        /* DS_PROMPT_IDS: "input_ids", n_ids of them */
    size_t n_ids;
    ds_chat_message *messages; /* DS_PROMPT_MESSAGES: role/content owned by the prompt */
    size_t n_messages;
    struct cJSON *id;    /* the line's "id" (a copy), or NULL */
} ds_prompt;

typedef struct {
    ds_prompt *items;
    size_t n;
} ds_prompt_list;

/* Parses one line (len bytes, need not be NUL-terminated) into *out. The
 * error names the field at fault, e.g. "input_ids[3] = 3.5 is not an integer
 * token id"; the caller adds file:line. */
ds_error *ds_prompt_parse_line(const char *line, size_t len, ds_prompt *out);

/* Parses a whole buffer of JSON Lines; errors read "<name>:<line>: ...". */
ds_error *ds_prompt_file_parse(const char *name, const char *buf, size_t len, ds_prompt_list *out);

/* Reads and parses path; "-" reads standard input. */
ds_error *ds_prompt_file_read(const char *path, ds_prompt_list *out);

void ds_prompt_free(ds_prompt *p);
void ds_prompt_list_free(ds_prompt_list *l);

#endif
