//! TLS settings for `rediss://` nodes (the `tls` feature): each node's client configuration,
//! made once when a client is built (the connection's TLS half is `runtime/tls_stream.rs`).
//!
//! Files are read once, when the client is built. Each node gets a session cache of its own:
//! a reconnect resumes the session (no certificate chain sent or checked again), counted in
//! [`IoStats::tls_resumed`](crate::IoStats::tls_resumed). One cache for all nodes would not do:
//! rustls keys it by server name, and nodes reached by IP address with one `tls_server_name`
//! share a name, so each would offer the others' tickets and fall back to full handshakes.

use std::path::Path;
use std::sync::Arc;

use rustls::client::Resumption;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// Sessions each node's cache keeps (a TLS 1.3 server hands out a few tickets per handshake,
/// each good for one resumption).
const SESSIONS_PER_NODE: usize = 8;

use crate::model::addr::{Endpoint, NodeAddr, TlsParams};
use crate::model::error::{Error, NodeFault};

/// What one TLS node connects with: the shared configuration and the name its certificate must
/// carry.
#[derive(Debug, Clone)]
pub(crate) struct Connector {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl Connector {
    /// A new client session, its ClientHello queued.
    pub fn start(&self) -> Result<ClientConnection, NodeFault> {
        ClientConnection::new(self.config.clone(), self.name.clone())
            .map_err(|e| NodeFault::Tls(e.to_string()))
    }
}

/// The [`Builder`](crate::Builder)'s TLS settings: the defaults of every `rediss://` address,
/// which the address's own options override.
#[derive(Debug, Clone, Default)]
pub(crate) struct TlsDefaults {
    pub params: TlsParams,
    /// A complete configuration given by the caller (`Builder::tls_config`): used as it is for
    /// the nodes without options of their own.
    pub config: Option<Arc<ClientConfig>>,
}

impl TlsDefaults {
    /// Whether the builder was given any TLS setting.
    pub fn is_set(&self) -> bool {
        self.params != TlsParams::default() || self.config.is_some()
    }
}

/// One connector per node (`None` for the plain ones). Files are read here, once, so that a
/// missing or unreadable one is a configuration error when the client is built, not a node
/// fault later.
pub(crate) fn connectors(
    nodes: &[NodeAddr],
    defaults: &TlsDefaults,
) -> Result<Vec<Option<Connector>>, Error> {
    // Nodes with the same files share what was read from them.
    let mut made: Vec<(TlsParams, Arc<ClientConfig>)> = Vec::new();
    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes {
        let (Some(own), Endpoint::Tcp { host, .. }) = (&node.tls, &node.endpoint) else {
            out.push(None);
            continue;
        };
        let params = merged(own, &defaults.params);
        let files = TlsParams {
            server_name: None,
            ..params.clone()
        };
        let config = match (&defaults.config, own == &TlsParams::default()) {
            // The caller's configuration, session cache included, as it is.
            (Some(config), true) => config.clone(),
            _ => {
                let shared = match made.iter().find(|(p, _)| *p == files) {
                    Some((_, config)) => config.clone(),
                    None => {
                        let config = Arc::new(client_config(&files)?);
                        made.push((files, config.clone()));
                        config
                    }
                };
                let mut own = (*shared).clone();
                own.resumption = Resumption::in_memory_sessions(SESSIONS_PER_NODE);
                Arc::new(own)
            }
        };
        let name = params.server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_owned()).map_err(|_| {
            Error::Config(format!(
                "{node}: \"{name}\" is not a valid TLS server name (give one with tls_server_name)"
            ))
        })?;
        out.push(Some(Connector { config, name }));
    }
    Ok(out)
}

fn merged(own: &TlsParams, defaults: &TlsParams) -> TlsParams {
    let (cert_file, key_file) = match (&own.cert_file, &own.key_file) {
        (Some(c), Some(k)) => (Some(c.clone()), Some(k.clone())),
        _ => (defaults.cert_file.clone(), defaults.key_file.clone()),
    };
    TlsParams {
        ca_file: own.ca_file.clone().or_else(|| defaults.ca_file.clone()),
        cert_file,
        key_file,
        server_name: own
            .server_name
            .clone()
            .or_else(|| defaults.server_name.clone()),
    }
}

fn file_error(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("TLS {what} {}: {e}", path.display()))
}

/// A rustls configuration: ring's crypto, TLS 1.2 and 1.3, the given CA file's certificates (or
/// the system's), a client certificate if given, and session resumption (rustls's default
/// in-memory cache).
fn client_config(files: &TlsParams) -> Result<ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots(files.ca_file.as_deref())?);
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "client certificate")?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("client key", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::Config(format!("TLS client certificate: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, e))?;
    if certs.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

fn roots(ca_file: Option<&Path>) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates(path, "CA file")? {
                roots
                    .add(cert)
                    .map_err(|e| file_error("CA file", path, e))?;
            }
        }
        None => {
            // Unreadable entries of the system store are skipped, as browsers do; an empty
            // store is an error, or every handshake would fail with a less helpful message.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(Error::Config(
                    "TLS: no trusted CA certificates found in the system's store; give the \
                     servers' CA with tls_ca=FILE (or Builder::tls_ca_file, --tls-ca)"
                        .into(),
                ));
            }
        }
    }
    Ok(roots)
}
