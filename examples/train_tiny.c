/*
 * train_tiny: the tiny-model training run as a standalone program (the same
 * driver as `tilegrad train`). `train_tiny --help` lists the options.
 */
#include "tiny_train.h"

int main(int argc, char **argv) { return tt_main(argc, argv, "train_tiny", NULL); }
