//! Pools of pinned staging memory and of host-mapped flags.
//!
//! Pinned allocations are slow (they lock pages and map them for the device), so staging buffers
//! are kept and reused: sizes are rounded up to a power of two (at least [`MIN_BLOCK`]) and
//! freed blocks wait in per-size free lists. The pool has a cap on what it holds in total; a
//! request that would pass it first releases idle blocks of other sizes, then reports that it
//! must wait ([`Pools::try_take`]) or fails with [`Error::PoolExhausted`] ([`Pools::take`]):
//! the pool never blocks. Flags come from pinned pages of
//! [`FLAGS_PER_PAGE`] slots; a slot is zeroed when taken. A slot a stream may still wait on when
//! it is given back goes back only once the stream has said it is past the wait
//! ([`FlagSlot::reuse_once`]). Both pools count what is in use, so tests can check that every
//! operation gave everything back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use duralumin_kernels::flag::reached;

use super::{Device, DevicePtr, Flag};
use crate::api::error::{Error, Result};

/// The smallest staging block.
pub const MIN_BLOCK: usize = 4096;

/// Flags per pinned page of the flag pool.
pub const FLAGS_PER_PAGE: usize = 1024;

/// How long a dropped pool's flag pages wait for the streams still waiting on its slots (see
/// [`FlagSlot::reuse_once`]) before they leak.
const PENDING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A snapshot of a pool's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pinned bytes handed out and not yet returned.
    pub in_use_bytes: usize,
    /// Pinned bytes the pool holds (in use plus idle).
    pub held_bytes: usize,
    /// The most `in_use_bytes` has ever been.
    pub high_water_bytes: usize,
    /// The cap on `held_bytes`.
    pub cap_bytes: usize,
    /// Staging blocks handed out and not yet returned.
    pub blocks_in_use: usize,
    /// Flags handed out and not yet returned.
    pub flags_in_use: usize,
}

struct Counters {
    free: BTreeMap<usize, Vec<usize>>,
    stats: PoolStats,
    flag_pages: Vec<(usize, DevicePtr)>,
    free_flags: Vec<(usize, usize)>,
    /// Slots given back that go back to `free_flags` once they reach a value (see
    /// [`FlagSlot::reuse_once`]): page, index, value.
    pending_flags: Vec<(usize, usize, u32)>,
}

/// Staging memory and flags of one device.
pub struct Pools<D: Device> {
    device: Arc<D>,
    state: Mutex<Counters>,
}

impl<D: Device> std::fmt::Debug for Pools<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools").field("stats", &self.stats()).finish_non_exhaustive()
    }
}

impl<D: Device> Pools<D> {
    /// Empty pools for `device` holding at most `cap_bytes` of staging memory.
    pub fn new(device: Arc<D>, cap_bytes: usize) -> Arc<Pools<D>> {
        let stats = PoolStats { cap_bytes, ..PoolStats::default() };
        Arc::new(Pools {
            device,
            state: Mutex::new(Counters {
                free: BTreeMap::new(),
                stats,
                flag_pages: Vec::new(),
                free_flags: Vec::new(),
                pending_flags: Vec::new(),
            }),
        })
    }

