//! Collectives checked against a host reference on fresh random data: every
//! collective, element type and operator; sizes from one element to 256 MiB,
//! odd ones (not a multiple of 16 bytes) included; out of place, in place
//! and misaligned; over the world and over split teams; under each of the
//! GPU kernels' settings ([`Variant`]).
//!
//! Every PE computes every PE's input from (seed, PE, index), and the
//! reference combines them in team order, accumulating as [`Element`] does
//! (the host backend's arithmetic), so results must match bit for bit.
//! Float inputs of sums have random mantissas and exponents spread over
//! ±6, so a sum in any other order than the PE order shows in the bits:
//! these tests guard the README's promise that shmem's all-reduce and
//! reduce-scatter give the sum in PE order whatever the size, algorithm
//! and path ([`kernels::graph_replay`] under graph replay).
//! Outputs are poisoned before each call, and guard elements after every
//! region must keep their poison.

use crate::kernels::{self, Settings, Variant};
use crate::util::{mix, par_fill, payload, poison, Env, TestElem, TestResult};
use crate::{each_dtype, Test};
use shmem::{BackendKind, Context, DType, Element, ReduceOp, Stream, SymSlice, SymmetricBuffer, Team};
use std::ops::Range;

/// The collectives' tests: each variant ([`Variant`]) over the world for
/// every collective it names ([`Variant::world_colls`]) and on split teams
/// where it says so ([`Variant::on_teams`]), named
/// `coll::{collective or teams}::{variant}`; and the tests of their own.
pub fn tests() -> Vec<Test> {
    let mut t = vec![Test::new("coll::barrier_orders_writes".into(), barrier_orders_writes)];
    for v in Variant::ALL {
        for &coll in v.world_colls() {
            t.push(Test::new(format!("coll::{}::{}", coll.name(), v.name()), move |e| world(e, coll, v)));
        }
        if v.on_teams() {
            t.push(Test::new(format!("coll::teams::{}", v.name()), move |e| teams(e, v)));
        }
    }
    t.push(Test::new("coll::all_to_all::lines_after_packets".into(), kernels::lines_after_packets));
    t.push(Test::new("coll::graph_replay_gpu_only".into(), kernels::graph_replay));
    t
}

/// Elements per PE (per block for the blocked collectives): every dtype and
/// operator runs these. 59 elements end in the 4-byte pieces of a line's
/// flag lanes (`LinesOf` in `prims/lines.cuh`): 118 bytes of 2-byte types end
/// inside lane 7's, 236 of 4-byte types at the end of lane 3's.
const SMALL: &[usize] = &[1, 3, 7, 8, 31, 33, 59, 1000, 4099];
/// The split teams' share of them.
const TEAM_SMALL: &[usize] = &[1, 7, 33, 4099];
/// What the host backend runs under the other settings it follows (forced
/// RMA; the route across nodes on split teams).
const HOST_VARIANT_SMALL: &[usize] = &[7, 4099];
/// What the host backend runs under the settings of the route across
/// nodes: shares of whole 16-byte vectors that are empty (1 and 3
/// elements on 2 or 3 rails; 9 2-byte elements, two vectors, on 3), end
/// short of a vector, or are uneven.
const HOST_NODES_SMALL: &[usize] = &[1, 3, 9, 33, 4099];
/// Around the kernels' size boundaries: 24 579 elements are 48 KiB of f16,
/// 96 KiB of f32 and 192 KiB of 8-byte types; 65 541 are 128 KiB + 10 bytes
/// of f16 (past the low-latency limit of worlds over 8 PEs) and 512 KiB +
/// 40 of 8-byte types. At 2 PEs the default runs them all on the
/// low-latency kernels (up to 1 MiB a peer), [`Variant::Tuned`] those past
/// 128 KiB (each dtype's 65 541, and the 8-byte types' 24 579) on the push
/// kernels; `LARGE` is past the push kernels' 1 MiB in every dtype.
const MEDIUM: &[usize] = &[24_579, (1 << 16) + 5];
const LARGE: usize = (1 << 20) + 3;
/// GPU only, f32 and bf16: the all-reduce's vector, the all-gather's output,
/// the reduce-scatter's input, the broadcast's vector.
const HUGE_BYTES: usize = 256 << 20;
/// Poisoned bytes after every region, which no call may touch.
const GUARD_BYTES: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    AllToAll,
}

