//! Cases (6) and (7): each memory-resource adaptor's cost per allocate+free pair against the bare
//! pool resource on the same stream, and slice copies host ↔ device against the raw driver pair.

use std::sync::Arc;

use cuda_mem_core::sys::cu_call;
use cuda_mem_core::{
    Device, DeviceMemoryResource, DeviceMemoryResourceOptions, LimitingAdaptor, MemoryResource, MemoryResourceExt,
    StatisticsAdaptor, Stream, StreamOptions, TrackingAdaptor,
};
use serde_json::{Value, json};

use crate::Error;
use crate::pools::per_pair;
use crate::stats::{Stats, elapsed_ns, rounded};
use crate::units::{KIB, MIB, bytes};

/// The size of case (6)'s pairs.
pub(crate) const ADAPTOR_PAIR_SIZE: usize = 64 * KIB;
/// The sizes of case (7)'s copies.
pub(crate) const COPY_SIZES: [usize; 4] = [4 * KIB, 256 * KIB, 4 * MIB, 16 * MIB];

/// One adaptor (or stack of them) against the bare pool resource, measured alternately.
pub(crate) struct AdaptorRow {
    /// What allocates: the adaptor, or the stack.
    pub(crate) name: &'static str,
    /// Through the adaptor, ns per pair.
    pub(crate) adapted: Stats,
    /// Through the bare pool resource, in the same run, ns per pair.
    pub(crate) bare: Stats,
}

impl AdaptorRow {
    /// Adapted against bare.
    pub(crate) fn ratio(&self) -> f64 {
        self.adapted.median / self.bare.median
    }

    /// As a JSON object (a row of `results.json`'s `adaptors`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "adaptor": self.name,
            "size": ADAPTOR_PAIR_SIZE,
            "adapted_per_pair": self.adapted.json(),
            "bare_per_pair": self.bare.json(),
            "ratio": rounded(self.ratio(), 3),
        })
    }
}

/// One size of case (7): a copy in and out through the safe API and through the raw calls.
pub(crate) struct CopyRow {
    /// Bytes each way.
    pub(crate) size: usize,
    /// `copy_from_slice` + `copy_to_slice`, ns per round trip.
    pub(crate) safe: Stats,
    /// `copy_from_slice` + `to_vec` (which allocates the `Vec`), ns per round trip.
    pub(crate) to_vec: Stats,
    /// `cuMemcpyHtoDAsync` + `cuMemcpyDtoHAsync` + `cuStreamSynchronize`, ns per round trip.
    pub(crate) raw: Stats,
}

impl CopyRow {
    /// Safe against raw.
    pub(crate) fn ratio(&self) -> f64 {
        self.safe.median / self.raw.median
    }

    /// `to_vec` against raw.
    pub(crate) fn ratio_to_vec(&self) -> f64 {
        self.to_vec.median / self.raw.median
    }

    /// As a JSON object (a row of `results.json`'s `copies`).
    pub(crate) fn json(&self) -> Value {
        json!({
            "size": self.size,
            "safe_per_round_trip": self.safe.json(),
            "to_vec_per_round_trip": self.to_vec.json(),
            "raw_per_round_trip": self.raw.json(),
            "ratio": rounded(self.ratio(), 3),
            "ratio_to_vec": rounded(self.ratio_to_vec(), 3),
        })
    }
}

/// A timed repetition: ns per operation.
type Rep<'a> = Box<dyn Fn() -> Result<f64, Error> + 'a>;

