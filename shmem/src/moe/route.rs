//! The host-routed path of [`MoeAllToAll`]'s dispatch, on either
//! backend: the routing checked and ordered into wire rows, the rows
//! filled, and the received rows expanded into the view.

use super::layer::*;
use crate::buffer::{SymSlice, SymmetricBuffer};
use crate::context::Stream;
use crate::dtype::Element;
use crate::error::{Error, Result, RoutingFault};
use crate::fp8::fp8_e4m3;
use crate::quant;
use half::bf16;
use rayon::prelude::*;

impl<T: Element> MoeAllToAll<T> {
    /// Checks the routing and orders the wire rows: by destination PE,
    /// each destination's in token order.
    ///
    /// A destination holds `group` experts: one PE's (`experts_per_pe`),
    /// or in the node-aware form one node's.
    pub(super) fn route(
        &self,
        tokens: &HostTokens<'_, T>,
        ids: &[i64],
        weights: &[f32],
        group: usize,
    ) -> Result<Route> {
        let c = &self.config;
        let n = self.team.n_pes();
        let experts = n * c.experts_per_pe;
        let len = tokens.len();
        let n_tokens = len / c.hidden;
        if len % c.hidden != 0 {
            return Err(Error::LengthMismatch(format!(
                "MoeAllToAll::dispatch: {len} token elements are not whole rows of hidden ({})",
                c.hidden
            )));
        }
        if n_tokens > c.max_tokens {
            return Err(Error::BadRouting {
                fault: RoutingFault::TooManyTokens,
                detail: format!("MoeAllToAll::dispatch: {n_tokens} tokens, more than max_tokens ({})", c.max_tokens),
            });
        }
        if let HostTokens::Codes(_, scales) = tokens {
            let want = n_tokens * c.scales_per_token();
            if scales.len() != want {
                return Err(Error::LengthMismatch(format!(
                    "MoeAllToAll::dispatch_fp8: {} scales for {n_tokens} pre-quantized tokens, expected {want} \
                     (one per {} elements of each token)",
                    scales.len(),
                    quant::GROUP
                )));
            }
        }
        for (what, len) in [("expert ids", ids.len()), ("weights", weights.len())] {
            if len != n_tokens * c.top_k {
                return Err(Error::LengthMismatch(format!(
                    "MoeAllToAll::dispatch: {len} {what} for {n_tokens} tokens, expected {n_tokens} × top_k ({})",
                    c.top_k
                )));
            }
        }
        let k = c.top_k;
        for (slot, (&id, &w)) in ids.iter().zip(weights).enumerate() {
            let (t, j) = (slot / k, slot % k);
            if usize::try_from(id).ok().filter(|&g| g < experts).is_none() {
                return Err(Error::BadRouting {
                    fault: RoutingFault::ExpertOutOfRange,
                    detail: format!(
                        "MoeAllToAll::dispatch: token {t} slot {j} routes to expert {id}, but experts are \
                         0..{experts} ({n} PEs × {} experts per PE)",
                        c.experts_per_pe
                    ),
                });
            }
            if let Some(i) = ids[t * k..slot].iter().position(|&x| x == id) {
                return Err(Error::BadRouting {
                    fault: RoutingFault::RepeatedExpert,
                    detail: format!(
                        "MoeAllToAll::dispatch: token {t} routes to expert {id} in slots {i} and {j}: a token's \
                         top-k experts must differ"
                    ),
                });
            }
            if !w.is_finite() {
                return Err(Error::BadRouting {
                    fault: RoutingFault::NonFiniteWeight,
                    detail: format!("MoeAllToAll::dispatch: token {t} slot {j} has weight {w}: weights must be finite"),
                });
            }
        }
        // Each token's destinations of `width` experts, ascending.
        let dests = |t: usize, width: usize| {
            let mut d: Vec<usize> = ids[t * k..(t + 1) * k].iter().map(|&g| g as usize / width).collect();
            d.sort_unstable();
            d.dedup();
            d
        };
        let (mut sent, mut wire) = (vec![0i64; n], vec![0i64; experts.div_ceil(group)]);
        for t in 0..n_tokens {
            dests(t, c.experts_per_pe).into_iter().for_each(|d| sent[d] += 1);
            dests(t, group).into_iter().for_each(|d| wire[d] += 1);
        }
        let mut next: Vec<usize> = wire
            .iter()
            .scan(0usize, |at, &x| {
                let start = *at;
                *at += x as usize;
                Some(start)
            })
            .collect();
        let total = wire.iter().sum::<i64>() as usize;
        let mut rows = vec![(0, 0); total];
        let (mut token_start, mut token_rows) = (Vec::with_capacity(n_tokens + 1), Vec::with_capacity(total));
        for t in 0..n_tokens {
            token_start.push(token_rows.len());
            for d in dests(t, group) {
                rows[next[d]] = (t, d);
                token_rows.push(next[d]);
                next[d] += 1;
            }
        }
        token_start.push(token_rows.len());
        Ok(Route { sent, wire, rows, token_start, token_rows })
    }

