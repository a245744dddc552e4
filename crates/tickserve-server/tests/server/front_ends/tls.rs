//! TLS and mutual TLS on both front ends, with certificates made here
//! (rcgen): Triton's Python clients over TLS (`tests/python/tls_check.py`),
//! a client without a certificate refused under mutual TLS, a plain-text
//! client refused on a TLS port, and certificate rotation (files replaced
//! under a running server) while a client keeps sending: no request fails,
//! and new connections get the new certificate.

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use tickserve_core::config::{FrontEnd, Restriction, TlsConfig};
use tickserve_proto::inference as pb;
use tickserve_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A certificate authority of the test.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Authority { cert, key }
    }

    /// A leaf for `localhost` and 127.0.0.1 (a server) or a client: (PEM
    /// certificate, PEM key).
    fn leaf(&self, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }
}

/// Writes `text` to `path` whole: to a temporary name, then a rename.
fn replace(path: &Path, text: &str) {
    let temporary = path.with_extension("new");
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, path).unwrap();
}

struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The server's files, from `authority`; with `client_ca`, mutual TLS.
    fn server(authority: &Authority, client_ca: Option<&Authority>) -> (Files, TlsConfig) {
        let files = Files {
            dir: tempfile::tempdir().unwrap(),
        };
        let (cert, key) = authority.leaf(ExtendedKeyUsagePurpose::ServerAuth);
        replace(&files.path("server.pem"), &cert);
        replace(&files.path("server.key"), &key);
        replace(&files.path("ca.pem"), &authority.pem());
        if let Some(ca) = client_ca {
            replace(&files.path("client-ca.pem"), &ca.pem());
            let (cert, key) = ca.leaf(ExtendedKeyUsagePurpose::ClientAuth);
            replace(&files.path("client.pem"), &cert);
            replace(&files.path("client.key"), &key);
        }
        let config = TlsConfig {
            cert_file: files.path("server.pem"),
            key_file: files.path("server.key"),
            client_ca_file: client_ca.map(|_| files.path("client-ca.pem")),
            front_ends: vec![FrontEnd::Http, FrontEnd::Grpc],
            reload_interval: Duration::from_secs(3600),
        };
        (files, config)
    }
}

async fn tls_client(
    address: std::net::SocketAddr,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<GrpcInferenceServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://127.0.0.1:{}", address.port()))
        .unwrap()
        .tls_config(tls)?
        .connect()
        .await?;
    Ok(GrpcInferenceServiceClient::new(channel))
}

