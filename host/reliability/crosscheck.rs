//! The signature check: before a collective moves any data, the ranks compare what they called
//! (`DURALUMIN_CHECK=1`, or `set_check`), on a communicator kept for it.
//!
//! Every rank contributes one fixed-size record (its call's [`Signature`], its sequence number,
//! and whether its own arguments passed their checks) to one allgather, so every rank reaches
//! the same verdict from the same data: a mismatch, or invalid arguments anywhere, is an error
//! on every rank, never a truncation or a hang. Operations whose counts are per pair (gatherv,
//! scatterv, alltoallv) then check those pairs with one all-to-all of counts and one allgather
//! of what each rank found.

use std::ffi::c_int;
use std::sync::Arc;
use std::task::Poll;

use super::monitor::{Asker, Monitor, OpId};
use super::recorder::{OpKind, RecordView, Signature, State, clip};
use super::report;
use crate::api::error::{Error, Result};
use crate::ffi::native::Native;
use crate::ffi::{RawDatatype, p2p, sys};

/// Per-pair counts of an operation whose ranks exchange different amounts with each peer:
/// what this rank sends to each rank and expects from each rank (its own entries ignored).
#[derive(Clone, Debug, Default)]
pub(crate) struct Pairs {
    pub(crate) send_to: Vec<u64>,
    pub(crate) recv_from: Vec<u64>,
}

impl Pairs {
    pub(crate) fn new(n: usize) -> Pairs {
        Pairs { send_to: vec![0; n], recv_from: vec![0; n] }
    }

    pub(crate) fn gatherv(n: usize, me: usize, root: usize, mine: usize, counts: &[usize]) -> Pairs {
        let mut p = Pairs::new(n);
        if me == root {
            for (i, &c) in counts.iter().enumerate().take(n) {
                p.recv_from[i] = c as u64;
            }
        } else if root < n {
            p.send_to[root] = mine as u64;
        }
        p
    }

    pub(crate) fn scatterv(n: usize, me: usize, root: usize, mine: usize, counts: &[usize]) -> Pairs {
        let Pairs { send_to, recv_from } = Pairs::gatherv(n, me, root, mine, counts);
        Pairs { send_to: recv_from, recv_from: send_to }
    }

    pub(crate) fn alltoallv(n: usize, send_counts: &[usize], recv_counts: &[usize]) -> Pairs {
        let widen = |v: &[usize]| (0..n).map(|i| v.get(i).map_or(0, |&c| c as u64)).collect();
        Pairs { send_to: widen(send_counts), recv_from: widen(recv_counts) }
    }
}

/// The size of one rank's record.
const RECORD: usize = 256;

fn put_str(out: &mut Vec<u8>, s: &str, width: usize) {
    let s = clip(s, width);
    out.extend_from_slice(s.as_bytes());
    out.resize(out.len() + width - s.len(), 0);
}

fn encode(seq: u64, sig: &Signature, note: Option<&str>) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD);
    b.extend_from_slice(&seq.to_le_bytes());
    b.push(sig.kind as u8);
    b.push(u8::from(note.is_none()) | (u8::from(sig.in_place) << 1));
    b.extend_from_slice(&sig.elem_size.to_le_bytes());
    b.extend_from_slice(&sig.root.unwrap_or(u32::MAX).to_le_bytes());
    b.extend_from_slice(&sig.count.to_le_bytes());
    b.extend_from_slice(&sig.digest.to_le_bytes());
    put_str(&mut b, sig.algorithm, 16);
    put_str(&mut b, sig.elem, 32);
    put_str(&mut b, sig.operator, 32);
    let rest = RECORD - b.len();
    put_str(&mut b, note.unwrap_or(""), rest);
    b
}

/// A rank's record as a view (state `Rejected` when its arguments failed their checks).
fn decode(b: &[u8], mine: &RecordView) -> RecordView {
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or_default());
    let str_at = |i: usize, w: usize| String::from_utf8_lossy(&b[i..i + w]).trim_end_matches('\0').to_string();
    let valid = b[9] & 1 != 0;
    let kind = OpKind::ALL.iter().copied().find(|k| *k as u8 == b[8]).unwrap_or(mine.kind);
    RecordView {
        seq: u64_at(0),
        kind,
        elem: str_at(50, 32),
        elem_size: u32_at(10),
        operator: str_at(82, 32),
        count: u64_at(18),
        digest: u64_at(26),
        root: Some(u32_at(14)).filter(|&r| r != u32::MAX),
        algorithm: str_at(34, 16),
        in_place: b[9] & 2 != 0,
        state: if valid { State::Running } else { State::Rejected },
        enqueued_ago: None,
        started_ago: None,
        ended_ago: None,
        note: str_at(114, RECORD - 114),
    }
}

