//! The control plane: agreement on collective calls and allocations,
//! barriers, teams' slots and the liveness of PEs, on both backends.
//!
//! Its node tier ([`node`]) is a shared-memory object per node in which
//! every PE of the node publishes its state, barrier counters and
//! descriptor rows. A team whose members span nodes adds a second tier:
//! after the barrier of its members on each node, the team's lowest member
//! there (its delegate) sends its node's rows to the other nodes' delegates
//! over the job's [`Net`], and publishes the rows it receives in its node's
//! object for the node's other members. A team within one node never
//! touches the network.

pub(crate) mod node;
pub(crate) mod op;
pub(crate) mod team;
pub(crate) mod topology;

use crate::bootstrap::{Incoming, Net};
use crate::error::{Error, Result};
use node::{round_tag, NodeArea};
pub(crate) use node::{PeState, DESC_WORDS, MAX_TEAMS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use team::TeamState;
use topology::Topology;

/// Set once this process saw a peer die, a wait time out or its CUDA
/// context fail. The gpu backend's exit handler reads it to skip the
/// libraries' teardown, which would talk to the dead peer or the failed
/// context.
static FAULTED: AtomicBool = AtomicBool::new(false);

/// Records that this PE's job is broken (a dead peer, a timed-out wait, a
/// trapped kernel).
pub(crate) fn note_fault() {
    FAULTED.store(true, Ordering::Release);
}

/// Whether [`note_fault`] was called in this process.
pub(crate) fn faulted() -> bool {
    FAULTED.load(Ordering::Acquire)
}

/// One descriptor row, as a team's members publish it in an exchange.
pub(crate) type DescRow = [u64; DESC_WORDS];
/// A round of a team: (team id, round).
type RoundKey = (u64, u64);
/// The rows of one node's members in a round, each after its world PE.
type NodeRows = Vec<(usize, DescRow)>;

/// How long the news that a PE of another node *left* (said goodbye) waits
/// before a wait for that PE fails on it: the PE may have done its part in
/// the round first, and its node's delegate's message may still be on its
/// way (the relay keeps each pair's order, not the order across pairs).
const LEFT_GRACE: Duration = Duration::from_millis(500);

/// Where a team's members are, seen from this PE.
#[derive(Debug, Clone)]
pub(crate) struct Span {
    /// The indices (in the team) of its members on this PE's node.
    pub(crate) local: Vec<usize>,
    /// The team's delegate on this node: its lowest member here.
    pub(crate) delegate: usize,
    /// The team's delegates on the other nodes (empty for a team within
    /// one node).
    pub(crate) remote: Vec<usize>,
}

/// The news of a PE of another node that ended.
struct GoneNews {
    died: bool,
    text: String,
    at: Instant,
}

/// This PE's end of the tier between nodes.
struct Tier {
    /// `None` once closed.
    net: Option<Net>,
    /// Rows received, by (team id, round): each message's sender and rows,
    /// one message per other node's delegate.
    mailbox: HashMap<RoundKey, Vec<(usize, NodeRows)>>,
    gone: HashMap<usize, GoneNews>,
    /// Why the channel failed, once it has.
    broken: Option<String>,
}

impl Tier {
    /// Files everything that has arrived.
    fn pump(&mut self) {
        let Some(net) = &mut self.net else { return };
        if self.broken.is_some() {
            return;
        }
        match net.poll() {
            Ok(got) => {
                for item in got {
                    match item {
                        Incoming::Message { from, body } => match decode_round(&body) {
                            Some((key, rows)) => self.mailbox.entry(key).or_default().push((from, rows)),
                            None => self.broken = Some(format!("a malformed message from PE {from}")),
                        },
                        Incoming::Gone { rank, died, text } => {
                            self.gone.entry(rank).or_insert(GoneNews { died, text, at: Instant::now() });
                        }
                    }
                }
            }
            Err(e) => self.broken = Some(e.to_string()),
        }
    }
}

/// A round's message between delegates: team id, round, and the sender's
/// node's rows (none for a plain barrier), each after its world PE.
fn encode_round(uid: u64, round: u64, rows: &[(usize, DescRow)]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + rows.len() * (4 + 8 * DESC_WORDS));
    b.extend_from_slice(&uid.to_le_bytes());
    b.extend_from_slice(&round.to_le_bytes());
    b.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for (pe, row) in rows {
        b.extend_from_slice(&(*pe as u32).to_le_bytes());
        for w in row {
            b.extend_from_slice(&w.to_le_bytes());
        }
    }
    b
}

