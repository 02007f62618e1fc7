//! The staging engine: [`HostTransferCommunicator::enqueue`] queues a [`Plan`] on a stream and hands its
//! MPI part to the proxy thread, in named steps:
//!
//! 1. [`cut_into_chunks`](HostTransferCommunicator::cut_into_chunks): the chunk size, the number of
//!    chunks and staging slots, or one chunk on the device buffers themselves ([`Geometry`]);
//! 2. [`take_staging`](HostTransferCommunicator::take_staging): the pinned staging block, in the order
//!    operations were queued ([`Grants`](super::Grants));
//! 3. [`set_up`](HostTransferCommunicator::set_up): the flags, and the device side laid out ([`Copies`]);
//! 4. [`hand_over`](HostTransferCommunicator::hand_over): the operation goes to the proxy thread
//!    ([`HostPart`]);
//! 5. [`queue_device_work`](HostTransferCommunicator::queue_device_work): the calling thread queues the
//!    device side (or the flag that lets the proxy thread queue it);
//! 6. [`abandon_queueing`](HostTransferCommunicator::abandon_queueing) where that fails: what was queued
//!    runs through, and the proxy thread lets the operation go.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin_kernels::Element;

use super::HostTransferCommunicator;
use super::copies::{Copies, Geometry};
use super::plans::{ChunkFn, InputArea, Plan};
use super::proxy::{HostPart, InFlight, release_waits};
use crate::device::pool::{FlagSlot, PinnedBlock};
use crate::device::{Device, Flag, KeepAlive};
use crate::error::{Error, Result};
use crate::progress::Task;
use crate::reliability::OnTimeout;
use crate::reliability::monitor::{Asker, OpId};
use crate::reliability::recorder::{Signature, State};
use crate::request::ErrorSlot;

/// An operation handed to the proxy thread and queued on a stream.
pub(crate) struct Queued<D: Device> {
    /// Raised to 1 by the stream once the operation has completed there.
    pub(crate) done: Arc<FlagSlot<D>>,
    /// Its host part, which a thread waiting for the operation drives too.
    pub(crate) task: Arc<Task>,
    /// Where its error goes.
    pub(crate) errors: Arc<ErrorSlot>,
}

/// The flags of an operation (see [`InFlight`] for what each says).
struct Flags<D: Device> {
    input: FlagSlot<D>,
    output: Arc<FlagSlot<D>>,
    done: Arc<FlagSlot<D>>,
    freed: Option<Arc<FlagSlot<D>>>,
    start: Option<FlagSlot<D>>,
}

/// An operation set up on the calling thread, its device side laid out but not queued.
struct SetUp<D: Device> {
    geo: Geometry,
    staging: Option<PinnedBlock<D>>,
    flags: Flags<D>,
    /// The device side when the proxy thread queues it.
    deferred: Option<Copies<D>>,
    work: DeviceWork<D>,
    /// What keeps the device buffers alive.
    keeps: Vec<KeepAlive>,
    /// Its staging is taken later, by the proxy thread.
    waits_for_memory: bool,
    /// Its copies go on the internal copy streams.
    two_streams: bool,
    in_place: bool,
    early: bool,
    recv_parts: usize,
}

/// Who queues an operation's device side.
#[allow(clippy::large_enum_variant)] // One per operation, on the calling thread's stack.
enum DeviceWork<D: Device> {
    /// The calling thread, these copies.
    Copies(Copies<D>),
    /// The proxy thread, once the stream raises this `start` flag.
    Start(Flag),
}

/// What is left to the calling thread of an operation handed to the proxy thread.
struct HandedOver<D: Device> {
    work: DeviceWork<D>,
    done: Arc<FlagSlot<D>>,
    output: Arc<FlagSlot<D>>,
    freed: Option<Arc<FlagSlot<D>>>,
    last_flag: u32,
    two_streams: bool,
    keeps: Vec<KeepAlive>,
    /// Tells the proxy thread that queueing failed (see `HostPart`).
    caller_gave_up: Arc<AtomicBool>,
    task: Arc<Task>,
}

/// A failure to queue an operation's device work.
struct QueueingFailed {
    error: Error,
    /// Whether the operation is to be let go: not when the stream already raised (or will
    /// raise) `start`, after which the proxy thread runs it to its end.
    let_go: bool,
}

