//! Credentials out of `NATS_URL`: `nats://user:password@host` (or `nats://token@host`) is split
//! into server addresses without credentials and the credentials themselves, which go to the
//! client's connect options. async-nats logs server addresses (at debug level, on every
//! connection attempt), so an address must never carry a secret.

/// Credentials found in a NATS URL list.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    /// `user:password@`.
    UserPassword { user: String, password: String },
    /// `token@` (a user part without a password).
    Token(String),
}

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .finish_non_exhaustive(),
            Self::Token(_) => f.write_str("Token(..)"),
        }
    }
}

/// Splits a comma-separated list of NATS URLs into the list without credentials and the
/// credentials of the first URL that has any (NATS takes one set per connection).
pub fn split_credentials(urls: &str) -> (String, Option<NatsCredentials>) {
    let mut credentials = None;
    let mut stripped = Vec::new();
    for url in urls.split(',') {
        let url = url.trim();
        let (scheme, rest) = match url.find("://") {
            Some(i) => url.split_at(i + 3),
            None => ("", url),
        };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                if credentials.is_none() && !userinfo.is_empty() {
                    credentials = Some(match userinfo.split_once(':') {
                        Some((user, password)) => NatsCredentials::UserPassword {
                            user: percent_decode(user),
                            password: percent_decode(password),
                        },
                        None => NatsCredentials::Token(percent_decode(userinfo)),
                    });
                }
                stripped.push(format!("{scheme}{}{tail}", &authority[at + 1..]));
            }
            None => stripped.push(url.to_owned()),
        }
    }
    (stripped.join(","), credentials)
}

/// Decodes `%XX` escapes (URL userinfo); anything malformed is kept as written.
fn percent_decode(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_leave_every_address() {
        let (urls, credentials) =
            split_credentials("nats://al%40x:s%3Acret@a:4222, nats://b:4223,tls://al:pw@c/");
        assert_eq!(urls, "nats://a:4222,nats://b:4223,tls://c/");
        assert_eq!(
            credentials,
            Some(NatsCredentials::UserPassword {
                user: "al@x".into(),
                password: "s:cret".into()
            })
        );
        let shown = format!("{credentials:?}");
        assert!(!shown.contains("cret"), "{shown}");
    }

    #[test]
    fn a_user_part_alone_is_a_token_and_plain_addresses_stay() {
        assert_eq!(
            split_credentials("nats://t0k3n@h:1"),
            (
                "nats://h:1".into(),
                Some(NatsCredentials::Token("t0k3n".into()))
            )
        );
        assert_eq!(
            split_credentials("nats://127.0.0.1:4222"),
            ("nats://127.0.0.1:4222".into(), None)
        );
        assert_eq!(
            split_credentials("localhost:4222"),
            ("localhost:4222".into(), None)
        );
    }
}