fn decode_round(b: &[u8]) -> Option<(RoundKey, NodeRows)> {
    let u64_at = |at: usize| Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let (uid, round, count) = (u64_at(0)?, u64_at(8)?, u32_at(16)? as usize);
    let each = 4 + 8 * DESC_WORDS;
    if b.len() != 20 + count * each {
        return None;
    }
    let rows = (0..count)
        .map(|k| {
            let at = 20 + k * each;
            let row: DescRow = std::array::from_fn(|i| u64_at(at + 4 + 8 * i).unwrap_or(0));
            Some((u32_at(at)? as usize, row))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(((uid, round), rows))
}

/// This PE's part in the control plane.
pub(crate) struct Control {
    node: NodeArea,
    me: usize,
    n: usize,
    wait_timeout: Option<Duration>,
    /// This PE's live teams: id → slot (for the crossed-wait check).
    live_teams: Mutex<HashMap<u64, usize>>,
    /// Each world PE's node, and the nodes' names.
    node_of: Vec<usize>,
    node_names: Vec<String>,
    /// The tier between nodes, in a job of more than one node.
    tier: Option<Mutex<Tier>>,
}

impl Control {
    /// PE `me`'s control plane over its node's area in a job of topology
    /// `topo`, with the teams (id, slot) that exist from the start; `net`
    /// joins it to the other nodes of a job of more than one node.
    pub(crate) fn new(
        node: NodeArea,
        topo: &Topology,
        me: usize,
        wait_timeout: Option<Duration>,
        teams: &[(u64, usize)],
        net: Option<Net>,
    ) -> Control {
        let live_teams = Mutex::new(teams.iter().copied().collect());
        let tier = net.map(|net| {
            Mutex::new(Tier { net: Some(net), mailbox: HashMap::new(), gone: HashMap::new(), broken: None })
        });
        let (node_of, node_names) = (topo.node_of.clone(), topo.node_names.clone());
        Control { node, me, n: node_of.len(), wait_timeout, live_teams, node_of, node_names, tier }
    }

    /// Where the members of a team (world PEs, in team order) are, seen
    /// from this PE, which is one of them.
    pub(crate) fn span(&self, members: &[usize]) -> Span {
        let my_node = self.node_of[self.me];
        let local: Vec<usize> = (0..members.len()).filter(|&i| self.node_of[members[i]] == my_node).collect();
        let delegate = members[local[0]];
        let mut seen = vec![false; self.node_names.len()];
        seen[my_node] = true;
        let mut remote = Vec::new();
        for &pe in members {
            if !std::mem::replace(&mut seen[self.node_of[pe]], true) {
                remote.push(pe);
            }
        }
        Span { local, delegate, remote }
    }

    /// Whether world PE `pe` is on another node than this PE.
    pub(crate) fn other_node(&self, pe: usize) -> bool {
        self.node_of[pe] != self.node_of[self.me]
    }

    /// This PE's number in the world.
    pub(crate) fn me(&self) -> usize {
        self.me
    }

    /// The node of world PE `pe` (an index into the topology's nodes).
    pub(crate) fn node_of(&self, pe: usize) -> usize {
        self.node_of[pe]
    }

    /// Says goodbye to the other nodes' PEs (after the last barrier of
    /// `finalize`): they hear that this PE left, not that it died.
    pub(crate) fn close_net(&self) {
        if let Some(tier) = &self.tier {
            if let Some(net) = tier.lock().unwrap_or_else(|e| e.into_inner()).net.take() {
                net.close();
            }
        }
    }

    fn tier(&self) -> Option<std::sync::MutexGuard<'_, Tier>> {
        self.tier.as_ref().map(|t| t.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Fails once the channel to the other nodes has.
    fn net_ok(&self) -> Result<()> {
        match self.tier().and_then(|t| t.broken.clone()) {
            Some(why) => Err(Error::bootstrap(format!("the channel to the other nodes failed: {why}"))),
            None => Ok(()),
        }
    }

    /// Publishes this PE's state to its peers.
    pub(crate) fn set_state(&self, state: PeState) {
        self.node.set_state(state);
    }

    /// How `pe` is doing, if not well: it has finalized, left or died.
    pub(crate) fn peer_problem(&self, pe: usize) -> Option<String> {
        self.problem_of(pe, true)
    }

    /// [`Control::peer_problem`]; the other nodes' news is read from the
    /// channel first only `if pump`.
    fn problem_of(&self, pe: usize, pump: bool) -> Option<String> {
        if self.node.holds(pe) {
            return self.node.peer_problem(pe);
        }
        let mut tier = self.tier()?;
        if pump {
            tier.pump();
        }
        let news = tier.gone.get(&pe)?;
        let node = &self.node_names[self.node_of[pe]];
        // "PE 3 died (…)" → "died on node b (…)".
        let text = news.text.strip_prefix(&format!("PE {pe} ")).unwrap_or(&news.text);
        let (verb, rest) = if news.died { ("died", "died") } else { ("has left", "") };
        let detail = text
            .strip_prefix(rest)
            .map(str::trim_start)
            .filter(|d| d.starts_with('('))
            .map_or_else(|| format!("({text})"), str::to_string);
        (news.died || news.at.elapsed() > LEFT_GRACE).then(|| format!("{verb} on node {node} {detail}"))
    }

    /// A PE of the job that died, if one has, seen from a thread other than
    /// the one that makes the calls (the gpu backend's liveness watcher).
    /// It reads the other nodes' news from the channel only where that may
    /// be polled from any thread: not MPI's, as the program may call MPI on
    /// its own thread meanwhile, which `MPI_THREAD_SERIALIZED` does not
    /// allow (Open MPI ends the whole job when a rank dies anyway).
    pub(crate) fn died_peer(&self) -> Option<usize> {
        let pump = self.tier().is_some_and(|t| t.net.as_ref().is_some_and(Net::polls_from_any_thread));
        (0..self.n)
            .filter(|&pe| pe != self.me)
            .find(|&pe| self.problem_of(pe, pump).is_some_and(|p| p.starts_with("died")))
    }

    /// A PE of the job that died, if one has, and how.
    fn dead_peer(&self) -> Option<(usize, String)> {
        (0..self.n)
            .filter(|&pe| pe != self.me)
            .find_map(|pe| self.peer_problem(pe).filter(|p| p.starts_with("died")).map(|p| (pe, p)))
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
        let round = self.enter(team, Some(parity))?;
        let read = |row: &[std::sync::atomic::AtomicU64; DESC_WORDS]| -> DescRow {
            // Relaxed: ordered after the member's row by the barrier's SeqCst
            // loads of its epoch (a local member) or of the delegate's
            // `remote_done` (a remote one).
            std::array::from_fn(|i| row[i].load(Ordering::Relaxed))
        };
        Ok(team
            .members
            .iter()
            .map(|&pe| match self.node.holds(pe) {
                true => read(&self.node.cell(pe).teams[team.slot].desc[parity]),
                false => read(self.node.remote_row(team.span.delegate, team.slot, (round & 1) as usize, pe)),
            })
            .collect())
    }

    /// Enters `team`'s barrier and waits for every member.
    pub(crate) fn barrier(&self, team: &TeamState) -> Result<()> {
        self.enter(team, None).map(|_| ())
    }

    /// Enters `team`'s barrier and waits for every member; with `rows`, the
    /// parity of the members' rows to carry to the other nodes. Returns the
    /// round (the same on every member).
    fn enter(&self, team: &TeamState, rows: Option<usize>) -> Result<u64> {
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
        let local = &team.span.local;
        let mut result = self.wait_until(
            || local.iter().all(|&i| arrived(i)),
            &mut local.iter().filter(|&&i| !arrived(i)).map(|&i| team.members[i]),
            &|| format!("waiting in a barrier of a team of {n} PEs"),
            &|| self.no_crossed_wait(team, &arrived),
        );
        if result.is_ok() && !team.span.remote.is_empty() {
            result = self.enter_remote(team, target, rows);
        }
        mine.waiting_team.store(0, Ordering::SeqCst);
        result.map(|()| target)
    }

    /// The tier between nodes of round `round` of `team`, once its members
    /// on this node have arrived. The delegate sends its node's rows (of
    /// parity `rows`, if any) to the other nodes' delegates, waits for
    /// theirs and publishes them; the node's other members wait for that.
    ///
    /// The remote rows of a round live in the delegate's area at the
    /// round's parity: the delegate writes those of round `r + 2` only
    /// after its node's barrier of round `r + 2`, so after every member
    /// here has read those of round `r`.
    fn enter_remote(&self, team: &TeamState, round: u64, rows: Option<usize>) -> Result<()> {
        let (n, slot, span) = (team.members.len(), team.slot, &team.span);
        let what = || format!("waiting in a barrier of a team of {n} PEs (for its members on other nodes)");
        let mut remote_members = team.members.iter().copied().filter(|&pe| !self.node.holds(pe));
        let tag = round_tag(team.uid, round);
        if span.delegate != self.me {
            let done = &self.node.cell(span.delegate).teams[slot].remote_done;
            return self.wait_until(
                || done.load(Ordering::SeqCst) == tag,
                &mut std::iter::once(span.delegate).chain(remote_members),
                &what,
                &|| self.net_ok(),
            );
        }
        let ours: Vec<(usize, DescRow)> = match rows {
            Some(parity) => span
                .local
                .iter()
                .map(|&i| {
                    let pe = team.members[i];
                    let row = &self.node.cell(pe).teams[slot].desc[parity];
                    // Relaxed: ordered by the node barrier's SeqCst epoch loads.
                    (pe, std::array::from_fn(|w| row[w].load(Ordering::Relaxed)))
                })
                .collect(),
            None => Vec::new(),
        };
        let message = encode_round(team.uid, round, &ours);
        {
            let mut tier =
                self.tier().ok_or_else(|| Error::bootstrap("a team spans nodes, but no channel joins them"))?;
            let net = tier.net.as_mut().ok_or(Error::Finalized("context"))?;
            for &to in &span.remote {
                net.send(to, &message)?;
            }
        }
        let mut theirs = Vec::new();
        self.wait_until(
            || {
                let Some(mut tier) = self.tier() else { return false };
                tier.pump();
                let key = (team.uid, round);
                if tier.mailbox.get(&key).is_some_and(|m| m.len() >= span.remote.len()) {
                    theirs = tier.mailbox.remove(&key).unwrap_or_default();
                    return true;
                }
                false
            },
            &mut remote_members,
            &what,
            &|| self.net_ok().and_then(|()| self.no_crossed_wait_remote(team, round)),
        )?;
        let parity = (round & 1) as usize;
        for (pe, row) in theirs.into_iter().flat_map(|(_, rows)| rows) {
            if pe < self.n && !self.node.holds(pe) {
                for (cell, w) in self.node.remote_row(self.me, slot, parity, pe).iter().zip(row) {
                    // Relaxed: published by the SeqCst store of `remote_done`.
                    cell.store(w, Ordering::Relaxed);
                }
            }
        }
        self.node.mine().teams[slot].remote_done.store(tag, Ordering::SeqCst);
        Ok(())
    }

    /// Fails when a member this PE waits for is itself waiting, in a barrier
    /// of another team of this PE, for an arrival of this PE: the two called
    /// collectives on different teams (or in a different order), and neither
    /// can go on.
    fn no_crossed_wait(&self, team: &TeamState, arrived: &dyn Fn(usize) -> bool) -> Result<()> {
        for (i, pe) in team.span.local.iter().map(|&i| (i, team.members[i])).filter(|&(i, _)| !arrived(i)) {
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
                return Err(crossed_wait(pe, team));
            }
        }
        Ok(())
    }

    /// The tier between nodes' twin of [`Control::no_crossed_wait`], for a
    /// delegate waiting for round `round` of `team`: fails when a remote
    /// delegate it waits for has sent, instead, a round of another team of
    /// this PE that this PE has not entered. Each pair's messages arrive in
    /// order, so that delegate waits in that other team's round, for this
    /// PE's node, while this PE waits here for it.
    fn no_crossed_wait_remote(&self, team: &TeamState, round: u64) -> Result<()> {
        let Some(tier) = self.tier() else { return Ok(()) };
        let sent_here: Vec<usize> =
            tier.mailbox.get(&(team.uid, round)).map_or(Vec::new(), |m| m.iter().map(|(from, _)| *from).collect());
        let live = self.live_teams.lock().unwrap_or_else(|e| e.into_inner());
        for (&(uid, other_round), messages) in tier.mailbox.iter().filter(|((uid, _), _)| *uid != team.uid) {
            let Some(&slot) = live.get(&uid) else { continue };
            let entered = self.node.mine().teams[slot].arrivals.load(Ordering::SeqCst);
            let stuck = messages
                .iter()
                .map(|(from, _)| *from)
                .find(|from| entered < other_round && team.span.remote.contains(from) && !sent_here.contains(from));
            if let Some(pe) = stuck {
                return Err(crossed_wait(pe, team));
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
                let problems: Vec<(usize, String)> =
                    awaited.iter().filter_map(|&pe| self.peer_problem(pe).map(|p| (pe, p))).collect();
                let Some(first) = problems.first() else { return also() };
                // A dead PE is the news, awaited or not: peers that left after
                // seeing it are echoes. (A wait for this node's members alone
                // sees a member that left on hearing of a death on another
                // node, and not the death.)
                let (pe, p) = problems
                    .iter()
                    .find(|(_, p)| p.starts_with("died"))
                    .cloned()
                    .or_else(|| self.dead_peer())
                    .unwrap_or_else(|| first.clone());
                Err(Error::PeerLost { pe, what: format!("{p} while {}", what()) })
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
                    note_fault();
                }
                alive?;
                if let Some(limit) = self.wait_timeout {
                    if now - start > limit {
                        note_fault();
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

/// The error of a crossed wait ([`Control::no_crossed_wait`] and its twin
/// between nodes): PE `pe` waits in another team's collective while this PE
/// waits for it in `team`'s.
fn crossed_wait(pe: usize, team: &TeamState) -> Error {
    Error::CollectiveMismatch(format!(
        "PE {pe} waits in a collective of another team this PE belongs to, while this PE waits for PE {pe} in a \
         collective of a team of {} PEs: the PEs called collectives on different teams (or in a different order)",
        team.members.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_messages_round_trip() {
        let rows: NodeRows = vec![(3, std::array::from_fn(|i| i as u64 * 7)), (5, [u64::MAX; DESC_WORDS])];
        let b = encode_round(0x8000_0000_0000_0001, 42, &rows);
        assert_eq!(decode_round(&b), Some(((0x8000_0000_0000_0001, 42), rows)));
        // A plain barrier carries no rows.
        assert_eq!(decode_round(&encode_round(1, 2, &[])), Some(((1, 2), Vec::new())));
        // Cut short, or with a count that does not match its length.
        assert_eq!(decode_round(&b[..b.len() - 1]), None);
        let mut bad = b.clone();
        bad[16] = 3;
        assert_eq!(decode_round(&bad), None);
    }

    #[test]
    fn round_tags_tell_teams_apart() {
        assert_ne!(round_tag(1, 5), round_tag(2, 5));
        assert_ne!(round_tag(1, 5), round_tag(1, 6));
        assert_eq!(round_tag(7, 9), round_tag(7, 9));
    }
}
