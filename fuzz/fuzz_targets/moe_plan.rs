//! `plan_exchange` (the split/offset validation and output layout of the three
//! all-to-all-v operations) against a plain reference in i128: the same
//! verdict, the same failure (kind, PE, index, message), and for a valid
//! exchange the same chunks and `out_splits_offsets` on every PE.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use shmem::fuzzing::{plan_exchange, A2av, Plan};
use shmem::Error;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    OneD,
    TwoD,
    TwoDOffset,
}

/// A split or offset: mostly small, so that many exchanges are valid.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Value {
    Small(u8),
    Signed(i8),
    Any(i64),
    Edge(u8),
}

impl Value {
    fn get(self) -> i64 {
        match self {
            Value::Small(v) => v as i64 % 16,
            Value::Signed(v) => v as i64,
            Value::Any(v) => v,
            Value::Edge(k) => {
                [i64::MAX, i64::MIN, i64::MAX - 1, i64::MIN + 1, -1, 0, 1 << 62, 1 << 32, u32::MAX as i64]
                    [k as usize % 9]
            }
        }
    }
}

/// Rows of an input or output: at most `i64::MAX` (the planner's
/// precondition: they count rows of a heap region).
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Rows {
    Small(u16),
    Any(u64),
    Max,
}

impl Rows {
    fn get(self) -> u64 {
        match self {
            Rows::Small(r) => r as u64 % 1024,
            Rows::Any(r) => r & i64::MAX as u64,
            Rows::Max => i64::MAX as u64,
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    op: Op,
    n: u8,
    experts_per_pe: u8,
    major_align: u8,
    in_rows: Rows,
    out_rows: Rows,
    /// Offset variant: offsets are the previous chunk's end plus the value
    /// (so that ascending offsets are common), not the value itself.
    offsets_as_gaps: bool,
    values: Vec<Value>,
}

/// Why the reference rejects an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    NegativeSplit {
        pe: usize,
        i: usize,
    },
    NegativeOffset {
        pe: usize,
        i: usize,
    },
    Backwards {
        pe: usize,
        i: usize,
    },
    PastInput {
        pe: usize,
        i: usize,
    },
    /// `total` rows (unpadded and padded) do not fit PE `pe`'s output.
    Overflow {
        pe: usize,
        total: i128,
    },
}

/// One PE's part, in i128.
#[derive(Debug, PartialEq, Eq)]
struct RefPlan {
    /// (source, first source row, first output row, rows), non-empty only.
    chunks: Vec<(usize, i128, i128, i128)>,
    out_splits: Vec<i128>,
    out_offsets: Vec<i128>,
}

/// The specification, one obvious step at a time. `data[s]` is PE `s`'s
/// splits, then (offset variant) its offsets.
fn reference(
    op: Op,
    n: usize,
    ne: usize,
    data: &[Vec<i64>],
    in_rows: u64,
    out_rows: u64,
    align: u64,
) -> Result<Vec<RefPlan>, Failure> {
    let m = match op {
        Op::OneD => n,
        _ => n * ne,
    };
    // Validate every source, in PE order, each entry in order.
    let mut from = vec![vec![0i128; m]; n];
    let mut rows = vec![vec![0i128; m]; n];
    for s in 0..n {
        let mut end: i128 = 0;
        for i in 0..m {
            let r = data[s][i] as i128;
            if r < 0 {
                return Err(Failure::NegativeSplit { pe: s, i });
            }
            let start = match op {
                Op::TwoDOffset => {
                    let o = data[s][m + i] as i128;
                    if o < 0 {
                        return Err(Failure::NegativeOffset { pe: s, i });
                    }
                    if o < end {
                        return Err(Failure::Backwards { pe: s, i });
                    }
                    o
                }
                _ => end,
            };
            if start + r > in_rows as i128 {
                return Err(Failure::PastInput { pe: s, i });
            }
            from[s][i] = start;
            rows[s][i] = r;
            end = start + r;
        }
    }
    // Lay out every destination, in PE order.
    let mut plans = Vec::new();
    for d in 0..n {
        let mut plan = RefPlan { chunks: vec![], out_splits: vec![], out_offsets: vec![] };
        let mut at: i128 = 0;
        let take = |s: usize, i: usize, at: &mut i128, plan: &mut RefPlan| {
            plan.out_splits.push(rows[s][i]);
            plan.out_offsets.push(*at);
            if rows[s][i] > 0 {
                plan.chunks.push((s, from[s][i], *at, rows[s][i]));
            }
            *at += rows[s][i];
        };
        match op {
            // Source order, entry `d` of each source.
            Op::OneD => {
                for s in 0..n {
                    take(s, d, &mut at, &mut plan);
                }
            }
            // Expert-major; each expert's block padded to a multiple of
            // `align`, at least `align` rows.
            Op::TwoD => {
                for e in 0..ne {
                    let start = at;
                    for s in 0..n {
                        take(s, d * ne + e, &mut at, &mut plan);
                    }
                    let got = at - start;
                    let mut padded = (got + align as i128 - 1) / align as i128 * align as i128;
                    if padded < align as i128 {
                        padded = align as i128;
                    }
                    at = start + padded;
                }
            }
            // Rank-major, packed: source `s`'s expert `e` sent entry `e × n + d`.
            Op::TwoDOffset => {
                for s in 0..n {
                    for e in 0..ne {
                        take(s, e * n + d, &mut at, &mut plan);
                    }
                }
            }
        }
        if at > out_rows as i128 {
            return Err(Failure::Overflow { pe: d, total: at });
        }
        plans.push(plan);
    }
    Ok(plans)
}

