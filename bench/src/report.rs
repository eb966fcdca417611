//! The results: a row's JSON object, PE 0's tables, and notes on stderr.

use crate::args::Args;
use crate::harness::PER_GRAPH;
use crate::layer::LayerBytes;
use crate::moe::MoeShape;
use crate::ops::{Imp, Op, REFERENCES};
use crate::overlap::{self, MatmulShape};
use std::fmt::Write as _;
use std::io::Write as _;

/// One line of the table and of the JSON output.
#[derive(Clone, Debug)]
pub(super) struct Row {
    pub(super) op: Op,
    pub(super) imp: Imp,
    /// `None` for the barrier, which moves no data.
    pub(super) dtype: Option<&'static str>,
    pub(super) bytes: usize,
    /// Timed as CUDA-graph replays.
    pub(super) graph: bool,
    pub(super) time_us: f64,
    /// The MoE ops' parameters (`None` for the others).
    pub(super) moe: Option<MoeShape>,
    /// The overlapped matmuls' parameters (`None` for the others).
    pub(super) matmul: Option<MatmulShape>,
    /// The MoE layer's bytes on the link and DeepEP's count (`None` for
    /// the others).
    pub(super) layer: Option<LayerBytes>,
    /// Each PE's bytes to and from other nodes' PEs in one operation
    /// (`Context::net_traffic`, around the eager check run); `None` where
    /// not counted (NCCL, NVSHMEM's collectives, memcpy, the overlapped
    /// matmuls).
    pub(super) net_pes: Option<Vec<u64>>,
    /// Eager rows on the GPU backend: PE 0's host time to issue one
    /// operation (the median batch's). Well under `time_us`, the row is
    /// bound by the device; near it, by the host, or by the device once
    /// the launch queue is full (see the crate's doc).
    pub(super) issue_us: Option<f64>,
    /// With `--gated`: the device's time per operation with every launch
    /// queued ahead (see the crate's doc).
    pub(super) device_us: Option<f64>,
}

impl Row {
    /// Bytes over time; none for the overlapped matmuls, which are timed
    /// in operations (`tflops`).
    pub(super) fn algbw_gbps(&self) -> Option<f64> {
        self.dtype.filter(|_| self.matmul.is_none()).map(|_| self.bytes as f64 / (self.time_us * 1e3))
    }

    /// The most bytes any PE moved to and from other nodes in one operation.
    pub(super) fn net_bytes(&self) -> Option<u64> {
        self.net_pes.as_ref().and_then(|pes| pes.iter().copied().max())
    }

    pub(super) fn busbw_gbps(&self, n: usize) -> Option<f64> {
        self.algbw_gbps().map(|a| a * self.op.bus_factor(n))
    }

    /// `other` is of the same operation (for a layer op of ours: its 2D
    /// counterpart), element type, size and timing mode.
    pub(super) fn same_case(&self, other: &Row) -> bool {
        (self.op.counterpart(), self.dtype, self.bytes, self.graph, self.moe, self.matmul)
            == (other.op, other.dtype, other.bytes, other.graph, other.moe, other.matmul)
    }

    /// `reference`'s time over ours, for shmem's rows (the MoE layer's
    /// against the reference's row of the 2D counterpart).
    pub(super) fn vs(&self, rows: &[Row], reference: Imp) -> Option<f64> {
        if !self.imp.is_shmem() {
            return None;
        }
        let r = rows.iter().find(|r| r.imp == reference && self.same_case(r))?;
        Some(r.time_us / self.time_us)
    }

    /// For the MoE layer's rows: the 2D counterpart's default shmem row's
    /// time over ours (above 1: the layer is faster).
    pub(super) fn vs_2d(&self, rows: &[Row]) -> Option<f64> {
        self.layer?;
        self.vs(rows, Imp::Shmem)
    }

    /// The MoE layer's bytes on the link over the time.
    pub(super) fn link_gbps(&self) -> Option<f64> {
        self.layer.map(|l| l.link as f64 / (self.time_us * 1e3))
    }

    /// The MoE layer's DeepEP-counted bytes over the time.
    pub(super) fn logical_gbps(&self) -> Option<f64> {
        self.layer.map(|l| l.logical as f64 / (self.time_us * 1e3))
    }

