# Sourced by the scripts: OpenMPI settings for running as root on a small
# shared-memory machine (see docs/getting-started.md).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_rmaps_base_oversubscribe=1