fn models() -> PathBuf {
    support::root().join("config/models")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_over_tls_and_a_plain_text_client_refused() {
    let authority = Authority::new("tickserve test CA");
    let (files, tls) = Files::server(&authority, None);
    let mut config = support::config(&models());
    config.security.tls = Some(tls);
    // A restricted group over TLS, too: keys and TLS together.
    let key_file = files.path("admin.key");
    std::fs::write(&key_file, "tls-and-a-key").unwrap();
    for front_end in [FrontEnd::Http, FrontEnd::Grpc] {
        config.security.restricted.push(
            Restriction::parse_triton(
                &format!("inference:admin-key=file:{}", key_file.display()),
                front_end,
            )
            .unwrap(),
        );
    }
    let server = support::start(&config).await;
    support::run_python_check(
        &server,
        "tls_check.py",
        &[
            "--ca".as_ref(),
            files.path("ca.pem").as_os_str(),
            "--restricted".as_ref(),
            "tls-and-a-key".as_ref(),
        ],
        "done",
    )
    .await;
    // Plain text on the TLS ports: refused, and the server goes on.
    let plain = GrpcInferenceServiceClient::connect(format!("http://{}", server.grpc_addr)).await;
    let failed = match plain {
        Err(_) => true,
        Ok(mut client) => client
            .server_ready(pb::ServerReadyRequest {})
            .await
            .is_err(),
    };
    assert!(failed, "plain-text gRPC was served on a TLS port");
    let plain = reqwest::get(format!("http://{}/v2/health/ready", server.http_addr)).await;
    assert!(plain.is_err(), "plain-text HTTP was served on a TLS port");
    let mut client = tls_client(server.grpc_addr, &authority.pem(), None)
        .await
        .unwrap();
    client
        .server_ready(pb::ServerReadyRequest {})
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_client_without_a_certificate_the_ca_signed() {
    if support::alone(
        module_path!(),
        "mutual_tls_refuses_a_client_without_a_certificate_the_ca_signed",
    ) {
        return;
    }
    let authority = Authority::new("tickserve test CA");
    let clients = Authority::new("tickserve test client CA");
    let (files, tls) = Files::server(&authority, Some(&clients));
    let mut config = support::config(&models());
    config.security.tls = Some(tls);
    let server = support::start(&config).await;
    support::run_python_check(
        &server,
        "tls_check.py",
        &[
            "--ca".as_ref(),
            files.path("ca.pem").as_os_str(),
            "--client-cert".as_ref(),
            files.path("client.pem").as_os_str(),
            "--client-key".as_ref(),
            files.path("client.key").as_os_str(),
        ],
        "done",
    )
    .await;
    let ca = authority.pem();
    // No certificate, and one from a CA the server does not trust.
    let stranger = Authority::new("someone else").leaf(ExtendedKeyUsagePurpose::ClientAuth);
    for identity in [None, Some((stranger.0.as_str(), stranger.1.as_str()))] {
        let refused = match tls_client(server.grpc_addr, &ca, identity).await {
            Err(_) => true,
            Ok(mut client) => client
                .server_ready(pb::ServerReadyRequest {})
                .await
                .is_err(),
        };
        assert!(refused, "served a client with {identity:?}");
    }
    let cert = std::fs::read_to_string(files.path("client.pem")).unwrap();
    let key = std::fs::read_to_string(files.path("client.key")).unwrap();
    let mut client = tls_client(server.grpc_addr, &ca, Some((&cert, &key)))
        .await
        .unwrap();
    client.model_infer(support::grpc_alpha_row()).await.unwrap();
    let metrics = tickserve_server::render_metrics();
    assert!(
        support::counter_total(&metrics, "tickserve_tls_handshake_failures_total") >= 2.0,
        "{metrics}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_failed_request() {
    let first = Authority::new("first CA");
    let (files, mut tls) = Files::server(&first, None);
    tls.reload_interval = Duration::from_millis(100);
    let mut config = support::config(&models());
    config.security.tls = Some(tls);
    let server = support::start(&config).await;
    // A client that keeps sending over one connection throughout.
    let mut steady = tls_client(server.grpc_addr, &first.pem(), None)
        .await
        .unwrap();
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn({
        let (sent, failed, stop) = (sent.clone(), failed.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                match steady.model_infer(support::grpc_alpha_row()).await {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let second = Authority::new("second CA");
    assert!(
        tls_client(server.grpc_addr, &second.pem(), None)
            .await
            .is_err(),
        "the second CA is trusted before the rotation"
    );
    // The key first, then the certificate: a look in between finds them
    // mismatched and keeps the current pair.
    let (cert, key) = second.leaf(ExtendedKeyUsagePurpose::ServerAuth);
    replace(&files.path("server.key"), &key);
    // A fixed wait longer than the certificate watcher's interval, so that
    // it looks while the pair is mismatched (what this step tests); the
    // watcher runs on real time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    replace(&files.path("server.pem"), &cert);
    let mut rotated = None;
    for _ in 0..500 {
        if let Ok(client) = tls_client(server.grpc_addr, &second.pem(), None).await {
            rotated = Some(client);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut rotated = rotated.expect("new connections get the new certificate");
    rotated
        .model_infer(support::grpc_alpha_row())
        .await
        .unwrap();
    assert!(
        tls_client(server.grpc_addr, &first.pem(), None)
            .await
            .is_err(),
        "a new connection still got the old certificate"
    );
    stop.store(true, Ordering::Relaxed);
    sender.await.unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the rotation"
    );
    assert!(sent.load(Ordering::Relaxed) > 10);
    server.shutdown().await.unwrap();
}
