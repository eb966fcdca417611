//! The host backend: PEs are processes of one node sharing one POSIX
//! shared-memory object that holds a small control area and every PE's
//! symmetric heap.
//!
//! Layout of the object (`n` PEs, heap size `h`, both agreed at init):
//!
//! ```text
//! [ header: 4 KiB ][ PeCell 0 ]..[ PeCell n-1 ][ heap 0: h ]..[ heap n-1: h ]
//! ```
//!
//! Each `PeCell` is written only by its PE (its pid and state, and per team
//! slot a barrier counter and two descriptor rows) and read by the others;
//! everything in it is an atomic, so references to it are sound across
//! processes.

pub(crate) mod asan;
pub(crate) mod shm;

use crate::error::{Error, Result};
use asan::HeapMarks;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Team slots per PE (world and node take two).
pub(crate) const MAX_TEAMS: usize = 64;
/// Words of one collective descriptor.
pub(crate) const DESC_WORDS: usize = 8;
const HEADER_BYTES: usize = 4096;
const MAGIC: u64 = 0x7368_6d65_6d5f_6831; // "shmem_h1"

/// A PE's life as its peers see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeState {
    // 0: not yet joined (fresh shared memory).
    Running = 1,
    Finalized = 2,
    /// Its context was dropped without `finalize`.
    Exited = 3,
}

/// Per-PE, per-team control words.
#[repr(C, align(64))]
pub(crate) struct TeamCell {
    /// Barriers this PE has entered on this slot (monotonic).
    pub(crate) epoch: AtomicU64,
    /// Barriers this PE has entered on the team now in this slot.
    pub(crate) arrivals: AtomicU64,
    /// Two rows of descriptors, by sequence parity: an exchange writes row
    /// `seq & 1`, and the barrier after it keeps anyone from reaching
    /// `seq + 2` (the same row) before every member has read row `seq`.
    pub(crate) desc: [[AtomicU64; DESC_WORDS]; 2],
}

#[repr(C, align(64))]
pub(crate) struct PeCell {
    pub(crate) pid: AtomicU64,
    pub(crate) state: AtomicU64,
    /// While this PE waits in a barrier: that team's id (0: not waiting),
    /// and the arrivals it waits for.
    pub(crate) waiting_team: AtomicU64,
    pub(crate) waiting_target: AtomicU64,
    pub(crate) teams: [TeamCell; MAX_TEAMS],
}

#[repr(C)]
struct Header {
    magic: AtomicU64,
    n_pes: AtomicU64,
    heap_size: AtomicU64,
}

const fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

const CELL_STRIDE: usize = round_up(std::mem::size_of::<PeCell>(), 4096);

/// Total size of the shared object for `n` PEs with `heap_size` bytes each.
pub(crate) fn object_size(n: usize, heap_size: usize) -> Option<usize> {
    let cells = CELL_STRIDE.checked_mul(n)?;
    heap_size.checked_mul(n)?.checked_add(HEADER_BYTES + cells)
}

/// This PE's view of the shared object.
pub(crate) struct HostWorld {
    map: shm::Mapping,
    me: usize,
    n: usize,
    heap_size: usize,
    wait_timeout: Option<Duration>,
    /// ASan builds: the heaps' marks, all poisoned until allocated.
    marks: Option<HeapMarks>,
}

