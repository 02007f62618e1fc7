//! Modules and kernels: PTX is read for its entry points and their parameter counts, and a
//! launch of one of Duralumin's builtin kernels runs its body from `duralumin-kernels` on the
//! CPU, after checking every address it will touch. A user's reduce and finish kernels (a
//! kernel crate's) run the host body the process hands over with
//! [`cudasimRegisterHostKernel`] (Duralumin does, before it loads such a kernel); any other
//! entry point loads but fails to launch with `CUDA_ERROR_NOT_SUPPORTED`.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::mover::{self, Schedule};
use duralumin_kernels::pack::Segment;
use duralumin_kernels::{Element, ReduceOp, flag, names::fixed, pack, reduce};

use crate::{Fault, exec, memory, timing, usize_of};

/// What a kernel is (a builtin one, or a user's with a host body), with its element size where
/// it has one.
#[derive(Clone, Copy)]
pub(crate) enum Body {
    Reduce { size: usize, run: ReduceRun },
    Reduce3 { size: usize, run: Reduce3 },
    Finish { size: usize, run: FinishRun },
    Copy2d,
    Pack,
    Unpack,
    StreamWait,
    Signal,
    Mover,
}

type Reduce2 = unsafe fn(HostGrid, *mut u8, *const u8, usize);
type Reduce3 = unsafe fn(HostGrid, *mut u8, *const u8, *const u8, usize);
type Finish = unsafe fn(HostGrid, *mut u8, usize, u32);
/// A user's reduce kernel's host body: `dst[..n] = combine(dst[..n], src[..n])`.
type HostReduce = unsafe extern "C" fn(*mut u8, *const u8, usize);
/// A user's finish kernel's host body: `dst[..n] = finish(dst[..n], ranks)`.
type HostFinish = unsafe extern "C" fn(*mut u8, usize, u32);

/// A reduce kernel's body: a builtin's (over the launch's grid) or a user's host body.
#[derive(Clone, Copy)]
pub(crate) enum ReduceRun {
    Builtin(Reduce2),
    User(HostReduce),
}

impl ReduceRun {
    /// # Safety
    /// As the kernel: `dst` and `src` hold `n` elements, not overlapping.
    unsafe fn call(self, g: HostGrid, dst: *mut u8, src: *const u8, n: usize) {
        // SAFETY: forwarded.
        unsafe {
            match self {
                ReduceRun::Builtin(run) => run(g, dst, src, n),
                ReduceRun::User(run) => run(dst, src, n),
            }
        }
    }
}

/// A finish kernel's body: a builtin's or a user's host body.
#[derive(Clone, Copy)]
pub(crate) enum FinishRun {
    Builtin(Finish),
    User(HostFinish),
}

impl FinishRun {
    /// # Safety
    /// As the kernel: `dst` holds `n` elements.
    unsafe fn call(self, g: HostGrid, dst: *mut u8, n: usize, ranks: u32) {
        // SAFETY: forwarded.
        unsafe {
            match self {
                FinishRun::Builtin(run) => run(g, dst, n, ranks),
                FinishRun::User(run) => run(dst, n, ranks),
            }
        }
    }
}

impl Body {
    /// The kernel's parameters: their number (each is 8 bytes but the trailing `u32` of
    /// finish, stream-wait and signal).
    fn params(self) -> usize {
        match self {
            Body::Reduce { .. } | Body::Finish { .. } => 3,
            Body::Reduce3 { .. } | Body::Pack | Body::Unpack => 4,
            Body::Copy2d => 6,
            Body::StreamWait | Body::Signal => 2,
            Body::Mover => Schedule::WORDS,
        }
    }

    /// Whether the last parameter is a `u32` (the rest are 8 bytes wide).
    fn narrow_last(self) -> bool {
        matches!(self, Body::Finish { .. } | Body::StreamWait | Body::Signal)
    }

    /// Each parameter's width in bytes.
    fn widths(self) -> Vec<usize> {
        let n = self.params();
        (0..n).map(|i| if self.narrow_last() && i + 1 == n { 4 } else { 8 }).collect()
    }
}

