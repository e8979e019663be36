//! What memory-snapshot messages carry (feature `snapshot`): a peer asks
//! ([`IpcChannel::request_snapshot`](crate::IpcChannel::request_snapshot), or Python's
//! `IpcChannel.request_snapshot`), this process answers with one of its own
//! ([`IpcChannel::answer_snapshot_request`](crate::IpcChannel::answer_snapshot_request)), and the
//! asker receives it as [`Received::Snapshot`](crate::Received::Snapshot). The messages are
//! [`MessageKind::SnapshotRequest`](crate::wire::MessageKind::SnapshotRequest) and
//! [`MessageKind::Snapshot`](crate::wire::MessageKind::Snapshot) (the snapshot's JSON); both
//! channels send and read them through this module.
//!
//! A snapshot goes in one message, at most [`MAX_PAYLOAD_LEN`] bytes: when its JSON would be
//! longer, its oldest events are left out (and counted in its `dropped_events`) until it fits.

use cuda_mem_core::snapshot::{MemorySnapshot, take_snapshot};

use crate::error::{IpcError, MessageLimit, Result};
use crate::wire::{MAX_PAYLOAD_LEN, SnapshotRequest};

/// The JSON answering `request`: a snapshot of this process taken now, with as many of the
/// latest events as the request asks and one message holds.
pub(crate) fn answer_json(request: &SnapshotRequest) -> Result<String> {
    let mut snapshot = take_snapshot();
    if let Some(most) = request.max_events {
        keep_latest(&mut snapshot, most as usize);
    }
    fitted_json(snapshot, MAX_PAYLOAD_LEN)
}

/// `snapshot`'s JSON, its oldest events left out until it fits one message.
pub(crate) fn snapshot_json(snapshot: &MemorySnapshot) -> Result<String> {
    let json = snapshot.to_json().map_err(IpcError::Snapshot)?;
    if json.len() <= MAX_PAYLOAD_LEN {
        return Ok(json);
    }
    fitted_json(snapshot.clone(), MAX_PAYLOAD_LEN)
}

/// The snapshot a peer sent, from its message's bytes.
pub(crate) fn read(payload: &[u8]) -> Result<Box<MemorySnapshot>> {
    MemorySnapshot::from_json_bytes(payload).map(Box::new).map_err(IpcError::Snapshot)
}

/// Leaves out all but the latest `most` events, counting those left out as dropped.
fn keep_latest(snapshot: &mut MemorySnapshot, most: usize) {
    let gone = snapshot.events.len().saturating_sub(most);
    snapshot.events.drain(..gone);
    snapshot.dropped_events += gone as u64;
}