    /// One JSON object; the ratios need every row (`None`: left out).
    pub(super) fn json(&self, n: usize, backend: &str, rows: Option<&[Row]>) -> String {
        let dtype = self.dtype.map_or("null".into(), |d| format!("\"{d}\""));
        let mut s = format!(
            "{{\"op\":\"{}\",\"impl\":\"{}\",\"backend\":\"{backend}\",\"dtype\":{dtype},\"bytes\":{},\"pes\":{n},\
             \"graph\":{},\"time_us\":{},\"algbw_gbps\":{},\"busbw_gbps\":{}",
            self.op.name(),
            self.imp.name(),
            self.bytes,
            self.graph,
            num(Some(self.time_us)),
            num(self.algbw_gbps()),
            num(self.busbw_gbps(n)),
        );
        if let Some(m) = self.moe {
            let _ = write!(
                s,
                ",\"tokens\":{},\"hidden\":{},\"experts_per_pe\":{},\"topk\":{},\"major_align\":{}",
                m.tokens, m.hidden, m.experts_per_pe, m.topk, m.major_align
            );
        }
        if let Some(l) = self.layer {
            let _ = write!(
                s,
                ",\"link_bytes\":{},\"link_gbps\":{},\"logical_bytes\":{},\"logical_gbps\":{}",
                l.link,
                num(self.link_gbps()),
                l.logical,
                num(self.logical_gbps())
            );
        }
        if let Some(m) = self.matmul {
            let chunks = m.chunks.map_or("null".into(), |c| c.to_string());
            let tflops = num(Some(m.flops() / (self.time_us * 1e6)));
            let _ = write!(s, ",\"m\":{},\"n\":{},\"k\":{},\"chunks\":{chunks},\"tflops\":{tflops}", m.m, m.n, m.k);
        }
        let net_pes = self
            .net_pes
            .as_ref()
            .map_or("null".into(), |pes| format!("[{}]", pes.iter().map(u64::to_string).collect::<Vec<_>>().join(",")));
        let net = self.net_bytes().map_or("null".into(), |b| b.to_string());
        let _ = write!(s, ",\"net_bytes\":{net},\"net_bytes_pes\":{net_pes},\"issue_us\":{}", num(self.issue_us));
        let _ = write!(s, ",\"device_us\":{}", num(self.device_us));
        if let Some(rows) = rows {
            for reference in REFERENCES {
                let _ = write!(s, ",\"vs_{}\":{}", reference.name(), num(self.vs(rows, reference)));
            }
            if self.layer.is_some() {
                let _ = write!(s, ",\"vs_2d\":{}", num(self.vs_2d(rows)));
            }
            if self.matmul.is_some() {
                let _ = write!(s, ",\"vs_sequential\":{}", num(overlap::vs_sequential(self, rows)));
            }
        }
        s.push('}');
        s
    }
}

/// One line on stderr in one write, so that the PEs' lines do not mix.
pub(super) fn note(msg: impl std::fmt::Display) {
    let _ = std::io::stderr().write_all(format!("shmem-bench: {msg}\n").as_bytes());
}

/// A JSON number, or null where there is none (or it is not finite).
pub(super) fn num(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.4}"),
        _ => "null".into(),
    }
}

pub(super) fn cell(x: Option<f64>, width: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:>width$.2}"),
        _ => format!("{:>width$}", "-"),
    }
}

