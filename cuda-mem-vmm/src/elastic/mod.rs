//! Elastic memory: physical memory given back to the device and taken again, every address
//! kept (vLLM's sleep mode, SGLang's memory saver, kvcached).
//!
//! - `group`: [`ElasticGroup`] (and its [`ElasticBuffer`]s, reached through [`ElasticAccess`]):
//!   buffers that sleep ([`Release::Discard`] or [`Release::Offload`] to pinned host memory)
//!   and wake together, at the same addresses;
//! - `on_demand`: [`OnDemandRange`]: a reservation much larger than memory, its pages mapped
//!   and unmapped one group at a time as what is used grows and shrinks (kvcached's KV cache);
//! - `access`: [`ElasticAccess`], the memory of either while it stays mapped;
//! - `snapshot`: both in memory snapshots (segments of what is mapped);
//! - `backing`: a reservation cut into chunks, each mapped or not, that both map and unmap.

mod access;
mod backing;
mod group;
mod on_demand;
mod snapshot;

pub use access::ElasticAccess;
pub use group::{Discarded, ElasticBuffer, ElasticGroup, ElasticStatistics, Release, SleepReport, WakeReport};
pub use on_demand::{OnDemandRange, OnDemandStatistics};
