//! The builtin kernel set (feature `builtin-kernels`): reductions for every builtin
//! (element, operator) pair plus the type-independent pack, unpack, stream-wait, signal and
//! mover kernels. The library's build script compiles this crate with the feature for NVPTX and AMDGPU;
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

// The schedule as its 29 words (`Schedule::WORDS`, checked below): plain arguments every GPU
// kernel ABI passes alike.
crate::__kernel_entry! {
    "duralumin_mover",
    (w0: u64, w1: u64, w2: u64, w3: u64, w4: u64, w5: u64, w6: u64, w7: u64, w8: u64, w9: u64, w10: u64, w11: u64, w12: u64, w13: u64, w14: u64, w15: u64, w16: u64, w17: u64, w18: u64, w19: u64, w20: u64, w21: u64, w22: u64, w23: u64, w24: u64, w25: u64, w26: u64, w27: u64, w28: u64)
    => crate::mover::device_entry(&crate::mover::Schedule::from_words([w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15, w16, w17, w18, w19, w20, w21, w22, w23, w24, w25, w26, w27, w28]))
}

const _: () = assert!(crate::mover::Schedule::WORDS == 29);

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
                "duralumin_signal",
                "duralumin_mover"
            ]
        );
    }
}
