# Sourced by the scripts that run on a GPU machine (gpu-run.sh,
# gpu-compare.sh): keeps NVLink multicast off, and finds NVSHMEM's host
# library, cuBLAS and NCCL (for the benchmark's reference rows) wherever the
# machine has them (NVSHMEM_HOME, Python wheels under /opt/*/.venv or
# /usr/local, the CUDA toolkit), exporting NVSHMEM_HOME and LD_LIBRARY_PATH.
# Returns non-zero when NVSHMEM is not found.
# NVLink multicast stays off on these machines, whatever else is set.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvlib=
for d in ${NVSHMEM_HOME:+"$NVSHMEM_HOME/lib"} /opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib \
    /usr/local/lib/python3*/dist-packages/nvidia/nvshmem/lib /usr/lib/x86_64-linux-gnu/nvshmem/*; do
    if [[ -e "$d/libnvshmem_host.so.3" ]]; then nvlib=$d; break; fi
done
if [[ -z "$nvlib" ]]; then
    echo "gpu-env: no libnvshmem_host.so.3 found; set NVSHMEM_HOME" >&2
    return 1
fi
export NVSHMEM_HOME=${nvlib%/lib}
export LD_LIBRARY_PATH="$nvlib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# cuBLAS for the overlapped matmuls (cudarc opens libcublas.so.13, loaded at
# first use): the CUDA toolkit's lib64 above, else another toolkit's or the
# nvidia-cublas wheel's lib, appended so that it shadows nothing.
cublas=
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
    /opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib /opt/*/.venv/lib/python3*/site-packages/nvidia/cublas/lib \
    /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib /usr/local/lib/python3*/dist-packages/nvidia/cublas/lib; do
    if [[ -e "$d/libcublas.so.13" ]]; then cublas=$d; break; fi
done
if [[ -z "$cublas" ]]; then
    echo "gpu-env: no libcublas.so.13 found: the overlapped matmuls will fail" >&2
elif [[ ":$LD_LIBRARY_PATH:" != *":$cublas:"* ]]; then
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$cublas"
fi
# NCCL for the benchmark's reference rows. cudarc asks for libnccl.so, which
# runtime-only installs (pip wheel, libnccl2) lack: link it beside ours.
nccl=
for f in /opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2; do
    if [[ -e "$f" ]]; then nccl=$f; break; fi
done
if [[ -n "$nccl" ]]; then
    ncclDir=$(mktemp -d)
    ln -sf "$nccl" "$ncclDir/libnccl.so"
    export LD_LIBRARY_PATH="$ncclDir:$LD_LIBRARY_PATH"
fi
