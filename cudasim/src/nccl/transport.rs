//! The wire between ranks: Unix domain sockets in a directory named for the communicator's id,
//! one connection each way per pair of ranks, and a reader thread per incoming connection that
//! moves whole frames into the receiving rank's [`Inbox`], so a send never waits for its
//! receiver and nothing deadlocks on socket buffers.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::lock;
use crate::exec::STALL_REPORT;

/// Starts every frame and every connection's greeting.
const MAGIC: u64 = 0x6e63_636c_7369_6d31;
/// Bytes of a frame's fixed part.
const HEADER_BYTES: usize = 64;
/// Bytes of a connection's greeting: magic, the connecting rank, the number of ranks.
const HELLO_BYTES: usize = 24;
/// The longest path a Unix socket address holds (`sun_path`, with its terminating NUL).
const SUN_PATH: usize = 108;
/// A payload longer than this means the stream is corrupt (no test moves 64 GiB).
const MAX_PAYLOAD: u64 = 64 << 30;

/// Which of a peer's frames one is: frames are matched by key, not by arrival order, so work
/// on several streams and host-side exchanges (splits) never take each other's frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    /// The `n`-th collective on the communicator (from 1).
    Coll(u64),
    /// The `n`-th send from the sending rank to the receiving rank (from 1).
    P2p(u64),
    /// The `n`-th `ncclCommSplit` of the communicator (from 1).
    Split(u64),
}

impl Key {
    fn encode(self) -> (u32, u64) {
        match self {
            Key::Coll(n) => (1, n),
            Key::P2p(n) => (2, n),
            Key::Split(n) => (3, n),
        }
    }

    fn decode(tag: u32, n: u64) -> Option<Key> {
        match tag {
            1 => Some(Key::Coll(n)),
            2 => Some(Key::P2p(n)),
            3 => Some(Key::Split(n)),
            _ => None,
        }
    }
}

/// What a frame says about the operation it belongs to; receivers compare it with their own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    /// The operation's kind (`super::group::Kind` as a number).
    pub(crate) kind: u32,
    pub(crate) count: u64,
    pub(crate) dtype: i32,
    /// The reduction operator (-1 where there is none).
    pub(crate) op: i32,
    /// The root (-1 where there is none).
    pub(crate) root: i32,
    /// For sends: how many groups of the sender held a send to the receiver, this one included.
    pub(crate) group: u64,
}

/// One message from a peer.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) key: Key,
    pub(crate) header: Header,
    pub(crate) payload: Vec<u8>,
}

fn encode(key: Key, h: &Header, len: usize) -> [u8; HEADER_BYTES] {
    let mut b = [0u8; HEADER_BYTES];
    let (tag, n) = key.encode();
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&tag.to_le_bytes());
    b[12..16].copy_from_slice(&h.kind.to_le_bytes());
    b[16..24].copy_from_slice(&n.to_le_bytes());
    b[24..32].copy_from_slice(&h.count.to_le_bytes());
    b[32..36].copy_from_slice(&h.dtype.to_le_bytes());
    b[36..40].copy_from_slice(&h.op.to_le_bytes());
    b[40..44].copy_from_slice(&h.root.to_le_bytes());
    b[48..56].copy_from_slice(&h.group.to_le_bytes());
    b[56..64].copy_from_slice(&(len as u64).to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    i32::from_le_bytes(w)
}

