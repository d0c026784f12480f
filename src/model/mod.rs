//! Plain data and rules.

pub mod addr;
pub(crate) mod config;
pub mod error;
pub(crate) mod event;
pub(crate) mod eviction;
pub(crate) mod fence_floor;
pub mod keys;
pub(crate) mod lock;
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
