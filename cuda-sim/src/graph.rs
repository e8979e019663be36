//! Graphs: what a capture recorded, executable graphs made from it, and graph memory.
//!
//! A captured graph is the list of its nodes in capture order (a capture on one stream is a
//! chain, so that order is a valid execution order). `cuGraphInstantiate*` makes an executable
//! graph sharing the nodes; `cuGraphLaunch` replays them as one piece of stream work on the
//! launch stream, after the previous launch of the same executable graph.
//!
//! Graph memory: a `cuMemAllocAsync` on a capturing stream makes an allocation node. Its address
//! (in the device arena) and its bytes are fixed when the node is captured and stay the graph's
//! for its whole life; each launch maps the allocation (the address becomes a live allocation
//! for every other call), and a free node in the graph, a `cuMemFreeAsync`/`cuMemFree` outside,
//! or a launch of another graph with a free node for it unmaps it. The address is never handed
//! out again, so a stale graph pointer is always reported.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::context::Fault;
use crate::event::Event;
use crate::memory::{Mapping, Touch};
use crate::stream::{Fence, Op};

/// The granularity graph memory is reserved and counted in (the VMM granularity every simulated
/// device has: graph memory is mapped physical memory on a GPU).
pub(crate) const GRAPH_GRANULARITY: u64 = 2 << 20;

/// What graph memory of `size` bytes counts for.
pub(crate) fn charge(size: usize) -> u64 {
    (size as u64).div_ceil(GRAPH_GRANULARITY).saturating_mul(GRAPH_GRANULARITY)
}

/// One node of a captured graph.
pub(crate) enum Node {
    /// Stream work (a copy, a memset, a host function, a wait), run again at each launch.
    Work {
        /// The work.
        op: Mutex<Op>,
        /// The simulator's memory it touches (checked at each launch).
        touches: Vec<Touch>,
    },
    /// An event recording: each launch records the event anew.
    Record(Arc<Event>),
    /// An allocation node.
    Alloc(Arc<GraphAlloc>),
    /// A free node: of an allocation of this graph (`own`), or of another graph's.
    Free {
        /// The allocation's address.
        base: u64,
        /// Its size.
        size: usize,
        /// Its device.
        device: usize,
        /// Whether an allocation node of this graph made it.
        own: bool,
    },
}

impl Node {
    /// Whether it is an allocation or a free node (such graphs have one executable graph at a
    /// time, as `cuda.h` says).
    pub(crate) fn is_memory_node(&self) -> bool {
        matches!(self, Node::Alloc(_) | Node::Free { .. })
    }
}

/// A graph allocation: its fixed address and bytes.
pub(crate) struct GraphAlloc {
    /// Its address.
    pub base: u64,
    /// The size asked for.
    pub size: usize,
    /// The device of the capturing stream.
    pub device: usize,
    /// The context of the capturing stream.
    pub ctx: usize,
    /// Its bytes, the same at every launch.
    pub backing: Arc<Mapping>,
    /// Whether a free node of its own graph frees it.
    freed_in_graph: AtomicBool,
}

impl GraphAlloc {
    /// A new allocation node's allocation.
    pub(crate) fn new(base: u64, size: usize, device: usize, ctx: usize, backing: Arc<Mapping>) -> Arc<GraphAlloc> {
        Arc::new(GraphAlloc { base, size, device, ctx, backing, freed_in_graph: AtomicBool::new(false) })
    }

    /// Whether a free node of its own graph frees it.
    pub(crate) fn is_freed_in_graph(&self) -> bool {
        self.freed_in_graph.load(Ordering::SeqCst)
    }

    /// Notes the free node of its own graph; `false` if there already is one.
    pub(crate) fn mark_freed_in_graph(&self) -> bool {
        !self.freed_in_graph.swap(true, Ordering::SeqCst)
    }
}

/// A captured graph's nodes, shared by the graph and its executable graphs.
pub(crate) struct Body {
    /// The nodes, in capture order.
    pub nodes: Vec<Node>,
    /// Whether an executable graph of it exists (tracked only for graphs with memory nodes).
    pub instantiated: AtomicBool,
}

impl Body {
    /// A graph of `nodes`.
    pub(crate) fn new(nodes: Vec<Node>) -> Arc<Body> {
        Arc::new(Body { nodes, instantiated: AtomicBool::new(false) })
    }

    /// Whether it has allocation or free nodes.
    pub(crate) fn has_memory_nodes(&self) -> bool {
        self.nodes.iter().any(Node::is_memory_node)
    }
}

