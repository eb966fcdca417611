//! Bootstrap of a job started by an MPI launcher (`mpirun`, `mpiexec`, `srun`), through rsmpi.
//!
//! MPI only carries the few small messages of `init`; it is never on the data path.
//!
//! If the program initialised MPI itself before calling `shmem::init`, this bootstrap uses that
//! MPI and leaves finalizing it to the program. Otherwise it initialises MPI and finalizes it when
//! dropped. MPI cannot be initialised again once finalized, so a process whose MPI was finalized
//! gets an error from [`MpiBootstrap::init`].
//!
//! Errors inside MPI calls are not returned: `MPI_COMM_WORLD`'s default error handler
//! (`MPI_ERRORS_ARE_FATAL`) aborts the whole job, which `mpirun` reports.

use crate::error::{Error, Result};
use ::mpi::datatype::PartitionMut;
use ::mpi::environment::Universe;
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::{Communicator, CommunicatorCollectives};
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
        let world = SimpleCommunicator::world();
        let (rank, size) = match (usize::try_from(world.rank()), usize::try_from(world.size())) {
            (Ok(rank), Ok(size)) if rank < size => (rank, size),
            _ => {
                let msg = format!("MPI returned rank {} of {}", world.rank(), world.size());
                return Err(Error::bootstrap(msg));
            }
        };
        Ok(MpiBootstrap { owned, rank, size })
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
            .finish()
    }
}
