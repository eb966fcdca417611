//! A user's own kernel on shmem's device header (`shmem::DEVICE_HEADER`),
//! compiled at run time with NVRTC (`shmem::compile_with_device_header`):
//! a hand-written all-reduce. Each PE scales its vector, puts it with a
//! signal into its slot of every peer's buffer, waits for every peer's
//! signal, and sums the slots in PE order;
//! a barrier of the header ends the exchange. Every PE checks the sums and
//! what each peer put, value by value.
//!
//! Epochs: the signal pads start at zero and every launch passes the next
//! epoch (1, 2, …) from the host; the kernel signals it and waits for it.
//! Even and odd epochs use two sets of slots, so a PE that starts epoch
//! e + 1 never overwrites slots a slower peer still sums for epoch e (the
//! peer's signal for e + 1, awaited before e + 2, says it is done with e).
//! A kernel captured in a CUDA graph would keep the epoch in device memory
//! and advance it there instead.
//!
//! Needs the gpu backend: `shmemrun -n 2 target/release/examples/device_kernel`
//! on a machine with two GPUs (run alone it starts one PE per GPU).
//! Elsewhere it says so and exits successfully.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use shmem::BackendKind;
use std::process::ExitCode;

const KERNELS: &str = r#"
#include "shmem_device.cuh"

// The symmetric buffer holds two sets (even and odd epochs) of n slots of
// `count` floats; slot p of a set holds PE p's scaled vector. Block b
// handles chunk b of the vector and signals on channel b.
extern "C" __global__ void scale_all_reduce(shmem::PeerHandle h, const float *x, float *out,
                                            unsigned long long count, float scale, unsigned int epoch) {
    const int me = h.rank, n = h.world_size, channel = blockIdx.x;
    const unsigned long long chunk = (count + gridDim.x - 1) / gridDim.x;
    const unsigned long long begin = blockIdx.x * chunk < count ? blockIdx.x * chunk : count;
    const unsigned long long end = begin + chunk < count ? begin + chunk : count;
    const unsigned long long set = (epoch % 2) * n * count;
    float *slots = shmem::peer_ptr<float>(h, me) + set;
    float *mine = slots + me * count;
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) mine[i] = scale * x[i];
    __syncthreads();
    // Right-hand neighbour first, so that the PEs do not all start on one.
    for (int k = 1; k < n; ++k) {
        int peer = (me + k) % n;
        shmem::put_signal(h, peer, (set + me * count + begin) * sizeof(float), mine + begin,
                          (end - begin) * sizeof(float), channel, epoch);
    }
    shmem::block_wait_signals(h, channel, epoch);
    for (unsigned long long i = begin + threadIdx.x; i < end; i += blockDim.x) {
        float sum = 0.0f;
        for (int p = 0; p < n; ++p) sum += slots[p * count + i];
        out[i] = sum;
    }
}

extern "C" __global__ void finish(shmem::PeerHandle h, int channel, unsigned int epoch) {
    shmem::barrier(h, channel, epoch);
}
"#;

/// Elements per PE: odd, so slots start unaligned and the copies' byte
/// head and tail run. Values `(pe · 2^16 + i) · epoch` stay exact in f32
/// for 8 PEs and 4 epochs.
const COUNT: usize = (1 << 16) - 3;
const EPOCHS: u32 = 4;
/// Blocks of the all-reduce, one signal channel each; the barrier takes
/// the last channel.
const BLOCKS: u32 = 16;
const BARRIER_CHANNEL: i32 = shmem::SIGNAL_PAD_WORDS_PER_PEER as i32 - 1;

fn input(pe: usize, i: usize) -> f32 {
    (pe * 65536 + i) as f32
}

