//! How the PEs of a job find each other at start-up.
//!
//! A bootstrap carries the few small messages of `init` (host names,
//! process ids, the name of the shared heap or NVSHMEM's unique id); every
//! operation after `init` goes through the backend itself. A job whose PEs
//! need to reach each other outside the backend after `init` (across
//! nodes, say) keeps the bootstrap's channel as a `Net` instead of
//! closing it.
//!
//! Three ways in, chosen from the environment:
//! - `shmemrun` (or [`crate::launch`]) sets `SHMEM_RANK`, `SHMEM_WORLD_SIZE`,
//!   `SHMEM_LOCAL_RANK`, `SHMEM_LOCAL_SIZE` and `SHMEM_RENDEZVOUS`
//!   (`127.0.0.1:port` of the launcher's rendezvous server);
//! - `mpirun`/`srun` (feature `mpi`): rank and size from MPI;
//! - neither: a world of one PE.

use crate::error::{Error, Result};
use crate::shm::Mapping;
pub(crate) use relay::Incoming;
use std::collections::VecDeque;
use std::time::Duration;

pub(crate) mod exit;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
#[cfg_attr(not(test), allow(dead_code, reason = "rank and size serve its tests"))]
pub(crate) mod relay;
pub(crate) mod server;
pub(crate) mod tcp;

/// Environment variables set by the launcher for each PE.
pub mod env {
    /// This PE's rank in the world.
    pub const RANK: &str = "SHMEM_RANK";
    /// Number of PEs in the world.
    pub const WORLD_SIZE: &str = "SHMEM_WORLD_SIZE";
    /// This PE's rank among the PEs of its node.
    pub const LOCAL_RANK: &str = "SHMEM_LOCAL_RANK";
    /// Number of PEs on this node.
    pub const LOCAL_SIZE: &str = "SHMEM_LOCAL_SIZE";
    /// The name of this PE's node, where it is not the host's: the PEs
    /// that share a value form one node. `shmemrun --nodes K` sets
    /// `node0` … `node<K-1>` to emulate K nodes on one machine, and unsets
    /// it otherwise.
    pub const NODE_ID: &str = "SHMEM_NODE_ID";
    /// `host:port` of the launcher's rendezvous server.
    pub const RENDEZVOUS: &str = "SHMEM_RENDEZVOUS";
    /// The job's random token (32 hex digits): the rendezvous server turns
    /// away a connection that does not present it.
    pub const RENDEZVOUS_TOKEN: &str = "SHMEM_RENDEZVOUS_TOKEN";
}

/// The start-up channel between the PEs of one job.
pub(crate) enum Bootstrap {
    /// No launcher: a world of one PE.
    Single,
    /// Started by `shmemrun`: the launcher's rendezvous server.
    Tcp(tcp::Client),
    /// Started by `mpirun`/`srun`.
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiBootstrap),
}

/// Whether this process looks like one rank of an MPI job.
pub(crate) fn started_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_STEP_NUM_TASKS"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Whether this process was started as one PE of a job (by any launcher).
pub fn started_by_launcher() -> bool {
    std::env::var_os(env::RANK).is_some() || started_by_mpi()
}

