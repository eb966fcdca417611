//! The choice functions' table tests.

use super::*;

#[test]
fn moe_lines_fit_the_room_of_one_sender() {
    // DeepSeek's rows (7168 bf16, 128 lines of 112 bytes each): 131
    // tokens of input fit in worlds of up to 8 PEs (16896 lines), 132
    // do not.
    let row = 7168 * 2;
    assert!(moe_lines_fit(2, 8, false, 128 * row));
    assert!(moe_lines_fit(8, 8, true, 128 * row));
    assert!(moe_lines_fit(2, 8, false, 131 * row));
    assert!(!moe_lines_fit(2, 8, false, 132 * row));
    assert!(!moe_lines_fit(2, 8, false, 4096 * row));
    // Larger worlds have 2560 lines a sender.
    assert!(moe_lines_fit(9, 8, false, 16 * row));
    assert!(moe_lines_fit(9, 8, false, 19 * row));
    assert!(!moe_lines_fit(9, 8, false, 20 * row));
    // The splits' lines and a line a chunk count.
    let line = LINE_DATA_BYTES_WIDE;
    assert!(moe_lines_fit(2, 1, false, 16894 * line));
    assert!(!moe_lines_fit(2, 1, false, 16894 * line + 1));
    assert!(moe_lines_fit(2, 8, false, 16886 * line));
    assert!(!moe_lines_fit(2, 8, true, 16886 * line), "the offsets take a line more");
    assert!(!moe_lines_fit(2, usize::MAX, false, 0));
}

#[test]
fn low_latency_limit_follows_what_each_pe_sends() {
    let none = Tuning::default();
    assert_eq!(low_latency_max_bytes(1, &none), 1 << 20);
    assert_eq!(low_latency_max_bytes(2, &none), 1 << 20);
    assert_eq!(low_latency_max_bytes(4, &none), (1 << 20) / 3);
    assert_eq!(low_latency_max_bytes(8, &none), (1 << 20) / 7);
    assert_eq!(low_latency_max_bytes(9, &none), 128 << 10);
    assert_eq!(low_latency_max_bytes(64, &none), 128 << 10);
    let tuned = |b| Tuning { low_latency_max_bytes: Some(b), ..Tuning::default() };
    assert_eq!(low_latency_max_bytes(8, &tuned(1 << 20)), 1 << 20);
    assert_eq!(low_latency_max_bytes(2, &tuned(4 << 20)), 1 << 20, "capped at the room");
    assert_eq!(low_latency_max_bytes(16, &tuned(1 << 20)), 128 << 10, "capped at the room");
    assert_eq!(low_latency_max_bytes(2, &tuned(0)), 0);
}

#[test]
fn a_team_of_one_copies_by_copy_engine_in_graphs_and_when_large() {
    let none = Tuning::default();
    assert_eq!(solo_copy_engine_min_bytes(true, true, &none), 0);
    assert_eq!(solo_copy_engine_min_bytes(false, true, &none), 0);
    assert_eq!(solo_copy_engine_min_bytes(true, false, &none), 2 << 20);
    assert_eq!(solo_copy_engine_min_bytes(false, false, &none), 8 << 20);
    let tuned = Tuning { solo_copy_engine_min_bytes: Some(4096), ..Tuning::default() };
    for (reduces, captured) in [(true, true), (true, false), (false, true), (false, false)] {
        assert_eq!(solo_copy_engine_min_bytes(reduces, captured, &tuned), 4096);
    }
}

