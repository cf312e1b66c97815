/*
 * `tilegrad train [options]`: trains the tiny decoder block of
 * examples/tiny_model.h on the built-in corpus and prints the loss as it
 * falls (examples/README.md). The model, corpus and loop live in
 * examples/tiny_model.c and examples/tiny_train.c; this is the subcommand.
 */
#include "tiny_train.h"

int tg_cli_train_main(int argc, char **argv) {
  return tt_main(argc, argv, "tilegrad train", "tilegrad");
}
