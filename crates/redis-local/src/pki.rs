//! Certificates for TLS tests (feature `pki`), made fresh for each test with rcgen: a CA, a server certificate
//! it signed for `localhost` and `127.0.0.1`, a client certificate it signed (mutual TLS), and
//! a second, unrelated CA (the "wrong CA" case). PEM files in a temporary directory, removed
//! on drop.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The files of one test's certificates, removed on drop.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Makes every certificate and key and writes them out.
    ///
    /// # Panics
    ///
    /// If a certificate cannot be made or a file cannot be written.
    pub fn generate() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("redlock-pki-")
            .tempdir()
            .expect("temp dir for certificates");
        let write = |name: &str, pem: String| {
            fs::write(dir.path().join(name), pem).unwrap_or_else(|e| panic!("write {name}: {e}"))
        };
        let (ca_pem, issuer) = ca("redlock test CA");
        write("ca.pem", ca_pem);
        let (other_pem, _) = ca("some other CA");
        write("other-ca.pem", other_pem);
        let (cert, key) = leaf(
            &issuer,
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server.pem", cert);
        write("server.key", key);
        let (cert, key) = leaf(&issuer, &[], ExtendedKeyUsagePurpose::ClientAuth);
        write("client.pem", cert);
        write("client.key", key);
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.file("ca.pem")
    }
    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.file("other-ca.pem")
    }
    /// The server's certificate, for `localhost` and `127.0.0.1`.
    pub fn server_cert(&self) -> PathBuf {
        self.file("server.pem")
    }
    /// The server certificate's key.
    pub fn server_key(&self) -> PathBuf {
        self.file("server.key")
    }
    /// A client certificate (mutual TLS) signed by [`ca`](Self::ca).
    pub fn client_cert(&self) -> PathBuf {
        self.file("client.pem")
    }
    /// The client certificate's key.
    pub fn client_key(&self) -> PathBuf {
        self.file("client.key")
    }
    /// The directory of the PEM files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("self-signed CA");
    (cert.pem(), Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("leaf params");
    params
        .distinguished_name
        .push(DnType::CommonName, "redlock test");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("signed leaf");
    (cert.pem(), key.serialize_pem())
}
