//! How a parent names the channel it passes to a child: the environment variables
//! ([`CHANNEL_FD_ENV`], [`CHANNEL_INODE_ENV`]), and why a child cannot take what they name
//! ([`ChannelEnvError`]).

use std::ffi::OsString;
use std::os::fd::RawFd;

use rustix::fs::FileType;
use rustix::net::{AddressFamily, SocketType};

#[cfg(doc)]
use crate::{Channel, IpcError};

/// The environment variable holding the number of the child's channel descriptor.
pub const CHANNEL_FD_ENV: &str = "CUDA_MEM_IPC_CHANNEL_FD";

/// The environment variable holding the inode number of the child's channel socket.
///
/// [`Channel::from_env`] requires it and compares it with the descriptor's.
pub const CHANNEL_INODE_ENV: &str = "CUDA_MEM_IPC_CHANNEL_INODE";

/// Why a process cannot take the channel its parent passed ([`Channel::from_env`]): nothing
/// was taken. [`IpcError::ChannelEnv`] carries it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelEnvError {
    /// [`CHANNEL_FD_ENV`] is not set: this process was not given a channel.
    #[error("{CHANNEL_FD_ENV} is not set, so this process was not given a channel")]
    NoDescriptor,
    /// [`CHANNEL_INODE_ENV`] is not set, so the descriptor cannot be told from another file.
    #[error(
        "{CHANNEL_INODE_ENV} is not set, so descriptor {fd} cannot be told from another file with that number and \
         is not taken"
    )]
    NoInode {
        /// The descriptor [`CHANNEL_FD_ENV`] names.
        fd: RawFd,
    },
    /// A variable is not a non-negative integer.
    #[error("{variable} is {value:?}, not a non-negative integer")]
    NotANumber {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        value: OsString,
    },
    /// [`CHANNEL_FD_ENV`] is negative.
    #[error("{CHANNEL_FD_ENV} is {fd}, not a descriptor number")]
    NegativeDescriptor {
        /// The number it names.
        fd: RawFd,
    },
    /// The descriptor is not open.
    #[error("{CHANNEL_FD_ENV} names descriptor {fd}, which is not open here ({source})")]
    NotOpen {
        /// The descriptor.
        fd: RawFd,
        /// The system's answer (`EBADF`).
        #[source]
        source: std::io::Error,
    },
    /// The descriptor is not a socket.
    #[error("descriptor {fd} from {CHANNEL_FD_ENV} is a {:?}, not a socket", FileType::from_raw_mode(*.mode))]
    NotASocket {
        /// The descriptor.
        fd: RawFd,
        /// Its `st_mode`.
        mode: u32,
    },
    /// The socket is not the one the parent passed.
    #[error(
        "descriptor {fd} from {CHANNEL_FD_ENV} is socket inode {found}, but {CHANNEL_INODE_ENV} says {expected}: it is \
         not the channel the parent passed (was the environment inherited from a grandparent?)"
    )]
    WrongInode {
        /// The descriptor.
        fd: RawFd,
        /// Its inode.
        found: u64,
        /// The inode [`CHANNEL_INODE_ENV`] names.
        expected: u64,
    },
    /// The socket's type cannot be read.
    #[error("cannot read the socket type of descriptor {fd} ({source})")]
    SocketTypeUnreadable {
        /// The descriptor.
        fd: RawFd,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The socket is not a stream socket.
    #[error(
        "descriptor {fd} from {CHANNEL_FD_ENV} is a socket of type {:?}, not a stream socket",
        SocketType::from_raw(*.socket_type)
    )]
    NotAStreamSocket {
        /// The descriptor.
        fd: RawFd,
        /// Its type (`SO_TYPE`).
        socket_type: u32,
    },
    /// The socket's address cannot be read.
    #[error("cannot read the address of descriptor {fd} ({source})")]
    AddressUnreadable {
        /// The descriptor.
        fd: RawFd,
        /// The system's answer.
        #[source]
        source: std::io::Error,
    },
    /// The socket is not a Unix domain socket.
    #[error(
        "descriptor {fd} from {CHANNEL_FD_ENV} is a socket of family {:?}, not a Unix domain socket",
        AddressFamily::from_raw(*.family)
    )]
    NotAUnixSocket {
        /// The descriptor.
        fd: RawFd,
        /// Its address family.
        family: u16,
    },
    /// An earlier [`Channel::from_env`] of this process took the channel.
    #[error("the channel was already taken by an earlier Channel::from_env in this process")]
    AlreadyTaken,
}