impl HostWorld {
    /// Writes the header of a freshly created object (PE 0, before any
    /// other PE opens it).
    pub(crate) fn init_header(map: &shm::Mapping, n: usize, heap_size: usize) {
        // SAFETY: the header lies at the start of the page-aligned mapping;
        // its fields are atomics.
        let h = unsafe { &*map.base().cast::<Header>() };
        h.n_pes.store(n as u64, Ordering::Relaxed);
        h.heap_size.store(heap_size as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// Wraps a mapping of `object_size(n, heap_size)` bytes whose header PE
    /// 0 wrote, and publishes this PE's pid.
    pub(crate) fn new(
        map: shm::Mapping,
        me: usize,
        n: usize,
        heap_size: usize,
        wait_timeout: Option<Duration>,
    ) -> Result<HostWorld> {
        assert_eq!(Some(map.len()), object_size(n, heap_size));
        let mut w = HostWorld { map, me, n, heap_size, wait_timeout, marks: None };
        w.marks = HeapMarks::new(w.heap_ptr(0, 0), heap_size, n);
        if let Some(marks) = w.marks {
            marks.freed(0, heap_size);
        }
        let h = w.header();
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.n_pes.load(Ordering::Relaxed) != n as u64
            || h.heap_size.load(Ordering::Relaxed) != heap_size as u64
        {
            return Err(Error::bootstrap("shared heap header does not match this job"));
        }
        let cell = w.cell(me);
        cell.pid.store(std::process::id() as u64, Ordering::SeqCst);
        cell.state.store(PeState::Running as u64, Ordering::SeqCst);
        Ok(w)
    }

    fn header(&self) -> &Header {
        // SAFETY: the header lies at the start of the mapping, which is
        // page-aligned and at least HEADER_BYTES long; all fields are atomics.
        unsafe { &*self.map.base().cast::<Header>() }
    }

    /// The control cell of `pe`.
    pub(crate) fn cell(&self, pe: usize) -> &PeCell {
        assert!(pe < self.n);
        // SAFETY: cells lie after the header at CELL_STRIDE (a multiple of
        // 4096, so aligned) intervals inside the mapping; all fields are
        // atomics, so shared references are sound across processes.
        unsafe { &*self.map.base().add(HEADER_BYTES + pe * CELL_STRIDE).cast::<PeCell>() }
    }

    /// Address of byte `offset` of `pe`'s symmetric heap.
    pub(crate) fn heap_ptr(&self, pe: usize, offset: usize) -> *mut u8 {
        assert!(pe < self.n && offset <= self.heap_size);
        // SAFETY: in bounds of the mapping by the asserts and `object_size`.
        unsafe { self.map.base().add(HEADER_BYTES + self.n * CELL_STRIDE + pe * self.heap_size + offset) }
    }

    /// ASan builds: the heaps' marks, for the allocator to keep.
    pub(crate) fn heap_marks(&self) -> Option<HeapMarks> {
        self.marks
    }

    pub(crate) fn set_state(&self, state: PeState) {
        self.cell(self.me).state.store(state as u64, Ordering::SeqCst);
    }

    /// How `pe` is doing: its published state, and whether its process lives.
    pub(crate) fn peer_problem(&self, pe: usize) -> Option<String> {
        let cell = self.cell(pe);
        let left = || match cell.state.load(Ordering::SeqCst) {
            s if s == PeState::Finalized as u64 => Some("has finalized".to_string()),
            s if s == PeState::Exited as u64 => Some("has left (its context was dropped without finalize)".to_string()),
            _ => None,
        };
        if let Some(p) = left() {
            return Some(p);
        }
        let pid = cell.pid.load(Ordering::SeqCst) as libc::pid_t;
        // A PE that left and exited between the two looks is gone with its
        // final state written: look again before calling it dead (seen in
        // CI: a PE that had left reported as died).
        (pid > 0 && !process_alive(pid)).then(|| left().unwrap_or_else(|| format!("died (process {pid} is gone)")))
    }

    /// Waits until `done()` holds. Spins briefly, then yields, then sleeps;
    /// every few milliseconds checks that the PEs in `awaited` are still
    /// alive, so a dead peer ends the wait with an error naming it, and runs
    /// `also` (which may find the wait hopeless).
    pub(crate) fn wait_until(
        &self,
        mut done: impl FnMut() -> bool,
        awaited: &mut dyn Iterator<Item = usize>,
        what: &dyn Fn() -> String,
        also: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let awaited: Vec<usize> = awaited.filter(|&pe| pe != self.me).collect();
        self.wait_loop(
            &mut done,
            &mut |w: &HostWorld| {
                // A dead PE is the news; peers that left after seeing it are echoes.
                let problems: Vec<(usize, String)> =
                    awaited.iter().filter_map(|&pe| w.peer_problem(pe).map(|p| (pe, p))).collect();
                match problems.iter().find(|(_, p)| p.starts_with("died")).or(problems.first()) {
                    Some((pe, p)) => Err(Error::PeerLost { pe: *pe, what: format!("{p} while {}", what()) }),
                    None => also(),
                }
            },
            what,
        )
    }

    /// Waits until `done()` holds, for a change that any PE may make (a
    /// signal): fails when a PE died, or when every other PE has left.
    pub(crate) fn wait_for_anyone(&self, mut done: impl FnMut() -> bool, what: &dyn Fn() -> String) -> Result<()> {
        self.wait_loop(
            &mut done,
            &mut |w: &HostWorld| {
                let mut others_alive = 0;
                for pe in (0..w.n).filter(|&pe| pe != w.me) {
                    match w.peer_problem(pe) {
                        Some(p) if p.starts_with("died") => {
                            return Err(Error::PeerLost { pe, what: format!("{p} while {}", what()) })
                        }
                        Some(_) => {}
                        None => others_alive += 1,
                    }
                }
                if others_alive == 0 && w.n > 1 {
                    return Err(Error::PeerLost {
                        pe: (w.me + 1) % w.n,
                        what: format!("and every other PE have left while {}", what()),
                    });
                }
                Ok(())
            },
            what,
        )
    }

    fn wait_loop(
        &self,
        done: &mut dyn FnMut() -> bool,
        check: &mut dyn FnMut(&HostWorld) -> Result<()>,
        what: &dyn Fn() -> String,
    ) -> Result<()> {
        for _ in 0..256 {
            if done() {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let start = Instant::now();
        let mut next_check = start + Duration::from_millis(1);
        loop {
            for _ in 0..16 {
                if done() {
                    return Ok(());
                }
                std::thread::yield_now();
            }
            let now = Instant::now();
            if now >= next_check {
                // Check the condition once more after the peers: a peer may
                // have done its part and then left.
                let alive = check(self);
                if done() {
                    return Ok(());
                }
                if matches!(alive, Err(Error::PeerLost { .. })) {
                    crate::gpu::note_fault();
                }
                alive?;
                if let Some(limit) = self.wait_timeout {
                    if now - start > limit {
                        crate::gpu::note_fault();
                        return Err(Error::Timeout { secs: (now - start).as_secs_f64(), what: what() });
                    }
                }
                next_check = now + Duration::from_millis(5);
            }
            if now - start > Duration::from_micros(200) {
                // Past the latency-sensitive window: give the cores to the
                // peers (PEs may outnumber cores, as in CI).
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

impl Drop for HostWorld {
    fn drop(&mut self) {
        // Before the mapping goes: a later mapping at these addresses (the
        // next context's) must not start out poisoned.
        if let Some(marks) = self.marks {
            marks.allocated(0, self.heap_size);
        }
    }
}

/// Whether process `pid` exists and is not a zombie.
fn process_alive(pid: libc::pid_t) -> bool {
    let exists = || {
        // SAFETY: signal 0 only checks for existence and permission.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    };
    if !exists() {
        return false;
    }
    // A dead child not yet reaped by its launcher is still there as a zombie.
    match proc_state(pid) {
        Some(state) => !matches!(state, 'Z' | 'X'),
        // Reaped since the first look (gone), or no /proc: ask again.
        None => exists(),
    }
}

/// The state letter of process `pid` (`R`, `S`, `Z` …) in `/proc`, if it
/// can be read. A process whose main thread has ended shows `Z`, even
/// while its other threads are still ending.
pub(crate) fn proc_state(pid: libc::pid_t) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 1..].trim_start().chars().next())
}
