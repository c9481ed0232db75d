/* Chat templates: every conversation of testdata/chat/<family>.jsonl
 * rendered byte-exact against transformers' apply_chat_template on the real
 * templates (and, for Qwen3 and Gemma 3, encoded to the same ids), the BOS
 * rule, detection from model directories, and the errors for templates and
 * messages dspark does not render. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testlib.h"
#include "tokenizer/chat_template.h"

/* ---- goldens ---------------------------------------------------------------- */

static void print_escaped(const char *what, const char *s) {
    fprintf(stderr, "    %s \"", what);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n') fputs("\\n", stderr);
        else if (c == '\\' || c == '"') fprintf(stderr, "\\%c", c);
        else if (c < 0x20) fprintf(stderr, "\\x%02x", c);
        else fputc(c, stderr);
    }
    fputs("\"\n", stderr);
}

/* The rendered text must encode (add_special = false, as
 * apply_chat_template tokenizes) to the golden ids. */
static void check_ids(ds_tokenizer *tok, const char *where, const char *text, const cJSON *golden) {
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    bool same = (size_t)cJSON_GetArraySize(golden) == n;
    size_t i = 0;
    for (const cJSON *c = golden->child; same && c; c = c->next, i++) same = ids[i] == (int32_t)c->valuedouble;
    CHECK(same, "%s: ids of the rendered text differ from HF's (%zu ids, golden %d)", where, n,
          cJSON_GetArraySize(golden));
    free(ids);
}

/* One golden line: render its messages and compare with "text", or expect
 * an error where the template raised. */
static void check_case(ds_chat_family f, const char *family, const cJSON *o, ds_tokenizer *tok) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(o, "add_generation_prompt");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    CHECK(cJSON_IsString(id) && cJSON_IsArray(msgs) && cJSON_IsBool(gen) &&
              (cJSON_IsString(text) || cJSON_IsString(err)),
          "%s: malformed golden line", family);
    if (!cJSON_IsString(id) || !cJSON_IsArray(msgs) || !cJSON_IsBool(gen)) return;
    char where[128];
    snprintf(where, sizeof where, "%s/%s", family, id->valuestring);

    size_t n = (size_t)cJSON_GetArraySize(msgs);
    ds_chat_message *m = calloc(n ? n : 1, sizeof *m);
    size_t i = 0;
    for (const cJSON *c = msgs->child; c; c = c->next, i++) {
        m[i].role = cJSON_GetObjectItemCaseSensitive(c, "role")->valuestring;
        m[i].content = cJSON_GetObjectItemCaseSensitive(c, "content")->valuestring;
    }
    char *out = NULL;
    ds_error *e = ds_chat_render(f, m, n, cJSON_IsTrue(gen), &out);
    if (cJSON_IsString(err)) {
        /* Gemma 3's template raises on these; the renderer must refuse too. */
        CHECK(e != NULL, "%s: rendered, but the template raises \"%s\"", where, err->valuestring);
        CHECK(!e || strstr(ds_error_message(e), "alternate"), "%s: unexpected error: %s", where,
              ds_error_message(e));
    } else if (e) {
        CHECK(false, "%s: %s", where, ds_error_message(e));
    } else {
        bool same = !strcmp(out, text->valuestring);
        CHECK(same, "%s: rendered text differs from the template's", where);
        if (!same) {
            print_escaped("got     ", out);
            print_escaped("expected", text->valuestring);
        }
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "ids");
        if (tok && cJSON_IsArray(ids)) check_ids(tok, where, out, ids);
    }
    ds_error_free(e);
    free(out);
    free(m);
}

