//! The kernel bodies, run on the host, against independent references: every builtin
//! (element, operator) pair, a few user element types (odd-sized ones included), pack/unpack and
//! stream-wait/signal, at sizes 0, 1, odd and large, aligned and unaligned, with several emulated
//! thread counts.
// Test values are cut from counters, ranks and random numbers on purpose (all small, or
// wanted modulo the type): the cast lints are noise here.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::half::{bf16, f16};
use duralumin_kernels::pack::Segment;
use duralumin_kernels::{Element, Max, ReduceOp, Sum, bytemuck};

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// A value in a domain wide enough to compute every builtin operator exactly.
#[derive(Clone, Copy, Debug)]
enum Wide {
    Int(i128),
    Float(f64),
}

/// The reference arithmetic: values are widened, combined exactly, and narrowed back.
trait Reference: Element {
    fn wide(self) -> Wide;
    fn narrow(w: Wide) -> Self;
    /// Verifiable test data: any bit pattern for integers; small integers for floats, so sums,
    /// products and averages are exact in every format and any order.
    fn random(rng: &mut Rng) -> Self;
}

macro_rules! int_reference {
    ($($t:ty),*) => {$(
        impl Reference for $t {
            fn wide(self) -> Wide {
                Wide::Int(self as i128)
            }
            fn narrow(w: Wide) -> Self {
                match w {
                    // Truncation is two's complement wrap-around, as the operators specify.
                    Wide::Int(x) => x as $t,
                    Wide::Float(_) => unreachable!(),
                }
            }
            fn random(rng: &mut Rng) -> Self {
                // Mostly full-range values; a quarter zeros and small values for the logical ops.
                match rng.next() % 4 {
                    0 => 0,
                    1 => (rng.next() % 3) as $t,
                    _ => rng.next() as $t,
                }
            }
        }
    )*};
}
int_reference!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_reference {
    ($($t:ty: $from:expr, $to:expr);*) => {$(
        impl Reference for $t {
            fn wide(self) -> Wide {
                Wide::Float($to(self))
            }
            fn narrow(w: Wide) -> Self {
                match w {
                    Wide::Float(x) => $from(x),
                    Wide::Int(_) => unreachable!(),
                }
            }
            fn random(rng: &mut Rng) -> Self {
                $from((rng.next() % 17) as f64 - 8.0)
            }
        }
    )*};
}
float_reference!(
    f32: |x| x as f32, |v: f32| v as f64;
    f64: |x| x, |v: f64| v;
    f16: f16::from_f64, f16::to_f64;
    bf16: bf16::from_f64, bf16::to_f64
);

/// What `op` (by its kernel name) makes of `a` and `b`, computed independently of the operator.
fn reference_combine<T: Reference>(op: &str, a: T, b: T) -> T {
    let truth = |w: Wide| match w {
        Wide::Int(x) => x != 0,
        Wide::Float(x) => x != 0.0,
    };
    let from_truth = |t: bool, like: Wide| match like {
        Wide::Int(_) => Wide::Int(t as i128),
        Wide::Float(_) => Wide::Float(t as i128 as f64),
    };
    let (x, y) = (a.wide(), b.wide());
    let w = match (op, x, y) {
        ("sum" | "avg", Wide::Int(p), Wide::Int(q)) => Wide::Int(p + q),
        ("sum" | "avg", Wide::Float(p), Wide::Float(q)) => Wide::Float(p + q),
        ("prod", Wide::Int(p), Wide::Int(q)) => Wide::Int(p.wrapping_mul(q)),
        ("prod", Wide::Float(p), Wide::Float(q)) => Wide::Float(p * q),
        ("min", Wide::Int(p), Wide::Int(q)) => Wide::Int(p.min(q)),
        ("min", Wide::Float(p), Wide::Float(q)) => Wide::Float(p.min(q)),
        ("max", Wide::Int(p), Wide::Int(q)) => Wide::Int(p.max(q)),
        ("max", Wide::Float(p), Wide::Float(q)) => Wide::Float(p.max(q)),
        ("land", _, _) => from_truth(truth(x) && truth(y), x),
        ("lor", _, _) => from_truth(truth(x) || truth(y), x),
        ("lxor", _, _) => from_truth(truth(x) != truth(y), x),
        ("band", Wide::Int(p), Wide::Int(q)) => Wide::Int(p & q),
        ("bor", Wide::Int(p), Wide::Int(q)) => Wide::Int(p | q),
        ("bxor", Wide::Int(p), Wide::Int(q)) => Wide::Int(p ^ q),
        _ => panic!("no reference for {op} on {}", T::NAME),
    };
    T::narrow(w)
}