/// # Safety
/// As [`reduce::reduce`] for `T`.
unsafe fn reduce2<T: Element, O: ReduceOp<T>>(g: HostGrid, dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: forwarded; the launch checked both ranges.
    g.run(|t| unsafe { reduce::reduce::<T, O, _>(t, dst.cast(), src.cast(), n) });
}

/// # Safety
/// As [`reduce::reduce3`] for `T`.
unsafe fn reduce3<T: Element, O: ReduceOp<T>>(g: HostGrid, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
    // SAFETY: forwarded; the launch checked the three ranges.
    g.run(|t| unsafe { reduce::reduce3::<T, O, _>(t, dst.cast(), a.cast(), b.cast(), n) });
}

/// # Safety
/// As [`reduce::finish`] for `T`.
unsafe fn finish<T: Element, O: ReduceOp<T>>(g: HostGrid, dst: *mut u8, n: usize, ranks: u32) {
    // SAFETY: forwarded; the launch checked the range.
    g.run(|t| unsafe { reduce::finish::<T, O, _>(t, dst.cast(), n, ranks) });
}

macro_rules! reduce_table {
    ($table:ident; $($elem:ty = $en:literal => [$($op:ty = $on:literal),+ $(,)?]);+ $(;)?) => {
        $($(
            $table.insert(
                concat!("duralumin_reduce_", $en, "_", $on),
                Body::Reduce { size: size_of::<$elem>(), run: ReduceRun::Builtin(reduce2::<$elem, $op>) },
            );
            $table.insert(
                concat!("duralumin_reduce3_", $en, "_", $on),
                Body::Reduce3 { size: size_of::<$elem>(), run: reduce3::<$elem, $op> },
            );
            $table.insert(
                concat!("duralumin_finish_", $en, "_", $on),
                Body::Finish { size: size_of::<$elem>(), run: FinishRun::Builtin(finish::<$elem, $op>) },
            );
        )+)+
    };
}

/// Every builtin kernel by entry name.
fn builtins() -> &'static HashMap<&'static str, Body> {
    static TABLE: OnceLock<HashMap<&'static str, Body>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = HashMap::new();
        duralumin_kernels::builtin_reduce_pairs!(reduce_table, table;);
        table.insert(fixed::COPY_2D, Body::Copy2d);
        table.insert(fixed::PACK_SEGMENTS, Body::Pack);
        table.insert(fixed::UNPACK_SEGMENTS, Body::Unpack);
        table.insert(fixed::STREAM_WAIT, Body::StreamWait);
        table.insert(fixed::SIGNAL, Body::Signal);
        table.insert(fixed::MOVER, Body::Mover);
        table
    })
}

/// User kernels' host bodies by entry name, as the process registered them.
static USER: Mutex<Option<HashMap<String, Body>>> = Mutex::new(None);

/// `kind` of [`cudasimRegisterHostKernel`]: a reduce kernel, `body` an
/// `unsafe extern "C" fn(dst: *mut u8, src: *const u8, n: usize)`.
pub const HOST_REDUCE: c_int = 0;
/// `kind` of [`cudasimRegisterHostKernel`]: a finish kernel, `body` an
/// `unsafe extern "C" fn(dst: *mut u8, n: usize, ranks: u32)`.
pub const HOST_FINISH: c_int = 1;

