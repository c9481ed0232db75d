/* One file per subcommand; each returns the process exit code. */
#ifndef DS_COMMANDS_H
#define DS_COMMANDS_H

#include "base/clock.h"

int cmd_generate(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_datagen(int argc, char **argv);
int cmd_train(int argc, char **argv);


#endif
