//! A user's own CUDA kernel (compiled at run time with NVRTC) stores into
//! the right-hand neighbour's symmetric buffer through its NVLink peer
//! pointer (neighbours in a ring of the PEs of a node); after a barrier
//! each PE checks what its left neighbour wrote.
//! A second kernel takes the buffer itself as its argument (cudarc interop).
//!
//! Needs the gpu backend: `shmemrun -n 2 target/release/examples/peer_kernel`
//! on a machine with two GPUs (run alone it starts one PE per GPU).
//! Elsewhere it says so and exits successfully.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use shmem::BackendKind;
use std::process::ExitCode;

const KERNELS: &str = r#"
extern "C" __global__ void write_peer(float *peer, unsigned int n, float sender) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        peer[i] = sender * 1048576.0f + (float)i;
}
extern "C" __global__ void negate(float *x, unsigned int n) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = -x[i];
}
"#;

/// Elements per PE: values `sender · 2^20 + i` stay exact in f32 for 8 PEs.
const N: usize = 1 << 20;

fn main() -> ExitCode {
    shmem::launch::spmd_main("peer_kernel", 2, run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let me = ctx.my_pe();
    if ctx.backend() != BackendKind::Gpu {
        if me == 0 {
            println!("peer_kernel: skipped: it needs the gpu backend, and this run uses {:?}", ctx.backend());
        }
        return Ok(ctx.finalize()?);
    }
    let s = ctx.stream();
    let cuda = ctx.cuda_context().expect("gpu backend");
    let stream = s.cuda_stream().expect("gpu backend").clone();
    let module = cuda.load_module(cudarc::nvrtc::compile_ptx(KERNELS)?)?;
    let (write_peer, negate) = (module.load_function("write_peer")?, module.load_function("negate")?);

    let buf = ctx.alloc_zeroed::<f32>(N)?;
    // Neighbours on this PE's node (the whole job on one node): another
    // node's PEs have no peer pointer.
    let node = ctx.node();
    let (rank, size) = (node.my_pe(), node.n_pes());
    let right = node.world_pe((rank + 1) % size)?;
    let left = node.world_pe((rank + size - 1) % size)?;
    let peer = buf.peer_ptr(right).ok_or("the right-hand PE is not reachable over NVLink")? as u64;
    ctx.barrier_all(&s)?; // every PE has zeroed its copy
    let cfg = LaunchConfig::for_num_elems(N as u32);
    let (len, sender) = (N as u32, me as f32);
    // SAFETY: `peer` is N f32 of the neighbour's copy (nvshmem_ptr); the
    // arguments match the kernel's parameters.
    unsafe { stream.launch_builder(&write_peer).arg(&peer).arg(&len).arg(&sender).launch(cfg)? };
    stream.synchronize()?;
    ctx.barrier_all(&s)?; // every neighbour's stores are done

    let got = buf.copy_to_host(&s)?;
    let want = |i: usize| left as f32 * 1048576.0 + i as f32;
    if let Some(i) = (0..N).find(|&i| got[i] != want(i)) {
        return Err(format!("element {i} is {}, expected {} from PE {left}", got[i], want(i)).into());
    }

    // The buffer itself as a kernel argument.
    let view = buf.cuda_view()?;
    // SAFETY: `view` is this PE's N f32; nobody else touches them now.
    unsafe { stream.launch_builder(&negate).arg(&view).arg(&len).launch(cfg)? };
    stream.synchronize()?;
    let got = buf.copy_to_host(&s)?;
    if let Some(i) = (0..N).find(|&i| got[i] != -want(i)) {
        return Err(format!("after negate, element {i} is {}, expected {}", got[i], -want(i)).into());
    }
    println!("PE {me}: read {N} values PE {left} stored through its peer pointer; negated them in place with a user kernel: OK");
    drop(buf);
    ctx.barrier_all(&s)?;
    Ok(ctx.finalize()?)
}
