//! Allocation traces for case (8): two seeded workloads, written as lists of events (allocate
//! `id` of `size` bytes on stream `s`, free `id`) grouped in steps, for [`crate::replay`] to play
//! against any memory resource. The same parameters and seed always give the same trace.
//!
//! # Serving ([`ServingParams`], [`serving`]): an LLM inference server
//!
//! Requests arrive and finish; every step runs one forward pass over the batch of requests in
//! flight, on stream 0.
//! - **Arrivals.** At each step before the last `drain_steps`, each of `max_arrivals` possible
//!   requests arrives with a chance of `arrival_percent` in 100, and waits in a queue; waiting requests join the batch while it has fewer
//!   than `max_batch`. A request has a prompt of `prompt_tokens.0..=prompt_tokens.1` tokens and
//!   generates `output_tokens.0..=output_tokens.1` tokens (uniform), one per step after the
//!   step that reads its prompt (prefill); it then finishes.
//! - **KV cache.** Each request holds one KV-cache buffer of `kv_bytes_per_token` bytes per
//!   token of capacity. The capacity is a multiple of `kv_chunk_tokens`: when a step needs more,
//!   the request allocates a buffer of the next multiple, then frees the old one (a contiguous
//!   cache grown by copying, as a framework's dynamic cache is). A finished request frees its
//!   buffer. Sizes are at most `kv_bytes_per_token` × (the longest prompt + output rounded up
//!   to the chunk).
//! - **Activations.** The step's tokens `t` are the sum of the prompts of the requests in
//!   prefill and one per decoding request; its context `c` is the sum of the batch's sequence
//!   lengths (every token in the requests' caches, this step's included). For each of `layers`
//!   layers, in order: QKV (3·t·h bytes, `h` = `hidden_bytes` per token), the attention
//!   workspace (c·`attention_bytes_per_token`: the keys and values gathered), attention out
//!   (t·h, then the workspace and QKV are freed), MLP up (4·t·h, then attention out is freed),
//!   MLP down (t·h, then MLP up is freed); the layer's input hidden state (t·h, allocated at the
//!   step's start) is freed when the next one exists. Then the logits (`vocab_bytes` per
//!   request in the batch), and everything left is freed at the step's end. The workspace
//!   changes every step (every request's sequence grows), the others with the batch; the
//!   largest activation is 4·h·(`max_batch` × the longest prompt) or the workspace of a full
//!   batch of the longest requests.
//!
//! # Training ([`TrainingParams`], [`training`]): a training loop
//!
//! The same sizes every step. A model of `layers` layers whose widths are drawn once from the
//! seed (each layer's `h` a whole number of KiB in `hidden_bytes.0..=hidden_bytes.1`).
//! - **Persistent buffers**, allocated in step 0 and freed in the last step: per layer its
//!   weights (12·e² elements of `dtype_bytes` bytes, e = h/`dtype_bytes` elements per hidden
//!   state: the QKV, output and two MLP matrices) and two optimizer states of the same size.
//! - **Forward** (stream 0): per layer, in order, the saved activations QKV (3·`tokens`·h),
//!   attention out (`tokens`·h), MLP up (4·`tokens`·h) and the layer's output (`tokens`·h), kept
//!   for the backward pass.
//! - **Backward** (stream 0), layers in reverse: a gradient temporary of 4·`tokens`·h, the
//!   layer's weight gradient (the weights' size, kept until the optimizer step), then the
//!   temporary and the layer's saved activations are freed, in reverse order of allocation.
//! - **Gradient all-reduce** (stream 1): one bucket the size of all weight gradients together,
//!   allocated after the backward pass and freed with the gradients after the optimizer step.

use std::collections::VecDeque;

use crate::units::KIB;
#[cfg(test)]
use crate::units::MIB;

/// One allocator call of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// Allocate `size` bytes (more than 0) on stream `stream`, named `id` (ids count from 0,
    /// each allocated once).
    Alloc { id: usize, size: usize, stream: usize },
    /// Free allocation `id`, on the stream it was allocated on.
    Free { id: usize },
}

