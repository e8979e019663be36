//! The simulator's configuration, read from the environment at the first `cuInit`.
//!
//! `CUDA_SIM_DEVICES`, `CUDA_SIM_MEMORY` and `CUDA_SIM_PEER_ACCESS` describe the simulated
//! *machine*: its physical devices, indexed `0..CUDA_SIM_DEVICES`, and which of them can reach
//! each other (pairs of physical indices). `CUDA_VISIBLE_DEVICES` then picks which of them this
//! process sees, and in what order, as the real driver does: the process's ordinal `i` is the
//! `i`-th device listed. Two processes can so see the same simulated GPUs under different
//! ordinals.
//!
//! `CUDA_VISIBLE_DEVICES` unset: every device, in physical order. Set: a comma-separated list
//! whose entries are physical indices (`2`) or device UUIDs as `nvidia-smi` prints them
//! (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lowercase hex, as [`uuid_string`] writes them),
//! or a prefix of one that starts with `GPU-` and matches exactly one device (`GPU-1a2b`). As
//! the CUDA documentation says, parsing stops at the first invalid entry and only the devices
//! listed before it are visible; an entry is invalid when it names no device of the machine
//! (`-1`, an index past the last, an unknown or ambiguous UUID prefix), names a device listed
//! already, or is anything else (an empty entry, surrounding spaces, `MIG-…`; see
//! [`conservative`](crate::conservative)). So `CUDA_VISIBLE_DEVICES=` (empty) hides every device,
//! and `cuInit` then fails with `CUDA_ERROR_NO_DEVICE`, as the real driver's does.
//!
//! Inside the simulator every table (contexts, pools, streams, memory accounting) is keyed by
//! the process's ordinal. The physical index appears only where hardware identity shows or
//! crosses a process boundary: device names, UUIDs and PCI bus ids, the peer topology, and the
//! headers of shareable pools and VMM allocations ([`Config::physical`] and
//! [`Config::ordinal`] translate).

use std::collections::BTreeSet;

use crate::device::uuid_string;

/// Default memory per simulated device.
const DEFAULT_MEMORY: u64 = 8 << 30;
/// Most devices the simulator will pretend to have.
const MAX_DEVICES: usize = 64;
/// The environment variable that selects the devices a process sees (`CUDA_VISIBLE_DEVICES`),
/// which the simulator honours as the driver does.
pub const VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";

/// The environment variable that makes the simulator pretend to be another (older) driver.
pub const DRIVER_VERSION_ENV: &str = "CUDA_SIM_DRIVER_VERSION";
/// The oldest version [`DRIVER_VERSION_ENV`] accepts: CUDA 11.0, older than every capability
/// `cuda-mem` gates (stream-ordered pools came with 11.2).
pub(crate) const OLDEST_DRIVER_VERSION: i32 = 11000;
/// The default: the `cuda.h` the simulator implements.
pub(crate) const DEFAULT_DRIVER_VERSION: i32 = cuda_mem_sys::HEADER_VERSION;
/// The newest version it accepts: CUDA 13.2, whose `cuMemcpyWithAttributesAsync` is the newest
/// entry point the simulator implements (`cuda_mem_sys::NEWER_SYMBOLS`).
pub(crate) const NEWEST_DRIVER_VERSION: i32 = cuda_mem_sys::MEMCPY_WITH_ATTRIBUTES_VERSION as i32;

/// Reads a [`DRIVER_VERSION_ENV`] value: a version as `cuDriverGetVersion` encodes it
/// (1000 × major + 10 × minor, `12080` for CUDA 12.8); unset or blank is the default.
pub(crate) fn parse_driver_version(text: Option<&str>) -> Result<i32, String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok(DEFAULT_DRIVER_VERSION);
    };
    match text.parse::<i32>() {
        Ok(v) if (OLDEST_DRIVER_VERSION..=NEWEST_DRIVER_VERSION).contains(&v) => Ok(v),
        _ => Err(format!(
            "{DRIVER_VERSION_ENV}={text:?}: expected a CUDA version as cuDriverGetVersion encodes it (12080 for \
             CUDA 12.8), from {OLDEST_DRIVER_VERSION} to {NEWEST_DRIVER_VERSION}"
        )),
    }
}