impl Bootstrap {
    /// Makes one shared-memory object per group of PEs and maps it on each
    /// group's PEs: `creator` (this PE's group's) runs `create`, which names,
    /// creates and initialises the object; its name travels with its "ok";
    /// every PE maps its group's object (`wrap` checks the mapping), all agree
    /// that they did, and every PE unlinks the name (all but the first find it
    /// gone), so that it goes also when its creator died during that agreement.
    /// A creator dead before its peers learnt the name leaves it to the
    /// launcher (`shmemrun` removes `shmem-<pid of PE 0>-…` after a failed job).
    ///
    /// # Collective
    /// Every PE of the job calls it, once per kind of object.
    pub(crate) fn share_object<T>(
        &mut self,
        me: usize,
        creator: usize,
        len: usize,
        what: &str,
        create: impl FnOnce() -> Result<(String, Mapping)>,
        wrap: impl FnOnce(Mapping) -> Result<T>,
    ) -> Result<T> {
        let created = if me == creator { create().map(Some) } else { Ok(None) };
        let (mine, created) = match created {
            Ok(Some((name, map))) => (Ok(name.clone().into_bytes()), Some((name, map))),
            Ok(None) => (Ok(Vec::new()), None),
            Err(e) => (Err(e), None),
        };
        let names = match self.agree_ok(mine, &format!("creating the {what}")) {
            Ok(names) => names,
            Err(e) => {
                // Another group's creator failed, or a PE left: nobody opens ours.
                if let Some((name, _)) = &created {
                    Mapping::unlink(name);
                }
                return Err(e);
            }
        };
        let name = String::from_utf8_lossy(&names[creator]).into_owned();
        let map = match created {
            Some((_, map)) => Ok(map),
            None => Mapping::open(&name, len),
        };
        let wrapped = map.and_then(wrap);
        let (mine, wrapped) = match wrapped {
            Ok(w) => (Ok(Vec::new()), Some(w)),
            Err(e) => (Err(e), None),
        };
        let outcome = self.agree_ok(mine, &format!("mapping the {what}"));
        // Everyone has mapped it (or failed): the name is no longer needed.
        Mapping::unlink(&name);
        outcome?;
        Ok(wrapped.expect("the agreement passed, so this PE mapped the object"))
    }

    /// Exchanges "ok" with a payload, or an error message; fails on every PE
    /// if any PE failed, else returns every PE's payload.
    pub(crate) fn agree_ok(&mut self, mine: Result<Vec<u8>>, step: &str) -> Result<Vec<Vec<u8>>> {
        let msg = match &mine {
            Ok(payload) => [&[0u8][..], payload].concat(),
            Err(e) => [&[1u8][..], e.to_string().as_bytes()].concat(),
        };
        let all = self.allgather(&msg)?;
        mine?;
        for (pe, m) in all.iter().enumerate() {
            if m.first() != Some(&0) {
                return Err(Error::bootstrap(format!(
                    "{step} failed on PE {pe}: {}",
                    String::from_utf8_lossy(m.get(1..).unwrap_or_default())
                )));
            }
        }
        Ok(all.into_iter().map(|m| m[1..].to_vec()).collect())
    }

    /// Joins the job this process was started in; waits at most `timeout`
    /// for the other PEs.
    pub(crate) fn from_env(timeout: Duration) -> Result<Bootstrap> {
        if std::env::var_os(env::RANK).is_some() {
            return tcp::Client::connect_from_env(timeout).map(Bootstrap::Tcp);
        }
        if started_by_mpi() {
            #[cfg(feature = "mpi")]
            return mpi::MpiBootstrap::init().map(Bootstrap::Mpi);
            #[cfg(not(feature = "mpi"))]
            {
                let size = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"]
                    .iter()
                    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
                    .unwrap_or(1);
                if size > 1 {
                    return Err(Error::bootstrap(format!(
                        "started by an MPI launcher with {size} ranks, but shmem was built without \
                         the `mpi` feature (rebuild with `--features mpi`, or launch with shmemrun)"
                    )));
                }
            }
        }
        Ok(Bootstrap::Single)
    }

    /// This PE's rank in the world.
    pub(crate) fn rank(&self) -> usize {
        match self {
            Bootstrap::Single => 0,
            Bootstrap::Tcp(c) => c.rank(),
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(m) => m.rank(),
        }
    }

    /// Number of PEs in the world.
    pub(crate) fn size(&self) -> usize {
        match self {
            Bootstrap::Single => 1,
            Bootstrap::Tcp(c) => c.size(),
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(m) => m.size(),
        }
    }

