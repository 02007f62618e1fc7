//! The public surface every backend shares: the [`Collectives`](collectives::Collectives)
//! trait, MPI's start and end ([`init`](init::init)), requests and scopes, errors, the
//! communicator's node topology, and the device code the kernels crate built.

pub(crate) mod collectives;
pub mod device_code;
pub(crate) mod error;
pub(crate) mod init;
pub(crate) mod launch;
pub(crate) mod request;
pub mod topology;