/// A trace: its steps, each a list of events in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trace {
    /// The workload's name (`serving`, `training`).
    pub(crate) name: &'static str,
    /// The streams the events name (`0..streams`).
    pub(crate) streams: usize,
    /// The steps, in order; after the last every allocation has been freed.
    pub(crate) steps: Vec<Vec<Event>>,
}

impl Trace {
    /// Allocations in the trace (its ids are `0..allocations()`).
    pub(crate) fn allocations(&self) -> usize {
        self.steps.iter().flatten().filter(|e| matches!(e, Event::Alloc { .. })).count()
    }

    /// Bytes live after each event, step by step: what the trace has allocated and not freed.
    /// For each step, the most live at any point in it and the live at its end.
    pub(crate) fn live_bytes(&self) -> Vec<(usize, usize)> {
        let mut sizes = vec![0; self.allocations()];
        let mut live = 0usize;
        self.steps
            .iter()
            .map(|step| {
                let mut most = live;
                for event in step {
                    match *event {
                        Event::Alloc { id, size, .. } => {
                            sizes[id] = size;
                            live += size;
                            most = most.max(live);
                        }
                        Event::Free { id } => live -= sizes[id],
                    }
                }
                (most, live)
            })
            .collect()
    }
}

/// A small, fast, seeded generator (SplitMix64): the traces need reproducibility, not quality.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    fn range(&mut self, (low, high): (usize, usize)) -> usize {
        low + (self.next() % (high - low + 1) as u64) as usize
    }
}

/// Hands out ids and writes events into the current step.
#[derive(Default)]
struct Writer {
    next_id: usize,
    step: Vec<Event>,
    steps: Vec<Vec<Event>>,
}

impl Writer {
    fn alloc(&mut self, size: usize, stream: usize) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        self.step.push(Event::Alloc { id, size, stream });
        id
    }

    fn free(&mut self, id: usize) {
        self.step.push(Event::Free { id });
    }

    fn end_step(&mut self) {
        self.steps.push(std::mem::take(&mut self.step));
    }
}

/// The serving workload's parameters (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServingParams {
    /// Steps in the trace.
    pub(crate) steps: usize,
    /// The last steps, in which no request arrives (those in flight finish; any left are
    /// finished at the last step).
    pub(crate) drain_steps: usize,
    /// Most requests arriving in one step.
    pub(crate) max_arrivals: usize,
    /// The chance in 100 that each of them arrives.
    pub(crate) arrival_percent: u64,
    /// Most requests in the batch.
    pub(crate) max_batch: usize,
    /// Prompt lengths, tokens (inclusive range).
    pub(crate) prompt_tokens: (usize, usize),
    /// Generated lengths, tokens (inclusive range).
    pub(crate) output_tokens: (usize, usize),
    /// Layers of the model.
    pub(crate) layers: usize,
    /// Bytes of a token's hidden state.
    pub(crate) hidden_bytes: usize,
    /// KV-cache bytes per token (all layers).
    pub(crate) kv_bytes_per_token: usize,
    /// Attention workspace bytes per token of context (one layer).
    pub(crate) attention_bytes_per_token: usize,
    /// KV-cache capacity grows in multiples of this many tokens.
    pub(crate) kv_chunk_tokens: usize,
    /// Logits bytes per request (vocabulary × element size).
    pub(crate) vocab_bytes: usize,
}

impl ServingParams {
    /// The benchmark's workload: a small model (4 layers, 2 KiB hidden states, 16 KiB of KV
    /// cache and 1 KiB of attention workspace per token, 64,000-byte logits), up to 16 requests
    /// of 16–512 prompt and 16–128 generated tokens, about one arriving every six steps for 200
    /// steps, then 100 steps in which the batch drains; a peak of about a hundred MiB.
    pub(crate) const BENCH: ServingParams = ServingParams {
        steps: 300,
        drain_steps: 100,
        max_arrivals: 2,
        arrival_percent: 8,
        max_batch: 16,
        prompt_tokens: (16, 512),
        output_tokens: (16, 128),
        layers: 4,
        hidden_bytes: 2 * KIB,
        kv_bytes_per_token: 16 * KIB,
        attention_bytes_per_token: KIB,
        kv_chunk_tokens: 64,
        vocab_bytes: 64_000,
    };