/// Runs a collective of the check on `m.check_comm`: blocking, or (when the operation must be
/// interruptible, [`Monitor::guarded`]) started non-blocking and polled until it completes or
/// the communicator is given up. Its buffers are leaked if it is abandoned, since MPI may
/// still write them.
fn collective(m: &Monitor, op: OpId, call: Native, bufs: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
    let dt = RawDatatype(unsafe { sys::RSMPI_UINT8_T });
    if !m.guarded() {
        // SAFETY: `call` points into `bufs`, which outlive the blocking call, sized by the
        // caller for this call's counts.
        unsafe { call.run(dt, m.check_comm) }?;
        return Ok(bufs);
    }
    // SAFETY: as above; the buffers and `call` live until the request completes, or are leaked.
    let mut req = unsafe { call.start(dt, m.check_comm) }?;
    let mut backoff = crate::common::progress::Backoff::default();
    loop {
        if p2p::test(&mut req)?.is_some() {
            return Ok(bufs);
        }
        if let Some(p) = m.poisoned() {
            std::mem::forget((req, bufs, call));
            return Err(p.error(Asker::Op(op)));
        }
        backoff.snooze();
    }
}

/// Runs a collective of the check on `m.check_comm` as a future polled to completion, for a
/// check that must not block its thread (a non-blocking operation's, the proxy thread's): as
/// [`collective`] when guarded, given up (its buffers leaked) if the communicator is.
async fn collective_polled(m: &Monitor, op: OpId, call: Native, bufs: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
    let dt = RawDatatype(unsafe { sys::RSMPI_UINT8_T });
    // SAFETY: `call` points into `bufs`; both live until the request completes, or are leaked.
    let mut held = Some((unsafe { call.start(dt, m.check_comm) }?, bufs, call));
    std::future::poll_fn(|_| {
        let Some((req, _, _)) = held.as_mut() else { return Poll::Ready(Err(Error::Progress("check polled after"))) };
        match p2p::test(req) {
            Ok(Some(_)) => Poll::Ready(Ok(held.take().map(|(_, bufs, _)| bufs).unwrap_or_default())),
            Err(e) => Poll::Ready(Err(e)),
            Ok(None) => match m.poisoned() {
                Some(p) => {
                    std::mem::forget(held.take());
                    Poll::Ready(Err(p.error(Asker::Op(op))))
                }
                None => Poll::Pending,
            },
        }
    })
    .await
}

/// This rank's record and room for every rank's, and the allgather between them.
fn exchange_of(op: OpId, sig: &Signature, note: Option<&str>, n: usize) -> (Native, Vec<Vec<u8>>) {
    let send = encode(op.seq, sig, note);
    let mut recv = vec![0u8; RECORD * n];
    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, reason = "RECORD is 256")]
    let call = Native::Allgather { send: send.as_ptr().cast(), recv: recv.as_mut_ptr().cast(), count: RECORD as c_int };
    (call, vec![send, recv])
}

/// Compares this rank's call with every other rank's (see the module docs). `local` is this
/// rank's own verdict on its arguments: when it is an error, that error is returned here (the
/// others learn of it and fail with [`Error::SignatureMismatch`]).
pub(crate) fn run(m: &Monitor, op: OpId, sig: &Signature, pairs: Option<Pairs>, local: Result<()>) -> Result<()> {
    let note = local.as_ref().err().map(|e| e.to_string());
    let (call, bufs) = exchange_of(op, sig, note.as_deref(), m.size);
    let got = collective(m, op, call, bufs)?;
    let mine = verdict(m, op, sig, note.as_deref(), &got, true)?;
    local?;
    match (pairs, mine) {
        (Some(p), mine) => check_pairs(m, op, sig, &mine.unwrap_or_else(|| report_view(op.seq, sig, None)), p),
        (None, _) => Ok(()),
    }
}