/// Registers the host body of the user kernel `name` (a kernel crate's reduce or finish entry
/// point over elements of `elem_size` bytes): a launch of `name` from a module whose PTX has
/// it then checks its ranges as for a builtin and runs `body` on the CPU. The body is the
/// process's own compiled `combine`, so the simulator checks everything around a user kernel
/// (arguments, ranges, stream order) but not the PTX the GPU would run. Builtin names are
/// accepted and ignored (the simulator has their bodies). A later registration of `name`
/// replaces the earlier. Returns `CUDA_SUCCESS`, or `CUDA_ERROR_INVALID_VALUE` for a null or
/// non-UTF-8 name, a null body, an unknown `kind` or a zero `elem_size`.
///
/// # Safety
/// `name` is null or a NUL-terminated string; `body` is null or a function of `kind`'s
/// signature that stays valid for the process's life and, given ranges holding `n` elements
/// of `elem_size` bytes, touches nothing else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cudasimRegisterHostKernel(
    name: *const c_char,
    kind: c_int,
    elem_size: usize,
    body: *const c_void,
) -> c_int {
    const INVALID_VALUE: c_int = 1;
    if name.is_null() || body.is_null() || elem_size == 0 {
        return INVALID_VALUE;
    }
    // SAFETY: a non-null NUL-terminated string (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else { return INVALID_VALUE };
    let entry = match kind {
        HOST_REDUCE => {
            // SAFETY: `body` is a non-null function of this kind's signature (the caller's
            // contract).
            let run = unsafe { std::mem::transmute::<*const c_void, HostReduce>(body) };
            Body::Reduce { size: elem_size, run: ReduceRun::User(run) }
        }
        HOST_FINISH => {
            // SAFETY: as above.
            let run = unsafe { std::mem::transmute::<*const c_void, HostFinish>(body) };
            Body::Finish { size: elem_size, run: FinishRun::User(run) }
        }
        _ => return INVALID_VALUE,
    };
    if !builtins().contains_key(name) {
        USER.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert_with(HashMap::new).insert(name.into(), entry);
    }
    0
}

/// The body of `name`: a builtin's, or a user kernel's registered host body.
fn body_of(name: &str) -> Option<Body> {
    builtins()
        .get(name)
        .copied()
        .or_else(|| USER.lock().unwrap_or_else(PoisonError::into_inner).as_ref().and_then(|m| m.get(name).copied()))
}

/// A loaded module: its entry points with their parameters' widths, and its launches not yet
/// run.
pub(crate) struct Module {
    entries: HashMap<String, Vec<usize>>,
    pub(crate) pending: AtomicUsize,
}

/// A kernel of a module.
pub(crate) struct Function {
    pub(crate) name: String,
    pub(crate) module: Arc<Module>,
    body: Option<Body>,
}

/// The width in bytes of a PTX parameter's type (`.u64`, `.b32`…); 0 for others (arrays).
fn width(param: &str) -> usize {
    match param.split_whitespace().nth(1).unwrap_or("") {
        ".u64" | ".s64" | ".b64" | ".f64" => 8,
        ".u32" | ".s32" | ".b32" | ".f32" => 4,
        ".u16" | ".s16" | ".b16" | ".f16" => 2,
        ".u8" | ".s8" | ".b8" => 1,
        _ => 0,
    }
}

/// Reads a PTX module's `.entry` points and their parameters' widths.
pub(crate) fn parse_ptx(text: &str) -> Result<Module, Fault> {
    if !text.contains(".version") || !text.contains(".target") {
        return Err(Fault::ptx("not PTX (no .version or .target directive)".into()));
    }
    let mut entries = HashMap::new();
    let mut rest = text;
    while let Some(at) = rest.find(".entry") {
        rest = &rest[at + ".entry".len()..];
        let open = rest.find('(').ok_or_else(|| Fault::ptx("an .entry without parameters".into()))?;
        let name = rest[..open].trim().to_string();
        let close = rest[open..].find(')').ok_or_else(|| Fault::ptx(format!("{name}: unclosed parameter list")))?;
        let list = &rest[open + 1..open + close];
        let params: Vec<usize> = list.split(',').filter(|p| p.contains(".param")).map(|p| width(p.trim())).collect();
        entries.insert(name, params);
        rest = &rest[open + close..];
    }
    Ok(Module { entries, pending: AtomicUsize::new(0) })
}

impl Module {
    /// The entry point `name`: it must be in the PTX, and a kernel with a body must take as
    /// many parameters there as its body does (a launch passes that many).
    pub(crate) fn function(self: &Arc<Self>, name: &str) -> Result<Function, Fault> {
        if !self.entries.contains_key(name) {
            return Err(Fault::not_found(format!("no entry point {name} in the module")));
        }
        let body = body_of(name).map(|b| self.check_params(name, b)).transpose()?;
        Ok(Function { name: name.to_string(), module: Arc::clone(self), body })
    }

