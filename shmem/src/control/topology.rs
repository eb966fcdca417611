//! Which PEs share a node, and which share a machine.
//!
//! A node is the host name, or `SHMEM_NODE_ID` where set, so that one
//! machine can be split into emulated nodes. Every PE sends a [`Hello`] at
//! start-up and runs [`Topology::from_hellos`] on all of them: a pure
//! function of the same data, so every PE reaches the same topology, or the
//! same error.

use crate::bootstrap::tcp::wire::list_pes;
use crate::bootstrap::{env, Bootstrap};
use crate::error::{Error, Result};

/// The variable that names this PE's node.
pub(crate) const NODE_ID: &str = "SHMEM_NODE_ID";

/// What a PE tells the others at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) pid: u32,
    pub(crate) heap_size: u64,
    /// 0: host backend, 1: gpu, 2: gpu asked for but unavailable here.
    pub(crate) backend: u8,
    /// Its node: `SHMEM_NODE_ID` where set, else `real_host`.
    pub(crate) node: String,
    /// The host name of its machine.
    pub(crate) real_host: String,
    /// Whether `SHMEM_NODE_ID` was set.
    pub(crate) node_id_set: bool,
    /// The local rank and size its launcher gave it, if any.
    pub(crate) given_local: Option<(u32, u32)>,
}

const FIXED: usize = 4 + 8 + 1 + 1 + 4 + 4 + 4;

