//! The staging engine: [`HostTransferCommunicator::enqueue`] queues a [`Plan`] on a stream and hands its
//! MPI part to the proxy thread, in named steps:
//!
//! 1. [`cut_into_chunks`](HostTransferCommunicator::cut_into_chunks): the chunk size and the
//!    number of chunks, and where they lie in the communicator's ring, or one chunk on the
//!    device buffers themselves ([`Geometry`]);
//! 2. [`set_up`](HostTransferCommunicator::set_up): the flags, and the device side laid out ([`Copies`]);
//! 3. [`hand_over`](HostTransferCommunicator::hand_over): the operation goes to the proxy thread
//!    ([`HostPart`]);
//! 4. [`queue_device_work`](HostTransferCommunicator::queue_device_work): the calling thread queues the
//!    device side;
//! 5. [`abandon_queueing`](HostTransferCommunicator::abandon_queueing) where that fails: what was queued
//!    runs through, and the proxy thread lets the operation go.
//!
//! The calling thread never allocates, frees or waits for staging memory: the ring was taken
//! when the communicator was made, and the device waits for its cells (see [`super::ring`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin_kernels::Element;
use duralumin_kernels::mover::Schedule;

use super::HostTransferCommunicator;
use super::copies::{Copies, Geometry};
use super::plans::{ChunkFn, Plan, chunks_of};
use super::proxy::{ChunkAt, HostPart, InFlight, chunk_job};
use crate::api::error::{Error, Result};
use crate::api::request::ErrorSlot;
use crate::common::progress::Task;
use crate::device::pool::FlagSlot;
use crate::device::{Device, KeepAlive};
use crate::reliability::OnTimeout;
use crate::reliability::monitor::OpId;
use crate::reliability::recorder::{Signature, State};

/// The value a stream sets an operation's `done` flag to once it is past its wait for it (see
/// [`HostTransferCommunicator::wait_done`]).
const PASSED: u32 = 2;

/// An operation queued on a stream and handed to the proxy thread, or run through on the
/// calling thread.
pub(crate) struct Queued<D: Device> {
    /// The flag the stream raises to 1 once the operation has completed there, and its host
    /// part, which [`HostTransferCommunicator::synchronize`] drives too; `None` for an operation
    /// that ran through on the calling thread (see [`HostTransferCommunicator::start_here`]).
    pub(crate) pending: Option<(Arc<FlagSlot<D>>, Arc<Task>)>,
    /// Where its error goes.
    pub(crate) errors: Arc<ErrorSlot>,
}

/// An operation set up on the calling thread, its device side laid out but not queued.
struct SetUp<D: Device> {
    geo: Geometry,
    /// Its own input and output flags when it works on the device buffers.
    own: Option<(FlagSlot<D>, Arc<FlagSlot<D>>)>,
    done: Arc<FlagSlot<D>>,
    copies: Copies<D>,
    /// What keeps the device buffers alive.
    keeps: Vec<KeepAlive>,
    in_place: bool,
    recv_parts: usize,
}

/// What is left to the calling thread of an operation handed to the proxy thread.
struct HandedOver<D: Device> {
    copies: Copies<D>,
    geo: Geometry,
    done: Arc<FlagSlot<D>>,
    /// The operation's own output flag (direct operations).
    output: Option<Arc<FlagSlot<D>>>,
    keeps: Vec<KeepAlive>,
    /// Tells the proxy thread that queueing failed (see `HostPart`).
    caller_gave_up: Arc<AtomicBool>,
    task: Arc<Task>,
}

