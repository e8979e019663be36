//! The cudarc interop (feature `cudarc`) against cudarc itself: its copies and memsets on our
//! pool buffers, the free of a buffer cudarc used waiting for cudarc's work, a cudarc allocation
//! as a buffer, streams both ways, and (on a GPU) a kernel launched on a pool buffer.
//!
//! cudarc loads the driver by name (`libcuda.so`): on the simulator each test runs in a child
//! process whose `LD_LIBRARY_PATH` finds the simulator under that name
//! (`cuda_sim::testing::with_simulator_as_libcuda`), so cudarc and this crate share one driver
//! and one memory.
#![cfg(feature = "cudarc")]

use std::sync::Arc;

use cuda_mem_core::{
    Buffer, CaptureState, Device, DeviceMemoryResource, FillPattern, PoolResource, Stream, StreamOptions,
};
use cuda_sim::testing::{self, Gate, with_simulator_as_libcuda};
use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};

/// The driver, installed for this crate, and cudarc's context of device 0, checked to be the
/// same driver: an allocation of cudarc's is one the simulator counts.
fn driver_and_context() -> (&'static cuda_mem_sys::Driver, Arc<CudaContext>) {
    let d = testing::driver().expect("the driver loads");
    let context = CudaContext::new(0).expect("cudarc opens device 0");
    if testing::on_simulator() {
        let before = testing::live_objects(d).unwrap().allocations;
        let slice = context.default_stream().alloc_zeros::<u8>(64).unwrap();
        assert_eq!(testing::live_objects(d).unwrap().allocations, before + 1, "cudarc loaded another driver");
        drop(slice);
        context.synchronize().unwrap();
    }
    (d, context)
}

#[test]
fn cudarc_copies_and_memsets_work_on_pool_buffers() {
    with_simulator_as_libcuda("cudarc_copies_and_memsets_work_on_pool_buffers", || {
        let (_, context) = driver_and_context();
        let theirs = context.new_stream().unwrap();
        let ours = Stream::from_cudarc(&theirs).unwrap();
        let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
        let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();

        let mut buffer = pool.allocate(data.len() * 4, &ours).unwrap();
        theirs.memcpy_htod(&data, &mut buffer.cudarc_view_mut::<f32>(&theirs).unwrap()).unwrap();
        assert_eq!(buffer.to_vec::<f32>(&ours).unwrap(), data, "cudarc's copy in, read by us");

        {
            let mut view = buffer.view_mut::<f32>().unwrap();
            let mut head = view.slice_mut(..256).unwrap().on_cudarc(&theirs).unwrap();
            theirs.memset_zeros(&mut head).unwrap();
        }
        let back = theirs.clone_dtoh(&buffer.cudarc_view::<f32>(&theirs).unwrap()).unwrap();
        assert!(back[..256].iter().all(|&x| x == 0.0), "cudarc's memset of a sub-range");
        assert_eq!(back[256..], data[256..], "and nothing past it");

        // Device to device, both ways: our buffer into a cudarc slice and back into another.
        let mut slice = theirs.alloc_zeros::<f32>(data.len()).unwrap();
        theirs.memcpy_dtod(&buffer.cudarc_view::<f32>(&theirs).unwrap(), &mut slice).unwrap();
        let mut other = pool.allocate(data.len() * 4, &ours).unwrap();
        theirs.memcpy_dtod(&slice, &mut other.cudarc_view_mut::<f32>(&theirs).unwrap()).unwrap();
        assert_eq!(other.to_vec::<f32>(&ours).unwrap(), back);
        context.check_err().expect("cudarc recorded no error");
    });
}

#[test]
fn a_copy_on_another_stream_follows_the_views_stream() {
    with_simulator_as_libcuda("a_copy_on_another_stream_follows_the_views_stream", || {
        let (d, context) = driver_and_context();
        let (home, other) = (context.new_stream().unwrap(), context.new_stream().unwrap());
        let ours = Stream::from_cudarc(&home).unwrap();
        let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
        let mut buffer = pool.allocate(4096, &ours).unwrap();
        buffer.fill(FillPattern::U8(7), &ours).unwrap();
        let view = buffer.cudarc_view::<u8>(&home).unwrap();
        // The view's stream is held: a copy on `other` must wait for it, so it cannot have read
        // the buffer when the gate opens later and the fill it follows is done.
        let (gate, _opens_on_failure) = Gate::new();
        // SAFETY: a live stream of the driver's primary context.
        unsafe { gate.hold(d, home.cu_stream().cast()) }.unwrap();
        gate.open_after(std::time::Duration::from_millis(200));
        let out = other.clone_dtoh(&view).unwrap();
        assert!(gate.is_open(), "the copy on another stream returned before the view's stream ran");
        assert!(out.iter().all(|&b| b == 7));
        context.check_err().unwrap();
    });
}

