//! Graphs: what a capture recorded, executable graphs made from it, and graph memory.
//!
//! A captured graph is the list of its nodes in capture order (a capture on one stream is a
//! chain, and a cross-stream capture enqueues in an order that keeps every dependency, so that
//! order is a valid execution order). `cuGraphInstantiate*` makes an executable graph sharing the
//! nodes; `cuGraphLaunch` replays them as one piece of stream work on the launch stream, after the
//! previous launch of the same executable graph. Besides that order, each node the graph API
//! shows ([`Listed`]: every node but the simulator's own event recordings) has a `CUgraphNode`
//! handle, its `CUgraphNodeType` and its dependencies, as the capture made them (see
//! [`crate::capture`]): `cuGraphGetNodes`, `cuGraphNodeGetType` and
//! `cuGraphNodeGetDependencies` read them.
//!
//! Graph memory: a `cuMemAllocAsync` on a capturing stream makes an allocation node. Its address
//! (in the device arena) and its bytes are fixed when the node is captured and stay the graph's
//! for its whole life; each launch maps the allocation (the address becomes a live allocation
//! for every other call), and a free node in the graph, a `cuMemFreeAsync`/`cuMemFree` outside,
//! or a launch of another graph with a free node for it unmaps it. The address is never handed
//! out again, so a stale graph pointer is always reported.
//!
//! Graph memory accounting ([`GraphMemory`], `cuDeviceGetGraphMemAttribute`): a launch maps
//! physical memory for each allocation of its graph that has none yet, and that memory stays
//! associated with the graph (counted in `USED_MEM_CURRENT`) after the allocation is freed, so
//! that the next launch reuses it: it stops counting when the executable graph is destroyed (for
//! an allocation still live, when it is then freed), when `cuDeviceGraphMemTrim` unmaps it (only
//! what no live allocation and no launch not yet run needs), or when its context is destroyed.
//! The reserve (`RESERVED_MEM_CURRENT`) grows to cover what is used and shrinks only at a trim.
//! See [`crate::conservative`] for the evidence.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use std::collections::BTreeMap;

use cuda_mem_sys::types::CUgraphNodeType;

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
        /// The node type the graph API reports for it.
        kind: CUgraphNodeType,
    },
    /// An event recording: each launch records the event anew.
    Record(Arc<Event>),
    /// An allocation node.
    Alloc(Arc<GraphAlloc>),
    /// A free node: of an allocation of this graph (`own`), or of another graph's.
    Free {
        /// The allocation's address.
        base: u64,
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

    /// The type `cuGraphNodeGetType` reports, for a node the graph API shows: every node but an
    /// event recording, which a GPU's capture makes no node of (an event recorded in a capture
    /// only notes the stream's dependencies; see [`crate::conservative`]).
    pub(crate) fn listed_kind(&self) -> Option<CUgraphNodeType> {
        match self {
            Node::Work { kind, .. } => Some(*kind),
            Node::Alloc(_) => Some(CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC),
            Node::Free { .. } => Some(CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_FREE),
            Node::Record(_) => None,
        }
    }
}

/// A node as the graph API shows it (`cuGraphGetNodes`, `cuGraphNodeGetType`,
/// `cuGraphNodeGetDependencies`, the dependencies `cuStreamGetCaptureInfo` reports).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Listed {
    /// Its `CUgraphNode` handle (unique for the life of the process).
    pub handle: usize,
    /// Its type.
    pub kind: CUgraphNodeType,
    /// The handles of the nodes it depends on (all of them earlier nodes of the same graph).
    pub deps: Vec<usize>,
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
    /// Its device's graph memory counters.
    pub memory: Arc<GraphMemory>,
    /// Whether a free node of its own graph frees it.
    freed_in_graph: AtomicBool,
}

impl GraphAlloc {
    /// A new allocation node's allocation, counted in `memory` (its device's) when launched.
    pub(crate) fn new(
        base: u64,
        size: usize,
        device: usize,
        ctx: usize,
        backing: Arc<Mapping>,
        memory: Arc<GraphMemory>,
    ) -> Arc<GraphAlloc> {
        Arc::new(GraphAlloc { base, size, device, ctx, backing, memory, freed_in_graph: AtomicBool::new(false) })
    }