impl<D: Device> HostTransferCommunicator<D> {
    /// Queues `plan` on `stream` and hands its MPI part to the proxy thread (or runs a small one
    /// on the calling thread, see [`start_here`](Self::start_here)). Returns what a request
    /// waits for ([`Queued`]).
    ///
    /// The calling thread queues the device work of every chunk on the communicator's two copy
    /// streams (device-to-host on one, host-to-device on the other, so both directions overlap
    /// each other and the MPI work), or the whole of it as one mover on the first (see
    /// [`mover_schedule`](Self::mover_schedule)); they start where `stream` is, and `stream`
    /// then waits for them, each item after whatever it waits for (the queue-order rule:
    /// `docs/architecture.md#the-queue-order-rule`). It takes no memory and waits for nothing:
    /// the chunks stream through the communicator's ring, whose cells the device waits for.
    ///
    /// `(id, sig)` is the operation's record and signature: the proxy thread marks it running
    /// when the stream reaches the operation, and done or failed when its MPI part ends (whose
    /// messages carry the signature). A refusal of its arguments (its chunks cannot be
    /// counted, or one does not fit in the ring) marks it failed on this rank; a failure to
    /// queue after that is a fault, which gives the communicator up on every rank or ends the
    /// job (`Monitor::failed_to_queue`). Errors of the MPI part go to `errors`: the request's
    /// or the communicator's (a failure to queue is returned here, and later errors then go to
    /// the communicator).
    pub(crate) fn enqueue<T: Element>(
        &self,
        stream: &D::Stream,
        plan: Plan<T>,
        (id, sig): (OpId, Signature),
        errors: Arc<ErrorSlot>,
    ) -> Result<Queued<D>> {
        // The ring's next place before this operation took its chunks: given back if it is
        // refused before anything is queued, since no one would release those chunks.
        let ring_before = self.ring_next.get();
        let m = &self.shared.monitor;
        let queued = match self.cut_into_chunks(&plan) {
            // Refused for its arguments, as every rank that made the same call refuses it.
            Err(e) => {
                m.set(id, State::Failed, Some(e.to_string()));
                Err(e)
            }
            // The device's failure, or no flag left, on this rank alone: the others may be in
            // the operation already (see `Monitor::failed_to_queue`).
            Ok(geo) => self
                .enqueue_cut(stream, plan, geo, (id, sig), Arc::clone(&errors), ring_before)
                .map_err(|e| m.failed_to_queue(id, e)),
        };
        if queued.is_err() {
            errors.let_go();
        }
        queued
    }

    /// Queues an operation cut into chunks (`ring_before`: the ring's next place before it).
    fn enqueue_cut<T: Element>(
        &self,
        stream: &D::Stream,
        mut plan: Plan<T>,
        geo: Geometry,
        op: (OpId, Signature),
        errors: Arc<ErrorSlot>,
        ring_before: (u64, u64),
    ) -> Result<Queued<D>> {
        if self.may_start_here(stream, &geo)? {
            let Some(started) = self.start_here(&mut plan, &geo, op, &errors) else {
                return Ok(Queued { pending: None, errors });
            };
            // A late peer: the proxy thread finishes it, and the stream waits for that.
            let Ok(set_up) = self.set_up(stream, &mut plan, geo) else {
                // Nothing to hand it on with (no flag left in the pool): it ends on this thread
                // instead, under the deadline.
                self.shared.monitor.set(op.0, State::Running, None);
                let ended = crate::common::progress::block_on(started);
                self.ended_here(op.0, ended, &errors);
                return Ok(Queued { pending: None, errors });
            };
            let handed = self.hand_over(set_up, plan.chunk, op, Arc::clone(&errors), Some(started));
            self.finish_elsewhere(stream, &handed);
            self.release(stream, &handed, &errors);
            return Ok(Queued { pending: Some((handed.done, handed.task)), errors });
        }
        let set_up = self.set_up(stream, &mut plan, geo).inspect_err(|_| self.ring_next.set(ring_before))?;
        let handed = self.hand_over(set_up, plan.chunk, op, Arc::clone(&errors), None);
        if let Err(error) = self.queue_device_work(stream, &handed) {
            return Err(self.abandon_queueing(stream, handed, error));
        }
        self.release(stream, &handed, &errors);
        Ok(Queued { pending: Some((handed.done, handed.task)), errors })
    }

    /// Makes the streams of the operation's buffers wait for it ([`Device::release`]). Where
    /// the device cannot, the operation (queued and handed over, so it runs) ends before the
    /// call returns instead, and the device's error goes where its errors go.
    fn release(&self, stream: &D::Stream, handed: &HandedOver<D>, errors: &ErrorSlot) {
        if let Err(e) = self.shared.device.release(stream, &handed.keeps) {
            let _ = handed.task.wait();
            errors.record(e);
        }
    }

