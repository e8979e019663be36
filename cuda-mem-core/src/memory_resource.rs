//! The `MemoryResource` abstraction: anything that hands out and takes back memory in stream
//! order. The pools of this crate implement it; so can an application's own allocator.

use std::any::Any;
use std::fmt::Debug;

use crate::access::Access;
use crate::device::{Device, DevicePtr};
use crate::error::Result;
use crate::pool::{MemoryPool, PoolAttributes, PoolKind, PoolUsage, ReusePolicy};
use crate::stream::Stream;

/// A source of memory.
///
/// Implementations allocate and free raw pointers; [`Buffer`](crate::Buffer) owns the result and calls
/// [`deallocate_raw`](MemoryResource::deallocate_raw) exactly once. Allocate through
/// [`MemoryResourceExt::allocate`](crate::MemoryResourceExt::allocate) to get a `Buffer` that keeps the resource alive.
///
/// A resource is shared between threads (buffers may be dropped anywhere), hence `Send + Sync`;
/// it is `Any`, so that code that needs more than this trait can find the concrete type. The
/// pool behind a resource, which sharing its buffers needs, it names itself
/// ([`memory_pool`](MemoryResource::memory_pool)).
///
/// Most resources answer the questions about their memory the same way, so the trait answers
/// them by default: an adaptor as the resource it wraps ([`upstream`](MemoryResource::upstream)),
/// a pool resource as its pool ([`memory_pool`](MemoryResource::memory_pool)). A resource with
/// neither answers for itself.
///
/// # Safety
/// [`Buffer`](crate::Buffer) builds host slices and device operations on what an implementation
/// reports, so implementing the trait promises: `allocate_raw` returns the address of at least
/// `size` bytes that stay valid until `deallocate_raw` is called for them; `is_host_accessible` is
/// true only if those bytes can be read and written by the host at that address, and
/// `is_device_accessible` only if devices can use them. The host slices also rest on
/// `may_be_written_externally`, true whenever anything but this process's buffers may write the
/// memory (another process importing it), and `is_managed`, true whenever it is managed memory
/// (whose host access waits for the devices). The defaults keep these promises when `upstream`
/// names the resource the memory comes from and `memory_pool` the pool it comes from; a resource
/// whose memory is otherwise answers for itself.
pub unsafe trait MemoryResource: AsDynMemoryResource + Any + Send + Sync + Debug {
    /// Allocates `size` bytes (more than 0), usable by work enqueued on `stream` after this call.
    ///
    /// # Errors
    /// When the memory cannot be had.
    fn allocate_raw(&self, size: usize, stream: &Stream) -> Result<DevicePtr>;

    /// Frees memory this resource allocated, once work enqueued on `stream` so far is done.
    ///
    /// # Safety
    /// `ptr` and `size` come from one `allocate_raw` call of this resource, the memory has not
    /// been freed since, and nothing uses it after the work already enqueued on `stream`.
    ///
    /// # Errors
    /// When the driver refuses (the memory is then not freed).
    unsafe fn deallocate_raw(&self, ptr: DevicePtr, size: usize, stream: &Stream) -> Result<()>;

    /// Whether devices can access the memory. By default (as the next four): as the
    /// [`upstream`](MemoryResource::upstream) resource answers, else true for memory of a
    /// [`memory_pool`](MemoryResource::memory_pool), false for a resource with neither.
    fn is_device_accessible(&self) -> bool {
        match self.upstream() {
            Some(upstream) => upstream.is_device_accessible(),
            None => self.memory_pool().is_some(),
        }
    }

    /// Whether the host can access the memory. By default as the upstream resource answers,
    /// else as the pool's [`kind`](MemoryPool::kind) says (pinned and managed memory), false for
    /// a resource with neither.
    fn is_host_accessible(&self) -> bool {
        match self.upstream() {
            Some(upstream) => upstream.is_host_accessible(),
            None => self.memory_pool().is_some_and(|pool| pool.kind().is_host_accessible()),
        }
    }

