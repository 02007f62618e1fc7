//! The sweep: for every operation, operator, algorithm and size, the check, then the timed
//! iterations (out of place, in place, and MPI's own operation), each row's time the slowest
//! rank's.

use std::time::{Duration, Instant};

use duralumin::Collectives;
use duralumin::mpi::collective::SystemOperation;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::*;

use crate::Boxed;
use crate::args::Args;
use crate::call::{Algorithm, Bufs, Layout, call};
use crate::ops::{Coll, Redop};
use crate::spec::{Buffers, PerfElem, Shape, in_place, out_of_place, wrong};
use crate::table::{Row, Timing};
use crate::targets::Target;

/// The largest of each rank's values.
fn max_over(world: &SimpleCommunicator, v: [f64; 2]) -> [f64; 2] {
    let mut out = [0.0; 2];
    world.all_reduce_into(&v[..], &mut out[..], SystemOperation::max());
    out
}

fn sum_over(world: &SimpleCommunicator, v: u64) -> u64 {
    let mut out = 0u64;
    world.all_reduce_into(&v, &mut out, SystemOperation::sum());
    out
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Moves `b` onto the target (two buffers each way for the multi-send-receive).
fn upload<X: Target, T: PerfElem>(x: &X, s: &Shape, b: &Buffers<T>) -> duralumin::Result<Bufs<X, T>> {
    let parts = if s.coll == Coll::MultiSendrecv { 2 } else { 1 };
    let halves = |v: &[T]| -> duralumin::Result<Vec<X::Owned<T>>> {
        if parts == 1 {
            return Ok(vec![x.up(v)?]);
        }
        v.chunks(s.count.max(1)).map(|h| x.up(h)).collect()
    };
    Ok(Bufs { send: halves(&b.send)?, recv: halves(&b.recv)? })
}

fn download<X: Target, T: PerfElem>(x: &X, bufs: &Bufs<X, T>) -> duralumin::Result<Vec<T>> {
    let mut out = Vec::new();
    for r in &bufs.recv {
        out.extend(x.down(r)?);
    }
    Ok(out)
}

/// Times `f`: `warmup` untimed calls, then `iters` timed ones after a barrier, `f(k)` making
/// `k` calls at once (at most `window`), calling `sync` (a stream-ordered communicator's
/// `synchronize`) after each round when `blocking` and once at the end. The time per call and
/// the host time of one call, µs, the slowest rank's.
fn time(
    world: &SimpleCommunicator,
    a: &Args,
    (blocking, window): (bool, usize),
    sync: &dyn Fn() -> duralumin::Result<()>,
    mut f: impl FnMut(usize) -> duralumin::Result<()>,
) -> duralumin::Result<(f64, f64)> {
    let rounds = |n: usize| (0..n).step_by(window.max(1)).map(move |i| window.max(1).min(n - i));
    for k in rounds(a.warmup) {
        f(k)?;
    }
    sync()?;
    world.barrier();
    let (start, mut calls) = (Instant::now(), Duration::ZERO);
    for k in rounds(a.iters) {
        let t = Instant::now();
        f(k)?;
        calls += t.elapsed();
        if blocking {
            sync()?;
        }
    }
    sync()?;
    let n = a.iters as f64;
    let [time, call] = max_over(world, [us(start.elapsed()) / n, us(calls) / n]);
    Ok((time, call))
}

/// How many calls of `s` run at once as non-blocking ones (`-z 0` on the Mpi backend): up to
/// [`WINDOW`], each on its own buffers, within [`WINDOW_BYTES`] of them; 1 where calls
/// complete one by one or queue on a stream.
fn window<T>(x_queues: bool, a: &Args, s: &Shape) -> usize {
    if x_queues || a.blocking_on(false) {
        return 1;
    }
    let set = 2 * s.count.max(1) * size_of::<T>();
    (WINDOW_BYTES / set).clamp(1, WINDOW).min(a.iters.max(a.warmup).max(1))
}

/// The most non-blocking calls started at once.
pub const WINDOW: usize = 8;
/// The most bytes of buffers the non-blocking calls started at once use, per rank (and as
/// much again for MPI's own, with `--native`).
const WINDOW_BYTES: usize = 256 << 20;

/// Whether the check is to see a wrong element on rank 0 (`DURALUMIN_PERF_CORRUPT=1`: how the
/// tests show that a wrong result is counted and fails the run).
fn corrupting() -> bool {
    std::env::var("DURALUMIN_PERF_CORRUPT").is_ok_and(|v| v == "1")
}

/// One form (out of place or in place) of one row: its check and its timing.
fn measure<X: Target, T: PerfElem>(
    x: &X,
    world: &SimpleCommunicator,
    a: &Args,
    s: &Shape,
    algo: Algorithm,
    init: &Buffers<T>,
    placed: bool,
) -> duralumin::Result<Timing> {
    let lay = Layout::of(s);
    let window = window::<T>(x.stream_ordered(), a, s);
    let mut sets = (0..window).map(|_| upload(x, s, init)).collect::<duralumin::Result<Vec<_>>>()?;
    // `k` calls: one by one, or started together as non-blocking ones.
    let calls = |sets: &mut [Bufs<X, T>], k: usize| match window {
        1 => call(x, s, &lay, algo, &mut sets[0], placed),
        _ => x
            .call_all(s, &lay, algo, &mut sets[..k], placed)
            .unwrap_or(Err(duralumin::Error::Unsupported("non-blocking calls on this backend"))),
    };
    let wrong = if a.check {
        calls(&mut sets, 1)?;
        x.comm().synchronize()?;
        let mut got = download(x, &sets[0])?;
        if let Some(v) = got.first_mut().filter(|_| s.rank == 0 && corrupting()) {
            *v = T::add(*v, T::from_truth(true));
        }
        Some(sum_over(world, wrong(&got, &init.expect)))
    } else {
        None
    };
    let blocking = a.blocking_on(x.stream_ordered());
    let (t, enqueue) = time(world, a, (blocking, window), &|| x.comm().synchronize(), |k| calls(&mut sets, k))?;
    let mut timing = Timing::new(s.count * size_of::<T>(), t, s.coll.busbw_factor(s.n));
    timing.wrong = wrong;
    timing.enqueue = x.stream_ordered().then_some(enqueue);
    Ok(timing)
}

/// MPI's own operation of `s` on host vectors: beside the Mpi backend's rows timed as they
/// are (its blocking calls, or with `-z 0` its non-blocking ones started together), beside a
/// stream-ordered backend's (`queues`) as blocking calls.
fn native<T: PerfElem>(
    world: &SimpleCommunicator,
    a: &Args,
    s: &Shape,
    (b, queues): (&Buffers<T>, bool),
) -> duralumin::Result<Option<Timing>> {
    let window = window::<T>(queues, a, s);
    let Some(mut n) = T::native(s, b, window) else { return Ok(None) };
    let (t, _) = time(world, a, (true, window), &|| Ok(()), |k| {
        match window {
            1 => n.call(world, s),
            _ => n.call_all(world, s, k),
        }
        Ok(())
    })?;
    Ok(Some(Timing::new(s.count * size_of::<T>(), t, s.coll.busbw_factor(s.n))))
}

/// The algorithms of `a` that apply to `coll` (an operation that takes none runs `auto`).
fn algorithms(a: &Args, coll: Coll) -> Result<Vec<Algorithm>, Boxed> {
    if a.algorithms.iter().any(|x| x == "all") {
        return Ok(Algorithm::all_for(coll));
    }
    if Algorithm::all_for(coll).len() == 1 {
        return Ok(vec![Algorithm::Auto]);
    }
    let named: Vec<_> = a.algorithms.iter().filter_map(|n| Algorithm::parse(coll, n)).collect();
    if named.is_empty() {
        // `-o all --algorithm ring`: the operations the names do not apply to run `auto`; a
        // name no operation has is a typo.
        let known = a.algorithms.iter().all(|n| Coll::ALL.iter().any(|&c| Algorithm::parse(c, n).is_some()));
        if !known {
            return Err(format!("--algorithm: {:?} names no algorithm (see --help)", a.algorithms).into());
        }
        return Ok(vec![Algorithm::Auto]);
    }
    Ok(named)
}

/// Every row of `a` on `x` with elements of `T`, each handed to `out` as it is measured.
/// Combinations the backend refuses as a whole (an algorithm it does not run on this
/// topology) are reported through `skip` and left out.
pub fn sweep<X: Target, T: PerfElem>(
    x: &X,
    world: &SimpleCommunicator,
    a: &Args,
    out: &mut dyn FnMut(Row),
    skip: &mut dyn FnMut(String),
) -> Result<(), Boxed> {
    let (n, rank) = (x.comm().size(), x.comm().rank());
    for &coll in &a.colls {
        let redops = if coll.reduces() { a.redops.clone() } else { vec![Redop::Sum] };
        if coll.rooted() && a.root >= n {
            return Err(format!("-r {}: the root must be below the rank count {n}", a.root).into());
        }
        for algo in algorithms(a, coll)? {
            for &redop in &redops {
                if let Err(e) = rows::<X, T>(x, world, a, coll, redop, algo, (n, rank), out) {
                    match e {
                        duralumin::Error::AlgorithmUnsupported { .. } | duralumin::Error::Unsupported(_) => {
                            skip(format!(
                                "{coll} {} {}: {e}",
                                algo.name(),
                                if coll.reduces() { redop.name() } else { "" }
                            ));
                        }
                        e => return Err(format!("{coll} ({}, {}): {e}", algo.name(), T::TYPE).into()),
                    }
                }
            }
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn rows<X: Target, T: PerfElem>(
    x: &X,
    world: &SimpleCommunicator,
    a: &Args,
    coll: Coll,
    redop: Redop,
    algo: Algorithm,
    (n, rank): (usize, usize),
    out: &mut dyn FnMut(Row),
) -> duralumin::Result<()> {
    let sizes = if coll == Coll::Barrier { vec![0] } else { a.sizes() };
    for bytes in sizes {
        let Some(count) = coll.count(bytes, size_of::<T>(), n) else { continue };
        let s = Shape { coll, redop, n, rank, count, root: if coll.rooted() { a.root } else { 0 } };
        let init = out_of_place::<T>(&s);
        let oop = measure(x, world, a, &s, algo, &init, false)?;
        let ip = match in_place(&s, &init) {
            Some(placed) if coll.has_in_place() => Some(measure(x, world, a, &s, algo, &placed, true)?),
            _ => None,
        };
        out(Row {
            op: coll.name().into(),
            backend: X::BACKEND.into(),
            device: x.device().into(),
            algorithm: algo.name().into(),
            np: n,
            size: count * size_of::<T>(),
            count,
            elem: T::TYPE.into(),
            redop: if coll.reduces() { redop.name().into() } else { "none".into() },
            root: if coll.rooted() { i64::try_from(a.root).unwrap_or(-1) } else { -1 },
            out_of_place: oop,
            in_place: ip,
            native: if a.native { native(world, a, &s, (&init, x.stream_ordered()))? } else { None },
        });
    }
    Ok(())
}

/// What the operations' spans cost with no subscriber: a 4-byte f32 allreduce on the Mpi
/// backend with the spans on and off (`duralumin::reliability::set_operation_spans`), in
/// alternating rounds of `a.iters` calls; the median time per call of each, µs, the slowest
/// rank's.
pub fn span_cost(world: &SimpleCommunicator, a: &Args, rounds: usize) -> Result<(f64, f64), Boxed> {
    let comm = duralumin::MpiCommunicator::new(world)?;
    let (send, mut recv) = ([1.0f32], [0.0f32]);
    let mut round = |on: bool| -> Result<f64, Boxed> {
        duralumin::reliability::set_operation_spans(on);
        let (t, _) =
            time(world, a, (true, 1), &|| Ok(()), |_| comm.allreduce(&send[..], &mut recv[..], duralumin::Sum))?;
        Ok(t)
    };
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        on.push(round(true)?);
        off.push(round(false)?);
    }
    duralumin::reliability::set_operation_spans(true);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok((median(on), median(off)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_algorithms_apply_where_they_exist_and_typos_are_refused() {
        let a = Args { algorithms: vec!["ring".into()], ..Args::default() };
        assert_eq!(
            algorithms(&a, Coll::Allreduce).unwrap(),
            vec![Algorithm::Allreduce(duralumin::AllreduceAlgorithm::Ring)]
        );
        assert_eq!(algorithms(&a, Coll::Bcast).unwrap(), vec![Algorithm::Auto]);
        assert_eq!(algorithms(&a, Coll::Gather).unwrap(), vec![Algorithm::Auto]);
        let all = Args { algorithms: vec!["all".into()], ..Args::default() };
        assert_eq!(algorithms(&all, Coll::Bcast).unwrap().len(), 4);
        let typo = Args { algorithms: vec!["rign".into()], ..Args::default() };
        assert!(algorithms(&typo, Coll::Bcast).is_err());
    }
}