    /// The device the memory belongs to.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// The counters now.
    pub fn stats(&self) -> PoolStats {
        let mut st = self.lock();
        st.reuse_reached();
        st.stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counters> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A staging block of at least `bytes` bytes (contents unspecified), or
    /// [`Error::PoolExhausted`] if the blocks in use leave no room for it now.
    pub fn take(self: &Arc<Self>, bytes: usize) -> Result<PinnedBlock<D>> {
        match self.try_take(bytes, true)? {
            Some(block) => Ok(block),
            None => Err(self.lock().exhausted(Self::block_size(bytes)?)),
        }
    }

    /// A staging block of at least `bytes` bytes if the cap leaves room for it now; `None` if
    /// it must wait for blocks in use to come back; [`Error::PoolExhausted`] if it never can
    /// (the block is larger than the cap).
    ///
    /// An idle block of the size, or else of a larger size, is reused; else a new one is
    /// allocated if the cap allows. With `free_idle`, idle blocks are freed to make room
    /// first. Pinned memory is allocated and freed outside the pool's lock, so a slow driver
    /// call never holds up a thread returning a block; the proxy thread passes `free_idle =
    /// false` because freeing pinned memory may wait for the device (the queue-order rule:
    /// `docs/architecture.md#the-queue-order-rule`).
    pub fn try_take(self: &Arc<Self>, bytes: usize, free_idle: bool) -> Result<Option<PinnedBlock<D>>> {
        let size = self.check_fits(bytes)?;
        let mut victims = Vec::new();
        let room;
        {
            let mut st = self.lock();
            let idle = st.free.range_mut(size..).find(|(_, l)| !l.is_empty()).map(|(&s, l)| (s, l.pop()));
            if let Some((got, Some(ptr))) = idle {
                st.lend(got);
                return Ok(Some(PinnedBlock { pools: Arc::clone(self), ptr, size: got }));
            }
            // Make room by releasing idle blocks (all smaller than `size` now), largest first.
            while free_idle && st.stats.held_bytes + size > st.stats.cap_bytes {
                let Some((&s, list)) = st.free.iter_mut().rev().find(|(_, l)| !l.is_empty()) else { break };
                victims.push((list.pop().unwrap_or_default(), s));
                st.stats.held_bytes -= s;
            }
            room = st.stats.held_bytes + size <= st.stats.cap_bytes;
            if room {
                // Reserved now; lent once allocated.
                st.stats.held_bytes += size;
            }
        }
        for (p, s) in victims {
            // SAFETY: idle blocks are used by no queued work and came from this device; they
            // left the free list above, so no one else has them.
            unsafe { self.device.free_pinned(p as *mut u8, s) };
        }
        if !room {
            return Ok(None);
        }
        match self.device.alloc_pinned(size) {
            Ok(p) => {
                self.lock().lend(size);
                Ok(Some(PinnedBlock { pools: Arc::clone(self), ptr: p as usize, size }))
            }
            Err(e) => {
                self.lock().stats.held_bytes -= size;
                Err(e)
            }
        }
    }

    /// The size of the block [`Pools::take`] hands out for `bytes`, or
    /// [`Error::PoolExhausted`] if that is more than the cap (no block of it can ever be had).
    pub fn check_fits(&self, bytes: usize) -> Result<usize> {
        let size = Self::block_size(bytes)?;
        let st = self.lock();
        if size > st.stats.cap_bytes {
            return Err(st.exhausted(size));
        }
        Ok(size)
    }

    /// Block sizes are powers of two, at least [`MIN_BLOCK`].
    fn block_size(bytes: usize) -> Result<usize> {
        bytes
            .max(MIN_BLOCK)
            .checked_next_power_of_two()
            .ok_or(Error::CountOverflow { what: "staging block", value: bytes as u128 })
    }

    /// A flag slot, set to zero.
    pub fn flag(self: &Arc<Self>) -> Result<FlagSlot<D>> {
        let mut st = self.lock();
        st.reuse_reached();
        if st.free_flags.is_empty() {
            let bytes = FLAGS_PER_PAGE * size_of::<u32>();
            let host = self.device.alloc_pinned(bytes)?;
            let device = match self.device.mapped(host) {
                Ok(d) => d,
                Err(e) => {
                    // SAFETY: just allocated, used by nothing.
                    unsafe { self.device.free_pinned(host, bytes) };
                    return Err(e);
                }
            };
            let page = st.flag_pages.len();
            st.flag_pages.push((host as usize, device));
            st.free_flags.extend((0..FLAGS_PER_PAGE).rev().map(|i| (page, i)));
        }
        let (page, index) = st.free_flags.pop().unwrap_or_default();
        st.stats.flags_in_use += 1;
        let (host, device) = st.flag_pages[page];
        let host = (host + index * size_of::<u32>()) as *const AtomicU32;
        let flag = Flag { host, device: device.offset(index * size_of::<u32>()) };
        // SAFETY: the slot belongs to the page just looked up, which lives as long as the pools.
        unsafe { flag.atomic() }.store(0, Ordering::Release);
        Ok(FlagSlot { pools: Arc::clone(self), flag, page, index, reuse_at: AtomicU32::new(0) })
    }
}

impl Counters {
    /// Moves the pending slots that reached their value to the free list.
    fn reuse_reached(&mut self) {
        if self.pending_flags.is_empty() {
            return;
        }
        let Counters { pending_flags, free_flags, flag_pages, stats, .. } = self;
        pending_flags.retain(|&(page, index, value)| {
            let host = (flag_pages[page].0 + index * size_of::<u32>()) as *const AtomicU32;
            // SAFETY: the slot belongs to a page the pools hold for their whole life.
            if reached(unsafe { &*host }.load(Ordering::Acquire), value) {
                free_flags.push((page, index));
                stats.flags_in_use -= 1;
                false
            } else {
                true
            }
        });
    }

