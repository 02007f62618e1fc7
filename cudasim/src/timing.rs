//! The timing model: with `CUDASIM_COPY_GBPS=B` set, every copy takes at least `bytes / B`
//! (B in GB/s), on one of three copy engines shared by all streams of the process: device to
//! host, host to device, and device to device. Two copies in one direction wait for each other,
//! copies in opposite directions overlap, as on a GPU with a copy engine per direction; a
//! kernel takes at least its thread count times 8 bytes at 10 B, on its own engine (the SMs).
//! Chosen slow (1–2 GB/s) so that the real copy underneath is hidden: the overlap of a
//! pipeline then shows in wall-clock time on a CPU. Unset, nothing is modelled.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::exec::Work;

/// What does the work: a copy engine per direction, or the SMs.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Engine {
    ToHost = 0,
    ToDevice = 1,
    OnDevice = 2,
    Sms = 3,
}

/// When each engine is next free.
static FREE: [Mutex<Option<Instant>>; 4] = [Mutex::new(None), Mutex::new(None), Mutex::new(None), Mutex::new(None)];

/// The modelled rate in bytes per second, if any.
fn rate() -> Option<f64> {
    static RATE: OnceLock<Option<f64>> = OnceLock::new();
    *RATE.get_or_init(|| {
        let gbps: f64 = std::env::var("CUDASIM_COPY_GBPS").ok()?.parse().ok()?;
        (gbps.is_finite() && gbps > 0.0).then_some(gbps * 1e9)
    })
}

/// The engine for a copy between the given sides.
pub(crate) fn engine_of(dst_device: bool, src_device: bool) -> Engine {
    match (dst_device, src_device) {
        (false, _) => Engine::ToHost,
        (true, false) => Engine::ToDevice,
        (true, true) => Engine::OnDevice,
    }
}

/// `work` taking at least its modelled time on `engine`: `bytes` at the copy rate (the SMs at
/// ten times it).
pub(crate) fn timed(engine: Engine, bytes: usize, work: Work) -> Work {
    if rate().is_none() {
        return work;
    }
    Box::new(move || {
        let start = Instant::now();
        let result = work();
        spend_from(engine, bytes, start);
        result
    })
}

/// Runs `copy`, which moves `bytes`, taking at least its modelled time on `engine` (a mover
/// kernel's copies, which go over the link as a copy engine's do).
pub(crate) fn spend(engine: Engine, bytes: usize, copy: impl FnOnce()) {
    let start = Instant::now();
    copy();
    spend_from(engine, bytes, start);
}

/// Sleeps until `engine` has spent `bytes` at its rate, from `start` or from when it is next
/// free if later.
fn spend_from(engine: Engine, bytes: usize, start: Instant) {
    let Some(rate) = rate() else { return };
    let rate = if matches!(engine, Engine::Sms) { rate * 10.0 } else { rate };
    let cost = Duration::from_secs_f64(bytes as f64 / rate);
    let end = {
        let mut free = FREE[engine as usize].lock().unwrap_or_else(PoisonError::into_inner);
        let end = free.map_or(start, |f| f.max(start)) + cost;
        *free = Some(end);
        end
    };
    let now = Instant::now();
    if end > now {
        std::thread::sleep(end - now);
    }
}