    /// How the operation is cut: in one chunk on the device buffers themselves where the host
    /// can address them, else into chunks of [`HostTransferConfig::chunk_elems`] placed in the
    /// ring after the communicator's earlier chunks.
    ///
    /// [`HostTransferConfig::chunk_elems`]: super::HostTransferConfig::chunk_elems
    fn cut_into_chunks<T>(&self, plan: &Plan<T>) -> Result<Geometry> {
        let sz = size_of::<T>().max(1);
        // Not when the operation may be abandoned (`OnTimeout::Error`): MPI must then only hold
        // memory the library owns (the ring, which is leaked then).
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
        let chunks = chunks_of(plan.count, chunk_elems, plan.exchange);
        let last_flag =
            u32::try_from(chunks).map_err(|_| Error::CountOverflow { what: "chunks", value: chunks as u128 })?;
        // A chunk's staging, which its copies and its MPI part are bounded by: checked here, so
        // that no later product wraps.
        let parts = plan.send_parts.saturating_add(plan.recv_parts);
        let slot_elems = parts.checked_mul(chunk_elems.min(plan.count)).filter(|e| e.checked_mul(sz).is_some()).ok_or(
            Error::CountOverflow { what: "a chunk's staging bytes", value: parts as u128 * chunk_elems as u128 },
        )?;
        let mut geo = Geometry {
            sz,
            chunk_elems,
            count: plan.count,
            chunks,
            last_flag,
            slot_elems,
            send_parts: plan.send_parts,
            place: None,
            direct,
        };
        if direct.is_none() {
            let span = self.shared.ring.span_of(geo.chunk_bytes())?;
            let (mut next_chunk, mut next_pos) = self.ring_next.get();
            geo.place = Some(self.shared.ring.place(chunks, span, &mut next_chunk, &mut next_pos));
            self.ring_next.set((next_chunk, next_pos));
        }
        Ok(geo)
    }

    /// Takes the operation's flags, orders it after the work on its buffers, and lays out its
    /// device side (taking the plan's regions).
    fn set_up<T>(&self, stream: &D::Stream, plan: &mut Plan<T>, geo: Geometry) -> Result<SetUp<D>> {
        let (device, pools, ring) = (&*self.shared.device, &self.shared.pools, &self.shared.ring);
        let own = match geo.place {
            Some(_) => None,
            None => Some((pools.flag()?, Arc::new(pools.flag()?))),
        };
        let done = Arc::new(pools.flag()?);
        let keeps = plan.keep_alives();
        let in_place = plan.in_place();
        device.acquire(stream, &keeps)?;
        let (ins, outs) = match geo.place {
            Some(_) => {
                let (i, o) = self.copy_streams()?;
                (i.clone(), o.clone())
            }
            None => (stream.clone(), stream.clone()),
        };
        // Send-only operations staged through the ring: once the data is staged, the device
        // buffers are free, so the stream need not wait for the MPI part.
        let early = geo.place.is_some() && plan.output.is_none() && plan.input.is_some();
        let (input_flag, output_flag) = match &own {
            Some((input, output)) => (input.flag(), output.flag()),
            None => (ring.staged.flag(), ring.output.flag()),
        };
        // The drained value the earlier operations reach, and this one's for the next.
        let after = self.drained_upto.get();
        if geo.place.is_some() && !early {
            self.drained_upto.set(geo.last());
        }
        let copies = Copies {
            device: Arc::clone(&self.shared.device),
            ins,
            outs,
            input: plan.input.take(),
            output: plan.output.take(),
            device_reduce: plan.device_reduce,
            recv_parts: plan.recv_parts,
            geo,
            input_flag,
            output_flag,
            ring: geo.place.map(|_| (ring.drained.flag(), ring.free.flag())),
            done: done.flag(),
            after,
            early,
        };
        Ok(SetUp { geo, own, done, copies, keeps, in_place, recv_parts: plan.recv_parts })
    }

    /// Whether the operation may start on the calling thread (see
    /// [`HostTransferConfig::inline_max_bytes`](super::HostTransferConfig::inline_max_bytes)):
    /// a small one on the device buffers, whose stream has run everything queued before it
    /// (its buffers are ready now) and whose communicator has no MPI part pending (it is its
    /// turn).
    fn may_start_here(&self, stream: &D::Stream, geo: &Geometry) -> Result<bool> {
        let small = geo.direct.is_some() && geo.chunk_bytes() <= self.config.inline_max_bytes;
        Ok(small
            && self.config.inline_max_bytes > 0
            && self.shared.turn.load(Ordering::Acquire) == self.tickets.get()
            && self.shared.device.query(stream)?)
    }