    /// The error for a block of `requested` bytes that the pool cannot hand out.
    fn exhausted(&self, requested: usize) -> Error {
        Error::PoolExhausted { requested, in_use: self.stats.in_use_bytes, cap: self.stats.cap_bytes }
    }

    /// Counts a block of `size` bytes as lent out.
    fn lend(&mut self, size: usize) {
        self.stats.in_use_bytes += size;
        self.stats.blocks_in_use += 1;
        self.stats.high_water_bytes = self.stats.high_water_bytes.max(self.stats.in_use_bytes);
    }

    /// Moves a block from in use to the free list.
    fn give_back(&mut self, ptr: usize, size: usize) {
        self.stats.in_use_bytes -= size;
        self.stats.blocks_in_use -= 1;
        self.free.entry(size).or_default().push(ptr);
    }
}

impl<D: Device> Drop for Pools<D> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Idle blocks are used by nothing (in-use blocks hold the pools alive); every flag slot
        // holds the pools alive too, so no flag page is in use now, unless a stream may still
        // wait on a slot given back (see `FlagSlot::reuse_once`): the pages then go once it
        // got past (a communicator dropped without synchronizing its stream), or leak if it
        // does not within `PENDING_WAIT` (a stream held up or failed).
        let blocks: Vec<(usize, usize)> =
            st.free.iter().flat_map(|(&size, list)| list.iter().map(move |&p| (p, size))).collect();
        st.reuse_reached();
        let pages: Vec<(usize, usize)> =
            st.flag_pages.iter().map(|&(host, _)| (host, FLAGS_PER_PAGE * size_of::<u32>())).collect();
        let pending: Vec<(usize, u32)> = st
            .pending_flags
            .iter()
            .map(|&(page, index, value)| (st.flag_pages[page].0 + index * size_of::<u32>(), value))
            .collect();
        let waits = !pending.is_empty();
        let device = Arc::clone(&self.device);
        let free = move || {
            let free_all = |memory: Vec<(usize, usize)>| {
                for (p, size) in memory {
                    // SAFETY: used by nothing (above, and the flag pages once no stream waits on
                    // them), allocated by this device, freed once.
                    unsafe { device.free_pinned(p as *mut u8, size) };
                }
            };
            free_all(blocks);
            let passed = || {
                pending.iter().all(|&(at, value)| {
                    // SAFETY: the pages these slots lie in are freed only below, after this.
                    let word = unsafe { &*(at as *const AtomicU32) };
                    reached(word.load(Ordering::Acquire), value)
                })
            };
            let deadline = std::time::Instant::now() + PENDING_WAIT;
            while !passed() {
                if std::time::Instant::now() >= deadline {
                    tracing::warn!("a dropped pool's flag is still waited on by a stream; its flag pages leak");
                    return;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            free_all(pages);
        };
        // Freeing pinned memory may wait for the device (CUDA's does), which the proxy thread
        // must not (docs/architecture.md#the-queue-order-rule), and a stream may have a wait to
        // pass first: then the frees run on a thread of their own. The last operation of a
        // dropped communicator lets its pools go on the proxy thread.
        if waits || crate::common::progress::on_proxy_thread() {
            let spawned = std::thread::Builder::new().name("duralumin-pool-free".into()).spawn(free);
            if spawned.is_err() {
                tracing::warn!("could not start a thread to free a dropped pool's pinned memory; it leaks");
            }
        } else {
            free();
        }
    }
}

/// A pinned staging block; back to its pool on drop.
pub struct PinnedBlock<D: Device> {
    pools: Arc<Pools<D>>,
    ptr: usize,
    size: usize,
}

impl<D: Device> std::fmt::Debug for PinnedBlock<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBlock").field("size", &self.size).finish()
    }
}