impl Coll {
    pub const ALL: [Coll; 5] = [Coll::AllReduce, Coll::ReduceScatter, Coll::AllGather, Coll::Broadcast, Coll::AllToAll];

    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllGather => "all_gather",
            Coll::Broadcast => "broadcast",
            Coll::AllToAll => "all_to_all",
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter)
    }

    /// (source, destination) lengths for `len` elements per PE (per block)
    /// over `n` PEs.
    fn shape(self, len: usize, n: usize) -> (usize, usize) {
        match self {
            Coll::AllReduce | Coll::Broadcast => (len, len),
            Coll::ReduceScatter => (len * n, len),
            Coll::AllGather => (len, len * n),
            Coll::AllToAll => (len * n, len * n),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Small,
    Medium,
    Large,
    Huge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    OutOfPlace,
    /// dst is src (all-reduce, broadcast, all-to-all) or this PE's block of it.
    InPlace,
    /// Out of place, both regions one element past an aligned start.
    Misaligned,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::OutOfPlace => "out of place",
            Placement::InPlace => "in place",
            Placement::Misaligned => "misaligned",
        }
    }
}

/// Which cases a run covers.
///
/// The settings of the route across nodes ([`Variant::about_nodes`]), on
/// the host: every dtype and operator at [`HOST_NODES_SMALL`], and the
/// medium sums of a few types, over the world.
///
/// GPU: every dtype and operator at the small and medium sizes; at the
/// large size sums of every dtype, and every operator of f32 and bf16 where
/// the variant is about the collective (not on split teams); 256 MiB for f32 and bf16 sums of the
/// world's all-reduce, all-gather and reduce-scatter where the variant is about them.
///
/// Host (CI: two cores): every dtype and operator at the small sizes under
/// the default settings (sums and maxima on split teams), two small sizes
/// under forced RMA; medium and large sums of a few types over the world
/// under the default settings. The variants that name a GPU form are
/// ignored there ([`Variant::gpu_form`]).
struct Plan {
    gpu: bool,
    variant: Variant,
    coll: Coll,
    teams: bool,
}

impl Plan {
    fn lengths(&self, env: &Env, dtype: DType) -> Vec<(Tier, usize)> {
        let small = match (self.teams, self.gpu || self.variant == Variant::Default) {
            (false, false) if self.variant.about_nodes() => HOST_NODES_SMALL,
            (_, false) => HOST_VARIANT_SMALL,
            (true, true) => TEAM_SMALL,
            (false, true) => SMALL,
        };
        let mut out: Vec<(Tier, usize)> = small.iter().map(|&l| (Tier::Small, l)).collect();
        out.extend(MEDIUM.iter().map(|&l| (Tier::Medium, l)));
        out.push((Tier::Large, LARGE));
        let huge = match self.coll {
            Coll::AllReduce => HUGE_BYTES / dtype.size(),
            Coll::AllGather | Coll::ReduceScatter => HUGE_BYTES / dtype.size() / env.n(),
            Coll::Broadcast => HUGE_BYTES / dtype.size(),
            _ => 0,
        };
        if huge > 0 && huge_on() {
            out.push((Tier::Huge, huge));
        }
        out
    }

    fn covers(&self, tier: Tier, dtype: DType, op: Option<ReduceOp>) -> bool {
        let sum = matches!(op, None | Some(ReduceOp::Sum));
        let about = self.variant.covers(self.coll);
        let world_default = !self.teams && self.variant == Variant::Default;
        let world_nodes = !self.teams && self.variant.about_nodes();
        match (self.gpu, tier) {
            (true, Tier::Small) => true,
            (false, Tier::Small) => !self.teams || matches!(op, None | Some(ReduceOp::Sum | ReduceOp::Max)),
            (true, Tier::Medium) => true,
            // At 1M elements (past the low-latency and push kernels), sums of
            // every dtype and every op of f32/bf16.
            (true, Tier::Large) => sum || (about && !self.teams && matches!(dtype, DType::F32 | DType::BF16)),
            (true, Tier::Huge) => sum && about && !self.teams && matches!(dtype, DType::F32 | DType::BF16),
            (false, Tier::Medium) => {
                (world_default || world_nodes) && sum && matches!(dtype, DType::F32 | DType::BF16 | DType::U64)
            }
            (false, Tier::Large) => world_default && sum && dtype == DType::F32,
            (false, Tier::Huge) => false,
        }
    }
}