impl<D: Device> HostTransferCommunicator<D> {
    /// Waits on the calling thread until the pool can lend `bytes` of staging: the earlier
    /// operations holding it are fully queued, so the proxy thread and the device finish them
    /// without this thread (as NCCL's host waits when its queue of work is full). An MPI
    /// failure recorded meanwhile ends the wait with that error.
    fn wait_for_staging(&self, bytes: usize) -> Result<PinnedBlock<D>> {
        let m = &self.shared.monitor;
        let wait = m.wait_begin("a wait for staging memory");
        let mut backoff = crate::progress::Backoff::default();
        let got = loop {
            match self.shared.pools.try_take(bytes, true) {
                Ok(Some(block)) => break Ok(block),
                Err(e) => break Err(e),
                Ok(None) => {}
            }
            if let Err(e) = self.shared.errors.check().and_then(|()| m.check_poison(Asker::Waiter(wait))) {
                break Err(e);
            }
            backoff.snooze();
        };
        m.wait_end(wait);
        got
    }

    /// Queues `plan` on `stream` and hands its MPI part to the proxy thread. Returns the flag the
    /// stream raises to 1 when the operation has completed on it, and the task of its host part
    /// (which [`HostTransferCommunicator::synchronize`] drives too).
    ///
    /// The calling thread queues the device work of every chunk: one chunk on `stream`; more on
    /// the two internal copy streams (device-to-host on one, host-to-device on the other, so
    /// both directions overlap each other and the MPI work), which start where `stream` is and
    /// which `stream` then waits for, each item after whatever it waits for (see the
    /// [module docs](super#queue-order)). When the pool cannot lend the staging until earlier
    /// operations give theirs back, the calling thread waits for that first. With
    /// `proxy_queues_copies` (and for operations waiting for memory then), the stream raises
    /// *start* and waits for *done*, and the proxy thread queues the copies once it sees
    /// *start*: two flag operations on the calling thread whatever the size.
    ///
    /// `(id, sig)` is the operation's record and signature: the proxy thread marks it running
    /// when the stream reaches the operation, and done or failed when its MPI part ends (whose
    /// messages carry the signature); a failure to queue marks it failed. Errors of the MPI part go to `errors`: the request's or the
    /// communicator's (a failure to queue is returned here, and later errors then go to the
    /// communicator).
    pub(crate) fn enqueue<T: Element>(
        &self,
        stream: &D::Stream,
        plan: Plan<T>,
        (id, sig): (OpId, Signature),
        errors: Arc<ErrorSlot>,
    ) -> Result<Queued<D>> {
        let queued = self.enqueue_recorded(stream, plan, (id, sig), Arc::clone(&errors));
        if let Err(e) = &queued {
            self.shared.monitor.set(id, State::Failed, Some(e.to_string()));
            errors.let_go();
        }
        queued
    }

    fn enqueue_recorded<T: Element>(
        &self,
        stream: &D::Stream,
        mut plan: Plan<T>,
        op: (OpId, Signature),
        errors: Arc<ErrorSlot>,
    ) -> Result<Queued<D>> {
        let geo = self.cut_into_chunks(&plan)?;
        let staging = self.take_staging(&geo)?;
        let set_up = self.set_up(stream, &mut plan, geo, staging)?;
        let handed = self.hand_over(set_up, plan.chunk, op, Arc::clone(&errors));
        if let Err(failed) = self.queue_device_work(stream, &handed) {
            return Err(self.abandon_queueing(stream, handed, failed));
        }
        self.shared.device.release(stream, &handed.keeps)?;
        Ok(Queued { done: handed.done, task: handed.task, errors })
    }

