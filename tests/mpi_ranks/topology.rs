//! Where the ranks run: a communicator's node-local rank and size, its topology and a split by
//! node, checked against the hostnames the ranks report. One node under plain mpirun; several
//! on the simulated cluster (`scripts/cluster.sh`, the `cluster_*` trials), where each host is a
//! network namespace with a hostname of its own.

use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::*;
use duralumin::{MpiCommunicator, Sum};

use crate::mpirun::rank_case::{enter, within};

/// Bytes a hostname is gathered in (`MPI_MAX_PROCESSOR_NAME` is 256 in Open MPI and MPICH).
const NAME_BYTES: usize = 256;

pub fn run(c: &MpiCommunicator, world: &SimpleCommunicator) {
    let names = within("gather the hostnames", || hostnames(world));
    within("local rank and size against the hostnames", || nodes(c, &names));
    within("placement by slot on the simulated cluster", || placement(&names));
    within("the shared-memory allreduce on several nodes", || shared_memory_refused(c));
    crate::engine::topology(c);
}

/// The shared-memory allreduce needs every rank on one node: across nodes it is refused on
/// every rank, with nothing sent, and the communicator goes on working.
fn shared_memory_refused(c: &MpiCommunicator) {
    let mut x = [1u32; 4];
    let r = c.allreduce_in_place_with(&mut x, duralumin::Sum, duralumin::AllreduceAlgorithm::SharedMemory);
    if c.topology().node_count() > 1 {
        assert!(matches!(r, Err(duralumin::Error::AlgorithmUnsupported { .. })), "{r:?}");
    } else {
        r.expect("shared-memory allreduce on one node");
        assert_eq!(x, [c.size() as u32; 4]);
        let _case = enter("a shared-memory allreduce large enough to stream its result out");
        // Over `STREAM_BYTES` (4 MiB), into a receive buffer one element off its allocation's
        // alignment, an odd length.
        let n = (5 << 20) / 4 + 3;
        let value = |rank: usize, i: usize| (i % 100_003) as u32 * 7 + rank as u32;
        let send: Vec<u32> = (0..n).map(|i| value(c.rank(), i)).collect();
        let mut recv = vec![0u32; n + 1];
        c.allreduce_with(&send, &mut recv[1..], Sum, duralumin::AllreduceAlgorithm::SharedMemory)
            .expect("large shared-memory allreduce");
        let bad = (0..n).find(|&i| recv[1 + i] != (0..c.size()).map(|r| value(r, i)).sum::<u32>());
        assert_eq!(bad, None, "first wrong element of the large shared-memory allreduce");
    }
    c.barrier().expect("barrier after the refusal");
}

/// Every rank's hostname (`MPI_Get_processor_name`), in rank order.
fn hostnames(world: &SimpleCommunicator) -> Vec<String> {
    let name = duralumin::mpi::environment::processor_name().expect("MPI_Get_processor_name");
    assert!(!name.is_empty() && name.len() < NAME_BYTES, "processor name {name:?}");
    let mut mine = [0u8; NAME_BYTES];
    mine[..name.len()].copy_from_slice(name.as_bytes());
    let mut all = vec![0u8; NAME_BYTES * usize::try_from(world.size()).expect("world size")];
    world.all_gather_into(&mine[..], &mut all[..]);
    all.chunks(NAME_BYTES)
        .map(|b| String::from_utf8_lossy(&b[..b.iter().position(|&x| x == 0).unwrap_or(b.len())]).into_owned())
        .collect()
}

/// `local_rank`/`local_size`, the topology and a split by node agree with the hostnames.
fn nodes(c: &MpiCommunicator, names: &[String]) {
    let (me, n) = (c.rank(), c.size());
    assert_eq!(names.len(), n);
    // Nodes numbered in the order of their lowest rank.
    let mut hosts: Vec<&str> = Vec::new();
    for name in names {
        if !hosts.contains(&name.as_str()) {
            hosts.push(name);
        }
    }
    let node = hosts.iter().position(|h| *h == names[me]).expect("own host");
    let peers: Vec<usize> = (0..n).filter(|&r| names[r] == names[me]).collect();
    let index = peers.iter().position(|&r| r == me).expect("own rank");
    let on = format!("rank {me} on {} (ranks by host: {names:?})", names[me]);
    assert_eq!(c.local_size(), peers.len(), "local_size of {on}");
    assert_eq!(c.local_rank(), index, "local_rank of {on}");

    let topology = c.topology();
    assert_eq!(topology.node_count(), hosts.len(), "node count seen by {on}");
    for (r, name) in names.iter().enumerate() {
        let host = hosts.iter().position(|h| h == name).expect("host");
        assert_eq!(topology.node_of(r), host, "node of rank {r}, seen by {on}");
    }
    assert_eq!(topology.ranks_on(node), peers, "ranks on the node of {on}");
    assert_eq!(topology.local_index(me), index, "local index of {on}");

    let _case = enter("split by node");
    let local = c.split(Some(node as u32), me as i32).expect("split by node").expect("member");
    assert_eq!((local.rank(), local.size()), (index, peers.len()), "split by node of {on}");
    assert_eq!((local.local_rank(), local.local_size()), (index, peers.len()), "one node: {on}");
    let mut sum = [me as u64];
    local.allreduce_in_place(&mut sum, Sum).expect("allreduce on the node");
    assert_eq!(sum[0], peers.iter().map(|&r| r as u64).sum::<u64>(), "allreduce on the node of {on}");
}

/// Under `scripts/cluster.sh mpirun` (which passes its hostfile to the ranks), ranks fill
/// host 0's slots first, then host 1's, as on a real cluster's hostfile, when they fill every
/// slot.
fn placement(names: &[String]) {
    let Ok(path) = std::env::var("DURALUMIN_CLUSTER_HOSTFILE") else { return };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut expected = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (host, slots) = line.split_once(" slots=").unwrap_or_else(|| panic!("{path}: line {line:?}"));
        let slots: usize = slots.trim().parse().unwrap_or_else(|e| panic!("{path}: line {line:?}: {e}"));
        expected.extend(std::iter::repeat_n(host.to_string(), slots));
    }
    if expected.len() == names.len() {
        assert_eq!(names, expected, "ranks' hosts against the hostfile {path}");
    }
}