    /// `body` if its parameters are those of the entry point `name` in the PTX.
    fn check_params(&self, name: &str, body: Body) -> Result<Body, Fault> {
        let params = self.entries.get(name).map(Vec::as_slice).unwrap_or_default();
        if body.widths() != params {
            return Err(Fault::ptx(format!(
                "{name} takes parameters of {params:?} bytes in the PTX, {:?} in its body",
                body.widths()
            )));
        }
        Ok(body)
    }
}

/// Launch parameters: the array of pointers to each argument.
pub(crate) struct Params(pub(crate) *mut *mut std::ffi::c_void);

impl Params {
    /// Argument `i` as a `u64` (pointers and `usize`).
    ///
    /// # Safety
    /// The launch passes at least `i + 1` arguments and argument `i` is 8 bytes.
    unsafe fn u64(&self, i: usize) -> u64 {
        // SAFETY: guaranteed by the caller (cuLaunchKernel's contract for this kernel).
        unsafe { (*self.0.add(i)).cast::<u64>().read_unaligned() }
    }

    /// Argument `i` as a `u32`.
    ///
    /// # Safety
    /// As [`Params::u64`], for a 4-byte argument.
    unsafe fn u32(&self, i: usize) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.0.add(i)).cast::<u32>().read_unaligned() }
    }
}

fn bytes(n: u64, size: usize, what: &str) -> Result<usize, Fault> {
    usize_of(n).checked_mul(size).ok_or_else(|| Fault::illegal(format!("{what}: {n} elements overflow")))
}

/// A launch's narrow last argument (see [`Body::narrow_last`]), read as a `u32`, so it fits.
fn narrow_arg(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The segments of a pack or unpack launch, read from device memory, and their total length.
fn segments(list: u64, count: u64, scattered: u64, name: &str) -> Result<(Vec<Segment>, usize), Fault> {
    let len = bytes(count, size_of::<Segment>(), name)?;
    memory::device_range(list, len, &format!("{name} (segment list)"))?;
    // SAFETY: the list lies in live device memory (checked) and segments are plain data.
    let segs: Vec<Segment> =
        (0..usize_of(count)).map(|k| unsafe { (list as *const Segment).add(k).read_unaligned() }).collect();
    let mut total = 0usize;
    for (k, s) in segs.iter().enumerate() {
        let at =
            scattered.checked_add(s.offset).ok_or_else(|| Fault::illegal(format!("{name}: segment {k} overflows")))?;
        memory::device_range(at, usize_of(s.len), &format!("{name} (segment {k})"))?;
        total += usize_of(s.len);
    }
    Ok((segs, total))
}

/// A launch's geometry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Launch {
    pub(crate) blocks: usize,
    /// Threads per block.
    pub(crate) threads: usize,
    /// Every block resident at once (a cooperative launch).
    pub(crate) together: bool,
}