fn placements(v: Variant, tier: Tier) -> &'static [Placement] {
    if !v.in_place() {
        &[Placement::OutOfPlace]
    } else if tier <= Tier::Medium {
        &[Placement::OutOfPlace, Placement::InPlace, Placement::Misaligned]
    } else {
        &[Placement::OutOfPlace, Placement::InPlace]
    }
}

/// Where a collective runs: the world, through the context's methods, or a
/// team split from it.
struct Group {
    name: String,
    team: Option<Team>,
    /// World PEs in team order.
    members: Vec<usize>,
    me: usize,
}

impl Group {
    fn world(env: &Env) -> Group {
        Group { name: "the world".into(), team: None, members: (0..env.n()).collect(), me: env.me() }
    }

    #[allow(clippy::too_many_arguments)]
    fn call<T: Element>(
        &self,
        ctx: &Context,
        coll: Coll,
        dst: SymSlice<'_, T>,
        src: SymSlice<'_, T>,
        op: Option<ReduceOp>,
        root: usize,
        s: &Stream,
    ) -> shmem::Result<()> {
        let op = op.unwrap_or(ReduceOp::Sum);
        match (&self.team, coll) {
            (None, Coll::AllReduce) => ctx.all_reduce(dst, src, op, s),
            (None, Coll::ReduceScatter) => ctx.reduce_scatter(dst, src, op, s),
            (None, Coll::AllGather) => ctx.all_gather(dst, src, s),
            (None, Coll::Broadcast) => ctx.broadcast(dst, src, root, s),
            (None, Coll::AllToAll) => ctx.all_to_all(dst, src, s),
            (Some(t), Coll::AllReduce) => t.all_reduce(dst, src, op, s),
            (Some(t), Coll::ReduceScatter) => t.reduce_scatter(dst, src, op, s),
            (Some(t), Coll::AllGather) => t.all_gather(dst, src, s),
            (Some(t), Coll::Broadcast) => t.broadcast(dst, src, root, s),
            (Some(t), Coll::AllToAll) => t.all_to_all(dst, src, s),
        }
    }
}

/// Teams split from the world, the ones this PE is in, in the same order on
/// every PE: all PEs (a team, not the world), the even PEs, the odd PEs, and
/// PEs 1.. (a team not starting at PE 0).
fn split_teams(env: &Env) -> shmem::Result<Vec<Group>> {
    let n = env.n();
    let mut specs = vec![("every PE", 0, 1, n), ("even PEs", 0, 2, n.div_ceil(2))];
    if n >= 2 {
        specs.push(("odd PEs", 1, 2, n / 2));
    }
    if n >= 3 {
        specs.push(("PEs 1..", 1, 1, n - 1));
    }
    let mut groups = Vec::new();
    for (name, start, stride, size) in specs {
        if let Some(team) = env.ctx.team_split_strided(start, stride, size)? {
            let members = (0..team.n_pes()).map(|i| team.world_pe(i)).collect::<shmem::Result<Vec<_>>>()?;
            let name = format!("team {name} {members:?}");
            groups.push(Group { name, me: team.my_pe(), members, team: Some(team) });
        }
    }
    Ok(groups)
}

/// PE `pe`'s input element `i`: random bits for data movement (NaNs and
/// all), [`TestElem::random`] values for reductions, and for float sums
/// a share of [`cancelling`] elements.
pub fn input<T: TestElem>(seed: u64, pe: usize, i: usize, op: Option<ReduceOp>) -> T {
    let r = mix(seed ^ mix((pe as u64) << 40 ^ i as u64));
    match op {
        None => payload(seed, pe, i),
        Some(ReduceOp::Sum) if T::ROUNDOFF > 0.0 => match cancelling(seed, pe, i, r) {
            Some(x) => T::from_real(x),
            None => T::random(r, ReduceOp::Sum),
        },
        Some(op) => T::random(r, op),
    }
}