    /// The largest KV-cache buffer: the longest request, rounded up to the chunk.
    #[cfg(test)]
    pub(crate) fn max_kv_bytes(&self) -> usize {
        (self.prompt_tokens.1 + self.output_tokens.1).div_ceil(self.kv_chunk_tokens)
            * self.kv_chunk_tokens
            * self.kv_bytes_per_token
    }

    /// The largest activation: MLP up of a step in which the whole batch reads its prompts, or
    /// the attention workspace of a full batch of the longest requests.
    #[cfg(test)]
    pub(crate) fn max_activation_bytes(&self) -> usize {
        let longest = self.prompt_tokens.1 + self.output_tokens.1;
        (4 * self.hidden_bytes * self.max_batch * self.prompt_tokens.1)
            .max(self.attention_bytes_per_token * self.max_batch * longest)
    }
}

/// A request of the serving workload in flight.
struct Request {
    prompt: usize,
    output: usize,
    /// Tokens in the cache (0 before the prefill).
    tokens: usize,
    /// The KV-cache buffer and its capacity in tokens.
    kv: Option<(usize, usize)>,
}

/// The serving trace of `params` and `seed`.
pub(crate) fn serving(params: &ServingParams, seed: u64) -> Trace {
    let p = params;
    let mut rng = Rng(seed);
    let mut w = Writer::default();
    let (mut queue, mut batch) = (VecDeque::new(), Vec::<Request>::new());
    for step in 0..p.steps {
        if step + p.drain_steps < p.steps {
            for _ in 0..p.max_arrivals {
                if rng.next() % 100 >= p.arrival_percent {
                    continue;
                }
                let (prompt, output) = (rng.range(p.prompt_tokens), rng.range(p.output_tokens));
                queue.push_back(Request { prompt, output, tokens: 0, kv: None });
            }
        }
        while batch.len() < p.max_batch {
            let Some(request) = queue.pop_front() else { break };
            batch.push(request);
        }
        if batch.is_empty() {
            w.end_step();
            continue;
        }
        let mut tokens = 0;
        for r in &mut batch {
            let new = if r.tokens == 0 { r.prompt } else { 1 };
            tokens += new;
            r.tokens += new;
            grow_kv(&mut w, p, r);
        }
        let context = batch.iter().map(|r| r.tokens).sum();
        activations(&mut w, p, (tokens, context), batch.len());
        let last = step + 1 == p.steps;
        batch.retain(|r| {
            let done = last || r.tokens >= r.prompt + r.output;
            if done && let Some((id, _)) = r.kv {
                w.free(id);
            }
            !done
        });
        w.end_step();
    }
    Trace { name: "serving", streams: 1, steps: w.steps }
}

/// A request's KV cache grown to hold its tokens: a larger buffer, then the old one freed.
fn grow_kv(w: &mut Writer, p: &ServingParams, r: &mut Request) {
    let capacity = r.kv.map_or(0, |(_, c)| c);
    if r.tokens <= capacity {
        return;
    }
    let grown = r.tokens.div_ceil(p.kv_chunk_tokens) * p.kv_chunk_tokens;
    let id = w.alloc(grown * p.kv_bytes_per_token, 0);
    if let Some((old, _)) = r.kv.replace((id, grown)) {
        w.free(old);
    }
}

/// One forward pass over `tokens` new tokens in a `context` of tokens, of `requests` requests:
/// per layer its temporaries, then the logits; all freed by the step's end.
fn activations(w: &mut Writer, p: &ServingParams, (tokens, context): (usize, usize), requests: usize) {
    let h = tokens * p.hidden_bytes;
    let mut hidden = w.alloc(h, 0);
    for _ in 0..p.layers {
        let qkv = w.alloc(3 * h, 0);
        let workspace = w.alloc(context * p.attention_bytes_per_token, 0);
        let attention = w.alloc(h, 0);
        w.free(workspace);
        w.free(qkv);
        let up = w.alloc(4 * h, 0);
        w.free(attention);
        let down = w.alloc(h, 0);
        w.free(up);
        w.free(hidden);
        hidden = down;
    }
    let logits = w.alloc(requests * p.vocab_bytes, 0);
    w.free(hidden);
    w.free(logits);
}