    /// How the operation is cut: in one chunk on the device buffers themselves where the host
    /// can address them, else into chunks of [`HostTransferConfig::chunk_elems`] staged through
    /// up to `depth` slots.
    ///
    /// [`HostTransferConfig::chunk_elems`]: super::HostTransferConfig::chunk_elems
    fn cut_into_chunks<T>(&self, plan: &Plan<T>) -> Result<Geometry> {
        let sz = size_of::<T>().max(1);
        // Not when the operation may be abandoned (`OnTimeout::Error`): MPI must then only hold
        // memory the library owns (staging, which is leaked with the operation).
        let abandonable = self.shared.monitor.on_timeout() == OnTimeout::Error;
        let direct = (self.config.direct && !plan.exchange && self.shared.device.host_accessible() && !abandonable)
            .then(|| plan.direct_areas(sz))
            .flatten();
        let chunk_elems = match direct {
            Some(_) => plan.count.max(1),
            None => {
                let fixed = plan.exchange || plan.device_reduce.is_some();
                self.config.chunk_elems(plan.count, sz, plan.width, fixed)
            }
        };
        let chunks = plan.count.div_ceil(chunk_elems).max(1);
        let last_flag =
            u32::try_from(chunks).map_err(|_| Error::CountOverflow { what: "chunks", value: chunks as u128 })?;
        Ok(Geometry {
            sz,
            chunk_elems,
            count: plan.count,
            chunks,
            last_flag,
            slots: self.config.depth.min(chunks),
            slot_elems: (plan.send_parts + plan.recv_parts) * chunk_elems.min(plan.count),
            send_parts: plan.send_parts,
            base: 0,
            direct,
        })
    }

    /// The staging block (none on the device buffers themselves). It is taken now only if no
    /// earlier operation is waiting for memory (else this one could hold what that one waits
    /// for, while waiting for that one's MPI turn). Without room now, the calling thread waits
    /// for the memory; with `proxy_queues_copies` (or behind a waiting operation), the proxy
    /// thread takes it when the operation's turn and the memory come, and the stream waits on
    /// the device meanwhile.
    fn take_staging(&self, geo: &Geometry) -> Result<Option<PinnedBlock<D>>> {
        if geo.direct.is_some() {
            return Ok(None);
        }
        let (pools, bytes) = (&self.shared.pools, geo.staging_bytes());
        if self.shared.grants().next != self.grants_issued.get() {
            pools.check_fits(bytes)?;
            return Ok(None);
        }
        match pools.try_take(bytes, true)? {
            None if !self.config.proxy_queues_copies => Ok(Some(self.wait_for_staging(bytes)?)),
            got => Ok(got),
        }
    }

    /// Takes the operation's flags, orders it after the work on its buffers, and lays out its
    /// device side (taking the plan's regions).
    fn set_up<T>(
        &self,
        stream: &D::Stream,
        plan: &mut Plan<T>,
        mut geo: Geometry,
        staging: Option<PinnedBlock<D>>,
    ) -> Result<SetUp<D>> {
        let (device, pools, direct) = (&*self.shared.device, &self.shared.pools, geo.direct.is_some());
        let waits_for_memory = !direct && staging.is_none();
        let (input, output, done) = (pools.flag()?, Arc::new(pools.flag()?), Arc::new(pools.flag()?));
        geo.base = staging.as_ref().map_or(0, |s| s.ptr() as usize);
        let keeps = plan.keep_alives();
        let in_place = !matches!(plan.input, Some((_, InputArea::Send)));
        device.acquire(stream, &keeps)?;
        let two_streams = !direct && (geo.chunks > 1 || waits_for_memory);
        // Send-only operations staged through pinned memory: once the data is staged, the device
        // buffers are free, so the stream need not wait for the MPI part.
        let early = !direct && plan.output.is_none() && plan.input.is_some();
        // The calling thread queues every chunk's copies (see the module docs of `host_transfer`
        // on queue order); only an operation that waits for staging memory (or a communicator
        // configured to) has the proxy thread queue them, once the stream raises `start`.
        let deferred = waits_for_memory || (two_streams && self.config.proxy_queues_copies);
        let freed = if two_streams { Some(Arc::new(pools.flag()?)) } else { None };
        let start = if deferred { Some(pools.flag()?) } else { None };
        let (ins, outs) = match self.copy_streams_if(two_streams)? {
            Some((i, o)) => (i.clone(), o.clone()),
            None => (stream.clone(), stream.clone()),
        };
        let copies = Copies {
            device: Arc::clone(&self.shared.device),
            ins,
            outs,
            input: plan.input.take(),
            output: plan.output.take(),
            device_reduce: plan.device_reduce,
            recv_parts: plan.recv_parts,
            geo,
            input_flag: input.flag(),
            output_flag: output.flag(),
            freed: freed.as_deref().map(FlagSlot::flag),
            done: done.flag(),
            early,
        };
        let (deferred, work) = match &start {
            Some(start) => (Some(copies), DeviceWork::Start(start.flag())),
            None => (None, DeviceWork::Copies(copies)),
        };
        let flags = Flags { input, output, done, freed, start };
        let recv_parts = plan.recv_parts;
        Ok(SetUp {
            geo,
            staging,
            flags,
            deferred,
            work,
            keeps,
            waits_for_memory,
            two_streams,
            in_place,
            early,
            recv_parts,
        })
    }

