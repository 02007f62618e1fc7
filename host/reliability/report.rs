//! The desync report: from every rank's [`Snapshot`], which ranks are out of step with the
//! operation that timed out, and how. The format is documented in `docs/reliability.md`:
//!
//! ```text
//! desync report, communicator of 3 ranks, seen from rank 0: allreduce #5 (f32 sum, count 7) timed out after 2.0 s
//!   rank 1: never entered #5: outside Duralumin for 2.1 s; last completed #4 allreduce (f32 sum, count 7)
//!   rank 2: entered #5 as bcast (f32, count 7, root 0), which differs in op (expected allreduce)
//!   in #5 as expected: rank 0
//!   last completed: #4 on ranks 0-2
//! ```
//!
//! The first line says what happened; then one line per rank that differs (never entered,
//! entered something else, refused its arguments, queued behind its stream, did not answer);
//! then the ranks that are where they should be, and the last collective each rank completed.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::recorder::{OpKind, RecordView, Snapshot, State};

/// What the report is about.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// A collective (numbered alike on every rank).
    Collective(RecordView),
    /// A point-to-point operation (`root` is its peer when it has one).
    P2p(RecordView),
    /// A thread waiting on the communicator (`synchronize`, a request's `wait`).
    Wait,
}

/// Ranks as ranges: `0-2, 5`.
pub(crate) fn ranges(ranks: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        let _ = match j - i {
            0 => write!(out, "{}", ranks[i]),
            _ => write!(out, "{}-{}", ranks[i], ranks[j]),
        };
        i = j + 1;
    }
    out
}

fn rank_list(ranks: &[usize]) -> String {
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, ranges(ranks))
}

/// `allreduce #5 (f32 sum, count 7)`, `recv #3 (7 u8 from rank 1, tag 9)`.
pub(crate) fn describe(r: &RecordView) -> String {
    format!("{} #{}{}", r.kind.name(), r.seq, details(r))
}

/// `allreduce (f32 sum, count 7)`: the call without its number.
fn call(r: &RecordView) -> String {
    format!("{}{}", r.kind.name(), details(r))
}

/// ` (f32 sum, count 7)`: the arguments that identify a call.
fn details(r: &RecordView) -> String {
    let mut parts: Vec<String> = Vec::new();
    let elem = match (r.elem.is_empty(), r.operator.is_empty()) {
        (true, _) => String::new(),
        (false, true) => r.elem.clone(),
        (false, false) => format!("{} {}", r.elem, r.operator),
    };
    if r.kind.is_collective() {
        if !elem.is_empty() {
            parts.push(elem);
        }
        if r.kind != OpKind::Barrier && !matches!(r.kind, OpKind::Dup | OpKind::Split | OpKind::Drop) {
            parts.push(format!("count {}", r.count));
        }
        if let (true, Some(root)) = (r.kind.has_root(), r.root) {
            parts.push(format!("root {root}"));
        }
    } else {
        let dir = match r.kind {
            OpKind::Send => "to",
            OpKind::Recv => "from",
            _ => "with",
        };
        let peer = r.root.map(|p| format!(" {dir} rank {p}")).unwrap_or_default();
        parts.push(format!("{} {elem}{peer}", r.count));
        parts.push(format!("tag {}", r.digest));
    }
    if r.algorithm != "auto" {
        parts.push(format!("algorithm {}", r.algorithm));
    }
    if r.in_place {
        parts.push("in place".into());
    }
    if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
}

/// What a collective call must agree on across ranks, for grouping.
#[allow(clippy::type_complexity)]
fn key(r: &RecordView) -> (u64, OpKind, &str, u32, &str, &str, Option<u32>, Option<u64>, u64) {
    let digest = if r.kind.common_digest() { r.digest } else { 0 };
    (
        r.seq,
        r.kind,
        &r.elem,
        r.elem_size,
        &r.operator,
        &r.algorithm,
        r.root.filter(|_| r.kind.has_root()),
        r.kind.common_count().then_some(r.count),
        digest,
    )
}