#[test]
fn defaults() {
    let none = Tuning::default();
    assert_eq!(low_latency_lines_min_bytes(&none), 256 << 10, "lines from 256 KiB a peer");
    assert_eq!(moe_lines_max_bytes(&none), Some(usize::MAX), "the MoE line kernel wherever it fits");
    assert_eq!(broadcast_pull_min_bytes(&none), usize::MAX, "no broadcast pulled");
    let tuned = Tuning {
        low_latency_lines_min_bytes: Some(0),
        moe_lines_max_bytes: Some(0),
        broadcast_pull_min_bytes: Some(16 << 20),
        ..Tuning::default()
    };
    assert_eq!(low_latency_lines_min_bytes(&tuned), 0);
    assert_eq!(moe_lines_max_bytes(&tuned), Some(0));
    assert_eq!(broadcast_pull_min_bytes(&tuned), 16 << 20);
}

#[test]
fn low_latency_grid_widens_at_32_kib() {
    let none = Tuning::default();
    assert_eq!(low_latency_blocks(8, &none), 16);
    assert_eq!(low_latency_blocks((32 << 10) - 1, &none), 16);
    assert_eq!(low_latency_blocks(32 << 10, &none), 128);
    let tuned = |b| Tuning { low_latency_blocks: Some(b), ..Tuning::default() };
    assert_eq!(low_latency_blocks(8, &tuned(64)), 64);
    assert_eq!(low_latency_blocks(1 << 20, &tuned(0)), 1);
    assert_eq!(low_latency_blocks(1 << 20, &tuned(500)), 128);
}

#[test]
fn low_latency_threads_take_the_lines_in_one_pass() {
    let none = Tuning::default();
    let (lines, wide) = (Some(LINE_DATA_BYTES), Some(LINE_DATA_BYTES_WIDE));
    // Packets: 512 at every size.
    assert_eq!(low_latency_threads(8, 16, None, &none), 512);
    assert_eq!(low_latency_threads(128 << 10, 128, None, &none), 512);
    // Lines on 128 blocks: 512 lines a pass a warp of each block.
    // 256 KiB (2185 lines): 5 warps would do, at least 8.
    assert_eq!(low_latency_threads(256 << 10, 128, lines, &none), 256);
    // 512 KiB (4370 lines): 9 warps.
    assert_eq!(low_latency_threads(512 << 10, 128, lines, &none), 288);
    // 1 MiB (8739 lines): 18 warps; in lines of 112 bytes (9363), 19.
    assert_eq!(low_latency_threads(1 << 20, 128, lines, &none), 576);
    assert_eq!(low_latency_threads(1 << 20, 128, wide, &none), 608);
    assert_eq!(low_latency_threads(9728 * LINE_DATA_BYTES, 128, lines, &none), 608);
    assert_eq!(low_latency_threads(9728 * LINE_DATA_BYTES + 1, 128, lines, &none), 640);
    // Past one pass of 20 warps: 20.
    assert_eq!(low_latency_threads(4 << 20, 128, lines, &none), 640);
    let tuned = |t| Tuning { low_latency_threads: Some(t), ..Tuning::default() };
    assert_eq!(low_latency_threads(1 << 20, 128, lines, &tuned(256)), 256);
    assert_eq!(low_latency_threads(8, 16, None, &tuned(300)), 288);
    assert_eq!(low_latency_threads(8, 16, None, &tuned(0)), 32);
    assert_eq!(low_latency_threads(8, 16, None, &tuned(1024)), 512);
    assert_eq!(low_latency_threads(8, 16, lines, &tuned(1024)), 640);
}

const PAIR: TeamShape = TeamShape { world: true, n_pes: 2, nvlink: true, lines: true };

#[test]
fn the_kernels_take_teams_of_up_to_64_unless_nvshmem_is_asked_for() {
    assert!(kernels_take(CollImpl::Kernels, 1));
    assert!(kernels_take(CollImpl::Kernels, 64));
    assert!(!kernels_take(CollImpl::Kernels, 65));
    assert!(!kernels_take(CollImpl::Nvshmem, 2));
}