    /// Hands the operation to the proxy thread, before its device work is queued: a GPU's
    /// command queue holds about a thousand items, and a calling thread queueing more (an
    /// operation of hundreds of chunks) blocks until the device has run some, which needs the
    /// proxy thread to run the operation's first chunks meanwhile. Tickets are still taken in
    /// the program's order.
    fn hand_over<T: Element>(
        &self,
        set_up: SetUp<D>,
        chunk: ChunkFn<T>,
        (id, sig): (OpId, Signature),
        errors: Arc<ErrorSlot>,
    ) -> HandedOver<D> {
        let SetUp { geo, staging, flags, deferred, work, keeps, .. } = set_up;
        let ticket = self.next_ticket();
        let grant = geo.direct.is_none().then(|| self.next_grant());
        if let (Some(g), false) = (grant, set_up.waits_for_memory) {
            self.shared.grants().pass(g);
        }
        let caller_gave_up = Arc::new(AtomicBool::new(false));
        let Flags { input, output, done, freed, start } = flags;
        let op = InFlight {
            shared: Arc::clone(&self.shared),
            ticket,
            turn_held: false,
            chunks: geo.last_flag,
            input,
            output: Arc::clone(&output),
            freed: freed.clone(),
            start,
            queued: deferred.is_none(),
            done: Arc::clone(&done),
            staging,
            retired: None,
            grant: grant.filter(|_| set_up.waits_for_memory),
            keep: if geo.direct.is_some() { keeps.clone() } else { Vec::new() },
            errors,
        };
        let host = HostPart {
            op,
            deferred,
            geo,
            chunk,
            recv_parts: set_up.recv_parts,
            in_place: set_up.in_place,
            early: set_up.early,
            monitor: Arc::clone(&self.shared.monitor),
            id,
            sig,
            caller_gave_up: Arc::clone(&caller_gave_up),
            failed: false,
            checked: false,
        };
        let task = Task::new(host.into_future());
        self.engine.submit_now(Arc::clone(&task));
        self.track(Arc::clone(&task));
        HandedOver {
            work,
            done,
            output,
            freed,
            last_flag: geo.last_flag,
            two_streams: set_up.two_streams,
            keeps,
            caller_gave_up,
            task,
        }
    }

    /// Queues the operation's device side on `stream` (and the copy streams), or the `start`
    /// flag and the wait for `done` where the proxy thread queues the copies.
    fn queue_device_work(&self, stream: &D::Stream, handed: &HandedOver<D>) -> Result<(), QueueingFailed> {
        let device = &*self.shared.device;
        let let_go = |error| QueueingFailed { error, let_go: true };
        let wait_done = || {
            // SAFETY: the wait keeps `done`'s slot. The operation's own hold is not enough: it
            // ends when the proxy thread sees `done`, which may be before this stream does, and
            // a later operation could then take the slot and reset it to 0 under the stream's
            // wait, which would never end.
            unsafe { device.wait_flag(stream, handed.done.flag(), 1, Some(Arc::clone(&handed.done) as KeepAlive)) }
        };
        match &handed.work {
            // SAFETY: `start` is held by the operation until the proxy thread has seen it.
            DeviceWork::Start(start) => match unsafe { device.write_flag(stream, *start, 1) } {
                Err(e) => Err(let_go(e)),
                Ok(()) => wait_done().map_err(|error| QueueingFailed { error, let_go: false }),
            },
            DeviceWork::Copies(copies) => {
                let two = handed.two_streams;
                // SAFETY: the flags and staging are held by the operation until `done`.
                unsafe {
                    // The copy streams start where the stream is now: its earlier work made
                    // the data.
                    let joined = if two { device.join(&copies.ins, stream) } else { Ok(()) };
                    joined.and_then(|()| copies.queue()).and_then(|()| if two { wait_done() } else { Ok(()) })
                }
                .map_err(let_go)
            }
        }
    }