/// The fields in which `r` differs from `expected`, whose values are called `label`'s
/// (`"expected"`, or another rank's).
fn differences(r: &RecordView, expected: &RecordView, label: &str) -> Vec<String> {
    let mut d = Vec::new();
    if r.seq != expected.seq {
        d.push(format!("number (#{}; {label} #{}: an earlier collective ran on some ranks only)", r.seq, expected.seq));
    }
    if r.kind != expected.kind {
        d.push(format!("op ({label} {})", expected.kind.name()));
        return d;
    }
    if r.elem != expected.elem || r.elem_size != expected.elem_size {
        d.push(format!(
            "element ({}, {} bytes; {label} {}, {} bytes)",
            r.elem, r.elem_size, expected.elem, expected.elem_size
        ));
    }
    if r.operator != expected.operator {
        d.push(format!("operator ({}; {label} {})", r.operator, expected.operator));
    }
    if r.kind.has_root() && r.root != expected.root {
        let show = |x: Option<u32>| x.map_or("none".to_string(), |v| v.to_string());
        d.push(format!("root ({}; {label} {})", show(r.root), show(expected.root)));
    }
    if r.kind.common_count() && r.count != expected.count {
        d.push(format!("count ({}; {label} {})", r.count, expected.count));
    } else if key(r).8 != key(expected).8 {
        d.push("per-rank counts".into());
    }
    if r.algorithm != expected.algorithm {
        d.push(format!("algorithm ({}; {label} {})", r.algorithm, expected.algorithm));
    }
    d
}

/// What a rank is doing, from its snapshot: the operations it is in, its waits, or how long it
/// has been outside Duralumin; and the last collective it completed.
fn activity(s: &Snapshot) -> String {
    let mut parts: Vec<String> = s
        .records
        .iter()
        .filter(|r| r.state == State::Running)
        .map(|r| format!("in {} for {:.1} s", describe(r), r.started_ago.unwrap_or(0.0)))
        .collect();
    parts.extend(s.records.iter().filter(|r| r.state == State::Queued).map(|r| {
        format!("{} queued {:.1} s ago, its stream not there yet", describe(r), r.enqueued_ago.unwrap_or(0.0))
    }));
    parts.extend(s.waits.iter().map(|w| format!("waiting in {} for {:.1} s", w.what, w.ago)));
    if parts.is_empty() {
        parts.push(format!("outside Duralumin for {:.1} s", s.idle));
    }
    if s.poisoned {
        parts.push("its communicator is aborted".into());
    }
    let mut out = parts.join("; ");
    match last_completed(s) {
        Some(r) => {
            let _ = write!(out, "; last completed {}", describe(r));
        }
        None => out.push_str("; no collective completed yet"),
    }
    out
}

fn last_completed(s: &Snapshot) -> Option<&RecordView> {
    s.records.iter().filter(|r| r.kind.is_collective() && r.state == State::Done).max_by_key(|r| r.seq)
}

/// The report, as text: the headline, then one line per rank that differs, then the summary.
/// `me` is the rank writing it; `snaps[r]` is rank `r`'s answer (`None`: none within
/// `answer_secs`).
pub(crate) fn write(
    me: usize,
    headline: &str,
    target: &Target,
    snaps: &[Option<Snapshot>],
    answer_secs: f64,
) -> String {
    let no_answer = |r: usize| {
        format!(
            "rank {r}: no answer within {answer_secs:.1} s (its process is stopped, busy where Duralumin cannot \
             answer, or gone)"
        )
    };
    let lines = match target {
        Target::Collective(mine) => collective_lines(me, mine, snaps, &no_answer),
        Target::P2p(mine) => {
            // The peer's line only (every other rank's, for an operation without one).
            let peers = |r: usize| r != me && mine.root.is_none_or(|p| p as usize == r);
            let mut lines = activity_lines(snaps, peers, &no_answer);
            lines.push(summary(snaps));
            lines
        }
        Target::Wait => activity_lines(snaps, |_| true, &no_answer),
    };
    let mut out = format!("desync report, communicator of {} ranks, seen from rank {me}: {headline}", snaps.len());
    for l in lines {
        out.push_str("\n  ");
        out.push_str(&l);
    }
    out
}