#[test]
fn a_pool_buffer_cudarc_used_is_freed_by_us_after_cudarcs_work() {
    with_simulator_as_libcuda("a_pool_buffer_cudarc_used_is_freed_by_us_after_cudarcs_work", || {
        let (d, context) = driver_and_context();
        let device = Device::new(0).unwrap();
        let ours = Stream::new(device, StreamOptions::default().non_blocking()).unwrap();
        let theirs = context.new_stream().unwrap();
        let pool = DeviceMemoryResource::new(device, Default::default()).unwrap();
        let mut buffer = pool.allocate(1 << 16, &ours).unwrap();

        let (gate, _opens_on_failure) = Gate::new();
        // SAFETY: a live stream of the driver's primary context.
        unsafe { gate.hold(d, theirs.cu_stream().cast()) }.unwrap();
        theirs.memset_zeros(&mut buffer.cudarc_view_mut::<u32>(&theirs).unwrap()).unwrap();
        drop(buffer); // freed on `ours`, which must wait for cudarc's memset
        gate.open_after(std::time::Duration::from_millis(200));
        ours.synchronize().unwrap();
        assert!(gate.is_open(), "the free did not wait for cudarc's work on its stream");
        assert_eq!(pool.attributes().unwrap().used_mem_current, 0, "freed by us once cudarc was done");
        assert!(cuda_mem_core::take_drop_errors().is_empty());
    });
}

#[test]
fn a_cudarc_allocation_is_a_buffer_cudarc_frees_after_our_work() {
    with_simulator_as_libcuda("a_cudarc_allocation_is_a_buffer_cudarc_frees_after_our_work", || {
        let (d, context) = driver_and_context();
        let theirs = context.new_stream().unwrap();
        let data: Vec<u32> = (0..4096).collect();
        let slice = theirs.clone_htod(&data).unwrap();
        // Where the simulator counts them (`None` on a real driver).
        let live_allocations = || testing::live_objects_if_simulated().map(|live| live.allocations);
        let allocations = live_allocations();

        let buffer = Buffer::from_cudarc(slice).unwrap();
        assert_eq!(
            (buffer.size(), buffer.is_device_accessible(), buffer.is_host_accessible()),
            (4096 * 4, true, false)
        );
        assert!(buffer.is_owning() && buffer.deallocation_stream() == Some(&Stream::from_cudarc(&theirs).unwrap()));
        // Its data is ready in the order of cudarc's stream, the buffer's own (read there, as
        // cudarc's copy in was made there; `to_vec` waits for it).
        let home = buffer.deallocation_stream().unwrap().clone();
        assert_eq!(buffer.to_vec::<u32>(&home).unwrap(), data, "cudarc's data, read by us");
        let ours = Stream::new(buffer.device().unwrap(), StreamOptions::default().non_blocking()).unwrap();
        let copy = buffer.copy_to_new(&ours).unwrap(); // allocated through cudarc too
        assert_eq!(copy.to_vec::<u32>(&ours).unwrap(), data);

        // Our work on our stream, held: cudarc's free (on its stream) must wait for it, whether
        // the buffer is freed on its recorded stream (cudarc's) or on ours.
        for (mut buffer, free_on_ours) in [(copy, true), (buffer, false)] {
            let (gate, _opens_on_failure) = Gate::new();
            // SAFETY: a live stream of the driver's primary context.
            unsafe { gate.hold(d, ours.handle()) }.unwrap();
            buffer.fill(FillPattern::U32(1), &ours).unwrap();
            if free_on_ours {
                buffer.close(Some(&ours)).unwrap()
            } else {
                drop(buffer)
            }
            gate.open_after(std::time::Duration::from_millis(200));
            theirs.synchronize().unwrap();
            assert!(gate.is_open(), "cudarc's free did not wait for our work (freed on ours: {free_on_ours})");
        }
        assert_eq!(live_allocations(), allocations.map(|n| n - 1), "both freed by cudarc");
        assert!(cuda_mem_core::take_drop_errors().is_empty());
        context.check_err().unwrap();
    });
}

