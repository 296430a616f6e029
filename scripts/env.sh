# Sourced by the scripts: what mpirun needs on these machines (root, more ranks than cores,
# one BLAS thread per rank).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# (GNU nproc honours OMP_NUM_THREADS, set to 1 just above: ask without it, or builds run -j1.)
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
