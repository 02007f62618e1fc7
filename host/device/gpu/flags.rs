//! Flags on the device: a stream stores to a flag, or waits until it reaches a value, by stream
//! memory operations or by the one-thread `signal`/`stream_wait` kernels ([`FlagPath`]).

use std::sync::atomic::Ordering;

use duralumin_kernels::flag::reached;
use duralumin_kernels::names::fixed;

use super::{Driver, FlagPath, Gpu, Shape, arg};
use crate::api::error::Result;
use crate::device::{Flag, KeepAlive};

impl<R: Driver> Gpu<R> {
    /// # Safety
    /// As [`crate::device::Device::write_flag`].
    pub(crate) unsafe fn write_flag(&self, stream: &R::Stream, flag: Flag, value: u32) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        match self.flag_path() {
            // SAFETY: the caller keeps the flag's slot held until the store has run.
            FlagPath::Kernels => unsafe { self.flag_kernel(stream, fixed::SIGNAL, flag, value) },
            // SAFETY: as above; the flag is mapped host memory.
            _ => unsafe { self.driver().write_value(stream, flag.device, value) },
        }
    }

    /// Queues nothing when the flag has already reached `value` (flags only move forward);
    /// else a stream memory wait where it compares exactly, else the `stream_wait` kernel.
    ///
    /// # Safety
    /// As [`crate::device::Device::wait_flag`].
    pub(crate) unsafe fn wait_flag(
        &self,
        stream: &R::Stream,
        flag: Flag,
        value: u32,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        // SAFETY: the caller keeps the flag's slot held.
        let now = unsafe { flag.atomic() }.load(Ordering::Acquire);
        if reached(now, value) {
            return Ok(());
        }
        if self.flag_path() != FlagPath::Kernels && R::wait_value_is_exact(now, value) {
            // SAFETY: the caller keeps the flag's slot held until the wait has finished.
            unsafe { self.driver().wait_value(stream, flag.device, value) }?;
        } else {
            // SAFETY: as above.
            unsafe { self.flag_kernel(stream, fixed::STREAM_WAIT, flag, value) }?;
        }
        self.hold(stream, keep.into_iter().collect())
    }

    /// A one-thread launch of a flag kernel.
    ///
    /// # Safety
    /// The flag's slot stays held until the kernel has run.
    unsafe fn flag_kernel(&self, stream: &R::Stream, entry: &str, flag: Flag, value: u32) -> Result<()> {
        let function = self.function(entry)?;
        let (mut ptr, mut value) = (flag.device.0, value);
        let mut args = [arg(&mut ptr), arg(&mut value)];
        // SAFETY: the flag kernels take `(flag: *u32, value: u32)`; the flag is mapped host
        // memory the caller keeps allocated until the kernel has run.
        unsafe { self.driver().launch(stream, &function, Shape::blocks(1, 1), &mut args) }
    }
}