/// The finishing step of `op` for `ranks` contributions.
fn reference_finish<T: Reference>(op: &str, x: T, ranks: u32) -> T {
    match (op, x.wide()) {
        // Integer division truncates toward zero, as avg specifies.
        ("avg", Wide::Int(p)) => T::narrow(Wide::Int(p / i128::from(ranks))),
        ("avg", Wide::Float(p)) => T::narrow(Wide::Float(p / f64::from(ranks))),
        _ => x,
    }
}

/// A 16-byte aligned byte buffer, so element offsets give known misalignments.
struct Aligned {
    blocks: Vec<[u128; 1]>,
}

impl Aligned {
    fn zeroed(bytes: usize) -> Aligned {
        Aligned { blocks: vec![[0u128]; bytes.div_ceil(16) + 1] }
    }

    fn bytes(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.blocks)
    }

    /// `n` elements of `T` starting `offset` elements into the buffer.
    fn elements<T: Element>(&mut self, offset: usize, n: usize) -> &mut [T] {
        let size = size_of::<T>();
        bytemuck::cast_slice_mut(&mut self.bytes()[offset * size..(offset + n) * size])
    }
}

fn random_vec<T: Reference>(rng: &mut Rng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::random(rng)).collect()
}

fn same_bits<T: Element>(a: &[T], b: &[T]) -> bool {
    bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}

/// Sizes: empty, one, odd, around vector boundaries, large. Miri, which interprets every access,
/// gets the small ones: they already cover every head, vector and tail path.
#[cfg(not(miri))]
const SIZES: &[usize] = &[0, 1, 3, 17, 64, 1001, 65_539];
#[cfg(miri)]
const SIZES: &[usize] = &[0, 1, 3, 17, 64];
/// The sizes of the user-element checks (as [`SIZES`], small ones under Miri).
#[cfg(not(miri))]
const USER_SIZES: &[usize] = &[0, 1, 2, 3, 5, 31, 1000, 4097];
#[cfg(miri)]
const USER_SIZES: &[usize] = &[0, 1, 2, 3, 5, 31];
/// A large size of the copy and segment checks: `n`, or the smaller `under_miri` (which still
/// spans many vectors) under Miri.
const fn large(n: usize, under_miri: usize) -> usize {
    if cfg!(miri) { under_miri } else { n }
}
/// `(dst, src)` element offsets from a 16-byte boundary: equal (vector path, with a head when
/// non-zero) and different (scalar path).
const OFFSETS: [(usize, usize); 4] = [(0, 0), (1, 1), (3, 3), (1, 2)];
/// Emulated thread counts: one, a few, more than most sizes have elements.
const THREADS: [usize; 3] = [1, 5, large(256, 32)];