/// `reps` timed repetitions of each of `kinds` in turn (which goes first rotating, so that none
/// always follows another), after ten untimed ones; a sample per kind.
fn alternate(kinds: &[Rep<'_>], reps: usize, stream: &Stream) -> Result<Vec<Vec<f64>>, Error> {
    for _ in 0..10 {
        for kind in kinds {
            kind()?;
        }
    }
    let mut samples = vec![Vec::with_capacity(reps); kinds.len()];
    for rep in 0..reps {
        for k in 0..kinds.len() {
            let kind = (rep + k) % kinds.len();
            samples[kind].push(kinds[kind]()?);
        }
        stream.synchronize()?;
    }
    Ok(samples)
}

/// Case (6): a row per adaptor, printed as it comes.
pub(crate) fn adaptors(device: Device) -> Result<Vec<AdaptorRow>, Error> {
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    pool.pool().set_release_threshold(u64::MAX)?;
    let counted = StatisticsAdaptor::new(Arc::clone(&pool));
    let adapted: [(&'static str, Arc<dyn MemoryResource>); 5] = [
        ("StatisticsAdaptor", counted.clone()),
        ("LimitingAdaptor", LimitingAdaptor::new(Arc::clone(&pool), usize::MAX)),
        ("TrackingAdaptor", TrackingAdaptor::new(Arc::clone(&pool))),
        ("TrackingAdaptor with backtraces", TrackingAdaptor::with_backtraces(Arc::clone(&pool))),
        ("LimitingAdaptor over StatisticsAdaptor", LimitingAdaptor::new(counted, usize::MAX)),
    ];
    let pair = |resource: Arc<dyn MemoryResource>| -> Rep<'_> {
        let stream = &stream;
        Box::new(move || {
            per_pair(|| {
                drop(resource.allocate(ADAPTOR_PAIR_SIZE, stream)?);
                Ok(())
            })
        })
    };
    let mut rows = Vec::new();
    for (name, resource) in adapted {
        // Backtraces cost microseconds each: fewer repetitions keep the case short.
        let reps = if name.contains("backtraces") { 100 } else { 1500 };
        let samples = alternate(&[pair(resource), pair(pool.clone())], reps, &stream)?;
        let [adapted, bare] = <[Vec<f64>; 2]>::try_from(samples).map_err(|_| "two samples")?;
        let row = AdaptorRow { name, adapted: Stats::of(adapted), bare: Stats::of(bare) };
        println!(
            "  {name}: {} per {} pair, bare pool {}, ratio {:.2}",
            row.adapted.show(),
            bytes(ADAPTOR_PAIR_SIZE),
            row.bare.show(),
            row.ratio()
        );
        rows.push(row);
    }
    Ok(rows)
}

/// Case (7): a row per size, printed as it comes. The same pageable `Vec`s and device buffer
/// serve both ways of copying.
pub(crate) fn copies(device: Device) -> Result<Vec<CopyRow>, Error> {
    let d = cuda_mem_core::driver()?;
    let stream = Stream::new(device, StreamOptions::default().non_blocking())?;
    let pool = DeviceMemoryResource::new(device, DeviceMemoryResourceOptions::default())?;
    let mut rows = Vec::new();
    for size in COPY_SIZES {
        let source: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let out = std::cell::RefCell::new(vec![0u8; size]);
        let buffer = std::cell::RefCell::new(pool.allocate(size, &stream)?);
        let safe: Rep<'_> = Box::new(|| {
            let start = std::time::Instant::now();
            let mut buffer = buffer.borrow_mut();
            buffer.copy_from_slice(&source, &stream)?;
            buffer.copy_to_slice(&mut out.borrow_mut(), &stream)?;
            Ok(elapsed_ns(start))
        });
        let to_vec: Rep<'_> = Box::new(|| {
            let start = std::time::Instant::now();
            let mut buffer = buffer.borrow_mut();
            buffer.copy_from_slice(&source, &stream)?;
            drop(std::hint::black_box(buffer.to_vec::<u8>(&stream)?));
            Ok(elapsed_ns(start))
        });
        let raw: Rep<'_> = Box::new(|| {
            let start = std::time::Instant::now();
            let ptr = buffer.borrow().ptr();
            let mut out = out.borrow_mut();
            // SAFETY: `ptr` is `size` bytes of device memory, `source` and `out` `size` bytes of
            // host memory each, which the synchronization below keeps in use until the copies end.
            unsafe {
                cu_call!(d, cuMemcpyHtoDAsync_v2(ptr, source.as_ptr().cast(), size, stream.handle()))?;
                cu_call!(d, cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, size, stream.handle()))?;
            }
            // SAFETY: the stream's live handle.
            unsafe { cu_call!(d, cuStreamSynchronize(stream.handle())) }?;
            Ok(elapsed_ns(start))
        });
        let reps = if size >= MIB { 100 } else { 1000 };
        let samples = alternate(&[safe, to_vec, raw], reps, &stream)?;
        let [safe, to_vec, raw] = <[Vec<f64>; 3]>::try_from(samples).map_err(|_| "three samples")?;
        if *out.borrow() != source {
            return Err(format!("the {} round trip did not bring the bytes back", bytes(size)).into());
        }
        let row = CopyRow { size, safe: Stats::of(safe), to_vec: Stats::of(to_vec), raw: Stats::of(raw) };
        println!(
            "  {} each way: copy_from_slice+copy_to_slice {}, +to_vec {}, raw {}, ratio {:.2} (to_vec {:.2})",
            bytes(size),
            row.safe.show(),
            row.to_vec.show(),
            row.raw.show(),
            row.ratio(),
            row.ratio_to_vec()
        );
        rows.push(row);
    }
    Ok(rows)
}
