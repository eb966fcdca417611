//! Teams: splitting, translation, and collectives over a team.

use crate::util::{payloads, Env, TestResult};
use crate::TestFn;
use shmem::ReduceOp;

pub const TESTS: &[(&str, TestFn)] = &[
    ("teams::split_even_odd_and_translate", split_even_odd_and_translate),
    ("teams::collectives_on_a_team", collectives_on_a_team),
    ("teams::nested_split", nested_split),
    ("teams::slots_are_reused", slots_are_reused),
];

fn split_even_odd_and_translate(env: &Env) -> TestResult {
    let (me, n) = (env.me(), env.n());
    let world = env.ctx.world();
    let even = world.split_strided(0, 2, n.div_ceil(2))?;
    let odd = if n >= 2 { world.split_strided(1, 2, n / 2)? } else { None };
    assert_eq!(even.is_some(), me % 2 == 0);
    assert_eq!(odd.is_some(), me % 2 == 1);
    let team = even.as_ref().or(odd.as_ref()).unwrap();
    assert_eq!(team.my_pe(), me / 2);
    assert_eq!(team.n_pes(), if me % 2 == 0 { n.div_ceil(2) } else { n / 2 });
    for i in 0..team.n_pes() {
        let w = team.world_pe(i)?;
        assert_eq!(w, me % 2 + 2 * i);
        assert_eq!(team.translate_pe(i, &world)?, Some(w));
        assert_eq!(world.translate_pe(w, team)?, Some(i));
    }
    assert!(team.world_pe(team.n_pes()).is_err());
    if n >= 2 {
        // A PE of the other parity is not in my team.
        let other = if me % 2 == 1 || me + 1 == n { me - 1 } else { me + 1 };
        assert_eq!(world.translate_pe(other, team)?, None);
    }
    Ok(())
}

fn collectives_on_a_team(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let world = env.ctx.world();
    let even = world.split_strided(0, 2, n.div_ceil(2))?;
    let odd = if n >= 2 { world.split_strided(1, 2, n / 2)? } else { None };
    let team = even.as_ref().or(odd.as_ref()).unwrap();
    let tn = team.n_pes();
    let seed = env.fresh_seed();
    let len = 513;
    // Buffers are allocated over the world (collective); teams use them.
    let src = env.ctx.alloc::<u64>(len)?;
    let dst = env.ctx.alloc::<u64>(len * n)?; // the same size on every PE
    src.copy_from_host(&payloads::<u64>(seed, me, len), s)?;
    // all_gather over the team collects the team's world PEs, in team order.
    team.all_gather(dst.slice(..len * tn), &src, s)?;
    let want: Vec<u64> = (0..tn).flat_map(|i| payloads::<u64>(seed, team.world_pe(i).unwrap(), len)).collect();
    assert_eq!(dst.slice(..len * tn).copy_to_host(s)?, want);
    // all_reduce of the world PE numbers over the team.
    let x = env.ctx.alloc::<i64>(3)?;
    x.copy_from_host(&[me as i64, 1, -(me as i64)], s)?;
    team.all_reduce(&x, &x, ReduceOp::Sum, s)?;
    let sum: i64 = (0..tn).map(|i| team.world_pe(i).unwrap() as i64).sum();
    assert_eq!(x.copy_to_host(s)?, vec![sum, tn as i64, -sum]);
    // broadcast from the team's last PE.
    let root = tn - 1;
    team.broadcast(dst.slice(..len), &src, root, s)?;
    assert_eq!(dst.slice(..len).copy_to_host(s)?, payloads::<u64>(seed, team.world_pe(root)?, len));
    team.barrier(s)?;
    team.sync(s)?;
    env.ctx.barrier_all(s)?;
    Ok(())
}

fn nested_split(env: &Env) -> TestResult {
    let (me, n, s) = (env.me(), env.n(), &env.s);
    let world = env.ctx.world();
    // The last ⌈n/2⌉ PEs, then the last one of those.
    let back = world.split_strided(n / 2, 1, n - n / 2)?;
    assert_eq!(back.is_some(), me >= n / 2);
    if let Some(back) = &back {
        let last = back.split_strided(back.n_pes() - 1, 1, 1)?;
        assert_eq!(last.is_some(), me == n - 1);
        if let Some(last) = &last {
            assert_eq!(last.translate_pe(0, back)?, Some(back.n_pes() - 1));
            assert_eq!(last.translate_pe(0, &world)?, Some(n - 1));
            last.barrier(s)?;
        }
        let v = env.ctx.alloc::<u32>(1)?;
        v.copy_from_host(&[1], s)?;
        back.all_reduce(&v, &v, ReduceOp::Sum, s)?;
        assert_eq!(v.copy_to_host(s)?, vec![back.n_pes() as u32]);
    } else {
        // Allocation is over the world: the other PEs allocate too.
        let _v = env.ctx.alloc::<u32>(1)?;
    }
    world.barrier(s)?;
    Ok(())
}

fn slots_are_reused(env: &Env) -> TestResult {
    // More teams than there are slots, made and dropped one after another.
    let n = env.n();
    for i in 0..100 {
        let t = env.ctx.team_split_strided(i % n, 1, 1)?;
        if let Some(t) = t {
            assert_eq!(t.world_pe(0)?, i % n);
            t.barrier(&env.s)?;
        }
    }
    Ok(())
}
