//! Device and pinned host memory: host allocations the simulator hands out and checks every
//! device-side access against.
//!
//! Device pointers are host addresses (unified addressing, as on a GPU where a pinned host
//! allocation's device address equals its host address). Freed blocks stay allocated for a
//! while (quarantined), marked freed, so a late access is reported instead of touching memory
//! the allocator has given to someone else.

use std::alloc::Layout;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::Fault;

/// What an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `cuMemAlloc`: device memory.
    Device,
    /// `cuMemHostAlloc`: page-locked host memory; `mapped` with `DEVICEMAP`.
    Pinned { mapped: bool },
}

struct Block {
    len: usize,
    kind: Kind,
    layout: Layout,
    freed: bool,
}

/// Bytes of freed blocks kept before the oldest go back to the allocator.
const QUARANTINE_BYTES: usize = 512 << 20;

#[derive(Default)]
struct Heap {
    blocks: BTreeMap<usize, Block>,
    quarantine: VecDeque<usize>,
    quarantined: usize,
}

static HEAP: Mutex<Heap> = Mutex::new(Heap { blocks: BTreeMap::new(), quarantine: VecDeque::new(), quarantined: 0 });

fn heap() -> MutexGuard<'static, Heap> {
    HEAP.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What fresh blocks hold (the driver does not clear memory it allocates).
const FRESH: u8 = 0xcd;
/// What freed blocks hold while quarantined.
const FREED: u8 = 0xdd;

/// A new block of `len` bytes (at least one) filled with [`FRESH`], 256-byte aligned as device
/// memory is.
pub(crate) fn alloc(len: usize, kind: Kind) -> Option<usize> {
    let align = match kind {
        Kind::Device => 256,
        Kind::Pinned { .. } => 4096,
    };
    let layout = Layout::from_size_align(len.max(1), align).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc(layout) } as usize;
    if ptr == 0 {
        return None;
    }
    // SAFETY: a fresh allocation of at least `len` bytes.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, FRESH, len) };
    heap().blocks.insert(ptr, Block { len, kind, layout, freed: false });
    Some(ptr)
}

/// Frees the block starting at `ptr`, which must be a live block of a kind `kind_ok` accepts.
pub(crate) fn free(ptr: usize, what: &str, kind_ok: impl Fn(Kind) -> bool) -> Result<(), Fault> {
    let mut h = heap();
    let block = match h.blocks.get_mut(&ptr) {
        Some(b) if !b.freed && kind_ok(b.kind) => b,
        Some(b) if b.freed => return Err(Fault::invalid(format!("{what}: {ptr:#x} was freed already"))),
        _ => return Err(Fault::invalid(format!("{what}: {ptr:#x} is not the start of such an allocation"))),
    };
    block.freed = true;
    let len = block.len;
    // SAFETY: the block's own `len` bytes, still allocated (quarantined); whoever reads them
    // now reads a use after free, which the poison makes visible.
    unsafe { std::ptr::write_bytes(ptr as *mut u8, FREED, len) };
    h.quarantine.push_back(ptr);
    h.quarantined += len;
    while h.quarantined > QUARANTINE_BYTES {
        let Some(old) = h.quarantine.pop_front() else { break };
        if let Some(b) = h.blocks.remove(&old) {
            h.quarantined -= b.len;
            // SAFETY: `old` came from `alloc_zeroed` with this layout and is no longer listed,
            // so nothing checked against it any more.
            unsafe { std::alloc::dealloc(old as *mut u8, b.layout) };
        }
    }
    Ok(())
}