#[test]
fn protocols_by_size_team_and_path() {
    let none = Tuning::default();
    assert_eq!(protocol(PAIR, 8, &none), Protocol::LowLatency);
    assert_eq!(protocol(PAIR, (256 << 10) - 1, &none), Protocol::LowLatency);
    assert_eq!(protocol(PAIR, 256 << 10, &none), Protocol::LowLatency128);
    assert_eq!(protocol(PAIR, 1 << 20, &none), Protocol::LowLatency128);
    assert_eq!(protocol(PAIR, (1 << 20) + 1, &none), Protocol::Sm, "past the packets' room and the push staging");
    let four = TeamShape { n_pes: 4, ..PAIR };
    assert_eq!(protocol(four, (1 << 20) / 3, &none), Protocol::LowLatency128);
    assert_eq!(protocol(four, (1 << 20) / 3 + 1, &none), Protocol::Push);
    assert_eq!(protocol(four, 1 << 20, &none), Protocol::Push);
    let nine = TeamShape { n_pes: 9, ..PAIR };
    assert_eq!(protocol(nine, 128 << 10, &none), Protocol::LowLatency);
    assert_eq!(protocol(nine, (128 << 10) + 1, &none), Protocol::Sm, "no push staging past 8 PEs");
    for team in [TeamShape { world: false, ..PAIR }, TeamShape { nvlink: false, ..PAIR }] {
        for bytes in [0, 8, 256 << 10, 1 << 20, 64 << 20] {
            assert_eq!(protocol(team, bytes, &none), Protocol::Sm);
        }
    }
    let lines = Tuning { low_latency_lines_min_bytes: Some(0), ..Tuning::default() };
    assert_eq!(protocol(PAIR, 8, &lines), Protocol::LowLatency128);
    let no_ll = Tuning { low_latency_max_bytes: Some(0), ..Tuning::default() };
    assert_eq!(protocol(PAIR, 8, &no_ll), Protocol::Push);
    assert!(all_to_all_in_place(PAIR, 1 << 20, &none));
    assert!(!all_to_all_in_place(PAIR, 2 << 20, &none));
}

#[test]
fn the_automatic_all_reduce() {
    let none = Tuning::default();
    let auto = |team, bytes, in_place| all_reduce_choice(team, AllReduceAlgo::Auto, bytes, in_place, &none);
    assert_eq!(auto(PAIR, 8, false), AllReduceChoice::LowLatency);
    assert_eq!(auto(PAIR, 256 << 10, true), AllReduceChoice::LowLatency128);
    assert_eq!(auto(PAIR, 1 << 20, false), AllReduceChoice::LowLatency128);
    let four = TeamShape { n_pes: 4, ..PAIR };
    assert_eq!(auto(four, (16 << 10) - 1, false), AllReduceChoice::LowLatency);
    assert_eq!(auto(four, 16 << 10, false), AllReduceChoice::LowLatency128);
    assert_eq!(auto(four, (1 << 20) - 1, true), AllReduceChoice::LowLatency128);
    assert_eq!(auto(four, 1 << 20, false), AllReduceChoice::TwoShot);
    assert_eq!(auto(four, 16 << 20, false), AllReduceChoice::TwoShot);
    let three = TeamShape { n_pes: 3, ..PAIR };
    assert_eq!(auto(three, 16 << 10, false), AllReduceChoice::LowLatency, "measured at 4: 3 as a pair");
    let tuned = Tuning { low_latency_lines_min_bytes: Some(512 << 10), ..Tuning::default() };
    let four_tuned = all_reduce_choice(four, AllReduceAlgo::Auto, 16 << 10, false, &tuned);
    assert_eq!(four_tuned, AllReduceChoice::LowLatency, "a tuned limit is the sweep's");
    // Past the world's protocols: one-shot out of place up to 256 KiB,
    // two-shot, by stores for a pair over NVLink out of place from 16 MiB.
    let split = TeamShape { world: false, ..PAIR };
    assert_eq!(auto(split, 256 << 10, false), AllReduceChoice::OneShot);
    assert_eq!(auto(split, 256 << 10, true), AllReduceChoice::TwoShot);
    assert_eq!(auto(split, (256 << 10) + 1, false), AllReduceChoice::TwoShot);
    assert_eq!(auto(split, (16 << 20) - 1, false), AllReduceChoice::TwoShot);
    assert_eq!(auto(split, 16 << 20, false), AllReduceChoice::TwoShotStores);
    assert_eq!(auto(split, 16 << 20, true), AllReduceChoice::TwoShot);
    assert_eq!(auto(PAIR, 16 << 20, false), AllReduceChoice::TwoShotStores);
    assert_eq!(auto(TeamShape { nvlink: false, ..PAIR }, 16 << 20, false), AllReduceChoice::TwoShot);
    assert_eq!(auto(TeamShape { n_pes: 3, ..split }, 16 << 20, false), AllReduceChoice::TwoShot);
}

