/* dspark: command-line front end. `dspark <subcommand> [options]`. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dspark <command> [options]\n"
            "\n"
            "commands:\n"
            "  generate   generate text from a model (speculative with a DSpark drafter)\n"
            "  tokenize   encode text to ids, or --decode ids to text\n"
            "  synth      write a seeded random checkpoint with a real model's shapes\n"
            "  bench      time prefill, decoding, verification and drafting on random ids\n"
            "  calibrate  fit STS temperatures for a drafter's confidence head, with a reliability diagram\n"
            "  serve      an OpenAI-compatible HTTP server (completions, chat, streaming, metrics)\n"
            "  quantize   affine int8 / int4 weights as MLX stores them (group scales and biases)\n"
            "  datagen    a drafter's training data: the target's continuations and hidden states, cached\n"
            "  train      train a DSpark drafter on a datagen cache (the DeepSpec recipe)\n"
            "\n"
            "`dspark <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "calibrate")) return cmd_calibrate(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) {
#ifdef DS_HAVE_SERVE
        return cmd_serve(argc - 1, argv + 1);
#else
        fprintf(stderr, "dspark serve: this build has no server (configured with -DDS_SERVE=OFF)\n");
        return 2;
#endif
    }
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "datagen")) return cmd_datagen(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "dspark: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
