/* Chat prompts rendered exactly as each model's own Jinja chat template
 * renders them through transformers' apply_chat_template(messages,
 * tokenize=False, add_generation_prompt=..., enable_thinking=False). There
 * is no Jinja engine here: each supported template family has a renderer
 * written from that template's logic for text-only system / user /
 * assistant messages (no tools, images or reasoning_content fields), and
 * the goldens in testdata/chat/ hold every renderer to the real template
 * byte for byte.
 *
 * Thinking is always off, as DeepSpec's evaluator renders prompts
 * (enable_thinking=False): Qwen3's generation prompt ends with an empty
 * "<think>\n\n</think>\n\n" block, Gemma 4's with an empty
 * "<|channel>thought\n<channel|>" channel.
 *
 * Encoding the result: pass the text to ds_tokenizer_encode with
 * add_special = false, as apply_chat_template(tokenize=True) does. The
 * Gemma templates write "<bos>" into the text themselves (and it is matched
 * as the special token); add_special = true would add a second BOS through
 * the tokenizer's post-processor. Qwen3's template writes no BOS and its
 * tokenizer adds none, so the text is the whole prompt there too.
 *
 * Family notes (what the renderers reproduce, quirks included):
 *  - Qwen3 (ChatML): contents verbatim (no trimming); a leading system
 *    message opens the prompt; assistant turns before the last user query
 *    lose any <think>...</think> part; one after it keeps its reasoning in
 *    a <think> block, and if it is the final message it gets one even when
 *    empty; a user message wrapped in <tool_response>...</tool_response>
 *    does not count as a query.
 *  - Gemma 3: "<bos>"; a leading system message is folded, untrimmed and
 *    followed by "\n\n", into the first turn after it; other contents are
 *    trimmed (Python str.strip()); roles after the system message must
 *    alternate user/assistant starting with user, or the template raises
 *    (here: an error); assistant is written as "model".
 *  - Gemma 4 (google/gemma-4-12B-it's template as of revision 657684f,
 *    shared by 26B-A4B-it, which closes an empty thought channel in the
 *    generation prompt; testdata/chat/README.md has the exact text and its
 *    provenance): "<bos>"; a leading system message becomes a trimmed
 *    "<|turn>system" turn; user contents are trimmed, assistant contents
 *    lose <|channel>...<channel|> thought parts and are trimmed; an
 *    assistant message right after another continues its turn (no new
 *    "<|turn>model" header). Later upstream revisions also open historical
 *    assistant turns with the empty thought channel; single-turn prompts
 *    (what DeepSpec evaluates) are the same in every revision. */
#ifndef DS_TOK_CHAT_TEMPLATE_H
#define DS_TOK_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "dspark.h"

/* ds_chat_message (a role and its content) is public: include/dspark.h. */

typedef enum { DS_CHAT_UNKNOWN, DS_CHAT_CHATML_QWEN3, DS_CHAT_GEMMA3, DS_CHAT_GEMMA4 } ds_chat_family;

/* Picks the family of the chat template a model directory ships, looked up
 * where transformers looks: chat_template.jinja first, then
 * tokenizer_config.json's "chat_template" (a string, or a list of named
 * templates of which "default" is used), then the legacy processor file
 * chat_template.json. A directory without a template, or with one that is
 * none of the three families, is an error that names the directory and its
 * config.json model_type; *out is then DS_CHAT_UNKNOWN. */
ds_error *ds_chat_detect(const char *model_dir, ds_chat_family *out);

/* Classifies template text by its signature strings; `where` names its
 * source in errors. Gemma 4 (`<|turn>`) is tested first because its
 * templates may mention older markers; a Gemma 4 template without the
 * empty thought channel in its generation prompt (gemma-4-E2B/E4B-it) and
 * a ChatML template without Qwen3's enable_thinking switch (Qwen2.5,
 * Qwen3-*-Instruct-2507) are refused rather than rendered wrongly. */
ds_error *ds_chat_detect_template(const char *template_text, const char *where, ds_chat_family *out);

/* Renders msgs[0..n) (n >= 1) to *out (malloc'd, NUL-terminated). Roles
 * other than system/user/assistant, NULL fields, invalid UTF-8 and what the
 * template itself refuses (Gemma 3's role alternation) are errors naming
 * the message. */
ds_error *ds_chat_render(ds_chat_family f, const ds_chat_message *msgs, size_t n, bool add_generation_prompt,
                         char **out);

/* "qwen3-chatml", "gemma3", "gemma4" or "unknown", for messages. */
const char *ds_chat_family_name(ds_chat_family f);

#endif