/// One float sum's element in four (the same on every PE): two PEs `a`
/// and `b` (world PEs 0–7, drawn per element) hold +B and −B, B in
/// [2^15, 1.5 · 2^15), the others small values in ±[2^-14, 2^-13). In f32,
/// the accumulator of f16 and bf16 too, what has been added before a ±B
/// vanishes in it, so the sum in PE order is the small values after both
/// Bs, and a sum in most other orders misses or keeps another one: a
/// difference far above f16's and bf16's rounding, which random values
/// alone seldom show, their f32 sums differing from order to order only in
/// bits that the rounding to 2 bytes drops. All within f16's range.
fn cancelling(seed: u64, pe: usize, i: usize, r: u64) -> Option<f64> {
    let h = mix(seed ^ mix(i as u64 ^ 0x5eed_ca9c_e11a_7105));
    let (a, b) = ((h >> 2) % 8, (h >> 5) % 8);
    if h & 3 != 0 || a == b {
        return None;
    }
    let big = f64::from_bits((1023 + 15) << 52 | h >> 13);
    Some(match pe as u64 {
        p if p == a => big,
        p if p == b => -big,
        _ => f64::from_bits((r >> 8 & 1) << 63 | (1023 - 14) << 52 | r >> 12),
    })
}

/// The reference reduction: `xs` combined in order, accumulating as the
/// runtime does (f16 and bf16 in f32, rounded once).
pub fn reduce<T: TestElem>(op: ReduceOp, mut xs: impl Iterator<Item = T>) -> T {
    let first = xs.next().expect("at least one PE").to_acc();
    T::from_acc(xs.fold(first, |acc, x| T::combine(op, acc, x.to_acc())))
}

/// The reference of the node-grouped order ([`shmem::ReduceOrder::NodeGrouped`]):
/// `xs` (in PE order) in groups of `per_node`, each reduced as [`reduce`]
/// does, then the groups' results combined in order, accumulating as
/// [`reduce`] does.
pub fn reduce_grouped<T: TestElem>(op: ReduceOp, xs: &[T], per_node: usize) -> T {
    reduce(op, xs.chunks(per_node).map(|node| reduce(op, node.iter().copied())))
}

/// The wrong results of one test on this PE. Checking goes on after a wrong
/// value (every PE must make the same calls), and the test fails at the end.
pub struct Report {
    pe: usize,
    suite_seed: u64,
    wrong: usize,
    first: Vec<String>,
}

impl Report {
    pub fn new(env: &Env) -> Report {
        Report { pe: env.me(), suite_seed: env.suite_seed(), wrong: 0, first: Vec::new() }
    }

    /// The seed of the case `label`: the same on every PE, and the same
    /// whichever tests run before it (`SHMEM_TEST_SEED` and a filter repeat it).
    pub fn seed(&self, label: &str) -> u64 {
        let fnv = label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        mix(self.suite_seed ^ fnv)
    }

    /// Compares bits; on a difference, records the case, how many elements
    /// differ and the first of them.
    pub fn check<T: TestElem>(&mut self, label: &str, seed: u64, what: &str, got: &[T], want: &[T]) {
        self.check_within(label, seed, what, got, want, None);
    }

    /// As [`Report::check`], but where `slack` is given an element may also
    /// be a finite value within `slack[i]` of the wanted one (a reduction
    /// in another order than the reference's).
    pub fn check_within<T: TestElem>(
        &mut self,
        label: &str,
        seed: u64,
        what: &str,
        got: &[T],
        want: &[T],
        slack: Option<&[f64]>,
    ) {
        assert_eq!(got.len(), want.len(), "{label}: {what}: length");
        let close = |i: usize| {
            slack.is_some_and(|sl| {
                let (g, w) = (got[i].real(), want[i].real());
                g.is_finite() && (g - w).abs() <= sl[i]
            })
        };
        let mut bad = (0..got.len()).filter(|&i| got[i].bits() != want[i].bits() && !close(i));
        let Some(i) = bad.next() else { return };
        let count = 1 + bad.count();
        let msg = format!(
            "PE {}: {label}: {what}: {count} of {} elements wrong, the first at index {i}: got {:?} ({:#x}), \
             want {:?} ({:#x}); case seed {seed:#x}, SHMEM_TEST_SEED={}",
            self.pe,
            got.len(),
            got[i],
            got[i].bits(),
            want[i],
            want[i].bits(),
            self.suite_seed
        );
        if self.wrong < 20 {
            eprintln!("[pe {}] {msg}", self.pe);
        }
        self.wrong += 1;
        if self.first.len() < 3 {
            self.first.push(msg);
        }
    }