/// Checks `reduce`, `reduce3` and `finish` of one pair against the reference.
fn check_pair<T: Reference, O: ReduceOp<T>>(op_name: &str, rng: &mut Rng) {
    assert_eq!(O::NAME, op_name);
    for (k, &n) in SIZES.iter().enumerate() {
        let (dst_off, src_off) = OFFSETS[k % OFFSETS.len()];
        let threads = HostGrid::new(THREADS[k % THREADS.len()]);
        let a: Vec<T> = random_vec(rng, n);
        let b: Vec<T> = random_vec(rng, n);
        let expected: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| reference_combine(op_name, x, y)).collect();
        let context =
            || format!("{}/{op_name}: n={n} offsets=({dst_off},{src_off}) threads={}", T::NAME, threads.threads());

        // dst = op(dst, src)
        let mut dst_buf = Aligned::zeroed((dst_off + n) * size_of::<T>());
        let mut src_buf = Aligned::zeroed((src_off + n) * size_of::<T>());
        dst_buf.elements::<T>(dst_off, n).copy_from_slice(&a);
        src_buf.elements::<T>(src_off, n).copy_from_slice(&b);
        threads.reduce::<T, O>(dst_buf.elements(dst_off, n), src_buf.elements(src_off, n));
        assert!(same_bits(dst_buf.elements::<T>(dst_off, n), &expected), "reduce {}", context());
        assert!(same_bits(src_buf.elements::<T>(src_off, n), &b), "reduce changed src: {}", context());

        // dst = op(a, b), with `a` at the source offset and `b` at the destination's.
        let mut out_buf = Aligned::zeroed((dst_off + n) * size_of::<T>());
        let mut a_buf = Aligned::zeroed((src_off + n) * size_of::<T>());
        let mut b_buf = Aligned::zeroed((dst_off + n) * size_of::<T>());
        a_buf.elements::<T>(src_off, n).copy_from_slice(&a);
        b_buf.elements::<T>(dst_off, n).copy_from_slice(&b);
        threads.reduce3::<T, O>(out_buf.elements(dst_off, n), a_buf.elements(src_off, n), b_buf.elements(dst_off, n));
        assert!(same_bits(out_buf.elements::<T>(dst_off, n), &expected), "reduce3 {}", context());

        // finish, for several rank counts
        for ranks in [1u32, 2, 3, 7] {
            let mut buf = Aligned::zeroed((dst_off + n) * size_of::<T>());
            buf.elements::<T>(dst_off, n).copy_from_slice(&expected);
            threads.finish::<T, O>(buf.elements(dst_off, n), ranks);
            let finished: Vec<T> = expected.iter().map(|&x| reference_finish(op_name, x, ranks)).collect();
            assert!(same_bits(buf.elements::<T>(dst_off, n), &finished), "finish ranks={ranks} {}", context());
        }
    }
}

/// Every pair natively. Miri, which checks how memory is accessed, gets each element's first
/// operator: the accesses (heads, vectors, tails, offsets, threads) depend on the element's
/// size and alignment, not on the operator, which is safe code combining two values.
macro_rules! sweep_builtin_pairs {
    ($rng:expr, $checked:expr; $($elem:ty = $elem_name:literal => [$($op:ty = $op_name:literal),+ $(,)?]);+ $(;)?) => {
        $(
            let mut first = true;
            $(
                assert_eq!(<$elem as Element>::NAME, $elem_name);
                if first || !cfg!(miri) {
                    check_pair::<$elem, $op>($op_name, $rng);
                }
                first = false;
                *$checked += 1;
            )+
            let _ = first;
        )+
    };
}

#[test]
fn every_builtin_pair_matches_the_reference() {
    let (mut rng, mut checked) = (Rng(0x9e37_79b9_7f4a_7c15), 0);
    duralumin_kernels::builtin_reduce_pairs!(sweep_builtin_pairs, &mut rng, &mut checked;);
    assert_eq!(checked, 12 * 8 + 8 * 3);
    assert_eq!(checked, duralumin_kernels::BUILTIN_REDUCE_PAIRS.len());
}

