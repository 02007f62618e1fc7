//! Where each rank is, for the launcher's failure message.
//!
//! A rank program names what it is doing with [`enter`]: a stack of frames per thread (a
//! group, a backend, one case: `allreduce in place, f32, Sum, count 7`). Each thread's stack
//! is mirrored into a slot of a small file the launcher made (`DURALUMIN_CASE_DIR/rank<R>`),
//! mapped into memory, so entering a case costs a copy and no system call, and however the
//! rank ends (a failed assert, an error, a panic inside the library, `MPI_Abort`, or SIGKILL at
//! the launch's deadline) the launcher reads where it was from the file. A panic also writes
//! its message, led by the case, to `rank<R>.panic` (from a panic hook chained in front of the
//! library's, which ends the job).
//!
//! The launcher side ([`Records`]) makes the directory, passes it in the environment, and
//! turns the files into one line per rank: `rank 2: <case>: <panic message>` for a rank that
//! panicked, `rank 1 was in: <case>` for the others.

#![allow(dead_code)]

use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The directory of the records, set by the launcher for the ranks.
pub const VAR: &str = "DURALUMIN_CASE_DIR";
/// Threads of a rank with a slot of their own in the file; later ones are not recorded there.
const SLOTS: usize = 16;
/// Bytes of a slot: a `u32` length, then the text.
const SLOT_BYTES: usize = 1024;

/// A thread's frames, rendered as they are entered (no allocation once the buffers have grown:
/// a case is entered and left thousands of times a second).
#[derive(Default)]
struct Stack {
    /// `thread <name>: ` for threads other than the one that called [`start`].
    thread: String,
    /// The frames, `group sweep / Mpi / allreduce, f32, Sum, count 7`.
    text: String,
    /// Where each frame starts in `text` (at its ` / `).
    starts: Vec<usize>,
    /// The frames left since the last one entered (`Mpi / allreduce, f32, Sum, count 7` once
    /// the backend's frame is left too), shown after the frames.
    after: String,
    /// Whether the top frame has had nothing entered above it (it is a case, not a group).
    leaf: bool,
    in_use: bool,
}

impl Stack {
    /// `group sweep / Mpi / allreduce, f32, Sum, count 7`, or between cases `group sweep / Mpi
    /// (after allreduce, f32, Sum, count 7)`, in up to five pieces.
    fn pieces(&self) -> [&str; 5] {
        let open = match (self.after.is_empty(), self.text.is_empty()) {
            (true, _) => "",
            (false, true) => "(after ",
            (false, false) => " (after ",
        };
        let close = if self.after.is_empty() { "" } else { ")" };
        [&self.thread, &self.text, open, &self.after, close]
    }

    fn render(&self) -> String {
        self.pieces().concat()
    }
}

struct Rank {
    rank: usize,
    /// The records' directory, when the launcher made one.
    dir: Option<PathBuf>,
    /// The mapped file's address (`SLOTS * SLOT_BYTES` bytes), or 0.
    map: usize,
    stacks: Mutex<Vec<Stack>>,
}

static RANK: OnceLock<Rank> = OnceLock::new();

thread_local! {
    static SLOT: SlotHandle = const { SlotHandle(Cell::new(None)) };
}

/// A thread's slot, given back when the thread ends.
struct SlotHandle(Cell<Option<usize>>);

impl Drop for SlotHandle {
    fn drop(&mut self) {
        if let (Some(i), Some(r)) = (self.0.get(), RANK.get()) {
            let mut stacks = r.lock();
            stacks[i] = Stack::default();
            r.write(i, &[]);
        }
    }
}