/// The CUDA version the simulator reports ([`DRIVER_VERSION_ENV`], read once, at the first call
/// that needs it: `cuDriverGetVersion` and `cuGetProcAddress` may come before `cuInit`). A value
/// it cannot read is reported on stderr, once, and is `Err`: `cuInit`, `cuDriverGetVersion` and
/// `cuGetProcAddress` then fail with `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn driver_version() -> Result<i32, ()> {
    static VERSION: std::sync::OnceLock<Result<i32, ()>> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        parse_driver_version(std::env::var(DRIVER_VERSION_ENV).ok().as_deref()).map_err(|message| {
            eprintln!("cuda-sim: {message}");
        })
    })
}

/// Which address hints `cuMemAddressReserve` refuses (`CUDA_SIM_ADDRESS_HINTS`): the driver
/// need not honour a hint (an H100 moved 32 of 511 in-place growth steps), so code that asks for
/// an address must work when it gets another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressHints {
    /// Every hint whose range is free is honoured (`honour`, the default).
    Honour,
    /// Every `n`-th hint of the process is refused, the others honoured (`refuse-every-N`).
    RefuseEvery(u64),
    /// No hint is honoured (`refuse-all`).
    RefuseAll,
}

impl AddressHints {
    /// Reads `honour`, `refuse-all` or `refuse-every-N` (`N` >= 1).
    fn parse(text: &str) -> Result<AddressHints, String> {
        let text = text.trim();
        let every = text.strip_prefix("refuse-every-").map(str::parse::<u64>);
        match (text, every) {
            ("honour", _) => Ok(AddressHints::Honour),
            ("refuse-all", _) => Ok(AddressHints::RefuseAll),
            (_, Some(Ok(n))) if n >= 1 => Ok(AddressHints::RefuseEvery(n)),
            _ => {
                Err(format!("CUDA_SIM_ADDRESS_HINTS={text:?}: expected honour, refuse-all or refuse-every-N (N >= 1)"))
            }
        }
    }

    /// Whether the `nth` hint of the process (1 = the first) is refused.
    pub(crate) fn refuses(self, nth: u64) -> bool {
        match self {
            AddressHints::Honour => false,
            AddressHints::RefuseEvery(n) => nth.is_multiple_of(n),
            AddressHints::RefuseAll => true,
        }
    }
}

/// The simulated machine, and the part of it this process sees.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// The physical index of each of this process's ordinals, in ordinal order (no repeats).
    pub visible: Vec<usize>,
    /// Bytes of memory per device.
    pub memory: u64,
    /// Pairs `(a, b)` of *physical* indices, `a != b`, where device `a` can access device `b`'s
    /// memory.
    pub peers: BTreeSet<(usize, usize)>,
    /// Where parsing `CUDA_VISIBLE_DEVICES` stopped early and why, for a message at `cuInit`
    /// (the devices listed before the invalid entry stay visible).
    pub visible_note: Option<String>,
    /// Whether a second import of a pool this process has imported already returns the first
    /// import's handle (`CUDA_SIM_POOL_IMPORT=same-handle`) instead of a new one (see
    /// [`conservative`](crate::conservative)).
    pub same_handle_imports: bool,
    /// Whether a destroyed device pool's handle value is handed to the next pool created on its
    /// device, with the peer access it still had (`CUDA_SIM_POOL_HANDLES=recycle`, the driver's
    /// nvbug 5698116), instead of every pool getting a value never used before (`unique`).
    pub recycle_pool_handles: bool,
    /// Which `cuMemAddressReserve` hints are refused (`CUDA_SIM_ADDRESS_HINTS`).
    pub address_hints: AddressHints,
    /// What `cuDeviceGetAttribute` reports instead of the simulated device's value, by
    /// `CUdevice_attribute` code, for every device (`CUDA_SIM_DEVICE_ATTRIBUTES`): a device that
    /// lacks a capability, for testing the checks a library makes before relying on it. Only the
    /// report changes; the rest of the simulator behaves as before.
    pub attribute_overrides: Vec<(u32, i32)>,
    /// The IMEX channel this process may use (`CUDA_SIM_IMEX_CHANNEL`), which fabric-handle
    /// sharing needs: none by default, as on a machine without `/dev/nvidia-caps-imex-channels`
    /// (fabric memory is then `CUDA_ERROR_NOT_PERMITTED`, see `conservative`).
    pub imex_channel: Option<u32>,
}

