/* The 32 dev prompts of the bundled pico model (models/prompts-dev.jsonl)
 * with the reference's outputs, shared by the pico tests. */
#ifndef DS_PICO_PROMPTS_H
#define DS_PICO_PROMPTS_H

#include <stdint.h>

#define PICO_MAX_PROMPTS 64

typedef struct {
    int n_ids, n_ar;
    int32_t ids[128];
    int32_t ar[128]; /* ar_greedy_output_ids */
} pico_prompt;

/* Returns the number of prompts read (0 on failure, reported as a test failure). */
int pico_load_prompts(pico_prompt *out, int max);

#endif