impl Rank {
    fn lock(&self) -> MutexGuard<'_, Vec<Stack>> {
        self.stacks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Mirrors `pieces`, one after the other, into slot `i` of the file (cut at the slot's end;
    /// the launcher reads bytes, so a cut inside a character shows as one replacement mark).
    fn write(&self, i: usize, pieces: &[&str]) {
        if self.map == 0 || i >= SLOTS {
            return;
        }
        let slot = (self.map + i * SLOT_BYTES) as *mut u8;
        // SAFETY: the mapping is `SLOTS * SLOT_BYTES` bytes, page-aligned and never unmapped, so
        // `slot`'s length and the `SLOT_BYTES - 4` bytes after it are inside it, and no copy
        // below goes past them; the caller holds the stacks' lock, the only way to this slot in
        // this process (the launcher reads the file only after the rank is gone).
        unsafe {
            let len = &*(slot as *const AtomicU32);
            // A rank killed halfway through leaves length 0, never a torn text.
            len.store(0, Ordering::Release);
            let mut n = 0;
            for p in pieces {
                let k = p.len().min(SLOT_BYTES - 4 - n);
                std::ptr::copy_nonoverlapping(p.as_ptr(), slot.add(4 + n), k);
                n += k;
            }
            len.store(u32::try_from(n).unwrap_or(0), Ordering::Release);
        }
    }

    /// This thread's slot, taking one on first use.
    fn slot(&self, stacks: &mut Vec<Stack>) -> usize {
        SLOT.with(|s| match s.0.get() {
            Some(i) => i,
            None => {
                let i = match stacks.iter().skip(1).position(|s| !s.in_use) {
                    Some(free) => free + 1,
                    None => {
                        stacks.push(Stack::default());
                        stacks.len() - 1
                    }
                };
                let name = std::thread::current()
                    .name()
                    .map_or_else(|| format!("{:?}", std::thread::current().id()), str::to_string);
                stacks[i] = Stack { thread: format!("thread {name}: "), in_use: true, ..Stack::default() };
                s.0.set(Some(i));
                i
            }
        })
    }
}

/// Sets this process up as rank `rank`: opens its record if the launcher asked for one, and
/// installs the panic hook. Call once, after MPI is initialized (so the hook runs before the
/// library's, which ends the job), from the thread that runs the cases.
pub fn start(rank: usize) {
    let dir = std::env::var_os(VAR).map(PathBuf::from);
    let map = dir.as_ref().map_or(0, |d| map_record(&d.join(format!("rank{rank}"))));
    let main = Stack { in_use: true, ..Stack::default() };
    let r = Rank { rank, dir, map, stacks: Mutex::new(vec![main]) };
    if RANK.set(r).is_err() {
        return;
    }
    SLOT.with(|s| s.0.set(Some(0)));
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        record_panic(info);
        previous(info);
    }));
}

/// This process's rank, once [`start`] was called.
pub fn rank() -> Option<usize> {
    RANK.get().map(|r| r.rank)
}

/// Maps a new record file of `SLOTS * SLOT_BYTES` zero bytes; 0 if that fails (the ranks run
/// on, unrecorded).
fn map_record(path: &std::path::Path) -> usize {
    // Read and write: a shared writable mapping needs both.
    let opened = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path);
    let file = match opened.and_then(|f| f.set_len((SLOTS * SLOT_BYTES) as u64).map(|()| f)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{}: no record of this rank's cases: {e}", path.display());
            return 0;
        }
    };
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of a file this process just made and sized; nothing else
    // in this process maps it, and it stays mapped until the process ends (the descriptor may
    // close: the mapping keeps the file).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            SLOTS * SLOT_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        eprintln!("{}: no record of this rank's cases: {}", path.display(), std::io::Error::last_os_error());
        return 0;
    }
    p as usize
}

/// A frame entered with [`enter`]; leaving it (dropping it) pops it.
#[must_use = "the frame is left when this is dropped"]
pub struct Frame(Option<usize>);

/// Enters `frame` on this thread: it is where this rank is until the returned guard drops.
/// Does nothing before [`start`].
pub fn enter(frame: impl fmt::Display) -> Frame {
    let Some(r) = RANK.get() else { return Frame(None) };
    let mut stacks = r.lock();
    let i = r.slot(&mut stacks);
    let s = &mut stacks[i];
    s.starts.push(s.text.len());
    if !s.text.is_empty() {
        s.text.push_str(" / ");
    }
    let _ = write!(s.text, "{frame}");
    s.after.clear();
    s.leaf = true;
    r.write(i, &s.pieces());
    Frame(Some(i))
}

impl Drop for Frame {
    fn drop(&mut self) {
        let (Some(i), Some(r)) = (self.0, RANK.get()) else { return };
        let mut stacks = r.lock();
        let Stack { text, starts, after, leaf, .. } = &mut stacks[i];
        let Some(start) = starts.pop() else { return };
        let left = if start == 0 { &text[..] } else { &text[start + 3..] };
        if *leaf || after.is_empty() {
            after.clear();
            after.push_str(left);
        } else {
            // Left a group: it goes in front of what was left inside it.
            after.insert_str(0, " / ");
            after.insert_str(0, left);
        }
        text.truncate(start);
        *leaf = false;
        r.write(i, &stacks[i].pieces());
    }
}

