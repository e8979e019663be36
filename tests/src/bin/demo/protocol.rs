//! What the parent and the child say to each other: requests as text messages on the channel
//! (then, for buffers, the buffers), each with the patterns to check and to write.

use std::fmt;

/// What the parent writes into a shared buffer, and what it asks the child to write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patterns {
    /// The word the buffer holds when it arrives.
    pub(crate) expect: u32,
    /// The word the child writes into it.
    pub(crate) write: u32,
}

impl fmt::Display for Patterns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}>{:08x}", self.expect, self.write)
    }
}

impl Patterns {
    /// Reads `EXPECT>WRITE` in hexadecimal (as [`fmt::Display`] writes it).
    pub(crate) fn parse(word: &str) -> Result<Patterns, String> {
        let bad = || format!("{word:?} is not EXPECT>WRITE in hexadecimal");
        let (expect, write) = word.split_once('>').ok_or_else(bad)?;
        let hex = |s: &str| u32::from_str_radix(s, 16).map_err(|_| bad());
        Ok(Patterns { expect: hex(expect)?, write: hex(write)? })
    }
}

/// What the parent asks of the child: a text message each (then, for buffers, the buffers).
#[derive(Debug)]
pub(crate) enum Request {
    /// Receive buffers (and their pool), check `expect` in each and write `write`.
    Buffers(Vec<Patterns>),
    /// Receive a virtual buffer, check and write it.
    Vmm(Patterns),
    /// Exit.
    Quit,
}

impl Request {
    /// The request as the text message sent for it.
    pub(crate) fn encode(&self) -> String {
        match self {
            Request::Buffers(patterns) => patterns.iter().fold("buffers".to_string(), |s, p| format!("{s} {p}")),
            Request::Vmm(p) => format!("vmm {p}"),
            Request::Quit => "quit".to_string(),
        }
    }

    /// Reads a request as [`Request::encode`] wrote it.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "a request that is not UTF-8".to_string())?;
        let mut words = text.split_whitespace();
        match (words.next(), words.clone().count()) {
            (Some("buffers"), _) => Ok(Request::Buffers(words.map(Patterns::parse).collect::<Result<_, _>>()?)),
            (Some("vmm"), 1) => Ok(Request::Vmm(Patterns::parse(words.next().unwrap_or_default())?)),
            (Some("quit"), 0) => Ok(Request::Quit),
            _ => Err(format!("an unknown request {text:?}")),
        }
    }
}