fn main() -> ExitCode {
    shmem::launch::spmd_main("device_kernel", 2, run)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let me = ctx.my_pe();
    if ctx.backend() != BackendKind::Gpu {
        if me == 0 {
            println!("device_kernel: skipped: it needs the gpu backend, and this run uses {:?}", ctx.backend());
        }
        return Ok(ctx.finalize()?);
    }
    let s = ctx.stream();
    // The device header reaches peers by loads and stores (NVLink): the
    // all-reduce runs over this PE's node, which is the whole job on one.
    let node = ctx.node();
    let (me, n) = (node.my_pe(), node.n_pes());
    let cuda = ctx.cuda_context().expect("gpu backend");
    let stream = s.cuda_stream().expect("gpu backend").clone();
    let module = cuda.load_module(shmem::compile_with_device_header(cuda, KERNELS)?)?;
    let (all_reduce, finish) = (module.load_function("scale_all_reduce")?, module.load_function("finish")?);

    let slots = ctx.alloc_zeroed::<f32>(2 * n * COUNT)?;
    let handle = slots.handle_on(&node)?;
    if let Some(pe) = (0..n).find(|&pe| handle.buffer_ptrs[pe] == 0) {
        return Err(format!("PE {pe} is not reachable over NVLink").into());
    }
    let x = stream.clone_htod(&(0..COUNT).map(|i| input(me, i)).collect::<Vec<f32>>())?;
    let mut out = stream.alloc_zeros::<f32>(EPOCHS as usize * COUNT)?;
    ctx.barrier_all(&s)?; // every PE's slots and signal pad are zeroed

    let arg = handle.device_arg();
    let cfg = LaunchConfig { grid_dim: (BLOCKS, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
    let count = COUNT as u64;
    for epoch in 1..=EPOCHS {
        let scale = epoch as f32;
        let mut row = out.slice_mut((epoch as usize - 1) * COUNT..epoch as usize * COUNT);
        // SAFETY: the arguments match the kernel's parameters; `arg`'s
        // arrays live in `handle` until the end; `slots` has 2·n·COUNT f32
        // on every PE, `x` and `row` COUNT; every PE launches the same
        // epochs, so every wait is answered.
        unsafe {
            stream
                .launch_builder(&all_reduce)
                .arg(&arg)
                .arg(&x)
                .arg(&mut row)
                .arg(&count)
                .arg(&scale)
                .arg(&epoch)
                .launch(cfg)?
        };
    }
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32.max(n as u32), 1, 1), shared_mem_bytes: 0 };
    // SAFETY: as above; the barrier's channel is used by no other kernel.
    unsafe { stream.launch_builder(&finish).arg(&arg).arg(&BARRIER_CHANNEL).arg(&1u32).launch(one)? };
    stream.synchronize()?;

    let sums = stream.clone_dtoh(&out)?;
    let total = |i: usize| (0..n).map(|pe| input(pe, i)).sum::<f32>();
    for epoch in 1..=EPOCHS as usize {
        let row = &sums[(epoch - 1) * COUNT..epoch * COUNT];
        if let Some(i) = (0..COUNT).find(|&i| row[i] != epoch as f32 * total(i)) {
            return Err(format!("epoch {epoch}: sum {i} is {}, expected {}", row[i], epoch as f32 * total(i)).into());
        }
    }
    // The last two epochs' slots, as the peers put them.
    let got = slots.copy_to_host(&s)?;
    for epoch in EPOCHS - 1..=EPOCHS {
        let set = &got[(epoch % 2) as usize * n * COUNT..][..n * COUNT];
        for pe in 0..n {
            let want = |i: usize| epoch as f32 * input(pe, i);
            if let Some(i) = (0..COUNT).find(|&i| set[pe * COUNT + i] != want(i)) {
                let v = set[pe * COUNT + i];
                return Err(format!("epoch {epoch}: slot of PE {pe}, element {i} is {v}, expected {}", want(i)).into());
            }
        }
    }
    println!(
        "PE {me} of its node: {EPOCHS} epochs of a hand-written all-reduce of {COUNT} f32 over the node's {n} PEs \
         ({BLOCKS} blocks, put_signal + wait + barrier from shmem_device.cuh): OK"
    );
    drop(handle);
    drop(slots);
    ctx.barrier_all(&s)?;
    Ok(ctx.finalize()?)
}