/// Runs `f` inside `frame`.
pub fn within<R>(frame: impl fmt::Display, f: impl FnOnce() -> R) -> R {
    let _frame = enter(frame);
    f()
}

/// Where this thread is: its frames, or, for a thread with none (the progress thread, say),
/// where the first thread is.
pub fn current() -> String {
    let Some(r) = RANK.get() else { return String::new() };
    // Never block: this runs in the panic hook, maybe on a thread that holds the lock.
    let mut tries = 0;
    let stacks = loop {
        match r.stacks.try_lock() {
            Ok(s) => break s,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if tries < 1000 => {
                tries += 1;
                std::thread::yield_now();
            }
            Err(std::sync::TryLockError::WouldBlock) => return "(unknown: the record stays locked)".into(),
        }
    };
    let mine = SLOT.try_with(|s| s.0.get()).ok().flatten().and_then(|i| stacks.get(i));
    match mine {
        Some(s) if !s.text.is_empty() => s.render(),
        _ => {
            let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
            format!("thread {thread}, while the main thread was in: {}", stacks[0].render())
        }
    }
}

fn record_panic(info: &std::panic::PanicHookInfo<'_>) {
    let Some(r) = RANK.get() else { return };
    let msg = match info.payload() {
        p if p.is::<&str>() => p.downcast_ref::<&str>().map(|s| s.to_string()),
        p => p.downcast_ref::<String>().cloned(),
    }
    .unwrap_or_else(|| "(a panic without a message)".into());
    let at = info.location().map(|l| format!(" (at {}:{})", l.file(), l.line())).unwrap_or_default();
    let line = format!("rank {}: {}: {msg}{at}\n", r.rank, current());
    // In the job's output too, next to the usual panic message.
    eprint!("{line}");
    if let Some(dir) = &r.dir {
        let path = dir.join(format!("rank{}.panic", r.rank));
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

/// The launcher's side: a directory for one launch's records, removed when dropped.
pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn new() -> Result<Records, String> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "duralumin-cases-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(Records { dir })
    }

    /// The variable that tells the ranks where to write.
    pub fn env(&self) -> (&'static str, String) {
        (VAR, self.dir.display().to_string())
    }

    /// One entry per rank of `np` that left a record: first each panic (`rank R: <case>:
    /// <message>`), then where the ranks that did not panic were (`rank R was in: <case>`, and
    /// as much for each other thread that was in a frame).
    pub fn read(&self, np: usize) -> Vec<String> {
        let mut failed = Vec::new();
        let mut whereabouts = Vec::new();
        for r in 0..np {
            if let Ok(p) = std::fs::read_to_string(self.dir.join(format!("rank{r}.panic"))) {
                failed.push(p.trim_end().to_string());
                continue;
            }
            let Ok(bytes) = std::fs::read(self.dir.join(format!("rank{r}"))) else { continue };
            for slot in bytes.chunks_exact(SLOT_BYTES) {
                let len = (u32::from_ne_bytes([slot[0], slot[1], slot[2], slot[3]]) as usize).min(SLOT_BYTES - 4);
                let text = String::from_utf8_lossy(&slot[4..4 + len]);
                if !text.is_empty() {
                    whereabouts.push(format!("rank {r} was in: {text}"));
                }
            }
        }
        failed.extend(whereabouts);
        failed
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How long a rank waits for what must come without any other rank's help (a send-only
/// request's release, the pool's return of an operation's flags) before it calls it missing.
/// Generous on purpose: what it catches never comes at all, and a loaded CI machine was seen to
/// stop every rank of a launch for 10–20 s (`docs/testing.md`, "Bounds in the tests").
pub const SURELY: std::time::Duration = std::time::Duration::from_secs(90);

/// Polls `done` (sleeping a millisecond in between, which leaves the core to the threads that
/// make it true) until it holds, or for [`SURELY`]; whether it held.
pub fn comes_surely(mut done: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + SURELY;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
