/* Fast path for loading big tokenizer.json files: model.vocab and
 * model.merges (gemma3: 262k + 515k entries, nearly all of its 33 MB) are
 * scanned straight from the file text into flat lists, then cut out of
 * it so that cJSON only parses the small rest. Building 2M cJSON nodes
 * would otherwise be most of the load time.
 *
 * The scanner accepts only plainly well-formed input (integer ids, the
 * usual string escapes); on anything else it reports "not handled" and the
 * caller parses the untouched text with cJSON alone, which then gives the
 * precise error. */
#ifndef DS_TOK_VOCAB_SCAN_H
#define DS_TOK_VOCAB_SCAN_H

#include <stdbool.h>
#include <stddef.h>

#include "tokenizer/bpe.h"

typedef struct {
    ds_bpe_lists lists;
    char *strings; /* decoded token strings the lists point into */
    size_t cut_at[2], cut_len[2], n_cuts; /* what was cut out, in order */
} ds_vocab_scan;

/* Scans text[0..*len) (NUL-terminated); on success (true) the two values are replaced by
 * "{}" / "[]" in text (*len shrinks) and *out holds their contents. On
 * false text is unchanged and *out empty. */
bool ds_vocab_scan_run(char *text, size_t *len, ds_vocab_scan *out);
void ds_vocab_scan_free(ds_vocab_scan *s);
/* Maps an offset in the cut text back to the original file. */
size_t ds_vocab_scan_orig_offset(const ds_vocab_scan *s, size_t off);

#endif