impl<D: Device> PinnedBlock<D> {
    /// The block's host address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    /// The block's size in bytes (at least what was asked for).
    pub fn size(&self) -> usize {
        self.size
    }
}

impl<D: Device> Drop for PinnedBlock<D> {
    fn drop(&mut self) {
        self.pools.lock().give_back(self.ptr, self.size);
    }
}

/// A flag from the pool; back to it on drop.
pub struct FlagSlot<D: Device> {
    pools: Arc<Pools<D>>,
    flag: Flag,
    page: usize,
    index: usize,
    /// 0, or the value the flag must reach before the slot is lent again.
    reuse_at: AtomicU32,
}

impl<D: Device> std::fmt::Debug for FlagSlot<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlagSlot").field("page", &self.page).field("index", &self.index).finish()
    }
}

impl<D: Device> FlagSlot<D> {
    /// The flag (valid while this slot is held).
    pub fn flag(&self) -> Flag {
        self.flag
    }

    /// The flag's value now (acquire load).
    pub fn load(&self) -> u32 {
        // SAFETY: the slot is held.
        unsafe { self.flag.atomic() }.load(Ordering::Acquire)
    }

    /// Blocks the calling thread until the flag reaches `value` ([`Device::host_wait`]).
    pub fn wait_for(&self, value: u32) {
        // SAFETY: the slot is held until this returns.
        unsafe { self.pools.device.host_wait(self.flag, value) }
    }

    /// Sets the flag from the host (release store).
    pub fn store(&self, value: u32) {
        // SAFETY: the slot is held.
        unsafe { self.flag.atomic() }.store(value, Ordering::Release);
        self.pools.device.host_wrote_flag();
    }

    /// Lends the slot again, once it is given back, only after the flag has reached `value`
    /// (nonzero): for a flag a stream waits on and then sets to `value`, so that the slot is
    /// never reset under a wait the stream has not passed yet, with no host function to hold it.
    /// A slot that never reaches `value` (its stream failed) is never lent again.
    pub fn reuse_once(&self, value: u32) {
        self.reuse_at.store(value, Ordering::Relaxed);
    }

    /// Raises the flag from the host to `value` unless it has already reached it, compared
    /// modulo 2³² as the device compares (flags that count chunks only go up, whichever of two
    /// threads writes last).
    pub fn raise(&self, value: u32) {
        // SAFETY: the slot is held.
        let word = unsafe { self.flag.atomic() };
        let behind = |cur: u32| (!reached(cur, value)).then_some(value);
        if word.fetch_update(Ordering::AcqRel, Ordering::Acquire, behind).is_ok() {
            self.pools.device.host_wrote_flag();
        }
    }
}

