//! TLS settings of a client (`rediss://`), and with the `tls` feature their rustls configuration.
//!
//! Without the feature the settings are still accepted by the builder (so code compiles the same
//! either way), and [`ClientBuilder::build`](crate::ClientBuilder::build) refuses them, as it
//! refuses a `rediss://` URL, instead of connecting in plain text.

#[cfg(feature = "tls")]
use crate::error::Error;

/// What the builder was told about TLS. Key material is never shown by `Debug`.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM inputs with the CA certificates to trust instead of the system's.
    pub(crate) roots_pem: Vec<Vec<u8>>,
    /// A client certificate chain and its private key, both PEM.
    pub(crate) client_auth: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Whether any TLS setting was given.
    pub(crate) fn is_set(&self) -> bool {
        !self.roots_pem.is_empty() || self.client_auth.is_some()
    }
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("root_pem_inputs", &self.roots_pem.len())
            .field("client_certificate", &self.client_auth.is_some())
            .finish()
    }
}

/// The rustls configuration for `settings`: the given roots (or the system's), TLS 1.2 and 1.3
/// with ring's algorithms, the client certificate if any.
#[cfg(feature = "tls")]
pub(crate) fn config(settings: &TlsSettings) -> Result<fred::types::config::TlsConfig, Error> {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let invalid = |what: &str, err: &dyn std::fmt::Display| {
        Error::InvalidArgument(format!("TLS {what}: {err}"))
    };

    let mut roots = rustls::RootCertStore::empty();
    if settings.roots_pem.is_empty() {
        let native = rustls_native_certs::load_native_certs();
        for err in &native.errors {
            tracing::warn!(%err, "could not load some of the system's root certificates");
        }
        let (added, ignored) = roots.add_parsable_certificates(native.certs);
        tracing::debug!(added, ignored, "TLS trusts the system's root certificates");
    } else {
        for pem in &settings.roots_pem {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|err| invalid("root certificates", &err))?;
                roots
                    .add(cert)
                    .map_err(|err| invalid("root certificates", &err))?;
            }
        }
        if roots.is_empty() {
            return Err(Error::InvalidArgument(
                "TLS root certificates: the PEM input holds no certificate".into(),
            ));
        }
    }

    // An explicit provider: never depend on (or panic for lack of) a process-wide default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| invalid("configuration", &err))?
        .with_root_certificates(roots);
    let config = match &settings.client_auth {
        None => builder.with_no_client_auth(),
        Some((chain_pem, key_pem)) => {
            let chain = CertificateDer::pem_slice_iter(chain_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| invalid("client certificate", &err))?;
            if chain.is_empty() {
                return Err(Error::InvalidArgument(
                    "TLS client certificate: the PEM input holds no certificate".into(),
                ));
            }
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|err| invalid("client private key", &err))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|err| invalid("client certificate", &err))?
        }
    };
    Ok(fred::types::config::TlsConnector::from(config).into())
}
