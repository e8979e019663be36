//! How the binaries of this crate print an error: with its causes, on one line.

/// An error and its causes, on one line (a cause already in the message is not repeated).
pub fn describe(error: &(dyn std::error::Error + 'static)) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn std::error::Error + 'static))
        }
    }

    #[test]
    fn causes_follow_the_error_once() {
        let error =
            Layer("reading x: io failed", Some(Box::new(Layer("io failed", Some(Box::new(Layer("EPERM", None)))))));
        assert_eq!(describe(&error), "reading x: io failed: EPERM");
    }
}
