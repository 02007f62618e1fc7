//! Which node each rank of a communicator runs on.
//!
//! Learned once, when a communicator is made: `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)` groups
//! the ranks that share memory, and an allgather of each group's lowest rank names the nodes.
//! The hierarchical algorithms (`AllreduceAlgorithm::Hierarchical` and friends) and the
//! automatic algorithm choice ([`crate::Tuning`]) read it; `docs/topology.md` explains both.

/// The nodes of a communicator and the ranks on each.
///
/// Nodes are numbered by their lowest rank (node 0 holds rank 0); the ranks of a node are
/// listed in rank order. Ranks need not be contiguous per node (`mpirun --map-by node` deals
/// them out round-robin) and nodes need not hold equally many.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    node_of: Vec<usize>,
    nodes: Vec<Vec<usize>>,
    /// [`Topology::shape`], which every automatic choice reads.
    shape: Shape,
}

impl Topology {
    /// The topology where `leaders[r]` is the lowest rank on rank `r`'s node.
    pub(crate) fn from_leaders(leaders: &[usize]) -> Self {
        let mut ids: Vec<usize> = leaders.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let node_of: Vec<usize> = leaders.iter().map(|l| ids.binary_search(l).unwrap_or(0)).collect();
        let mut nodes = vec![Vec::new(); ids.len()];
        for (rank, &node) in node_of.iter().enumerate() {
            nodes[node].push(rank);
        }
        let sizes = nodes.iter().map(Vec::len);
        let shape = Shape {
            nodes: nodes.len(),
            min_per_node: sizes.clone().min().unwrap_or(0),
            max_per_node: sizes.max().unwrap_or(0),
        };
        Topology { node_of, nodes, shape }
    }

    /// The number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node `rank` runs on (0 for a rank out of range).
    pub fn node_of(&self, rank: usize) -> usize {
        self.node_of.get(rank).copied().unwrap_or(0)
    }

    /// The ranks on `node`, in rank order (empty for a node out of range).
    pub fn ranks_on(&self, node: usize) -> &[usize] {
        self.nodes.get(node).map_or(&[], Vec::as_slice)
    }

    /// `rank`'s index among the ranks of its node.
    pub fn local_index(&self, rank: usize) -> usize {
        self.ranks_on(self.node_of(rank)).iter().position(|&r| r == rank).unwrap_or(0)
    }

    /// The summary the automatic algorithm choice works from.
    pub fn shape(&self) -> Shape {
        self.shape
    }
}

/// How many nodes and how many ranks on each: what [`Tuning`](crate::Tuning) keys its choices
/// on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The number of nodes.
    pub nodes: usize,
    /// The fewest ranks on one node.
    pub min_per_node: usize,
    /// The most ranks on one node.
    pub max_per_node: usize,
}

impl Shape {
    /// All ranks on one node.
    pub fn single_node(&self) -> bool {
        self.nodes <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_by_their_lowest_rank() {
        // Ranks dealt round-robin over two nodes, and a third node with one rank.
        let t = Topology::from_leaders(&[0, 1, 0, 1, 4]);
        assert_eq!(t.node_count(), 3);
        assert_eq!(t.ranks_on(0), &[0, 2]);
        assert_eq!(t.ranks_on(1), &[1, 3]);
        assert_eq!(t.ranks_on(2), &[4]);
        assert_eq!((t.node_of(3), t.local_index(3)), (1, 1));
        assert_eq!(t.shape(), Shape { nodes: 3, min_per_node: 1, max_per_node: 2 });
        assert!(Topology::from_leaders(&[0, 0, 0]).shape().single_node());
    }
}

/// Which MPI library the process runs on, from `MPI_Get_library_version`: what
/// [`Tuning::for_library`](crate::Tuning::for_library) adjusts its thresholds for
/// (`docs/topology.md`, "Per MPI").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MpiLibrary {
    /// Open MPI (4 or 5).
    OpenMpi,
    /// MPICH, or an MPI of its family that says so (MVAPICH2, Intel MPI, Cray MPICH).
    Mpich,
    /// Any other.
    Other,
}

impl MpiLibrary {
    /// The library that `version` (`MPI_Get_library_version`'s text) describes.
    pub fn from_version(version: &str) -> MpiLibrary {
        let mpich_family = ["MPICH", "MVAPICH", "Intel(R) MPI", "CRAY MPICH"];
        if version.starts_with("Open MPI") {
            MpiLibrary::OpenMpi
        } else if mpich_family.iter().any(|m| version.contains(m)) {
            MpiLibrary::Mpich
        } else {
            MpiLibrary::Other
        }
    }

    /// The library this process runs on (asked once).
    pub fn running() -> MpiLibrary {
        static RUNNING: std::sync::OnceLock<MpiLibrary> = std::sync::OnceLock::new();
        *RUNNING.get_or_init(|| MpiLibrary::from_version(&crate::ffi::library_version()))
    }
}

#[cfg(test)]
mod library_tests {
    use super::MpiLibrary;

    #[test]
    fn version_strings_name_their_library() {
        let cases = [
            ("Open MPI v5.0.11, package: Open MPI ..., ident: 5.0.11", MpiLibrary::OpenMpi),
            ("MPICH Version:\t5.0.2\nMPICH Release date: ...", MpiLibrary::Mpich),
            ("MVAPICH2 Version      :\t2.3.6", MpiLibrary::Mpich),
            ("Intel(R) MPI Library 2021.6 for Linux* OS", MpiLibrary::Mpich),
            ("MPI VERSION    : CRAY MPICH version 8.1.28.2 (ANL base 3.4a2)", MpiLibrary::Mpich),
            ("Microsoft MPI 10.1", MpiLibrary::Other),
        ];
        for (version, library) in cases {
            assert_eq!(MpiLibrary::from_version(version), library, "{version}");
        }
    }
}