#[test]
fn streams_cross_both_ways_and_stay_with_their_owner() {
    with_simulator_as_libcuda("streams_cross_both_ways_and_stay_with_their_owner", || {
        let (_, context) = driver_and_context();
        let theirs = context.new_stream().unwrap();
        let weak = Arc::downgrade(&theirs);
        let ours = Stream::from_cudarc(&theirs).unwrap();
        assert!(!ours.is_owned() && ours.handle() == theirs.cu_stream().cast());
        // Ours keeps theirs alive...
        drop(theirs);
        let theirs: Arc<CudaStream> = weak.upgrade().expect("our stream holds cudarc's");
        let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
        let mut buffer = pool.allocate(256, &ours).unwrap();
        buffer.fill(FillPattern::U8(3), &ours).unwrap();
        // ...and dropping ours leaves theirs usable.
        drop(buffer);
        drop(ours);
        let zeros = theirs.alloc_zeros::<u8>(256).unwrap();
        assert_eq!(theirs.clone_dtoh(&zeros).unwrap(), vec![0; 256]);
        drop(zeros);
        drop(theirs);
        assert!(weak.upgrade().is_none(), "the last holder was ours, now gone");

        // Ours as theirs: cudarc works on it, and dropping cudarc's wrapper leaves ours usable.
        let ours = Stream::new(Device::new(0).unwrap(), StreamOptions::default()).unwrap();
        // SAFETY: `ours` outlives `wrapped` and the slice allocated on it.
        let wrapped = unsafe { ours.to_cudarc(&context) }.unwrap();
        assert_eq!(wrapped.cu_stream(), ours.handle().cast());
        let slice = wrapped.clone_htod(&[1u8, 2, 3]).unwrap();
        assert_eq!(wrapped.clone_dtoh(&slice).unwrap(), [1, 2, 3]);
        drop(slice);
        drop(wrapped);
        let mut buffer = pool.allocate(16, &ours).unwrap();
        buffer.fill(FillPattern::U8(9), &ours).unwrap();
        assert_eq!(buffer.to_vec::<u8>(&ours).unwrap(), [9; 16]);
        context.check_err().unwrap();
    });
}

#[test]
fn a_stream_cudarc_captures_is_refused_by_our_pools() {
    with_simulator_as_libcuda("a_stream_cudarc_captures_is_refused_by_our_pools", || {
        let (_, context) = driver_and_context();
        let relaxed = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let assert_refused = |result: cuda_mem_core::Result<Buffer>, what: &str| {
            let error = result.expect_err(what);
            assert!(matches!(error, cuda_mem_core::Error::CapturingStream), "{what}: {error}");
        };
        // Ours, handed to cudarc, captured through cudarc's safe API.
        let ours = Stream::new(Device::new(0).unwrap(), StreamOptions::default()).unwrap();
        let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
        drop(pool.allocate(16, &ours).unwrap());
        // SAFETY: `ours` outlives `wrapped`.
        let wrapped = unsafe { ours.to_cudarc(&context) }.unwrap();
        assert_eq!(ours.capture_state(), CaptureState::Unknown, "cudarc may capture it");
        wrapped.begin_capture(relaxed).unwrap();
        assert_refused(pool.allocate(16, &ours), "ours, captured by cudarc");
        assert!(wrapped.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)).is_ok());
        drop(pool.allocate(16, &ours).unwrap());
        // Cudarc's, captured by cudarc.
        let theirs = context.new_stream().unwrap();
        let borrowed = Stream::from_cudarc(&theirs).unwrap();
        theirs.begin_capture(relaxed).unwrap();
        assert_refused(pool.allocate(16, &borrowed), "cudarc's, captured by cudarc");
        assert!(theirs.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0)).is_ok());
        drop(pool.allocate(16, &borrowed).unwrap());
        context.check_err().unwrap();
    });
}