/// [`run`] for a call whose own arguments passed and whose counts are common (no pairs), as a
/// future that never blocks its thread (or, `blocking`, on this thread): the check a native
/// collective above `NATIVE_UNCHECKED_BYTES` makes first in every mode (see
/// `docs/reliability.md`). It compares the calls, not their numbers: a collective refused on one
/// rank alone (its own arguments, an earlier request's error) took a number there only, which
/// shifts nothing the ranks send.
pub(crate) async fn verify(m: Arc<Monitor>, op: OpId, sig: Signature) -> Result<()> {
    let (call, bufs) = exchange_of(op, &sig, None, m.size);
    let got = collective_polled(&m, op, call, bufs).await?;
    verdict(&m, op, &sig, None, &got, false).map(drop)
}

/// [`verify`] on this thread.
pub(crate) fn verify_blocking(m: &Monitor, op: OpId, sig: &Signature) -> Result<()> {
    let (call, bufs) = exchange_of(op, sig, None, m.size);
    let got = collective(m, op, call, bufs)?;
    verdict(m, op, sig, None, &got, false).map(drop)
}

/// The verdict on the records gathered (`got[0]` this rank's, `got[1]` every rank's): a
/// mismatch is [`Error::SignatureMismatch`]. When every record agrees byte for byte in what
/// the ranks must agree on (the operation numbers too where `numbered`), nothing is decoded
/// (`None`); else this rank's view of its call.
fn verdict(
    m: &Monitor,
    op: OpId,
    sig: &Signature,
    note: Option<&str>,
    got: &[Vec<u8>],
    numbered: bool,
) -> Result<Option<RecordView>> {
    judge(m.rank, op.seq, sig, note, (&got[0], &got[1]), numbered)
}

/// [`verdict`] as rank `me`, on operation number `seq`.
fn judge(
    me: usize,
    seq: u64,
    sig: &Signature,
    note: Option<&str>,
    (own, all): (&[u8], &[u8]),
    numbered: bool,
) -> Result<Option<RecordView>> {
    if all.chunks_exact(RECORD).all(|theirs| agrees(sig.kind, own, theirs, numbered)) {
        return Ok(None);
    }
    let mine = report_view(seq, sig, note);
    let views: Vec<RecordView> = all
        .chunks_exact(RECORD)
        .map(|b| {
            let v = decode(b, &mine);
            if numbered { v } else { RecordView { seq: mine.seq, ..v } }
        })
        .collect();
    let headline = format!("{}: the signature check found ranks that differ", report::describe(&mine));
    // Records that differ in their bytes but not once decoded (an operation kind this build
    // does not know, which decodes as this rank's: a rank of another build, or a damaged
    // record) differ all the same: the collective never runs on them.
    let text = report::calls(me, &headline, &mine, &views).unwrap_or_else(|| {
        let differing: Vec<String> = all
            .chunks_exact(RECORD)
            .enumerate()
            .filter(|(_, theirs)| !agrees(sig.kind, own, theirs, numbered))
            .map(|(r, _)| r.to_string())
            .collect();
        undecodable(&headline, &differing)
    });
    if note.is_none() {
        return Err(Error::SignatureMismatch { op: sig.kind.name(), seq, report: text });
    }
    Ok(Some(mine))
}

/// The report on records whose difference does not survive decoding, from ranks `differing`.
fn undecodable(headline: &str, differing: &[String]) -> String {
    format!(
        "{headline}: ranks {} sent records that differ from this rank's in bytes that do not decode (a rank \
         of another build, or a damaged record)",
        differing.join(", ")
    )
}

/// Whether two encoded records agree in every byte the report compares (`report::key`, which
/// `Signature::agreement_hash` follows too): the number (where `numbered`), op, validity,
/// element, operator, algorithm, and where the kind has them, root, count and the counts'
/// digest.
fn agrees(kind: OpKind, a: &[u8], b: &[u8], numbered: bool) -> bool {
    let same = |r: std::ops::Range<usize>| a.get(r.clone()) == b.get(r);
    (!numbered || same(0..8))
        && same(8..9)
        && (a[9] & 1) == (b[9] & 1)
        && same(10..14)
        && (!kind.has_root() || same(14..18))
        && (!kind.common_count() || same(18..26))
        && (!kind.common_digest() || same(26..34))
        && same(34..114)
}

