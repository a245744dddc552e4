//! TLS for the front ends, with rustls: the certificate chain and key come
//! from PEM files; with a client CA, mutual TLS (a client must present a
//! certificate that CA signed, or the handshake fails).
//!
//! Rotation without a restart: the files are looked at every
//! `reload_interval`, and at once on SIGHUP; when they changed and load, new
//! connections get the new certificate while open ones keep theirs. Files
//! that do not load (a half-written key, say) leave the current certificate
//! in place and are logged; the next look tries again.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::ServerConfig as RustlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tickserve_core::config::TlsConfig;
use tickserve_core::metrics as names;
use tokio::sync::watch;

/// The TLS settings of one front end: what new connections are offered.
#[derive(Debug)]
pub struct Tls {
    config: TlsConfig,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Loaded>,
}

/// What was loaded, and the files' modification times it was loaded from.
#[derive(Debug)]
struct Loaded {
    rustls: Arc<RustlsConfig>,
    stamps: Vec<Option<SystemTime>>,
}

impl Tls {
    /// Loads `config`'s files; `alpn` lists the protocols offered (`h2`,
    /// `http/1.1`). Errors name the file and what is wrong with it.
    pub fn new(config: &TlsConfig, alpn: &[&[u8]]) -> Result<Tls, String> {
        let alpn: Vec<Vec<u8>> = alpn.iter().map(|p| p.to_vec()).collect();
        let loaded = load(config, &alpn)?;
        Ok(Tls {
            config: config.clone(),
            alpn,
            current: RwLock::new(loaded),
        })
    }

    /// The acceptor for a new connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        tokio_rustls::TlsAcceptor::from(Arc::clone(&current.rustls))
    }

    /// Loads the files again if they changed since the last load (or always,
    /// with `force`). Returns whether a new certificate is in place.
    pub fn reload(&self, force: bool) -> bool {
        let stamps = stamps(&self.config);
        {
            let current = self.current.read().unwrap_or_else(|p| p.into_inner());
            if !force && current.stamps == stamps {
                return false;
            }
        }
        match load(&self.config, &self.alpn) {
            Ok(loaded) => {
                *self.current.write().unwrap_or_else(|p| p.into_inner()) = loaded;
                metrics::counter!(names::TLS_RELOADS).increment(1);
                tracing::info!(
                    cert = %self.config.cert_file.display(),
                    "TLS certificate loaded anew; new connections get it"
                );
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "TLS files changed but do not load; keeping the current certificate");
                false
            }
        }
    }

    /// How often its files are looked at.
    pub fn interval(&self) -> Duration {
        self.config.reload_interval
    }
}

/// Looks at the files of every front end's TLS every interval, and at once on
/// SIGHUP, until `stop` turns true. Runs without TLS too: SIGHUP then only
/// logs, so a hangup never ends the server (its default action would).
pub async fn watch_files(tls: Vec<Arc<Tls>>, mut stop: watch::Receiver<bool>) {
    let interval = tls.iter().map(|t| t.interval()).min();
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| tracing::warn!(error = %e, "cannot watch SIGHUP"))
        .ok();
    let mut tick = tokio::time::interval(interval.unwrap_or(Duration::from_secs(3600)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let force = tokio::select! {
            _ = tick.tick(), if interval.is_some() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        if force && tls.is_empty() {
            tracing::info!("SIGHUP: no TLS files to load anew");
            continue;
        }
        let tls = tls.clone();
        // Reading files blocks; it runs off the async workers.
        let _ = tokio::task::spawn_blocking(move || {
            for t in &tls {
                t.reload(force);
            }
        })
        .await;
    }
}

fn stamps(config: &TlsConfig) -> Vec<Option<SystemTime>> {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut stamps = vec![modified(&config.cert_file), modified(&config.key_file)];
    if let Some(ca) = &config.client_ca_file {
        stamps.push(modified(ca));
    }
    stamps
}

fn load(config: &TlsConfig, alpn: &[Vec<u8>]) -> Result<Loaded, String> {
    // The stamps first: a file changed while it is read is read again next time.
    let stamps = stamps(config);
    let cert_file = &config.cert_file;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| format!("security.tls.cert_file {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "security.tls.cert_file {}: no certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&config.key_file)
        .map_err(|e| format!("security.tls.key_file {}: {e}", config.key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = RustlsConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match &config.client_ca_file {
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca_file)
                .map_err(|e| format!("security.tls.client_ca_file {}: {e}", ca_file.display()))?
            {
                let cert = cert.map_err(|e| {
                    format!("security.tls.client_ca_file {}: {e}", ca_file.display())
                })?;
                roots.add(cert).map_err(|e| {
                    format!("security.tls.client_ca_file {}: {e}", ca_file.display())
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("security.tls.client_ca_file {}: {e}", ca_file.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut rustls = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("security.tls: the certificate and key do not go together: {e}"))?;
    rustls.alpn_protocols = alpn.to_vec();
    Ok(Loaded {
        rustls: Arc::new(rustls),
        stamps,
    })
}
