# Sourced by the scripts that train an example on real digits (run_mnist_example.sh,
# horovod_mnist_check.sh), called as SCRIPT PYTHON MPIEXEC [MPIEXEC_FLAGS...]. Sets py (the
# interpreter), mpi (mpiexec and its flags, an array), src (the source tree), work (a private
# folder removed at exit) and data/dataset: the 10k MNIST digits of tests/common/real_data.sh or,
# where they are absent, Fashion-MNIST cut to the same shape (dataset "digits" or "fashion").
# Exits 77 when torch is not importable or no data exists.
set -u
py=$1
shift
mpi=("$@")
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
"$py" -c "import torch" 2>/dev/null || { echo "SKIP: torch is not importable"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/hora-mnist-py.XXXXXX")
trap 'rm -rf "$work"' EXIT
found=$(HORA_SOURCE_DIR=${HORA_SOURCE_DIR:-$src} bash "$src/tests/common/real_data.sh" "$work") || exit $?
data=${found% *} dataset=${found##* }