/// The training workload's parameters (see the module's documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TrainingParams {
    /// Steps in the trace.
    pub(crate) steps: usize,
    /// Layers of the model.
    pub(crate) layers: usize,
    /// Tokens per step (batch × sequence).
    pub(crate) tokens: usize,
    /// Bytes of a token's hidden state, per layer drawn from this range (inclusive; whole KiB).
    pub(crate) hidden_bytes: (usize, usize),
    /// Bytes per weight element.
    pub(crate) dtype_bytes: usize,
}

impl TrainingParams {
    /// The benchmark's workload: 8 layers of 512 B–1 KiB hidden states (256–512 two-byte
    /// elements), 512 tokens a step, 40 steps; a peak of a few hundred MiB.
    pub(crate) const BENCH: TrainingParams =
        TrainingParams { steps: 40, layers: 8, tokens: 512, hidden_bytes: (KIB / 2, KIB), dtype_bytes: 2 };

    /// A layer's weights, in bytes, for hidden states of `h` bytes.
    pub(crate) fn weight_bytes(&self, h: usize) -> usize {
        let elements = h / self.dtype_bytes;
        12 * elements * elements * self.dtype_bytes
    }
}

/// The training trace of `params` and `seed` (the seed draws the layers' widths).
pub(crate) fn training(params: &TrainingParams, seed: u64) -> Trace {
    let p = params;
    let mut rng = Rng(seed);
    // Whole KiB, or whole 256-byte units where the range is under a KiB wide.
    let unit = if p.hidden_bytes.1 - p.hidden_bytes.0 >= KIB { KIB } else { 256 };
    let widths: Vec<usize> =
        (0..p.layers).map(|_| rng.range((p.hidden_bytes.0.div_ceil(unit), p.hidden_bytes.1 / unit)) * unit).collect();
    let mut w = Writer::default();
    let persistent: Vec<usize> = widths
        .iter()
        .flat_map(|&h| [p.weight_bytes(h); 3])
        .collect::<Vec<_>>()
        .into_iter()
        .map(|size| w.alloc(size, 0))
        .collect();
    for step in 0..p.steps {
        let mut saved = Vec::new();
        for &h in &widths {
            let t = p.tokens * h;
            saved.push([3 * t, t, 4 * t, t].map(|size| w.alloc(size, 0)));
        }
        let mut gradients = Vec::new();
        for (&h, layer) in widths.iter().zip(saved).rev() {
            let temporary = w.alloc(4 * p.tokens * h, 0);
            gradients.push(w.alloc(p.weight_bytes(h), 0));
            w.free(temporary);
            for id in layer.into_iter().rev() {
                w.free(id);
            }
        }
        let bucket = w.alloc(widths.iter().map(|&h| p.weight_bytes(h)).sum(), 1);
        w.free(bucket);
        for id in gradients {
            w.free(id);
        }
        if step + 1 == p.steps {
            for &id in persistent.iter().rev() {
                w.free(id);
            }
        }
        w.end_step();
    }
    Trace { name: "training", streams: 2, steps: w.steps }
}

/// Both workloads at their benchmark parameters, from `seed`.
pub(crate) fn bench_traces(seed: u64) -> [Trace; 2] {
    [serving(&ServingParams::BENCH, seed), training(&TrainingParams::BENCH, seed)]
}

/// The seed of the benchmark's traces.
pub(crate) const BENCH_SEED: u64 = 0x5EED_2026;

