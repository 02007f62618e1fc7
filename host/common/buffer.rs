//! Raw views of user buffers for operations in flight, and reusable scratch memory.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::error::{Error, Result};

/// A pointer and length erased from a borrowed slice, for an operation that is in flight.
///
/// Algorithms address disjoint blocks of one buffer while MPI writes other blocks, which
/// borrowed slices cannot express. Whoever makes a `RawBuf` keeps the memory borrowed (the
/// operation's [`crate::Scope`], or the blocking call's frame) until the operation completes.
#[derive(Debug)]
pub(crate) struct RawBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for RawBuf<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RawBuf<T> {}

// SAFETY: a RawBuf is an address; the operation that owns it is the only user of the memory
// while it is in flight (see the type's docs), so moving it to the progress thread is sound for
// Send element types.
unsafe impl<T: Send> Send for RawBuf<T> {}
// SAFETY: shared references to a RawBuf only read the address.
unsafe impl<T: Sync> Sync for RawBuf<T> {}

/// The address given to MPI for empty buffers. An empty slice's pointer is "dangling": for
/// byte-aligned types it is `0x1`, which is exactly Open MPI's `MPI_IN_PLACE`, so passing it
/// would turn an empty send into an in-place operation. MPI never dereferences it (the count is
/// zero), but it must be a real, distinct address.
static EMPTY: [u64; 8] = [0; 8];

/// `s`'s address, or [`EMPTY`]'s for an empty slice. Only for reading: a pointer taken from a
/// shared slice may not be written through (see [`address_mut`]).
pub(crate) fn address<T>(s: &[T]) -> *mut T {
    if s.is_empty() { EMPTY.as_ptr().cast_mut().cast() } else { s.as_ptr().cast_mut() }
}

/// `s`'s address, for writing through, or [`EMPTY`]'s for an empty slice (never written: its
/// length is zero).
pub(crate) fn address_mut<T>(s: &mut [T]) -> *mut T {
    if s.is_empty() { EMPTY.as_ptr().cast_mut().cast() } else { s.as_mut_ptr() }
}

impl<T> RawBuf<T> {
    /// A view of a buffer the operation reads and writes.
    pub(crate) fn from_mut(s: &mut [T]) -> Self {
        // The pointer comes from the unique borrow: one taken through a shared reborrow (as
        // `address` does) permits reads only, and every write through the view would be UB.
        RawBuf { ptr: address_mut(s), len: s.len() }
    }

    /// A view of a buffer the operation only reads. Nothing in the crate writes through a
    /// `RawBuf` made here: such buffers are only passed as send blocks or reduce sources.
    pub(crate) fn from_ref(s: &[T]) -> Self {
        RawBuf { ptr: address(s), len: s.len() }
    }

