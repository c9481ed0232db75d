/* A prompt file's prompt as ids for the engine: input_ids as given, chat messages through the model's
 * template, text through the tokenizer (calibrate's and train's validation prompts; generate adds --chat). */
#ifndef DS_PROMPT_IDS_H
#define DS_PROMPT_IDS_H

#include "dspark.h"
#include "io/prompt_file.h"

/* *ids malloc'd (*n of them). A text prompt without a tokenizer is an error saying so. */
ds_error *cli_prompt_ids(ds_engine *eng, const ds_prompt *p, int32_t **ids, size_t *n);

#endif
