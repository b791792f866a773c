//! Certificates for TLS tests, made at test time in Rust (rcgen, with ring).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use tempfile::TempDir;

use crate::server::temp_dir;
use crate::TestkitError;

/// A fresh certificate authority with a server and a client certificate signed by it, in a
/// temporary directory of their own (removed on drop). Made in-process with
/// [rcgen](https://docs.rs/rcgen) (no `openssl` command needed): EC P-256 keys, valid from an
/// hour ago (some slack for clock steps) for two days.
///
/// - the server certificate is valid for `127.0.0.1`, `::1` and `localhost`;
/// - the client certificate is for TLS client authentication (`tls-auth-clients yes`).
///
/// Every call makes a new CA, so two `TestCertificates` do not trust each other.
///
/// ```no_run
/// use lockkit_testkit::{RedisServer, ServerOptions, TestCertificates};
///
/// # async fn demo() -> Result<(), lockkit_testkit::TestkitError> {
/// let certs = TestCertificates::generate()?;
/// let server = RedisServer::start_with(ServerOptions::new().tls(&certs)).await?;
/// assert!(server.url().starts_with("rediss://"));
/// let ca_pem = certs.ca_pem()?; // give this to the client as its trusted root
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TestCertificates {
    dir: TempDir,
}

/// How long before "now" the certificates become valid.
const BACKDATE: Duration = Duration::from_secs(60 * 60);
/// How long after "now" they stay valid.
const VALIDITY: Duration = Duration::from_secs(2 * 24 * 60 * 60);

impl TestCertificates {
    /// Makes a CA, a server and a client certificate (`ca.crt`, `server.crt`/`server.key`,
    /// `client.crt`/`client.key`, PEM, in [`dir`](TestCertificates::dir)). Takes a few
    /// milliseconds; blocking (it writes the files).
    ///
    /// # Errors
    /// [`TestkitError::Certificates`] if a key or certificate cannot be made,
    /// [`TestkitError::TempDir`] or [`TestkitError::Io`] if the files cannot be written.
    pub fn generate() -> Result<TestCertificates, TestkitError> {
        let certs = TestCertificates { dir: temp_dir()? };
        let (from, until) = validity()?;
        // rcgen takes `time::OffsetDateTime`s; offsets from its epoch avoid naming the crate.
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        let (not_before, not_after) = (epoch + from, epoch + until);

        let mut ca = CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(DnType::CommonName, "lockkit test CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca.not_before = not_before;
        ca.not_after = not_after;
        let ca = CertifiedIssuer::self_signed(ca, new_key()?)
            .map_err(|e| certificate_error("signing the CA certificate", e))?;
        certs.write("ca.crt", &ca.pem())?;

        let server_names = vec![
            SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            SanType::IpAddress(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            SanType::DnsName(
                "localhost"
                    .try_into()
                    .map_err(|e| certificate_error("naming localhost", e))?,
            ),
        ];
        let leaves = [
            (
                "server",
                "localhost",
                ExtendedKeyUsagePurpose::ServerAuth,
                server_names,
            ),
            (
                "client",
                "lockkit test client",
                ExtendedKeyUsagePurpose::ClientAuth,
                Vec::new(),
            ),
        ];
        for (stem, common_name, usage, names) in leaves {
            let mut leaf = CertificateParams::default();
            leaf.distinguished_name = rcgen::DistinguishedName::new();
            leaf.distinguished_name
                .push(DnType::CommonName, common_name);
            leaf.subject_alt_names = names;
            leaf.is_ca = IsCa::ExplicitNoCa;
            leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            leaf.extended_key_usages = vec![usage];
            leaf.use_authority_key_identifier_extension = true;
            leaf.not_before = not_before;
            leaf.not_after = not_after;
            let key = new_key()?;
            let cert = leaf
                .signed_by(&key, &ca)
                .map_err(|e| certificate_error(&format!("signing the {stem} certificate"), e))?;
            certs.write(&format!("{stem}.crt"), &cert.pem())?;
            certs.write(&format!("{stem}.key"), &key.serialize_pem())?;
        }
        Ok(certs)
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate (PEM): what a client must trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The server certificate (PEM), for `--tls-cert-file`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.crt")
    }

    /// The server's private key (PEM, PKCS#8), for `--tls-key-file`.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }

    /// A client certificate (PEM) signed by the CA.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path().join("client.crt")
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path().join("client.key")
    }

    /// The CA certificate's PEM bytes.
    pub fn ca_pem(&self) -> Result<Vec<u8>, TestkitError> {
        self.read(&self.ca_cert())
    }

    /// The client certificate's and its key's PEM bytes.
    pub fn client_pem(&self) -> Result<(Vec<u8>, Vec<u8>), TestkitError> {
        Ok((
            self.read(&self.client_cert())?,
            self.read(&self.client_key())?,
        ))
    }

    fn read(&self, path: &Path) -> Result<Vec<u8>, TestkitError> {
        std::fs::read(path).map_err(|e| TestkitError::io(format!("reading {}", path.display()), e))
    }

    fn write(&self, name: &str, text: &str) -> Result<(), TestkitError> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text)
            .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
    }
}

