//! Safe host-side launches of the kernel bodies on slices, for the host device, the CPU reducer and
//! tests. Each runs the same body a GPU thread runs, once per emulated thread of the [`HostGrid`].

use core::sync::atomic::AtomicU32;

use crate::grid::HostGrid;
use crate::pack::Segment;
use crate::{Element, ReduceOp, flag, pack, reduce};

/// Panics unless `segments` all fit in a scattered buffer of `scattered` bytes; returns their
/// total length.
fn segments_fit(segments: &[Segment], scattered: usize) -> usize {
    let mut total = 0usize;
    for (k, s) in segments.iter().enumerate() {
        let end = s.offset.checked_add(s.len);
        assert!(
            end.is_some_and(|e| e <= scattered as u64),
            "segment {k} ({}..{}+{}) is outside the buffer of {scattered} bytes",
            s.offset,
            s.offset,
            s.len
        );
        total =
            usize::try_from(s.len).ok().and_then(|len| total.checked_add(len)).expect("segment lengths overflow usize");
    }
    total
}

impl HostGrid {
    /// `dst[i] = O::combine(dst[i], src[i])`.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn reduce<T: Element, O: ReduceOp<T>>(self, dst: &mut [T], src: &[T]) {
        assert_eq!(dst.len(), src.len(), "reduce: dst and src lengths differ");
        let (d, s, n) = (dst.as_mut_ptr(), src.as_ptr(), dst.len());
        // SAFETY: both slices hold `n` aligned elements, `&mut`/`&` borrows cannot overlap, and
        // the emulated threads run one after another on this thread.
        self.run(|t| unsafe { reduce::reduce::<T, O, _>(t, d, s, n) });
    }

    /// `dst[i] = O::combine(a[i], b[i])`.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn reduce3<T: Element, O: ReduceOp<T>>(self, dst: &mut [T], a: &[T], b: &[T]) {
        assert!(dst.len() == a.len() && a.len() == b.len(), "reduce3: dst, a and b lengths differ");
        let (d, x, y, n) = (dst.as_mut_ptr(), a.as_ptr(), b.as_ptr(), dst.len());
        // SAFETY: as in `reduce`; `a` and `b` may overlap each other, which only reads allow.
        self.run(|t| unsafe { reduce::reduce3::<T, O, _>(t, d, x, y, n) });
    }

    /// `dst[i] = O::finish(dst[i], ranks)` (nothing when the operator has no finishing step).
    pub fn finish<T: Element, O: ReduceOp<T>>(self, dst: &mut [T], ranks: u32) {
        let (d, n) = (dst.as_mut_ptr(), dst.len());
        // SAFETY: `dst` holds `n` aligned elements and is exclusively borrowed.
        self.run(|t| unsafe { reduce::finish::<T, O, _>(t, d, n, ranks) });
    }

    /// Copies `rows` rows of `row_bytes` bytes from `src` (rows `src_pitch` bytes apart) to `dst`
    /// (rows `dst_pitch` bytes apart).
    ///
    /// # Panics
    /// If a row does not fit its buffer, or two destination rows overlap
    /// (`rows > 1 && dst_pitch < row_bytes`).
    pub fn copy_2d(
        self,
        dst: &mut [u8],
        dst_pitch: usize,
        src: &[u8],
        src_pitch: usize,
        row_bytes: usize,
        rows: usize,
    ) {
        let extent =
            |pitch: usize| rows.checked_sub(1).map_or(Some(0), |r| r.checked_mul(pitch)?.checked_add(row_bytes));
        assert!(extent(dst_pitch).is_some_and(|e| e <= dst.len()), "copy_2d: the rows do not fit dst");
        assert!(extent(src_pitch).is_some_and(|e| e <= src.len()), "copy_2d: the rows do not fit src");
        assert!(rows <= 1 || dst_pitch >= row_bytes, "copy_2d: destination rows overlap");
        let (d, s) = (dst.as_mut_ptr(), src.as_ptr());
        // SAFETY: every row is inside its buffer (checked), destination rows do not overlap each
        // other (checked) or `src` (distinct borrows).
        self.run(|t| unsafe { pack::copy_2d(t, d, dst_pitch, s, src_pitch, row_bytes, rows) });
    }

    /// Concatenates `src[offset..offset + len]` of every segment into the front of `dst`; returns
    /// the number of bytes written.
    ///
    /// # Panics
    /// If a segment is outside `src` or `dst` is shorter than the segments' total length.
    pub fn pack_segments(self, dst: &mut [u8], src: &[u8], segments: &[Segment]) -> usize {
        let total = segments_fit(segments, src.len());
        assert!(total <= dst.len(), "pack_segments: {total} bytes do not fit dst of {}", dst.len());
        let (d, s, g, n) = (dst.as_mut_ptr(), src.as_ptr(), segments.as_ptr(), segments.len());
        // SAFETY: every segment is inside `src` and the packed total inside `dst` (checked); the
        // buffers are distinct borrows.
        self.run(|t| unsafe { pack::pack_segments(t, d, s, g, n) });
        total
    }

    /// Spreads the front of `src` over the segments of `dst`: the inverse of
    /// [`HostGrid::pack_segments`]; returns the number of bytes read. Where segments overlap, the
    /// overlap holds one of their bytes: the later segment's with one thread, unspecified with
    /// more (as on a GPU, where the kernel requires segments that do not overlap).
    ///
    /// # Panics
    /// If a segment is outside `dst` or `src` is shorter than the segments' total length.
    pub fn unpack_segments(self, dst: &mut [u8], src: &[u8], segments: &[Segment]) -> usize {
        let total = segments_fit(segments, dst.len());
        assert!(total <= src.len(), "unpack_segments: src of {} bytes holds less than {total}", src.len());
        let (d, s, g, n) = (dst.as_mut_ptr(), src.as_ptr(), segments.as_ptr(), segments.len());
        // SAFETY: as in `pack_segments`. Overlapping segments are no data race here: the emulated
        // threads run one after another.
        self.run(|t| unsafe { pack::unpack_segments(t, d, s, g, n) });
        total
    }

    /// Returns once `flag` has reached `value` (modulo 2³², see [`flag::reached`]), polling with
    /// acquire loads and backoff, like the stream-wait kernel.
    pub fn stream_wait(self, flag: &AtomicU32, value: u32) {
        let f = flag.as_ptr().cast_const();
        // SAFETY: the flag is a live, aligned atomic, accessed only atomically.
        self.run(|t| unsafe { flag::stream_wait(t, f, value) });
    }

    /// Stores `value` to `flag` with a release store, like the signal kernel.
    pub fn signal(self, flag: &AtomicU32, value: u32) {
        let f = flag.as_ptr();
        // SAFETY: as in `stream_wait`.
        self.run(|t| unsafe { flag::signal(t, f, value) });
    }
}