static void run_goldens(ds_chat_family f, const char *family, const char *tokenizer) {
    char path[1024];
    snprintf(path, sizeof path, "%s/chat/%s.jsonl", DS_TESTDATA, family);
    char *data = read_text_file(path, NULL);
    CHECK(data != NULL, "cannot read %s", path);
    if (!data) return;
    ds_tokenizer *tok = tokenizer ? load_test_tokenizer(tokenizer) : NULL;
    int n = 0, rendered = 0;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save), n++) {
        cJSON *o = cJSON_Parse(line);
        CHECK(o != NULL, "%s line %d is not JSON", path, n + 1);
        if (!o) continue;
        rendered += cJSON_GetObjectItemCaseSensitive(o, "text") != NULL;
        check_case(f, family, o, tok);
        cJSON_Delete(o);
    }
    CHECK(rendered >= 5, "%s: only %d rendered cases", path, rendered);
    ds_tokenizer_free(tok);
    free(data);
}

static void test_qwen3_goldens(void) { run_goldens(DS_CHAT_CHATML_QWEN3, "qwen3", "qwen3"); }
static void test_gemma3_goldens(void) { run_goldens(DS_CHAT_GEMMA3, "gemma3", "gemma3"); }
static void test_gemma4_goldens(void) { run_goldens(DS_CHAT_GEMMA4, "gemma4", NULL); }

/* ---- BOS -------------------------------------------------------------------- */

/* Gemma's BOS is in the rendered text; encoding with add_special would add
 * a second one. Qwen3 has none either way. */
static void test_bos_comes_from_the_template(void) {
    ds_chat_message m[] = {{"user", "Hello"}};
    ds_tokenizer *tok = load_test_tokenizer("gemma3");
    if (!tok) return;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t bos = ds_tokenizer_token_id(tok, "<bos>");
    CHECK_OK(ds_chat_render(DS_CHAT_GEMMA3, m, 1, true, &text));
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), false, &ids, &n));
    CHECK(n > 2 && ids[0] == bos && ids[1] != bos, "gemma3: the prompt must start with exactly one <bos> (%d)", bos);
    free(ids);
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), true, &ids, &n));
    CHECK(n > 2 && ids[0] == bos && ids[1] == bos, "gemma3: add_special is expected to double the BOS");
    free(ids);
    free(text);
    ds_tokenizer_free(tok);

    tok = load_test_tokenizer("qwen3");
    if (!tok) return;
    CHECK_OK(ds_chat_render(DS_CHAT_CHATML_QWEN3, m, 1, true, &text));
    int32_t *plain = NULL;
    size_t n_plain = 0;
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), false, &plain, &n_plain));
    CHECK_OK(ds_tokenizer_encode(tok, text, strlen(text), true, &ids, &n));
    CHECK(n == n_plain && !memcmp(ids, plain, n * sizeof *ids), "qwen3: add_special should add nothing");
    CHECK(n_plain > 0 && plain[0] == ds_tokenizer_token_id(tok, "<|im_start|>"), "qwen3: prompt starts <|im_start|>");
    free(plain);
    free(ids);
    free(text);
    ds_tokenizer_free(tok);
}

/* ---- detection -------------------------------------------------------------- */

static void expect_family(const char *dir, ds_chat_family want) {
    ds_chat_family f = DS_CHAT_UNKNOWN;
    ds_error *e = ds_chat_detect(dir, &f);
    CHECK(e == NULL && f == want, "%s: detected %s (%s), want %s", dir, ds_chat_family_name(f), ds_error_message(e),
          ds_chat_family_name(want));
    ds_error_free(e);
}

/* Refused with an error that names the model directory and says why. */
static void expect_refused(const char *dir, const char *needle) {
    ds_chat_family f = DS_CHAT_CHATML_QWEN3;
    ds_error *e = ds_chat_detect(dir, &f);
    const char *msg = ds_error_message(e);
    CHECK(e && strstr(msg, dir) && strstr(msg, needle), "%s: want an error naming the directory and \"%s\", got: %s",
          dir, needle, msg);
    CHECK(f == DS_CHAT_UNKNOWN, "%s: family must be unknown after an error", dir);
    ds_error_free(e);
}

