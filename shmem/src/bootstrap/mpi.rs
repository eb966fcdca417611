//! Bootstrap of a job started by an MPI launcher (`mpirun`, `mpiexec`, `srun`), through rsmpi.
//!
//! MPI carries the few small messages of `init` and, in a job of more than one node, the control
//! plane's messages between nodes ([`MpiNet`]); it is never on the data path.
//!
//! If the program initialised MPI itself before calling `shmem::init`, this bootstrap uses that
//! MPI and leaves finalizing it to the program. Otherwise it initialises MPI and finalizes it when
//! dropped. MPI cannot be initialised again once finalized, so a process whose MPI was finalized
//! gets an error from [`MpiBootstrap::init`].
//!
//! Errors inside MPI calls are not returned: `MPI_COMM_WORLD`'s default error handler
//! (`MPI_ERRORS_ARE_FATAL`) aborts the whole job, which `mpirun` reports.

use super::Incoming;
use crate::error::{Error, Result};
use ::mpi::datatype::PartitionMut;
use ::mpi::environment::Universe;
use ::mpi::ffi;
use ::mpi::point_to_point::MatchedReceiveVec;
use ::mpi::raw::AsRaw;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator, CommunicatorCollectives, Source};
use ::mpi::{Count, Threading};
use std::fmt;

/// The start-up channel of a job launched by an MPI launcher.
///
/// The world communicator is `MPI_COMM_WORLD`, which rsmpi hands out by value
/// ([`SimpleCommunicator::world`]) on each use rather than storing it: a stored
/// `SimpleCommunicator` would make this type (and so the whole bootstrap) neither `Send` nor
/// `Sync`, and `MPI_COMM_WORLD` needs no freeing.
pub(crate) struct MpiBootstrap {
    /// `Some` if this bootstrap initialised MPI: dropping the `Universe` calls `MPI_Finalize`.
    /// `None` if the program had initialised MPI already and is in charge of finalizing it.
    owned: Option<Universe>,
    /// This process's rank in `MPI_COMM_WORLD`.
    rank: usize,
    /// Number of processes in `MPI_COMM_WORLD`.
    size: usize,
    /// The thread level MPI provides.
    threading: Threading,
}

impl MpiBootstrap {
    /// Initialises MPI, or uses it as it is if the program already initialised it (in that case
    /// dropping the bootstrap does not finalize MPI).
    ///
    /// MPI is asked for `MPI_THREAD_SERIALIZED`: the bootstrap is called from one thread at a
    /// time (`&mut self`), but not necessarily from the thread that initialised MPI.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] if MPI was already finalized in this process (MPI cannot be
    /// initialised twice), or if MPI reports a rank or size that is not usable.
    pub(crate) fn init() -> Result<MpiBootstrap> {
        if ::mpi::is_finalized() {
            return Err(Error::bootstrap(
                "MPI has already been finalized in this process and cannot be initialised again: \
                 a process started by an MPI launcher can initialise shmem only once, unless the \
                 program itself initialises MPI before the first shmem init and finalizes it \
                 after the last",
            ));
        }
        // `None`: MPI was initialised before us (by the program, or by a library it uses).
        let owned = ::mpi::initialize_with_threading(Threading::Serialized).map(|(u, _)| u);
        let threading = ::mpi::environment::threading_support();
        let world = SimpleCommunicator::world();
        let (rank, size) = match (usize::try_from(world.rank()), usize::try_from(world.size())) {
            (Ok(rank), Ok(size)) if rank < size => (rank, size),
            _ => {
                let msg = format!("MPI returned rank {} of {}", world.rank(), world.size());
                return Err(Error::bootstrap(msg));
            }
        };
        Ok(MpiBootstrap { owned, rank, size, threading })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in `MPI_COMM_WORLD`.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Gathers `data` from every rank (lengths may differ), in rank order: an `MPI_Allgather` of
    /// the lengths, then an `MPI_Allgatherv` of the bytes.
    ///
    /// # Collective
    /// Every rank of `MPI_COMM_WORLD` calls it the same number of times.
    ///
    /// # Errors
    /// [`Error::Bootstrap`], on every rank alike, if the bytes of all ranks together exceed what
    /// one MPI call can address (`i32::MAX` bytes).
    pub(crate) fn allgather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let world = SimpleCommunicator::world();

        // Every rank learns every length, so all ranks take the same decision below: none of
        // them can return early from a collective that the others then wait in.
        let my_len = data.len() as u64;
        let mut lens = vec![0u64; self.size];
        world.all_gather_into(&my_len, &mut lens[..]);

        let mut counts: Vec<Count> = Vec::with_capacity(self.size);
        let mut displs: Vec<Count> = Vec::with_capacity(self.size);
        let mut total: Count = 0;
        for &len in &lens {
            let count = Count::try_from(len).ok();
            let end = count.and_then(|c| total.checked_add(c));
            let (Some(count), Some(end)) = (count, end) else {
                let all: u64 = lens.iter().sum();
                return Err(Error::bootstrap(format!(
                    "MPI allgather of {all} bytes in total (this rank: {my_len}) exceeds the {} \
                     bytes one MPI call can carry",
                    Count::MAX
                )));
            };
            counts.push(count);
            displs.push(total);
            total = end;
        }

        // An empty slice's pointer is dangling, `0x1` for bytes, and Open MPI's `MPI_IN_PLACE`
        // is `(void *)1`: neither buffer handed to MPI may be an empty allocation, or MPI takes
        // it for `MPI_IN_PLACE` (wrong data when sending, `MPI_ERR_ARG` when receiving).
        let one = [0u8; 1];
        let send = if data.is_empty() { &one[..0] } else { data };
        // Counts and displacements are in 0..=Count::MAX, so `as usize` is lossless.
        let mut buf = vec![0u8; (total as usize).max(1)];
        {
            let mut partition = PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
            world.all_gather_varcount_into(send, &mut partition);
        }

        Ok(counts
            .iter()
            .zip(&displs)
            .map(|(&count, &displ)| buf[displ as usize..(displ + count) as usize].to_vec())
            .collect())
    }

