/* `tilegrad bench`: entry point called by the CLI (cli/main.c). */
#ifndef TG_BENCH_H
#define TG_BENCH_H
/* argv[0] is "bench"; returns a process exit code. */
int tg_bench_main(int argc, char **argv);
#endif
