//! Receives that never let a message longer than their buffer in.
//!
//! An MPI library writes a message longer than its receive buffer past the buffer: Open MPI 4.1
//! and 5.0 do for every message above their eager size, over shared memory and over TCP
//! (measured in `docs/reliability.md`). A receive posted with `MPI_Irecv` is therefore only as
//! safe as the peer's count. Duralumin's receives are *expected* instead: kept here, one
//! [`Matcher`] per communicator, in the order they were posted for each (source, tag), and
//! claimed with `MPI_Improbe`, which takes the first waiting message of the pair off MPI's
//! queue with its length before a byte of it lands. A message of the expected length is then
//! received into its buffer (`MPI_Imrecv`); any other is received into memory of its own size,
//! so its sender completes, and the receive fails with what arrived ([`Misfit`]).
//!
//! The order MPI gives posted receives is kept: of the receives posted for one (source, tag),
//! the first gets the first message, because a receive is claimed only once every earlier one
//! of its pair was; and any receive's poll claims what has arrived for the others of its pairs,
//! so a receive posted early still has its message moving while its owner waits on another.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;

use crate::api::error::Result;
use crate::ffi::{RawComm, RawDatatype, RawRequest, p2p, sys};

/// The receives expected on one communicator (see the module docs).
#[derive(Debug)]
pub(crate) struct Matcher {
    comm: RawComm,
    state: Mutex<State>,
}

/// A receive's handle in its [`Matcher`]: its place in the slots.
pub(crate) type SlotId = usize;

/// The receives of one (source, tag) not yet claimed, oldest first.
type Queue = SmallVec<[SlotId; 2]>;

/// A short list kept without a heap allocation (the receives of one operation's post, the
/// keys of one poll).
pub(crate) type Few<T> = SmallVec<[T; 2]>;

#[derive(Debug, Default)]
struct State {
    /// Per (source, tag): the receives not yet claimed, oldest first (usually one).
    queues: HashMap<(c_int, c_int), Queue>,
    /// Every receive not yet collected by its owner, by [`SlotId`]; `None`: a free place.
    slots: Vec<Option<Slot>>,
    /// The free places of `slots`.
    free: Vec<SlotId>,
    /// Messages of another length, received into memory of their own, which lives as long as
    /// the receive.
    drains: Vec<(RawRequest, Vec<u8>)>,
}

// SAFETY: the buffer addresses in the slots belong to the operations that expect them, which
// keep them valid until their receives are collected or released (see `Matcher::expect`); the
// state is only touched under its mutex.
unsafe impl Send for State {}

#[derive(Debug)]
struct Slot {
    key: (c_int, c_int),
    buf: *mut c_void,
    count: c_int,
    dt: RawDatatype,
    state: SlotState,
}

#[derive(Debug)]
enum SlotState {
    /// No message claimed yet.
    Waiting,
    /// Its message is being received into its buffer.
    Receiving(RawRequest),
    /// A message of another length came instead.
    Failed(Misfit),
}

/// What a receive found instead of its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Misfit {
    /// The sender (a rank of the matcher's communicator).
    pub(crate) source: usize,
    /// The elements the receive expected.
    pub(crate) expected: usize,
    /// The message's length in the receive's elements (`None`: not a whole number of them).
    pub(crate) elements: Option<usize>,
    /// The message's length in bytes.
    pub(crate) bytes: u64,
}

/// How a receive stands after a poll.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Every receive polled has completed.
    Done,
    /// Some are still waiting for their message or receiving it.
    Pending,
    /// One found a message of another length.
    Failed(Misfit),
}