#[test]
fn an_asked_all_reduce_where_it_applies() {
    let none = Tuning::default();
    let asked = |team, algo, bytes, in_place| all_reduce_choice(team, algo, bytes, in_place, &none);
    let split = TeamShape { world: false, ..PAIR };
    assert_eq!(asked(PAIR, AllReduceAlgo::LowLatency, 512 << 10, false), AllReduceChoice::LowLatency);
    assert_eq!(asked(split, AllReduceAlgo::LowLatency, 8, false), AllReduceChoice::OneShot, "else automatic");
    assert_eq!(asked(PAIR, AllReduceAlgo::LowLatency128, 8, false), AllReduceChoice::LowLatency128);
    let nine = TeamShape { n_pes: 9, ..PAIR };
    assert_eq!(
        asked(nine, AllReduceAlgo::LowLatency128, (128 << 10) + 1, false),
        AllReduceChoice::OneShot,
        "past the packets' room of a larger world"
    );
    assert_eq!(asked(PAIR, AllReduceAlgo::Push, 8, false), AllReduceChoice::Push);
    assert_eq!(asked(nine, AllReduceAlgo::Push, 8, false), AllReduceChoice::LowLatency);
    assert_eq!(asked(PAIR, AllReduceAlgo::OneShot, 64 << 20, false), AllReduceChoice::OneShot);
    assert_eq!(asked(PAIR, AllReduceAlgo::OneShot, 8, true), AllReduceChoice::LowLatency, "in place: automatic");
    assert_eq!(asked(PAIR, AllReduceAlgo::TwoShot, 8, true), AllReduceChoice::TwoShot);
    assert_eq!(asked(PAIR, AllReduceAlgo::TwoShotStores, 8, false), AllReduceChoice::TwoShotStores);
    assert_eq!(asked(PAIR, AllReduceAlgo::TwoShotStores, 8, true), AllReduceChoice::TwoShot);
    assert_eq!(asked(nine, AllReduceAlgo::TwoShotStores, 8, false), AllReduceChoice::TwoShot);
}

#[test]
fn the_host_all_reduce_is_one_shot_when_small() {
    assert!(host_all_reduce_one_shot(256 << 10, 64 << 10, 4));
    assert!(!host_all_reduce_one_shot((256 << 10) + 4, (64 << 10) + 1, 4));
    assert!(host_all_reduce_one_shot(1 << 30, 3, 4), "fewer elements than PEs");
}

#[test]
fn push_grids() {
    assert_eq!(push_blocks(&Tuning::default()), 64);
    let tuned = |b| Tuning { push_blocks: Some(b), ..Tuning::default() };
    assert_eq!(push_blocks(&tuned(0)), 1);
    assert_eq!(push_blocks(&tuned(32)), 32);
    assert_eq!(push_blocks(&tuned(500)), 128);
}