#[test]
fn reduce3_may_write_over_an_input() {
    let a: Vec<i32> = (0..1001).collect();
    let b: Vec<i32> = (0..1001).map(|i| 3 * i).collect();
    let mut dst = a.clone();
    let (d, y, n) = (dst.as_mut_ptr(), b.as_ptr(), dst.len());
    HostGrid::new(7).run(|t| {
        // SAFETY: `dst` and `b` hold `n` elements; `dst` doubles as input `a`, which reduce3
        // allows.
        unsafe { duralumin_kernels::reduce::reduce3::<i32, Sum, _>(t, d, d, y, n) }
    });
    assert!(dst.iter().enumerate().all(|(i, &x)| x == 4 * i as i32));
}

/// A 3-byte element: never moved in vectors.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Rgb {
    r: u8,
    g: u8,
    b: u8,
}

impl Element for Rgb {
    const NAME: &'static str = "rgb";
}

impl ReduceOp<Rgb> for Max {
    const NAME: &'static str = "max";
    fn combine(a: Rgb, b: Rgb) -> Rgb {
        Rgb { r: a.r.max(b.r), g: a.g.max(b.g), b: a.b.max(b.b) }
    }
}

/// An 8-byte element with 4-byte alignment: vectors only at matching 8-byte phases.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Pair {
    lo: f32,
    hi: f32,
}

impl Element for Pair {
    const NAME: &'static str = "pair";
}

impl ReduceOp<Pair> for Sum {
    const NAME: &'static str = "sum";
    fn combine(a: Pair, b: Pair) -> Pair {
        Pair { lo: a.lo + b.lo, hi: a.hi + b.hi }
    }
}

/// A 24-byte element.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Triple([u64; 3]);

impl Element for Triple {
    const NAME: &'static str = "triple";
}

/// An operator with a finishing step that is not a division: counts contributions in lane 2.
#[derive(Clone, Copy, Debug, Default)]
struct Tally;

impl ReduceOp<Triple> for Tally {
    const NAME: &'static str = "tally";
    const HAS_FINISH: bool = true;
    fn combine(a: Triple, b: Triple) -> Triple {
        Triple([a.0[0].wrapping_add(b.0[0]), a.0[1] ^ b.0[1], a.0[2]])
    }
    fn finish(x: Triple, ranks: u32) -> Triple {
        Triple([x.0[0], x.0[1], u64::from(ranks)])
    }
}

/// Checks a user pair against its own `combine` applied element by element, at every size,
/// offset pair (in bytes, since user elements may be odd-sized) and thread count.
fn check_user_pair<T: Element + PartialEq, O: ReduceOp<T>>(make: impl Fn(u64) -> T) {
    for &n in USER_SIZES {
        for (dst_off, src_off) in OFFSETS {
            for threads in THREADS {
                let grid = HostGrid::new(threads);
                let a: Vec<T> = (0..n as u64).map(&make).collect();
                let b: Vec<T> = (0..n as u64).map(|i| make(i * 7 + 3)).collect();
                let expected: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| O::combine(x, y)).collect();
                let mut d = Aligned::zeroed((dst_off + n) * size_of::<T>());
                let mut s = Aligned::zeroed((src_off + n) * size_of::<T>());
                d.elements::<T>(dst_off, n).copy_from_slice(&a);
                s.elements::<T>(src_off, n).copy_from_slice(&b);
                grid.reduce::<T, O>(d.elements(dst_off, n), s.elements(src_off, n));
                assert!(
                    d.elements::<T>(dst_off, n) == &expected[..],
                    "{} n={n} offsets=({dst_off},{src_off})",
                    T::NAME
                );
                grid.finish::<T, O>(d.elements(dst_off, n), 4);
                let finished: Vec<T> = expected.iter().map(|&x| O::finish(x, 4)).collect();
                assert!(d.elements::<T>(dst_off, n) == &finished[..], "{} finish n={n}", T::NAME);
            }
        }
    }
}

