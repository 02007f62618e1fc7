//! Pinned, device-mapped host memory for the argument lists GPU kernels read (the pack
//! kernels' segment lists).
//!
//! The host writes a list before it queues the launch, and the kernel reads it over the bus:
//! no copy is queued for it. A copy to device memory would need a stream of its own, and a
//! copy from pageable memory may wait for its stream, which may wait for the very operation
//! the calling thread is queueing (the queue-order rule:
//! `docs/architecture.md#the-queue-order-rule`). With the list in mapped memory, the launch depends
//! on nothing but its own stream.
//!
//! Blocks are page-sized and larger powers of two, reused once the stream that read one has
//! passed the launch (the [`ArgList`] is a keep-alive the device drops then); the device
//! frees them all when it goes.

use std::sync::{Arc, Mutex, PoisonError};

use super::{Driver, Gpu};
use crate::api::error::Result;
use crate::device::DevicePtr;

/// The smallest block: a page.
const MIN_BLOCK: usize = 4096;

/// The lists of one device.
#[derive(Debug, Default)]
pub(crate) struct ArgLists {
    /// Idle blocks by size class (`MIN_BLOCK << class`): `(host address, device address)`.
    idle: Mutex<Vec<Vec<(usize, u64)>>>,
    /// Every block allocated, `(host address, bytes)`, for the device to free.
    all: Mutex<Vec<(usize, usize)>>,
}

/// One list's block, back to the idle blocks when dropped.
#[derive(Debug)]
pub(crate) struct ArgList {
    lists: Arc<ArgLists>,
    class: usize,
    host: usize,
    device: u64,
}

impl ArgLists {
    /// A block holding `bytes`, with `bytes` copied into it: an idle one, else a new one from
    /// `alloc` (pinned, device-mapped memory of the given size, and its device address).
    pub(crate) fn take(
        self: &Arc<Self>,
        bytes: &[u8],
        alloc: impl FnOnce(usize) -> Result<(*mut u8, DevicePtr)>,
    ) -> Result<ArgList> {
        let size = bytes.len().max(MIN_BLOCK).next_power_of_two();
        let class = (size / MIN_BLOCK).trailing_zeros() as usize;
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).get_mut(class).and_then(Vec::pop);
        let (host, device) = match idle {
            Some(block) => block,
            None => {
                let (host, device) = alloc(size)?;
                self.all.lock().unwrap_or_else(PoisonError::into_inner).push((host as usize, size));
                (host as usize, device.0)
            }
        };
        // SAFETY: the block holds `size >= bytes.len()` bytes and is this list's alone until
        // it is dropped (taken off the idle blocks or fresh).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), host as *mut u8, bytes.len()) };
        Ok(ArgList { lists: Arc::clone(self), class, host, device })
    }

    /// [`ArgLists::take`] with `device`'s pinned, mapped memory.
    pub(crate) fn take_on<R: Driver>(self: &Arc<Self>, device: &Gpu<R>, bytes: &[u8]) -> Result<ArgList> {
        self.take(bytes, |size| {
            let host = device.alloc_pinned(size)?;
            match device.mapped(host) {
                Ok(mapped) => Ok((host, mapped)),
                Err(e) => {
                    // SAFETY: just allocated; nothing uses it.
                    unsafe { device.free_pinned(host) };
                    Err(e)
                }
            }
        })
    }

    /// Every block allocated, `(host address, bytes)`: the device frees them when it goes,
    /// once no kernel can read them.
    pub(crate) fn blocks(&self) -> Vec<(*mut u8, usize)> {
        self.all.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|&(p, n)| (p as *mut u8, n)).collect()
    }
}

impl ArgList {
    /// The list's device address.
    pub(crate) fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.device)
    }
}

impl Drop for ArgList {
    fn drop(&mut self) {
        let mut idle = self.lists.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() <= self.class {
            idle.resize_with(self.class + 1, Vec::new);
        }
        idle[self.class].push((self.host, self.device));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_by_size_class() {
        let lists = Arc::new(ArgLists::default());
        let mut backing: Vec<Vec<u8>> = Vec::new();
        let mut alloc = |n: usize| {
            backing.push(vec![0u8; n]);
            let p = backing.last_mut().unwrap().as_mut_ptr();
            Ok((p, DevicePtr(p as u64 + 1)))
        };
        let a = lists.take(&[1, 2, 3], &mut alloc).unwrap();
        // SAFETY: the block is live (owned by `backing`) and holds the three bytes written.
        assert_eq!(unsafe { std::slice::from_raw_parts(a.host as *const u8, 3) }, &[1, 2, 3]);
        assert_eq!(a.device_ptr().0, a.host as u64 + 1);
        let first = a.host;
        drop(a);
        let b = lists.take(&[9; 100], |_| panic!("an idle block of the class exists")).unwrap();
        assert_eq!(b.host, first, "the idle block is reused");
        let c = lists.take(&[0; MIN_BLOCK + 1], &mut alloc).unwrap();
        assert_eq!(lists.blocks().len(), 2);
        assert_eq!(lists.blocks()[1].1, 2 * MIN_BLOCK, "the next class up");
        drop((b, c));
    }
}