#[test]
fn a_team_of_one_copies_or_does_nothing() {
    let none = Tuning::default();
    assert_eq!(solo(true, 64 << 20, true, false, false, &none), Solo::Nothing);
    assert_eq!(solo(false, 0, false, false, false, &none), Solo::Nothing);
    assert_eq!(solo(false, 8, false, false, true, &none), Solo::CopyEngine, "in a graph");
    assert_eq!(solo(false, 8, true, false, true, &none), Solo::Kernel, "overlapping");
    assert_eq!(solo(false, (8 << 20) - 1, false, false, false, &none), Solo::Kernel);
    assert_eq!(solo(false, 8 << 20, false, false, false, &none), Solo::CopyEngine);
    assert_eq!(solo(false, 2 << 20, false, true, false, &none), Solo::CopyEngine);
}

#[test]
fn copy_engines_and_pulls_where_asked_over_nvlink() {
    assert!(all_gather_by_copy_engine(AllGatherAlgo::CopyEngine, true));
    assert!(!all_gather_by_copy_engine(AllGatherAlgo::CopyEngine, false));
    assert!(!all_gather_by_copy_engine(AllGatherAlgo::Auto, true));
    assert!(!all_gather_by_copy_engine(AllGatherAlgo::Sm, true));
    let none = Tuning::default();
    use BroadcastForm::{Pull, Push, Relay};
    let (mib, relay) = (1 << 20, BROADCAST_RELAY_MIN_BYTES);
    assert_eq!(relay, PUSH_MAX_BYTES + 1, "relayed past the push kernels");
    assert_eq!(broadcast_form(true, 4, usize::MAX - 1, &none), Relay, "no broadcast pulled by default");
    assert_eq!(broadcast_form(true, 3, relay, &none), Relay);
    assert_eq!(broadcast_form(true, 4, relay - 1, &none), Push);
    assert_eq!(broadcast_form(true, 2, 256 * mib, &none), Push, "a pair has nobody to relay to");
    assert_eq!(broadcast_form(false, 4, 256 * mib, &none), Push, "relays need NVLink");
    let tuned = Tuning { broadcast_pull_min_bytes: Some(16 * mib), ..Tuning::default() };
    assert_eq!(broadcast_form(true, 4, 16 * mib, &tuned), Pull);
    assert_eq!(broadcast_form(true, 2, 16 * mib, &tuned), Pull);
    assert_eq!(broadcast_form(true, 4, 16 * mib - 1, &tuned), Relay);
    assert_eq!(broadcast_form(false, 4, 16 * mib, &tuned), Push);
    let relays = Tuning { broadcast_relay_min_bytes: Some(0), ..Tuning::default() };
    assert_eq!(broadcast_form(true, 3, 1, &relays), Relay);
    assert_eq!(broadcast_form(true, 2, 1, &relays), Push);
}

#[test]
fn no_lines_where_pes_share_a_gpu() {
    let none = Tuning::default();
    let shared = TeamShape { lines: false, ..PAIR };
    let four = TeamShape { n_pes: 4, ..shared };
    let lines_asked = Tuning { low_latency_lines_min_bytes: Some(0), ..Tuning::default() };
    for (team, bytes) in [(shared, 512 << 10), (four, 128 << 10)] {
        assert!(!lines_take(team, bytes));
        assert_eq!(protocol(team, bytes, &none), Protocol::LowLatency);
        assert_eq!(protocol(team, 8, &lines_asked), Protocol::LowLatency);
        for asked in [AllReduceAlgo::Auto, AllReduceAlgo::LowLatency128] {
            assert_eq!(all_reduce_choice(team, asked, bytes, false, &none), AllReduceChoice::LowLatency);
        }
    }
    assert_eq!(protocol(TeamShape { lines: true, ..shared }, 512 << 10, &none), Protocol::LowLatency128);
    let row = 7168 * 2;
    assert_eq!(moe_form(shared, 8, false, 128 * row, MoeKernels::Lines, &none), MoeForm::OneKernel);
    assert_eq!(moe_form(PAIR, 8, false, 128 * row, MoeKernels::Lines, &none), MoeForm::Lines);
}

