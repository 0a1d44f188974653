#!/bin/sh
# Runs a command at the lowest CPU priority, also against the other sessions on the machine, and
# waits for it (its exit status is the command's).
#   sh tests/common/background.sh COMMAND [ARGS...]
# With the kernel's autogroups (sched_autogroup_enabled, the default on desktop and VM kernels),
# each session competes for the CPU as one group of weight nice 0 whatever the nice values of its
# processes: a nice-19 build in the test runner's session still took that session's whole share
# from the tests that run in sessions of their own (the fault tests' jobs, the Slurm ranks),
# whose tight timing bounds then failed. So the command runs in a session of its own (setsid:
# never the caller's, whose every process the autogroup setting would slow down) whose autogroup
# is set to nice 19: it only gets the CPU nobody else wants. Where autogroups are off or the write
# is refused, plain nice 19 is all there is.
exec setsid -w sh -c 'echo 19 > /proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' sh "$@"
