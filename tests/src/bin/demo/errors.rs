//! How the demo's errors read: an error with its causes on one line (`cuda_mem_integration::errors`), and what
//! was being done when it happened.

use std::fmt;

pub(crate) use cuda_mem_integration::errors::describe;

use crate::Error;

/// Says what was being done when an error happened.
pub(crate) trait Context<T> {
    /// The error, if any, prefixed with what was being done (`what`).
    fn context(self, what: impl fmt::Display) -> Result<T, Error>;
}

impl<T, E: Into<Error>> Context<T> for Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T, Error> {
        self.map_err(|e| format!("{what}: {}", describe(e.into().as_ref())).into())
    }
}