/// 64K, 1M, 3G; plain bytes where that is not exact.
pub(super) fn human(bytes: usize) -> String {
    for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// One table per operation, element type and timing mode.
pub(super) fn print_table(rows: &[Row], n: usize, backend: &str, args: &Args) {
    let iters = args.iters.map_or("auto (10..=1000)".into(), |i| i.to_string());
    println!("# shmem-bench: {n} PEs, {backend} backend; time: µs on PE 0, median");
    println!("# eager: {iters} iterations per batch after {} warm-up; graph: replays of {PER_GRAPH}", args.warmup);
    if args.tuning() != shmem::Tuning::default() {
        println!("# shmem rows tuned: {:?}", args.tuning());
    }
    println!("# bytes per PE: all_gather's output, reduce_scatter's input, else the buffer; busbw as nccl-tests");
    if rows.iter().any(|r| r.moe.is_some()) {
        println!("# MoE ops: bytes sent per PE (tokens × topk × hidden × element), busbw = algbw × (n-1)/n");
    }
    if rows.iter().any(|r| r.layer.is_some()) {
        println!("# MoE layer: link/PE = PE 0's wire bytes to other PEs; logical = DeepEP's count (distinct tokens");
        println!("#   PE 0 receives × hidden × element) over the time; vs_2d: the 2D op's shmem time / the layer's");
        if rows.iter().any(|r| r.layer.is_some() && r.dtype == Some(crate::layer_fp8::E4M3)) {
            println!(
                "#   e4m3: the FP8 dispatch of the bf16 tokens; link/PE its FP8 wire rows, logical its bf16 tokens"
            );
        }
    }
    if rows.iter().any(|r| r.matmul.is_some()) {
        println!("# overlapped matmuls: bytes = one PE's block (ag_matmul: its shard; matmul_rs: its output)");
    }
    println!("# vs X: X's time / shmem's time (above 1: shmem is faster)");
    println!("# net/PE: the most bytes a PE moved to or from other nodes' PEs in one operation (- : not counted)");
    if rows.is_empty() {
        println!("# no rows: nothing selected runs on this backend");
    }
    let mut sections: Vec<(Op, Option<&str>, bool)> = Vec::new();
    for r in rows.iter().filter(|r| r.matmul.is_none()) {
        if !sections.contains(&(r.op, r.dtype, r.graph)) {
            sections.push((r.op, r.dtype, r.graph));
        }
    }
    sections.sort_by_key(|&(op, _, graph)| (op, graph));
    for (op, dtype, graph) in sections {
        let mut section: Vec<&Row> = rows.iter().filter(|r| (r.op, r.dtype, r.graph) == (op, dtype, graph)).collect();
        section.sort_by_key(|r| (r.bytes, r.imp));
        // The layer's references are its 2D counterpart's rows.
        let layer = section.iter().any(|r| r.layer.is_some());
        let refs: Vec<Imp> = match layer {
            true => REFERENCES.into_iter().filter(|&i| section.iter().any(|r| r.vs(rows, i).is_some())).collect(),
            false => REFERENCES.into_iter().filter(|&i| section.iter().any(|r| r.imp == i)).collect(),
        };
        let mode = if graph { "graph" } else { "eager" };
        let moe = section.first().and_then(|r| r.moe);
        let shape = moe.map_or(String::new(), |m| {
            let (h, e, k, a) = (m.hidden, m.experts_per_pe, m.topk, m.major_align);
            format!(" (hidden {h}, {e} experts per PE, top-{k}, major_align {a})")
        });
        println!("\n## {} {}{mode}{shape}", op.name(), dtype.map_or(String::new(), |d| format!("{d} ")));
        let tokens = |t: &dyn std::fmt::Display| moe.map_or(String::new(), |_| format!("{t:>8}"));
        let mut head = format!(
            "{:<15}{}{:>7}{:>12}{:>12}{:>12}{:>9}",
            "impl",
            tokens(&"tokens"),
            "size",
            "time_us",
            "algbw_GBps",
            "busbw_GBps",
            "net/PE"
        );
        if layer {
            let _ = write!(head, "{:>10}{:>14}{:>8}", "link/PE", "logical_GBps", "vs_2d");
        }
        for i in &refs {
            let _ = write!(head, "{:>12}", format!("vs_{}", i.name()));
        }
        println!("{head}");
        for r in section {
            let mut line = format!(
                "{:<15}{}{:>7}{:>12.2}{}{}{:>9}",
                r.imp.name(),
                tokens(&r.moe.map_or(0, |m| m.tokens)),
                human(r.bytes),
                r.time_us,
                cell(r.algbw_gbps(), 12),
                cell(r.busbw_gbps(n), 12),
                r.net_bytes().map_or("-".into(), |b| human(b as usize))
            );
            if layer {
                let link = r.layer.map_or("-".into(), |l| human(l.link));
                let _ = write!(line, "{link:>10}{}{}", cell(r.logical_gbps(), 14), cell(r.vs_2d(rows), 8));
            }
            for &i in &refs {
                line += &cell(r.vs(rows, i), 12);
            }
            println!("{line}");
        }
    }
    overlap::print_tables(rows, n);
}