/// The JSON of `snapshot`, its oldest events left out until it is at most `limit` bytes.
fn fitted_json(mut snapshot: MemorySnapshot, limit: usize) -> Result<String> {
    loop {
        let json = snapshot.to_json().map_err(IpcError::Snapshot)?;
        if json.len() <= limit {
            return Ok(json);
        }
        let events = snapshot.events.len();
        if events == 0 {
            return Err(IpcError::MessageTooLarge { what: MessageLimit::Payload, actual: json.len(), limit });
        }
        // Events weigh about alike: keep the share of them that fits, a tenth less for the ones
        // that weigh more (each round leaves out at least one).
        let share = (events as u128 * limit as u128 / json.len() as u128 * 9 / 10) as usize;
        keep_latest(&mut snapshot, share.min(events - 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MessageKind;
    use crate::{Channel, IpcChannel, Received};
    use cuda_mem_core::history::{self, HistoryOptions, ResourceId};
    use cuda_mem_core::{CachingOptions, CachingResource, Device, DeviceMemoryResource, Stream};

    /// A snapshot of a cache with 300 allocations recorded, 100 of them live.
    fn recorded() -> (Stream, std::sync::Arc<CachingResource>, Vec<cuda_mem_core::Buffer>, MemorySnapshot) {
        cuda_sim::testing::driver().unwrap();
        let device = Device::new(0).unwrap();
        let stream = Stream::new(device, Default::default()).unwrap();
        let cache = CachingResource::new(
            DeviceMemoryResource::new(device, Default::default()).unwrap(),
            CachingOptions::default(),
        )
        .unwrap();
        history::start_recording(HistoryOptions::default());
        let mut live = Vec::new();
        for i in 0..300 {
            let buffer = cache.allocate(1024 * (1 + i % 5), &stream).unwrap();
            if i % 3 == 0 {
                live.push(buffer);
            }
        }
        history::stop_recording();
        let snapshot = take_snapshot();
        (stream, cache, live, snapshot)
    }

    #[test]
    fn a_snapshot_too_long_for_a_message_loses_its_oldest_events_and_counts_them() {
        let _serial = history::tests_serial();
        let (_stream, _cache, _live, snapshot) = recorded();
        let whole = snapshot.to_json().unwrap();
        let limit = whole.len() / 2;
        let fitted = MemorySnapshot::from_json(&fitted_json(snapshot.clone(), limit).unwrap()).unwrap();
        assert!(fitted.to_json().unwrap().len() <= limit);
        let kept = fitted.events.len();
        assert!(kept > 0 && kept < snapshot.events.len(), "{kept} of {}", snapshot.events.len());
        assert_eq!(fitted.events[..], snapshot.events[snapshot.events.len() - kept..], "the latest");
        assert_eq!(fitted.dropped_events, snapshot.dropped_events + (snapshot.events.len() - kept) as u64);
        assert_eq!(fitted.resources, snapshot.resources, "every resource, whole");
        let too_small = fitted_json(snapshot, 10);
        assert!(matches!(too_small, Err(IpcError::MessageTooLarge { what: MessageLimit::Payload, limit: 10, .. })));
    }

    #[test]
    fn a_peer_asks_and_gets_this_process_s_snapshot_with_the_events_it_asked_for() {
        let _serial = history::tests_serial();
        let (stream, cache, live, _) = recorded();
        let (here, there) = Channel::pair().unwrap();
        let (asker, server) = (IpcChannel::new(here), IpcChannel::new(there));
        asker.request_snapshot(Some(50)).unwrap();
        let Received::SnapshotRequest(request) = server.recv(&stream).unwrap() else { panic!("a request") };
        assert_eq!(request.max_events, Some(50));
        server.answer_snapshot_request(&request).unwrap();
        let Received::Snapshot(snapshot) = asker.recv(&stream).unwrap() else { panic!("a snapshot") };
        assert_eq!(snapshot.events.len(), 50);
        let ours = snapshot.resource(ResourceId::of(&*cache)).unwrap();
        assert_eq!(ours.live_allocations, live.len() as u64);
    }

    #[test]
    fn a_bad_request_or_snapshot_is_an_error_and_the_channel_goes_on() {
        cuda_sim::testing::driver().unwrap();
        let stream = Stream::new(Device::new(0).unwrap(), Default::default()).unwrap();
        let (here, there) = Channel::pair().unwrap();
        let receiver = IpcChannel::new(there);
        here.send(MessageKind::SnapshotRequest.code(), &[1, 2], &[]).unwrap();
        here.send(MessageKind::Snapshot.code(), b"{\"version\": 1}", &[]).unwrap();
        here.send(MessageKind::Snapshot.code(), b"{\"version\": 99}", &[]).unwrap();
        here.send(MessageKind::Data.code(), b"still in step", &[]).unwrap();
        let short = receiver.recv(&stream).unwrap_err();
        assert!(short.channel_usable(), "{short}");
        assert!(
            matches!(
                short,
                IpcError::Protocol(crate::ProtocolError::SnapshotRequest(crate::wire::SnapshotRequestError::Length {
                    len: 2
                }))
            ),
            "{short}"
        );
        let partial = receiver.recv(&stream).unwrap_err();
        assert!(matches!(partial, IpcError::Snapshot(cuda_mem_core::snapshot::SnapshotFormatError::Json(_))));
        let newer = receiver.recv(&stream).unwrap_err();
        assert!(
            matches!(
                newer,
                IpcError::Snapshot(cuda_mem_core::snapshot::SnapshotFormatError::NewerSchema { found: 99, .. })
            ),
            "{newer}"
        );
        assert!(newer.to_string().ends_with("the channel is still usable"), "{newer}");
        assert!(matches!(receiver.recv(&stream).unwrap(), Received::Data(bytes) if bytes == b"still in step"));
    }
}
