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

/// A new zero-filled block of `len` bytes (at least one), 256-byte aligned as device memory is.
pub(crate) fn alloc(len: usize, kind: Kind) -> Option<usize> {
    let align = match kind {
        Kind::Device => 256,
        Kind::Pinned { .. } => 4096,
    };
    let layout = Layout::from_size_align(len.max(1), align).ok()?;
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    if ptr == 0 {
        return None;
    }
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

/// Checks that the device may access `[ptr, ptr + len)`: device memory or mapped pinned memory.
pub(crate) fn device_range(ptr: u64, len: usize, what: &str) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    match find(&heap(), ptr as usize, len) {
        Ok((_, Kind::Device | Kind::Pinned { mapped: true })) => Ok(()),
        Ok((_, Kind::Pinned { mapped: false })) => {
            Err(Fault::illegal(format!("{what}: pinned memory at {ptr:#x} was not allocated with DEVICEMAP")))
        }
        Err(e) => Err(Fault::illegal(format!("{what}: device address {e}"))),
    }
}

/// Whether `[ptr, ptr + len)` is pinned host memory (else the driver treats it as pageable).
pub(crate) fn pinned(ptr: usize, len: usize) -> bool {
    matches!(find(&heap(), ptr, len.max(1)), Ok((_, Kind::Pinned { .. })))
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
        assert!(device_range(d as u64, 100, "t").is_ok());
        assert!(device_range(d as u64 + 50, 50, "t").is_ok());
        assert!(device_range(d as u64 + 50, 51, "t").is_err(), "past the end");
        assert!(device_range(d as u64 - 1, 1, "t").is_err(), "before the start");
        let p = alloc(64, Kind::Pinned { mapped: false }).unwrap();
        assert!(pinned(p, 64) && !pinned(d, 1));
        assert!(device_range(p as u64, 4, "t").is_err(), "unmapped pinned memory");
        assert!(mapped(p).is_err());
        free(d, "t", |k| k == Kind::Device).unwrap();
        assert!(device_range(d as u64, 1, "t").is_err(), "use after free");
        assert!(free(d, "t", |_| true).is_err(), "double free");
        assert!(free(p, "t", |k| k == Kind::Device).is_err(), "wrong kind");
        free(p, "t", |_| true).unwrap();
    }
}