impl Config {
    /// Reads `CUDA_SIM_DEVICES`, `CUDA_SIM_MEMORY`, `CUDA_SIM_PEER_ACCESS` and
    /// `CUDA_VISIBLE_DEVICES`.
    pub(crate) fn from_env() -> Result<Config, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        // Unlike the simulator's own variables, an empty CUDA_VISIBLE_DEVICES means something
        // (no device), so only an unset one selects every device.
        let visible = std::env::var_os(VISIBLE_DEVICES_ENV).map(|v| v.to_string_lossy().into_owned());
        let mut config = Config::parse(
            var("CUDA_SIM_DEVICES").as_deref(),
            var("CUDA_SIM_MEMORY").as_deref(),
            var("CUDA_SIM_PEER_ACCESS").as_deref(),
            visible.as_deref(),
        )?;
        config.same_handle_imports = match var("CUDA_SIM_POOL_IMPORT").as_deref().map(str::trim) {
            None | Some("new-handle") => false,
            Some("same-handle") => true,
            Some(other) => {
                return Err(format!("CUDA_SIM_POOL_IMPORT={other:?}: expected new-handle or same-handle"));
            }
        };
        config.recycle_pool_handles = match var("CUDA_SIM_POOL_HANDLES").as_deref().map(str::trim) {
            None | Some("unique") => false,
            Some("recycle") => true,
            Some(other) => {
                return Err(format!("CUDA_SIM_POOL_HANDLES={other:?}: expected unique or recycle"));
            }
        };
        if let Some(text) = var("CUDA_SIM_ADDRESS_HINTS") {
            config.address_hints = AddressHints::parse(&text)?;
        }
        if let Some(text) = var("CUDA_SIM_DEVICE_ATTRIBUTES") {
            config.attribute_overrides = parse_attribute_overrides(&text)?;
        }
        if let Some(text) = var("CUDA_SIM_IMEX_CHANNEL") {
            let channel = text.trim().parse::<u32>();
            config.imex_channel =
                Some(channel.map_err(|_| format!("CUDA_SIM_IMEX_CHANNEL={text:?}: expected a channel number"))?);
        }
        Ok(config)
    }

    /// The value `cuDeviceGetAttribute` reports for `attribute` instead of the device's, if
    /// `CUDA_SIM_DEVICE_ATTRIBUTES` sets one.
    pub(crate) fn attribute_override(&self, attribute: u32) -> Option<i32> {
        self.attribute_overrides.iter().rev().find(|(code, _)| *code == attribute).map(|&(_, value)| value)
    }

    /// Builds a configuration from the four settings' text (`None`: the default, which for
    /// `visible` means every device). A `CUDA_VISIBLE_DEVICES` that leaves no device visible is
    /// not an error here: `cuInit` answers it with `CUDA_ERROR_NO_DEVICE`.
    pub(crate) fn parse(
        devices: Option<&str>,
        memory: Option<&str>,
        peers: Option<&str>,
        visible: Option<&str>,
    ) -> Result<Config, String> {
        let physical_devices = match devices {
            None => 1,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_DEVICES).contains(&n) => n,
                _ => {
                    return Err(format!("CUDA_SIM_DEVICES={text:?}: expected a number from 1 to {MAX_DEVICES}"));
                }
            },
        };
        let memory = match memory {
            None => DEFAULT_MEMORY,
            Some(text) => parse_bytes(text).ok_or_else(|| {
                format!("CUDA_SIM_MEMORY={text:?}: expected a positive byte count such as 4294967296 or 4G")
            })?,
        };
        let peers = parse_peers(peers.unwrap_or("all"), physical_devices)?;
        let (visible, visible_note) = match visible {
            None => ((0..physical_devices).collect(), None),
            Some(text) => parse_visible(text, physical_devices),
        };
        Ok(Config {
            visible,
            memory,
            peers,
            visible_note,
            same_handle_imports: false,
            recycle_pool_handles: false,
            address_hints: AddressHints::Honour,
            attribute_overrides: Vec::new(),
            imex_channel: None,
        })
    }

    /// Number of devices this process sees; its ordinals are `0..devices()`.
    pub(crate) fn devices(&self) -> usize {
        self.visible.len()
    }

    /// The physical index of this process's `ordinal` (`None` past the last ordinal).
    pub(crate) fn physical(&self, ordinal: usize) -> Option<usize> {
        self.visible.get(ordinal).copied()
    }

    /// This process's ordinal for the physical device `physical` (`None` when it is not visible).
    pub(crate) fn ordinal(&self, physical: usize) -> Option<usize> {
        self.visible.iter().position(|&p| p == physical)
    }

    /// Whether the device of ordinal `from` can access memory on the device of ordinal `to`
    /// (the topology is the machine's, so the ordinals are translated first).
    pub(crate) fn can_access(&self, from: usize, to: usize) -> bool {
        match (self.physical(from), self.physical(to)) {
            (Some(a), Some(b)) => a != b && self.peers.contains(&(a, b)),
            _ => false,
        }
    }
}