    /// A view of `len` elements at `ptr`, memory the caller owns for the operation (staging
    /// slots). Empty views get the same distinct address as empty slices.
    pub(crate) fn from_raw(ptr: *mut T, len: usize) -> Self {
        if len == 0 { RawBuf { ptr: EMPTY.as_ptr().cast_mut().cast(), len } } else { RawBuf { ptr, len } }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn ptr(&self) -> *mut T {
        self.ptr
    }

    /// The sub-block `[start, start + len)`, clamped to the buffer.
    pub(crate) fn block(&self, start: usize, len: usize) -> RawBuf<T> {
        let start = start.min(self.len);
        let len = len.min(self.len - start);
        // SAFETY: `start <= self.len`, so the offset stays inside (or one past) the allocation.
        RawBuf { ptr: unsafe { self.ptr.add(start) }, len }
    }

    /// The block as a slice.
    ///
    /// # Safety
    /// The memory must be valid for reads for `'a` and not written by anyone meanwhile.
    pub(crate) unsafe fn as_slice<'a>(&self) -> &'a [T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: guaranteed by the caller; the pointer came from a slice of at least `len`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The block as a mutable slice.
    ///
    /// # Safety
    /// The memory must be valid for writes for `'a` and not accessed by anyone else meanwhile
    /// (in particular not covered by a pending receive or another live slice).
    pub(crate) unsafe fn as_mut_slice<'a>(&self) -> &'a mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: guaranteed by the caller; the pointer came from a slice of at least `len`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Copy> RawBuf<T> {
    /// Copies `src` into this block (equal lengths).
    ///
    /// # Safety
    /// `src` must be readable, this block writable, neither otherwise accessed meanwhile; they
    /// may not overlap unless they are the same block.
    pub(crate) unsafe fn copy_from(&self, src: RawBuf<T>) {
        let n = self.len.min(src.len);
        if n == 0 || std::ptr::eq(self.ptr, src.ptr) {
            return;
        }
        // SAFETY: guaranteed by the caller.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr, self.ptr, n) };
    }

    /// Copies `src` into this block (equal lengths) like [`RawBuf::copy_from`], writing around
    /// the caches where the CPU can (non-temporal stores on x86-64): for a destination nobody
    /// reads soon, this saves reading each line in before overwriting it and keeps the caches
    /// for the source. Measured in `docs/topology.md`.
    ///
    /// # Safety
    /// As for [`RawBuf::copy_from`].
    pub(crate) unsafe fn stream_from(&self, src: RawBuf<T>) {
        let n = self.len.min(src.len);
        if n == 0 || std::ptr::eq(self.ptr, src.ptr) {
            return;
        }
        // SAFETY: guaranteed by the caller, for `n` elements of both.
        unsafe { stream_bytes(self.ptr.cast(), src.ptr.cast(), n * size_of::<T>()) };
    }
}

/// Copies `len` bytes from `src` to `dst` with non-temporal stores, after an ordinary copy up
/// to `dst`'s first 16-byte boundary; the tail too is copied ordinarily. A store fence at the
/// end orders the streamed stores before anything this thread does next (such as a barrier
/// message).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping, not otherwise accessed
/// meanwhile.
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn stream_bytes(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LINE: usize = 64;
    let head = dst.align_offset(16).min(len);
    let body = (len - head) / LINE * LINE;
    // SAFETY: all ranges lie within the `len` bytes the caller vouches for; `dst + head` is
    // 16-byte aligned, as `_mm_stream_si128` needs, and so is every 16-byte step after it.
    // SSE2 is part of the x86-64 baseline.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (s, d) = (src.add(head), dst.add(head));
        for line in (0..body).step_by(LINE) {
            for part in (0..LINE).step_by(16) {
                let v = _mm_loadu_si128(s.add(line + part).cast::<__m128i>());
                _mm_stream_si128(d.add(line + part).cast::<__m128i>(), v);
            }
        }
        std::ptr::copy_nonoverlapping(s.add(body), d.add(body), len - head - body);
        _mm_sfence();
    }
}

/// An ordinary copy where the CPU has no non-temporal stores we use, and under Miri (which does
/// not model the store fence).
///
/// # Safety
/// As for the x86-64 version.
#[cfg(any(not(target_arch = "x86_64"), miri))]
unsafe fn stream_bytes(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: guaranteed by the caller.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

const SCRATCH_ALIGN: usize = 64;

/// A heap block aligned to 64 bytes, reused between operations.
#[derive(Debug)]
struct Block {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: a Block exclusively owns its allocation.
unsafe impl Send for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated with exactly this layout in `ScratchPool::take`.
        unsafe { std::alloc::dealloc(self.ptr, Layout::from_size_align_unchecked(self.bytes, SCRATCH_ALIGN)) };
    }
}

/// Scratch memory for algorithms, kept between operations so large collectives do not pay for
/// fresh pages (page faults on a 32 MiB temporary cost milliseconds) on every call.
///
/// Once [`ScratchPool::leak_flag`] is set (an operation left sends MPI may still read from its
/// scratch: `transport::OnError::Abandon`), blocks given back are leaked instead.
#[derive(Debug, Default)]
pub(crate) struct ScratchPool {
    free: Mutex<Vec<Block>>,
    leak: Arc<AtomicBool>,
}

/// Keeps at most this many idle blocks; larger pools only hold memory nobody uses.
const MAX_IDLE_BLOCKS: usize = 4;

impl ScratchPool {
    /// The flag that makes this pool leak the blocks given back from now on.
    pub(crate) fn leak_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.leak)
    }

    /// A scratch buffer of `len` elements of `T` (contents unspecified but initialized bytes).
    pub(crate) fn take<T: bytemuck::Pod>(&self, len: usize) -> Result<Scratch<'_, T>> {
        let bytes = len.max(1).checked_mul(std::mem::size_of::<T>().max(1));
        let layout = bytes
            .filter(|_| std::mem::align_of::<T>() <= SCRATCH_ALIGN)
            .and_then(|b| Layout::from_size_align(b, SCRATCH_ALIGN).ok())
            .ok_or(Error::CountOverflow { what: "scratch buffer", value: len as u128 })?;
        let bytes = layout.size();
        let reuse = {
            let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
            free.iter().position(|b| b.bytes >= bytes).map(|i| free.swap_remove(i))
        };
        let block = reuse.unwrap_or_else(|| {
            // SAFETY: the layout has non-zero size. Zeroed memory makes every byte initialized,
            // so any Pod view of it is a valid value.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                std::alloc::handle_alloc_error(layout);
            }
            Block { ptr, bytes }
        });
        Ok(Scratch { pool: self, block: Some(block), len, _t: PhantomData })
    }
}

/// A scratch buffer borrowed from a [`ScratchPool`]; returns to it on drop.
#[derive(Debug)]
pub(crate) struct Scratch<'p, T> {
    pool: &'p ScratchPool,
    block: Option<Block>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> Scratch<'_, T> {
    pub(crate) fn raw(&mut self) -> RawBuf<T> {
        let ptr = self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr.cast());
        RawBuf { ptr, len: self.len }
    }
}