    /// Gathers `data` from every PE (lengths may differ), in rank order.
    ///
    /// # Collective
    /// Every PE calls it the same number of times.
    pub(crate) fn allgather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self {
            Bootstrap::Single => Ok(vec![data.to_vec()]),
            Bootstrap::Tcp(c) => c.allgather(data),
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(m) => m.allgather(data),
        }
    }

    /// Ends the bootstrap's part in the job. Called once `init` is done with it.
    pub(crate) fn close(&mut self) {
        if let Bootstrap::Tcp(c) = self {
            c.close();
        }
    }

    /// Keeps the bootstrap's channel as a [`Net`] for messages between PEs
    /// after `init`; called instead of [`Bootstrap::close`] once `init` is
    /// done with its allgathers. Under `shmemrun` the launcher relays the
    /// messages ([`relay::Relay`]); under MPI, point-to-point messages on a
    /// duplicate of the world communicator ([`mpi::MpiNet`]); a world of one
    /// PE sends only to itself.
    ///
    /// # Errors
    /// [`crate::Error::Bootstrap`] if the rendezvous connection has failed,
    /// or if MPI provides less than `MPI_THREAD_SERIALIZED`.
    pub(crate) fn into_net(self) -> Result<Net> {
        match self {
            Bootstrap::Single => Ok(Net::Alone(VecDeque::new())),
            Bootstrap::Tcp(c) => c.into_relay().map(Net::Relay),
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(m) => m.into_net().map(Net::Mpi),
        }
    }
}

/// The message channel between the PEs of a job after `init`, from
/// [`Bootstrap::into_net`]: messages to any PE, and the news of PEs that
/// have ended. Each PE's messages to another arrive in the order sent, and
/// the news of a PE's end after all its messages.
pub(crate) enum Net {
    /// A world of one PE: messages to itself.
    Alone(VecDeque<Incoming>),
    /// Relayed by the launcher's rendezvous server.
    Relay(relay::Relay),
    /// Over MPI, started by `mpirun`/`srun`. It brings no news of PEs'
    /// ends: an MPI launcher aborts the whole job when a rank dies.
    #[cfg(feature = "mpi")]
    Mpi(mpi::MpiNet),
}

#[cfg_attr(not(test), allow(dead_code, reason = "rank and size serve its tests"))]
impl Net {
    /// This PE's rank in the world.
    pub(crate) fn rank(&self) -> usize {
        match self {
            Net::Alone(_) => 0,
            Net::Relay(r) => r.rank(),
            #[cfg(feature = "mpi")]
            Net::Mpi(m) => m.rank(),
        }
    }

    /// Number of PEs in the world.
    pub(crate) fn size(&self) -> usize {
        match self {
            Net::Alone(_) => 1,
            Net::Relay(r) => r.size(),
            #[cfg(feature = "mpi")]
            Net::Mpi(m) => m.size(),
        }
    }

    /// Sends `body` to PE `to` (which may be this PE). A message to a PE
    /// that has ended is dropped; its [`Incoming::Gone`] says so.
    pub(crate) fn send(&mut self, to: usize, body: &[u8]) -> Result<()> {
        match self {
            Net::Alone(queue) if to == 0 => {
                queue.push_back(Incoming::Message { from: 0, body: body.to_vec() });
                Ok(())
            }
            Net::Alone(_) => Err(Error::bootstrap(format!("a message to PE {to}, in a world of 1 PE"))),
            Net::Relay(r) => r.send(to, body),
            #[cfg(feature = "mpi")]
            Net::Mpi(m) => m.send(to, body),
        }
    }

    /// Everything that has arrived since the last call, in arrival order,
    /// without waiting.
    pub(crate) fn poll(&mut self) -> Result<Vec<Incoming>> {
        match self {
            Net::Alone(queue) => Ok(queue.drain(..).collect()),
            Net::Relay(r) => r.poll(),
            #[cfg(feature = "mpi")]
            Net::Mpi(m) => m.poll(),
        }
    }

    /// Whether [`Net::poll`] may be called from a thread of shmem's own
    /// (one at a time): not under MPI, where the program's own MPI calls may
    /// run beside it.
    pub(crate) fn polls_from_any_thread(&self) -> bool {
        match self {
            Net::Alone(_) | Net::Relay(_) => true,
            #[cfg(feature = "mpi")]
            Net::Mpi(_) => false,
        }
    }

    /// Says goodbye: the other PEs hear that this PE left. Dropping a `Net`
    /// without it looks like this PE's death to them. Under MPI it is
    /// collective instead: it waits for every rank's pending messages
    /// before MPI may be finalized.
    pub(crate) fn close(self) {
        match self {
            Net::Alone(_) => {}
            Net::Relay(r) => r.close(),
            #[cfg(feature = "mpi")]
            Net::Mpi(m) => m.close(),
        }
    }
}