    /// The device the memory belongs to, if one does (`None` for host memory). By default as
    /// the upstream resource answers, else the pool's [`owner`](MemoryPool::owner), `None` for a
    /// resource with neither.
    #[doc(alias = "device_id")]
    fn device(&self) -> Option<Device> {
        match self.upstream() {
            Some(upstream) => upstream.device(),
            None => self.memory_pool().and_then(MemoryPool::owner),
        }
    }

    /// Whether the memory is managed (migrates between host and devices). By default as the
    /// upstream resource answers, else whether the pool holds managed memory, false for a
    /// resource with neither.
    fn is_managed(&self) -> bool {
        match self.upstream() {
            Some(upstream) => upstream.is_managed(),
            None => self.memory_pool().is_some_and(|pool| pool.kind() == PoolKind::Managed),
        }
    }

    /// Whether the memory may be written by something other than this process's buffers while
    /// they hold it: true for memory shared with other processes (an IPC-enabled pool, whose
    /// importers may write it at any time, or an imported one). A buffer of such memory lends no
    /// host slice through the safe API ([`ScopedBuffer::host_slice`](crate::ScopedBuffer::host_slice)
    /// refuses with [`Error::WritableElsewhere`](crate::Error::WritableElsewhere)). By default as
    /// the upstream resource answers, else whether the pool is
    /// [shareable](MemoryPool::is_shareable), false for a resource with neither.
    fn may_be_written_externally(&self) -> bool {
        match self.upstream() {
            Some(upstream) => upstream.may_be_written_externally(),
            None => self.memory_pool().is_some_and(MemoryPool::is_shareable),
        }
    }

    /// The resource this one allocates from, for an adaptor (a
    /// [`StatisticsAdaptor`](crate::StatisticsAdaptor), say) that wraps another: what lets code
    /// that needs more than this trait see through adaptors. `None` by default: a resource that
    /// adapts none.
    #[doc(alias = "get_upstream_resource")]
    #[doc(alias = "upstream_resource")]
    fn upstream(&self) -> Option<&dyn MemoryResource> {
        None
    }

    /// The driver pool the memory comes from, when it comes from one: what sharing a buffer with
    /// other processes needs, and how a buffer's pool is found
    /// (`buffer.memory_resource()?.memory_pool()`). A pool resource answers with its pool (this
    /// crate's, and `cuda-mem-ipc`'s imported pools); by default a resource answers as its
    /// [`upstream`](MemoryResource::upstream) does, so buffers allocated through any stack of
    /// adaptors over a pool are that pool's. `None` for a resource with neither.
    fn memory_pool(&self) -> Option<&MemoryPool> {
        self.upstream().and_then(MemoryResource::memory_pool)
    }

    /// Told that an empty buffer (a request for 0 bytes) was made from this resource. There is
    /// no memory to allocate, so [`allocate_raw`](MemoryResource::allocate_raw) is not asked;
    /// this is for a resource that counts what it hands out (a
    /// [`StatisticsAdaptor`](crate::StatisticsAdaptor)), once per empty buffer, and
    /// [`note_empty_deallocation`](MemoryResource::note_empty_deallocation) once when that
    /// buffer is dropped (an empty buffer leaked, or handed out with
    /// [`Buffer::into_raw`](crate::Buffer::into_raw), is not dropped). By default passed on to
    /// the [`upstream`](MemoryResource::upstream) resource, if any, as an adaptor passes
    /// allocations on.
    fn note_empty_allocation(&self) {
        if let Some(upstream) = self.upstream() {
            upstream.note_empty_allocation();
        }
    }

    /// Told that an empty buffer [`note_empty_allocation`](MemoryResource::note_empty_allocation)
    /// announced was dropped. By default passed on to the upstream resource, if any.
    fn note_empty_deallocation(&self) {
        if let Some(upstream) = self.upstream() {
            upstream.note_empty_deallocation();
        }
    }
}