#[test]
fn cudarc_creates_a_context_of_its_own_and_destroys_it() {
    with_simulator_as_libcuda("cudarc_creates_a_context_of_its_own_and_destroys_it", || {
        use cudarc::driver::sys::{CUfunc_cache, CUlimit};
        let (_, primary) = driver_and_context();
        let live_allocations = || testing::live_objects_if_simulated().map(|live| live.allocations);
        let allocations = live_allocations();
        // cuCtxCreate_v4, current once made.
        let created = CudaContext::new_non_primary(0, 0).expect("cudarc creates a context");
        assert!(!created.is_primary() && created.cu_ctx() != primary.cu_ctx());
        let stream = created.new_stream().unwrap();
        let data: Vec<u32> = (0..1024).collect();
        let slice = stream.clone_htod(&data).unwrap();
        assert_eq!(stream.clone_dtoh(&slice).unwrap(), data);
        // Its limits and cache preference are its own.
        let stack = CUlimit::CU_LIMIT_STACK_SIZE;
        let before = primary.get_limit(stack).unwrap();
        created.set_limit(stack, before * 4).unwrap();
        assert_eq!(created.get_limit(stack).unwrap(), before * 4);
        assert_eq!(primary.get_limit(stack).unwrap(), before, "the primary context's is unchanged");
        created.set_cache_config(CUfunc_cache::CU_FUNC_CACHE_PREFER_SHARED).unwrap();
        assert_eq!(created.get_cache_config().unwrap(), CUfunc_cache::CU_FUNC_CACHE_PREFER_SHARED);
        drop(slice);
        drop(stream);
        created.check_err().expect("cudarc recorded no error");
        drop(created); // cuCtxDestroy_v2
        assert_eq!(live_allocations(), allocations, "nothing of it is left");
        primary.check_err().unwrap();
    });
}

#[test]
fn cudarc_pinned_host_memory_is_page_locked_memory_of_the_driver() {
    with_simulator_as_libcuda("cudarc_pinned_host_memory_is_page_locked_memory_of_the_driver", || {
        use cuda_mem_sys::types::{CUmemorytype, CUpointer_attribute};
        let (d, context) = driver_and_context();
        let stream = context.new_stream().unwrap();
        let data: Vec<u32> = (0..4096).map(|i| i * 3).collect();
        let portable_mapped =
            cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE | cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: u32 is valid for any bit pattern, and every element is written before it is read.
        let slices = unsafe {
            [
                context.alloc_pinned::<u32>(data.len()).unwrap(),
                context.alloc_pinned_with_flags::<u32>(data.len(), portable_mapped).unwrap(),
            ]
        };
        for mut pinned in slices {
            pinned.as_mut_slice().unwrap().copy_from_slice(&data);
            let address = pinned.as_ptr().unwrap() as u64;
            let mut memory_type = 0u32;
            let attribute = CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
            // SAFETY: `memory_type` is the attribute's type; the address is live pinned memory.
            unsafe {
                cuda_mem_sys::cu_call!(d, cuPointerGetAttribute((&raw mut memory_type).cast(), attribute, address))
            }
            .unwrap();
            assert_eq!(memory_type, CUmemorytype::CU_MEMORYTYPE_HOST.0, "the driver's page-locked memory");
            let device = stream.clone_htod(&pinned).unwrap();
            let mut back = stream.clone_htod(&vec![0u32; data.len()]).unwrap();
            stream.memcpy_dtod(&device, &mut back).unwrap();
            stream.memcpy_dtoh(&back, &mut pinned).unwrap();
            assert_eq!(pinned.as_slice().unwrap(), data, "through the device and back");
        }
        context.check_err().expect("cudarc recorded no error (cuMemFreeHost included)");
    });
}