    /// What it counts for in the graph memory counters.
    pub(crate) fn charge(&self) -> u64 {
        charge(self.size)
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
    /// The nodes the graph API shows, in capture order, with their dependencies.
    pub listed: Vec<Listed>,
    /// Whether an executable graph of it exists (tracked only for graphs with memory nodes).
    pub instantiated: AtomicBool,
}

impl Body {
    /// A graph of `nodes`, of which the graph API shows `listed`.
    pub(crate) fn new(nodes: Vec<Node>, listed: Vec<Listed>) -> Arc<Body> {
        Arc::new(Body { nodes, listed, instantiated: AtomicBool::new(false) })
    }

    /// Its allocation nodes' allocations.
    pub(crate) fn allocs(&self) -> impl Iterator<Item = &Arc<GraphAlloc>> {
        self.nodes.iter().filter_map(|node| match node {
            Node::Alloc(alloc) => Some(alloc),
            _ => None,
        })
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
    /// The graph's physical memory stops being associated with it: what no live allocation and
    /// no launch still to run needs stops counting as used (the rest when it is freed).
    fn drop(&mut self) {
        self.body.instantiated.store(false, Ordering::SeqCst);
        for alloc in self.body.allocs() {
            alloc.memory.exec_gone(alloc.base);
        }
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
    /// A free of the graph allocation at this address reached (see [`GraphMemory::freed`]).
    Freed(Arc<GraphMemory>, u64),
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
            Step::Freed(memory, base) => memory.freed(*base),
        }
    }
}

/// One device's graph memory: its counters (`cuDeviceGetGraphMemAttribute`) and the
/// allocations whose physical memory is associated with graphs.
#[derive(Default)]
pub(crate) struct GraphMemory {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    counters: Counters,
    /// The graph allocations (by address) a launch mapped physical memory for, until it is
    /// unmapped.
    held: BTreeMap<u64, Held>,
}

/// One graph allocation's physical memory.
struct Held {
    /// What it counts for.
    bytes: u64,
    /// How many of its uses are outstanding: launches that map it (each until its free is
    /// reached), counted from the launch call.
    uses: u32,
    /// Whether an executable graph of its graph may map it again (none destroyed since the
    /// launch that mapped it).
    exec: bool,
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

impl Inner {
    /// Stops counting the allocation at `base` as used.
    fn unmap(&mut self, base: u64) {
        if let Some(held) = self.held.remove(&base) {
            self.counters.used = self.counters.used.saturating_sub(held.bytes);
        }
    }

    /// What `allocs` (address, bytes) would add to the memory in use: those not mapped already.
    fn added(&self, allocs: &[(u64, u64)]) -> Option<u64> {
        allocs
            .iter()
            .filter(|(base, _)| !self.held.contains_key(base))
            .try_fold(0u64, |sum, &(_, bytes)| sum.checked_add(bytes))
    }
}

impl GraphMemory {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counters now.
    pub(crate) fn read(&self) -> Counters {
        self.lock().counters
    }

    /// How much the reserve would grow if a launch mapped `allocs` (address, bytes) (`None` on
    /// overflow).
    pub(crate) fn growth_for(&self, allocs: &[(u64, u64)]) -> Option<u64> {
        let inner = self.lock();
        let used = inner.counters.used.checked_add(inner.added(allocs)?)?;
        Some(used.saturating_sub(inner.counters.reserved))
    }

    /// A launch maps `allocs` (address, bytes): each not mapped already gets physical memory
    /// (counted as used), each is in use until the launch reaches its free. Returns how much the
    /// reserve grew (memory the device must now provide), or `None` if more than `available`
    /// would be needed (nothing changes then).
    pub(crate) fn map_for_launch(&self, allocs: &[(u64, u64)], available: u64) -> Option<u64> {
        let mut inner = self.lock();
        let used = inner.counters.used.checked_add(inner.added(allocs)?)?;
        let growth = used.saturating_sub(inner.counters.reserved);
        if growth > available {
            return None;
        }
        for &(base, bytes) in allocs {
            let held = inner.held.entry(base).or_insert(Held { bytes, uses: 0, exec: true });
            held.uses = held.uses.saturating_add(1);
            held.exec = true;
        }
        let counters = &mut inner.counters;
        counters.used = used;
        counters.used_high = counters.used_high.max(used);
        counters.reserved += growth;
        counters.reserved_high = counters.reserved_high.max(counters.reserved);
        Some(growth)
    }

    /// The graph allocation at `base` was freed (a free node reached, `cuMemFreeAsync` reached,
    /// `cuMemFree`): its physical memory stays associated with its executable graph, to be
    /// reused by the next launch, unless that graph was destroyed.
    pub(crate) fn freed(&self, base: u64) {
        let mut inner = self.lock();
        let Some(held) = inner.held.get_mut(&base) else { return };
        held.uses = held.uses.saturating_sub(1);
        if held.uses == 0 && !held.exec {
            inner.unmap(base);
        }
    }

