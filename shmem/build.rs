//! Builds the device-initiated kernels of `../kernels` into one image
//! embedded in the crate, when nvcc and NVSHMEM are found:
//!
//! - nvcc: `NVCC`, else `CUDA_HOME/bin/nvcc`, else the repository's
//!   `.gpu-toolchain/` (made by `ci/gpu-toolchain.sh`);
//! - NVSHMEM: `NVSHMEM_HOME`, else `.gpu-toolchain/nvidia/nvshmem`.
//!
//! Each `.cu` is compiled with `-rdc=true -cubin`, then nvlink links them
//! with `libnvshmem_device.a`. `SHMEM_CUDA_ARCHS` (e.g. `90,100`; default
//! `90`) picks the architectures; with several, their cubins are packed into
//! one fat binary for `cuModuleLoadData` to choose from. The `.cu` files
//! compile in parallel, and the result is cached in `target/shmem-kernels/`
//! under a hash of every input (sources, tools, architectures), so other
//! profiles and feature sets reuse it. Without the tools the crate
//! still builds (cfg `shmem_kernels` unset), and the GPU backend says how to
//! build the kernels when one is needed.
//!
//! A build with AddressSanitizer (`-Zsanitizer=address` in the target's
//! rustflags) also gets cfg `shmem_asan`: the host backend then tells ASan
//! which bytes of the symmetric heap no buffer covers (`src/heap/asan.rs`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(shmem_kernels)");
    println!("cargo::rustc-check-cfg=cfg(shmem_asan)");
    let rustflags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if rustflags.split('\x1f').collect::<Vec<_>>().join(" ").contains("sanitizer=address") {
        println!("cargo::rustc-cfg=shmem_asan");
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../kernels");
    let toolchain = manifest.join("../.gpu-toolchain/nvidia");
    println!("cargo::rerun-if-changed={}", kernels.display());
    for var in [
        "NVCC",
        "CUDA_HOME",
        "NVSHMEM_HOME",
        "SHMEM_CUDA_ARCHS",
        "SHMEM_NO_KERNELS",
        "SHMEM_KERNEL_PHASES",
        "SHMEM_KERNEL_PHASE_BLOCK",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    println!("cargo::rerun-if-changed={}", toolchain.join("nvshmem/include/non_abi/nvshmem_version.h").display());
    if std::env::var_os("SHMEM_NO_KERNELS").is_some() {
        return;
    }
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("bin/nvcc")))
        .unwrap_or_else(|| toolchain.join("cu13/bin/nvcc"));
    let nvshmem = std::env::var_os("NVSHMEM_HOME").map(PathBuf::from).unwrap_or_else(|| toolchain.join("nvshmem"));
    let device_lib = nvshmem.join("lib/libnvshmem_device.a");
    if !nvcc.is_file() || !device_lib.is_file() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let archs: Vec<String> = std::env::var("SHMEM_CUDA_ARCHS")
        .ok()
        .map(|a| a.split(',').map(|x| x.trim().to_owned()).filter(|x| !x.is_empty()).collect())
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| vec!["90".into()]);
    let sources = files_under(&kernels, "cu");
    // The cache: `target/shmem-kernels/<hash of the inputs>/` (OUT_DIR is
    // target/<profile>/build/<pkg>/out).
    let mut key = std::collections::hash_map::DefaultHasher::new();
    for path in sources.iter().chain(headers(&kernels).iter()) {
        path.file_name().hash(&mut key);
        std::fs::read(path).expect("a kernel source").hash(&mut key);
    }
    for tool in [&nvcc, &device_lib] {
        tool.hash(&mut key);
        std::fs::metadata(tool).ok().and_then(|m| m.modified().ok()).hash(&mut key);
    }
    archs.hash(&mut key);
    phases().hash(&mut key);
    phase_block().hash(&mut key);
    // What the cache holds besides the image (bump when that changes).
    "image and stack frames".hash(&mut key);
    let cache_root = out.ancestors().nth(4).map_or_else(|| out.clone(), |t| t.join("shmem-kernels"));
    let cache = cache_root.join(format!("{:016x}", key.finish()));
    let linked = cache.join("shmem_kernels.image");
    let frames = cache.join("stack_frames.txt");
    if !linked.is_file() || !frames.is_file() {
        let work = out.join("kernels");
        std::fs::create_dir_all(&work).expect("OUT_DIR");
        let (image, stacks) = build(&nvcc, &nvshmem, &device_lib, &kernels, &sources, &archs, &work);
        std::fs::create_dir_all(&cache).expect("the kernel cache folder");
        // Write then rename, so a concurrent build never sees half a file;
        // the image last, which the check above looks for first.
        let tmp = cache.join(format!("frames.{}", std::process::id()));
        std::fs::write(&tmp, stacks).expect("caching the kernels");
        std::fs::rename(&tmp, &frames).expect("caching the kernels");
        let tmp = cache.join(format!("image.{}", std::process::id()));
        std::fs::copy(&image, &tmp).expect("caching the kernels");
        std::fs::rename(&tmp, &linked).expect("caching the kernels");
    }
    println!("cargo::rustc-env=SHMEM_KERNELS_CUBIN={}", linked.display());
    println!("cargo::rustc-env=SHMEM_KERNELS_STACK_FRAMES={}", frames.display());
    println!("cargo::rustc-env=SHMEM_KERNELS_NVSHMEM_VERSION={}", nvshmem_version(&nvshmem));
    println!("cargo::rustc-cfg=shmem_kernels");
}

