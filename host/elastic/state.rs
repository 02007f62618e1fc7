//! What an elastic job keeps: the program's state as parts saved to host bytes
//! ([`StatePart`], [`State`]), and the committed copies of it ([`Store`]), each kept by this
//! rank and replicated to the next (`docs/elastic.md`).

use bytemuck::Pod;

use crate::api::error::{Error, Result};
use crate::device::cpu::{HostBuffer, HostDevice};

/// One buffer of a program's state, saved into host bytes at a commit and restored from them
/// after a failure or on a joining rank. Its length in bytes must be the same at every save
/// and on every rank that holds the same part.
pub trait StatePart {
    /// The part's length in bytes.
    fn bytes(&self) -> usize;
    /// Appends the part's bytes to `out`.
    fn save(&self, out: &mut Vec<u8>) -> Result<()>;
    /// Overwrites the part with `from` ([`bytes`](Self::bytes) long: the driver checks).
    fn load(&mut self, from: &[u8]) -> Result<()>;
}

/// `StatePart` for a container of Pod values, through its slice.
macro_rules! slice_part {
    ([$($params:tt)*] $ty:ty) => {
        impl<$($params)*> StatePart for $ty {
            fn bytes(&self) -> usize {
                std::mem::size_of_val(self.as_slice())
            }
            fn save(&self, out: &mut Vec<u8>) -> Result<()> {
                out.extend_from_slice(bytemuck::cast_slice(self.as_slice()));
                Ok(())
            }
            fn load(&mut self, from: &[u8]) -> Result<()> {
                bytemuck::cast_slice_mut::<T, u8>(self.as_mut_slice()).copy_from_slice(from);
                Ok(())
            }
        }
    };
}

slice_part!([T: Pod] Vec<T>);
slice_part!([T: Pod, const N: usize] [T; N]);

/// A buffer of the host device, with the device that reads and writes it (after its streams'
/// queued work).
#[derive(Debug)]
pub struct HostDeviceState<T: crate::Element> {
    /// The device.
    pub dev: HostDevice,
    /// The buffer.
    pub buf: HostBuffer<T>,
}

impl<T: crate::Element> StatePart for HostDeviceState<T> {
    fn bytes(&self) -> usize {
        self.buf.len() * std::mem::size_of::<T>()
    }
    fn save(&self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(bytemuck::cast_slice(&self.dev.download(&self.buf)?));
        Ok(())
    }
    fn load(&mut self, from: &[u8]) -> Result<()> {
        let data: Vec<T> = elements(from);
        self.dev.write(&mut self.buf, &data)
    }
}

/// A buffer of a CUDA device, read and written in its stream's order (the host waits).
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub struct CudaState<T: crate::Element> {
    /// The device.
    pub dev: crate::device::cuda::CudaDevice,
    /// The stream the copies are queued on.
    pub stream: std::sync::Arc<cudarc::driver::CudaStream>,
    /// The buffer.
    pub buf: cudarc::driver::CudaSlice<T>,
}

#[cfg(feature = "cuda")]
impl<T: crate::Element> StatePart for CudaState<T> {
    fn bytes(&self) -> usize {
        self.buf.len() * std::mem::size_of::<T>()
    }
    fn save(&self, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(bytemuck::cast_slice(&self.dev.download(&self.stream, &self.buf)?));
        Ok(())
    }
    fn load(&mut self, from: &[u8]) -> Result<()> {
        let data: Vec<T> = elements(from);
        self.buf = self.dev.upload(&self.stream, &data)?;
        Ok(())
    }
}

/// `from` as elements of `T` (its length a multiple of theirs: the driver checks).
fn elements<T: Pod>(from: &[u8]) -> Vec<T> {
    let mut out = vec![T::zeroed(); from.len() / std::mem::size_of::<T>().max(1)];
    bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(from);
    out
}

/// A program's state, in two kinds of parts:
///
/// - **global** parts hold the same bytes on every rank (a data-parallel model and its
///   optimizer state): a joining rank gets them from any peer;
/// - **local** parts are this rank's own (its data cursor, its random state, its shard): each
///   commit copies them to the next rank too, so a rank that replaces a dead one gets the dead
///   rank's local parts from there.
///
/// Every rank must list parts of the same lengths.
pub trait State {
    /// The parts every rank holds alike.
    fn global(&mut self) -> Vec<&mut dyn StatePart>;
    /// This rank's own parts (none by default).
    fn local(&mut self) -> Vec<&mut dyn StatePart> {
        Vec::new()
    }
}