#[test]
fn cudarc_copies_between_two_devices() {
    let name = "cudarc_copies_between_two_devices";
    testing::with_simulator_as_libcuda_on(name, &[("CUDA_SIM_DEVICES", "2")], || {
        if CudaContext::device_count().expect("the device count") < 2 {
            testing::skip("a copy between devices needs two");
            return;
        }
        let (first, second) = (CudaContext::new(0).unwrap(), CudaContext::new(1).unwrap());
        let (on_first, on_second) = (first.new_stream().unwrap(), second.new_stream().unwrap());
        let data: Vec<u32> = (0..8192).map(|i| i ^ 0x5a5a).collect();
        // Stream-ordered memory of each device's pool (cudarc allocates with cuMemAllocAsync),
        // no access granted: cudarc's copy between contexts is cuMemcpyPeerAsync.
        let source = on_first.clone_htod(&data).unwrap();
        let mut copy = on_second.alloc_zeros::<u32>(data.len()).unwrap();
        on_second.memcpy_dtod(&source, &mut copy).unwrap();
        assert_eq!(on_second.clone_dtoh(&copy).unwrap(), data, "device 0 to device 1");
        let mut again = on_first.alloc_zeros::<u32>(data.len()).unwrap();
        on_first.memcpy_dtod(&copy, &mut again).unwrap();
        assert_eq!(on_first.clone_dtoh(&again).unwrap(), data, "and back");
        first.check_err().unwrap();
        second.check_err().unwrap();
    });
}

#[test]
fn cudarc_attaches_its_unified_memory_to_a_stream() {
    with_simulator_as_libcuda("cudarc_attaches_its_unified_memory_to_a_stream", || {
        use cudarc::driver::sys::CUmemAttach_flags;
        let (_, context) = driver_and_context();
        let stream = context.new_stream().unwrap();
        // SAFETY: u32 is valid for any bit pattern.
        let mut unified = unsafe { context.alloc_unified::<u32>(1024, true) }.unwrap();
        for flags in [CUmemAttach_flags::CU_MEM_ATTACH_SINGLE, CUmemAttach_flags::CU_MEM_ATTACH_HOST] {
            unified.attach(&stream, flags).expect("cuStreamAttachMemAsync of the whole allocation");
        }
        unified.as_mut_slice().unwrap().fill(7);
        assert!(unified.as_slice().unwrap().iter().all(|&x| x == 7));
        drop(unified);
        context.check_err().unwrap();
    });
}

/// A kernel that adds 1 to each of `n` floats, written in PTX by hand (no compiler needed).
const ADD_ONE_PTX: &str = r#"
.version 7.0
.target sm_75
.address_size 64

.visible .entry add_one(.param .u64 data, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [data];
    ld.param.u32 %r2, [n];
    mov.u32 %r3, %ctaid.x;
    mov.u32 %r4, %ntid.x;
    mov.u32 %r5, %tid.x;
    mad.lo.s32 %r1, %r3, %r4, %r5;
    setp.ge.u32 %p1, %r1, %r2;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r1, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}
"#;

#[test]
fn a_kernel_launched_by_cudarc_writes_a_pool_buffer() {
    // The simulator runs no kernels: it has no `cuModuleLoadData` (also where it stands in for a
    // real driver, in a rehearsal of a GPU run).
    if testing::driver().expect("the driver loads").library_symbol(c"cuModuleLoadData").is_err() {
        testing::skip("kernel launches need a GPU: the simulator runs no kernels (no cuModuleLoadData)");
        return;
    }
    let (_, context) = driver_and_context();
    let theirs = context.new_stream().unwrap();
    let ours = Stream::from_cudarc(&theirs).unwrap();
    let module = context.load_module(cudarc::nvrtc::Ptx::from_src(ADD_ONE_PTX)).unwrap();
    let add_one = module.load_function("add_one").unwrap();
    let pool = DeviceMemoryResource::new(ours.device(), Default::default()).unwrap();
    let data: Vec<f32> = (0..5000).map(|i| i as f32).collect();
    let mut buffer = pool.allocate(data.len() * 4, &ours).unwrap();
    buffer.copy_from_slice(&data, &ours).unwrap();
    {
        let mut view = buffer.cudarc_view_mut::<f32>(&theirs).unwrap();
        let n = data.len() as u32;
        let mut launch = theirs.launch_builder(&add_one);
        launch.arg(&mut view).arg(&n);
        // SAFETY: the kernel takes a pointer to `n` floats and `n`, and is launched on the
        // view's stream.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
    }
    let out = buffer.to_vec::<f32>(&ours).unwrap();
    assert!(out.iter().zip(&data).all(|(o, d)| *o == d + 1.0), "the kernel's writes");
    drop(buffer); // freed by us, after the kernel
    ours.synchronize().unwrap();
    context.check_err().unwrap();
}