    /// Queueing failed: unless the proxy thread runs the operation to its end anyway, lets what
    /// was queued run through (its waits released), then lets the proxy thread drop the
    /// operation, whose flags and staging go back to the pool; the outputs are unspecified.
    /// Returns the error.
    fn abandon_queueing(&self, stream: &D::Stream, handed: HandedOver<D>, failed: QueueingFailed) -> Error {
        if failed.let_go {
            release_waits(&handed.output, handed.freed.as_deref(), handed.last_flag);
            if let DeviceWork::Copies(copies) = &handed.work {
                copies.run_through();
            }
            handed.caller_gave_up.store(true, Ordering::Release);
        }
        let _ = self.shared.device.release(stream, &handed.keeps);
        failed.error
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{HostTransferCommunicator, HostTransferConfig};
    use crate::Sum;
    use crate::device::host::HostDevice;

    const LIMIT: Duration = Duration::from_secs(30);

    /// A stream that falls behind the proxy thread still passes its wait for a pipelined
    /// operation's `done` flag. The stream is held at that wait until the proxy thread has
    /// finished the operation; the flag's slot must still be lent then (the wait holds it), and
    /// an operation queued next on the stream must not take it. When the operation's own hold
    /// was all there was, the next operation took the slot and reset it to 0 under the wait,
    /// and the stream never went on.
    #[test]
    #[cfg_attr(miri, ignore = "initializes MPI, a foreign library Miri cannot call")]
    fn a_stream_behind_the_proxy_thread_keeps_its_done_flag() {
        let universe = crate::init().expect("MPI init (singleton)");
        let world = universe.world();
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let config = HostTransferConfig { chunk_bytes: 4 << 10, direct: false, ..Default::default() };
        let c = HostTransferCommunicator::with_config(&world, dev.clone(), stream.clone(), config).unwrap();
        let len = 4 << 10; // 16 KiB of u32: four chunks, so the operation pipelines.
        let send = dev.upload(&vec![3u32; len]).unwrap();
        let (mut first, mut second) = (dev.alloc_zeroed::<u32>(len).unwrap(), dev.alloc_zeroed::<u32>(len).unwrap());

        let gate = stream.wait_gate();
        gate.hold();
        // Whatever fails below, the stream is let go, so the test fails rather than hangs.
        let _open = gate.held_until_drop();
        c.allreduce(&send, &mut first, Sum).unwrap();
        assert!(gate.reached_by(1, LIMIT), "the stream never reached its wait for done");
        // The proxy thread lets go of the operation's flags (four of them) once it sees `done`.
        let end = Instant::now() + LIMIT;
        while c.pool_stats().flags_in_use > 1 {
            assert!(Instant::now() < end, "the operation never finished: {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.pool_stats().flags_in_use, 1, "the stream waits on done, so its slot must stay lent");
        // Without that, the next operation takes the slot: its flags are set to 0 on taking.

        c.allreduce(&send, &mut second, Sum).unwrap();
        gate.release();
        let (tx, rx) = std::sync::mpsc::channel();
        let behind = stream.clone();
        std::thread::spawn(move || {
            let _ = tx.send(behind.sync());
        });
        match rx.recv_timeout(LIMIT) {
            Ok(r) => r.unwrap(),
            Err(_) => {
                // Dropping the communicator would wait for the stream forever.
                std::mem::forget(c);
                panic!("the stream hung on its wait for the first operation's done flag")
            }
        }
        c.synchronize().unwrap();
        assert_eq!(dev.download(&first).unwrap(), vec![3; len]);
        assert_eq!(dev.download(&second).unwrap(), vec![3; len]);
        let end = Instant::now() + LIMIT;
        while c.pool_stats().flags_in_use != 0 || c.pool_stats().blocks_in_use != 0 {
            assert!(Instant::now() < end, "the pool still lends {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