    /// Records a failure that is not a wrong value.
    pub fn fail(&mut self, label: &str, what: &str) {
        let msg = format!("PE {}: {label}: {what}", self.pe);
        eprintln!("[pe {}] {msg}", self.pe);
        self.wrong += 1;
        if self.first.len() < 3 {
            self.first.push(msg);
        }
    }

    pub fn finish(self) -> TestResult {
        if self.wrong == 0 {
            return Ok(());
        }
        Err(format!("{} check(s) failed; the first:\n  {}", self.wrong, self.first.join("\n  ")).into())
    }
}

/// One collective call to check.
#[derive(Clone, Copy)]
struct Case<'a> {
    coll: Coll,
    variant: Variant,
    op: Option<ReduceOp>,
    len: usize,
    placement: Placement,
    root: usize,
    group: &'a Group,
    /// Collectives go through RMA (the variant or `SHMEM_FORCE_RMA=1`).
    rma: bool,
    /// Reductions in the node-grouped order, on nodes of this many PEs
    /// (the group takes the node-aware forms under [`Variant::NodeGrouped`]).
    grouped: Option<usize>,
}

impl Case<'_> {
    fn label<T: TestElem>(&self) -> String {
        let op = self.op.map_or(String::new(), |op| format!(" {op}"));
        let root = if self.coll == Coll::Broadcast { format!(" from root {}", self.root) } else { String::new() };
        format!(
            "{}{op} {} × {} {}{root} on {}, settings {}{}",
            self.coll.name(),
            T::DTYPE,
            self.len,
            self.placement.name(),
            self.group.name,
            self.variant.name(),
            if self.rma { " (RMA forced)" } else { "" }
        )
    }

    /// Whether this case's result may differ from the reference's order of
    /// operations: a float sum or product over more than two PEs by
    /// NVSHMEM's own collective (the baseline adds in its own order, not in
    /// PE order as shmem's kernels and the reference do).
    fn reordered<T: TestElem>(&self) -> bool {
        self.variant == Variant::Nvshmem
            && T::ROUNDOFF > 0.0
            && self.group.members.len() > 2
            && matches!(self.coll, Coll::AllReduce | Coll::ReduceScatter)
            && matches!(self.op, Some(ReduceOp::Sum | ReduceOp::Prod))
    }

    /// How far element `i` of a [`Case::reordered`] case may lie from the
    /// reference: the bound of a reduction of n terms in any order,
    /// doubled, n · u · Σ|x| for a sum and n · u · |Π x| for a product (u:
    /// the unit roundoff).
    fn reorder_slack<T: TestElem>(&self, i: usize, x: impl Fn(usize, usize) -> T) -> f64 {
        let (tn, me, len) = (self.group.members.len(), self.group.me, self.len);
        let index = if self.coll == Coll::ReduceScatter { me * len + i } else { i };
        let terms = (0..tn).map(|m| x(m, index).real());
        let size = match self.op {
            Some(ReduceOp::Prod) => terms.product::<f64>().abs(),
            _ => terms.map(f64::abs).sum::<f64>(),
        };
        2.0 * tn as f64 * T::ROUNDOFF * size
    }

    /// Whether the node-grouped and the PE-order references of this case
    /// must differ somewhere: float sums of a thousand elements or more.
    fn distinguishes_orders<T: TestElem>(&self) -> bool {
        T::ROUNDOFF > 0.0 && self.op == Some(ReduceOp::Sum) && self.len >= 1000
    }

    /// Element `i` of this PE's expected output, from `x(member, index)`.
    fn expected<T: TestElem>(&self, i: usize, x: impl Fn(usize, usize) -> T) -> T {
        let (tn, me, len) = (self.group.members.len(), self.group.me, self.len);
        let op = self.op.unwrap_or(ReduceOp::Sum);
        let fold = |index: usize| match self.grouped {
            Some(per_node) => reduce_grouped(op, &(0..tn).map(|m| x(m, index)).collect::<Vec<T>>(), per_node),
            None => reduce(op, (0..tn).map(|m| x(m, index))),
        };
        match self.coll {
            Coll::AllReduce => fold(i),
            Coll::ReduceScatter => fold(me * len + i),
            Coll::AllGather => x(i / len, i % len),
            Coll::Broadcast => x(self.root, i),
            Coll::AllToAll => x(i / len, me * len + i % len),
        }
    }
}

