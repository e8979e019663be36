//! How the demo's errors read: an error with its causes on one line, and what was being done
//! when it happened.

use std::fmt;

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

/// An error and its causes, on one line (a cause already in the message is not repeated).
pub(crate) fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text = format!("{text}: {message}");
        }
        source = cause.source();
    }
    text
}
