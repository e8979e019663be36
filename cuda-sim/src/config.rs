//! The simulator's configuration, read from the environment at the first `cuInit`.

use std::collections::BTreeSet;

/// Default memory per simulated device.
const DEFAULT_MEMORY: u64 = 8 << 30;
/// Most devices the simulator will pretend to have.
const MAX_DEVICES: usize = 64;

/// The simulated machine.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    /// Number of devices.
    pub devices: usize,
    /// Bytes of memory per device.
    pub memory: u64,
    /// Pairs `(a, b)` with `a != b` where device `a` can access device `b`'s memory.
    pub peers: BTreeSet<(usize, usize)>,
}

impl Config {
    /// Reads `CUDA_SIM_DEVICES`, `CUDA_SIM_MEMORY` and `CUDA_SIM_PEER_ACCESS`.
    pub(crate) fn from_env() -> Result<Config, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Config::parse(
            var("CUDA_SIM_DEVICES").as_deref(),
            var("CUDA_SIM_MEMORY").as_deref(),
            var("CUDA_SIM_PEER_ACCESS").as_deref(),
        )
    }

    /// Builds a configuration from the three settings' text (`None`: the default).
    pub(crate) fn parse(devices: Option<&str>, memory: Option<&str>, peers: Option<&str>) -> Result<Config, String> {
        let devices = match devices {
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
        let peers = parse_peers(peers.unwrap_or("all"), devices)?;
        Ok(Config { devices, memory, peers })
    }

    /// Whether device `from` can access memory on device `to`.
    pub(crate) fn can_access(&self, from: usize, to: usize) -> bool {
        from != to && self.peers.contains(&(from, to))
    }
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
                        "CUDA_SIM_PEER_ACCESS={text:?}: expected `all`, `none` or pairs of distinct device \
                         ordinals below {devices} such as `0-1,2-3`"
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::parse(None, None, None).unwrap();
        assert_eq!(c.devices, 1);
        assert_eq!(c.memory, 8 << 30);
        assert!(c.peers.is_empty());
    }

    #[test]
    fn peers_all_none_and_pairs() {
        let c = Config::parse(Some("3"), None, None).unwrap();
        assert!(c.can_access(0, 2) && c.can_access(2, 1));
        assert!(!c.can_access(1, 1));
        let c = Config::parse(Some("3"), None, Some("none")).unwrap();
        assert!(!c.can_access(0, 1));
        let c = Config::parse(Some("4"), None, Some("0-1, 2-3")).unwrap();
        assert!(c.can_access(0, 1) && c.can_access(1, 0) && c.can_access(3, 2));
        assert!(!c.can_access(0, 2) && !c.can_access(1, 3));
    }

    #[test]
    fn bad_settings_are_rejected_with_the_variable_named() {
        assert!(Config::parse(Some("0"), None, None).unwrap_err().contains("CUDA_SIM_DEVICES"));
        assert!(Config::parse(Some("x"), None, None).is_err());
        assert!(Config::parse(None, Some("-5"), None).unwrap_err().contains("CUDA_SIM_MEMORY"));
        assert!(Config::parse(Some("2"), None, Some("0-2")).unwrap_err().contains("CUDA_SIM_PEER_ACCESS"));
        assert!(Config::parse(Some("2"), None, Some("1-1")).is_err());
        assert!(Config::parse(Some("2"), None, Some("0:1")).is_err());
    }

    #[test]
    fn memory_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("0"), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }
}
