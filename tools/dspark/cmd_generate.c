#include <stdio.h>
#include "commands.h"
int cmd_generate(int argc, char **argv) { fprintf(stderr, "todo\n"); return 1; }
