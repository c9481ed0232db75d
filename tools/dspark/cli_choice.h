/* A flag that takes one of a few words (--backend cpu|cuda, --schedule fixed|confidence, --save-dtype bf16|fp32):
 * every command parses and refuses it the same way. */
#ifndef DS_CLI_CHOICE_H
#define DS_CLI_CHOICE_H

/* The index of arg among choices (NULL-terminated); -1 after printing "dspark CMD: FLAG expects A or B, got 'ARG'"
 * to stderr. */
int cli_choice(const char *cmd, const char *flag, const char *arg, const char *const *choices);

#define CLI_BACKENDS ((const char *const[]){"cpu", "cuda", NULL})

#endif