impl<D: Device> Drop for FlagSlot<D> {
    fn drop(&mut self) {
        let at = *self.reuse_at.get_mut();
        let waits = at != 0 && !reached(self.load(), at);
        let mut st = self.pools.lock();
        if waits {
            // Still in use, until the stream gets there (see `reuse_once`).
            st.pending_flags.push((self.page, self.index, at));
        } else {
            st.stats.flags_in_use -= 1;
            st.free_flags.push((self.page, self.index));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{MIN_BLOCK, Pools};
    use crate::device::cpu::HostDevice;

    #[test]
    fn idle_blocks_freed_to_make_room_are_freed_even_when_it_is_not_enough() {
        let dev = HostDevice::new(0);
        let pools = Pools::new(Arc::new(dev.clone()), 4 * MIN_BLOCK);
        let held = pools.take(2 * MIN_BLOCK).unwrap();
        drop(pools.take(MIN_BLOCK).unwrap());
        assert_eq!(dev.pinned_bytes(), 3 * MIN_BLOCK);
        // The idle block goes, and the one in use still leaves no room.
        assert!(pools.try_take(4 * MIN_BLOCK, true).unwrap().is_none());
        assert_eq!(dev.pinned_bytes(), 2 * MIN_BLOCK);
        assert_eq!(pools.stats().held_bytes, 2 * MIN_BLOCK);
        // Without `free_idle` nothing goes; a larger idle block serves a smaller request.
        drop(held);
        let small = pools.try_take(MIN_BLOCK, false).unwrap().expect("the idle 8 KiB block");
        assert_eq!(small.size(), 2 * MIN_BLOCK);
        drop(small);
        drop(pools);
        assert_eq!(dev.pinned_bytes(), 0);
    }

    #[test]
    fn a_slot_to_reuse_once_it_reaches_a_value_waits_for_it() {
        let dev = HostDevice::new(0);
        let pools = Pools::new(Arc::new(dev.clone()), MIN_BLOCK);
        let slot = pools.flag().unwrap();
        let flag = slot.flag();
        slot.store(1);
        slot.reuse_once(2);
        drop(slot);
        // Given back before the stream got past its wait: still in use, and never lent again
        // meanwhile (the next slot is another one).
        assert_eq!(pools.stats().flags_in_use, 1);
        let other = pools.flag().unwrap();
        assert_ne!(other.flag().host, flag.host);
        // SAFETY: the slot's page lives as long as the pools; nothing else writes this slot.
        unsafe { flag.atomic() }.store(2, std::sync::atomic::Ordering::Release);
        assert_eq!(pools.stats().flags_in_use, 1, "only `other` is in use once the value is reached");
        drop(other);
        // The slot reached its value: lent again, zeroed.
        let again = [pools.flag().unwrap(), pools.flag().unwrap()];
        let same = again.iter().find(|s| s.flag().host == flag.host).expect("the slot is lent again");
        assert_eq!(same.load(), 0);
        drop(again);
        assert_eq!(pools.stats().flags_in_use, 0);
        drop(pools);
        assert_eq!(dev.pinned_bytes(), 0, "no slot pending: the flag page was freed");
    }

    #[test]
    fn a_pool_dropped_with_a_slot_a_stream_may_still_wait_on_frees_its_flag_pages_once_it_passed() {
        let dev = HostDevice::new(0);
        let pools = Pools::new(Arc::new(dev.clone()), MIN_BLOCK);
        let slot = pools.flag().unwrap();
        let flag = slot.flag();
        slot.reuse_once(2);
        drop(slot);
        drop(pools);
        assert!(dev.pinned_bytes() > 0, "the flag page outlives the pools while the slot may be waited on");
        // The stream gets past its wait.
        // SAFETY: the page is freed only once the slot reads 2, after this store.
        unsafe { flag.atomic() }.store(2, std::sync::atomic::Ordering::Release);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while dev.pinned_bytes() > 0 {
            assert!(std::time::Instant::now() < deadline, "the flag page was not freed once its slot passed");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