fn barrier_orders_writes(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let buf = env.ctx.alloc_zeroed::<u64>(n)?;
    for round in 1..=20u64 {
        for pe in 0..n {
            env.ctx.p(&buf, me, round * 100 + me as u64, pe, s)?;
        }
        env.ctx.barrier_all(s)?;
        let got = buf.copy_to_host(s)?;
        for (pe, v) in got.iter().enumerate() {
            assert_eq!(*v, round * 100 + pe as u64, "round {round}: PE {pe}'s write not visible after the barrier");
        }
        env.ctx.barrier_all(s)?;
    }
    Ok(())
}

/// One collective over the world under one variant.
fn world(env: &Env, coll: Coll, v: Variant) -> TestResult {
    v.on_this_backend(env)?;
    let _settings = Settings::apply(&env.ctx, v);
    let mut rep = Report::new(env);
    if v.about_nodes() {
        nodes_taken(env, v, &mut rep)?;
    }
    each_dtype!(one_dtype, env, &[Group::world(env)], coll, v, &mut rep)?;
    rep.finish()
}

/// Under the settings of the route across nodes: the world takes the
/// node-aware forms where it should, on either backend: spanning nodes of
/// consecutive ranks, not under forced RMA, not [`Variant::Flat`]. On the
/// gpu backend that means its node-aware kernels ran the all-gather,
/// broadcast, all-to-all, all-reduce and reduce-scatter (the reductions in
/// the order the variant asks for).
fn nodes_taken(env: &Env, v: Variant, rep: &mut Report) -> TestResult {
    // This PE's node is ranks a·L .. a·L + L.
    let node = env.ctx.node();
    let per_node = node.n_pes();
    let members = (0..per_node).map(|k| node.world_pe(k)).collect::<shmem::Result<Vec<_>>>()?;
    let first = env.me() / per_node * per_node;
    let consecutive = members.iter().enumerate().all(|(k, &pe)| pe == first + k);
    let all_consecutive = env.agree(u32::from(consecutive))?.iter().all(|&c| c == 1);
    let should = v != Variant::Flat && per_node < env.n() && all_consecutive && !env.ctx.force_rma();
    let takes = env.ctx.world().node_aware();
    if takes != should {
        rep.fail(
            &format!("the world's collectives under settings {}", v.name()),
            &format!("node-aware forms taken: {takes}, expected {should} ({per_node} PEs a node of {})", env.n()),
        );
    }
    Ok(())
}

/// The collectives a variant is about, over split teams.
fn teams(env: &Env, v: Variant) -> TestResult {
    v.on_this_backend(env)?;
    let _settings = Settings::apply(&env.ctx, v);
    let groups = split_teams(env)?;
    for g in &groups {
        if g.team.as_ref().is_some_and(|t| t.node_aware()) {
            return Err(format!("{} takes the node-aware forms, which are the world's only", g.name).into());
        }
    }
    let mut rep = Report::new(env);
    for coll in Coll::ALL.into_iter().filter(|&c| v.covers(c)) {
        each_dtype!(one_dtype, env, &groups, coll, v, &mut rep)?;
    }
    rep.finish()
}

