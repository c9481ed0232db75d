/* tokenizer.json "post_processor": what add_special adds around the ids.
 * TemplateProcessing (single template), BertProcessing, RobertaProcessing,
 * ByteLevel (offsets only: adds nothing) and Sequence of those. */
#ifndef DS_TOK_POSTPROCESS_H
#define DS_TOK_POSTPROCESS_H

#include <cjson/cJSON.h>

#include "dspark.h"
#include "tokenizer/strbuf.h"

typedef struct ds_postproc ds_postproc;

/* j: the "post_processor" value (NULL/null gives *out = NULL). max_id
 * bounds the ids it may add. */
ds_error *ds_postproc_parse(const cJSON *j, long long max_id, ds_postproc **out);
void ds_postproc_free(ds_postproc *pp);
/* Replaces ids with the processed sequence (pp may be NULL). */
ds_error *ds_postproc_apply(const ds_postproc *pp, ds_ids *ids);

#endif