/// Every pair's counts agree: one all-to-all of what each rank sends, one allgather of the
/// first disagreement each rank found.
fn check_pairs(m: &Monitor, op: OpId, sig: &Signature, mine: &RecordView, p: Pairs) -> Result<()> {
    let n = m.size;
    let send: Vec<u8> = p.send_to.iter().flat_map(|c| c.to_le_bytes()).collect();
    let mut recv = vec![0u8; 8 * n];
    let call = Native::Alltoall { send: send.as_ptr().cast(), recv: recv.as_mut_ptr().cast(), count: 8 };
    let got = collective(m, op, call, vec![send, recv])?;
    let sent_to_me = |i: usize| u64::from_le_bytes(got[1][8 * i..8 * i + 8].try_into().unwrap_or_default());
    let bad: Vec<usize> = (0..n).filter(|&i| i != m.rank && sent_to_me(i) != p.recv_from[i]).collect();
    let mut finding = Vec::with_capacity(24);
    finding.extend_from_slice(&(bad.len() as u64).to_le_bytes());
    let first = bad.first().map_or((0, 0, 0), |&i| (i as u64, p.recv_from[i], sent_to_me(i)));
    for v in [first.0, first.1, first.2] {
        finding.extend_from_slice(&v.to_le_bytes());
    }
    let mut all = vec![0u8; 32 * n];
    let call = Native::Allgather { send: finding.as_ptr().cast(), recv: all.as_mut_ptr().cast(), count: 32 };
    let got = collective(m, op, call, vec![finding, all])?;
    let word = |r: usize, k: usize| {
        u64::from_le_bytes(got[1][32 * r + 8 * k..32 * r + 8 * k + 8].try_into().unwrap_or_default())
    };
    let lines: Vec<String> = (0..n)
        .filter(|&r| word(r, 0) > 0)
        .map(|r| {
            let more = word(r, 0) - 1;
            format!(
                "rank {r} expects {} elements from rank {}, which sends {}{}",
                word(r, 2),
                word(r, 1),
                word(r, 3),
                if more > 0 { format!(" (and {more} more pairs differ)") } else { String::new() }
            )
        })
        .collect();
    if lines.is_empty() {
        return Ok(());
    }
    let mut text = format!(
        "desync report, communicator of {n} ranks, seen from rank {}: {}: the per-pair counts differ",
        m.rank,
        report::describe(mine)
    );
    for l in lines {
        text.push_str("\n  ");
        text.push_str(&l);
    }
    Err(Error::SignatureMismatch { op: sig.kind.name(), seq: op.seq, report: text })
}

fn report_view(seq: u64, sig: &Signature, note: Option<&str>) -> RecordView {
    let state = if note.is_some() { State::Rejected } else { State::Running };
    RecordView { state, note: note.unwrap_or("").into(), ..RecordView::of_call(seq, sig) }
}

/// A record that matches the local one survives its trip through the fixed-size encoding.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_keep_what_the_report_compares() {
        let sig = Signature::new(OpKind::Gatherv)
            .reduce::<f32, crate::Sum>()
            .counts(&[1, 2])
            .root(3)
            .algorithm("ring")
            .in_place();
        let mine = report_view(9, &sig, None);
        assert_eq!(decode(&encode(9, &sig, None), &mine), mine);
        let rejected = decode(&encode(9, &sig, Some("bad buffer")), &mine);
        assert_eq!((rejected.state, rejected.note.as_str()), (State::Rejected, "bad buffer"));
        let p = Pairs::gatherv(3, 1, 0, 5, &[]);
        assert_eq!((p.send_to, p.recv_from), (vec![5, 0, 0], vec![0, 0, 0]));
        let p = Pairs::scatterv(3, 0, 0, 1, &[1, 2, 3]);
        assert_eq!((p.send_to, p.recv_from), (vec![1, 2, 3], vec![0, 0, 0]));
    }

    /// A record whose difference is lost in decoding (an operation kind this build does not
    /// know reads as this rank's) is still a mismatch, never a pass.
    #[test]
    fn records_that_differ_only_in_undecodable_bytes_still_differ() {
        let sig = Signature::new(OpKind::Allreduce).reduce::<f32, crate::Sum>().count(4);
        let own = encode(2, &sig, None);
        let judged = |theirs: &[u8]| judge(0, 2, &sig, None, (&own, &[own.as_slice(), theirs].concat()), true);
        assert!(matches!(judged(&own), Ok(None)), "alike records pass");
        let report = |theirs: &[u8]| match judged(theirs) {
            Err(Error::SignatureMismatch { report, .. }) => report,
            other => panic!("a record that differs passed the check: {other:?}"),
        };
        let mut unknown_kind = own.clone();
        unknown_kind[8] = 250;
        assert!(report(&unknown_kind).contains("ranks 1 sent records that differ"));
        let other_kind = encode(2, &Signature { kind: OpKind::Reduce, ..sig }, None);
        assert!(!report(&other_kind).contains("do not decode"), "a known difference is reported as itself");
    }
}
