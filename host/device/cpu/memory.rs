//! The host device's memory: buffers, pinned memory, and where the work queued on each buffer
//! last is (see "Ordering across streams" in [the host device's docs](super)).

use std::alloc::Layout;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use duralumin_kernels::Element;

use super::HostDevice;
use super::executor::{Lane, LaneItem};
use crate::api::error::{Error, Result};
use crate::device::{DevicePtr, DeviceSlice, DeviceSliceMut, KeepAlive, sealed};

/// Alignment of host-device allocations: enough for the copy bodies' 16-byte accesses and for
/// any element type.
const ALIGN: usize = 64;

/// Memory of the host device, 64-byte aligned and zero-filled.
pub(super) struct Memory {
    pub(super) ptr: *mut u8,
    bytes: usize,
    ordinal: usize,
    /// Where the work queued on the memory last is, per executor (see "Ordering across
    /// streams" in [`super`]; unused for pinned memory, whose users order themselves with
    /// flags).
    uses: Mutex<Vec<Use>>,
}

/// An item of an executor that uses a buffer's memory: the `ticket`-th item queued on `lane`.
/// A lane that is gone has run all its items.
pub(super) struct Use {
    lane: Weak<Lane>,
    ticket: u64,
}

impl Use {
    /// The `ticket`-th item queued on `lane`.
    pub(super) fn new(lane: &Arc<Lane>, ticket: u64) -> Use {
        Use { lane: Arc::downgrade(lane), ticket }
    }

    /// The lane, while the item has not run yet.
    fn pending(&self) -> Option<Arc<Lane>> {
        self.lane.upgrade().filter(|lane| !lane.has_finished(self.ticket))
    }
}

/// Adds the uses among `uses` on lanes other than `lane` that have not run yet to `after`:
/// what work queued on `lane` must wait for (its own lane runs in order).
pub(super) fn pending_uses(uses: &[Use], lane: &Arc<Lane>, after: &mut Vec<LaneItem>) {
    for u in uses {
        if let Some(other) = u.pending().filter(|other| !Arc::ptr_eq(other, lane)) {
            after.push((other, u.ticket));
        }
    }
}

/// The host device's memory behind keep-alives (a buffer's [`DeviceSlice::keep_alive`]).
pub(super) fn memories(keep: &[KeepAlive]) -> impl Iterator<Item = &Memory> {
    keep.iter().filter_map(|k| k.downcast_ref::<Memory>())
}

// SAFETY: the memory is only accessed in stream order or after synchronizing (see the host
// device's module docs); the struct itself is an owned allocation (and a lock).
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    pub(super) fn uses(&self) -> MutexGuard<'_, Vec<Use>> {
        self.uses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the `ticket`-th item of `lane` as the memory's last use there (it comes after
    /// the lane's earlier ones), dropping uses that have run.
    pub(super) fn record(&self, lane: &Arc<Lane>, ticket: u64) {
        let mut uses = self.uses();
        uses.retain(|u| !std::ptr::eq(u.lane.as_ptr(), Arc::as_ptr(lane)) && u.pending().is_some());
        uses.push(Use::new(lane, ticket));
    }

    fn layout(bytes: usize) -> Result<Layout> {
        Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|_| Error::CountOverflow { what: "allocation", value: bytes as u128 })
    }

    pub(super) fn zeroed(bytes: usize, ordinal: usize) -> Result<Memory> {
        let layout = Self::layout(bytes)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory { what: "host device memory", bytes });
        }
        Ok(Memory { ptr, bytes, ordinal, uses: Mutex::default() })
    }

    /// Hands the allocation to the caller (pinned memory): it lives until
    /// [`Memory::from_raw`] takes it back.
    pub(super) fn into_raw(self) -> *mut u8 {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }

    /// Takes back an allocation handed out by [`Memory::into_raw`], freed when the result drops.
    ///
    /// # Safety
    /// `ptr` comes from [`Memory::into_raw`] of memory of `bytes` bytes, is taken back once, and
    /// nothing uses it once the result has dropped.
    pub(super) unsafe fn from_raw(ptr: *mut u8, bytes: usize, ordinal: usize) -> Memory {
        Memory { ptr, bytes, ordinal, uses: Mutex::default() }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Ok(layout) = Self::layout(self.bytes) {
            // SAFETY: allocated in `zeroed` with this layout (`from_raw` callers guarantee it).
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// A buffer of `T` in the host device's memory: the host device's counterpart of a
/// `CudaSlice<T>`. Read it with [`HostDevice::download`].
pub struct HostBuffer<T> {
    pub(super) mem: Arc<Memory>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer").field("len", &self.len).field("ordinal", &self.mem.ordinal).finish()
    }
}

impl<T> HostBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first element.
    pub(super) fn ptr(&self) -> *mut T {
        self.mem.ptr.cast::<T>()
    }
}

impl<T: Element> HostBuffer<T> {
    /// A zero-filled buffer of `len` elements on the host device `ordinal`.
    pub(super) fn zeroed(len: usize, ordinal: usize) -> Result<HostBuffer<T>> {
        let bytes =
            len.checked_mul(size_of::<T>()).ok_or(Error::CountOverflow { what: "buffer", value: len as u128 })?;
        Ok(HostBuffer { mem: Arc::new(Memory::zeroed(bytes, ordinal)?), len, _t: PhantomData })
    }
}

impl<T> sealed::Sealed for HostBuffer<T> {}

impl<T: Element> DeviceSlice<HostDevice> for HostBuffer<T> {
    type Elem = T;
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.mem.ptr as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn ordinal(&self) -> usize {
        self.mem.ordinal
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(Arc::clone(&self.mem) as KeepAlive)
    }
}

impl<T: Element> DeviceSliceMut<HostDevice> for HostBuffer<T> {}
