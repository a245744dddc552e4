//! The HTTP port: one handler for every path. It parses the path once with
//! the port's route table, answers 404 for a path that does not parse,
//! checks the key of the route's group, checks the method, and dispatches
//! the parsed route to its front end. The key check and the handler see the
//! same route, whatever the path's spelling.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::watch;

use crate::control::Operation;
use crate::listen::budget::BodyRules;
use crate::listen::{self, ConnectionLimits};
use crate::tls::Tls;
use crate::transport::access::Access;
use crate::transport::body::BodyRefused;
use crate::transport::routes::{self, HttpRoute, ModelEndpoint};
use crate::transport::status::Refusal;
use crate::{http, observe, tfserving};
use tickserve_edge::Edge;

/// What the port's one handler holds.
struct Port {
    edge: Arc<Edge>,
    access: Access,
}

/// Serves HTTP on `listener` behind `access`, over `tls` when given, within
/// `limits`, until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    edge: Arc<Edge>,
    access: Access,
    tls: Option<Arc<Tls>>,
    limits: Arc<ConnectionLimits>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let rules = BodyRules {
        refuse: |error| Box::new(BodyRefused(error)),
        stream: |_| false,
        grpc: false,
    };
    let router = router(Arc::clone(&edge), access);
    listen::serve(listener, router, (edge, rules), tls, limits, "http", stop).await
}

/// The port's router: every request goes to [`dispatch`].
pub fn router(edge: Arc<Edge>, access: Access) -> Router {
    Router::new()
        .fallback(dispatch)
        .with_state(Arc::new(Port { edge, access }))
}

/// Whether `method` is one `expected` takes.
fn takes(expected: routes::Method, method: &Method) -> bool {
    match expected {
        routes::Method::Get => method == Method::GET || method == Method::HEAD,
        routes::Method::Post => method == Method::POST,
        routes::Method::Any => true,
    }
}

/// Routes, checks and answers one request.
async fn dispatch(State(port): State<Arc<Port>>, request: Request) -> Response {
    let (mut parts, body) = request.into_parts();
    let path = parts.uri.path();
    let Some(route) = HttpRoute::parse(path) else {
        return Refusal::NoRoute(format!("{} {path}", parts.method)).http();
    };
    let key = match port.access.admit(route.group(), &parts.headers) {
        Ok(key) => key,
        Err(refusal) => return refusal.http(),
    };
    if let Some(key) = key {
        parts.extensions.insert(key);
    }
    if !takes(route.method(), &parts.method) {
        return Refusal::WrongMethod {
            path: path.to_string(),
            method: parts.method.to_string(),
        }
        .http();
    }
    let edge = &port.edge;
    let headers = &parts.headers;
    match route {
        HttpRoute::Live => StatusCode::OK.into_response(),
        HttpRoute::Ready => http::server_ready(edge).into_response(),
        HttpRoute::ServerMetadata => http::server_metadata(),
        HttpRoute::Metrics => {
            edge.runtime.refresh_readiness();
            observe::render().into_response()
        }
        HttpRoute::AllStats => http::all_stats(edge),
        HttpRoute::RepositoryIndex => into(http::repository_index(edge, headers, body).await),
        HttpRoute::RepositoryLoad(model) => {
            into(http::repository_change(edge, Operation::Load, model).await)
        }
        HttpRoute::RepositoryUnload(model) => {
            into(http::repository_change(edge, Operation::Unload, model).await)
        }
        HttpRoute::Model(model, endpoint) => match endpoint {
            ModelEndpoint::Metadata => into(http::model_metadata(edge, &model)),
            ModelEndpoint::Ready => into(http::model_ready(edge, &model)),
            ModelEndpoint::Config => into(http::model_config(edge, &model)),
            ModelEndpoint::Stats => into(http::model_stats(edge, &model)),
            ModelEndpoint::Infer => {
                http::infer(edge, &model, headers, &parts.extensions, body).await
            }
            ModelEndpoint::Sequences => into(http::sequences::list(edge, &model, key)),
            ModelEndpoint::SequenceRead => {
                into(http::sequences::read(edge, &model, key, body).await)
            }
            ModelEndpoint::SequenceWrite => {
                into(http::sequences::write(edge, &model, headers, key, body).await)
            }
            ModelEndpoint::SequenceDrop => {
                into(http::sequences::drop_sequence(edge, &model, key, body).await)
            }
            ModelEndpoint::Halt => into(http::risk::halt(edge, &model, body).await),
            ModelEndpoint::Resume => into(http::risk::resume(edge, &model, body).await),
        },
        HttpRoute::TfServing(route) => {
            let request = (&parts.method, headers, &parts.extensions);
            tfserving::rest::serve(edge, request, &route, body).await
        }
        HttpRoute::TfMalformed(message) => {
            drain(body).await;
            tfserving::rest::malformed(&message)
        }
    }
}

fn into<T: IntoResponse, E: IntoResponse>(result: Result<T, E>) -> Response {
    match result {
        Ok(answer) => answer.into_response(),
        Err(error) => error.into_response(),
    }
}

/// Reads and drops a small body the answer does not need, so the client
/// reads the answer instead of a reset.
async fn drain(body: Body) {
    use http_body_util::BodyExt;
    let _ = http_body_util::Limited::new(body, 64 * 1024)
        .collect()
        .await;
}
