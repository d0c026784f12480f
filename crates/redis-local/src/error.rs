//! Why a server could not be started.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use crate::binary::INSTALL_HINT;
use crate::server::START_DEADLINE;

/// Why a server (or a cluster) could not be started. The panicking starters
/// ([`ServerBuilder::start`](crate::ServerBuilder::start), [`Cluster::start`](crate::Cluster::start))
/// panic with this message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No `redis-server` binary: the message says where it was looked for, then how to install it.
    #[error("{0}: {INSTALL_HINT}")]
    NotInstalled(String),
    /// The binary exists but could not be run.
    #[error("cannot start {}: {source}", bin.display())]
    Spawn {
        /// The binary.
        bin: PathBuf,
        /// What `spawn` said.
        source: io::Error,
    },
    /// The server exited while starting, for another reason than its port being taken.
    #[error("redis-server on port {port} exited during startup ({status})\n{log_tail}")]
    Exited {
        /// The port it was to listen on.
        port: u16,
        /// How it ended.
        status: ExitStatus,
        /// The end of its log.
        log_tail: String,
    },
    /// The server did not answer `PING` in time.
    #[error(
        "redis-server on 127.0.0.1:{port} did not answer PING within {START_DEADLINE:?} \
         (last reply {last_reply:?})\n{log_tail}"
    )]
    NotReady {
        /// Its port.
        port: u16,
        /// The first line of the last reply on that port, if any.
        last_reply: String,
        /// The end of its log.
        log_tail: String,
    },
    /// Every port tried was taken by the time the server bound it.
    #[error("redis-server found no free port in {attempts} attempts\n{log_tail}")]
    NoFreePort {
        /// How many ports were tried.
        attempts: usize,
        /// The end of its log.
        log_tail: String,
    },
    /// What was asked cannot be done with this binary or on this machine (a fake clock without
    /// libfaketime, or with a binary that hangs under it): the message says why and what to do.
    #[error("{0}")]
    Unsupported(String),
    /// A file or directory of the server could not be made.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
}
