//! `ChannelListener`: where processes that start on their own connect to an exporter, by a
//! socket path or a name in Linux's abstract namespace, each connection a [`Channel`]. Who may
//! connect is a [`PeerPolicy`] of the peer's credentials, as the kernel reports them
//! (`SO_PEERCRED`): the same user as this process by default.

use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

use crate::channel::Channel;
use crate::error::{IpcError, Result};
use crate::peer::peer_credentials;

/// The process at a socket's other end, as the kernel recorded it when the connection was made
/// (`SO_PEERCRED`): no peer can change these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PeerCredentials {
    /// Its process id; 0 for a process in a pid namespace this process does not see.
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its group id.
    pub gid: u32,
}

impl PeerCredentials {
    /// The credentials of `socket`'s peer.
    pub(crate) fn of(socket: BorrowedFd<'_>) -> Option<PeerCredentials> {
        let credentials = peer_credentials(socket)?;
        Some(PeerCredentials {
            pid: u32::try_from(credentials.pid).unwrap_or(0),
            uid: credentials.uid,
            gid: credentials.gid,
        })
    }
}

impl fmt::Display for PeerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {} (uid {}, gid {})", self.pid, self.uid, self.gid)
    }
}

/// Who may connect to a [`ChannelListener`], by the peer's [`PeerCredentials`].
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum PeerPolicy {
    /// Processes of this process's user (the same uid). The default: a socket path's file
    /// permissions say nothing of a name in the abstract namespace, which every process in the
    /// network namespace can reach.
    #[default]
    SameUser,
    /// Any process that can reach the socket.
    AnyUser,
    /// Processes whose credentials the function accepts.
    Allow(Arc<dyn Fn(&PeerCredentials) -> bool + Send + Sync>),
}

impl PeerPolicy {
    /// Whether a peer with `credentials` may connect.
    pub fn admits(&self, credentials: &PeerCredentials) -> bool {
        match self {
            PeerPolicy::SameUser => credentials.uid == rustix::process::geteuid().as_raw(),
            PeerPolicy::AnyUser => true,
            PeerPolicy::Allow(check) => check(credentials),
        }
    }
}

impl fmt::Debug for PeerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerPolicy::SameUser => f.write_str("SameUser"),
            PeerPolicy::AnyUser => f.write_str("AnyUser"),
            PeerPolicy::Allow(_) => f.write_str("Allow(..)"),
        }
    }
}

/// A socket where processes connect with [`Channel::connect`] (a path) or
/// [`Channel::connect_abstract`] (a name in Linux's abstract namespace), each connection a
/// [`Channel`] from [`accept`](ChannelListener::accept), which admits only the peers its
/// [`PeerPolicy`] does ([`PeerPolicy::SameUser`] by default).
///
/// A socket path's file stays after the listener is dropped; remove it when done. An abstract
/// name has no file and goes with the listener.
///
/// ```
/// use cuda_mem_ipc::{Channel, ChannelListener, PeerPolicy};
///
/// let name = format!("cuda-mem-example-{}", std::process::id());
/// let listener = ChannelListener::bind_abstract(&name)?.with_policy(PeerPolicy::SameUser);
/// let worker = std::thread::spawn(move || -> Result<(), cuda_mem_ipc::IpcError> {
///     let channel = Channel::connect_abstract(&name)?; // a worker that started on its own
///     channel.send(3, b"ready", &[])
/// });
/// let channel = listener.accept()?; // this process's user: admitted
/// assert_eq!(channel.recv()?.payload, b"ready");
/// assert_eq!(channel.peer_credentials().map(|c| c.pid), Some(std::process::id()));
/// worker.join().expect("the worker")?;
/// # Ok::<(), cuda_mem_ipc::IpcError>(())
/// ```
#[derive(Debug)]
pub struct ChannelListener {
    listener: UnixListener,
    policy: PeerPolicy,
}

impl ChannelListener {
    /// Listens at `path`, which must not exist.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: `path` exists, is too long for a socket address (about 107 bytes), or
    ///   its directory is not writable.
    pub fn bind(path: impl AsRef<Path>) -> Result<ChannelListener> {
        let listener = UnixListener::bind(path).map_err(|e| IpcError::io("binding the IPC channel's socket", e))?;
        Ok(ChannelListener { listener, policy: PeerPolicy::default() })
    }

    /// Listens at `name` in Linux's abstract namespace: no file, reachable by every process in
    /// this network namespace (the [`PeerPolicy`] decides who is admitted), gone with the
    /// listener.
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: another socket listens at `name`, or it is too long (107 bytes).
    pub fn bind_abstract(name: impl AsRef<[u8]>) -> Result<ChannelListener> {
        let address = abstract_address(name.as_ref())?;
        let listener =
            UnixListener::bind_addr(&address).map_err(|e| IpcError::io("binding the IPC channel's socket", e))?;
        Ok(ChannelListener { listener, policy: PeerPolicy::default() })
    }

    /// The listener, admitting the peers `policy` does.
    pub fn with_policy(mut self, policy: PeerPolicy) -> ChannelListener {
        self.policy = policy;
        self
    }