    /// Writes the wire rows in send order into `out`, and the splits: each
    /// slot names its expert among the destination's `group` (or -1), and
    /// in the node-aware form (`origin`) the token field carries this PE.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fill_send(
        &self,
        tokens: &HostTokens<'_, T>,
        ids: &[i64],
        weights: &[f32],
        r: &Route,
        (group, origin): (usize, Option<usize>),
        (out, splits): (&SymmetricBuffer<u8>, SymSlice<'_, i64>),
        stream: &Stream,
    ) -> Result<()> {
        let (c, w) = (&self.config, self.wire);
        let (h, k, ne, g) = (c.hidden, c.top_k, group, c.scales_per_token());
        let field = |t: usize| origin.map_or(t, |pe| pe << ORIGIN_SHIFT | t);
        let mut bytes = vec![0u8; r.rows.len() * w.stride];
        let fill = |(i, row): (usize, &mut [u8])| {
            let (t, d) = r.rows[i];
            let scales = w.scales..w.scales + g * size_of::<f32>();
            match *tokens {
                HostTokens::Plain(x) if w.fp8 => {
                    let (q, sc) = quant::quantize_vec(same_type::<T, bf16>(&x[t * h..(t + 1) * h]));
                    row[..h].copy_from_slice(bytes_of(&q));
                    row[scales].copy_from_slice(bytes_of(&sc));
                }
                HostTokens::Plain(x) => row[..w.data].copy_from_slice(bytes_of(&x[t * h..(t + 1) * h])),
                HostTokens::Codes(q, sc) => {
                    row[..h].copy_from_slice(bytes_of(&q[t * h..(t + 1) * h]));
                    row[scales].copy_from_slice(bytes_of(&sc[t * g..(t + 1) * g]));
                }
            }
            let slots = (0..k).map(|j| {
                let g = ids[t * k + j] as usize;
                (if g / ne == d { (g % ne) as i32 } else { -1 }, weights[t * k + j])
            });
            w.set_meta(row, field(t), slots);
        };
        if bytes.len() < PARALLEL_BYTES {
            bytes.chunks_mut(w.stride).enumerate().for_each(fill);
        } else {
            self.team.ctx.pool.install(|| bytes.par_chunks_mut(w.stride).enumerate().for_each(fill));
        }
        out.slice(0..bytes.len()).copy_from_host(&bytes, stream)?;
        splits.copy_from_host(&r.wire, stream)
    }