/// Whether this is a profiling build, with the kernels' phase stamps
/// (`SHMEM_KERNEL_PHASES=1`; see kernels/core/phases.cuh).
fn phases() -> bool {
    std::env::var_os("SHMEM_KERNEL_PHASES").is_some_and(|v| !v.is_empty() && v != "0")
}

/// The block whose thread 0 stamps the phases in a profiling build
/// (`SHMEM_KERNEL_PHASE_BLOCK`, 0 by default), as a macro definition.
fn phase_block() -> String {
    let block = match std::env::var("SHMEM_KERNEL_PHASE_BLOCK") {
        Ok(v) if !v.is_empty() => v
            .parse::<u32>()
            .unwrap_or_else(|_| panic!("SHMEM_KERNEL_PHASE_BLOCK is {v:?}, not a block index (0, 1, ...)")),
        _ => 0,
    };
    format!("-DSHMEM_PHASE_BLOCK={block}")
}

/// The `.cuh` headers the sources include.
fn headers(kernels: &Path) -> Vec<PathBuf> {
    files_under(kernels, "cuh")
}

/// The files of extension `ext` in `dir` and its folders, sorted.
fn files_under(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("the kernels folder") {
            let path = entry.expect("the kernels folder").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|x| x == ext) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// How many nvcc run at once: cargo's job count for this build script
/// (`NUM_JOBS`, which `-j` and `CARGO_BUILD_JOBS` set), else the cores.
fn nvcc_jobs() -> usize {
    std::env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1)
}