#[test]
fn user_elements_of_odd_sizes_and_alignments() {
    check_user_pair::<Rgb, Max>(|i| Rgb { r: i as u8, g: (i * 3) as u8, b: (i >> 3) as u8 });
    check_user_pair::<Pair, Sum>(|i| Pair { lo: (i % 100) as f32, hi: -((i % 7) as f32) });
    check_user_pair::<Triple, Tally>(|i| Triple([i, i.rotate_left(17), 0]));
}

#[test]
fn copy_2d_packs_unpacks_and_restrides() {
    let mut rng = Rng(7);
    // (row_bytes, rows, src_pitch, dst_pitch, src_offset, dst_offset)
    let shapes = [
        (0, 5, 8, 0, 0, 0),
        (16, 0, 32, 16, 0, 0),
        (1, 1, 1, 1, 0, 0),
        (12, 7, 20, 12, 0, 0),
        (64, 33, 96, 64, 0, 0),
        (64, 33, 96, 64, 3, 3),
        (64, 33, 96, 64, 1, 2),
        (37, 101, 40, 37, 5, 0),
        (large(4096, 256), 17, large(8192, 512), large(4096, 256), 16, 32),
        (24, large(1000, 60), 24, 100, 8, 4),
    ];
    for (row_bytes, rows, src_pitch, dst_pitch, src_off, dst_off) in shapes {
        let src_len = src_off + rows * src_pitch.max(row_bytes);
        let dst_len = dst_off + rows * dst_pitch.max(row_bytes);
        let mut src = Aligned::zeroed(src_len);
        for b in src.bytes().iter_mut() {
            *b = rng.next() as u8;
        }
        let src_bytes = src.bytes()[src_off..src_len].to_vec();
        let mut expected = vec![0u8; dst_len - dst_off];
        for r in 0..rows {
            expected[r * dst_pitch..r * dst_pitch + row_bytes]
                .copy_from_slice(&src_bytes[r * src_pitch..r * src_pitch + row_bytes]);
        }
        for threads in THREADS {
            let mut dst = Aligned::zeroed(dst_len);
            HostGrid::new(threads).copy_2d(
                &mut dst.bytes()[dst_off..dst_len],
                dst_pitch,
                &src_bytes,
                src_pitch,
                row_bytes,
                rows,
            );
            assert_eq!(&dst.bytes()[dst_off..dst_len], &expected[..], "{row_bytes}x{rows} threads={threads}");
            // The same with each thread reading 4 items before writing them (the mover's copy).
            let mut dst = Aligned::zeroed(dst_len);
            let (d, s) = (dst.bytes()[dst_off..].as_mut_ptr(), src_bytes.as_ptr());
            // SAFETY: as `HostGrid::copy_2d` checks above for the same shape: every row inside
            // its buffer, destination rows apart, two distinct buffers.
            HostGrid::new(threads).run(|t| unsafe {
                duralumin_kernels::pack::copy_2d_unrolled::<_, 4>(t, d, dst_pitch, s, src_pitch, row_bytes, rows)
            });
            assert_eq!(&dst.bytes()[dst_off..dst_len], &expected[..], "unrolled {row_bytes}x{rows} threads={threads}");
        }
    }
}