impl Matcher {
    pub(crate) fn new(comm: RawComm) -> Self {
        Matcher { comm, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Expects a message of `count` elements of `dt` from `source` with `tag` into `buf`, after
    /// every receive expected before it from the same (source, tag).
    ///
    /// # Safety
    /// `buf` must hold `count` elements of `dt`, valid for writes and untouched by anyone else
    /// until the receive is collected by [`Matcher::poll`] (done or failed) or released by
    /// [`Matcher::release`].
    pub(crate) unsafe fn expect(
        &self,
        source: c_int,
        tag: c_int,
        buf: *mut c_void,
        count: c_int,
        dt: RawDatatype,
    ) -> SlotId {
        let mut st = self.state();
        let key = (source, tag);
        let id = st.insert(Slot { key, buf, count, dt, state: SlotState::Waiting });
        st.queues.entry(key).or_default().push(id);
        id
    }

    /// Claims what has arrived for the pairs of `ids`, tests the receives of `ids` and drops the
    /// completed ones from `ids`. A failed receive stays in `ids` until released.
    pub(crate) fn poll(&self, ids: &mut Few<SlotId>) -> Result<Progress> {
        let mut st = self.state();
        st.complete_drains();
        let mut claimed: Few<(c_int, c_int)> = SmallVec::new();
        for &id in ids.iter() {
            if let Some(slot) = st.slot(id).filter(|s| matches!(s.state, SlotState::Waiting)) {
                let key = slot.key;
                if !claimed.contains(&key) {
                    claimed.push(key);
                    st.claim(self.comm, key)?;
                }
            }
        }
        let mut i = 0;
        let mut progress = Progress::Done;
        while i < ids.len() {
            let Some(slot) = st.slot_mut(ids[i]) else {
                ids.swap_remove(i);
                continue;
            };
            match &mut slot.state {
                SlotState::Waiting => progress = Progress::Pending,
                SlotState::Receiving(req) => match p2p::test_p2p(req)? {
                    Some(_) => {
                        st.remove(ids[i]);
                        ids.swap_remove(i);
                        crate::common::progress::made_progress();
                        continue;
                    }
                    None => progress = Progress::Pending,
                },
                SlotState::Failed(m) => return Ok(Progress::Failed(*m)),
            }
            i += 1;
        }
        Ok(progress)
    }

    /// The distinct sources of the receives of `ids` that have no message yet.
    pub(crate) fn waiting_sources(&self, ids: &[SlotId]) -> Few<c_int> {
        let st = self.state();
        let mut sources = SmallVec::new();
        for slot in ids.iter().filter_map(|&id| st.slot(id)) {
            if matches!(slot.state, SlotState::Waiting) && !sources.contains(&slot.key.0) {
                sources.push(slot.key.0);
            }
        }
        sources
    }

    /// Gives up the receives of `ids` (their operation failed): those without a message are
    /// forgotten (MPI never had them); those receiving are waited for, which their senders,
    /// sending, complete.
    pub(crate) fn release(&self, ids: &[SlotId]) {
        let mut receiving = Vec::new();
        {
            let mut st = self.state();
            for &id in ids {
                let Some(slot) = st.remove(id) else { continue };
                if let Some(q) = st.queues.get_mut(&slot.key) {
                    q.retain(|x| *x != id);
                    if q.is_empty() {
                        st.queues.remove(&slot.key);
                    }
                }
                if let SlotState::Receiving(req) = slot.state {
                    receiving.push(req);
                }
            }
        }
        for mut req in receiving {
            p2p::cancel_and_wait(&mut req);
        }
    }
}

impl State {
    fn insert(&mut self, slot: Slot) -> SlotId {
        match self.free.pop() {
            Some(id) => {
                self.slots[id] = Some(slot);
                id
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        }
    }

    fn slot(&self, id: SlotId) -> Option<&Slot> {
        self.slots.get(id).and_then(Option::as_ref)
    }

    fn slot_mut(&mut self, id: SlotId) -> Option<&mut Slot> {
        self.slots.get_mut(id).and_then(Option::as_mut)
    }

    fn remove(&mut self, id: SlotId) -> Option<Slot> {
        let slot = self.slots.get_mut(id)?.take();
        if slot.is_some() {
            self.free.push(id);
        }
        slot
    }

    /// Claims messages for the receives waiting on `key`, oldest first, while messages of the
    /// pair have arrived.
    fn claim(&mut self, comm: RawComm, key: (c_int, c_int)) -> Result<()> {
        while let Some(&id) = self.queues.get(&key).and_then(|q| q.first()) {
            let Some((msg, status)) = p2p::improbe(key.0, key.1, comm)? else { break };
            if let Some(q) = self.queues.get_mut(&key) {
                q.remove(0);
                if q.is_empty() {
                    self.queues.remove(&key);
                }
            }
            let Some(slot) = self.slot_mut(id) else {
                // Not reached (a released receive leaves its queue), but a message taken off
                // MPI's queue is always received, so that its sender completes.
                let bytes = p2p::message_bytes(&status)?;
                self.drain(msg, bytes)?;
                continue;
            };
            let elements = p2p::received_elements(&status, slot.dt)?;
            if elements.is_some() && elements == usize::try_from(slot.count).ok() {
                // SAFETY: the slot's buffer holds `count` elements of `dt` and is reserved for
                // this receive until it is collected (`expect`'s contract); the message has
                // exactly that length.
                slot.state = SlotState::Receiving(unsafe { p2p::imrecv(slot.buf, slot.count, slot.dt, msg) }?);
                crate::common::progress::made_progress();
                continue;
            }
            let bytes = p2p::message_bytes(&status)?;
            slot.state = SlotState::Failed(Misfit {
                source: usize::try_from(key.0).unwrap_or(usize::MAX),
                expected: usize::try_from(slot.count).unwrap_or(0),
                elements,
                bytes,
            });
            self.drain(msg, bytes)?;
        }
        Ok(())
    }

    /// Receives a message that fits no expected receive into memory of its own size, so its
    /// sender completes. One too large to hold (beyond `c_int::MAX` bytes, or memory) is left
    /// unreceived: its sender then waits, until its own communicator is given up.
    fn drain(&mut self, msg: p2p::RawMessage, bytes: u64) -> Result<()> {
        let Some(len) = usize::try_from(bytes).ok().filter(|_| c_int::try_from(bytes).is_ok()) else {
            return Ok(());
        };
        let mut buf = Vec::new();
        if buf.try_reserve_exact(len).is_err() {
            return Ok(());
        }
        buf.resize(len, 0u8);
        // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
        let byte = RawDatatype(unsafe { sys::RSMPI_UINT8_T });
        // SAFETY: `buf` holds the message's `len` bytes and moves into `drains` with the
        // request (its heap memory unmoved) until the request completes.
        let req = unsafe { p2p::imrecv(buf.as_mut_ptr().cast(), c_int::try_from(len).unwrap_or(0), byte, msg) }?;
        self.drains.push((req, buf));
        Ok(())
    }

    /// Lets go of the drained messages that have arrived. A drain whose test fails (a revoked
    /// communicator) may still be written by MPI: its memory is leaked, never freed.
    fn complete_drains(&mut self) {
        self.drains.retain_mut(|(req, buf)| match p2p::test_p2p(req) {
            Ok(None) => true,
            Ok(Some(_)) => false,
            Err(_) => {
                std::mem::forget(std::mem::take(buf));
                false
            }
        });
    }
}

impl Drop for Matcher {
    fn drop(&mut self) {
        // A drained message still arriving keeps its memory: MPI may yet write it. After
        // MPI_Finalize no request may be tested: every drain is left as it is.
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if !crate::ffi::is_finalized() {
            st.complete_drains();
        }
        std::mem::forget(std::mem::take(&mut st.drains));
    }
}
