//! How a process authenticates to NATS and secures the connection, with the names of the NATS
//! tools (contract §7): user and password or token in `NATS_URL` or `NATS_USER` /
//! `NATS_PASSWORD` / `NATS_TOKEN`, a creds file (`NATS_CREDS`), an nkey seed file (`NATS_NKEY`),
//! TLS with `tls://` URLs, `NATS_CA` and a client certificate (`NATS_CERT`, `NATS_KEY`).
//!
//! Everything is checked once at startup ([`NatsAccess::resolve`]): one way to authenticate,
//! readable files, a valid seed. Errors name the setting, never a value or a path. Secrets go
//! to the client's connect options only: no address, `Debug` output or error holds one.

use std::path::PathBuf;

use crate::error::StoreError;
use crate::nats_url::NatsCredentials;

/// The settings as the process found them (flags and environment).
#[derive(Clone, Default)]
pub struct NatsAccess {
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// Creds file: a user JWT and its nkey seed.
    pub creds_file: Option<PathBuf>,
    /// File holding an nkey seed.
    pub nkey_file: Option<PathBuf>,
    /// CA certificates (PEM) the server's certificate must chain to; implies TLS.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), with `key_file`; implies TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Debug for NatsAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsAccess")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| ".."))
            .field("token", &self.token.as_ref().map(|_| ".."))
            .field("creds_file", &self.creds_file.is_some())
            .field("nkey_file", &self.nkey_file.is_some())
            .field("ca_file", &self.ca_file.is_some())
            .field("cert_file", &self.cert_file.is_some())
            .finish_non_exhaustive()
    }
}

/// One way to authenticate, with file contents read.
#[derive(Clone)]
enum Auth {
    None,
    UserPassword {
        user: String,
        password: String,
    },
    Token(String),
    /// The creds file's content.
    Creds(String),
    /// An nkey seed.
    Nkey(String),
}

/// [`NatsAccess`] checked: apply it to the options of each connection attempt.
#[derive(Clone)]
pub struct ResolvedAccess {
    auth: Auth,
    ca_file: Option<PathBuf>,
    client_certificate: Option<(PathBuf, PathBuf)>,
    require_tls: bool,
}

impl std::fmt::Debug for ResolvedAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match &self.auth {
            Auth::None => "none",
            Auth::UserPassword { .. } => "user and password",
            Auth::Token(_) => "token",
            Auth::Creds(_) => "creds file",
            Auth::Nkey(_) => "nkey",
        };
        f.debug_struct("ResolvedAccess")
            .field("auth", &auth)
            .field("require_tls", &self.require_tls)
            .finish_non_exhaustive()
    }
}

fn misconfigured(message: impl Into<String>) -> StoreError {
    StoreError::Misconfigured(message.into())
}