/// The lines of a report about collective `mine`: each rank that is not in it as expected,
/// those that are, and the summary.
fn collective_lines(
    me: usize,
    mine: &RecordView,
    snaps: &[Option<Snapshot>],
    no_answer: &dyn Fn(usize) -> String,
) -> Vec<String> {
    let seq = mine.seq;
    let at: Vec<Option<&RecordView>> = snaps
        .iter()
        .map(|s| s.as_ref().and_then(|s| s.records.iter().find(|r| r.kind.is_collective() && r.seq == seq)))
        .collect();
    let expected = expected(me, mine, &at);
    let (mut lines, mut in_step) = (Vec::new(), Vec::new());
    for (r, snap) in snaps.iter().enumerate() {
        let Some(snap) = snap else {
            lines.push(no_answer(r));
            continue;
        };
        match at[r] {
            None if snap.next_seq <= seq => lines.push(format!("rank {r}: never entered #{seq}: {}", activity(snap))),
            None => lines.push(format!(
                "rank {r}: is past #{seq} (its last collective is #{}): the ranks' collectives got out of step earlier",
                snap.next_seq.saturating_sub(1)
            )),
            Some(rec) => match rank_line(r, rec, expected) {
                Some(l) if rec.state == State::Queued => lines.push(format!("{l}: {}", activity(snap))),
                Some(l) => lines.push(l),
                None => in_step.push(r),
            },
        }
    }
    if !in_step.is_empty() {
        lines.push(format!("in #{seq} as expected ({}): {}", describe(expected), rank_list(&in_step)));
    }
    lines.push(summary(snaps));
    lines
}

/// One line per rank `shown` picks: what it is doing, or that it did not answer.
fn activity_lines(
    snaps: &[Option<Snapshot>],
    shown: impl Fn(usize) -> bool,
    no_answer: &dyn Fn(usize) -> String,
) -> Vec<String> {
    let shown = snaps.iter().enumerate().filter(|(r, _)| shown(*r));
    shown
        .map(|(r, snap)| match snap {
            None => no_answer(r),
            Some(s) => format!("rank {r}: {}", activity(s)),
        })
        .collect()
}

/// The line of a rank whose call at this point is not the expected one (refused, different,
/// or queued behind its stream); `None` for a rank in step.
fn rank_line(r: usize, rec: &RecordView, expected: &RecordView) -> Option<String> {
    if rec.state == State::Rejected {
        return Some(format!("rank {r}: refused its arguments for {}: {}", describe(rec), rec.note));
    }
    if key(rec) != key(expected) {
        let what = differences(rec, expected, "expected").join(", ");
        return Some(format!("rank {r}: entered #{} as {}, which differs in {what}", expected.seq, call(rec)));
    }
    (rec.state == State::Queued).then(|| {
        format!(
            "rank {r}: queued #{} {:.1} s ago, but its stream has not reached it",
            rec.seq,
            rec.enqueued_ago.unwrap_or(0.0)
        )
    })
}

/// The report of a rank whose collective #n another rank gave up in (`from`, whose deadline
/// passed there first, or whose call failed) with a call unlike this rank's (`mine`, `theirs`):
/// `None` if the calls agree. The rank that gave up wrote the whole report, from every rank's
/// answer; this one compares the two calls this rank knows.
pub(crate) fn against_giver(
    (me, size): (usize, usize),
    headline: &str,
    mine: &RecordView,
    (from, theirs): (usize, &RecordView),
) -> Option<String> {
    if key(mine) == key(theirs) {
        return None;
    }
    // Neither call is known to be the odd one: the other rank's values are named as its own
    // (`count (8; rank 0's 7)`), not as the expected ones.
    let what = differences(mine, theirs, &format!("rank {from}'s")).join(", ");
    Some(format!(
        "desync report, communicator of {size} ranks, seen from rank {me}: {headline}\n  rank {me}: entered #{} as {}, \
         which differs from rank {from}'s call in {what}\n  rank {from}: entered #{} as {}, and gave the communicator \
         up (its own report names every rank's call)",
        mine.seq,
        call(mine),
        theirs.seq,
        call(theirs)
    ))
}