    /// Runs the MPI part of an operation [`may_start_here`](Self::may_start_here) allowed on
    /// the calling thread for at most `inline_wait`, with nothing of the proxy thread's set up
    /// for it (no flags, no ticket: nothing else can start meanwhile). `None` once it is
    /// through, its outcome recorded (an error goes to `errors`, as the proxy thread's would);
    /// else the part still running (a late peer), which the proxy thread is then to finish.
    fn start_here<T: Element>(
        &self,
        plan: &mut Plan<T>,
        geo: &Geometry,
        (id, sig): (OpId, Signature),
        errors: &ErrorSlot,
    ) -> Option<crate::common::progress::OpFuture> {
        // Recorded running only if it is handed on: the proxy thread then says so.
        let m = &*self.shared.monitor;
        let _mpi = super::steps::Steps::new(m.span(id), 1).map(|s| s.during("mpi", 0));
        let in_place = plan.in_place();
        let at = ChunkAt { geo, k: 0, in_place, recv_parts: plan.recv_parts };
        let mut job = match chunk_job(&self.shared, &mut plan.chunk, &at, (id, sig), true) {
            Ok((job, _)) => job,
            Err(e) => {
                self.ended_here(id, Err(e), errors);
                return None;
            }
        };
        let (mut until, mut polls) = (None, 0u32);
        loop {
            if let std::task::Poll::Ready(ended) = crate::common::progress::poll_guarded(&mut job) {
                self.ended_here(id, ended, errors);
                return None;
            }
            // The clock is read every few polls (a poll of a message that has not come is
            // cheaper than reading it).
            if polls % 16 == 0 {
                let now = std::time::Instant::now();
                if now >= *until.get_or_insert(now + self.config.inline_wait) {
                    return Some(job);
                }
            }
            polls = polls.wrapping_add(1);
            std::hint::spin_loop();
        }
    }

    /// Records the outcome of an operation that ended on the calling thread: done, or its error
    /// in `errors`, as the proxy thread would.
    fn ended_here(&self, id: OpId, ended: Result<()>, errors: &ErrorSlot) {
        let m = &*self.shared.monitor;
        match ended {
            Ok(()) => m.set(id, State::Done, None),
            Err(e) => errors.record(m.end(id, Err(e)).err().unwrap_or(Error::Progress("operation failed"))),
        }
    }

    /// An operation [`start_here`](Self::start_here) handed on, which the proxy thread finishes:
    /// the stream waits for its `done` flag, which the proxy thread raises at the end (nothing
    /// else of the operation is queued on the stream).
    fn finish_elsewhere(&self, stream: &D::Stream, handed: &HandedOver<D>) {
        let (task, done) = (&handed.task, &handed.done);
        self.engine.submit_now(Arc::clone(task));
        // SAFETY: `done`'s slot is held until the stream has passed the wait (see `wait_done`).
        let queued = unsafe { self.wait_done(stream, done) };
        if queued.is_err() {
            // The stream cannot wait for it: it ends before the call returns instead (its
            // error, if any, goes where its errors go).
            let _ = task.wait();
        }
    }