#[test]
fn moe_forms() {
    let none = Tuning::default();
    let row = 7168 * 2;
    let form = |team, ne, combine, bytes, asked| moe_form(team, ne, combine, bytes, asked, &none);
    assert_eq!(form(PAIR, 8, false, 128 * row, MoeKernels::Auto), MoeForm::Lines);
    assert_eq!(form(PAIR, 8, true, 128 * row, MoeKernels::Auto), MoeForm::Lines);
    assert_eq!(form(PAIR, 8, false, 132 * row, MoeKernels::Auto), MoeForm::OneKernel, "past the lines' buffer");
    assert_eq!(form(PAIR, 8, false, 132 * row, MoeKernels::Lines), MoeForm::OneKernel);
    assert_eq!(form(PAIR, 8, false, row, MoeKernels::PlanThenMove), MoeForm::PlanThenMove);
    let split = TeamShape { world: false, ..PAIR };
    assert_eq!(form(split, 8, false, row, MoeKernels::Lines), MoeForm::OneKernel, "lines on the world only");
    let rma = TeamShape { nvlink: false, ..PAIR };
    assert_eq!(form(rma, 8, false, row, MoeKernels::Auto), MoeForm::PlanThenMove);
    assert_eq!(form(PAIR, 32, false, row, MoeKernels::Auto), MoeForm::Lines);
    assert_eq!(form(PAIR, 33, false, row, MoeKernels::Auto), MoeForm::OneKernel, "a lane a chunk");
    // The one kernel's packets: n × n × ne words (twice for the combine) up to 1024.
    let eight = TeamShape { n_pes: 8, ..split };
    assert_eq!(form(eight, 16, false, row, MoeKernels::Auto), MoeForm::OneKernel);
    assert_eq!(form(eight, 17, false, row, MoeKernels::Auto), MoeForm::PlanThenMove);
    assert_eq!(form(eight, 8, true, row, MoeKernels::Auto), MoeForm::OneKernel);
    assert_eq!(form(eight, 9, true, row, MoeKernels::Auto), MoeForm::PlanThenMove);
    // Lines up to a tuned input size.
    let tuned = Tuning { moe_lines_max_bytes: Some(0), ..Tuning::default() };
    assert_eq!(moe_form(PAIR, 8, false, 0, MoeKernels::Auto, &tuned), MoeForm::Lines);
    assert_eq!(moe_form(PAIR, 8, false, 1, MoeKernels::Auto, &tuned), MoeForm::OneKernel);
    assert_eq!(moe_form(PAIR, 8, false, 1, MoeKernels::Lines, &tuned), MoeForm::Lines);
}

/// The shape of a team of `members` whose PE `pe` is on node `nodes[pe]`.
fn shape(world: bool, members: &[usize], nodes: &[usize]) -> NodeShape {
    NodeShape::of(world, members, |pe| nodes[pe])
}

#[test]
fn node_shapes() {
    let two_by_two = [0, 0, 1, 1];
    let s = shape(true, &[0, 1, 2, 3], &two_by_two);
    assert_eq!(s, NodeShape { world: true, nodes: 2, per_node: 2, contiguous: true });
    // Ranks by node, not node by node (`--map-by node`).
    let s = shape(true, &[0, 1, 2, 3], &[0, 1, 0, 1]);
    assert_eq!(s, NodeShape { world: true, nodes: 2, per_node: 2, contiguous: false });
    // A block per node, but a node's block twice.
    let s = shape(true, &[0, 1, 2, 3, 4, 5, 6, 7], &[0, 0, 1, 1, 0, 0, 1, 1]);
    assert_eq!((s.per_node, s.contiguous), (4, false));
    // Uneven: 3 members on node 0, 1 on node 1.
    let s = shape(false, &[0, 1, 2, 3], &[0, 0, 0, 1]);
    assert_eq!(s, NodeShape { world: false, nodes: 2, per_node: 0, contiguous: false });
    // Nodes in team order other than the nodes' numbering still count.
    let s = shape(false, &[2, 3, 0, 1], &two_by_two);
    assert_eq!(s, NodeShape { world: false, nodes: 2, per_node: 2, contiguous: true });
    let s = shape(true, &[0, 1], &[0, 0]);
    assert_eq!(s, NodeShape { world: true, nodes: 1, per_node: 2, contiguous: true });
    let s = shape(true, &[0, 1, 2], &[0, 1, 2]);
    assert_eq!(s, NodeShape { world: true, nodes: 3, per_node: 1, contiguous: true });
}