/// Compiles every source for every architecture (sources in parallel, up
/// to [`nvcc_jobs`] at once), links each architecture's objects with the
/// NVSHMEM device library, and packs several architectures into one fat
/// binary. Returns the image, and every kernel's stack frame as ptxas
/// reports it, a line each: `sm_ARCH NAME BYTES` (the test
/// `kernels_keep_their_parameters_off_the_stack` reads them).
fn build(
    nvcc: &Path,
    nvshmem: &Path,
    device_lib: &Path,
    kernels: &Path,
    sources: &[PathBuf],
    archs: &[String],
    out: &Path,
) -> (PathBuf, String) {
    let nvlink = nvcc.with_file_name("nvlink");
    let phases = phases();
    let mut images = Vec::new();
    let stacks = std::sync::Mutex::new(String::new());
    for arch in archs {
        // At most `jobs` nvcc at once: each takes most of a GiB, and cargo
        // may run several builds beside this one; more than the cores
        // brings nothing anyway.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let objects: Vec<PathBuf> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..nvcc_jobs().min(sources.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(src) = sources.get(i) else { return done };
                            let stem = src.file_stem().unwrap().to_string_lossy();
                            let obj = out.join(format!("{stem}.sm_{arch}.cubin"));
                            let report = run_reporting(
                                Command::new(nvcc)
                                    .args([
                                        &format!("-arch=sm_{arch}"),
                                        "-rdc=true",
                                        "-cubin",
                                        "-O3",
                                        "-std=c++17",
                                        "-lineinfo",
                                        "-Xptxas=-v",
                                    ])
                                    // A profiling build: phase stamps (kernels/core/phases.cuh).
                                    .args(phases.then_some("-DSHMEM_PHASES"))
                                    .args(phases.then(phase_block))
                                    .arg("-I")
                                    .arg(kernels)
                                    .arg("-I")
                                    .arg(nvshmem.join("include"))
                                    .arg(src)
                                    .arg("-o")
                                    .arg(&obj),
                            );
                            let mut stacks = stacks.lock().expect("the stack frames");
                            for (name, bytes) in stack_frames(&report) {
                                stacks.push_str(&format!("sm_{arch} {name} {bytes}\n"));
                            }
                            done.push((i, obj));
                        }
                    })
                })
                .collect();
            let mut all: Vec<(usize, PathBuf)> =
                workers.into_iter().flat_map(|w| w.join().expect("an nvcc worker")).collect();
            // The sources' order, whichever worker compiled each.
            all.sort();
            all.into_iter().map(|(_, obj)| obj).collect()
        });
        let linked = out.join(format!("shmem_kernels.sm_{arch}.cubin"));
        run(Command::new(&nvlink)
            .arg(format!("--arch=sm_{arch}"))
            .args(&objects)
            .arg(device_lib)
            .arg("-o")
            .arg(&linked));
        images.push((arch.clone(), linked));
    }
    let stacks = stacks.into_inner().expect("the stack frames");
    // Several architectures: one fat binary, from which the driver picks.
    if let [(_, only)] = images.as_slice() {
        return (only.clone(), stacks);
    }
    let fat = out.join("shmem_kernels.fatbin");
    let mut cmd = Command::new(nvcc.with_file_name("fatbinary"));
    cmd.arg("--64").arg(format!("--create={}", fat.display()));
    for (arch, image) in &images {
        cmd.arg(format!("--image3=kind=elf,sm={arch},file={}", image.display()));
    }
    run(&mut cmd);
    (fat, stacks)
}

/// The kernels' stack frames in ptxas's report (`-Xptxas=-v`): each
/// `Function properties for NAME` line, then its `N bytes stack frame`.
/// Kernels only: their names are not mangled, device functions' are.
fn stack_frames(report: &str) -> Vec<(String, u64)> {
    let mut frames = Vec::new();
    let mut name: Option<&str> = None;
    for line in report.lines() {
        if let Some((_, n)) = line.split_once("Function properties for ") {
            name = Some(n.trim());
        } else if let (Some(n), Some(at)) = (name, line.find(" bytes stack frame")) {
            let bytes = line[..at].split_whitespace().last().and_then(|b| b.parse().ok());
            if let (false, Some(bytes)) = (n.starts_with("_Z"), bytes) {
                frames.push((n.to_owned(), bytes));
            }
            name = None;
        }
    }
    frames
}

/// `major.minor.patch` of the NVSHMEM headers the kernels are built with.
fn nvshmem_version(home: &Path) -> String {
    let text = std::fs::read_to_string(home.join("include/non_abi/nvshmem_version.h")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("#define NVSHMEM_VENDOR_{name}_VERSION ")))
            .map_or("?".to_owned(), |v| v.trim().to_owned())
    };
    format!("{}.{}.{}", field("MAJOR"), field("MINOR"), field("PATCH"))
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed with {status}");
}

/// Runs `cmd` and returns what it wrote to stderr (where nvcc passes on
/// ptxas's report); on failure, panics with it.
fn run_reporting(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed with {}:\n{stdout}{stderr}", out.status);
    stderr.into_owned()
}