/// Applies `CUDA_VISIBLE_DEVICES` (`text`) to a machine of `physical` devices: the physical
/// index of each visible ordinal and, when parsing stopped at an invalid entry, why.
fn parse_visible(text: &str, physical: usize) -> (Vec<usize>, Option<String>) {
    let mut visible: Vec<usize> = Vec::new();
    for entry in text.split(',') {
        let problem = match resolve_visible_entry(entry, physical) {
            Ok(index) if !visible.contains(&index) => {
                visible.push(index);
                continue;
            }
            Ok(index) => format!("names physical device {index} a second time"),
            Err(problem) => problem,
        };
        let note = format!(
            "{VISIBLE_DEVICES_ENV}={text:?}: entry {entry:?} {problem}, so it and the entries after it are \
             ignored ({} device(s) visible)",
            visible.len()
        );
        return (visible, Some(note));
    }
    (visible, None)
}

/// The physical index one `CUDA_VISIBLE_DEVICES` entry names, or why it is invalid.
fn resolve_visible_entry(entry: &str, physical: usize) -> Result<usize, String> {
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        return match entry.parse::<usize>() {
            Ok(index) if index < physical => Ok(index),
            _ => Err(format!("is not a device index below CUDA_SIM_DEVICES={physical}")),
        };
    }
    if entry.len() > "GPU-".len() && entry.starts_with("GPU-") {
        let matching: Vec<usize> = (0..physical).filter(|&d| uuid_string(d).starts_with(entry)).collect();
        return match matching[..] {
            [index] => Ok(index),
            [] => Err("matches no simulated device's UUID".to_owned()),
            _ => Err(format!("is a prefix of {} devices' UUIDs", matching.len())),
        };
    }
    Err("is neither a device index nor a device UUID (or unique prefix of one) starting with `GPU-`".to_owned())
}

/// Reads `CUDA_SIM_DEVICE_ATTRIBUTES`: `code=value` pairs (`CUdevice_attribute` codes),
/// separated by commas.
fn parse_attribute_overrides(text: &str) -> Result<Vec<(u32, i32)>, String> {
    text.split(',')
        .map(|pair| {
            let parsed = pair
                .split_once('=')
                .and_then(|(code, value)| Some((code.trim().parse::<u32>().ok()?, value.trim().parse::<i32>().ok()?)));
            parsed.ok_or_else(|| {
                format!(
                    "CUDA_SIM_DEVICE_ATTRIBUTES={text:?}: expected CUdevice_attribute codes and values such as \
                     `115=0,119=0`"
                )
            })
        })
        .collect()
}

fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last()? {
        'k' | 'K' => (&text[..text.len() - 1], 10),
        'm' | 'M' => (&text[..text.len() - 1], 20),
        'g' | 'G' => (&text[..text.len() - 1], 30),
        't' | 'T' => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let value: u64 = digits.trim().parse().ok()?;
    let bytes = value.checked_mul(1u64 << shift)?;
    (bytes > 0).then_some(bytes)
}

/// Reads `CUDA_SIM_PEER_ACCESS` for a machine of `devices` physical devices.
fn parse_peers(text: &str, devices: usize) -> Result<BTreeSet<(usize, usize)>, String> {
    let text = text.trim();
    let mut peers = BTreeSet::new();
    match text {
        "all" => {
            for a in 0..devices {
                for b in 0..devices {
                    if a != b {
                        peers.insert((a, b));
                    }
                }
            }
        }
        "none" => {}
        pairs => {
            for pair in pairs.split(',') {
                let bad = || {
                    format!(
                        "CUDA_SIM_PEER_ACCESS={text:?}: expected `all`, `none` or pairs of distinct physical \
                         device indices below {devices} such as `0-1,2-3`"
                    )
                };
                let (a, b) = pair.trim().split_once('-').ok_or_else(bad)?;
                let a: usize = a.trim().parse().map_err(|_| bad())?;
                let b: usize = b.trim().parse().map_err(|_| bad())?;
                if a == b || a >= devices || b >= devices {
                    return Err(bad());
                }
                peers.insert((a, b));
                peers.insert((b, a));
            }
        }
    }
    Ok(peers)
}