/// A new EC P-256 key (rcgen's default algorithm, ECDSA with SHA-256).
fn new_key() -> Result<KeyPair, TestkitError> {
    KeyPair::generate().map_err(|e| certificate_error("generating a P-256 key", e))
}

/// The validity window, as times since the Unix epoch: from [`BACKDATE`] ago to [`VALIDITY`]
/// from now.
fn validity() -> Result<(Duration, Duration), TestkitError> {
    let now =
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|e| TestkitError::Certificates {
                detail: format!("the system clock is before 1970: {e}"),
            })?;
    Ok((now.saturating_sub(BACKDATE), now.saturating_add(VALIDITY)))
}

fn certificate_error(context: &str, err: impl std::fmt::Display) -> TestkitError {
    TestkitError::Certificates {
        detail: format!("{context}: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
    use webpki::{EndEntityCert, KeyUsage, ALL_VERIFICATION_ALGS};

    fn der(path: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(path).unwrap()
    }

    /// Verifies `leaf` against `ca` for `usage`, as rustls does during a handshake.
    fn verify(ca: &Path, leaf: &Path, usage: KeyUsage) -> Result<(), webpki::Error> {
        let ca = der(ca);
        let anchor = webpki::anchor_from_trusted_cert(&ca)?;
        let leaf = der(leaf);
        let leaf = EndEntityCert::try_from(&leaf)?;
        leaf.verify_for_usage(
            ALL_VERIFICATION_ALGS,
            &[anchor],
            &[],
            UnixTime::now(),
            usage,
            None,
            None,
        )?;
        Ok(())
    }

    #[test]
    fn generates_a_ca_and_two_signed_certificates() {
        let certs = TestCertificates::generate().unwrap();
        for (path, label) in [
            (certs.ca_cert(), "CERTIFICATE"),
            (certs.server_cert(), "CERTIFICATE"),
            (certs.server_key(), "PRIVATE KEY"),
            (certs.client_cert(), "CERTIFICATE"),
            (certs.client_key(), "PRIVATE KEY"),
        ] {
            let text = std::fs::read_to_string(&path).unwrap();
            // PKCS#8 keys, as redis-server (OpenSSL) and rustls both read them.
            assert!(
                text.starts_with(&format!("-----BEGIN {label}-----")),
                "{}: {text}",
                path.display()
            );
            assert!(path.starts_with(certs.dir()));
        }

        let (ca, server, client) = (certs.ca_cert(), certs.server_cert(), certs.client_cert());
        verify(&ca, &server, KeyUsage::server_auth()).unwrap();
        verify(&ca, &client, KeyUsage::client_auth()).unwrap();
        // Each certificate is for its own purpose only.
        assert!(verify(&ca, &server, KeyUsage::client_auth()).is_err());
        assert!(verify(&ca, &client, KeyUsage::server_auth()).is_err());

        let server = der(&server);
        let server = EndEntityCert::try_from(&server).unwrap();
        for name in ["127.0.0.1", "::1", "localhost"] {
            let name = ServerName::try_from(name).unwrap();
            server.verify_is_valid_for_subject_name(&name).unwrap();
        }
        let elsewhere = ServerName::try_from("example.com").unwrap();
        assert!(server.verify_is_valid_for_subject_name(&elsewhere).is_err());

        let other = TestCertificates::generate().unwrap();
        assert!(
            verify(
                &other.ca_cert(),
                &certs.server_cert(),
                KeyUsage::server_auth()
            )
            .is_err(),
            "a second CA does not vouch for the first one's certificates"
        );
    }

    #[test]
    fn the_files_go_with_the_value() {
        let certs = TestCertificates::generate().unwrap();
        let dir = certs.dir().to_owned();
        assert!(dir.is_dir());
        drop(certs);
        assert!(!dir.exists());
    }
}