impl NatsAccess {
    /// Checks the settings together with the credentials found in `NATS_URL` (see
    /// [`crate::nats_url::split_credentials`]) and `tls_url` (whether any URL is `tls://`).
    /// Several ways to authenticate at once are refused rather than guessed between.
    pub fn resolve(
        &self,
        url_credentials: Option<NatsCredentials>,
        tls_url: bool,
    ) -> Result<ResolvedAccess, StoreError> {
        let mut given: Vec<(&str, Auth)> = Vec::new();
        match url_credentials {
            Some(NatsCredentials::UserPassword { user, password }) => {
                given.push((
                    "a user and password in NATS_URL",
                    Auth::UserPassword { user, password },
                ));
            }
            Some(NatsCredentials::Token(token)) => {
                given.push(("a token in NATS_URL", Auth::Token(token)));
            }
            None => {}
        }
        match (&self.user, &self.password) {
            (Some(user), Some(password)) => given.push((
                "NATS_USER/NATS_PASSWORD",
                Auth::UserPassword {
                    user: user.clone(),
                    password: password.clone(),
                },
            )),
            (Some(_), None) => return Err(misconfigured("NATS_USER is set without NATS_PASSWORD")),
            (None, Some(_)) => return Err(misconfigured("NATS_PASSWORD is set without NATS_USER")),
            (None, None) => {}
        }
        if let Some(token) = &self.token {
            given.push(("NATS_TOKEN", Auth::Token(token.clone())));
        }
        if let Some(path) = &self.creds_file {
            let bytes = crate::tls::read("NATS_CREDS", path)?;
            let creds = String::from_utf8(bytes)
                .ok()
                .filter(|creds| async_nats::ConnectOptions::with_credentials(creds).is_ok())
                .ok_or_else(|| misconfigured("NATS_CREDS is not a NATS credentials file"))?;
            given.push(("NATS_CREDS", Auth::Creds(creds)));
        }
        if let Some(path) = &self.nkey_file {
            let bytes = crate::tls::read("NATS_NKEY", path)?;
            let seed = String::from_utf8(bytes)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|seed| nkeys::KeyPair::from_seed(seed).is_ok())
                .ok_or_else(|| misconfigured("NATS_NKEY does not hold an nkey seed"))?;
            given.push(("NATS_NKEY", Auth::Nkey(seed)));
        }
        if given.len() > 1 {
            let names: Vec<&str> = given.iter().map(|(name, _)| *name).collect();
            return Err(misconfigured(format!(
                "NATS credentials are given more than once ({}); give one",
                names.join(", ")
            )));
        }
        let auth = given.pop().map_or(Auth::None, |(_, auth)| auth);

        if let Some(path) = &self.ca_file {
            crate::tls::read_certificates("NATS_CA", path)?;
        }
        let client_certificate = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                crate::tls::read_certificates("NATS_CERT", cert)?;
                crate::tls::check_private_key("NATS_KEY", key)?;
                Some((cert.clone(), key.clone()))
            }
            (None, None) => None,
            _ => return Err(misconfigured("NATS_CERT and NATS_KEY go together")),
        };
        let require_tls = tls_url || self.ca_file.is_some() || client_certificate.is_some();
        if require_tls {
            crate::tls::install_crypto_provider();
        }
        Ok(ResolvedAccess {
            auth,
            ca_file: self.ca_file.clone(),
            client_certificate,
            require_tls,
        })
    }
}