    /// Hands the operation to the proxy thread, before its device work is queued: a GPU's
    /// command queue holds about a thousand items, and a calling thread queueing more (an
    /// operation of hundreds of chunks) blocks until the device has run some, which needs the
    /// proxy thread to run the operation's first chunks meanwhile. Tickets are still taken in
    /// the program's order. An operation whose MPI part `started` on the calling thread (see
    /// [`start_here`](Self::start_here)) queues no device work, and is handed over by
    /// [`finish_elsewhere`](Self::finish_elsewhere).
    fn hand_over<T: Element>(
        &self,
        set_up: SetUp<D>,
        chunk: ChunkFn<T>,
        (id, sig): (OpId, Signature),
        errors: Arc<ErrorSlot>,
        started: Option<crate::common::progress::OpFuture>,
    ) -> HandedOver<D> {
        let queued = started.is_none();
        let SetUp { geo, own, done, copies, keeps, in_place, recv_parts } = set_up;
        if let (false, Some((input, _))) = (queued, &own) {
            // Started on the calling thread, whose stream has run everything before it: the
            // input is ready.
            input.raise(geo.last());
        }
        let ticket = self.next_ticket();
        let caller_gave_up = Arc::new(AtomicBool::new(false));
        let output = own.as_ref().map(|o| Arc::clone(&o.1));
        let op = InFlight {
            shared: Arc::clone(&self.shared),
            ticket,
            turn_held: false,
            geo,
            own,
            queued,
            released: 0,
            drains: !copies.early,
            done: Arc::clone(&done),
            keep: if geo.direct.is_some() { keeps.clone() } else { Vec::new() },
            errors,
        };
        let host = HostPart {
            op,
            chunk,
            recv_parts,
            in_place,
            monitor: Arc::clone(&self.shared.monitor),
            id,
            sig,
            caller_gave_up: Arc::clone(&caller_gave_up),
            failed: false,
            checked: false,
            steps: None,
            started,
        };
        let task = Task::new(host.into_future());
        if queued {
            self.engine.submit_now(Arc::clone(&task));
        }
        self.track(Arc::clone(&task));
        HandedOver { copies, geo, done, output, keeps, caller_gave_up, task }
    }

    /// Queues the operation's device side: on the copy streams, which start where `stream` is
    /// (its earlier work made the data) and which `stream` then waits for; or on `stream`
    /// itself for an operation on the device buffers.
    fn queue_device_work(&self, stream: &D::Stream, handed: &HandedOver<D>) -> Result<()> {
        let (device, copies) = (&*self.shared.device, &handed.copies);
        let staged = handed.geo.place.is_some();
        // SAFETY: the flags are held by the operation until `done`, the ring by the shared
        // state it holds, and `done`'s slot until the stream has passed its wait (`wait_done`).
        unsafe {
            if staged {
                device.join(&copies.ins, stream)?;
            }
            match self.mover_schedule(copies) {
                Some(schedule) => copies.queue_mover(schedule, self.config.mover_blocks)?,
                None => copies.queue()?,
            }
            if staged {
                self.wait_done(stream, &handed.done)?;
            }
        }
        Ok(())
    }

    /// Queues `stream`'s wait for the operation's `done` flag, then the stream's note that it
    /// is past it (`done` set to [`PASSED`]), and holds the slot until then
    /// ([`FlagSlot::reuse_once`]). The operation's own hold ends when the proxy thread sees
    /// `done`, which may be before this stream does, and a later operation could then take the
    /// slot and reset it to 0 under the stream's wait. A host function behind the wait would
    /// hold it too, but the stream would then wait for a round trip through the driver's thread
    /// before its next item, and so would the next operation, which starts where the stream is.
    ///
    /// # Safety
    /// As [`Device::wait_flag`].
    unsafe fn wait_done(&self, stream: &D::Stream, done: &FlagSlot<D>) -> Result<()> {
        let device = &*self.shared.device;
        // SAFETY: the slot is held until the stream has written `PASSED`, after its wait (if
        // that write cannot be queued, for ever: the stream may still wait).
        unsafe {
            device.wait_flag(stream, done.flag(), 1, None)?;
            done.reuse_once(PASSED);
            device.write_flag(stream, done.flag(), PASSED)
        }
    }

    /// The operation's schedule if it is queued as one mover: a staged operation of at least
    /// [`mover_min_chunks`](super::HostTransferConfig::mover_min_chunks) chunks, on a device
    /// with a mover, that a mover can run (see [`Copies::schedule`]).
    fn mover_schedule(&self, copies: &Copies<D>) -> Option<Schedule> {
        let device = &*self.shared.device;
        let min = self.config.mover_min_chunks.or_else(|| device.mover_min_chunks()).unwrap_or(usize::MAX);
        let wanted = copies.geo.chunks >= min && device.has_mover();
        let ring = &self.shared.ring;
        wanted.then(|| copies.schedule(ring.device_base, ring.arrivals())).flatten()
    }