/// The parts' bytes, back to back.
pub(crate) fn save(parts: Vec<&mut dyn StatePart>, out: &mut Vec<u8>) -> Result<()> {
    out.clear();
    for p in parts {
        let (before, want) = (out.len(), p.bytes());
        p.save(out)?;
        if out.len() - before != want {
            return Err(Error::InvalidConfig("a state part saved another number of bytes than it says it has"));
        }
    }
    Ok(())
}

/// Loads `from` into the parts, which must add up to its length.
pub(crate) fn load(parts: Vec<&mut dyn StatePart>, from: &[u8]) -> Result<()> {
    let total: usize = parts.iter().map(|p| p.bytes()).sum();
    if total != from.len() {
        return Err(Error::Membership(format!(
            "a saved state of {} bytes cannot load into this rank's state of {total} bytes (every rank must list parts \
             of the same lengths)",
            from.len()
        )));
    }
    let mut at = 0;
    for p in parts {
        let n = p.bytes();
        p.load(&from[at..at + n])?;
        at += n;
    }
    Ok(())
}

/// The length in bytes of the parts.
pub(crate) fn bytes(parts: Vec<&mut dyn StatePart>) -> usize {
    parts.iter().map(|p| p.bytes()).sum()
}

/// One committed (or pending) copy.
#[derive(Debug, Default)]
pub(crate) struct Generation {
    /// The step the copy was taken before.
    pub step: u64,
    pub global: Vec<u8>,
    pub local: Vec<u8>,
    /// The local parts of the rank before this one (its slot), as of the same step.
    pub replica: Option<(u64, Vec<u8>)>,
}

/// The copies one rank keeps: the two newest committed generations (a rank may be one commit
/// ahead of another when a failure cuts an agreement short, `docs/elastic.md`) and the one
/// being committed.
#[derive(Debug, Default)]
pub(crate) struct Store {
    /// Newest first.
    pub committed: Vec<Generation>,
    pub pending: Option<Generation>,
}

impl Store {
    /// A generation to fill: the oldest's buffers are reused once two are kept.
    pub fn blank(&mut self) -> Generation {
        if self.committed.len() >= 2 { self.committed.pop().unwrap_or_default() } else { Generation::default() }
    }

    /// The pending generation becomes the newest committed one.
    pub fn promote(&mut self) {
        if let Some(g) = self.pending.take() {
            self.committed.insert(0, g);
            self.committed.truncate(2);
        }
    }

    /// The committed generation of `step`.
    pub fn at(&self, step: u64) -> Option<&Generation> {
        self.committed.iter().find(|g| g.step == step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Two {
        model: Vec<f32>,
        cursor: [u64; 2],
    }

    impl State for Two {
        fn global(&mut self) -> Vec<&mut dyn StatePart> {
            vec![&mut self.model]
        }
        fn local(&mut self) -> Vec<&mut dyn StatePart> {
            vec![&mut self.cursor]
        }
    }

    #[test]
    fn parts_save_and_load_back() {
        let mut a = Two { model: vec![1.5, -2.0, 3.25], cursor: [7, 9] };
        let (mut g, mut l) = (Vec::new(), Vec::new());
        save(a.global(), &mut g).unwrap();
        save(a.local(), &mut l).unwrap();
        assert_eq!((g.len(), l.len()), (12, 16));
        let mut b = Two { model: vec![0.0; 3], cursor: [0; 2] };
        load(b.global(), &g).unwrap();
        load(b.local(), &l).unwrap();
        assert_eq!((b.model, b.cursor), (a.model.clone(), a.cursor));
        // Another length is an error, not a partial load.
        let mut c = Two { model: vec![0.0; 4], cursor: [0; 2] };
        assert!(matches!(load(c.global(), &g), Err(Error::Membership(_))));
        assert_eq!(c.model, vec![0.0; 4]);
    }

    #[test]
    fn the_store_keeps_two_commits_and_reuses_the_oldest() {
        let mut store = Store::default();
        for step in 0..4u64 {
            let mut g = store.blank();
            g.step = step;
            g.global = vec![step.to_le_bytes()[0]; 8];
            store.pending = Some(g);
            store.promote();
        }
        let steps: Vec<u64> = store.committed.iter().map(|g| g.step).collect();
        assert_eq!(steps, vec![3, 2]);
        assert!(store.at(2).is_some() && store.at(1).is_none());
        // The next commit takes the oldest's buffers.
        let reused = store.blank();
        assert_eq!((reused.step, reused.global.capacity() >= 8), (2, true));
        assert_eq!(store.committed.len(), 1);
    }
}