/// A machine of four devices, of which this process sees `visible` (for the unit tests of the
/// modules that translate device numbers).
#[cfg(test)]
pub(crate) fn four_devices_seeing(visible: &str) -> Config {
    Config::parse(Some("4"), None, None, Some(visible)).expect("a valid test configuration")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(devices: &str, visible: Option<&str>) -> Config {
        Config::parse(Some(devices), None, None, visible).unwrap()
    }

    #[test]
    fn defaults() {
        let c = Config::parse(None, None, None, None).unwrap();
        assert_eq!(c.devices(), 1);
        assert_eq!(c.visible, [0]);
        assert_eq!(c.memory, 8 << 30);
        assert!(c.peers.is_empty());
        assert!(c.visible_note.is_none());
    }

    #[test]
    fn attribute_overrides_are_code_value_pairs() {
        assert_eq!(parse_attribute_overrides("115=0, 134 = -1").unwrap(), [(115, 0), (134, -1)]);
        for bad in ["115", "x=1", "115=y", "115=0,", "-1=0"] {
            assert!(parse_attribute_overrides(bad).is_err(), "{bad:?}");
        }
        let mut c = Config::parse(None, None, None, None).unwrap();
        assert_eq!(c.attribute_override(115), None);
        c.attribute_overrides = parse_attribute_overrides("115=0,115=1").unwrap();
        assert_eq!(c.attribute_override(115), Some(1), "the last setting of a code stands");
    }

    #[test]
    fn peers_all_none_and_pairs() {
        let c = machine("3", None);
        assert!(c.can_access(0, 2) && c.can_access(2, 1));
        assert!(!c.can_access(1, 1));
        let c = Config::parse(Some("3"), None, Some("none"), None).unwrap();
        assert!(!c.can_access(0, 1));
        let c = Config::parse(Some("4"), None, Some("0-1, 2-3"), None).unwrap();
        assert!(c.can_access(0, 1) && c.can_access(1, 0) && c.can_access(3, 2));
        assert!(!c.can_access(0, 2) && !c.can_access(1, 3));
    }

    #[test]
    fn bad_settings_are_rejected_with_the_variable_named() {
        let parse = |d, m, p| Config::parse(d, m, p, None);
        assert!(parse(Some("0"), None, None).unwrap_err().contains("CUDA_SIM_DEVICES"));
        assert!(parse(Some("x"), None, None).is_err());
        assert!(parse(None, Some("-5"), None).unwrap_err().contains("CUDA_SIM_MEMORY"));
        assert!(parse(Some("2"), None, Some("0-2")).unwrap_err().contains("CUDA_SIM_PEER_ACCESS"));
        assert!(parse(Some("2"), None, Some("1-1")).is_err());
        assert!(parse(Some("2"), None, Some("0:1")).is_err());
    }

    #[test]
    fn memory_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("0"), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }

    #[test]
    fn unset_visible_devices_shows_every_device_in_order() {
        let c = machine("4", None);
        assert_eq!(c.visible, [0, 1, 2, 3]);
        assert!((0..4).all(|d| c.physical(d) == Some(d) && c.ordinal(d) == Some(d)));
        assert_eq!(c.physical(4), None);
    }

    #[test]
    fn visible_indices_select_and_reorder() {
        let c = machine("4", Some("2,0"));
        assert_eq!(c.devices(), 2);
        assert_eq!(c.visible, [2, 0]);
        assert_eq!((c.physical(0), c.physical(1), c.physical(2)), (Some(2), Some(0), None));
        assert_eq!((c.ordinal(2), c.ordinal(0), c.ordinal(1), c.ordinal(3)), (Some(0), Some(1), None, None));
        assert!(c.visible_note.is_none());
        assert_eq!(machine("4", Some("3")).visible, [3]);
        assert_eq!(machine("4", Some("03,1")).visible, [3, 1], "leading zeros are still the index");
    }

    #[test]
    fn peers_are_checked_between_physical_devices() {
        let c = Config::parse(Some("4"), None, Some("0-2"), Some("2,1,0")).unwrap();
        // Ordinals 0 and 2 are physical devices 2 and 0, the only linked pair.
        assert!(c.can_access(0, 2) && c.can_access(2, 0));
        assert!(!c.can_access(0, 1) && !c.can_access(1, 2) && !c.can_access(1, 0));
        assert!(!c.can_access(0, 3), "an ordinal past the last reaches nothing");
        let c = Config::parse(Some("4"), None, Some("1-3"), Some("3,0,1")).unwrap();
        assert!(c.can_access(0, 2) && !c.can_access(0, 1) && !c.can_access(1, 2));
    }

    #[test]
    fn visible_uuids_and_unique_prefixes() {
        let full = uuid_string(3);
        let c = machine("4", Some(&format!("{full},1")));
        assert_eq!(c.visible, [3, 1]);
        // "GPU-" and the first 8 hex digits are unique among all 64 possible devices.
        let prefix = &uuid_string(2)[..12];
        assert_eq!(machine("4", Some(&format!("0,{prefix}"))).visible, [0, 2]);
        let shortest = (5..full.len())
            .map(|n| &full[..n])
            .find(|p| (0..4).filter(|&d| uuid_string(d).starts_with(p)).count() == 1);
        assert_eq!(machine("4", shortest).visible, [3]);
    }

    #[test]
    fn an_invalid_entry_stops_parsing() {
        // The CUDA documentation's own example.
        let c = machine("3", Some("0,2,-1,1"));
        assert_eq!(c.visible, [0, 2]);
        assert!(c.visible_note.as_deref().is_some_and(|n| n.contains("\"-1\"") && n.contains("CUDA_VISIBLE_DEVICES")));
        assert_eq!(machine("4", Some("1,5,0")).visible, [1], "past the last physical device");
        assert_eq!(machine("4", Some("1,,0")).visible, [1], "an empty entry");
        assert_eq!(machine("4", Some("1,0,")).visible, [1, 0], "a trailing comma");
        assert_eq!(machine("4", Some("1, 0")).visible, [1], "a space");
        assert_eq!(machine("4", Some("1,+0")).visible, [1]);
        assert_eq!(machine("4", Some("1,0x2")).visible, [1]);
        assert_eq!(machine("4", Some("1,99999999999999999999999")).visible, [1]);
        assert_eq!(machine("4", Some("2,GPU-")).visible, [2], "a bare `GPU-` is no prefix");
        let upper = uuid_string(0).to_uppercase();
        assert_eq!(machine("4", Some(&format!("2,{upper}"))).visible, [2], "UUIDs as printed: lowercase");
        let bare = uuid_string(0)["GPU-".len()..].to_owned();
        assert_eq!(machine("4", Some(&format!("2,{bare}"))).visible, [2], "the `GPU-` is part of the UUID");
        assert_eq!(machine("4", Some(&format!("2,MIG-{bare}"))).visible, [2], "no MIG instances");
        // A UUID of a device the machine does not have (device 5 of a 4-device machine).
        assert_eq!(machine("4", Some(&format!("2,{}", uuid_string(5)))).visible, [2]);
        assert_eq!(machine("4", Some("2,GPU-ffffffff-ffff")).visible, [2]);
    }

    #[test]
    fn an_ambiguous_uuid_prefix_is_invalid() {
        // Of 64 devices, two share their first hex digit.
        let first = |d: usize| uuid_string(d)[..5].to_owned();
        let (a, b) =
            (0..64).flat_map(|a| (a + 1..64).map(move |b| (a, b))).find(|&(a, b)| first(a) == first(b)).unwrap();
        let c = machine("64", Some(&format!("{a},{}", first(b))));
        assert_eq!(c.visible, [a]);
        assert!(c.visible_note.unwrap().contains("prefix of"));
    }

    #[test]
    fn duplicates_stop_parsing() {
        assert_eq!(machine("4", Some("1,1,0")).visible, [1]);
        assert_eq!(machine("4", Some("2,0,2,1")).visible, [2, 0]);
        let c = machine("4", Some(&format!("1,{},0", uuid_string(1))));
        assert_eq!(c.visible, [1], "the same device by index and by UUID");
        assert!(c.visible_note.unwrap().contains("second time"));
    }

    #[test]
    fn no_visible_device() {
        for text in ["", "-1", "4", " 0", "MIG-0", "none", ","] {
            let c = machine("4", Some(text));
            assert_eq!(c.devices(), 0, "{text:?}");
            assert!(c.visible_note.is_some(), "{text:?}");
        }
    }

    #[test]
    fn driver_version_settings() {
        assert_eq!(parse_driver_version(None), Ok(DEFAULT_DRIVER_VERSION));
        assert_eq!(parse_driver_version(Some(" ")), Ok(DEFAULT_DRIVER_VERSION));
        assert_eq!(parse_driver_version(Some("13020")), Ok(13020));
        assert_eq!(parse_driver_version(Some("11020")), Ok(11020));
        assert_eq!(parse_driver_version(Some(" 12080 ")), Ok(12080));
        for bad in ["12.8", "10020", "13030", "x", "-1"] {
            assert!(parse_driver_version(Some(bad)).unwrap_err().contains(DRIVER_VERSION_ENV), "{bad:?}");
        }
    }

    #[test]
    fn address_hint_settings() {
        assert_eq!(AddressHints::parse("honour"), Ok(AddressHints::Honour));
        assert_eq!(AddressHints::parse(" refuse-all "), Ok(AddressHints::RefuseAll));
        assert_eq!(AddressHints::parse("refuse-every-3"), Ok(AddressHints::RefuseEvery(3)));
        for bad in ["refuse-every-0", "refuse-every-", "refuse-every-x", "honor", "all"] {
            assert!(AddressHints::parse(bad).is_err(), "{bad:?}");
        }
        let every_third: Vec<bool> = (1..=6).map(|n| AddressHints::RefuseEvery(3).refuses(n)).collect();
        assert_eq!(every_third, [false, false, true, false, false, true]);
        assert!((1..=4).all(|n| AddressHints::RefuseAll.refuses(n) && !AddressHints::Honour.refuses(n)));
    }
}