static void test_detect_real_models(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/qwen3", DS_TOKDATA);
    expect_family(dir, DS_CHAT_CHATML_QWEN3);
    snprintf(dir, sizeof dir, "%s/gemma3", DS_TOKDATA);
    expect_family(dir, DS_CHAT_GEMMA3);
    snprintf(dir, sizeof dir, "%s/chat/gemma4", DS_TESTDATA);
    expect_family(dir, DS_CHAT_GEMMA4);
    /* Llama 3's template is a real one that dspark does not render. */
    snprintf(dir, sizeof dir, "%s/llama3", DS_TOKDATA);
    expect_refused(dir, "not recognised");
    /* Llama 2's tokenizer_config.json has no template at all. */
    snprintf(dir, sizeof dir, "%s/llama2", DS_TOKDATA);
    expect_refused(dir, "no chat template");
    /* A Qwen3-architecture model without a template is still refused: HF
     * could not render a chat for it either. */
    snprintf(dir, sizeof dir, "%s/pico-qwen3", DS_MODELS);
    expect_refused(dir, "model_type \"qwen3\"");
    expect_refused("/nonexistent/model/dir", "no chat template");
}

/* A scratch model directory. */
typedef struct {
    char dir[64];
} scratch;

static bool scratch_new(scratch *s) {
    snprintf(s->dir, sizeof s->dir, "/tmp/ds_chat_XXXXXX");
    bool ok = mkdtemp(s->dir) != NULL;
    CHECK(ok, "mkdtemp failed");
    return ok;
}