/// The signature check's verdict on every rank's call at one point (`views[r]` is rank `r`'s):
/// `None` when all are valid and alike, else the report.
pub(crate) fn calls(me: usize, headline: &str, mine: &RecordView, views: &[RecordView]) -> Option<String> {
    let at: Vec<Option<&RecordView>> = views.iter().map(Some).collect();
    let expected = expected(me, mine, &at);
    let mut out = format!("desync report, communicator of {} ranks, seen from rank {me}: {headline}", views.len());
    let mut in_step = Vec::new();
    for (r, rec) in views.iter().enumerate() {
        match rank_line(r, rec, expected) {
            Some(l) => {
                out.push_str("\n  ");
                out.push_str(&l);
            }
            None => in_step.push(r),
        }
    }
    if in_step.len() == views.len() {
        return None;
    }
    if !in_step.is_empty() {
        let _ = write!(out, "\n  in step ({}): {}", describe(expected), rank_list(&in_step));
    }
    Some(out)
}

/// The call most ranks made at this point (ties go to this rank's own call, then to the
/// lowest rank's), to compare the others against.
fn expected<'a>(me: usize, mine: &'a RecordView, at: &[Option<&'a RecordView>]) -> &'a RecordView {
    let mut groups: Vec<(&RecordView, usize, bool)> = Vec::new();
    for (r, rec) in at.iter().enumerate() {
        let Some(rec) = rec.filter(|x| x.state != State::Rejected) else { continue };
        match groups.iter_mut().find(|g| key(g.0) == key(rec)) {
            Some(g) => {
                g.1 += 1;
                g.2 |= r == me;
            }
            None => groups.push((rec, 1, r == me)),
        }
    }
    groups.iter().max_by_key(|g| (g.1, g.2)).map_or(mine, |g| g.0)
}

/// `last completed: #4 allreduce on ranks 0-2; none on rank 3`.
fn summary(snaps: &[Option<Snapshot>]) -> String {
    let mut by: BTreeMap<(u64, &str), Vec<usize>> = BTreeMap::new();
    for (r, s) in snaps.iter().enumerate() {
        if let Some(s) = s {
            let k = last_completed(s).map_or((0, "none"), |x| (x.seq, x.kind.name()));
            by.entry(k).or_default().push(r);
        }
    }
    let parts: Vec<String> = by
        .iter()
        .rev()
        .map(|((seq, op), ranks)| match *seq {
            0 => format!("none on {}", rank_list(ranks)),
            s => format!("#{s} {op} on {}", rank_list(ranks)),
        })
        .collect();
    format!("last completed: {}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::super::recorder::{Recorder, Signature, WaitView};
    use super::*;

    fn view(seq: u64, sig: Signature, state: State) -> RecordView {
        let mut rec = Recorder::new(8);
        let id = rec.push(seq, sig, State::Running, 1_000_000_000, None);
        rec.set(id, state, 2_000_000_000, (state == State::Rejected).then(|| "buffer too short".into()));
        RecordView::of(rec.iter().next().unwrap(), 3_000_000_000)
    }

    fn allreduce(count: usize) -> Signature {
        Signature::new(OpKind::Allreduce).reduce::<f32, crate::Sum>().count(count)
    }

    fn snap(rank: u32, next_seq: u64, records: Vec<RecordView>) -> Option<Snapshot> {
        Some(Snapshot { rank, next_seq, next_p2p: 1, poisoned: false, idle: 2.5, waits: vec![], records })
    }

    #[test]
    fn names_the_ranks_that_are_out_of_step() {
        let done4 = || view(4, allreduce(7), State::Done);
        let mine = view(5, allreduce(7), State::Running);
        let bcast = Signature::new(OpKind::Bcast).elem::<f32>().count(7).root(0);
        let snaps = vec![
            snap(0, 6, vec![done4(), mine.clone()]),
            snap(1, 5, vec![done4()]),
            snap(2, 6, vec![done4(), view(5, bcast, State::Running)]),
            snap(3, 6, vec![done4(), view(5, allreduce(8), State::Running)]),
            snap(4, 6, vec![done4(), view(5, allreduce(7), State::Rejected)]),
            None,
            snap(6, 6, vec![done4(), view(5, allreduce(7), State::Running)]),
        ];
        let text = write(0, "allreduce #5 timed out after 2.0 s", &Target::Collective(mine), &snaps, 1.0);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("desync report, communicator of 7 ranks, seen from rank 0: allreduce #5"));
        assert!(lines[1].starts_with("  rank 1: never entered #5: outside Duralumin for 2.5 s"), "{text}");
        assert!(lines[1].ends_with("last completed allreduce #4 (f32 sum, count 7)"), "{text}");
        assert_eq!(
            lines[2],
            "  rank 2: entered #5 as bcast (f32, count 7, root 0), which differs in op (expected allreduce)"
        );
        assert_eq!(
            lines[3],
            "  rank 3: entered #5 as allreduce (f32 sum, count 8), which differs in count (8; expected 7)"
        );
        assert_eq!(lines[4], "  rank 4: refused its arguments for allreduce #5 (f32 sum, count 7): buffer too short");
        assert!(lines[5].starts_with("  rank 5: no answer within 1.0 s"), "{text}");
        assert_eq!(lines[6], "  in #5 as expected (allreduce #5 (f32 sum, count 7)): ranks 0, 6");
        assert_eq!(lines[7], "  last completed: #4 allreduce on ranks 0-4, 6");
        assert_eq!(lines.len(), 8);
    }

    #[test]
    fn a_tie_goes_to_the_writers_own_call() {
        let mine = view(2, allreduce(7), State::Running);
        let snaps = vec![snap(0, 3, vec![view(2, allreduce(8), State::Running)]), snap(1, 3, vec![mine.clone()])];
        let text = write(1, "x", &Target::Collective(mine), &snaps, 1.0);
        assert!(
            text.contains("rank 0: entered #2 as allreduce (f32 sum, count 8), which differs in count (8; expected 7)"),
            "{text}"
        );
        assert!(text.contains("last completed: none on ranks 0-1"), "{text}");
    }

    #[test]
    fn a_rank_told_of_a_give_up_compares_the_giver_s_call_with_its_own() {
        let mine = view(2, allreduce(8), State::Running);
        let theirs = RecordView::decode(&view(2, allreduce(7), State::Running).encode()).unwrap();
        assert!(against_giver((1, 4), "x", &mine, (0, &view(2, allreduce(8), State::Running))).is_none());
        let text = against_giver((1, 4), "rank 0 gave up", &mine, (0, &theirs)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "desync report, communicator of 4 ranks, seen from rank 1: rank 0 gave up");
        assert_eq!(
            lines[1],
            "  rank 1: entered #2 as allreduce (f32 sum, count 8), which differs from rank 0's call in count (8; \
             rank 0's 7)"
        );
        assert!(lines[2].starts_with("  rank 0: entered #2 as allreduce (f32 sum, count 7), and gave"), "{text}");
        assert_eq!(lines.len(), 3);
        assert!(RecordView::decode(&[0xff]).is_none(), "another build's encoding reads as nothing");
        let bytes = theirs.encode();
        assert!((0..bytes.len()).all(|n| RecordView::decode(&bytes[..n]).is_none()), "a cut record reads as nothing");
    }

    #[test]
    fn waits_and_point_to_point_list_what_the_others_do() {
        let recv = view(3, Signature::new(OpKind::Recv).elem::<u8>().count(4).root(1).tag(9), State::Running);
        let mut busy = snap(1, 1, vec![]).unwrap();
        busy.waits.push(WaitView { what: "synchronize".into(), ago: 4.0 });
        let snaps = vec![snap(0, 1, vec![recv.clone()]), Some(busy), snap(2, 1, vec![])];
        let text = write(0, "recv #3 timed out", &Target::P2p(recv), &snaps, 1.0);
        assert!(text.contains("rank 1: waiting in synchronize for 4.0 s; no collective completed yet"), "{text}");
        assert!(!text.contains("rank 2:"), "only the peer is listed: {text}");
        let text = write(0, "synchronize timed out", &Target::Wait, &snaps, 1.0);
        assert!(text.contains("rank 0: in recv #3 (4 u8 from rank 1, tag 9) for 1.0 s"), "{text}");
        assert!(text.contains("rank 2: outside Duralumin for 2.5 s"), "{text}");
        assert_eq!(ranges(&[0, 1, 2, 4, 6, 7]), "0-2, 4, 6-7");
    }
}