    /// Queueing failed: lets what was queued run through (its waits released), then lets the
    /// proxy thread drop the operation, whose chunks go back to the ring and whose flags go back
    /// to the pool; the outputs are unspecified. Returns the error.
    ///
    /// On the copy streams, the proxy thread releases the operation's waits once its turn has
    /// come (raising the ring's *output* earlier would release earlier operations' chunks
    /// before their MPI parts are done); the copy streams then run through, and since nothing
    /// queued is left on them, the operation's chunks count as drained.
    fn abandon_queueing(&self, stream: &D::Stream, handed: HandedOver<D>, error: Error) -> Error {
        let last = handed.geo.last();
        match &handed.output {
            Some(output) => {
                output.raise(last);
                handed.copies.run_through();
                handed.caller_gave_up.store(true, Ordering::Release);
            }
            None => {
                handed.caller_gave_up.store(true, Ordering::Release);
                handed.copies.run_through();
                self.shared.ring.drained.raise(last);
            }
        }
        let _ = self.shared.device.release(stream, &handed.keeps);
        error
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{HostTransferCommunicator, HostTransferConfig};
    use mpi::topology::SimpleCommunicator;

    use crate::Sum;
    use crate::device::cpu::HostDevice;

    const LIMIT: Duration = Duration::from_secs(30);
    /// The ring's counters, lent for the communicator's life.
    const RING: usize = 4;
    /// The ring's pinned blocks (its cells, its movers' arrival words), lent for the
    /// communicator's life.
    const RING_BLOCKS: usize = 2;

    /// The trials below on one rank (MPI is initialized once per process).
    #[test]
    #[cfg_attr(miri, ignore = "initializes MPI, a foreign library Miri cannot call")]
    fn on_one_rank() {
        let universe = crate::init().expect("MPI init (singleton)");
        let world = universe.world();
        small_operations_on_an_idle_stream_start_on_the_calling_thread(&world);
        a_stream_behind_the_proxy_thread_keeps_its_done_flag(&world);
        movers_and_copy_streams_share_the_ring(&world);
    }

    /// Staged operations of `mover_min_chunks` chunks or more are queued as one mover, smaller
    /// ones item by item on the copy streams; queued back to back without a synchronize, in
    /// place and out of place, send-only or not, through a ring they wrap around many times,
    /// both kinds leave the right results (a mover that raised *drained* or *staged* out of
    /// order, or refilled cells too early, would corrupt them or hang).
    fn movers_and_copy_streams_share_the_ring(world: &SimpleCommunicator) {
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let config = HostTransferConfig {
            chunk_bytes: 1 << 10,
            min_chunk_bytes: 256,
            pipeline_chunks: 4,
            direct: false,
            mover_min_chunks: Some(4),
            ..Default::default()
        };
        let c = HostTransferCommunicator::with_config(world, dev.clone(), stream, config.with_ring_cells(4)).unwrap();
        // 40 KiB: 40 chunks of 1 KiB through 4 cells (a mover); 512 B: 2 chunks (copy streams).
        let (big, small) = (10 << 10, 128);
        let mut expected = Vec::new();
        let mut outs = Vec::new();
        for round in 0..6u32 {
            for (i, len) in (0u32..).zip([big, small, small, big]) {
                let value = round * 10 + i;
                let send = dev.upload(&vec![value; len]).unwrap();
                let mut out = dev.alloc_zeroed::<u32>(len).unwrap();
                if i == 3 {
                    // In place, and a send-only bcast root next to it.
                    let mut inout = dev.upload(&vec![value; len]).unwrap();
                    c.allreduce_in_place(&mut inout, Sum).unwrap();
                    let mut root = dev.upload(&vec![value + 1; len]).unwrap();
                    c.bcast(&mut root, 0).unwrap();
                    outs.push(inout);
                    expected.push((len, value));
                    outs.push(root);
                    expected.push((len, value + 1));
                } else {
                    c.allreduce(&send, &mut out, Sum).unwrap();
                    outs.push(out);
                    expected.push((len, value));
                }
            }
        }
        c.synchronize().unwrap();
        for (k, (out, (len, value))) in outs.iter().zip(&expected).enumerate() {
            assert_eq!(dev.download(out).unwrap(), vec![*value; *len], "operation {k}");
        }
        // Per round: 3 big operations (an allreduce, an in-place one and a bcast) and 2 small.
        assert_eq!(dev.movers_queued(), 6 * 3, "every operation of 4 chunks or more is one mover, no other");
    }

    /// A small operation on the device buffers of an idle stream runs on the calling thread
    /// and queues nothing on the stream; one too large, or queued behind work the stream has
    /// not run, or on a communicator that starts nothing there, is queued as before (its wait
    /// for the MPI part reaches the stream's held gate).
    fn small_operations_on_an_idle_stream_start_on_the_calling_thread(world: &SimpleCommunicator) {
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        // A wait as long as the test's limit: the call returns only once the operation is
        // through (a single rank's always gets through).
        let config = HostTransferConfig::default().with_inline_wait(LIMIT);
        let here = HostTransferCommunicator::with_config(world, dev.clone(), stream.clone(), config).unwrap();
        let queued =
            HostTransferCommunicator::with_config(world, dev.clone(), stream.clone(), config.with_inline_max_bytes(0))
                .unwrap();
        let small = config.inline_max_bytes / 8;
        let send = dev.upload(&vec![5u32; small]).unwrap();
        let large = dev.upload(&vec![7u32; 2 * small]).unwrap();
        let mut outs: Vec<_> = (0..3).map(|_| dev.alloc_zeroed::<u32>(small).unwrap()).collect();
        let mut d = dev.alloc_zeroed::<u32>(2 * small).unwrap();

        let gate = stream.wait_gate();
        gate.hold();
        let _open = gate.held_until_drop();
        let [a, b, c] = &mut outs[..] else { unreachable!() };
        here.allreduce(&send, a, Sum).unwrap();
        assert!(!gate.reached_by(1, Duration::from_millis(200)), "a small operation on an idle stream queued a wait");
        // The stream holds nothing: the result is there without waiting for it.
        assert_eq!(dev.download(a).unwrap(), vec![5; small]);

        queued.allreduce(&send, b, Sum).unwrap();
        assert!(gate.reached_by(1, LIMIT), "with inline_max_bytes 0, the operation's wait never reached the stream");
        // Behind that held wait, even a small operation queues; so does a large one.
        here.allreduce(&send, c, Sum).unwrap();
        here.allreduce(&large, &mut d, Sum).unwrap();
        gate.release();
        here.synchronize().unwrap();
        queued.synchronize().unwrap();
        assert!(gate.reached_by(3, LIMIT), "the operations queued behind a busy stream queued no wait");
        for out in [&*b, &*c] {
            assert_eq!(dev.download(out).unwrap(), vec![5; small]);
        }
        assert_eq!(dev.download(&d).unwrap(), vec![7; 2 * small]);
    }

    /// A stream that falls behind the proxy thread still passes its wait for a pipelined
    /// operation's `done` flag. The stream is held at that wait until the proxy thread has
    /// finished the operation; the flag's slot must still be lent then (the wait holds it), and
    /// an operation queued next on the stream must not take it. When the operation's own hold
    /// was all there was, the next operation took the slot and reset it to 0 under the wait,
    /// and the stream never went on.
    fn a_stream_behind_the_proxy_thread_keeps_its_done_flag(world: &SimpleCommunicator) {
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let config = HostTransferConfig { chunk_bytes: 4 << 10, direct: false, ..Default::default() };
        let c = HostTransferCommunicator::with_config(world, dev.clone(), stream.clone(), config).unwrap();
        let len = 4 << 10; // 16 KiB of u32: four full chunks, so the operation pipelines.
        let send = dev.upload(&vec![3u32; len]).unwrap();
        let (mut first, mut second) = (dev.alloc_zeroed::<u32>(len).unwrap(), dev.alloc_zeroed::<u32>(len).unwrap());

        let gate = stream.wait_gate();
        gate.hold();
        // Whatever fails below, the stream is let go, so the test fails rather than hangs.
        let _open = gate.held_until_drop();
        c.allreduce(&send, &mut first, Sum).unwrap();
        assert!(gate.reached_by(1, LIMIT), "the stream never reached its wait for done");
        // The proxy thread lets go of the operation's flag once it sees `done`; the ring's four
        // counters stay.
        let end = Instant::now() + LIMIT;
        while c.pool_stats().flags_in_use > RING + 1 {
            assert!(Instant::now() < end, "the operation never finished: {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.pool_stats().flags_in_use, RING + 1, "the stream waits on done, so its slot must stay lent");
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
        while c.pool_stats().flags_in_use != RING || c.pool_stats().blocks_in_use != RING_BLOCKS {
            assert!(Instant::now() < end, "the pool still lends {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