#[test]
fn node_aware_where_the_world_spans_even_contiguous_nodes() {
    let world = |nodes, per_node| NodeShape { world: true, nodes, per_node, contiguous: true };
    for asked in [AcrossNodes::Auto, AcrossNodes::NodeAware] {
        assert!(node_aware(world(2, 2), asked, false));
        assert!(node_aware(world(2, 3), asked, false));
        assert!(node_aware(world(4, 8), asked, false));
        assert!(!node_aware(world(2, 2), asked, true), "forced RMA: flat");
        assert!(!node_aware(world(1, 4), asked, false), "one node: flat");
        assert!(!node_aware(NodeShape { world: false, ..world(2, 2) }, asked, false), "split team: flat");
        assert!(!node_aware(NodeShape { contiguous: false, ..world(2, 2) }, asked, false), "by node: flat");
        assert!(!node_aware(NodeShape { contiguous: false, ..world(2, 0) }, asked, false), "uneven: flat");
    }
    assert!(!node_aware(world(2, 1), AcrossNodes::Auto, false), "one PE a node: flat unless asked");
    assert!(node_aware(world(2, 1), AcrossNodes::NodeAware, false));
    assert!(!node_aware(world(2, 2), AcrossNodes::Flat, false));
    let d = Collectives::default();
    assert_eq!((d.across_nodes, d.reduce_order), (AcrossNodes::Auto, ReduceOrder::PeOrder));
}

#[test]
fn rail_shares_are_whole_vectors_covering_the_count() {
    // 4099 f32 (1025 vectors) over 2 rails: 512 vectors, then 513.
    assert_eq!(rail_share(4099, 4, 0, 2), 0..2048);
    assert_eq!(rail_share(4099, 4, 1, 2), 2048..4099);
    // Fewer vectors than rails: empty shares first.
    assert_eq!(rail_share(3, 2, 0, 3), 0..0);
    assert_eq!(rail_share(3, 2, 1, 3), 0..0);
    assert_eq!(rail_share(3, 2, 2, 3), 0..3);
    assert_eq!(rail_share(9, 2, 0, 3), 0..0);
    assert_eq!(rail_share(9, 2, 1, 3), 0..8);
    assert_eq!(rail_share(9, 2, 2, 3), 8..9);
    assert_eq!(rail_share(0, 8, 0, 2), 0..0);
    for (count, elem, parts) in [(1000, 8, 3), (7, 4, 2), (33, 2, 6), (1, 4, 1)] {
        let shares: Vec<_> = (0..parts).map(|i| rail_share(count, elem, i, parts)).collect();
        assert_eq!(shares[0].start, 0);
        assert_eq!(shares[parts - 1].end, count);
        assert!(shares.windows(2).all(|w| w[0].end == w[1].start));
        assert!(shares.iter().all(|r| r.start == count || r.start * elem % 16 == 0));
    }
}

#[test]
fn reductions_of_8_byte_elements_keep_wide_flags() {
    assert_eq!(reduce_line_data_bytes(2), 120);
    assert_eq!(reduce_line_data_bytes(4), 120);
    assert_eq!(reduce_line_data_bytes(8), 112);
}
