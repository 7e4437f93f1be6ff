//! TLS pieces shared by the NATS and Redis connections: the one crypto provider (ring, the
//! provider the workspace's HTTP clients use), checks of certificate and key files made at
//! startup so a bad file is a clear error, and the TLS failure hidden in a connection error.
//!
//! Messages name the setting (`NATS_CA`) and never a path or file content.

use std::error::Error;
use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::StoreError;

/// Installs ring as the process's rustls provider unless one is installed already. Clients
/// that build their TLS configuration with `ClientConfig::builder()` (async-nats, redis) use it.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The PEM certificates in the file named by setting `name`; at least one.
pub(crate) fn read_certificates(
    name: &str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let bytes = read(name, path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| misconfigured(format!("{name} is not a PEM certificate file")))?;
    if certificates.is_empty() {
        return Err(misconfigured(format!("{name} holds no PEM certificate")));
    }
    Ok(certificates)
}

/// Checks that the file named by setting `name` holds a PEM private key.
pub(crate) fn check_private_key(name: &str, path: &Path) -> Result<(), StoreError> {
    let bytes = read(name, path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map(drop)
        .map_err(|_| misconfigured(format!("{name} holds no PEM private key")))
}

/// The whole file named by setting `name`.
pub(crate) fn read(name: &str, path: &Path) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| misconfigured(format!("cannot read {name} ({})", e.kind())))
}

fn misconfigured(message: String) -> StoreError {
    StoreError::Misconfigured(message)
}

/// The TLS failure anywhere in `error`'s source chain (an untrusted or mismatched server
/// certificate, a refused client certificate), as rustls words it: never a secret.
pub(crate) fn tls_failure(error: &(dyn Error + 'static)) -> Option<String> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // `io::Error::source` skips the error it wraps: look at that one too.
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(inner.to_string());
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_error_is_found_inside_io_errors() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let found = tls_failure(&io).expect("found");
        assert!(found.contains("UnknownIssuer"), "{found}");
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(tls_failure(&plain), None);
    }

    #[test]
    fn bad_files_name_the_setting_and_not_the_path() {
        let missing = Path::new("/nonexistent/secret-dir/ca.pem");
        let err = read_certificates("NATS_CA", missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read NATS_CA"), "{err}");
        assert!(!err.contains("secret-dir"), "{err}");
        let dir = std::env::temp_dir().join(format!("mrt-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-pem");
        std::fs::write(&file, "hunter2 is not a certificate").unwrap();
        let err = read_certificates("REDIS_CA", &file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("REDIS_CA holds no PEM certificate"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = check_private_key("NATS_KEY", &file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("NATS_KEY holds no PEM private key"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