    /// The executable graph of the allocation at `base` was destroyed: its physical memory
    /// stops counting as used now if the allocation is not in use, else when it is freed.
    pub(crate) fn exec_gone(&self, base: u64) {
        let mut inner = self.lock();
        let Some(held) = inner.held.get_mut(&base) else { return };
        held.exec = false;
        if held.uses == 0 {
            inner.unmap(base);
        }
    }

    /// The allocation at `base` is gone with its context: it stops counting as used.
    pub(crate) fn forget(&self, base: u64) {
        self.lock().unmap(base);
    }

    /// `cuDeviceGraphMemTrim`: unmaps the physical memory of every allocation not in use (freed,
    /// with no launch still to run that maps it) and gives back what is reserved but not in
    /// use; returns how much.
    pub(crate) fn trim(&self) -> u64 {
        let mut inner = self.lock();
        let idle: Vec<u64> = inner.held.iter().filter(|(_, held)| held.uses == 0).map(|(&base, _)| base).collect();
        for base in idle {
            inner.unmap(base);
        }
        let counters = &mut inner.counters;
        let released = counters.reserved.saturating_sub(counters.used);
        counters.reserved -= released;
        released
    }

    /// Resets a high-water mark to the current value (`cuDeviceSetGraphMemAttribute` with 0).
    pub(crate) fn reset_high(&self, reserved: bool) {
        let counters = &mut self.lock().counters;
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

    fn used_reserved(memory: &GraphMemory) -> (u64, u64) {
        let c = memory.read();
        (c.used / MIB, c.reserved / MIB)
    }

    #[test]
    fn charges_are_whole_granules() {
        assert_eq!(charge(0), 0);
        assert_eq!(charge(1), 2 * MIB);
        assert_eq!(charge(2 * MIB as usize), 2 * MIB);
        assert_eq!(charge(2 * MIB as usize + 1), 4 * MIB);
    }

    /// Freed memory stays used while its executable graph exists (the next launch reuses it);
    /// trimming unmaps what is not in use; the reserve shrinks only at a trim.
    #[test]
    fn freed_memory_stays_used_until_trimmed_or_its_graph_is_destroyed() {
        let memory = GraphMemory::default();
        assert_eq!(memory.map_for_launch(&[(0x10, 4 * MIB)], 3 * MIB), None, "more than the device has");
        assert_eq!(memory.read(), Counters::default(), "nothing changes");
        assert_eq!(memory.map_for_launch(&[(0x10, 4 * MIB)], 8 * MIB), Some(4 * MIB));
        memory.freed(0x10);
        assert_eq!(used_reserved(&memory), (4, 4), "freed: still associated with its graph");
        assert_eq!(memory.growth_for(&[(0x10, 4 * MIB)]), Some(0));
        assert_eq!(memory.map_for_launch(&[(0x10, 4 * MIB)], 0), Some(0), "relaunched: the same memory");
        assert_eq!(memory.trim(), 0, "in use: nothing to trim");
        memory.freed(0x10);
        assert_eq!(memory.trim(), 4 * MIB);
        assert_eq!(used_reserved(&memory), (0, 0));
        let c = memory.read();
        assert_eq!((c.used_high, c.reserved_high), (4 * MIB, 4 * MIB));
        memory.reset_high(false);
        memory.reset_high(true);
        assert_eq!(memory.read(), Counters::default());

        // Destroying the executable graph ends the association: at once for freed memory, at
        // the free for a live allocation; the reserve stays.
        memory.map_for_launch(&[(0x20, 2 * MIB), (0x30, 2 * MIB)], u64::MAX).unwrap();
        memory.freed(0x20);
        memory.exec_gone(0x20);
        memory.exec_gone(0x30);
        assert_eq!(used_reserved(&memory), (2, 4));
        memory.freed(0x30);
        assert_eq!(used_reserved(&memory), (0, 4));
        memory.freed(0x30);
        memory.exec_gone(0x40);
        assert_eq!(used_reserved(&memory), (0, 4), "unknown or unmapped addresses change nothing");
        assert_eq!(memory.map_for_launch(&[(0x50, 2 * MIB)], 0), Some(0), "the reserve is reused");
        memory.forget(0x50);
        assert_eq!(used_reserved(&memory), (0, 4), "gone with its context");
        assert_eq!(memory.trim(), 4 * MIB);
    }
}