    /// Who it admits.
    pub fn policy(&self) -> &PeerPolicy {
        &self.policy
    }

    /// Waits for the next connection, and admits it if the policy does.
    ///
    /// # Errors
    ///
    /// - [`IpcError::PeerRefused`]: the policy refuses the peer (its connection is closed; the
    ///   listener goes on: call `accept` again).
    /// - [`IpcError::Io`]: `accept` fails (such as out of descriptors), or the peer's
    ///   credentials cannot be read.
    pub fn accept(&self) -> Result<Channel> {
        let stream = loop {
            match self.listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(IpcError::io("accepting a connection on the IPC channel's socket", e)),
            }
        };
        admit(&self.policy, &stream)?;
        Channel::from_stream(stream)
    }

    /// The listening socket (for an [`AsyncChannelListener`](crate::AsyncChannelListener)).
    #[cfg(feature = "tokio")]
    pub(crate) fn into_std(self) -> UnixListener {
        self.listener
    }
}

impl AsFd for ChannelListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Channel {
    /// Connects to a [`ChannelListener`] at `name` in Linux's abstract namespace
    /// ([`ChannelListener::bind_abstract`]).
    ///
    /// # Errors
    ///
    /// - [`IpcError::Io`]: nothing listens at `name`, or it is too long (107 bytes).
    pub fn connect_abstract(name: impl AsRef<[u8]>) -> Result<Channel> {
        let address = abstract_address(name.as_ref())?;
        let stream = UnixStream::connect_addr(&address)
            .map_err(|e| IpcError::io("connecting to the IPC channel's socket", e))?;
        Ok(Channel::new(stream))
    }

    /// The peer's credentials, as the kernel recorded them when the connection was made; `None`
    /// where they cannot be read.
    pub fn peer_credentials(&self) -> Option<PeerCredentials> {
        PeerCredentials::of(self.as_fd())
    }
}

/// Admits the peer of `stream` if `policy` does: otherwise [`IpcError::PeerRefused`] (the
/// caller drops `stream`, which closes the connection).
pub(crate) fn admit(policy: &PeerPolicy, stream: &UnixStream) -> Result<()> {
    let credentials = PeerCredentials::of(stream.as_fd())
        .ok_or_else(|| IpcError::io("reading the peer's credentials (SO_PEERCRED)", std::io::Error::last_os_error()))?;
    if policy.admits(&credentials) { Ok(()) } else { Err(IpcError::PeerRefused { credentials }) }
}

/// The socket address of `name` in the abstract namespace.
fn abstract_address(name: &[u8]) -> Result<SocketAddr> {
    SocketAddr::from_abstract_name(name).map_err(|e| IpcError::io("naming an abstract IPC socket", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> String {
        format!("cuda-mem-ipc-test-{}", uuid::Uuid::new_v4())
    }

    #[test]
    fn abstract_names_connect_and_a_taken_name_is_refused() {
        let name = name();
        let listener = ChannelListener::bind_abstract(&name).unwrap();
        assert!(matches!(
            ChannelListener::bind_abstract(&name),
            Err(IpcError::Io { context, .. }) if context.contains("binding")
        ));
        std::thread::scope(|s| {
            s.spawn(|| Channel::connect_abstract(&name).unwrap().send(7, b"hello", &[]).unwrap());
            let channel = listener.accept().unwrap();
            assert_eq!(channel.recv().unwrap().payload, b"hello");
            let credentials = channel.peer_credentials().unwrap();
            assert_eq!((credentials.pid, credentials.uid), (std::process::id(), rustix::process::geteuid().as_raw()));
        });
        drop(listener);
        assert!(Channel::connect_abstract(&name).is_err(), "gone with the listener");
        assert!(matches!(Channel::connect_abstract(vec![b'x'; 200]), Err(IpcError::Io { .. })));
    }

    #[test]
    fn a_refused_peer_is_an_error_and_the_listener_goes_on() {
        let name = name();
        let me = std::process::id();
        let listener = ChannelListener::bind_abstract(&name)
            .unwrap()
            .with_policy(PeerPolicy::Allow(Arc::new(move |peer: &PeerCredentials| peer.pid != me)));
        let refused = Channel::connect_abstract(&name).unwrap();
        let error = listener.accept().unwrap_err();
        assert!(matches!(&error, IpcError::PeerRefused { credentials } if credentials.pid == me), "{error}");
        assert!(error.to_string().contains(&format!("process {me}")), "{error}");
        assert!(matches!(refused.recv(), Err(IpcError::PeerClosed)), "its connection was closed");
        let listener = listener.with_policy(PeerPolicy::AnyUser);
        let _admitted = Channel::connect_abstract(&name).unwrap();
        assert!(listener.accept().is_ok());
        assert!(PeerPolicy::SameUser.admits(&PeerCredentials {
            pid: 1,
            uid: rustix::process::geteuid().as_raw(),
            gid: 0
        }));
        assert!(!PeerPolicy::SameUser.admits(&PeerCredentials { pid: 1, uid: u32::MAX - 1, gid: 0 }));
        assert_eq!(format!("{:?}", listener.policy()), "AnyUser");
    }
}