impl Hello {
    /// This PE's hello, from the environment its launcher (`boot`) made.
    pub(crate) fn mine(boot: &Bootstrap, heap_size: u64, backend: u8) -> Hello {
        let real_host = hostname();
        let node_id = std::env::var_os(NODE_ID).map(|v| v.to_string_lossy().into_owned());
        let number = |var: &str| std::env::var(var).ok()?.trim().parse::<u32>().ok();
        let pair = |rank: &str, size: &str| Some((number(rank)?, number(size)?));
        let given_local = match boot {
            Bootstrap::Single => None,
            // shmemrun sets them for every PE.
            Bootstrap::Tcp(_) => pair(env::LOCAL_RANK, env::LOCAL_SIZE),
            // MPI's are per machine: they say nothing of emulated nodes.
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(_) if node_id.is_some() => None,
            #[cfg(feature = "mpi")]
            Bootstrap::Mpi(_) => pair("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
                .or_else(|| pair("MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
        };
        Hello {
            pid: std::process::id(),
            heap_size,
            backend,
            node: node_id.clone().unwrap_or_else(|| real_host.clone()),
            real_host,
            node_id_set: node_id.is_some(),
            given_local,
        }
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FIXED + self.node.len() + self.real_host.len());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.heap_size.to_le_bytes());
        v.push(self.backend);
        v.push(self.node_id_set as u8 | (self.given_local.is_some() as u8) << 1);
        let (rank, size) = self.given_local.unwrap_or_default();
        v.extend_from_slice(&rank.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&(self.node.len() as u32).to_le_bytes());
        v.extend_from_slice(self.node.as_bytes());
        v.extend_from_slice(self.real_host.as_bytes());
        v
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Hello> {
        let malformed = || Error::bootstrap("malformed hello from a peer");
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        if b.len() < FIXED {
            return Err(malformed());
        }
        let node_len = u32_at(22) as usize;
        let names = &b[FIXED..];
        if names.len() < node_len {
            return Err(malformed());
        }
        let text = |t: &[u8]| String::from_utf8(t.to_vec()).map_err(|_| malformed());
        Ok(Hello {
            pid: u32_at(0),
            heap_size: u64::from_le_bytes(b[4..12].try_into().unwrap()),
            backend: b[12],
            node_id_set: b[13] & 1 != 0,
            given_local: (b[13] & 2 != 0).then(|| (u32_at(14), u32_at(18))),
            node: text(&names[..node_len])?,
            real_host: text(&names[node_len..])?,
        })
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into `buf`.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The job's nodes and machines, as every PE sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Topology {
    /// Each PE's node: an index into `nodes`.
    pub(crate) node_of: Vec<usize>,
    /// Each node's PEs in rank order (a PE's index is its local rank);
    /// nodes in the order of their lowest PE.
    pub(crate) nodes: Vec<Vec<usize>>,
    /// Each node's name.
    pub(crate) node_names: Vec<String>,
    pub(crate) my_node: usize,
    /// This PE's rank among the PEs of its node, and their number.
    pub(crate) local_rank: usize,
    pub(crate) local_size: usize,
    /// This PE's rank among the PEs of its machine (real host), and their
    /// number: emulated nodes share one machine's cores and GPUs.
    pub(crate) host_rank: usize,
    pub(crate) host_size: usize,
    /// This PE's machine's host name.
    pub(crate) machine: String,
}

impl Topology {
    /// The topology of the job whose PEs said `hellos`, seen from PE `me`.
    ///
    /// Fails with [`Error::Config`] when `SHMEM_NODE_ID` is set on some PEs
    /// only or empty, when one node spans two machines, when nodes run
    /// different numbers of PEs, or when local ranks given by the launcher
    /// are missing on some PEs or disagree with the nodes; with
    /// [`Error::BackendUnavailable`] when the host backend would span
    /// machines.
    pub(crate) fn from_hellos(hellos: &[Hello], me: usize) -> Result<Topology> {
        let n = hellos.len();
        let pes_where = |f: &dyn Fn(&Hello) -> bool| -> Vec<usize> { (0..n).filter(|&pe| f(&hellos[pe])).collect() };

        let set = pes_where(&|h| h.node_id_set);
        if !set.is_empty() && set.len() < n {
            return Err(Error::config(format!(
                "{NODE_ID} is set on {}, not on {}: set it on every PE or on none",
                list_pes(&set),
                list_pes(&pes_where(&|h| !h.node_id_set))
            )));
        }
        let empty = pes_where(&|h| h.node_id_set && h.node.is_empty());
        if !empty.is_empty() {
            return Err(Error::config(format!(
                "{NODE_ID} is empty on {}: name every PE's node, or unset it on every PE",
                list_pes(&empty)
            )));
        }

        let mut node_names: Vec<String> = Vec::new();
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        let mut node_of = Vec::with_capacity(n);
        for (pe, h) in hellos.iter().enumerate() {
            let k = node_names.iter().position(|name| *name == h.node).unwrap_or_else(|| {
                node_names.push(h.node.clone());
                nodes.push(Vec::new());
                nodes.len() - 1
            });
            nodes[k].push(pe);
            node_of.push(k);
        }

        for (k, members) in nodes.iter().enumerate() {
            let first = members[0];
            if let Some(&other) = members.iter().find(|&&pe| hellos[pe].real_host != hellos[first].real_host) {
                return Err(Error::config(format!(
                    "node {} spans two machines: PE {first} runs on {} and PE {other} on {} (a node is one \
                     machine: give the PEs of each machine their own {NODE_ID})",
                    node_names[k], hellos[first].real_host, hellos[other].real_host
                )));
            }
        }

        if nodes.iter().any(|m| m.len() != nodes[0].len()) {
            const SHOWN: usize = 8;
            let mut parts: Vec<String> = (0..nodes.len().min(SHOWN))
                .map(|k| format!("node {}: {} ({})", node_names[k], nodes[k].len(), list_pes(&nodes[k])))
                .collect();
            if nodes.len() > SHOWN {
                parts.push(format!("and {} more nodes", nodes.len() - SHOWN));
            }
            return Err(Error::config(format!(
                "the nodes run different numbers of PEs: {} (start as many PEs on every node)",
                parts.join("; ")
            )));
        }

        let given = pes_where(&|h| h.given_local.is_some());
        if !given.is_empty() && given.len() < n {
            return Err(Error::config(format!(
                "the launcher gave a local rank and size ({} and {}, or MPI's own) to {}, but not to {} (missing \
                 or not a number)",
                env::LOCAL_RANK,
                env::LOCAL_SIZE,
                list_pes(&given),
                list_pes(&pes_where(&|h| h.given_local.is_none()))
            )));
        }
        for (pe, h) in hellos.iter().enumerate() {
            let Some((rank, size)) = h.given_local else { continue };
            let members = &nodes[node_of[pe]];
            let local = members.iter().position(|&m| m == pe).expect("a PE is on its node");
            if (rank as usize, size as usize) != (local, members.len()) {
                return Err(Error::config(format!(
                    "the launcher made PE {pe} local rank {rank} of {size}, but on node {} ({}) it is local rank \
                     {local} of {}: the launcher's nodes differ from shmem's ({NODE_ID}, else the host name)",
                    node_names[node_of[pe]],
                    list_pes(members),
                    members.len()
                )));
            }
        }

        if hellos.iter().any(|h| h.backend == 0) {
            if let Some(other) = (1..n).find(|&pe| hellos[pe].real_host != hellos[0].real_host) {
                return Err(Error::BackendUnavailable(format!(
                    "the host backend keeps every PE's heap in one machine's shared memory, but PE 0 runs on {} \
                     and PE {other} on {}: use SHMEM_BACKEND=gpu across machines",
                    hellos[0].real_host, hellos[other].real_host
                )));
            }
        }

        let my_node = node_of[me];
        let local_rank = nodes[my_node].iter().position(|&pe| pe == me).expect("a PE is on its node");
        let on_my_host = |pe: &usize| hellos[*pe].real_host == hellos[me].real_host;
        Ok(Topology {
            local_size: nodes[my_node].len(),
            host_rank: (0..me).filter(on_my_host).count(),
            host_size: (0..n).filter(on_my_host).count(),
            machine: hellos[me].real_host.clone(),
            node_of,
            nodes,
            node_names,
            my_node,
            local_rank,
        })
    }

    /// This PE's node's PEs, in rank order.
    pub(crate) fn my_members(&self) -> &[usize] {
        &self.nodes[self.my_node]
    }

    /// This PE's node's name.
    pub(crate) fn my_node_name(&self) -> &str {
        &self.node_names[self.my_node]
    }

    /// Whether every node's PEs are consecutive ranks, so that NVSHMEM can
    /// make each node a team of its own (a strided split of the world).
    pub(crate) fn nodes_contiguous(&self) -> bool {
        self.nodes.iter().all(|m| m.windows(2).all(|w| w[1] == w[0] + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hello of a PE on machine `host`, in node `node` if given
    /// (`SHMEM_NODE_ID`), with a launcher-given local rank/size if given.
    fn hello(host: &str, node: Option<&str>, given: Option<(u32, u32)>) -> Hello {
        Hello {
            pid: 100,
            heap_size: 4096,
            backend: 1,
            node: node.unwrap_or(host).to_string(),
            real_host: host.to_string(),
            node_id_set: node.is_some(),
            given_local: given,
        }
    }

    fn config_error(hellos: &[Hello]) -> String {
        // Every PE reaches the same verdict.
        let errors: Vec<String> = (0..hellos.len())
            .map(|me| match Topology::from_hellos(hellos, me) {
                Err(Error::Config(m)) => m,
                other => panic!("PE {me}: expected a config error, got {other:?}"),
            })
            .collect();
        assert!(errors.iter().all(|e| *e == errors[0]), "{errors:?}");
        errors[0].clone()
    }

    #[test]
    fn hello_round_trips() {
        for h in [
            hello("box", None, None),
            hello("box", Some("node-a"), Some((3, 4))),
            Hello { backend: 2, pid: u32::MAX, heap_size: u64::MAX, ..hello("", Some(""), Some((0, 0))) },
        ] {
            assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        }
        let b = hello("box", Some("a"), None).encode();
        assert!(Hello::decode(&b[..FIXED - 1]).is_err());
        let mut long = b.clone();
        long[22] = 200; // a node name longer than the message
        assert!(Hello::decode(&long).is_err());
    }

    #[test]
    fn one_machine_is_one_node() {
        let hellos: Vec<Hello> = (0..3).map(|r| hello("box", None, Some((r, 3)))).collect();
        let t = Topology::from_hellos(&hellos, 2).unwrap();
        assert_eq!(t.nodes, vec![vec![0, 1, 2]]);
        assert_eq!(t.node_of, vec![0, 0, 0]);
        assert_eq!(t.node_names, vec!["box"]);
        assert_eq!((t.my_node, t.local_rank, t.local_size, t.host_rank, t.host_size), (0, 2, 3, 2, 3));
        assert!(t.nodes_contiguous());
        // No launcher-given ranks (a world of one PE, or srun): derived.
        let t = Topology::from_hellos(&[hello("box", None, None)], 0).unwrap();
        assert_eq!((t.local_rank, t.local_size, t.my_members()), (0, 1, &[0][..]));
    }

    #[test]
    fn emulated_nodes_share_a_machine() {
        let nodes = ["b", "a", "b", "a"];
        let hellos: Vec<Hello> = nodes.iter().map(|&k| hello("box", Some(k), None)).collect();
        let t = Topology::from_hellos(&hellos, 3).unwrap();
        assert_eq!(t.nodes, vec![vec![0, 2], vec![1, 3]]);
        assert_eq!(t.node_of, vec![0, 1, 0, 1]);
        assert_eq!(t.node_names, vec!["b", "a"]);
        assert_eq!((t.my_node, t.my_node_name(), t.local_rank, t.local_size), (1, "a", 1, 2));
        // The rayon pool and the GPUs are shared by the whole machine.
        assert_eq!((t.host_rank, t.host_size), (3, 4));
        // Interleaved nodes: NVSHMEM cannot split them off the world.
        assert!(!t.nodes_contiguous());
        assert_eq!(t.machine, "box");
    }

    #[test]
    fn real_machines_are_nodes_on_the_gpu_backend() {
        let hellos: Vec<Hello> =
            ["x", "x", "y", "y"].iter().enumerate().map(|(pe, &h)| hello(h, None, Some((pe as u32 % 2, 2)))).collect();
        let t = Topology::from_hellos(&hellos, 2).unwrap();
        assert_eq!((t.nodes.len(), t.local_rank, t.host_rank, t.host_size), (2, 0, 0, 2));
        assert!(t.nodes_contiguous());
        assert_eq!(t.machine, "y");
    }

    #[test]
    fn node_id_on_some_pes_only() {
        let hellos = [
            hello("box", Some("a"), None),
            hello("box", Some("a"), None),
            hello("box", None, None),
            hello("box", None, None),
        ];
        let m = config_error(&hellos);
        assert!(m.contains("SHMEM_NODE_ID is set on PEs 0 and 1, not on PEs 2 and 3"), "{m}");
    }

    #[test]
    fn empty_node_id() {
        let m = config_error(&[hello("box", Some("a"), None), hello("box", Some(""), None)]);
        assert!(m.contains("SHMEM_NODE_ID is empty on PE 1"), "{m}");
    }

    #[test]
    fn one_node_on_two_machines() {
        let m = config_error(&[hello("x", Some("a"), None), hello("y", Some("a"), None)]);
        assert!(m.contains("node a spans two machines: PE 0 runs on x and PE 1 on y"), "{m}");
    }

    #[test]
    fn nodes_of_different_sizes() {
        let nodes = ["a", "a", "b", "b", "b"];
        let hellos: Vec<Hello> = nodes.iter().map(|&k| hello("box", Some(k), None)).collect();
        let m = config_error(&hellos);
        assert!(m.contains("node a: 2 (PEs 0 and 1); node b: 3 (PEs 2, 3 and 4)"), "{m}");
        // Real machines too.
        let m = config_error(&[hello("x", None, None), hello("y", None, None), hello("y", None, None)]);
        assert!(m.contains("node x: 1 (PE 0); node y: 2 (PEs 1 and 2)"), "{m}");
    }

    #[test]
    fn launcher_local_rank_missing_on_some_pes() {
        let m = config_error(&[
            hello("box", None, Some((0, 3))),
            hello("box", None, None),
            hello("box", None, Some((2, 3))),
        ]);
        assert!(m.contains("to PEs 0 and 2, but not to PE 1"), "{m}");
    }

    #[test]
    fn launcher_local_rank_disagrees_with_the_nodes() {
        // A launcher that thinks all four share a node, split in two by SHMEM_NODE_ID.
        let nodes = ["a", "a", "b", "b"];
        let hellos: Vec<Hello> =
            nodes.iter().enumerate().map(|(pe, &k)| hello("box", Some(k), Some((pe as u32, 4)))).collect();
        let m = config_error(&hellos);
        assert!(m.contains("made PE 0 local rank 0 of 4, but on node a (PEs 0 and 1) it is local rank 0 of 2"), "{m}");
        // A wrong rank with the right size.
        let m = config_error(&[hello("box", None, Some((1, 2))), hello("box", None, Some((0, 2)))]);
        assert!(m.contains("made PE 0 local rank 1 of 2"), "{m}");
    }

    #[test]
    fn host_backend_across_machines() {
        let mut hellos = [hello("x", None, None), hello("y", None, None)];
        for h in &mut hellos {
            h.backend = 0;
        }
        for me in 0..2 {
            match Topology::from_hellos(&hellos, me) {
                Err(Error::BackendUnavailable(m)) => {
                    assert!(m.contains("PE 0 runs on x and PE 1 on y") && m.contains("SHMEM_BACKEND=gpu"), "{m}")
                }
                other => panic!("{other:?}"),
            }
        }
        // Emulated nodes of one machine are fine for it.
        for h in &mut hellos {
            h.real_host = "x".into();
        }
        assert!(Topology::from_hellos(&hellos, 0).is_ok());
    }
}