/// Reads a launch's arguments, checks every address the kernel will touch, and returns the work
/// that runs it.
///
/// # Safety
/// `params` holds the function's arguments, as `cuLaunchKernel` requires.
pub(crate) unsafe fn launch(f: &Function, params: &Params, shape: Launch) -> Result<exec::Work, Fault> {
    let threads = shape.blocks * shape.threads;
    let name = f.name.clone();
    // A user kernel's host body may have been registered after the function was loaded.
    let body = match f.body {
        Some(body) => body,
        None => match body_of(&name) {
            Some(body) => f.module.check_params(&name, body)?,
            None => {
                return Err(Fault::not_supported(format!(
                    "{name} is neither one of Duralumin's builtin kernels nor a user kernel with a \
                     registered host body (cudasimRegisterHostKernel); the simulator runs only those"
                )));
            }
        },
    };
    let g = HostGrid::new(threads);
    // The arguments are read now; the addresses are checked when the kernel runs (memory may
    // be written, or freed, by work queued before it), as a GPU faults only then.
    let n_params = body.params();
    let narrow = body.narrow_last();
    let mut a = [0u64; 6];
    // The mover's arguments are its schedule's words, read below.
    let scalars = if matches!(body, Body::Mover) { 0 } else { n_params };
    for (i, arg) in a.iter_mut().enumerate().take(scalars) {
        // SAFETY: the caller guarantees the arguments, whose number and sizes `Body::params`
        // gives (the last one a `u32` for finish and the flag kernels), which the PTX confirmed
        // when the function was loaded.
        *arg = unsafe { if narrow && i + 1 == n_params { u64::from(params.u32(i)) } else { params.u64(i) } };
    }
    let work: exec::Work = {
        match body {
            Body::Reduce { size, run } => {
                let (dst, src, n) = (a[0], a[1], a[2]);
                Box::new(move || {
                    let len = bytes(n, size, &name)?;
                    memory::device_range(dst, len, &name)?;
                    memory::device_range(src, len, &name)?;
                    // SAFETY: both ranges are live device-accessible memory (checked).
                    unsafe { run.call(g, dst as *mut u8, src as *const u8, usize_of(n)) };
                    Ok(())
                })
            }
            Body::Reduce3 { size, run } => {
                let (dst, x, y, n) = (a[0], a[1], a[2], a[3]);
                Box::new(move || {
                    let len = bytes(n, size, &name)?;
                    for p in [dst, x, y] {
                        memory::device_range(p, len, &name)?;
                    }
                    // SAFETY: as for reduce.
                    unsafe { run(g, dst as *mut u8, x as *const u8, y as *const u8, usize_of(n)) };
                    Ok(())
                })
            }
            Body::Finish { size, run } => {
                let (dst, n, ranks) = (a[0], a[1], narrow_arg(a[2]));
                Box::new(move || {
                    memory::device_range(dst, bytes(n, size, &name)?, &name)?;
                    // SAFETY: as for reduce.
                    unsafe { run.call(g, dst as *mut u8, usize_of(n), ranks) };
                    Ok(())
                })
            }
            Body::Copy2d => {
                let (dst, dst_pitch, src, src_pitch, row, rows) = (a[0], a[1], a[2], a[3], a[4], a[5]);
                Box::new(move || {
                    if rows == 0 {
                        return Ok(());
                    }
                    let extent = |pitch: u64| (rows - 1).checked_mul(pitch).and_then(|x| x.checked_add(row));
                    let over = || Fault::illegal(format!("{name}: extent overflows"));
                    memory::device_range(dst, usize_of(extent(dst_pitch).ok_or_else(over)?), &name)?;
                    memory::device_range(src, usize_of(extent(src_pitch).ok_or_else(over)?), &name)?;
                    let (dp, sp, row, rows) = (usize_of(dst_pitch), usize_of(src_pitch), usize_of(row), usize_of(rows));
                    // SAFETY: every row of both sides is in live memory (checked).
                    g.run(|t| unsafe { pack::copy_2d(t, dst as *mut u8, dp, src as *const u8, sp, row, rows) });
                    Ok(())
                })
            }
            Body::Pack | Body::Unpack => {
                let (dst, src, list, count) = (a[0], a[1], a[2], a[3]);
                let unpack = matches!(body, Body::Unpack);
                Box::new(move || {
                    let (scattered, packed) = if unpack { (dst, src) } else { (src, dst) };
                    let (segs, total) = segments(list, count, scattered, &name)?;
                    memory::device_range(packed, total, &format!("{name} (packed side)"))?;
                    let (d, s, l, c) = (dst as *mut u8, src as *const u8, segs.as_ptr(), segs.len());
                    // SAFETY: every segment and the packed total lie in live memory (checked).
                    g.run(|t| unsafe {
                        if unpack { pack::unpack_segments(t, d, s, l, c) } else { pack::pack_segments(t, d, s, l, c) }
                    });
                    Ok(())
                })
            }
            Body::Mover => {
                check_mover_launch(shape, &name)?;
                let words = std::array::from_fn(|i| {
                    // SAFETY: the caller guarantees the arguments: the mover's are the schedule's
                    // `Schedule::WORDS` words, as many 8-byte parameters as the PTX confirmed
                    // when the function was loaded.
                    unsafe { params.u64(i) }
                });
                mover(Schedule::from_words(words), shape.blocks, name)
            }
            Body::StreamWait | Body::Signal => {
                let (ptr, value) = (a[0], narrow_arg(a[1]));
                let signal = matches!(body, Body::Signal);
                Box::new(move || {
                    memory::device_range(ptr, 4, &name)?;
                    if !ptr.is_multiple_of(4) {
                        return Err(Fault::illegal(format!("{name}: flag {ptr:#x} is not 4-byte aligned")));
                    }
                    // SAFETY: a live, aligned word of device-accessible memory (checked); flags
                    // are only accessed atomically.
                    let word = unsafe { AtomicU32::from_ptr(ptr as *mut u32) };
                    if signal {
                        word.store(value, Ordering::Release);
                    } else {
                        // One thread polls the flag, as the kernel does (sleeping between polls
                        // rather than burning a core the host threads need).
                        exec::device_wait(
                            || flag::reached(word.load(Ordering::Acquire), value),
                            || format!("{name}: flag {ptr:#x} to reach {value}"),
                        );
                    }
                    Ok(())
                })
            }
        }
    };
    Ok(work)
}