/// An executable graph.
pub(crate) struct Exec {
    /// The nodes it runs.
    pub body: Arc<Body>,
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_*`.
    pub flags: u64,
    /// Where its latest launch ends: the next launch waits for it.
    pub last_launch: Mutex<Option<Fence>>,
    /// The user object references it holds (those of its graph when it was instantiated), kept
    /// by each launch until the launch completes.
    pub user_objects: Arc<crate::user_object::Held>,
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.body.instantiated.store(false, Ordering::SeqCst);
    }
}

/// One step of a launch, decided when the graph is launched.
pub(crate) enum Step {
    /// Run node `index` (a [`Node::Work`]).
    Work(usize),
    /// Node `index` (a [`Node::Work`]) touches memory no longer mapped at the launch: a GPU
    /// faults (`CUDA_ERROR_ILLEGAL_ADDRESS`), which becomes the context's sticky error; the
    /// node does not run.
    Fault(Arc<Fault>),
    /// Complete recording `generation` of an event.
    Complete(Arc<Event>, u64),
    /// A free node reached: the allocation's memory stops counting as used.
    Release(Arc<GraphMemory>, u64),
}

/// Runs a launch's steps in order, on the stream's worker.
pub(crate) fn run_steps(body: &Body, steps: &[Step]) {
    for step in steps {
        match step {
            Step::Work(index) => {
                if let Some(Node::Work { op, .. }) = body.nodes.get(*index) {
                    let mut op = op.lock().unwrap_or_else(PoisonError::into_inner);
                    (*op)();
                }
            }
            Step::Fault(fault) => fault.record(cuda_mem_sys::types::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
            // Waiting for it shows the host no stream's frees (the simulator keeps no marks for
            // a graph's recordings: see `conservative`).
            Step::Complete(event, generation) => event.complete(*generation, None),
            Step::Release(memory, bytes) => memory.release(*bytes),
        }
    }
}

/// One device's graph memory counters (`cuDeviceGetGraphMemAttribute`).
#[derive(Default)]
pub(crate) struct GraphMemory {
    counters: Mutex<Counters>,
}

/// The four attributes.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counters {
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT`.
    pub used: u64,
    /// `CU_GRAPH_MEM_ATTR_USED_MEM_HIGH`.
    pub used_high: u64,
    /// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`.
    pub reserved: u64,
    /// `CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH`.
    pub reserved_high: u64,
}

impl GraphMemory {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters now.
    pub(crate) fn read(&self) -> Counters {
        *self.lock()
    }

    /// How much the reserve would grow if `bytes` more were used (`None` on overflow).
    pub(crate) fn growth_for(&self, bytes: u64) -> Option<u64> {
        let counters = self.lock();
        Some(counters.used.checked_add(bytes)?.saturating_sub(counters.reserved))
    }

    /// A launch maps `bytes` of graph memory: returns how much the reserve grew (memory the
    /// device must now provide), or `None` if more than `available` would be needed (nothing
    /// changes then).
    pub(crate) fn use_bytes(&self, bytes: u64, available: u64) -> Option<u64> {
        let mut counters = self.lock();
        let used = counters.used.checked_add(bytes)?;
        let growth = used.saturating_sub(counters.reserved);
        if growth > available {
            return None;
        }
        counters.used = used;
        counters.used_high = counters.used_high.max(used);
        counters.reserved += growth;
        counters.reserved_high = counters.reserved_high.max(counters.reserved);
        Some(growth)
    }

    /// Graph memory freed: it stays reserved for later launches until trimmed.
    pub(crate) fn release(&self, bytes: u64) {
        let mut counters = self.lock();
        counters.used = counters.used.saturating_sub(bytes);
    }

    /// `cuDeviceGraphMemTrim`: gives back what is reserved but not in use; returns how much.
    pub(crate) fn trim(&self) -> u64 {
        let mut counters = self.lock();
        let released = counters.reserved.saturating_sub(counters.used);
        counters.reserved -= released;
        released
    }

    /// Resets a high-water mark to the current value (`cuDeviceSetGraphMemAttribute` with 0).
    pub(crate) fn reset_high(&self, reserved: bool) {
        let mut counters = self.lock();
        if reserved {
            counters.reserved_high = counters.reserved;
        } else {
            counters.used_high = counters.used;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn counters_follow_use_release_and_trim() {
        let memory = GraphMemory::default();
        assert_eq!(charge(1), 2 * MIB);
        assert_eq!(charge(2 * MIB as usize), 2 * MIB);
        assert_eq!(charge(2 * MIB as usize + 1), 4 * MIB);
        assert_eq!(memory.use_bytes(4 * MIB, 3 * MIB), None, "more than the device has: nothing changes");
        assert_eq!(memory.read(), Counters::default());
        assert_eq!(memory.use_bytes(4 * MIB, 8 * MIB), Some(4 * MIB));
        memory.release(4 * MIB);
        assert_eq!(memory.use_bytes(2 * MIB, 0), Some(0), "the reserve is reused");
        let c = memory.read();
        assert_eq!((c.used, c.used_high, c.reserved, c.reserved_high), (2 * MIB, 4 * MIB, 4 * MIB, 4 * MIB));
        memory.reset_high(false);
        assert_eq!(memory.read().used_high, 2 * MIB);
        assert_eq!(memory.trim(), 2 * MIB, "only what is not in use is trimmed");
        memory.reset_high(true);
        let c = memory.read();
        assert_eq!((c.used, c.reserved, c.reserved_high), (2 * MIB, 2 * MIB, 2 * MIB));
        memory.release(2 * MIB);
        assert_eq!(memory.trim(), 2 * MIB);
        assert_eq!(memory.read().reserved, 0);
    }
}
