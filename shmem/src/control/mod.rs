//! The control plane: agreement on collective calls and allocations,
//! barriers, teams' slots and the liveness of PEs, on both backends.
//!
//! Its node tier ([`node`]) is a shared-memory object per node in which
//! every PE of the node publishes its state, barrier counters and
//! descriptor rows. Jobs run on one node for now, so every fact a PE needs
//! is in its node's object.

pub(crate) mod node;
pub(crate) mod topology;

use crate::error::{Error, Result};
use crate::team::TeamState;
use node::NodeArea;
pub(crate) use node::{PeState, DESC_WORDS, MAX_TEAMS};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One descriptor row, as a team's members publish it in an exchange.
pub(crate) type DescRow = [u64; DESC_WORDS];

/// This PE's part in the control plane.
pub(crate) struct Control {
    node: NodeArea,
    me: usize,
    n: usize,
    wait_timeout: Option<Duration>,
    /// This PE's live teams: id → slot (for the crossed-wait check).
    live_teams: Mutex<HashMap<u64, usize>>,
}

impl Control {
    /// This PE's control plane over its node's area, with the teams
    /// (id, slot) that exist from the start.
    pub(crate) fn new(
        node: NodeArea,
        me: usize,
        n: usize,
        wait_timeout: Option<Duration>,
        teams: &[(u64, usize)],
    ) -> Control {
        let live_teams = Mutex::new(teams.iter().copied().collect());
        Control { node, me, n, wait_timeout, live_teams }
    }

    /// Publishes this PE's state to its peers.
    pub(crate) fn set_state(&self, state: PeState) {
        self.node.set_state(state);
    }

    /// How `pe` is doing, if not well: it has finalized, left or died.
    pub(crate) fn peer_problem(&self, pe: usize) -> Option<String> {
        // Every PE of a job is on this PE's node (init refuses others).
        self.node.holds(pe).then(|| self.node.peer_problem(pe)).flatten()
    }

    /// This PE's barrier counter on team slot `slot`: a new team's members
    /// exchange it, as the base their later arrivals count from.
    pub(crate) fn slot_epoch(&self, slot: usize) -> u64 {
        self.node.mine().teams[slot].epoch.load(Ordering::SeqCst)
    }

    /// A new team `uid` of this PE takes slot `slot`.
    pub(crate) fn team_joined(&self, uid: u64, slot: usize) {
        self.node.mine().teams[slot].arrivals.store(0, Ordering::SeqCst);
        self.live_teams.lock().unwrap_or_else(|e| e.into_inner()).insert(uid, slot);
    }

    /// Team `uid` of this PE is gone.
    pub(crate) fn team_left(&self, uid: u64) {
        self.live_teams.lock().unwrap_or_else(|e| e.into_inner()).remove(&uid);
    }

    /// Publishes `row` as this PE's descriptor of exchange `seq` on `team`,
    /// enters the team's barrier, and returns every member's row.
    pub(crate) fn exchange(&self, team: &TeamState, seq: u64, row: &DescRow) -> Result<Vec<DescRow>> {
        let parity = (seq & 1) as usize;
        let mine = &self.node.mine().teams[team.slot].desc[parity];
        for (cell, &w) in mine.iter().zip(row) {
            // Relaxed: the barrier's SeqCst epoch increment publishes them.
            cell.store(w, Ordering::Relaxed);
        }
        self.barrier(team)?;
        Ok(team
            .members
            .iter()
            .map(|&pe| {
                let row = &self.node.cell(pe).teams[team.slot].desc[parity];
                // Relaxed: ordered after the member's row by the barrier's
                // SeqCst loads of its epoch.
                std::array::from_fn(|i| row[i].load(Ordering::Relaxed))
            })
            .collect())
    }

    /// Enters `team`'s barrier and waits for every member.
    pub(crate) fn barrier(&self, team: &TeamState) -> Result<()> {
        let mine = self.node.mine();
        let target = team.arrivals.fetch_add(1, Ordering::Relaxed) + 1;
        mine.teams[team.slot].arrivals.store(target, Ordering::SeqCst);
        // Target first, then the team: a reader that sees the team sees its target.
        mine.waiting_target.store(target, Ordering::SeqCst);
        mine.waiting_team.store(team.uid, Ordering::SeqCst);
        // SeqCst: publishes this PE's descriptor row and data writes before
        // any member can see the arrival.
        mine.teams[team.slot].epoch.fetch_add(1, Ordering::SeqCst);
        let arrived = |i: usize| {
            let epoch = self.node.cell(team.members[i]).teams[team.slot].epoch.load(Ordering::SeqCst);
            epoch.wrapping_sub(team.bases[i]) >= target
        };
        let n = team.members.len();
        let result = self.wait_until(
            || (0..n).all(arrived),
            &mut (0..n).filter(|&i| !arrived(i)).map(|i| team.members[i]),
            &|| format!("waiting in a barrier of a team of {n} PEs"),
            &|| self.no_crossed_wait(team, &arrived),
        );
        mine.waiting_team.store(0, Ordering::SeqCst);
        result
    }

    /// Fails when a member this PE waits for is itself waiting, in a barrier
    /// of another team of this PE, for an arrival of this PE: the two called
    /// collectives on different teams (or in a different order), and neither
    /// can go on.
    fn no_crossed_wait(&self, team: &TeamState, arrived: &dyn Fn(usize) -> bool) -> Result<()> {
        for (i, &pe) in team.members.iter().enumerate().filter(|&(i, _)| !arrived(i)) {
            let cell = self.node.cell(pe);
            let other = cell.waiting_team.load(Ordering::SeqCst);
            if other == 0 || other == team.uid {
                continue;
            }
            let wanted = cell.waiting_target.load(Ordering::SeqCst);
            let slot = self.live_teams.lock().unwrap_or_else(|e| e.into_inner()).get(&other).copied();
            let Some(slot) = slot else { continue };
            let mine = self.node.mine().teams[slot].arrivals.load(Ordering::SeqCst);
            // Re-read: the peer still waits in that barrier, for this PE.
            if mine < wanted && cell.waiting_team.load(Ordering::SeqCst) == other && !arrived(i) {
                return Err(Error::CollectiveMismatch(format!(
                    "PE {pe} waits in a collective of another team this PE belongs to, while this PE waits for \
                     PE {pe} in a collective of a team of {} PEs: the PEs called collectives on different teams \
                     (or in a different order)",
                    team.members.len()
                )));
            }
        }
        Ok(())
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
            &mut || {
                // A dead PE is the news; peers that left after seeing it are echoes.
                let problems: Vec<(usize, String)> =
                    awaited.iter().filter_map(|&pe| self.peer_problem(pe).map(|p| (pe, p))).collect();
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
            &mut || {
                let mut others_alive = 0;
                for pe in (0..self.n).filter(|&pe| pe != self.me) {
                    match self.peer_problem(pe) {
                        Some(p) if p.starts_with("died") => {
                            return Err(Error::PeerLost { pe, what: format!("{p} while {}", what()) })
                        }
                        Some(_) => {}
                        None => others_alive += 1,
                    }
                }
                if others_alive == 0 && self.n > 1 {
                    return Err(Error::PeerLost {
                        pe: (self.me + 1) % self.n,
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
        check: &mut dyn FnMut() -> Result<()>,
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
                let alive = check();
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