/// What a GPU needs of a mover's launch: blocks of [`mover::DEVICE_THREADS`] threads (its two
/// sides' barriers count on them), and every block resident at once when there are several
/// (they wait for each other's chunks: blocks launched plainly may run one after another, and
/// one would wait for a block that has not started).
fn check_mover_launch(shape: Launch, name: &str) -> Result<(), Fault> {
    if shape.threads != mover::DEVICE_THREADS as usize {
        return Err(Fault::invalid(format!(
            "{name} launched with {} threads per block: its barriers need {}",
            shape.threads,
            mover::DEVICE_THREADS
        )));
    }
    if shape.blocks > mover::MAX_BLOCKS {
        return Err(Fault::invalid(format!(
            "{name} launched as {} blocks: it has arrival words for {}",
            shape.blocks,
            mover::MAX_BLOCKS
        )));
    }
    if shape.blocks > 1 && !shape.together {
        return Err(Fault::invalid(format!(
            "{name} launched as {} blocks without a cooperative launch: its blocks wait for each other, so all \
             must be resident at once (cuLaunchCooperativeKernel)",
            shape.blocks
        )));
    }
    Ok(())
}

/// The mover's work: every address of its schedule checked when it runs, then the two sides of
/// each of its `blocks` blocks at once, as the two halves of a block run on a GPU, each side on
/// a thread of its own (a side's barrier needs its threads running at once; one thread does all
/// of their work), its waits as the stream-wait kernel's and its copies on the timing model's
/// engines.
fn mover(s: Schedule, blocks: usize, name: String) -> exec::Work {
    Box::new(move || {
        check_schedule(&s, blocks, &name)?;
        let hooks = MoverHooks { name: &name };
        let side = |side, block| {
            let share = mover::Share { block, blocks };
            // SAFETY: every range the schedule's copies touch and every counter lies in live
            // device-accessible memory (checked); counters are only accessed atomically; the
            // input side runs beside the output side, and every block beside the others.
            HostGrid::SINGLE.run(|t| unsafe { mover::run(t, &s, &hooks, side, share) });
        };
        std::thread::scope(|scope| {
            for block in 1..blocks {
                scope.spawn(move || side(mover::Side::Input, block));
                scope.spawn(move || side(mover::Side::Output, block));
            }
            scope.spawn(|| side(mover::Side::Input, 0));
            side(mover::Side::Output, 0);
        });
        Ok(())
    })
}