fn corrupt(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

fn read_frame(s: &mut UnixStream) -> io::Result<Frame> {
    let mut b = [0u8; HEADER_BYTES];
    s.read_exact(&mut b)?;
    if u64_at(&b, 0) != MAGIC {
        return Err(corrupt("a frame without the magic number"));
    }
    let key = Key::decode(u32_at(&b, 8), u64_at(&b, 16)).ok_or_else(|| corrupt("a frame of an unknown key"))?;
    let header = Header {
        kind: u32_at(&b, 12),
        count: u64_at(&b, 24),
        dtype: i32_at(&b, 32),
        op: i32_at(&b, 36),
        root: i32_at(&b, 40),
        group: u64_at(&b, 48),
    };
    let len = u64_at(&b, 56);
    if len > MAX_PAYLOAD {
        return Err(corrupt("a frame longer than 64 GiB"));
    }
    let mut payload = vec![0u8; usize::try_from(len).map_err(|_| corrupt("a frame too long for memory"))?];
    s.read_exact(&mut payload)?;
    Ok(Frame { key, header, payload })
}

/// Writes all of `buf` to a socket without raising `SIGPIPE` when the peer has gone (the
/// process may not ignore it, as Rust programs do).
fn send_all(s: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is a live slice of `buf.len()` bytes; the descriptor is the stream's own.
        let n = unsafe { libc::send(s.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        match usize::try_from(n) {
            Ok(n) => buf = &buf[n.min(buf.len())..],
            Err(_) => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// Why a wait for a frame ended without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// This rank's communicator was aborted.
    Aborted,
    /// The peer's connection closed (it aborted, was destroyed or its process ended).
    Closed,
}

struct Queues {
    /// Frames not yet taken, per sending peer, in arrival order.
    frames: Vec<VecDeque<Frame>>,
    /// Peers whose connection has closed.
    closed: Vec<bool>,
    aborted: bool,
}

/// A rank's received frames, per peer.
pub(crate) struct Inbox {
    queues: Mutex<Queues>,
    arrived: Condvar,
}

impl Inbox {
    fn new(nranks: usize) -> Inbox {
        let queues = Queues {
            frames: (0..nranks).map(|_| VecDeque::new()).collect(),
            closed: vec![false; nranks],
            aborted: false,
        };
        Inbox { queues: Mutex::new(queues), arrived: Condvar::new() }
    }

    fn push(&self, peer: usize, frame: Frame) {
        if let Some(q) = lock(&self.queues).frames.get_mut(peer) {
            q.push_back(frame);
        }
        self.arrived.notify_all();
    }

    fn close(&self, peer: usize) {
        if let Some(c) = lock(&self.queues).closed.get_mut(peer) {
            *c = true;
        }
        self.arrived.notify_all();
    }

    /// Ends every wait on this inbox, now and later.
    pub(crate) fn abort(&self) {
        lock(&self.queues).aborted = true;
        self.arrived.notify_all();
    }

    /// Waits for `peer`'s frame `key`. After [`STALL_REPORT`] says once on stderr that
    /// `waiting()` (who waits, in which call) looks like a hang, and goes on waiting.
    pub(crate) fn take(&self, peer: usize, key: Key, waiting: &dyn Fn() -> String) -> Result<Frame, Stop> {
        let (start, mut reported) = (Instant::now(), false);
        let mut q = lock(&self.queues);
        loop {
            if q.aborted {
                return Err(Stop::Aborted);
            }
            let Some(frames) = q.frames.get_mut(peer) else { return Err(Stop::Closed) };
            if let Some(at) = frames.iter().position(|f| f.key == key)
                && let Some(frame) = frames.remove(at)
            {
                return Ok(frame);
            }
            if q.closed.get(peer).copied().unwrap_or(true) {
                return Err(Stop::Closed);
            }
            q = self.arrived.wait_timeout(q, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
            if !reported && start.elapsed() >= STALL_REPORT {
                reported = true;
                eprintln!("ncclsim: {}: likely a hang", waiting());
            }
        }
    }

    /// Blocks until the communicator is aborted (an injected hang).
    pub(crate) fn wait_aborted(&self) {
        let mut q = lock(&self.queues);
        while !q.aborted {
            q = self.arrived.wait_timeout(q, Duration::from_millis(100)).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// Frames that arrived and were never taken, as `(peer, key)`.
    pub(crate) fn leftovers(&self) -> Vec<(usize, Key)> {
        let q = lock(&self.queues);
        q.frames.iter().enumerate().flat_map(|(p, fs)| fs.iter().map(move |f| (p, f.key))).collect()
    }
}

/// A rank's connections to the other ranks of one communicator.
pub(crate) struct Transport {
    rank: usize,
    /// Connections this rank sends on, per peer (none for itself).
    outgoing: Vec<Option<Mutex<UnixStream>>>,
    /// Clones of the connections the reader threads read, to shut them down.
    incoming: Vec<Option<UnixStream>>,
    pub(crate) inbox: Arc<Inbox>,
    path: Option<PathBuf>,
    dir: Option<PathBuf>,
}

/// The directory of a communicator's sockets.
fn directory(id: u64) -> PathBuf {
    let base = std::env::var_os("NCCLSIM_DIR").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    base.join(format!("ncclsim-{id:016x}"))
}

fn greeting(rank: usize, nranks: usize) -> [u8; HELLO_BYTES] {
    let mut b = [0u8; HELLO_BYTES];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..16].copy_from_slice(&(rank as u64).to_le_bytes());
    b[16..24].copy_from_slice(&(nranks as u64).to_le_bytes());
    b
}

impl Transport {
    /// Connects rank `rank` of `nranks` of the communicator `id` to every other rank, retrying
    /// until `deadline`; gives up early when `aborted()`.
    pub(crate) fn connect(
        id: u64,
        rank: usize,
        nranks: usize,
        deadline: Instant,
        aborted: &dyn Fn() -> bool,
    ) -> Result<Transport, String> {
        let inbox = Arc::new(Inbox::new(nranks));
        let mut t = Transport {
            rank,
            outgoing: (0..nranks).map(|_| None).collect(),
            incoming: (0..nranks).map(|_| None).collect(),
            inbox,
            path: None,
            dir: None,
        };
        if nranks == 1 {
            return Ok(t);
        }
        let dir = directory(id);
        let path = dir.join(rank.to_string());
        let longest = dir.join(nranks.to_string());
        if longest.as_os_str().len() >= SUN_PATH {
            return Err(format!(
                "socket path {} is longer than a Unix socket address holds ({SUN_PATH} bytes): set NCCLSIM_DIR to a shorter directory",
                longest.display()
            ));
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        t.dir = Some(dir.clone());
        let listener = UnixListener::bind(&path).map_err(|e| {
            format!("cannot listen on {} (is rank {rank} of this id initialized twice?): {e}", path.display())
        })?;
        t.path = Some(path);
        listener.set_nonblocking(true).map_err(|e| format!("listener: {e}"))?;
        let mut accepted = 0;
        loop {
            for (p, out) in t.outgoing.iter_mut().enumerate() {
                if p == rank || out.is_some() {
                    continue;
                }
                // A peer not yet listening: its socket is missing or refuses; retried below.
                if let Ok(s) = UnixStream::connect(dir.join(p.to_string())) {
                    send_all(&s, &greeting(rank, nranks)).map_err(|e| format!("greeting rank {p}: {e}"))?;
                    *out = Some(Mutex::new(s));
                }
            }
            while accepted + 1 < nranks {
                match listener.accept() {
                    Ok((s, _)) => {
                        let peer = Self::greeted(&s, rank, nranks, deadline)?;
                        if t.incoming[peer].is_some() {
                            return Err(format!("rank {peer} connected twice"));
                        }
                        let reader = s.try_clone().map_err(|e| format!("socket: {e}"))?;
                        t.incoming[peer] = Some(s);
                        let inbox = Arc::clone(&t.inbox);
                        std::thread::Builder::new()
                            .name(format!("ncclsim-reader-{rank}-{peer}"))
                            .spawn(move || read_frames(reader, peer, &inbox))
                            .map_err(|e| format!("cannot start a reader thread: {e}"))?;
                        accepted += 1;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("accept: {e}")),
                }
            }
            let unconnected: Vec<usize> = (0..nranks).filter(|&p| p != rank && t.outgoing[p].is_none()).collect();
            if unconnected.is_empty() && accepted + 1 == nranks {
                break;
            }
            if aborted() {
                return Err("aborted during initialization".into());
            }
            if Instant::now() >= deadline {
                let silent: Vec<usize> = (0..nranks).filter(|&p| p != rank && t.incoming[p].is_none()).collect();
                return Err(format!(
                    "rank {rank} of {nranks} timed out (NCCLSIM_INIT_TIMEOUT): could not connect to ranks {unconnected:?}; ranks {silent:?} never connected to it"
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // Every peer has connected: nobody needs the socket's name any more.
        t.remove_files();
        Ok(t)
    }

    /// Reads a new connection's greeting: the peer's rank.
    fn greeted(s: &UnixStream, rank: usize, nranks: usize, deadline: Instant) -> Result<usize, String> {
        let wait = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
        s.set_nonblocking(false).and_then(|()| s.set_read_timeout(Some(wait))).map_err(|e| format!("socket: {e}"))?;
        let mut b = [0u8; HELLO_BYTES];
        (&*s).read_exact(&mut b).map_err(|e| format!("reading a peer's greeting: {e}"))?;
        s.set_read_timeout(None).map_err(|e| format!("socket: {e}"))?;
        let (peer, theirs) = (u64_at(&b, 8), u64_at(&b, 16));
        if u64_at(&b, 0) != MAGIC {
            return Err("a connection that is not ncclsim's".into());
        }
        if theirs != nranks as u64 {
            return Err(format!("rank {peer} initialized with {theirs} ranks, rank {rank} with {nranks}"));
        }
        match usize::try_from(peer) {
            Ok(p) if p < nranks && p != rank => Ok(p),
            _ => Err(format!("a connection from rank {peer} (of {nranks})")),
        }
    }

    /// Sends one frame to `peer` (to this rank's own inbox for itself).
    pub(crate) fn send(&self, peer: usize, key: Key, header: &Header, payload: &[u8]) -> Result<(), String> {
        if peer == self.rank {
            self.inbox.push(peer, Frame { key, header: *header, payload: payload.to_vec() });
            return Ok(());
        }
        let Some(Some(out)) = self.outgoing.get(peer) else {
            return Err(format!("no connection to rank {peer}"));
        };
        let s = lock(out);
        send_all(&s, &encode(key, header, payload.len()))
            .and_then(|()| send_all(&s, payload))
            .map_err(|e| format!("sending to rank {peer}: {e}"))
    }

    /// Closes every connection: peers see theirs close, this rank's reader threads end.
    pub(crate) fn close(&self) {
        for s in self.outgoing.iter().flatten() {
            let _ = lock(s).shutdown(std::net::Shutdown::Both);
        }
        for s in self.incoming.iter().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.remove_files();
    }

    fn remove_files(&self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
        // Fails while another rank's socket is still there; the last rank's removal succeeds.
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir(d);
        }
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.close();
    }
}

fn read_frames(mut s: UnixStream, peer: usize, inbox: &Inbox) {
    loop {
        match read_frame(&mut s) {
            Ok(frame) => inbox.push(peer, frame),
            Err(e) => {
                if e.kind() != io::ErrorKind::UnexpectedEof && e.kind() != io::ErrorKind::ConnectionReset {
                    eprintln!("ncclsim: the connection from rank {peer} failed: {e}");
                }
                inbox.close(peer);
                return;
            }
        }
    }
}