/// The live block holding `[ptr, ptr + len)`, as `(start, kind)`.
fn find(h: &Heap, ptr: usize, len: usize) -> Result<(usize, Kind), String> {
    let end = ptr.checked_add(len).ok_or_else(|| format!("{ptr:#x} + {len} overflows"))?;
    match h.blocks.range(..=ptr).next_back() {
        Some((&start, b)) if end <= start + b.len => {
            if b.freed {
                Err(format!("[{ptr:#x}, +{len}) lies in a freed allocation ({start:#x}, {} bytes)", b.len))
            } else {
                Ok((start, b.kind))
            }
        }
        Some((&start, b)) if ptr < start + b.len.max(1) => {
            Err(format!("[{ptr:#x}, +{len}) runs past the end of its allocation ({start:#x}, {} bytes)", b.len))
        }
        _ => Err(format!("[{ptr:#x}, +{len}) is in no allocation")),
    }
}

/// Checks that the device may access `[ptr, ptr + len)`: device memory or page-locked memory
/// (with unified addressing its device address is its host address, mapped or not).
pub(crate) fn device_range(ptr: u64, len: usize, what: &str) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    find(&heap(), crate::usize_of(ptr), len)
        .map(drop)
        .map_err(|e| Fault::illegal(format!("{what}: device address {e}")))
}

/// Whether the host range `[ptr, ptr + len)` of a copy is pinned memory; `false` for memory the
/// simulator did not allocate (pageable, which the driver copies synchronously). A range that
/// starts in a pinned block and runs past it, or lies in a freed one, faults: no driver copies
/// that correctly.
pub(crate) fn pinned(ptr: usize, len: usize, what: &str) -> Result<bool, Fault> {
    let h = heap();
    match h.blocks.range(..=ptr).next_back() {
        Some((&start, b)) if matches!(b.kind, Kind::Pinned { .. }) && ptr < start + b.len.max(1) => {
            find(&h, ptr, len.max(1)).map(|_| true).map_err(|e| Fault::illegal(format!("{what}: host range {e}")))
        }
        _ => Ok(false),
    }
}

/// The device address of pinned memory at `ptr` (the same address), if it was allocated with
/// `DEVICEMAP`.
pub(crate) fn mapped(ptr: usize) -> Result<u64, Fault> {
    match find(&heap(), ptr, 1) {
        Ok((_, Kind::Pinned { mapped: true })) => Ok(ptr as u64),
        Ok(_) => Err(Fault::invalid(format!("{ptr:#x} is not host memory allocated with DEVICEMAP"))),
        Err(e) => Err(Fault::invalid(format!("cuMemHostGetDevicePointer: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_checked_against_live_blocks() {
        let d = alloc(100, Kind::Device).unwrap();
        // SAFETY: the block's 100 bytes are allocated.
        let fresh = unsafe { std::slice::from_raw_parts(d as *const u8, 100) };
        assert!(fresh.iter().all(|&b| b == FRESH), "new memory is poisoned, not zeroed");
        assert!(device_range(d as u64, 100, "t").is_ok());
        assert!(device_range(d as u64 + 50, 50, "t").is_ok());
        assert!(device_range(d as u64 + 50, 51, "t").is_err(), "past the end");
        assert!(device_range(d as u64 - 1, 1, "t").is_err(), "before the start");
        let p = alloc(64, Kind::Pinned { mapped: false }).unwrap();
        assert!(pinned(p, 64, "t").unwrap() && !pinned(d, 1, "t").unwrap());
        assert!(pinned(p + 60, 8, "t").is_err(), "a host range running past its pinned block");
        assert!(device_range(p as u64, 4, "t").is_ok(), "pinned memory, mapped or not (unified addressing)");
        assert!(mapped(p).is_err(), "not allocated with DEVICEMAP");
        free(d, "t", |k| k == Kind::Device).unwrap();
        assert!(device_range(d as u64, 1, "t").is_err(), "use after free");
        // SAFETY: a freed block stays allocated while quarantined (one block here, far below
        // the quarantine's bound).
        assert_eq!(unsafe { *(d as *const u8).add(99) }, FREED, "freed memory is poisoned");
        assert!(free(d, "t", |_| true).is_err(), "double free");
        assert!(free(p, "t", |k| k == Kind::Device).is_err(), "wrong kind");
        free(p, "t", |_| true).unwrap();
    }
}