/// Checks every address a mover of schedule `s` and `blocks` blocks touches: its counters (and
/// arrival words, with several blocks), its rows, and each chunk's cells inside the ring.
fn check_schedule(s: &Schedule, blocks: usize, name: &str) -> Result<(), Fault> {
    let over = || Fault::illegal(format!("{name}: a range of the schedule overflows"));
    if blocks > 1 {
        for (what, at) in [("arrived_in", s.arrived_in), ("arrived_out", s.arrived_out)] {
            memory::device_range(at, mover::MAX_BLOCKS * 8, &format!("{name} ({what} words)"))?;
            if !at.is_multiple_of(8) {
                return Err(Fault::illegal(format!("{name}: the {what} words at {at:#x} are not 8-byte aligned")));
            }
        }
    }
    let counters =
        [("staged", s.staged), ("output", s.output_flag), ("drained", s.drained), ("free", s.free), ("done", s.done)];
    for (what, at) in counters {
        memory::device_range(at, 4, &format!("{name} ({what} counter)"))?;
        if !at.is_multiple_of(4) {
            return Err(Fault::illegal(format!("{name}: the {what} counter {at:#x} is not 4-byte aligned")));
        }
    }
    let ring = s.place.cells.checked_mul(s.place.cell_bytes).ok_or_else(over)?;
    memory::device_range(s.ring, usize_of(ring), &format!("{name} (ring)"))?;
    for (what, rows) in [("input", &s.input), ("output", &s.output)] {
        if rows.parts == 0 || rows.len == 0 {
            continue;
        }
        let extent = (rows.parts - 1)
            .checked_mul(rows.pitch)
            .and_then(|x| x.checked_add(rows.len))
            .and_then(|x| x.checked_mul(s.sz))
            .ok_or_else(over)?;
        memory::device_range(rows.ptr, extent, &format!("{name} ({what} rows)"))?;
    }
    for k in 0..s.chunks {
        // What the mover touches of chunk k's cells: its input rows in the send area (or in the
        // receive area from row `input_at - 1` on), its output rows in the receive area; each
        // row `len` elements apart, the last one the chunk's part of a row long.
        let len = s.len_of(k);
        let rows_end = |first: usize, rows: &mover::Rows| -> Option<usize> {
            if rows.parts == 0 {
                return Some(0);
            }
            let row = rows.chunk_len(k, s.chunk_elems);
            first.checked_add(rows.parts - 1)?.checked_mul(len)?.checked_add(row)?.checked_mul(s.sz)
        };
        let input_first = if s.input_at == 0 { 0 } else { s.send_parts + s.input_at - 1 };
        let end = rows_end(input_first, &s.input)
            .zip(rows_end(s.send_parts, &s.output))
            .map(|(a, b)| a.max(b))
            .ok_or_else(over)?;
        let cells = s.place.span.checked_mul(s.place.cell_bytes).ok_or_else(over)?;
        if s.place.offset(k).checked_add(end as u64).is_none_or(|e| e > ring) || end as u64 > cells {
            return Err(Fault::illegal(format!("{name}: chunk {k} ({end} bytes) runs past its cells or the ring")));
        }
    }
    Ok(())
}

/// The mover's hooks on the simulator.
struct MoverHooks<'a> {
    name: &'a str,
}

