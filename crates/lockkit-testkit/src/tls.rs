//! Certificates for TLS tests, made at test time with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::server::TempDir;
use crate::TestkitError;

/// A fresh certificate authority with a server and a client certificate signed by it, in a
/// temporary directory of their own (removed on drop). Made with the `openssl` command (Debian
/// package `openssl`): EC P-256 keys, valid for two days.
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

/// The extensions of each certificate, as `openssl x509 -extfile` reads them.
const CA_EXTENSIONS: &str = "basicConstraints=critical,CA:TRUE\n\
                             keyUsage=critical,keyCertSign,cRLSign\n\
                             subjectKeyIdentifier=hash\n";
const SERVER_EXTENSIONS: &str = "basicConstraints=critical,CA:FALSE\n\
                                 keyUsage=critical,digitalSignature\n\
                                 extendedKeyUsage=serverAuth\n\
                                 subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n\
                                 authorityKeyIdentifier=keyid\n";
const CLIENT_EXTENSIONS: &str = "basicConstraints=critical,CA:FALSE\n\
                                 keyUsage=critical,digitalSignature\n\
                                 extendedKeyUsage=clientAuth\n\
                                 authorityKeyIdentifier=keyid\n";

impl TestCertificates {
    /// Makes a CA, a server and a client certificate. Runs `openssl` a few times (tens of
    /// milliseconds); blocking.
    pub fn generate() -> Result<TestCertificates, TestkitError> {
        let dir = TempDir::new()?;
        let certs = TestCertificates { dir };
        certs.write("ca.ext", CA_EXTENSIONS)?;
        certs.write("server.ext", SERVER_EXTENSIONS)?;
        certs.write("client.ext", CLIENT_EXTENSIONS)?;
        certs.key("ca.key")?;
        certs.openssl(&[
            "req",
            "-new",
            "-x509",
            "-key",
            "ca.key",
            "-subj",
            "/CN=lockkit test CA",
            "-days",
            "2",
            "-out",
            "ca.crt",
            // `req -x509` reads extensions from a config section; give them explicitly.
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ])?;
        certs.signed("server", "/CN=localhost")?;
        certs.signed("client", "/CN=lockkit test client")?;
        Ok(certs)
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// The CA certificate (PEM): what a client must trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.path.join("ca.crt")
    }

    /// The server certificate (PEM), for `--tls-cert-file`.
    pub fn server_cert(&self) -> PathBuf {
        self.dir.path.join("server.crt")
    }

    /// The server's private key (PEM, PKCS#8), for `--tls-key-file`.
    pub fn server_key(&self) -> PathBuf {
        self.dir.path.join("server.key")
    }

    /// A client certificate (PEM) signed by the CA.
    pub fn client_cert(&self) -> PathBuf {
        self.dir.path.join("client.crt")
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key(&self) -> PathBuf {
        self.dir.path.join("client.key")
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
        let path = self.dir.path.join(name);
        std::fs::write(&path, text)
            .map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
    }

    /// A new P-256 private key in `name`.
    fn key(&self, name: &str) -> Result<(), TestkitError> {
        self.openssl(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            name,
        ])
    }

    /// `<stem>.key` and `<stem>.crt`, signed by the CA with the extensions in `<stem>.ext`.
    fn signed(&self, stem: &str, subject: &str) -> Result<(), TestkitError> {
        let (key, csr, crt, ext) = (
            format!("{stem}.key"),
            format!("{stem}.csr"),
            format!("{stem}.crt"),
            format!("{stem}.ext"),
        );
        self.key(&key)?;
        self.openssl(&["req", "-new", "-key", &key, "-subj", subject, "-out", &csr])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ])
    }

    /// Runs `openssl <args>` in the directory.
    fn openssl(&self, args: &[&str]) -> Result<(), TestkitError> {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir.path)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| TestkitError::Certificates {
                detail: format!("running `openssl {}`: {e}", args.join(" ")),
            })?;
        if output.status.success() {
            Ok(())
        } else {
            Err(TestkitError::Certificates {
                detail: format!(
                    "`openssl {}` {}: {}",
                    args.join(" "),
                    output.status,
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_a_ca_and_two_signed_certificates() {
        let certs = TestCertificates::generate().unwrap();
        for path in [
            certs.ca_cert(),
            certs.server_cert(),
            certs.server_key(),
            certs.client_cert(),
            certs.client_key(),
        ] {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(text.starts_with("-----BEGIN "), "{}", path.display());
        }
        for leaf in ["server.crt", "client.crt"] {
            certs
                .openssl(&["verify", "-CAfile", "ca.crt", leaf])
                .unwrap();
        }
        let other = TestCertificates::generate().unwrap();
        assert!(
            other
                .openssl(&[
                    "verify",
                    "-CAfile",
                    "ca.crt",
                    &certs.server_cert().display().to_string()
                ])
                .is_err(),
            "a second CA does not vouch for the first one's certificates"
        );
    }
}
