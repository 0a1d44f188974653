/* The text formats launch reads from Slurm and from its own command line.
 *
 * Why our own parsers: libslurm's hostlist functions are not a public, stable API (and would make
 * launch depend on the Slurm development package at run time); the formats are small and the
 * tests compare our expansion with `scontrol show hostnames` on every case.
 *
 * Every function here is pure (no environment, no I/O), never aborts, and on error returns -1 and
 * writes a one-line message naming the bad input into err (errlen bytes, always terminated). On
 * error the outputs are left untouched. Outputs are malloc'ed and owned by the caller
 * (launch_strv_free / free). */
#ifndef LAUNCH_PARSE_H
#define LAUNCH_PARSE_H
#include <stddef.h>

/* Upper bound on the names one hostlist may expand to, and on the total of a tasks-per-node
 * string: far above any real job, low enough that a hostile string cannot exhaust memory. */
#define LAUNCH_MAX_NAMES (1 << 20)

/* Slurm hostlist, e.g. "n[01-04,07],gpu-a[1-2]", "b04-[09-10]", "rack[1-2]-n[1-3]".
 * Items are separated by commas outside brackets. A bracket holds comma-separated numbers or
 * ranges lo-hi (lo <= hi); a range is zero-padded to the width of lo when lo has a leading zero
 * (as Slurm does: "[09-10]" -> 09 10, "[8-10]" -> 8 9 10). Several brackets in one item expand
 * as a product, the leftmost varying slowest ("n[1-2][3-4]" -> n13 n14 n23 n24). Host names may
 * hold letters, digits, '-', '_' and '.'. */
int launch_hostlist_expand(const char *s, char ***names, size_t *count, char *err, size_t errlen);

/* Slurm tasks-per-node, e.g. "2(x3),1" -> {2,2,2,1}; each count >= 1. */
int launch_tasks_per_node_parse(const char *s, int **counts, size_t *n, char *err, size_t errlen);

/* A GPU list as Slurm and CUDA write it: comma-separated entries; an entry is a number, a range
 * lo-hi of numbers, or an opaque id (a CUDA UUID "GPU-..." / "MIG-..."). Ranges are expanded.
 * The empty string is an empty list. Entries are returned as strings ("3", "GPU-8a1f...").
 * Duplicates are an error. */
int launch_gpu_list_parse(const char *s, char ***ids, size_t *count, char *err, size_t errlen);

/* "-H host1:4,host2:4" (slots default to 1 when ":n" is missing) -> names and slots. */
int launch_hosts_parse(const char *s, char ***names, int **slots, size_t *count, char *err,
                       size_t errlen);

/* A host file as horovodrun's -hostfile and Open MPI's --hostfile take it: one host per line,
 * "host slots=N" (slots default to 1; Open MPI's "max_slots=M" is accepted and not used), '#'
 * starts a comment, blank lines are skipped. *hosts receives the -H form "h1:n1,h2:n2". Errors
 * name the line (the caller adds the file name). */
int launch_hostfile_parse(const char *text, char **hosts, char *err, size_t errlen);

/* A non-negative decimal int (no sign, no spaces, <= max). */
int launch_parse_uint(const char *s, int max, int *out);

void launch_strv_free(char **v, size_t n);
#endif
