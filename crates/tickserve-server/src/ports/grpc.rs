//! The gRPC port: v2's `GRPCInferenceService`, TF Serving's
//! `PredictionService` and `ModelService`, the sequence-state service and
//! `grpc.health.v1`, behind one check: the port's method table names each
//! method's key group, a method not in it is answered UNIMPLEMENTED, and the
//! key of the group is checked before any service sees the call.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::watch;

use crate::edge::Edge;
use crate::edge::access::Access;
use crate::edge::routes::grpc_group;
use crate::edge::status::{self, Refusal};
use crate::listen::{self, ConnectionLimits};
use crate::tls::Tls;
use crate::{grpc, tfserving};

/// Serves gRPC on `listener` behind `access`, over `tls` when given, within
/// `limits`, until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    edge: Arc<Edge>,
    access: Access,
    tls: Option<Arc<Tls>>,
    limits: Arc<ConnectionLimits>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let limit = edge.max_request_bytes;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<grpc::Server>().await;
    let (predictions, model_status) =
        tfserving::grpc::TfServing::services(Arc::clone(&edge), limit);
    // Served by hyper (`listen`) rather than tonic's transport: tonic's
    // transport answers a `grpc-timeout` that runs out with CANCELLED before the
    // handler runs; tickserve applies the deadline itself (it is checked when
    // the request is dispatched) and answers DEADLINE_EXCEEDED.
    let router = tonic::service::Routes::new(health_service)
        .add_service(grpc::service(Arc::clone(&edge), limit))
        .add_service(predictions)
        .add_service(model_status)
        .add_service(grpc::sequences::Sequence::service(Arc::clone(&edge)))
        .into_axum_router()
        .layer(tower::util::MapResponseLayer::new(
            status::grpc_oversized_is_invalid_argument::<axum::body::Body>,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(access),
            guard,
        ));
    let mut stopping = stop.clone();
    tokio::spawn(async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        health.set_not_serving::<grpc::Server>().await;
    });
    listen::serve(listener, router, tls, limits, "grpc", stop).await
}

/// Refuses a call of a method the port does not serve, or of a restricted
/// group without its key, before any service sees it.
async fn guard(State(access): State<Arc<Access>>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let refused = match grpc_group(path) {
        None => Err(Refusal::NoRoute(format!("for the gRPC method {path}"))),
        Some(group) => access.admit(group, request.headers()),
    };
    match refused {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.grpc().into_http::<axum::body::Body>(),
    }
}