impl<T> Drop for Scratch<'_, T> {
    fn drop(&mut self) {
        if let Some(block) = self.block.take() {
            if self.pool.leak.load(Ordering::Acquire) {
                // MPI may still read it (see `ScratchPool`).
                std::mem::forget(block);
                return;
            }
            let mut free = self.pool.free.lock().unwrap_or_else(PoisonError::into_inner);
            if free.len() < MAX_IDLE_BLOCKS {
                free.push(block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{EMPTY, MAX_IDLE_BLOCKS, RawBuf, SCRATCH_ALIGN, ScratchPool};
    use crate::api::error::Error;

    #[test]
    fn a_streamed_copy_is_exact_at_every_alignment_and_length() {
        let src: Vec<u8> = (0u8..=255).cycle().skip(3).step_by(7).take(1000).collect();
        for offset in [0, 1, 5, 15, 16, 17, 63] {
            for len in [0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 500, 1000 - 63] {
                let mut dst = vec![0u8; 1000 + 64];
                let (d, s) = (RawBuf::from_mut(&mut dst).block(offset, len), RawBuf::from_ref(&src[..len]));
                // SAFETY: distinct vectors, both alive and untouched during the copy.
                unsafe { d.stream_from(s) };
                assert_eq!(&dst[offset..offset + len], &src[..len], "offset {offset} len {len}");
                assert!(dst[..offset].iter().chain(&dst[offset + len..]).all(|&b| b == 0), "{offset} {len}");
            }
        }
        let mut wide = vec![0u64; 300];
        let from: Vec<u64> = (0..300).collect();
        // SAFETY: as above.
        unsafe { RawBuf::from_mut(&mut wide).stream_from(RawBuf::from_ref(&from)) };
        assert_eq!(wide, from);
    }

    #[test]
    fn views_of_a_borrowed_buffer_write_through_to_it() {
        let mut v: Vec<u32> = (0..10).collect();
        let raw = RawBuf::from_mut(&mut v);
        let (low, high) = (raw.block(0, 4), raw.block(6, 100));
        assert_eq!((low.len(), high.len()), (4, 4), "blocks are clamped to the buffer");
        // SAFETY: `v` is borrowed for the views' use only; the two blocks are disjoint.
        unsafe {
            let (l, h) = (low.as_mut_slice(), high.as_mut_slice());
            l[0] = 100;
            h[3] = 900;
            high.block(0, 2).copy_from(low.block(1, 2));
        }
        assert_eq!(v, [100, 1, 2, 3, 4, 5, 1, 2, 8, 900]);
    }

    #[test]
    fn empty_views_are_a_distinct_address_and_never_touched() {
        let mut bytes: [u8; 0] = [];
        let raw = RawBuf::from_mut(&mut bytes);
        assert_eq!(raw.ptr().cast_const(), EMPTY.as_ptr().cast(), "not the dangling 0x1 (MPI_IN_PLACE)");
        assert_eq!(RawBuf::<u64>::from_raw(std::ptr::null_mut(), 0).ptr().cast_const(), EMPTY.as_ptr());
        let past = RawBuf::from_ref(&[1u16, 2][..]).block(5, 1);
        // SAFETY: empty views are never dereferenced.
        unsafe {
            assert!(raw.as_mut_slice().is_empty() && past.as_slice().is_empty());
            raw.copy_from(raw);
        }
    }

    #[test]
    fn scratch_is_zeroed_aligned_and_reused() {
        let pool = ScratchPool::default();
        let first = {
            let mut s = pool.take::<f64>(100).unwrap();
            let raw = s.raw();
            assert_eq!(raw.ptr() as usize % SCRATCH_ALIGN, 0);
            // SAFETY: the scratch buffer is this test's alone while `s` lives.
            let view = unsafe { raw.as_mut_slice() };
            assert!(view.iter().all(|&x| x == 0.0));
            view.fill(1.5);
            raw.ptr().cast::<u8>()
        };
        // A smaller request of another type reuses the idle block, contents as left.
        let mut again = pool.take::<u64>(3).unwrap();
        let raw = again.raw();
        assert_eq!(raw.ptr().cast::<u8>(), first);
        // SAFETY: as above.
        assert_eq!(unsafe { raw.as_slice() }, [1.5f64.to_bits(); 3]);
        // Zero elements and zero-sized types still get a block of their own.
        let mut none = pool.take::<u32>(0).unwrap();
        let mut units = pool.take::<()>(5).unwrap();
        // SAFETY: as above.
        unsafe {
            assert!(none.raw().as_mut_slice().is_empty());
            assert_eq!(units.raw().as_mut_slice().len(), 5);
        }
    }

    #[test]
    fn scratch_keeps_a_few_idle_blocks_and_refuses_impossible_ones() {
        let pool = ScratchPool::default();
        let taken: Vec<_> = (1..=MAX_IDLE_BLOCKS + 2).map(|n| pool.take::<u8>(n * 64).unwrap()).collect();
        drop(taken);
        assert_eq!(pool.free.lock().unwrap().len(), MAX_IDLE_BLOCKS);
        assert!(matches!(pool.take::<u64>(usize::MAX / 4), Err(Error::CountOverflow { .. })));
        #[repr(C, align(128))]
        #[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
        struct Wide([u8; 128]);
        assert!(matches!(pool.take::<Wide>(1), Err(Error::CountOverflow { .. })));
    }
}
