//! The builtin kernel set (feature `builtin-kernels`): reductions for every builtin
//! (element, operator) pair plus the type-independent pack, unpack, stream-wait and signal
//! kernels. The library's build script compiles this crate with the feature for NVPTX and AMDGPU;
//! user kernel crates depend on the crate without it, so their modules hold only their own
//! kernels.

crate::builtin_reduce_pairs!(crate::reduce_kernels);

crate::__kernel_entry! {
    "duralumin_copy_2d",
    (dst: *mut u8, dst_pitch: usize, src: *const u8, src_pitch: usize, row_bytes: usize, rows: usize)
    => crate::pack::copy_2d(crate::grid::DeviceGrid, dst, dst_pitch, src, src_pitch, row_bytes, rows)
}

crate::__kernel_entry! {
    "duralumin_pack_segments",
    (dst: *mut u8, src: *const u8, segments: *const crate::pack::Segment, count: usize)
    => crate::pack::pack_segments(crate::grid::DeviceGrid, dst, src, segments, count)
}

crate::__kernel_entry! {
    "duralumin_unpack_segments",
    (dst: *mut u8, src: *const u8, segments: *const crate::pack::Segment, count: usize)
    => crate::pack::unpack_segments(crate::grid::DeviceGrid, dst, src, segments, count)
}

crate::__kernel_entry! {
    "duralumin_stream_wait",
    (flag: *const u32, value: u32)
    => crate::flag::stream_wait(crate::grid::DeviceGrid, flag, value)
}

crate::__kernel_entry! {
    "duralumin_signal",
    (flag: *mut u32, value: u32)
    => crate::flag::signal(crate::grid::DeviceGrid, flag, value)
}

#[cfg(test)]
mod tests {
    use crate::names::fixed;

    #[test]
    fn fixed_names_match_the_exported_literals() {
        // The literals above are repeated here through `fixed`; a rename must change both.
        assert_eq!(
            fixed::ALL,
            [
                "duralumin_copy_2d",
                "duralumin_pack_segments",
                "duralumin_unpack_segments",
                "duralumin_stream_wait",
                "duralumin_signal"
            ]
        );
    }
}