    /// Becomes the job's message channel between PEs after `init` ([`MpiNet`]).
    ///
    /// # Collective
    /// Every rank calls it (it duplicates `MPI_COMM_WORLD`).
    ///
    /// # Errors
    /// [`Error::Bootstrap`], on every rank alike, if MPI provides less than
    /// `MPI_THREAD_SERIALIZED`: the control plane calls MPI from whichever thread waits, one at
    /// a time.
    pub(crate) fn into_net(self) -> Result<MpiNet> {
        if self.threading < Threading::Serialized {
            return Err(Error::bootstrap(format!(
                "MPI provides the thread level {:?}, but the channel between nodes needs at least \
                 Serialized (MPI is called from more than one thread, one at a time)",
                self.threading
            )));
        }
        let comm = Comm(SimpleCommunicator::world().duplicate());
        Ok(MpiNet { comm: Some(comm), pending: Vec::new(), boot: self })
    }
}

impl Drop for MpiBootstrap {
    /// Finalizes MPI if this bootstrap initialised it (the `Universe`'s own drop does that), but
    /// aborts the whole job instead if the thread is unwinding from a panic: `MPI_Finalize` waits
    /// for every rank, and the others may be waiting for this one in a collective, so the job
    /// would hang instead of failing.
    fn drop(&mut self) {
        if self.owned.is_some() && std::thread::panicking() {
            let (rank, size) = (self.rank, self.size);
            eprintln!("shmem: rank {rank} of {size} panicked holding MPI: aborting the MPI job");
            SimpleCommunicator::world().abort(PANIC_EXIT_CODE);
        }
    }
}

/// Exit code of a job aborted by [`MpiBootstrap`]'s drop during a panic: that of a Rust program
/// that panicked.
const PANIC_EXIT_CODE: i32 = 101;

impl fmt::Debug for MpiBootstrap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiBootstrap")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("finalizes_mpi", &self.owned.is_some())
            .field("threading", &self.threading)
            .finish()
    }
}

/// A communicator that may move between threads.
struct Comm(SimpleCommunicator);

// SAFETY: an MPI communicator is a handle that any thread may use under
// `MPI_THREAD_SERIALIZED` as long as no two threads call MPI at once; rsmpi
// marks it neither `Send` nor `Sync` only because the handle is a raw
// pointer in Open MPI. [`MpiNet`] is the only user of its communicator, and
// every call to it takes `&mut MpiNet`, which the control plane holds under
// one lock ([`MpiBootstrap::into_net`] checks the thread level).
unsafe impl Send for Comm {}

/// The message channel between PEs after `init` in a job started by an MPI launcher: a
/// duplicate of `MPI_COMM_WORLD` (so no message of the program's own can match), point-to-point
/// messages of one tag.
///
/// A send is immediate (`MPI_Isend`): its buffer is kept until MPI reports it complete, which
/// each later send or poll tests, so a send never waits for its receiver (which may be waiting
/// for this PE's messages in turn). Each rank's messages to another arrive in the order sent
/// (MPI's non-overtaking rule, one communicator and one tag).
///
/// Liveness: MPI reports no PE's end, so [`Incoming::Gone`] never comes from here: under
/// `mpirun` a rank that dies makes the launcher abort the whole job (Open MPI's default), and a
/// wait for a PE that has finalized ends by its timeout.
///
/// [`MpiNet::close`] (or a drop) waits for the pending sends, and then for every rank
/// (`MPI_Ibarrier` on the duplicate, receiving meanwhile) so that no rank finalizes MPI while
/// messages to it are in flight; then it frees the communicator and drops the bootstrap, which
/// finalizes MPI if it initialised it.
pub(crate) struct MpiNet {
    /// `None` once closed. Declared before `boot`: freed before MPI is finalized.
    comm: Option<Comm>,
    /// Sends not yet complete, with their buffers (a `Vec`'s heap buffer does not move when the
    /// `Vec` is moved).
    pending: Vec<(ffi::MPI_Request, Vec<u8>)>,
    boot: MpiBootstrap,
}

