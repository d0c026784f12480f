//! The model: plain data and the rules on it — what a caller configures ([`Config`] and its
//! [`Builder`], node addresses, TLS settings), what it holds ([`Lock`], [`Token`]), what it is
//! told ([`Error`], [`NodeFault`], [`Stats`], events, a status read's [`NodeStatus`]), the keys
//! this crate writes and the namespace rule that guards them (`keys.rs`), and one attempt's
//! quorum decision (`round.rs`: votes, deadlines, validity — arithmetic on answers, so it sits
//! here with the data it decides on, below the wire).
//!
//! What it may not touch: any other layer of the crate (it imports only itself), sockets,
//! threads, and the clock — a time is always an argument. Everything above builds on these
//! types; nothing here knows how bytes reach a node.
//!
//! [`Config`]: config::Config
//! [`Builder`]: config::Builder
//! [`Lock`]: lock::Lock
//! [`Token`]: token::Token
//! [`Error`]: error::Error
//! [`NodeFault`]: error::NodeFault
//! [`Stats`]: stats::Stats
//! [`NodeStatus`]: node_status::NodeStatus

pub mod addr;
pub(crate) mod clock;
pub(crate) mod config;
pub mod error;
pub(crate) mod event;
pub(crate) mod eviction;
pub(crate) mod fence_floor;
pub mod keys;
pub(crate) mod lock;
pub(crate) mod lock_options;
pub(crate) mod mutation;
pub(crate) mod node_status;
pub mod round;
pub(crate) mod stats;
#[cfg(feature = "tls")]
pub(crate) mod tls;
pub(crate) mod token;
pub(crate) mod wire;
/// Without the `tls` feature no TLS connector can be made, and `rediss://` is refused when a
/// client is built.
#[cfg(not(feature = "tls"))]
pub(crate) mod tls {
    use crate::model::addr::{NodeAddr, TlsParams};
    use crate::model::error::Error;

    /// Never made in this build.
    #[derive(Debug, Clone)]
    pub(crate) enum Connector {}

    #[derive(Debug, Clone, Default)]
    pub(crate) struct TlsDefaults {
        pub params: TlsParams,
    }

    impl TlsDefaults {
        pub fn is_set(&self) -> bool {
            self.params != TlsParams::default()
        }
    }

    pub(crate) fn connectors(
        nodes: &[NodeAddr],
        _: &TlsDefaults,
    ) -> Result<Vec<Option<Connector>>, Error> {
        match nodes.iter().find(|n| n.tls.is_some()) {
            Some(n) => Err(Error::Config(format!(
                "{n}: rediss:// (TLS) needs redlock-mux built with its `tls` feature"
            ))),
            None => Ok(nodes.iter().map(|_| None).collect()),
        }
    }
}