    /// After the exchange: places every staged row in the blocks of its
    /// local experts, writes the view's splits and offsets, and returns
    /// the layout. In the node-aware form (`forward`) the rows were staged
    /// by the node's forwarding PEs, each row naming its source PE.
    pub(super) fn expand(
        &self,
        route: Route,
        forward: Option<Forward>,
        n_tokens: usize,
        dequantize: bool,
        stream: &Stream,
    ) -> Result<Layout> {
        let (c, w, n) = (&self.config, self.wire, self.team.n_pes());
        let (h, k, ne, g) = (c.hidden, c.top_k, c.experts_per_pe, c.scales_per_token());
        let members = self.rails.as_ref().map_or(n, |r| r.per_node);
        let received = self.stage_so.slice(0..members).read(stream)?;
        let total = received.iter().sum::<i64>() as usize;
        let staged = self.stage.slice(0..total * w.stride).read(stream)?;
        let staged: Vec<&[u8]> = staged.chunks(w.stride).collect();
        // Each staged row's (source, token), then the rows in that order:
        // staging is source-major in the flat form, by forwarder (each
        // forwarder's by source) in the node-aware one.
        let origins: Vec<(usize, usize)> = if forward.is_some() {
            staged.iter().map(|row| w.origin(row)).collect()
        } else {
            let sources = received.iter().enumerate().flat_map(|(s, &r)| std::iter::repeat_n(s, r as usize));
            sources.zip(&staged).map(|(s, row)| (s, w.token(row))).collect()
        };
        let mut staged_at: Vec<usize> = (0..total).collect();
        staged_at.sort_by_key(|&i| origins[i]);
        let arrivals: Vec<(usize, usize)> = staged_at.iter().map(|&i| origins[i]).collect();
        let staged: Vec<&[u8]> = staged_at.iter().map(|&i| staged[i]).collect();
        // Rows per (expert, source), then the blocks' offsets with padding.
        let mut splits = vec![0i64; ne * n];
        for (row, &(s, _)) in staged.iter().zip(&arrivals) {
            for j in 0..k {
                let (e, _) = w.slot(row, j);
                if e >= 0 {
                    splits[e as usize * n + s] += 1;
                }
            }
        }
        let mut offsets = vec![0i64; ne * n];
        let mut at = 0usize;
        for e in 0..ne {
            let start = at;
            for s in 0..n {
                offsets[e * n + s] = at as i64;
                at += splits[e * n + s] as usize;
            }
            at = start + (at - start).div_ceil(c.major_align).max(1) * c.major_align;
        }
        let rows = at;
        // The rows by source and token: each block's rows come in that order.
        let mut next = offsets.clone();
        let mut placements = vec![None; total * k];
        // The view: the elements, or in the FP8 format the codes and scales.
        let (view_len, codes_len, scales_len) = if w.fp8 { (0, rows * h, rows * g) } else { (rows * h, 0, 0) };
        let mut view = crate::dtype::zeroed_vec::<T>(view_len);
        let mut codes = vec![fp8_e4m3::default(); codes_len];
        let mut scales = vec![0f32; scales_len];
        for (i, (row, &(s, _))) in staged.iter().zip(&arrivals).enumerate() {
            for j in 0..k {
                let (e, weight) = w.slot(row, j);
                if e >= 0 {
                    let at = &mut next[e as usize * n + s];
                    let r = *at as usize;
                    if w.fp8 {
                        read_elems(row, &mut codes[r * h..(r + 1) * h]);
                        read_elems(&row[w.scales..], &mut scales[r * g..(r + 1) * g]);
                    } else {
                        read_elems(row, &mut view[r * h..(r + 1) * h]);
                    }
                    placements[i * k + j] = Some((*at as usize, weight));
                    *at += 1;
                }
            }
        }
        let layout = Layout {
            n_pes: n,
            config: *c,
            n_tokens,
            splits,
            offsets,
            rows,
            sent: route.sent,
            token_start: route.token_start,
            token_rows: route.token_rows,
            received,
            arrivals,
            staged_at,
            wire_sent: route.wire,
            forward,
            placements,
        };
        // The blocks' rows, not the padding (which is never written).
        for e in 0..ne {
            let r = layout.expert_rows(e);
            if let Some(f) = &self.fp8 {
                f.codes.slice(r.start * h..r.end * h).copy_from_host(&codes[r.start * h..r.end * h], stream)?;
                f.scales.slice(r.start * g..r.end * g).copy_from_host(&scales[r.start * g..r.end * g], stream)?;
                if dequantize {
                    let mut x = vec![bf16::ZERO; r.len() * h];
                    for (i, out) in r.clone().zip(x.chunks_mut(h)) {
                        quant::dequantize(&codes[i * h..(i + 1) * h], &scales[i * g..(i + 1) * g], out)?;
                    }
                    self.recv.slice(r.start * h..r.end * h).copy_from_host(same_type::<bf16, T>(&x), stream)?;
                }
            } else {
                self.recv.slice(r.start * h..r.end * h).copy_from_host(&view[r.start * h..r.end * h], stream)?;
            }
        }
        self.dispatch_splits.copy_from_host(&[&layout.splits[..], &layout.offsets[..]].concat(), stream)?;
        self.mark_arrivals(stream)?;
        Ok(layout)
    }
}