impl ResolvedAccess {
    /// `options` with these credentials and TLS settings.
    pub fn apply(
        &self,
        options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, StoreError> {
        let mut options = match &self.auth {
            Auth::None => options,
            Auth::UserPassword { user, password } => {
                options.user_and_password(user.clone(), password.clone())
            }
            Auth::Token(token) => options.token(token.clone()),
            Auth::Creds(creds) => options
                .credentials(creds)
                .map_err(|_| misconfigured("NATS_CREDS is not a NATS credentials file"))?,
            Auth::Nkey(seed) => options.nkey(seed.clone()),
        };
        if let Some(ca) = &self.ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client_certificate {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(options.require_tls(self.require_tls))
    }

    /// Whether the connection must use TLS.
    pub fn tls(&self) -> bool {
        self.require_tls
    }
}

/// What a failed connection attempt means for startup.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AttemptFailure {
    /// Retrying cannot help: stop with this message (no secret in it).
    Fatal(String),
    /// The server may come up later.
    Transient,
}

/// Classifies a failed connection attempt: refused credentials and TLS failures are fatal.
pub(crate) fn classify(error: &async_nats::ConnectError) -> AttemptFailure {
    use async_nats::ConnectErrorKind as Kind;
    const CHECK: &str = "check the credentials in NATS_URL, NATS_USER/NATS_PASSWORD, NATS_TOKEN, NATS_CREDS or NATS_NKEY";
    match error.kind() {
        Kind::AuthorizationViolation => AttemptFailure::Fatal(format!(
            "NATS refused the credentials (authorization violation); {CHECK}"
        )),
        Kind::Authentication => AttemptFailure::Fatal(format!(
            "NATS authentication failed (cannot sign the server's nonce); {CHECK}"
        )),
        Kind::Tls => AttemptFailure::Fatal(format!(
            "TLS with NATS failed ({}); check NATS_CA, NATS_CERT and NATS_KEY",
            crate::tls::tls_failure(error).unwrap_or_else(|| "TLS setup".into())
        )),
        _ => match crate::tls::tls_failure(error) {
            Some(tls) => AttemptFailure::Fatal(format!(
                "TLS with NATS failed ({tls}); check NATS_CA, NATS_CERT and NATS_KEY"
            )),
            None => AttemptFailure::Transient,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, content: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mrt-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    #[test]
    fn one_way_to_authenticate() {
        let access = NatsAccess {
            user: Some("u".into()),
            password: Some("pw-s3cret".into()),
            ..NatsAccess::default()
        };
        let resolved = access.resolve(None, false).unwrap();
        assert!(matches!(resolved.auth, Auth::UserPassword { .. }));
        assert!(!resolved.tls());
        let shown = format!("{access:?} {resolved:?}");
        assert!(!shown.contains("s3cret"), "{shown}");

        let err = access
            .resolve(Some(NatsCredentials::Token("t0k3n".into())), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a token in NATS_URL, NATS_USER/NATS_PASSWORD"),
            "{err}"
        );
        assert!(!err.contains("t0k3n") && !err.contains("s3cret"), "{err}");

        let half = NatsAccess {
            password: Some("pw".into()),
            ..NatsAccess::default()
        };
        let err = half.resolve(None, false).unwrap_err().to_string();
        assert!(
            err.contains("NATS_PASSWORD is set without NATS_USER"),
            "{err}"
        );
    }

    #[test]
    fn files_are_checked_at_startup() {
        let seed = nkeys::KeyPair::new_user().seed().unwrap();
        let nkey = NatsAccess {
            nkey_file: Some(temp_file("user.nk", &format!("{seed}\n"))),
            ..NatsAccess::default()
        };
        let resolved = nkey.resolve(None, false).unwrap();
        assert!(matches!(&resolved.auth, Auth::Nkey(s) if *s == seed));
        assert!(!format!("{resolved:?}").contains(&seed));

        // Refused files: (access, what the error says, a secret it must not repeat).
        let refused = [
            (
                NatsAccess {
                    nkey_file: Some(temp_file("bad.nk", "SUnotaseed")),
                    ..NatsAccess::default()
                },
                "NATS_NKEY does not hold an nkey seed",
                Some("SUnotaseed"),
            ),
            (
                NatsAccess {
                    creds_file: Some(temp_file("bad.creds", "not creds")),
                    ..NatsAccess::default()
                },
                "NATS_CREDS is not a NATS credentials file",
                None,
            ),
            (
                NatsAccess {
                    cert_file: Some(temp_file("c.pem", "")),
                    ..NatsAccess::default()
                },
                "NATS_CERT and NATS_KEY go together",
                None,
            ),
        ];
        for (access, says, secret) in refused {
            let err = access.resolve(None, false).unwrap_err().to_string();
            assert!(err.contains(says), "{err}");
            if let Some(secret) = secret {
                assert!(!err.contains(secret), "{err}");
            }
        }
    }

    #[test]
    fn tls_urls_and_tls_files_require_tls() {
        assert!(NatsAccess::default().resolve(None, true).unwrap().tls());
        assert!(!NatsAccess::default().resolve(None, false).unwrap().tls());
    }

    #[test]
    fn refused_credentials_and_tls_failures_are_fatal() {
        use async_nats::{ConnectError, ConnectErrorKind};
        let refused = ConnectError::new(ConnectErrorKind::AuthorizationViolation);
        assert!(
            matches!(classify(&refused), AttemptFailure::Fatal(m) if m.contains("refused the credentials"))
        );
        let untrusted = ConnectError::with_source(
            ConnectErrorKind::Io,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            ),
        );
        assert!(
            matches!(classify(&untrusted), AttemptFailure::Fatal(m) if m.contains("UnknownIssuer"))
        );
        let refused_tcp = ConnectError::with_source(
            ConnectErrorKind::Io,
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(classify(&refused_tcp), AttemptFailure::Transient);
    }
}