static void scratch_write(const scratch *s, const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void scratch_remove(const scratch *s, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", s->dir, name);
    unlink(path);
}

static void scratch_free(scratch *s) {
    static const char *const names[] = {"chat_template.jinja", "tokenizer_config.json", "chat_template.json",
                                        "config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) scratch_remove(s, names[i]);
    rmdir(s->dir);
}

/* Signature fragments of the real templates. QWEN3_SIG goes inside a JSON
 * string, hence one more level of escaping: both reach the template text as
 * the two characters backslash-n, as Jinja sources write newlines. */
#define QWEN3_SIG                                                 \
    "{{ '<|im_start|>assistant\\\\n' }}{% if enable_thinking is false %}" \
    "{{ '<think>\\\\n\\\\n</think>\\\\n\\\\n' }}{% endif %}"
#define GEMMA4_SIG                                                                        \
    "{{- '<|turn>model\\n' -}}{%- if not enable_thinking -%}{{- '<|channel>thought\\n<channel|>' -}}" \
    "{%- endif -%}"

static void test_detect_sources(void) {
    scratch s;
    if (!scratch_new(&s)) return;
    scratch_write(&s, "config.json", "{\"model_type\": \"mystery\"}");
    expect_refused(s.dir, "model_type \"mystery\"");

    /* tokenizer_config.json's string template. */
    scratch_write(&s, "tokenizer_config.json", "{\"chat_template\": \"" QWEN3_SIG "\"}");
    expect_family(s.dir, DS_CHAT_CHATML_QWEN3);
    /* chat_template.jinja wins over it, as in transformers. */
    scratch_write(&s, "chat_template.jinja", GEMMA4_SIG);
    expect_family(s.dir, DS_CHAT_GEMMA4);
    scratch_remove(&s, "chat_template.jinja");

    /* The list form: the "default" template is the one used. */
    scratch_write(&s, "tokenizer_config.json",
                  "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"<|im_start|>\"},"
                  " {\"name\": \"default\", \"template\": \"<start_of_turn>\"}]}");
    expect_family(s.dir, DS_CHAT_GEMMA3);
    scratch_write(&s, "tokenizer_config.json", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}");
    expect_refused(s.dir, "none is \"default\"");
    scratch_write(&s, "tokenizer_config.json", "{\"chat_template\": 7}");
    expect_refused(s.dir, "tokenizer_config.json: chat_template is neither");
    scratch_write(&s, "tokenizer_config.json", "{\"chat_template\": ");
    expect_refused(s.dir, "tokenizer_config.json: invalid JSON");

    /* Without a template there, the legacy processor file is read. */
    scratch_write(&s, "tokenizer_config.json", "{\"eos_token\": \"<eos>\"}");
    scratch_write(&s, "chat_template.json", "{\"chat_template\": \"{{ bos_token }}<start_of_turn>\"}");
    expect_family(s.dir, DS_CHAT_GEMMA3);
    scratch_free(&s);
}

static void test_detect_refusals(void) {
    ds_chat_family f;
    /* gemma-4-E2B/E4B-it: bare model turn in the generation prompt. */
    CHECK_ERR(ds_chat_detect_template("{{- '<|turn>model\\n' -}}{{- '<|channel>thought\\n' + t + '\\n<channel|>' -}}",
                                      "e2b", &f),
              "E2B");
    CHECK(f == DS_CHAT_UNKNOWN, "refused template must leave the family unknown");
    /* Plain ChatML without Qwen3's thinking switch. */
    CHECK_ERR(ds_chat_detect_template("{{ '<|im_start|>' + m.role }}", "qwen2.5", &f), "enable_thinking");
    CHECK_ERR(ds_chat_detect_template("{{ messages }}", "some/model/tokenizer_config.json", &f),
              "some/model/tokenizer_config.json: chat template not recognised");
    /* A Gemma 4 template that also mentions Gemma 3's marker is Gemma 4. */
    CHECK_OK(ds_chat_detect_template("{# <start_of_turn> #}" GEMMA4_SIG, "g4", &f));
    CHECK(f == DS_CHAT_GEMMA4, "Gemma 4 must be tested before Gemma 3");
}

/* ---- render errors ---------------------------------------------------------- */

static void test_render_errors(void) {
    char *out = (char *)"untouched";
    ds_chat_message ok[] = {{"user", "hi"}};
    CHECK_ERR(ds_chat_render(DS_CHAT_CHATML_QWEN3, ok, 0, true, &out), "no messages");
    CHECK(out == NULL, "out must be NULL after an error");
    CHECK_ERR(ds_chat_render(DS_CHAT_UNKNOWN, ok, 1, true, &out), "no renderer for template family unknown");
    CHECK_ERR(ds_chat_render((ds_chat_family)42, ok, 1, true, &out), "(42)");

    ds_chat_message tool[] = {{"user", "hi"}, {"tool", "42"}};
    CHECK_ERR(ds_chat_render(DS_CHAT_GEMMA4, tool, 2, true, &out), "chat message 1: role \"tool\" is not system");
    ds_chat_message no_role[] = {{NULL, "hi"}};
    CHECK_ERR(ds_chat_render(DS_CHAT_GEMMA3, no_role, 1, true, &out), "chat message 0: no role");
    ds_chat_message no_content[] = {{"system", "s"}, {"user", NULL}};
    CHECK_ERR(ds_chat_render(DS_CHAT_CHATML_QWEN3, no_content, 2, true, &out), "chat message 1 (user): no content");
    ds_chat_message bad_utf8[] = {{"user", "ok \xff"}};
    CHECK_ERR(ds_chat_render(DS_CHAT_CHATML_QWEN3, bad_utf8, 1, true, &out), "not valid UTF-8 (byte 3)");

    /* Gemma 3's alternation rule names the offending message. */
    ds_chat_message twice[] = {{"system", "s"}, {"user", "a"}, {"user", "b"}};
    CHECK_ERR(ds_chat_render(DS_CHAT_GEMMA3, twice, 3, true, &out), "chat message 2 (user)");
    /* Gemma 4 and Qwen3 accept the same conversation. */
    CHECK_OK(ds_chat_render(DS_CHAT_GEMMA4, twice, 3, true, &out));
    CHECK(!strcmp(out, "<bos><|turn>system\ns<turn|>\n<|turn>user\na<turn|>\n<|turn>user\nb<turn|>\n"
                       "<|turn>model\n<|channel>thought\n<channel|>"),
          "gemma4 two user turns");
    free(out);
}

RUN_TESTS("chat_template", test_qwen3_goldens, test_gemma3_goldens, test_gemma4_goldens,
          test_bos_comes_from_the_template, test_detect_real_models, test_detect_sources, test_detect_refusals,
          test_render_errors)
