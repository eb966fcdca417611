//! How many PEs [`spmd_main`] starts when a program is run directly: as many
//! as the backend that `init` will pick takes on this machine.
//!
//! [`spmd_main`]: super::spmd_main

use crate::config::{BackendKind, Config};

/// The PEs to start, and why, in words for the line [`super::spmd_main`]
/// prints: "2 PEs, one per GPU (gpu backend)".
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Choice {
    pub(super) pes: usize,
    pub(super) why: String,
}

/// The choice for this process's settings (`SHMEM_BACKEND`,
/// `SHMEM_PES_PER_GPU`) and GPUs, `host_pes` on the host backend.
pub(super) fn choose_here(host_pes: usize) -> Choice {
    let config = Config::new();
    choose(host_pes, config.backend, config.pes_per_gpu, visible_gpus)
}

/// The PEs the gpu backend takes here, or `None` where `init` would pick
/// the host backend.
pub(super) fn gpu_pes_here() -> Option<usize> {
    if Config::new().backend == BackendKind::Host {
        return None;
    }
    gpu_capacity().ok()
}

/// The PEs the gpu backend takes here whatever `SHMEM_BACKEND` says (its
/// GPUs times `SHMEM_PES_PER_GPU`), or why it cannot run here.
pub(super) fn gpu_capacity() -> Result<usize, String> {
    visible_gpus().map(|gpus| gpus * Config::new().pes_per_gpu.max(1))
}

/// The GPUs the gpu backend would use here, or why it cannot run: `init`'s
/// own check ([`crate::gpu::available`]: a CUDA driver with a device, and an
/// NVSHMEM library), then the driver's count of GPUs, which honours
/// `CUDA_VISIBLE_DEVICES` (the PEs inherit it and so see the same GPUs).
///
/// This initialises the CUDA driver in the launcher (`cuInit`), which
/// creates no context: the launcher holds no GPU memory and no compute
/// slot (a GPU in exclusive-process mode stays free for its PE), and its
/// PEs, started by `exec`, inherit none of it.
fn visible_gpus() -> Result<usize, String> {
    crate::gpu::available()?;
    match cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => Ok(n as usize),
        Ok(_) => Err("the CUDA driver sees no GPU".into()),
        Err(e) => Err(format!("the CUDA driver failed to count GPUs: {e:?}")),
    }
}

/// What `init` would pick for `backend` (as `SHMEM_BACKEND=auto|gpu|host`
/// does), and the PEs to start for it: on the gpu backend `per_gpu` a GPU
/// of those `gpus` finds, on the host backend `host_pes`. Where the gpu
/// backend was asked for but cannot run, `host_pes` PEs start, and each
/// fails `init` saying why.
fn choose(
    host_pes: usize,
    backend: BackendKind,
    per_gpu: usize,
    gpus: impl FnOnce() -> Result<usize, String>,
) -> Choice {
    let host = |why: String| Choice { pes: host_pes, why: format!("{} ({why})", count(host_pes)) };
    if backend == BackendKind::Host {
        return host("host backend: SHMEM_BACKEND=host".into());
    }
    match (gpus(), backend) {
        (Ok(gpus), _) if per_gpu <= 1 => {
            Choice { pes: gpus, why: format!("{}, one per GPU (gpu backend)", count(gpus)) }
        }
        (Ok(gpus), _) => Choice {
            pes: gpus * per_gpu,
            why: format!("{}, {per_gpu} per GPU (gpu backend, SHMEM_PES_PER_GPU={per_gpu})", count(gpus * per_gpu)),
        },
        (Err(why), BackendKind::Gpu) => host(format!("SHMEM_BACKEND=gpu, but {why}")),
        (Err(why), _) => host(format!("host backend: {why}")),
    }
}

/// "1 PE", "4 PEs".
fn count(pes: usize) -> String {
    if pes == 1 {
        "1 PE".into()
    } else {
        format!("{pes} PEs")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(backend: BackendKind, per_gpu: usize, gpus: Result<usize, &str>) -> (usize, String) {
        let c = choose(4, backend, per_gpu, || gpus.map_err(String::from));
        (c.pes, c.why)
    }

    #[test]
    fn gpu_backend_one_pe_per_gpu() {
        assert_eq!(pick(BackendKind::Auto, 1, Ok(2)), (2, "2 PEs, one per GPU (gpu backend)".into()));
        assert_eq!(pick(BackendKind::Gpu, 1, Ok(1)), (1, "1 PE, one per GPU (gpu backend)".into()));
        assert_eq!(
            pick(BackendKind::Auto, 3, Ok(2)),
            (6, "6 PEs, 3 per GPU (gpu backend, SHMEM_PES_PER_GPU=3)".into())
        );
    }

    #[test]
    fn host_backend_fixed_count() {
        let no_gpu = Err("no CUDA driver (libcuda.so.1) found");
        assert_eq!(
            pick(BackendKind::Auto, 1, no_gpu),
            (4, "4 PEs (host backend: no CUDA driver (libcuda.so.1) found)".into())
        );
        // SHMEM_BACKEND=host never looks for GPUs.
        let c = choose(4, BackendKind::Host, 2, || panic!("looked for GPUs"));
        assert_eq!((c.pes, c.why.as_str()), (4, "4 PEs (host backend: SHMEM_BACKEND=host)"));
        assert_eq!(
            pick(BackendKind::Gpu, 1, no_gpu),
            (4, "4 PEs (SHMEM_BACKEND=gpu, but no CUDA driver (libcuda.so.1) found)".into())
        );
    }
}