#[test]
fn segments_pack_and_unpack_in_one_launch() {
    let mut rng = Rng(11);
    // A v-collective's blocks: empty ones, odd lengths and offsets, and large ones.
    let lists: Vec<Vec<Segment>> = vec![
        vec![],
        vec![Segment::new(0, 0)],
        vec![Segment::new(3, 1)],
        vec![Segment::new(0, 64), Segment::new(64, 0), Segment::new(80, 48)],
        vec![
            Segment::new(1, 17),
            Segment::new(40, 3),
            Segment::new(43, 100),
            Segment::new(200, 0),
            Segment::new(201, 55),
        ],
        (0..large(37, 5) as u64).map(|k| Segment::new(k * 1000 + k % 5, 513 + (k * 97) % 400)).collect(),
        {
            let big = large(1 << 20, 4096) as u64;
            vec![Segment::new(16, big), Segment::new(big + 48, large(12_345, 345) as u64)]
        },
    ];
    for segments in lists {
        let scattered_len = segments.iter().map(|s| (s.offset + s.len) as usize).max().unwrap_or(0) + 16;
        let total: usize = segments.iter().map(|s| s.len as usize).sum();
        let mut scattered = Aligned::zeroed(scattered_len);
        for b in scattered.bytes().iter_mut() {
            *b = rng.next() as u8;
        }
        let source = scattered.bytes()[..scattered_len].to_vec();
        let expected: Vec<u8> = segments
            .iter()
            .flat_map(|s| source[s.offset as usize..(s.offset + s.len) as usize].iter().copied())
            .collect();
        // Unpacking restores the bytes inside the segments and leaves the rest zero.
        let restored: Vec<u8> = (0..scattered_len)
            .map(|i| {
                let inside = segments.iter().any(|s| (s.offset as usize..(s.offset + s.len) as usize).contains(&i));
                if inside { source[i] } else { 0 }
            })
            .collect();
        // Beside THREADS: two groups of lanes, the second short (the pack body deals tiles to
        // groups of 32 threads).
        for threads in THREADS.into_iter().chain([40]) {
            for packed_off in [0usize, 1, 4] {
                let grid = HostGrid::new(threads);
                let mut packed = Aligned::zeroed(packed_off + total);
                let written =
                    grid.pack_segments(&mut packed.bytes()[packed_off..packed_off + total], &source, &segments);
                assert_eq!(written, total);
                assert_eq!(&packed.bytes()[packed_off..packed_off + total], &expected[..], "pack threads={threads}");

                let mut back = Aligned::zeroed(scattered_len);
                let packed_bytes = packed.bytes()[packed_off..packed_off + total].to_vec();
                let read = grid.unpack_segments(&mut back.bytes()[..scattered_len], &packed_bytes, &segments);
                assert_eq!(read, total);
                let wrong = back.bytes()[..scattered_len].iter().zip(&restored).position(|(got, want)| got != want);
                assert_eq!(wrong, None, "unpack: the first wrong byte, threads={threads}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "outside the buffer")]
fn segments_outside_the_buffer_are_rejected() {
    let mut dst = [0u8; 8];
    HostGrid::SINGLE.pack_segments(&mut dst, &[0u8; 8], &[Segment::new(4, 8)]);
}

#[test]
fn stream_wait_returns_once_the_flag_is_reached() {
    let flag = Arc::new(AtomicU32::new(0));
    let setter = {
        let flag = Arc::clone(&flag);
        std::thread::spawn(move || {
            for v in 1..=5 {
                std::thread::sleep(Duration::from_millis(2));
                flag.store(v, Ordering::Release);
            }
        })
    };
    HostGrid::new(4).stream_wait(&flag, 5);
    assert_eq!(flag.load(Ordering::Acquire), 5);
    setter.join().unwrap();

    // Already reached, also across the wrap-around of the 32-bit counter.
    let wrapped = AtomicU32::new(3);
    HostGrid::SINGLE.stream_wait(&wrapped, u32::MAX - 2);
}

#[test]
fn signal_publishes_with_a_release_store() {
    let flag = AtomicU32::new(0);
    HostGrid::new(3).signal(&flag, 42);
    assert_eq!(flag.load(Ordering::Acquire), 42);
}

/// Hooks of a mover run on host threads: waits poll (giving up after a deadline, so a wrong
/// schedule fails rather than hangs).
struct PollingHooks;

impl duralumin_kernels::mover::Hooks for PollingHooks {
    fn wait_until<F: Fn() -> bool>(&self, ready: F, value: u64) {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(std::time::Instant::now() < end, "the mover waited 20 s for a counter to reach {value}");
            std::thread::yield_now();
        }
    }
}

/// Hooks of a mover block whose copies are slow (a millisecond each): a block that handed a
/// chunk on without waiting for them would hand it on before they are done.
struct SlowCopies;

impl duralumin_kernels::mover::Hooks for SlowCopies {
    fn wait_until<F: Fn() -> bool>(&self, ready: F, value: u64) {
        PollingHooks.wait_until(ready, value);
    }

    fn copy<F: FnOnce()>(&self, _bytes: usize, _to_host: bool, copy: F) {
        std::thread::sleep(Duration::from_millis(1));
        copy();
    }
}

/// One mover case: 1000 `u32`s in chunks of 64 through a ring of 8 cells of 256 bytes, placed
/// after 5 earlier chunks; a host thread plays the proxy (result = 2 × input + 1, or checks
/// what a send-only operation staged) and hands the cells back in order. The mover runs as
/// `blocks` blocks at once, each as one body or as two sides (the copies of every block but the
/// first slow).
fn mover_case(early: bool, in_place: bool, sides: bool, blocks: usize) {
    use duralumin_kernels::mover::{self, Hooks, Place, Rows, Schedule, Share, Side};
    let (count, chunk_elems, sz) = (1000usize, 64usize, 4usize);
    let input: Vec<u32> = (0..count as u32).map(|i| i * 3 + 7).collect();
    let mut output = vec![0u32; count];
    // Words, so the cells are aligned as pinned memory is.
    let mut ring = vec![0u64; 8 * 256 / 8];
    // One pointer for the mover and the proxy alike (a second borrow would end the first).
    let ring_at = ring.as_mut_ptr() as usize;
    let counters: Vec<AtomicU32> = (0..5).map(|_| AtomicU32::new(0)).collect();
    let [staged, out_flag, drained, free, done] = &counters[..] else { unreachable!() };
    // The blocks' arrival words, input side then output side, left as an earlier mover would.
    let words: Vec<AtomicU64> = (0..2 * mover::MAX_BLOCKS).map(|_| AtomicU64::new(3)).collect();
    let send_parts = usize::from(!in_place);
    let span = if send_parts == 1 && !early { 2 } else { 1 };
    let place = Place { first: 5, pos: 6, skipped: 6, span, cells: 8, cell_bytes: 256 };
    for (c, v) in [(staged, 5), (out_flag, 5), (drained, 5), (free, 6)] {
        c.store(v, Ordering::Relaxed);
    }
    let addr = |p: *const u8| p as u64;
    let flag = |c: &AtomicU32| addr(c.as_ptr().cast());
    let rows = |ptr: u64| Rows { ptr, parts: 1, len: count, pitch: count };
    let s = Schedule {
        place,
        ring: ring_at as u64,
        sz,
        chunk_elems,
        count,
        chunks: count.div_ceil(chunk_elems),
        send_parts,
        input: rows(addr(input.as_ptr().cast())),
        input_at: usize::from(in_place),
        output: if early { Rows::default() } else { rows(addr(output.as_mut_ptr().cast())) },
        early: u32::from(early),
        after: 5,
        staged: flag(staged),
        output_flag: flag(out_flag),
        drained: flag(drained),
        free: flag(free),
        done: flag(done),
        arrived_in: addr(words.as_ptr().cast()),
        arrived_out: addr(words[mover::MAX_BLOCKS..].as_ptr().cast()),
    };
    let mut seen = Vec::new();
    std::thread::scope(|scope| {
        let run = |side, block| {
            let share = Share { block, blocks };
            // SAFETY: every address of the schedule is one of the buffers above, alive until the
            // scope ends; the proxy below raises every counter the mover waits for; every block
            // runs at once.
            HostGrid::SINGLE.run(|t| unsafe {
                if block == 0 {
                    mover::run(t, &s, &PollingHooks, side, share);
                } else {
                    mover::run(t, &s, &SlowCopies, side, share);
                }
            })
        };
        for block in 0..blocks {
            if sides {
                scope.spawn(move || run(Side::Input, block));
                scope.spawn(move || run(Side::Output, block));
            } else {
                scope.spawn(move || run(Side::Both, block));
            }
        }
        // The proxy: each chunk's "MPI part" on its cells, then its cells back in order.
        for k in 0..s.chunks {
            PollingHooks.wait(staged, place.flag(k));
            let len = s.len_of(k);
            let cell = (ring_at + place.offset(k) as usize) as *mut u32;
            // The chunk's input: its send area, or (in place) its receive area.
            let (input_at, recv_at) = (if in_place { send_parts * len } else { 0 }, send_parts * len);
            // SAFETY: the chunk's cells lie in `ring` (span × 256 bytes from its offset), and the
            // mover leaves them to this thread between *staged* and *output*; the input is read
            // into a vector before the receive area is written.
            unsafe {
                let from = std::slice::from_raw_parts(cell.add(input_at), len).to_vec();
                if early {
                    seen.extend_from_slice(&from);
                } else {
                    let recv = std::slice::from_raw_parts_mut(cell.add(recv_at), len);
                    for (r, x) in recv.iter_mut().zip(from) {
                        *r = 2 * x + 1;
                    }
                }
            }
            out_flag.store(place.flag(k), Ordering::Release);
            if !early {
                PollingHooks.wait(drained, place.flag(k));
            }
            free.store(duralumin_kernels::mover::low(place.end(k)), Ordering::Release);
        }
        PollingHooks.wait(done, 1);
    });
    let what = format!("early {early}, in place {in_place}, sides {sides}, blocks {blocks}");
    let first_wrong = |got: &[u32], want: &[u32]| {
        (got.len() != want.len()).then_some(got.len()).or_else(|| got.iter().zip(want).position(|(g, w)| g != w))
    };
    if early {
        assert_eq!(first_wrong(&seen, &input), None, "{what}: what the mover staged differs from there");
    } else {
        let want: Vec<u32> = input.iter().map(|x| 2 * x + 1).collect();
        assert_eq!(first_wrong(&output, &want), None, "{what}: what the mover copied back differs from there");
        assert_eq!(drained.load(Ordering::Acquire), place.flag(s.chunks - 1), "{what}: drained");
    }
    assert_eq!(staged.load(Ordering::Acquire), place.flag(s.chunks - 1), "{what}: staged");
    // Every block other than 0 said it copied its share of the last chunk (chunk numbers are
    // the communicator's, from 5 here); the output side's words only where there is one.
    let last = 5 + s.chunks as u64;
    for (b, word) in words.iter().enumerate() {
        let (side, block) = (b / mover::MAX_BLOCKS, b % mover::MAX_BLOCKS);
        let wrote = block > 0 && block < blocks && blocks > 1 && (side == 0 || !early);
        let want = if wrote { last } else { 3 };
        assert_eq!(word.load(Ordering::Acquire), want, "{what}: arrival word {block} of side {side}");
    }
}

/// The mover runs every chunk of a schedule through the ring, wrapping around it, as one body
/// (`Side::Both`, the host device's) and as two sides at once (a GPU block's halves, cudasim's
/// two threads), as one block and as three blocks that copy a share of every chunk (a chunk
/// handed to the proxy only once every block copied its share): out of place, in place, and
/// send-only.
#[test]
#[cfg_attr(
    miri,
    ignore = "a schedule carries device addresses as integers: scripts/miri.sh runs it with permissive provenance"
)]
fn the_mover_streams_every_chunk_through_the_ring() {
    for (early, in_place) in [(false, false), (false, true), (true, false)] {
        for (sides, blocks) in [(false, 1), (true, 1), (false, 3), (true, 3)] {
            mover_case(early, in_place, sides, blocks);
        }
    }
}