// SAFETY: the requests are MPI handles, used under the same rule as `Comm`.
unsafe impl Send for MpiNet {}

/// The tag of the control plane's messages.
const TAG: i32 = 0;

impl MpiNet {
    /// This process's rank in the world.
    pub(crate) fn rank(&self) -> usize {
        self.boot.rank
    }

    /// Number of processes in the world.
    pub(crate) fn size(&self) -> usize {
        self.boot.size
    }

    fn comm(&self) -> Result<&SimpleCommunicator> {
        self.comm.as_ref().map(|c| &c.0).ok_or_else(|| Error::bootstrap("the MPI channel is closed"))
    }

    /// Sends `body` to rank `to` (which may be this rank) without waiting for it to arrive.
    pub(crate) fn send(&mut self, to: usize, body: &[u8]) -> Result<()> {
        self.test_pending();
        let size = self.boot.size;
        if to >= size {
            return Err(Error::bootstrap(format!("a message to PE {to}, in a world of {size} PEs")));
        }
        let count = Count::try_from(body.len()).map_err(|_| {
            Error::bootstrap(format!("a message of {} bytes exceeds what one MPI call can carry", body.len()))
        })?;
        // Never an empty allocation: its dangling pointer would read as `MPI_IN_PLACE`.
        let mut buf = Vec::with_capacity(body.len().max(1));
        buf.extend_from_slice(body);
        let raw = self.comm()?.as_raw();
        // SAFETY: `buf` stays in `pending`, untouched, until MPI reports the send complete.
        let request = unsafe {
            let mut request = ffi::RSMPI_REQUEST_NULL;
            ffi::MPI_Isend(buf.as_ptr().cast(), count, ffi::RSMPI_UINT8_T, to as i32, TAG, raw, &mut request);
            request
        };
        self.pending.push((request, buf));
        Ok(())
    }

    /// Everything that has arrived, in arrival order, without waiting.
    pub(crate) fn poll(&mut self) -> Result<Vec<Incoming>> {
        self.test_pending();
        let comm = self.comm()?;
        let mut got = Vec::new();
        while let Some(matched) = comm.any_process().immediate_matched_probe_with_tag(TAG) {
            let (body, status) = matched.matched_receive_vec::<u8>();
            let from = usize::try_from(status.source_rank())
                .map_err(|_| Error::bootstrap(format!("an MPI message from rank {}", status.source_rank())))?;
            got.push(Incoming::Message { from, body });
        }
        Ok(got)
    }

    /// Drops the sends that MPI reports complete.
    fn test_pending(&mut self) {
        self.pending.retain_mut(|(request, _)| {
            let mut done = 0;
            // SAFETY: `request` is an active request of this channel; MPI_Test sets it to
            // MPI_REQUEST_NULL once complete.
            unsafe { ffi::MPI_Test(request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            done == 0
        });
    }

    /// Completes the pending sends, then waits for every rank to have done so, receiving (and
    /// dropping) what still arrives meanwhile, so that no send waits for a receiver that no
    /// longer polls.
    ///
    /// # Collective
    /// Every rank calls it (through [`MpiNet::close`] or a drop).
    fn flush(&mut self) {
        let Some(comm) = self.comm.take() else { return };
        // A panicking rank aborts the job (the bootstrap's drop) rather than wait for the others.
        if std::thread::panicking() {
            std::mem::forget(std::mem::take(&mut self.pending));
            std::mem::forget(comm);
            return;
        }
        self.comm = Some(comm);
        let mut barrier: Option<ffi::MPI_Request> = None;
        loop {
            self.test_pending();
            let _ = self.poll();
            let Ok(raw) = self.comm().map(|c| c.as_raw()) else { return };
            match &mut barrier {
                None if self.pending.is_empty() => {
                    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
                    // SAFETY: a non-blocking barrier on this channel's communicator.
                    unsafe { ffi::MPI_Ibarrier(raw, &mut request) };
                    barrier = Some(request);
                }
                None => {}
                Some(request) => {
                    let mut done = 0;
                    // SAFETY: the barrier's active request.
                    unsafe { ffi::MPI_Test(request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
                    if done != 0 {
                        break;
                    }
                }
            }
            std::thread::yield_now();
        }
        // Frees the duplicate communicator.
        self.comm = None;
    }

    /// Completes this rank's part in the channel (see [`MpiNet::flush`]), then drops the
    /// bootstrap, which finalizes MPI if it initialised it.
    ///
    /// # Collective
    /// Every rank calls it.
    pub(crate) fn close(mut self) {
        self.flush();
    }
}

impl Drop for MpiNet {
    fn drop(&mut self) {
        self.flush();
    }
}
