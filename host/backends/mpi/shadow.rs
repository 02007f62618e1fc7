//! Copies of an operation's buffers that MPI works on instead of the caller's, for
//! communicators whose operations may be abandoned while MPI still holds them
//! ([`OnTimeout::Error`](crate::reliability::OnTimeout::Error) without ULFM: MPI offers no way to
//! take a collective back). The copies belong to the library: an abandoned operation leaks them
//! with its MPI requests, so MPI never writes memory the caller got back. A completed one
//! copies the results into the caller's buffers. Why and what it costs: `docs/reliability.md`.

use std::any::Any;

use duralumin_kernels::Element;

/// See the module docs.
#[derive(Default)]
pub(crate) struct Shadow {
    /// The copies (boxed slices of each element type).
    owned: Vec<Box<dyn Any + Send>>,
    /// `(copy, caller's buffer, bytes)` of every written buffer, copied back on success.
    back: Vec<(usize, usize, usize)>,
}

impl std::fmt::Debug for Shadow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadow").field("buffers", &self.owned.len()).finish()
    }
}

impl Shadow {
    /// A copy of `s` (`wanted` to be copied back into `s` once the operation succeeds).
    fn copy<'a, T: Element>(&mut self, s: &[T], back: Option<usize>) -> &'a mut [T] {
        let mut copy: Box<[T]> = s.into();
        let (ptr, len) = (copy.as_mut_ptr(), copy.len());
        if let Some(to) = back {
            self.back.push((ptr as usize, to, size_of_val(s)));
        }
        self.owned.push(Box::new(copy));
        // SAFETY: the box's heap memory does not move when the box does; it lives as long as
        // `self` (or for ever, once abandoned), and the caller promises not to use the slice
        // beyond that.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    /// A copy of a buffer the operation reads.
    ///
    /// # Safety
    /// The returned slice must not be used after [`Shadow::commit`] or a drop of `self`.
    pub(crate) unsafe fn read<'a, T: Element>(&mut self, s: &[T]) -> &'a [T] {
        self.copy(s, None)
    }

    /// A copy of a buffer the operation writes (it starts as the buffer's contents, so
    /// elements the operation leaves alone stay as they were).
    ///
    /// # Safety
    /// As [`Shadow::read`]; `s` must stay borrowed until [`Shadow::commit`] (which writes it).
    pub(crate) unsafe fn write<'a, T: Element>(&mut self, s: &mut [T]) -> &'a mut [T] {
        // From the `&mut` itself: the copy back writes through this address.
        let to = s.as_mut_ptr() as usize;
        self.copy(s, Some(to))
    }

    /// Copies of a list of `(buffer, peer)` the operation reads.
    ///
    /// # Safety
    /// As [`Shadow::read`].
    pub(crate) unsafe fn reads<'a, T: Element>(&mut self, list: &[(&[T], usize)]) -> Vec<(&'a [T], usize)> {
        list.iter().map(|&(b, p)| (&*self.copy(b, None), p)).collect()
    }

    /// Copies of a list of `(buffer, peer)` the operation writes.
    ///
    /// # Safety
    /// As [`Shadow::write`], for every buffer of the list.
    pub(crate) unsafe fn writes<'a, T: Element>(
        &mut self,
        list: &mut [(&mut [T], usize)],
    ) -> Vec<(&'a mut [T], usize)> {
        list.iter_mut()
            .map(|(b, p)| {
                let to = b.as_mut_ptr() as usize;
                (self.copy(b, Some(to)), *p)
            })
            .collect()
    }

    /// Copies the results into the caller's buffers.
    ///
    /// # Safety
    /// The operation has completed (MPI no longer touches the copies) and every buffer given to
    /// [`Shadow::write`] is still borrowed by the operation's caller.
    pub(crate) unsafe fn commit(self) {
        for &(from, to, bytes) in &self.back {
            // SAFETY: `from` is one of our copies, `to` the caller's buffer of the same size,
            // still borrowed (the caller's contract); they are distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(from as *const u8, to as *mut u8, bytes) };
        }
    }

    /// The operation was abandoned: MPI may still write the copies, so they are never freed.
    pub(crate) fn abandon(self) {
        std::mem::forget(self.owned);
    }
}