/// Every case of `coll` for one dtype over `groups` (this PE's; the buffers
/// are allocated over the world, the same sequence on every PE).
fn one_dtype<T: TestElem>(env: &Env, groups: &[Group], coll: Coll, v: Variant, rep: &mut Report) -> TestResult {
    let gpu = env.ctx.backend() == BackendKind::Gpu;
    let plan = Plan { gpu, variant: v, coll, teams: groups.iter().any(|g| g.team.is_some()) };
    let rma = env.ctx.force_rma();
    let node_width = env.ctx.node().n_pes();
    let ops: Vec<Option<ReduceOp>> =
        if coll.reduces() { T::OPS.iter().copied().map(Some).collect() } else { vec![None] };
    for (tier, len) in plan.lengths(env, T::DTYPE) {
        let ops: Vec<_> = ops.iter().copied().filter(|&op| plan.covers(tier, T::DTYPE, op)).collect();
        if ops.is_empty() {
            continue;
        }
        let (src_len, dst_len) = coll.shape(len, env.n());
        let pad = 1 + GUARD_BYTES / size_of::<T>();
        let need = (src_len + dst_len + 2 * pad) * size_of::<T>();
        let free = env.ctx.heap_size() - env.ctx.heap_used();
        if need + (16 << 20) > free {
            if env.me() == 0 {
                eprintln!(
                    "coll::{}::{}: {} × {len} skipped: it needs {need} bytes of symmetric heap, {free} are free \
                     (raise SHMEM_HEAP_SIZE; ci/gpu-run.sh sets 2G)",
                    coll.name(),
                    v.name(),
                    T::DTYPE
                );
            }
            continue;
        }
        let src = env.ctx.alloc::<T>(src_len + pad)?;
        let dst = env.ctx.alloc::<T>(dst_len + pad)?;
        for group in groups {
            let roots = match (coll, tier) {
                (Coll::Broadcast, Tier::Small) => (0..group.members.len()).collect(),
                (Coll::Broadcast, _) => vec![group.members.len() - 1],
                _ => vec![0],
            };
            for &op in &ops {
                for &placement in placements(v, tier) {
                    for &root in &roots {
                        let node_aware =
                            group.team.as_ref().map_or_else(|| env.ctx.world().node_aware(), Team::node_aware);
                        let grouped = (v == Variant::NodeGrouped && node_aware).then_some(node_width);
                        let case = Case { coll, variant: v, op, len, placement, root, group, rma, grouped };
                        run_case(env, rep, &case, &src, &dst)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes the inputs, poisons the outputs, makes the call, and checks the
/// output, the guards, and (out of place) that the source is unchanged.
fn run_case<T: TestElem>(
    env: &Env,
    rep: &mut Report,
    c: &Case<'_>,
    src_buf: &SymmetricBuffer<T>,
    dst_buf: &SymmetricBuffer<T>,
) -> TestResult {
    let (s, g) = (&env.s, c.group);
    let (tn, me, len) = (g.members.len(), g.me, c.len);
    let (src_len, dst_len) = c.coll.shape(len, tn);
    let label = c.label::<T>();
    if trace() {
        eprintln!("[pe {}] case {label}", env.me());
    }
    let seed = rep.seed(&label);
    let guard = GUARD_BYTES / size_of::<T>();
    let x = |m: usize, i: usize| input::<T>(seed, g.members[m], i, c.op);
    let mut want = vec![poison::<T>(); dst_len];
    par_fill(&mut want, env.threads(), |i| c.expected(i, x));
    if let (Some(per_node), true) = (c.grouped, c.distinguishes_orders::<T>()) {
        // The check must be able to tell the orders apart: float sums of
        // random mantissas differ somewhere at this size.
        let pe_order = Case { grouped: None, ..*c };
        let same = (0..dst_len).all(|i| pe_order.expected(i, x).bits() == want[i].bits());
        if same && tn > per_node && per_node > 1 {
            rep.fail(&label, "the node-grouped reference equals the PE-order one everywhere");
        }
    }
    let slack: Option<Vec<f64>> = c.reordered::<T>().then(|| (0..dst_len).map(|i| c.reorder_slack(i, x)).collect());
    // Each region: poison before it (misaligned), its data, poison after.
    let at = usize::from(c.placement == Placement::Misaligned);
    let framed = |len: usize, data: Range<usize>, f: &(dyn Fn(usize) -> T + Sync)| {
        let mut v = vec![poison::<T>(); at + len + guard];
        par_fill(&mut v[at + data.start..at + data.end], env.threads(), |i| f(data.start + i));
        v
    };
    let mine = |i: usize| x(me, i);
    let block = me * len..(me + 1) * len;
    let refuses = nvshmem_refuses(env, c, src_len * size_of::<T>());
    let mut refused = false;
    // (the buffer read back, its host image before the call, where the
    // output lies in it)
    let (out_buf, out_image, out_at) = match (c.placement, c.coll) {
        (Placement::OutOfPlace | Placement::Misaligned, _) => {
            let src_image = framed(src_len, 0..src_len, &mine);
            let dst_image = framed(dst_len, 0..0, &mine);
            src_buf.slice(..src_image.len()).copy_from_host(&src_image, s)?;
            dst_buf.slice(..dst_image.len()).copy_from_host(&dst_image, s)?;
            refused |= outcome(
                refuses,
                g.call(
                    &env.ctx,
                    c.coll,
                    dst_buf.slice(at..at + dst_len),
                    src_buf.slice(at..at + src_len),
                    c.op,
                    c.root,
                    s,
                ),
            )?;
            rep.check(
                &label,
                seed,
                "source afterwards",
                &src_buf.slice(..src_image.len()).copy_to_host(s)?,
                &src_image,
            );
            (dst_buf, dst_image, at)
        }
        (Placement::InPlace, Coll::AllGather) => {
            let image = framed(dst_len, block.clone(), &|i| mine(i - me * len));
            dst_buf.slice(..image.len()).copy_from_host(&image, s)?;
            refused |= outcome(
                refuses,
                g.call(&env.ctx, c.coll, dst_buf.slice(..dst_len), dst_buf.slice(block), c.op, c.root, s),
            )?;
            (dst_buf, image, 0)
        }
        (Placement::InPlace, Coll::ReduceScatter) => {
            let image = framed(src_len, 0..src_len, &mine);
            src_buf.slice(..image.len()).copy_from_host(&image, s)?;
            refused |= outcome(
                refuses,
                g.call(&env.ctx, c.coll, src_buf.slice(block.clone()), src_buf.slice(..src_len), c.op, c.root, s),
            )?;
            (src_buf, image, block.start)
        }
        (Placement::InPlace, _) => {
            let image = framed(src_len, 0..src_len, &mine);
            src_buf.slice(..image.len()).copy_from_host(&image, s)?;
            refused |= outcome(
                refuses,
                g.call(&env.ctx, c.coll, src_buf.slice(..src_len), src_buf.slice(..src_len), c.op, c.root, s),
            )?;
            (src_buf, image, 0)
        }
    };
    let got = out_buf.slice(..out_image.len()).copy_to_host(s)?;
    if refused {
        // Nothing written.
        rep.check(&label, seed, "output of a refused call", &got, &out_image);
        return Ok(());
    }
    rep.check_within(&label, seed, "result", &got[out_at..out_at + dst_len], &want, slack.as_deref());
    let fence = out_image.len() - guard;
    rep.check(&label, seed, "poison before the region", &got[..at], &out_image[..at]);
    rep.check(&label, seed, "guard after the region", &got[fence..], &out_image[fence..]);
    Ok(())
}

/// Whether the call must be refused: NVSHMEM's reduce-scatter (on the gpu
/// backend) where the source does not fit half of NVSHMEM's reduce scratch
/// (`NVSHMEM_REDUCE_SCRATCH_SIZE` bytes, 512 KiB by default; this reads a
/// plain number of bytes), past which NVSHMEM writes beyond it.
fn nvshmem_refuses(env: &Env, c: &Case<'_>, src_bytes: usize) -> bool {
    let scratch = std::env::var("NVSHMEM_REDUCE_SCRATCH_SIZE").ok().and_then(|v| v.parse().ok()).unwrap_or(512 << 10);
    env.ctx.backend() == BackendKind::Gpu
        && c.variant == Variant::Nvshmem
        && c.coll == Coll::ReduceScatter
        && src_bytes > scratch / 2
}

/// Whether a call was refused as `refuses` says it must be (`Ok(true)`), or
/// ran as it must (`Ok(false)`); otherwise its error.
fn outcome(refuses: bool, r: shmem::Result<()>) -> Result<bool, Box<dyn std::error::Error>> {
    match (r, refuses) {
        (Ok(()), false) => Ok(false),
        (Err(shmem::Error::Invalid(m)), true) if m.contains("NVSHMEM_REDUCE_SCRATCH_SIZE") => Ok(true),
        (Ok(()), true) => Err("NVSHMEM's reduce-scatter ran on a source past half its reduce scratch".into()),
        (Err(e), _) => Err(e.into()),
    }
}

/// `SHMEM_TEST_HUGE=0`: leave out the 256 MiB cases (the sanitizers' runs
/// on the box: the kernels take the same paths at 1M elements).
fn huge_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SHMEM_TEST_HUGE").is_none_or(|v| v != "0"))
}

/// `SHMEM_TEST_TRACE=1`: every case is named on stderr before it runs, so a
/// run that hangs says where.
fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SHMEM_TEST_TRACE").is_some_and(|v| v != "0"))
}
