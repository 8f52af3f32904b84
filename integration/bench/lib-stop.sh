# shellcheck shell=bash
# Sourced by every benchmark right after `set -euo pipefail`: a run that
# stops on an error says so, with the command, its line and its exit
# status, on stderr, instead of ending with nothing but what it printed
# so far (issue 30: daos-lifecycle-sequential.sh once ended after its
# cluster line, silently). `set -E` carries the trap into functions.
set -E
# Only where errexit is on, i.e. where the failure ends the run: a cleanup
# that runs with `set +e` fails quietly as it means to.
bench_stopped() { # STATUS LINE COMMAND
    [[ $- == *e* ]] || return 0
    echo "${0##*/}: stopped: line $2: \`$3\` exited $1" >&2
}
trap 'bench_stopped $? $LINENO "$BASH_COMMAND"' ERR