/// The largest peak either benchmark trace may reach: what the tests hold them to, so that the
/// simulator (host memory) runs them comfortably.
#[cfg(test)]
pub(crate) const BENCH_PEAK_LIMIT: usize = 512 * MIB;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every id allocated once, with a size over 0, on a stream of the trace; freed once, after
    /// its allocation; nothing left at the end.
    fn check_balanced(trace: &Trace) {
        let n = trace.allocations();
        let (mut allocated, mut freed) = (vec![false; n], vec![false; n]);
        for event in trace.steps.iter().flatten() {
            match *event {
                Event::Alloc { id, size, stream } => {
                    assert!(!allocated[id] && size > 0 && stream < trace.streams, "{}: {event:?}", trace.name);
                    allocated[id] = true;
                }
                Event::Free { id } => {
                    assert!(allocated[id] && !freed[id], "{}: {event:?}", trace.name);
                    freed[id] = true;
                }
            }
        }
        assert!(allocated.iter().chain(&freed).all(|&b| b), "{}: not all allocated and freed", trace.name);
        assert_eq!(trace.live_bytes().last().map(|l| l.1), Some(0), "{}", trace.name);
    }

    fn sizes(trace: &Trace) -> Vec<usize> {
        trace
            .steps
            .iter()
            .flatten()
            .filter_map(|e| match *e {
                Event::Alloc { size, .. } => Some(size),
                Event::Free { .. } => None,
            })
            .collect()
    }

    #[test]
    fn a_seed_gives_the_same_trace_and_another_seed_another() {
        for seed in [0, 1, BENCH_SEED] {
            assert_eq!(bench_traces(seed), bench_traces(seed));
        }
        assert_ne!(serving(&ServingParams::BENCH, 1), serving(&ServingParams::BENCH, 2));
        assert_ne!(training(&TrainingParams::BENCH, 1), training(&TrainingParams::BENCH, 2));
    }

    #[test]
    fn every_allocation_is_freed_once() {
        for seed in 0..20 {
            for trace in bench_traces(seed) {
                check_balanced(&trace);
            }
        }
        // A batch still full at the end: the last step finishes what is in flight.
        let busy = ServingParams { drain_steps: 0, steps: 30, ..ServingParams::BENCH };
        check_balanced(&serving(&busy, 7));
    }

    #[test]
    fn serving_sizes_stay_within_the_documented_bounds_and_change_from_step_to_step() {
        let p = ServingParams::BENCH;
        for seed in 0..20 {
            let trace = serving(&p, seed);
            let most = p.max_kv_bytes().max(p.max_activation_bytes()).max(p.max_batch * p.vocab_bytes);
            assert!(sizes(&trace).iter().all(|&s| s <= most), "seed {seed}");
            // Each step's sizes (those of a step with a batch) differ from the step before's.
            let shapes: Vec<Vec<usize>> = trace
                .steps
                .iter()
                .filter(|step| !step.is_empty())
                .map(|step| sizes(&Trace { steps: vec![step.clone()], ..trace.clone() }))
                .collect();
            let changes = shapes.windows(2).filter(|w| w[0] != w[1]).count();
            assert!(changes + 1 == shapes.len(), "seed {seed}: {changes} changes in {} steps", shapes.len());
            assert!(trace.live_bytes().iter().all(|l| l.0 <= BENCH_PEAK_LIMIT), "seed {seed}");
        }
        assert!(p.max_kv_bytes() == 10 * MIB && p.max_activation_bytes() == 64 * MIB);
    }

    #[test]
    fn training_repeats_the_same_sizes_every_step_within_bounds() {
        let p = TrainingParams::BENCH;
        for seed in 0..20 {
            let trace = training(&p, seed);
            let steps = &trace.steps;
            // Step 0 also allocates the persistent buffers, the last step frees them.
            let middle: Vec<&Vec<Event>> = steps[1..steps.len() - 1].iter().collect();
            let shape = |step: &Vec<Event>| sizes(&Trace { steps: vec![step.clone()], ..trace.clone() });
            assert!(middle.windows(2).all(|w| shape(w[0]) == shape(w[1])), "seed {seed}");
            let most = (4 * p.tokens * p.hidden_bytes.1).max(p.layers * p.weight_bytes(p.hidden_bytes.1));
            let least = p.tokens * p.hidden_bytes.0;
            assert!(sizes(&trace).iter().all(|&s| (least..=most).contains(&s)), "seed {seed}");
            assert!(trace.live_bytes().iter().all(|l| l.0 <= BENCH_PEAK_LIMIT), "seed {seed}");
        }
    }
}