/// A memory resource that allocates from a driver pool, with the pool's features on the resource,
/// where cuda.core puts them (`mr.attributes`, `mr.release_threshold`, …).
///
/// Implementing it takes one method, [`pool`](PoolResource::pool); each other one forwards to the
/// [`MemoryPool`] method of the same name. This crate's pool resources, the adaptors over them and
/// `cuda-mem-ipc`'s imported pools implement it. It is in the [`prelude`](crate::prelude).
pub trait PoolResource: MemoryResource {
    /// The pool behind the resource.
    fn pool(&self) -> &MemoryPool;

    /// The pool's usage, high-water marks, release threshold and reuse policies
    /// ([`MemoryPool::attributes`]).
    ///
    /// # Errors
    /// Driver errors.
    fn attributes(&self) -> Result<PoolAttributes> {
        self.pool().attributes()
    }

    /// The pool's usage at a glance: used and reserved bytes with their high-water marks, and the
    /// live allocations ([`MemoryPool::usage`]).
    ///
    /// # Errors
    /// Driver errors.
    fn usage(&self) -> Result<PoolUsage> {
        self.pool().usage()
    }

    /// Bytes the pool keeps cached at a synchronization ([`MemoryPool::release_threshold`]).
    ///
    /// # Errors
    /// Driver errors.
    fn release_threshold(&self) -> Result<u64> {
        self.pool().release_threshold()
    }

    /// Sets the release threshold ([`MemoryPool::set_release_threshold`]).
    ///
    /// # Errors
    /// Driver errors.
    fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.pool().set_release_threshold(bytes)
    }

    /// Turns a reuse policy on or off ([`MemoryPool::set_reuse`]).
    ///
    /// # Errors
    /// Driver errors.
    fn set_reuse(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        self.pool().set_reuse(policy, enabled)
    }

    /// Resets the high-water marks to the current usage ([`MemoryPool::reset_peak_usage`]).
    ///
    /// # Errors
    /// Driver errors.
    fn reset_peak_usage(&self) -> Result<()> {
        self.pool().reset_peak_usage()
    }

    /// Releases cached memory down to `keep` bytes ([`MemoryPool::trim_to`]).
    ///
    /// # Errors
    /// Driver errors.
    #[doc(alias = "trim")]
    fn trim_to(&self, keep: usize) -> Result<()> {
        self.pool().trim_to(keep)
    }

    /// The access `device` has to the pool's memory ([`MemoryPool::access`]).
    ///
    /// # Errors
    /// Driver errors.
    #[doc(alias = "DMR_mempool_get_access")]
    fn access(&self, device: Device) -> Result<Access> {
        self.pool().access(device)
    }

    /// Whether the pool can be shared with other processes by file descriptor
    /// ([`MemoryPool::is_shareable`]).
    fn is_ipc_enabled(&self) -> bool {
        self.pool().is_shareable()
    }

    /// Whether dropping the resource destroys the pool (false for a current pool or an imported
    /// one that another holder owns; [`MemoryPool::is_owned`]).
    #[doc(alias = "is_handle_owned")]
    fn is_owned(&self) -> bool {
        self.pool().is_owned()
    }

    /// The raw pool handle ([`MemoryPool::handle`]).
    fn handle(&self) -> cuda_mem_sys::types::CUmemoryPool {
        self.pool().handle()
    }
}

/// Any memory resource as a `&dyn MemoryResource`, also where its type is a generic `R: ?Sized`
/// (which the language cannot turn into a trait object): implemented for every sized resource,
/// and a supertrait of [`MemoryResource`], so `dyn MemoryResource` has it too. An adaptor over
/// `Arc<R>` names its resource through it in [`MemoryResource::upstream`].
pub trait AsDynMemoryResource {
    /// `self`, as a trait object.
    fn as_dyn_memory_resource(&self) -> &dyn MemoryResource;
}

impl<R: MemoryResource> AsDynMemoryResource for R {
    #[inline]
    fn as_dyn_memory_resource(&self) -> &dyn MemoryResource {
        self
    }
}
