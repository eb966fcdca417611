//! Each team's view for the kernels ([`TeamSync`]): its members' heap
//! bases and PE numbers on the device, and its synchronisation slot.

use super::abi::{TeamSync, AGREE_WORDS, MAX_TEAM};
use super::kernels::Kernels;
use super::{CudaCall, GpuWorld};
use crate::error::{Error, Result};
use cudarc::driver::CudaSlice;

/// A team's view: the device arrays its [`TeamSync`] points at, kept
/// alive with it.
pub(super) struct View {
    members: Vec<usize>,
    _heap: CudaSlice<u64>,
    _pes: CudaSlice<i32>,
    sync: TeamSync,
}

impl Kernels {
    /// Makes the views of a new team on `slot` (both RMA settings) after
    /// zeroing this PE's synchronisation state of the slot. The caller
    /// makes sure every member has done so before any uses the team.
    pub(crate) fn add_team(&self, g: &GpuWorld, slot: usize, members: &[usize], me: usize) -> Result<()> {
        // A dropped team's kernels may still run on a user's stream and
        // write the slot's epoch counters when they end: let them finish.
        g.cuda.synchronize().cuda("cuCtxSynchronize")?;
        g.zero(g.addr(self.layout.slot(slot)), self.layout.slot_bytes(), g.own_stream())?;
        g.own_stream().synchronize().cuda("cuStreamSynchronize")?;
        for force in [false, true] {
            self.add_view(g, slot, members, me, force)?;
        }
        Ok(())
    }

    /// Forgets the views of a team slot.
    pub(crate) fn drop_team(&self, slot: usize) {
        let mut views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        views.remove(&(slot, false));
        views.remove(&(slot, true));
    }

    /// Makes the view of the team on `slot` with `members`, reaching every
    /// peer through RMA when `force`.
    pub(super) fn add_view(&self, g: &GpuWorld, slot: usize, members: &[usize], me: usize, force: bool) -> Result<()> {
        let rank = members.iter().position(|&m| m == me).expect("a member");
        let bases: Vec<u64> = members
            .iter()
            .map(|&pe| match g.peer_base[pe] {
                Some(b) if pe == me || !force => b,
                _ => 0,
            })
            .collect();
        let pes: Vec<i32> = members.iter().map(|&pe| pe as i32).collect();
        let remote = members
            .iter()
            .take(MAX_TEAM)
            .enumerate()
            .filter(|&(_, &pe)| g.node_of[pe] != g.node_of[me])
            .fold(0u64, |mask, (r, _)| mask | 1 << r);
        let s = g.own_stream();
        let heap = s.clone_htod(&bases).cuda("CudaStream::clone_htod")?;
        let pes_dev = s.clone_htod(&pes).cuda("CudaStream::clone_htod")?;
        s.synchronize().cuda("cuStreamSynchronize")?;
        let (hp, _a) = cudarc::driver::DevicePtr::device_ptr(&heap, s);
        let (pp, _b) = cudarc::driver::DevicePtr::device_ptr(&pes_dev, s);
        let sync = TeamSync {
            peer_heap: hp,
            pes: pp,
            heap: g.heap_base,
            sync_offset: self.layout.slot(slot) as u64,
            ll_offset: self.layout.ll() as u64,
            temp_offset: self.layout.temp() as u64,
            rank: rank as i32,
            n: members.len() as i32,
            rma: bases.contains(&0) as i32,
            _pad: 0,
            agree: 0,
            report: self.agree_error.device,
            row: [0; AGREE_WORDS],
            remote,
            net_offset: self.layout.net() as u64,
        };
        drop((_a, _b));
        let view = View { members: members.to_vec(), _heap: heap, _pes: pes_dev, sync };
        self.views.lock().unwrap_or_else(|e| e.into_inner()).insert((slot, force), view);
        Ok(())
    }

    /// The kernels' view of the team on `slot` with these members.
    pub(crate) fn team(&self, slot: usize, members: &[usize], force_rma: bool) -> Result<TeamSync> {
        let views = self.views.lock().unwrap_or_else(|e| e.into_inner());
        match views.get(&(slot, force_rma)) {
            Some(v) if v.members == members => Ok(v.sync),
            _ => Err(Error::Invalid(format!("team slot {slot} has no kernel state for members {members:?}"))),
        }
    }
}