fn to_ref(p: &Plan) -> RefPlan {
    RefPlan {
        chunks: p.chunks.iter().map(|c| (c.src, c.from as i128, c.to as i128, c.rows as i128)).collect(),
        out_splits: p.out_splits.iter().map(|&v| v as i128).collect(),
        out_offsets: p.out_offsets.iter().map(|&v| v as i128).collect(),
    }
}

/// Checks that `err` is the failure the reference found, message included.
fn check_error(name: &str, err: &Error, want: Failure) {
    let (mismatch, fragments): (bool, Vec<String>) = match want {
        Failure::NegativeSplit { pe, i } => (false, vec![format!("PE {pe}'s split {i} is negative (")]),
        Failure::NegativeOffset { pe, i } => (false, vec![format!("PE {pe}'s offset {i} is negative (")]),
        Failure::Backwards { pe, i } => (
            false,
            vec![format!("PE {pe}'s offset {i} ("), format!("before the end of its chunk {}", i.wrapping_sub(1))],
        ),
        Failure::PastInput { pe, i } => {
            (true, vec![format!("PE {pe}'s chunk {i} ("), "runs past its input of".to_string()])
        }
        Failure::Overflow { pe, total } => {
            // The planner saturates at u64::MAX; below it the count is exact.
            let shown = total.min(u64::MAX as i128);
            (true, vec![format!("PE {pe} would receive {shown} rows")])
        }
    };
    let msg = match (err, mismatch) {
        (Error::Invalid(m), false) | (Error::LengthMismatch(m), true) => m,
        _ => panic!("{want:?}: wrong error variant {err:?}"),
    };
    assert!(msg.starts_with(&format!("{name}: ")), "{want:?}: {msg}");
    for f in fragments {
        assert!(msg.contains(&f), "{want:?}: `{msg}` lacks `{f}`");
    }
}

fuzz_target!(|input: Input| {
    let n = input.n as usize % 8 + 1;
    let ne = match input.op {
        Op::OneD => 1,
        _ => input.experts_per_pe as usize % 8 + 1,
    };
    let m = n * ne;
    // The real calls pass 0 for the operations that do not pad.
    let align = match input.op {
        Op::TwoD => input.major_align as usize + 1,
        _ => 0,
    };
    let (in_rows, out_rows) = (input.in_rows.get(), input.out_rows.get());
    let values = if input.values.is_empty() { vec![Value::Small(0)] } else { input.values.clone() };
    let mut next = values.iter().cycle().map(|v| v.get());
    let data: Vec<Vec<i64>> = (0..n)
        .map(|_| {
            let mut v: Vec<i64> = (0..m).map(|_| next.next().unwrap()).collect();
            if let Op::TwoDOffset = input.op {
                let mut end = 0i64;
                for i in 0..m {
                    let x = next.next().unwrap();
                    let o = if input.offsets_as_gaps { end.saturating_add(x) } else { x };
                    v.push(o);
                    end = o.saturating_add(v[i].max(0));
                }
            }
            v
        })
        .collect();
    let (op, name) = match input.op {
        Op::OneD => (A2av::OneD, "all_to_all_v"),
        Op::TwoD => (A2av::TwoD, "all_to_all_v_2d"),
        Op::TwoDOffset => (A2av::TwoDOffset, "all_to_all_v_2d_offset"),
    };
    let want = reference(input.op, n, ne, &data, in_rows, out_rows, align as u64);
    for me in 0..n {
        let got = plan_exchange(op, me, &data, m, in_rows, out_rows, align);
        match (&got, &want) {
            (Ok(p), Ok(plans)) => assert_eq!(to_ref(p), plans[me], "PE {me}"),
            (Err(e), Err(f)) => check_error(name, e, *f),
            _ => panic!("PE {me}: planner {got:?}, reference {want:?}"),
        }
    }
});