impl mover::Hooks for MoverHooks<'_> {
    fn wait_until<F: Fn() -> bool>(&self, ready: F, value: u64) {
        exec::device_wait(ready, || format!("{}: a counter to reach {value}", self.name));
    }

    fn copy<F: FnOnce()>(&self, bytes: usize, to_host: bool, copy: F) {
        timing::spend(if to_host { timing::Engine::ToHost } else { timing::Engine::ToDevice }, bytes, copy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mover launched as blocks of the wrong size, as more blocks than it has arrival words,
    /// or as several blocks that might not all be resident (not cooperatively), is refused.
    #[test]
    fn mover_launches_are_checked() {
        let shape = |blocks, threads, together| Launch { blocks, threads, together };
        let full = mover::DEVICE_THREADS as usize;
        assert!(check_mover_launch(shape(1, full, false), "m").is_ok());
        assert!(check_mover_launch(shape(4, full, true), "m").is_ok());
        assert!(check_mover_launch(shape(4, full, false), "m").is_err(), "blocks that wait for each other");
        assert!(check_mover_launch(shape(1, full / 2, false), "m").is_err(), "a block its barriers do not fit");
        let many = mover::MAX_BLOCKS + 1;
        assert!(check_mover_launch(shape(many, full, true), "m").is_err(), "more blocks than arrival words");
    }

    /// A mover's schedule is checked whole before it runs: its counters (and arrival words,
    /// with several blocks), its rows, and every chunk inside its cells and the ring.
    #[test]
    fn mover_schedules_are_checked() {
        use crate::memory::{Kind, alloc};
        let ring = alloc(4 * 256, Kind::Device).unwrap() as u64;
        let rows = alloc(1000 * 4, Kind::Device).unwrap() as u64;
        let flags = alloc(64, Kind::Device).unwrap() as u64;
        let words = alloc(2 * mover::MAX_BLOCKS * 8, Kind::Device).unwrap() as u64;
        let place = mover::Place { first: 0, pos: 0, skipped: 0, span: 1, cells: 4, cell_bytes: 256 };
        let good = Schedule {
            place,
            ring,
            sz: 4,
            chunk_elems: 64,
            count: 1000,
            chunks: 16,
            send_parts: 0,
            input: mover::Rows { ptr: rows, parts: 1, len: 1000, pitch: 1000 },
            input_at: 1,
            output: mover::Rows { ptr: rows, parts: 1, len: 1000, pitch: 1000 },
            early: 0,
            after: 0,
            staged: flags,
            output_flag: flags + 4,
            drained: flags + 8,
            free: flags + 12,
            done: flags + 16,
            arrived_in: 0,
            arrived_out: 0,
        };
        assert!(check_schedule(&good, 1, "m").is_ok());
        assert!(check_schedule(&good, 2, "m").is_err(), "several blocks without arrival words");
        let counted = Schedule { arrived_in: words, arrived_out: words + 8 * mover::MAX_BLOCKS as u64, ..good };
        assert!(check_schedule(&counted, 2, "m").is_ok());
        let short = Schedule { arrived_out: words + 8 * mover::MAX_BLOCKS as u64 + 8, ..counted };
        assert!(check_schedule(&short, 2, "m").is_err(), "arrival words past their allocation");
        let two_rows = Schedule { input: mover::Rows { parts: 2, ..good.input }, ..good };
        assert!(check_schedule(&two_rows, 1, "m").is_err(), "rows past the device buffer");
        let wide = Schedule { chunk_elems: 128, ..good };
        assert!(check_schedule(&wide, 1, "m").is_err(), "a chunk of 512 bytes in a cell of 256");
        let odd = Schedule { done: flags + 17, ..good };
        assert!(check_schedule(&odd, 1, "m").is_err(), "an unaligned counter");
        let outside = Schedule { ring: ring + 256, ..good };
        assert!(check_schedule(&outside, 1, "m").is_err(), "a ring past its block");
    }

    #[test]
    fn ptx_entries_and_parameter_counts() {
        let ptx = ".version 8.0\n.target sm_70\n.address_size 64\n\
            .visible .entry duralumin_signal(\n\t.param .u64 a,\n\t.param .u32 b\n)\n{ ret; }\n\
            .visible .entry duralumin_reduce_f32_sum(.param .u64 a, .param .u64 b)\n{ ret; }\n";
        let m = Arc::new(parse_ptx(ptx).unwrap());
        assert_eq!(m.entries.get("duralumin_signal"), Some(&vec![8, 4]));
        assert!(m.function("duralumin_signal").is_ok());
        assert!(m.function("duralumin_stream_wait").is_err(), "not in the module");
        assert!(m.function("duralumin_reduce_f32_sum").is_err(), "two parameters, the body takes three");
        let wide = ".version 8.0\n.target sm_70\n.visible .entry duralumin_signal(.param .u64 a, .param .u64 b)\n{}";
        let m = Arc::new(parse_ptx(wide).unwrap());
        assert!(m.function("duralumin_signal").is_err(), "a u64 value where the body takes a u32");
        assert!(parse_ptx("hello").is_err());
    }

    #[test]
    fn every_builtin_pair_has_its_three_kernels() {
        for (e, o) in duralumin_kernels::BUILTIN_REDUCE_PAIRS {
            for kind in ["reduce", "reduce3", "finish"] {
                assert!(builtins().contains_key(format!("duralumin_{kind}_{e}_{o}").as_str()), "{kind} {e} {o}");
            }
        }
        for f in fixed::ALL {
            assert!(builtins().contains_key(f));
        }
    }
}
