//! A child process of one of this crate's binaries (the demo's child, the probe's), killed if
//! it outstays its time or is left behind after a failure, and its output read while it runs.

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A child process, killed if dropped while it still runs.
#[derive(Debug)]
pub struct KillOnDrop(Child);

impl KillOnDrop {
    /// Takes charge of `child`.
    pub fn new(child: Child) -> KillOnDrop {
        KillOnDrop(child)
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// The child, for its standard streams.
    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    /// Waits for the child to exit, at most `timeout`; kills it after that.
    ///
    /// # Errors
    /// When waiting fails, or when the child had to be killed.
    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.0.kill()?;
                self.0.wait()?;
                return Err(format!("the child did not exit within {} s and was killed", timeout.as_secs()).into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Reads `pipe` (a child's standard output or error) to its end on a thread of its own, so that
/// a child that writes more than the pipe holds does not block while the parent waits for it.
pub fn read_in_background(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}
