#include "cli_choice.h"

#include <stdio.h>
#include <string.h>

int cli_choice(const char *cmd, const char *flag, const char *arg, const char *const *choices) {
    int n = 0;
    for (; choices[n]; n++)
        if (!strcmp(arg, choices[n])) return n;
    fprintf(stderr, "dspark %s: %s expects ", cmd, flag);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    fprintf(stderr, ", got '%s'\n", arg);
    return -1;
}
