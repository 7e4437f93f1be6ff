//! Shutdown signals: the future both binaries stop on.
//!
//! The one decision a reader must know: the handlers are installed when
//! [`install_shutdown_signal`] is called, not when the future is first polled, so a signal
//! during startup is a graceful stop and never the default disposition (which kills the
//! process).

/// Installs the SIGTERM and SIGINT handlers now and resolves on the first signal.
///
/// Installing before anything else means a signal during startup is a graceful stop, never the
/// default disposition (which kills the process). `tokio::signal::ctrl_c` would install its
/// handler only when first polled, hence the explicit unix signals.
pub fn install_shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                (term, int) => {
                    if let Err(e) = term.as_ref().and(int.as_ref()) {
                        tracing::warn!(error = %e, "cannot install a signal handler");
                    }
                    shutdown_signal().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        shutdown_signal()
    }
}

/// Resolves on SIGTERM or SIGINT; installs the handlers only when first polled (prefer
/// [`install_shutdown_signal`]).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
